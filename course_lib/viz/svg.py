"""Deterministic SVG text: escaping, number formatting, shapes, legends, a displayable picture.

Every view of the course draws by string building, not through a plotting library, so that
the same input gives byte-identical SVG (stored notebook outputs must not change when a cell
is re-run) and a 30,720-block frame renders in milliseconds. Nothing here knows about pools
or arenas.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from course_lib.viz.raster import svg_to_png

WIDTH = 900
"""Width in pixels of every course SVG: one notebook column."""

MARGIN = 16
"""Left and right margin inside an SVG."""

FONT = "-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
"""Font stack set on the root group (a ``<style>`` element would leak into the page)."""

INK = "#1f2328"
"""Colour of titles and labels."""

MUTED = "#57606a"
"""Colour of secondary text (statistics, captions)."""

EMPTY = "#eef1f4"
"""Colour of slots that hold nothing."""

EDGE = "#c5ccd3"
"""Colour of thin cell borders."""

ALERT = "#d62728"
"""Colour of what the learner should notice first (copy-on-write copies, stranded gaps)."""


def esc(value: object) -> str:
    """Text escaped for SVG/HTML content and attribute values."""
    return html.escape(str(value), quote=True)


def num(value: float) -> str:
    """A coordinate with at most two decimals and no trailing zeros (stable, compact)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless n is 1: "1 gap", "3 gaps", "1,024 requests"."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def attrs(**values: object) -> str:
    """SVG attributes from keyword arguments: ``class_`` -> ``class``, ``_`` -> ``-``.

    ``None`` values are left out; floats go through :func:`num`; order is argument order,
    so output is deterministic.
    """
    parts = []
    for key, value in values.items():
        if value is None:
            continue
        name = "class" if key == "class_" else key.replace("_", "-")
        if isinstance(value, float):
            shown = num(value)
        elif isinstance(value, int):
            shown = str(value)
        else:
            shown = esc(value)
        parts.append(f'{name}="{shown}"')
    return " ".join(parts)


def rect(x: float, y: float, w: float, h: float, **extra: object) -> str:
    """One ``<rect>``."""
    return f"<rect {attrs(x=float(x), y=float(y), width=float(w), height=float(h), **extra)}/>"


def text(x: float, y: float, content: object, **extra: object) -> str:
    """One ``<text>`` element with escaped content."""
    return f"<text {attrs(x=float(x), y=float(y), **extra)}>{esc(content)}</text>"


def text_lines(x: float, y: float, rows: Sequence[str], step: float, **extra: object) -> str:
    """One ``<text>`` holding several lines (``tspan``s), so it reads back as one element."""
    spans = "".join(
        f"<tspan {attrs(x=float(x), y=float(y + i * step))}>{esc(row)}</tspan>"
        for i, row in enumerate(rows)
    )
    return f"<text {attrs(**extra)}>{spans}</text>"


def document(height: float, body: Iterable[str], *, title: str, class_: str) -> str:
    """A complete ``<svg>`` of the course width, with an accessible title and the font set."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" '
        f'{attrs(class_=class_, width=WIDTH, height=float(height))} '
        f'viewBox="0 0 {WIDTH} {num(height)}" role="img">'
        f"<title>{esc(title)}</title>"
        f'<rect width="100%" height="100%" fill="#ffffff"/>'
        f'<g {attrs(font_family=FONT, font_size=12, fill=INK)}>'
    )
    return head + "".join(body) + "</g></svg>"


@dataclass(frozen=True)
class Swatch:
    """How a legend entry's sample square is painted."""

    fill: str
    stroke: str | None = None
    stroke_width: float = 1.0
    dash: str | None = None
    glyph: str | None = None
    """Text drawn in place of the square (e.g. ``"×n"``)."""


def legend(
    items: Sequence[tuple[Swatch, str]], y: float, *, font_size: float = 11.0
) -> tuple[list[str], float]:
    """Swatch-and-label entries laid out left to right, wrapping at the SVG width.

    Returns the SVG pieces and the y just below the last line.
    """
    pieces: list[str] = []
    x, size, line = float(MARGIN), 11.0, font_size + 8
    for swatch, label in items:
        box = size if swatch.glyph is None else 0.65 * font_size * len(swatch.glyph)
        width = box + 6 + 0.58 * font_size * len(label) + 18
        if x + width > WIDTH - MARGIN and x > MARGIN:
            x, y = float(MARGIN), y + line
        if swatch.glyph is None:
            pieces.append(rect(x, y, size, size, fill=swatch.fill, stroke=swatch.stroke,
                               stroke_width=swatch.stroke_width if swatch.stroke else None,
                               stroke_dasharray=swatch.dash))
        else:
            pieces.append(text(x + box / 2, y + size - 1.5, swatch.glyph, text_anchor="middle",
                               font_size=font_size, font_weight="bold", fill=swatch.fill))
        pieces.append(text(x + box + 6, y + size - 1.5, label, font_size=font_size, fill=MUTED))
        x += width
    return pieces, y + line


@dataclass(frozen=True)
class SvgPicture:
    """A finished drawing: shows as an image in Jupyter, on GitHub and in nbval outputs.

    Displayed, it carries a PNG copy beside the SVG (see :mod:`course_lib.viz.raster`), so
    a notebook opened without running it shows the picture even where SVG is not trusted.

    ``summary`` is the plain-text form (what a frontend that cannot draw SVG shows).
    """

    svg: str
    summary: str

    def _repr_svg_(self) -> str:
        return self.svg

    def _repr_png_(self) -> tuple[bytes, dict[str, int]]:
        return svg_to_png(self.svg)

    def __repr__(self) -> str:
        return self.summary

    def save(self, path: str | Path) -> Path:
        """Write the SVG to ``path`` (for slides or the README) and return the path."""
        target = Path(path)
        target.write_text(self.svg, encoding="utf-8")
        return target
