"""The arena view: one contiguous token arena as the slab allocators see it.

A frame (:class:`ArenaFrame`) lists each request's reservation: where it starts, how many
slots it reserved, how many it has written, and how many it will hold when finished. The
drawing shows, per reservation, the written part (solid), the part still to be written
(light), the part that will never be written (hatched: internal fragmentation), and the
free gaps between reservations, with gaps too small for the next waiting request in red
(external fragmentation). The arena wraps over rows like memory addresses.

DOM contract (``dom_id`` defaults to ``"arena"``): the statistics are the text element
``#arena-stats`` with ``data-written``, ``data-pending``, ``data-internal``, ``data-free``,
``data-stranded``, ``data-largest-gap`` and ``data-blocked`` ("true" when the free slots
would hold the next request but no single gap does); reservation pieces are ``rect``s with
class ``written``, ``pending`` or ``internal`` and ``data-request``; gaps are
``rect.gap`` (plus ``stranded`` when too small) with ``data-start`` and ``data-length``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

from course_lib.slab import SlabAllocator
from course_lib.viz.palette import OWNER_COLORS, mix, owner_colors
from course_lib.viz.svg import (
    ALERT,
    EDGE,
    MARGIN,
    MUTED,
    WIDTH,
    Swatch,
    count,
    document,
    legend,
    rect,
    text,
    text_lines,
)
from course_lib.viz.timeline import Timeline

if TYPE_CHECKING:
    from course_lib.simulator import SimResult

GUTTER = 62.0
ROW_HEIGHT = 30.0
ROW_GAP = 8.0
BAND_TOP = 74.0
STRANDED_FILL = "#fbe3e3"
HATCH, HATCH_FILL = "#b9b0a3", "#f3efe9"
HATCH_ID = "course-arena-hatch"
PENDING_TINT = 0.6
"""How far towards white the not-yet-written part of a reservation is drawn."""


@dataclass(frozen=True)
class Reservation:
    """One request's contiguous slab: ``reserved`` slots from ``start``.

    ``written`` slots hold tokens now; ``final`` is how many it will hold when the request
    finishes, so ``final - written`` are still to be written and ``reserved - final`` are
    never written (internal fragmentation; zero for an exact-size reservation).
    """

    request_id: str
    start: int
    reserved: int
    written: int
    final: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.reserved <= 0:
            raise ValueError(f"reservation {self.request_id!r}: start={self.start!r} and "
                             f"reserved={self.reserved!r} must be >= 0 and > 0")
        if not 0 <= self.written <= self.final <= self.reserved:
            raise ValueError(
                f"reservation {self.request_id!r} needs 0 <= written <= final <= reserved, "
                f"got written={self.written!r}, final={self.final!r}, "
                f"reserved={self.reserved!r}"
            )

    @property
    def end(self) -> int:
        """First slot after the reservation."""
        return self.start + self.reserved


@dataclass(frozen=True)
class ArenaFrame:
    """The arena at one step: its size, the reservations, and what the next request needs.

    ``next_request`` is the number of contiguous slots the first waiting request needs
    (``None`` when nobody waits); gaps smaller than it are drawn as stranded.
    Reservations are kept in address order; overlapping ones, or ones that run past the
    end of the arena, raise ``ValueError`` naming them.
    """

    size: int
    reservations: tuple[Reservation, ...]
    next_request: int | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size <= 0:
            raise ValueError(f"size must be a positive integer, got {self.size!r}")
        if self.next_request is not None and self.next_request <= 0:
            raise ValueError(f"next_request must be positive or None, got {self.next_request!r}")
        ordered = sorted(self.reservations, key=lambda r: r.start)
        for before, after in pairwise(ordered):
            if after.start < before.end:
                raise ValueError(f"reservations {before.request_id!r} and "
                                 f"{after.request_id!r} overlap")
        if ordered and ordered[-1].end > self.size:
            raise ValueError(f"reservation {ordered[-1].request_id!r} ends at "
                             f"{ordered[-1].end}, past the arena size {self.size}")
        object.__setattr__(self, "reservations", tuple(ordered))

    @property
    def gaps(self) -> tuple[tuple[int, int], ...]:
        """Free runs as (start, length), in address order."""
        runs, cursor = [], 0
        for res in self.reservations:
            if res.start > cursor:
                runs.append((cursor, res.start - cursor))
            cursor = res.end
        if cursor < self.size:
            runs.append((cursor, self.size - cursor))
        return tuple(runs)


@dataclass(frozen=True)
class ArenaStats:
    """Slots by kind, and whether the next request is blocked by fragmentation alone."""

    size: int
    written: int
    pending: int
    internal: int
    free: int
    gaps: int
    largest_gap: int
    stranded: int
    next_request: int | None

    @property
    def blocked(self) -> bool:
        """Free slots would hold the next request, but no single gap does."""
        need = self.next_request
        return need is not None and self.free >= need > self.largest_gap

    def lines(self) -> list[str]:
        """The statistics as two lines: slots by kind, then the next request's fate."""
        share = self.size / 100
        kinds = (
            f"written {self.written / share:.1f}% · "
            f"reserved, not yet written {self.pending / share:.1f}% · "
            f"never written {self.internal / share:.1f}% · "
            f"free {self.free / share:.1f}% in {count(self.gaps, 'gap')} "
            f"(largest {self.largest_gap:,} slots)"
        )
        if self.next_request is None:
            return [kinds, "no request waiting"]
        verdict = (
            f"no gap fits, though {self.free:,} slots are free" if self.blocked
            else "fits" if self.largest_gap >= self.next_request else "does not fit"
        )
        stranded = f" · {self.stranded:,} free slots in gaps too small" if self.stranded else ""
        return [kinds, f"next request needs {self.next_request:,} slots: {verdict}{stranded}"]


