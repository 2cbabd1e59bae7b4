"""PNG copies of the course's SVG pictures, so they show where SVG is not trusted.

JupyterLab renders a stored ``image/svg+xml`` output only in a trusted notebook; a lecture
opened without running it is not trusted, and would show the picture's one line of text.
A PNG is always safe to show, so every picture carries one beside its SVG (the frontend
picks the SVG where it may, the PNG elsewhere; GitHub and Colab show either). Trusting the
course's notebooks instead would need a step in every way of opening them (the lab command,
the conda route, a plain ``jupyter lab``), would lapse on each edit or pull, and would let
stored scripts run too; a PNG needs none of that.

The PNG is drawn by matplotlib (already a course dependency, so nothing new to install)
from the SVG text itself, so the two cannot disagree. Only the subset of SVG the course's
views write is understood: ``svg``, ``g``, ``title``, ``defs``/``pattern`` (a hatch),
``rect``, ``text``/``tspan``, ``path`` (M, L, H, V, Z, absolute or relative), ``polyline``
and ``circle``. Anything else raises ``ValueError`` naming it, so a view that starts
drawing something new fails its tests instead of losing part of its PNG.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, replace

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Circle, PathPatch, Rectangle
from matplotlib.path import Path as MplPath

SCALE = 2
"""Pixels of PNG per SVG pixel: sharp on high-density screens; displayed at SVG size."""

SVG_NS = "{http://www.w3.org/2000/svg}"
IGNORED = frozenset({"class", "id", "rx"})
"""Attributes with no effect on the PNG (identity, and corner rounding too small to see)."""

INHERITED = ("fill", "font-family", "font-size", "font-weight", "text-anchor")
ANCHORS = {"start": "left", "middle": "center", "end": "right"}
HATCH = "//"
"""Matplotlib's hatch for the only pattern the views draw: diagonal lines 6 px apart
(each ``/`` draws 6 lines per 72 px)."""


@dataclass(frozen=True)
class _Style:
    """Presentation attributes in force at an element (SVG inheritance)."""

    fill: str = "#000000"
    font_family: str = "sans-serif"
    font_size: float = 16.0
    font_weight: str = "normal"
    text_anchor: str = "start"
    opacity: float = 1.0
    scale: float = 1.0
    """Points per user unit here: 1 at a root drawn at its own size, less inside a
    ``viewBox`` that shrinks its content (text and line widths shrink with it)."""


@dataclass(frozen=True)
class _Hatch:
    """A ``<pattern>`` of parallel lines: background colour and line colour."""

    background: str
    color: str


def svg_to_png(svg: str, scale: int = SCALE) -> tuple[bytes, dict[str, int]]:
    """The PNG of a course SVG and the display size (``width``/``height`` in CSS pixels).

    Returns what IPython's ``_repr_png_`` may return: the bytes and their metadata.
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or not 1 <= scale <= 4:
        raise ValueError(f"scale must be an integer from 1 to 4, got {scale!r}")
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as error:
        raise ValueError(f"not well-formed SVG: {error}") from error
    if root.tag != f"{SVG_NS}svg":
        raise ValueError(f"expected an <svg> root element, got <{_name(root)}>")
    width, height = (_number(root.get(key), key) for key in ("width", "height"))
    fig = Figure(figsize=(width / 72, height / 72), dpi=72 * scale)  # 1 SVG px = 1 pt
    FigureCanvasAgg(fig)
    _viewport(fig.add_axes((0, 0, 1, 1)), root, _Style(), dict(_patterns(root)),
              (width, height))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue(), {"width": round(width), "height": round(height)}


def _viewport(ax: Axes, element: ET.Element, style: _Style, hatches: dict[str, _Hatch],
              size: tuple[float, float]) -> None:
    """Draw an ``<svg>`` element's children on ``ax``, which covers its ``size``: the user
    units are its ``viewBox`` (its own size where it has none)."""
    box = element.get("viewBox")
    parts = [_number(v, "viewBox") for v in box.split()] if box else [0.0, 0.0, *size]
    if len(parts) != 4 or parts[2] <= 0 or parts[3] <= 0:
        raise ValueError(f"viewBox {box!r} is not four numbers with a positive size")
    x, y, w, h = parts
    ax.set_xlim(x, x + w)
    ax.set_ylim(y + h, y)
    ax.set_axis_off()
    inner = replace(_style(element, style), scale=style.scale * size[0] / w)
    # Patches go in with add_artist: add_patch would also update the data limits, which
    # are fixed here and cost half the time on a big picture.
    for child in element:
        _draw(ax, child, inner, hatches, (w, h))


