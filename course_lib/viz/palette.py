"""Stable colours for requests: the same request keeps its colour in every frame and view.

Colours are handed out in natural order of the request ids ("req-2" before "req-10"), so
consecutive requests get different colours and the assignment does not depend on which
frame is drawn first. A timeline builds one palette from all its frames.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

OWNER_COLORS: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
    "#9c755f", "#ff9da7", "#499894", "#d37295", "#8cd17d", "#a0cbe8",
)
"""Qualitative palette (Tableau-derived) without the reds and greys used for markers."""

SHARED_BY_MANY = "#5b6770"
"""Fill of a block shared by more owners than can be drawn as stripes."""


def natural_key(request_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders digit runs numerically: a2 < a10."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.split(r"(\d+)", request_id)
        if part
    )


def owner_colors(request_ids: Iterable[str]) -> dict[str, str]:
    """Map each distinct request id to a palette colour, in natural id order (cycling)."""
    ordered = sorted(set(request_ids), key=natural_key)
    return {rid: OWNER_COLORS[i % len(OWNER_COLORS)] for i, rid in enumerate(ordered)}


def mix(color: str, other: str, amount: float) -> str:
    """``color`` moved ``amount`` of the way towards ``other`` (both ``#rrggbb``)."""
    if not 0.0 <= amount <= 1.0:
        raise ValueError(f"amount must lie in [0, 1], got {amount!r}")
    start = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    end = [int(other[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(a + (b - a) * amount) for a, b in zip(start, end, strict=True)]
    return "#" + "".join(f"{c:02x}" for c in mixed)
