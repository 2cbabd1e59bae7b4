"""Stable, distinct colours for requests: one colour per request in every frame and view.

Requests drawn together (one frame of a pool, one window of a large pool, one arena) get
different colours while the palette lasts. With no more requests than colours, each has
its own. With more, colours are handed out greedily in order of first appearance, each
request taking the first colour none of the requests drawn with it already has. Over a
timeline whose frames are the groups, this needs the fewest colours possible (a request is
present over consecutive frames), so a request keeps its colour in every frame and differs
from every request beside it as long as at most ``len(OWNER_COLORS)`` are drawn together.
Beyond that colours must repeat; a request then takes the colour fewest of its companions
have (and the pool view's legend says colours repeat).

The colours the pool view reserves for its marks (null block, cached-hash mark, unowned and
many-owner fills) live here too, so the palette can be checked against them: no request
colour lies within :data:`MIN_MARK_DISTANCE` (CIELAB ΔE) of a reserved colour.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

OWNER_COLORS: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
    "#9c755f", "#ff9da7", "#b6992d", "#d37295", "#8cd17d", "#a0cbe8",
    "#6a3d9a", "#e7298a", "#e5c494", "#b15928", "#fccde5", "#1b9e77", "#a6d854", "#fc8d62",
)
"""Qualitative palette: twelve Tableau-derived colours without the reds, greys and the dark
teal used for marks (Tableau's #499894 sat too close to :data:`CACHE_MARK` and is replaced by
#b6992d), then eight ColorBrewer colours, each the farthest (CIELAB) from those before it."""

SHARED_BY_MANY = "#5b6770"
"""Fill of a block shared by more owners than can be drawn as stripes."""

NULL_FILL = "#3d444d"
"""Fill of the null block."""

UNOWNED_FILL = "#8c959f"
"""Fill of tokens in a block no request owns (a cached, evictable block)."""

CACHE_MARK = "#12877f"
"""Corner mark of a block carrying a prefix-cache hash."""

RESERVED_COLORS: tuple[str, ...] = (NULL_FILL, CACHE_MARK, UNOWNED_FILL, SHARED_BY_MANY)
"""Colours that mean something other than "this request"; request colours keep away."""

MIN_MARK_DISTANCE = 20.0
"""Smallest CIELAB ΔE (1976) allowed between a request colour and a reserved colour."""


def natural_key(request_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders digit runs numerically: a2 < a10."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.split(r"(\d+)", request_id)
        if part
    )


def owner_colors(
    request_ids: Iterable[str],
    together: Iterable[Sequence[str]] | None = None,
    preferred: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Map each distinct request id to a palette colour, different within each group.

    While there are no more requests than colours, each has its own, in natural id order.
    Beyond that, ``together`` lists the groups of requests drawn at the same time (default:
    all of them at once, which cycles through the palette in natural id order); requests are
    coloured in order of first appearance in the groups (natural order within a group),
    then any left over in natural order. A request keeps its ``preferred`` colour (say, a
    timeline's) unless one coloured before it, and drawn with it, has taken it.
    """
    ids = sorted(set(request_ids), key=natural_key)
    groups = [ids] if together is None else [sorted(g, key=natural_key) for g in together]
    if len(ids) <= len(OWNER_COLORS):
        groups = [ids]  # enough colours for every request to have its own
    preferred = preferred or {}
    companions: dict[str, set[str]] = {rid: set() for rid in ids}
    order: dict[str, None] = {}
    for group in groups:
        for rid in group:
            if rid not in companions:
                raise ValueError(f"request {rid!r} is in a group but not in request_ids")
            companions[rid].update(group)
            order.setdefault(rid, None)
    colors: dict[str, str] = {}
    for rid in [*order, *(rid for rid in ids if rid not in order)]:
        taken = Counter(colors[other] for other in companions[rid] if other in colors)
        choices = dict.fromkeys([*([preferred[rid]] if rid in preferred else []),
                                 *OWNER_COLORS])
        colors[rid] = min(choices, key=lambda c: taken[c])  # the first of the least taken
    return {rid: colors[rid] for rid in ids}


def _lab(color: str) -> tuple[float, float, float]:
    """``#rrggbb`` (sRGB, D65) as CIELAB L*, a*, b*."""
    channels = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def color_distance(color: str, other: str) -> float:
    """Perceptual distance of two ``#rrggbb`` colours: CIELAB ΔE (1976); ~2.3 is just visible."""
    return math.dist(_lab(color), _lab(other))


def mix(color: str, other: str, amount: float) -> str:
    """``color`` moved ``amount`` of the way towards ``other`` (both ``#rrggbb``)."""
    if not 0.0 <= amount <= 1.0:
        raise ValueError(f"amount must lie in [0, 1], got {amount!r}")
    start = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    end = [int(other[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(a + (b - a) * amount) for a, b in zip(start, end, strict=True)]
    return "#" + "".join(f"{c:02x}" for c in mixed)