def arena_frame(
    arena: SlabAllocator, *, next_request: int | None = None, label: str = ""
) -> ArenaFrame:
    """A :class:`~course_lib.slab.SlabAllocator` as a frame: one reservation per live slab.

    Request ids become text (the views key colours by text); ``next_request`` is the number
    of contiguous slots the first waiting request needs, if any.
    """
    if not isinstance(arena, SlabAllocator):
        raise ValueError(f"arena must be a SlabAllocator, got {arena!r}")
    reservations = tuple(
        Reservation(str(rid), slab.start, slab.size, slab.length, slab.final_len)
        for rid, slab in arena.slabs.items()
    )
    return ArenaFrame(arena.num_slots, reservations, next_request=next_request, label=label)


def arena_frame_at(result: SimResult, step: int, *, label: str | None = None) -> ArenaFrame:
    """The arena of a contiguous simulation recorded with ``record="full"`` at ``step``.

    The frame marks gaps too small for the request then first in the queue (the slots it
    needs come from the run's timeline). The label defaults to ``"<allocator> · step N"``.
    """
    arena = result.arena_at(step)  # raises for paged runs and runs without events
    need = int(result.timeline.next_need[step])
    shown = f"{result.allocator} · step {step:,}" if label is None else label
    return arena_frame(arena, next_request=need or None, label=shown)


def arena_stats(frame: ArenaFrame) -> ArenaStats:
    """Count written, pending, internal and free slots, and the stranded ones."""
    gaps = frame.gaps
    need = frame.next_request
    return ArenaStats(
        size=frame.size,
        written=sum(r.written for r in frame.reservations),
        pending=sum(r.final - r.written for r in frame.reservations),
        internal=sum(r.reserved - r.final for r in frame.reservations),
        free=sum(length for _, length in gaps),
        gaps=len(gaps),
        largest_gap=max((length for _, length in gaps), default=0),
        stranded=sum(length for _, length in gaps if need is not None and length < need),
        next_request=need,
    )


class _Band:
    """Maps slot ranges to rectangles on the wrapped rows of the arena."""

    def __init__(self, size: int, rows: int) -> None:
        self.per_row = math.ceil(size / rows)
        self.scale = (WIDTH - MARGIN - GUTTER) / self.per_row

    def pieces(self, start: int, length: int, **extra: object) -> list[str]:
        """``rect``s covering slots ``start:start+length``, split where rows wrap."""
        out, end = [], start + length
        while start < end:
            row, offset = divmod(start, self.per_row)
            stop = min(end, (row + 1) * self.per_row)
            x = GUTTER + offset * self.scale
            y = BAND_TOP + row * (ROW_HEIGHT + ROW_GAP)
            out.append(rect(x, y, max((stop - start) * self.scale, 0.6), ROW_HEIGHT, **extra))
            start = stop
        return out