def _nested(ax: Axes, element: ET.Element, style: _Style, hatches: dict[str, _Hatch],
            size: tuple[float, float]) -> None:
    """An ``<svg>`` inside another: its own axes over the box it takes in its parent."""
    _check_attributes(element, {"x", "y", "width", "height", "viewBox", "role", *INHERITED})
    x, y = (_number(element.get(key, "0"), key) for key in ("x", "y"))
    w, h = (_number(element.get(key, str(whole)), key)
            for key, whole in (("width", size[0]), ("height", size[1])))
    corners = ax.transData.transform([(x, y), (x + w, y + h)])
    (left, top), (right, bottom) = ax.figure.transFigure.inverted().transform(corners)
    placed = ax.figure.add_axes((left, min(top, bottom), right - left, abs(top - bottom)))
    _viewport(placed, element, style, hatches, (w, h))


def figure_png(fig: Figure, scale: int = SCALE) -> tuple[bytes, dict[str, int]]:
    """A matplotlib figure's PNG and display size, the same size its SVG is shown at."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96 * scale, metadata={"Software": None})
    width, height = fig.get_size_inches()
    return buffer.getvalue(), {"width": round(width * 96), "height": round(height * 96)}


def _name(element: ET.Element) -> str:
    return element.tag.removeprefix(SVG_NS)


def _number(value: str | None, what: str) -> float:
    try:
        return float(value.removesuffix("px"))  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        raise ValueError(f"SVG attribute {what}={value!r} is not a number") from None


def _patterns(root: ET.Element) -> Iterator[tuple[str, _Hatch]]:
    """Each ``<pattern>`` as a hatch: its background rect's fill and its line's stroke."""
    for pattern in root.iter(f"{SVG_NS}pattern"):
        kinds = {_name(child): child for child in pattern}
        if set(kinds) != {"rect", "path"}:
            raise ValueError(f"pattern {pattern.get('id')!r} is not a rect and a line")
        yield pattern.get("id", ""), _Hatch(kinds["rect"].get("fill", "#ffffff"),
                                            kinds["path"].get("stroke", "#000000"))


def _style(element: ET.Element, parent: _Style) -> _Style:
    """``parent`` with the inherited attributes ``element`` sets."""
    values = {key.replace("-", "_"): element.get(key) for key in INHERITED if element.get(key)}
    if "font_size" in values:
        values["font_size"] = _number(values["font_size"], "font-size")
    opacity = parent.opacity * float(element.get("opacity", 1))
    return replace(parent, opacity=opacity, **values)


def _check_attributes(element: ET.Element, known: set[str]) -> None:
    for key in element.attrib:
        if key not in known and key not in IGNORED and not key.startswith("data-"):
            raise ValueError(f"<{_name(element)}> attribute {key}={element.get(key)!r} "
                             "is not drawn in the PNG")


def _draw(ax: Axes, element: ET.Element, parent: _Style, hatches: dict[str, _Hatch],
          size: tuple[float, float]) -> None:
    """Draw ``element`` and its children with the style they inherit."""
    name = _name(element)
    if name in ("title", "defs"):
        return
    style = _style(element, parent)
    if name == "g":
        _check_attributes(element, {*INHERITED, "opacity"})
        for child in element:
            _draw(ax, child, style, hatches, size)
    elif name == "svg":
        _nested(ax, element, parent, hatches, size)
    elif name == "rect":
        _rect(ax, element, style, hatches, size)
    elif name == "text":
        _text(ax, element, style)
    elif name in ("path", "polyline", "circle"):
        _shape(ax, element, style)
    else:
        raise ValueError(f"<{name}> is not an SVG element the course's PNG copies draw")


def _paint(element: ET.Element, style: _Style) -> dict[str, object]:
    """Fill and stroke keyword arguments for a matplotlib patch."""
    fill = element.get("fill", style.fill)
    stroke = element.get("stroke")
    alpha = style.opacity * float(element.get("fill-opacity", 1))
    dash = element.get("stroke-dasharray")
    return {
        "facecolor": "none" if fill == "none" else fill,
        "alpha": alpha if alpha < 1 else None,
        "edgecolor": "none" if stroke in (None, "none") else stroke,
        "linewidth": float(element.get("stroke-width", 1)) * style.scale if stroke else 0.0,
        "linestyle": (0, tuple(float(d) for d in dash.split())) if dash else "solid",
    }


def _rect(ax: Axes, element: ET.Element, style: _Style, hatches: dict[str, _Hatch],
          size: tuple[float, float]) -> None:
    _check_attributes(element, {"x", "y", "width", "height", "fill", "fill-opacity",
                                "stroke", "stroke-width", "stroke-dasharray"})
    box = []
    for key, whole in (("x", 0.0), ("y", 0.0), ("width", size[0]), ("height", size[1])):
        value = element.get(key, "0")
        box.append(whole if value == "100%" else _number(value, key))
    x, y, w, h = box
    paint = _paint(element, style)
    url = re.fullmatch(r"url\(#(.+)\)", str(element.get("fill", "")))
    if url:
        if url.group(1) not in hatches:
            raise ValueError(f"fill {element.get('fill')!r} names no pattern")
        hatch = hatches[url.group(1)]
        ax.add_artist(Rectangle((x, y), w, h, facecolor=hatch.background, hatch=HATCH,
                               edgecolor=hatch.color, linewidth=0))
        paint["facecolor"] = "none"
    ax.add_artist(Rectangle((x, y), w, h, **paint))


def _text(ax: Axes, element: ET.Element, style: _Style) -> None:
    _check_attributes(element, {"x", "y", *INHERITED})
    lines = [(element, element.text or "")]
    for span in element:
        if _name(span) != "tspan":
            raise ValueError(f"<{_name(span)}> inside <text> is not drawn in the PNG")
        _check_attributes(span, {"x", "y"})
        lines.append((span, span.text or ""))
    family = "DejaVu Sans Mono" if "monospace" in style.font_family else "DejaVu Sans"
    for where, content in lines:
        if not content.strip():
            continue
        ax.text(_number(where.get("x", "0"), "x"), _number(where.get("y", "0"), "y"), content,
                fontsize=style.font_size * style.scale, family=family, color=style.fill,
                fontweight="bold" if style.font_weight == "bold" else "normal",
                ha=ANCHORS[style.text_anchor], va="baseline", alpha=style.opacity,
                clip_on=False)


def _shape(ax: Axes, element: ET.Element, style: _Style) -> None:
    name = _name(element)
    paint_keys = {"fill", "stroke", "stroke-width", "stroke-opacity"}
    if name == "circle":
        _check_attributes(element, {"cx", "cy", "r", *paint_keys})
        centre = (_number(element.get("cx"), "cx"), _number(element.get("cy"), "cy"))
        patch = Circle(centre, _number(element.get("r"), "r"), **_paint(element, style))
    else:
        _check_attributes(element, {"d", "points", *paint_keys})
        if name == "polyline":
            numbers = [float(v) for v in re.split(r"[\s,]+", element.get("points", "").strip())]
            points = list(zip(numbers[::2], numbers[1::2], strict=True))
            path = MplPath(points, [MplPath.MOVETO] + [MplPath.LINETO] * (len(points) - 1))
        else:
            path = _path(element.get("d", ""))
        paint = _paint(element, style)
        if element.get("stroke-opacity") is not None:
            paint["alpha"] = style.opacity * float(element.get("stroke-opacity", 1))
        patch = PathPatch(path, **paint)
    ax.add_artist(patch)


def _path(d: str) -> MplPath:
    """A path of M, L, H, V and Z commands (upper case absolute, lower case relative)."""
    tokens = re.findall(r"[A-Za-z]|-?\d*\.?\d+(?:e-?\d+)?", d)
    vertices: list[tuple[float, float]] = []
    codes: list[int] = []
    x = y = start_x = start_y = 0.0
    command = ""
    i = 0
    while i < len(tokens):
        if tokens[i].isalpha():
            command, i = tokens[i], i + 1
            if command not in "MLHVZmlhvz":
                raise ValueError(f"path command {command!r} in {d!r} is not drawn in the PNG")
            if command in "Zz":
                vertices.append((start_x, start_y))
                codes.append(MplPath.CLOSEPOLY)
                x, y, command = start_x, start_y, ""  # a number after Z is an error
                continue
        if not command:
            raise ValueError(f"path data {d!r} does not start with a command")
        relative = command.islower()
        kind = command.upper()
        if kind in "ML":
            dx, dy = float(tokens[i]), float(tokens[i + 1])
            i += 2
            x, y = (x + dx, y + dy) if relative else (dx, dy)
        elif kind == "H":
            x, i = (x if relative else 0.0) + float(tokens[i]), i + 1
        else:
            y, i = (y if relative else 0.0) + float(tokens[i]), i + 1
        if kind == "M":
            start_x, start_y = x, y
            codes.append(MplPath.MOVETO)
            command = "l" if relative else "L"  # coordinates after M continue as a line
        else:
            codes.append(MplPath.LINETO)
        vertices.append((x, y))
    return MplPath(vertices, codes)