def render_svg(
    frame: ArenaFrame,
    *,
    rows: int | None = None,
    palette: Mapping[str, str] | None = None,
    dom_id: str = "arena",
) -> str:
    """The frame as SVG text (deterministic); ``rows`` wraps the arena (default: by size)."""
    rows = (1 if frame.size <= 4096 else 8) if rows is None else rows
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 64:
        raise ValueError(f"rows must be an integer from 1 to 64, got {rows!r}")
    colors = (owner_colors(r.request_id for r in frame.reservations)
              if palette is None else palette)
    stats = arena_stats(frame)
    band = _Band(frame.size, rows)
    pieces = [
        f'<defs><pattern id="{HATCH_ID}" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{HATCH_FILL}"/>'
        f'<path d="M0 0v6" stroke="{HATCH}" stroke-width="2.5"/></pattern></defs>',
        text(MARGIN, 24, frame.label or "token arena", font_size=15, font_weight="bold"),
        text(WIDTH - MARGIN, 24, f"{frame.size:,} slots · {len(frame.reservations):,} "
             "reservations", text_anchor="end", fill=MUTED),
        text_lines(MARGIN, 44, stats.lines(), 16, id=f"{dom_id}-stats", class_="stats",
                   fill=MUTED, data_written=stats.written, data_pending=stats.pending,
                   data_internal=stats.internal, data_free=stats.free,
                   data_stranded=stats.stranded, data_largest_gap=stats.largest_gap,
                   data_blocked=str(stats.blocked).lower()),
    ]
    for row in range(rows):
        y = BAND_TOP + row * (ROW_HEIGHT + ROW_GAP)
        pieces.append(text(GUTTER - 6, y + ROW_HEIGHT / 2 + 4, f"{row * band.per_row:,}",
                           text_anchor="end", font_size=10, fill=MUTED))
        length = min(band.per_row, frame.size - row * band.per_row)
        pieces.append(rect(GUTTER, y, max(length, 0) * band.scale, ROW_HEIGHT, fill="#ffffff",
                           stroke=EDGE, stroke_width=0.8))
    for start, length in frame.gaps:
        stranded = frame.next_request is not None and length < frame.next_request
        pieces += band.pieces(start, length, class_="gap stranded" if stranded else "gap",
                              data_start=start, data_length=length,
                              fill=STRANDED_FILL if stranded else "#ffffff",
                              stroke=ALERT if stranded else None,
                              stroke_width=1.0 if stranded else None)
    for res in frame.reservations:
        if res.request_id not in colors:
            raise ValueError(f"palette has no colour for request {res.request_id!r}")
        color = colors[res.request_id]
        parts = (
            ("internal", res.start + res.final, res.reserved - res.final,
             f"url(#{HATCH_ID})"),
            ("pending", res.start + res.written, res.final - res.written,
             mix(color, "#ffffff", PENDING_TINT)),
            ("written", res.start, res.written, color),
        )
        for kind, start, length, fill in parts:
            if length:
                pieces += band.pieces(start, length, class_=kind,
                                      data_request=res.request_id, fill=fill)
        pieces += band.pieces(res.start, res.reserved, class_="outline", fill="none",
                              stroke="#ffffff", stroke_width=1.0)
    y = BAND_TOP + rows * (ROW_HEIGHT + ROW_GAP) + 4
    marks, y = legend([
        (Swatch(OWNER_COLORS[0]), "written (tokens)"),
        (Swatch(mix(OWNER_COLORS[0], "#ffffff", PENDING_TINT)), "reserved, not yet written"),
        (Swatch(HATCH_FILL, HATCH, 1.5), "never written (internal)"),
        (Swatch("#ffffff", EDGE), "free gap"),
        (Swatch(STRANDED_FILL, ALERT), "gap too small for the next request"),
    ], y)
    pieces += marks
    title = f"{frame.label or 'token arena'}: {' · '.join(stats.lines())}"
    return document(y + MARGIN - 8, pieces, title=title, class_="course-arena")


def arena_timeline(
    frames: Sequence[ArenaFrame],
    *,
    step: int | None = None,
    rows: int | None = None,
    name: str = "arena",
    interval_ms: int = 500,
) -> Timeline[ArenaFrame]:
    """A timeline over arena frames: ``.at(step)`` for a picture, ``.widget()`` to play it.

    One palette over all frames keeps each request's colour; requests in one frame differ
    while the palette lasts.
    """
    if len(frames) == 0:
        raise ValueError("frames is empty: an arena timeline needs at least one frame")
    colors = owner_colors((r.request_id for f in frames for r in f.reservations),
                          together=[[r.request_id for r in f.reservations] for f in frames])

    def draw(frame: ArenaFrame, *, dom_id: str) -> str:
        return render_svg(frame, rows=rows, palette=colors, dom_id=dom_id)

    def describe(frame: ArenaFrame) -> str:
        return f"{frame.label or 'token arena'}: {' · '.join(arena_stats(frame).lines())}"

    return Timeline(frames, draw, name=name, describe=describe, step=step,
                    interval_ms=interval_ms)
