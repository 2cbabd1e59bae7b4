"""The block-pool view: the physical pool, one request's block table, live statistics.

Draws a :class:`~course_lib.snapshot.PoolSnapshot` as SVG. Each block is a cell coloured by
its owning request (stable palette), filled from the bottom as far as it holds tokens; the
null block is dark and crossed; ``×n`` marks a reference count above one; a corner
triangle marks a block carrying a prefix-cache hash; what happened to a block this step
(``event``) is an outline (red for a copy-on-write copy). Selecting a request dims every
other block and draws its block table (logical -> physical), optionally with its hash
chain overlaid on the pool.

A pool larger than ``max_cells`` blocks (e.g. 30,720) is drawn aggregated: each cell
summarises a run of consecutive blocks and is shaded by the share of them in use; pass a
``window`` to see a range of blocks in detail instead.

DOM contract (``dom_id`` defaults to ``"pool"``): the statistics are the text element
``#pool-stats`` with ``data-used``, ``data-free``, ``data-shared``, ``data-cached``,
``data-tokens`` and ``data-utilization``; each detailed block is a ``g.block`` with
``data-block``, ``data-owner``, ``data-refs``, ``data-tokens`` and the classes ``null``,
``free``, ``shared``, ``cached`` and its event (``cow-copy``, ...); its fill is the
``rect.fill`` inside; an aggregated cell is ``rect.run`` with ``data-first``,
``data-last`` and ``data-used``; the block table is ``g#pool-table`` with
``data-request``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

from course_lib.hybrid import request_of
from course_lib.paged import NULL_BLOCK
from course_lib.snapshot import BlockView, PoolSnapshot
from course_lib.viz.palette import (
    CACHE_MARK,
    NULL_FILL,
    SHARED_BY_MANY,
    UNOWNED_FILL,
    mix,
    natural_key,
    owner_colors,
)
from course_lib.viz.svg import (
    ALERT,
    EDGE,
    EMPTY,
    INK,
    MARGIN,
    MUTED,
    WIDTH,
    SvgPicture,
    Swatch,
    attrs,
    count,
    document,
    esc,
    legend,
    num,
    rect,
    text,
)
from course_lib.viz.timeline import Timeline

MAX_CELLS = 512
"""Most cells drawn; a larger pool (or window) is aggregated into at most this many."""

RAMP_LOW, RAMP_HIGH = "#eef2f6", "#1d4f7a"
MAX_STRIPES = 4
"""A block shared by up to this many owners is striped in their colours."""

EVENT_STYLES: dict[str, Swatch] = {
    "cow-copy": Swatch("#ffffff", ALERT, 3.0),
    "cache-hit": Swatch("#ffffff", CACHE_MARK, 2.5),
    "shared": Swatch("#ffffff", "#1f3b73", 2.5, "3 2"),
    "allocated": Swatch("#ffffff", INK, 1.5),
    "freed": Swatch("#ffffff", UNOWNED_FILL, 1.5, "3 2"),
    "evicted": Swatch("#ffffff", "#9467bd", 2.0, "3 2"),
}
"""Outline drawn around a block for each ``BlockView.event``."""

EVENT_LABELS: dict[str, str] = {
    "cow-copy": "copy-on-write copy",
    "cache-hit": "prefix-cache hit",
    "shared": "newly shared (fork)",
    "allocated": "allocated this step",
    "freed": "freed this step",
    "evicted": "evicted from cache",
}

GRID_TOP = 58.0


@dataclass(frozen=True)
class PoolStats:
    """What the statistics line reports for one snapshot."""

    blocks: int
    usable: int
    used: int
    free: int
    shared: int
    cached: int
    tokens: int
    requests: int
    block_size: int
    tables: int = 0

    @property
    def occupancy(self) -> float:
        """Share of usable blocks (all but the null block) in use."""
        return self.used / self.usable if self.usable else 0.0

    @property
    def utilization(self) -> float:
        """Share of the slots of blocks in use that hold tokens (U_paged over the pool)."""
        return self.tokens / (self.used * self.block_size) if self.used else 0.0

    def _tables(self) -> str:
        """" (N block tables)" when requests hold more than one table each (KV-cache groups
        of a hybrid model, chapter 08), else nothing."""
        more = self.tables > self.requests
        return f" ({count(self.tables, 'block table')})" if more else ""

    def line(self) -> str:
        """The statistics as one line of text."""
        return (
            f"in use {self.used:,} of {self.usable:,} blocks ({self.occupancy:.1%}) · "
            f"free {self.free:,} · shared {self.shared:,} · cached {self.cached:,} · "
            f"{count(self.requests, 'request')}{self._tables()} · "
            f"{self.utilization:.1%} of allocated slots hold tokens"
        )


def pool_stats(snapshot: PoolSnapshot) -> PoolStats:
    """Count used, free, shared and cached blocks; reject impossible block contents."""
    size = snapshot.block_size
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {size!r}")
    if not snapshot.blocks:
        raise ValueError("snapshot has no blocks")
    usable = used = shared = cached = tokens = 0
    for block in snapshot.blocks:
        if not 0 <= block.tokens <= size:
            raise ValueError(
                f"block {block.block_id} holds {block.tokens!r} tokens; block_size is {size}"
            )
        if block.ref_count < 0:
            raise ValueError(f"block {block.block_id} has ref_count {block.ref_count!r}")
        if block.is_null:
            continue
        usable += 1
        cached += block.cached_hash is not None
        if block.ref_count:
            used += 1
            shared += block.ref_count > 1
            tokens += block.tokens
    return PoolStats(
        blocks=len(snapshot.blocks), usable=usable, used=used, free=usable - used,
        shared=shared, cached=cached, tokens=tokens,
        requests=len({request_of(name) for name in snapshot.tables}), block_size=size,
        tables=len(snapshot.tables),
    )


def _request_ids(snapshots: Sequence[PoolSnapshot]) -> list[str]:
    """Every request that appears in any of the snapshots, in natural order."""
    ids = {rid for snap in snapshots for rid in snap.tables}
    ids.update(owner for snap in snapshots for block in snap.blocks for owner in block.owners)
    return sorted(ids, key=natural_key)


def _drawn_ids(snapshot: PoolSnapshot, start: int, stop: int) -> list[str]:
    """Owners of blocks ``start:stop`` (and, for the whole pool, every table), naturally sorted."""
    ids = {owner for block in snapshot.blocks[start:stop] for owner in block.owners}
    if (start, stop) == (0, len(snapshot.blocks)):
        ids.update(snapshot.tables)
    return sorted(ids, key=natural_key)


def _together(snapshot: PoolSnapshot, max_cells: int) -> list[list[str]]:
    """The groups of requests a picture of ``snapshot`` draws in colour at once: the whole
    pool when it is drawn in detail, else each window the widget offers."""
    count = len(snapshot.blocks)
    windows = [(0, count)] if count <= max_cells else [w for _, w in _windows(count, max_cells)[1:]]
    return [_drawn_ids(snapshot, start, stop) for start, stop in windows]


def _distinct(colors: Mapping[str, str], drawn: Sequence[str]) -> Mapping[str, str]:
    """``colors``, with clashes among the ``drawn`` requests resolved (a timeline's palette
    can only keep apart the requests of the windows it knows)."""
    if len({colors[rid] for rid in drawn}) == len(set(drawn)):
        return colors
    return {**colors, **owner_colors(drawn, together=[drawn], preferred=colors)}


def _check_window(window: tuple[int, int] | None, count: int) -> tuple[int, int]:
    """``window`` as (start, stop) within the pool, or the whole pool for ``None``."""
    if window is None:
        return 0, count
    ok = (
        isinstance(window, tuple) and len(window) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in window)
        and 0 <= window[0] < window[1] <= count
    )
    if not ok:
        raise ValueError(f"window must be (start, stop) with 0 <= start < stop <= {count}, "
                         f"got {window!r}")
    return window


def _grid(count: int) -> tuple[int, float]:
    """Columns and cell pitch for ``count`` cells across the course width."""
    cols = count if count <= 32 else (32 if count <= 256 else 64)
    return cols, min(48.0, (WIDTH - 2 * MARGIN) / cols)


def _fill_colors(block: BlockView, colors: Mapping[str, str]) -> list[str]:
    """The colours a block's filled part is striped in."""
    if not block.owners:
        return [UNOWNED_FILL]
    if len(block.owners) > MAX_STRIPES:
        return [SHARED_BY_MANY]
    return [colors[owner] for owner in block.owners]


def _block_cell(
    block: BlockView, x: float, y: float, size: float, block_size: int,
    colors: Mapping[str, str], dimmed: bool,
) -> str:
    """One detailed block: background, fill stripes, labels, cache mark, event outline."""
    classes = ["block"]
    if block.is_null:
        classes.append("null")
    elif block.ref_count == 0:
        classes.append("free")
    if block.ref_count > 1:
        classes.append("shared")
    if block.cached_hash is not None:
        classes.append("cached")
    if block.event is not None:
        classes.append(block.event)
    details = [f"block {block.block_id}", ", ".join(block.owners) or "no owner",
               f"{block.tokens}/{block_size} tokens", f"{block.ref_count} refs"]
    if block.cached_hash is not None:
        details.append(f"hash {block.cached_hash[:12]}")
    if block.event is not None:
        details.append(EVENT_LABELS[block.event])
    if block.is_null:
        details = [f"block {block.block_id}", "null block (reserved, never allocated)"]
    group = attrs(class_=" ".join(classes), data_block=block.block_id,
                  data_owner=",".join(block.owners) or None, data_refs=block.ref_count,
                  data_tokens=block.tokens, opacity=0.28 if dimmed else None)
    parts = [
        f"<g {group}>",
        f"<title>{esc(' · '.join(details))}</title>",
        rect(x, y, size, size, rx=2, fill=NULL_FILL if block.is_null else EMPTY,
             stroke=EDGE, stroke_width=0.5),
    ]
    if block.is_null:
        parts.append(f'<path d="M{num(x)} {num(y)}l{num(size)} {num(size)}" '
                     f'stroke="{UNOWNED_FILL}" stroke-width="1"/>')
    elif block.tokens:
        height = size * block.tokens / block_size
        stripes = _fill_colors(block, colors)
        width = size / len(stripes)
        parts.extend(
            rect(x + i * width, y + size - height, width, height, class_="fill", fill=color)
            for i, color in enumerate(stripes)
        )
    if size >= 22:
        label_size = min(10.0, size * 0.24)
        parts.append(text(x + 2.5, y + 2 + label_size, block.block_id, font_size=label_size,
                          fill="#ffffff" if block.is_null or block.tokens == block_size
                          else MUTED))
    if block.ref_count > 1 and size >= 14:
        label = f"×{block.ref_count}"
        font = min(9.5, size * 0.36)
        width, height = 0.62 * font * len(label) + 4, font + 3
        left, top = x + size - width - 1.5, y + size - height - 1.5
        parts.append(rect(left, top, width, height, rx=2, fill="#ffffff", fill_opacity=0.9))
        parts.append(text(left + width / 2, top + height - 2.6, label, class_="refs",
                          text_anchor="middle", font_size=font, font_weight="bold"))
    if block.cached_hash is not None:
        mark = size * 0.3
        parts.append(f'<path d="M{num(x + size - mark)} {num(y)}h{num(mark)}v{num(mark)}z" '
                     f'fill="{CACHE_MARK}"/>')
    if block.event is not None:
        style = EVENT_STYLES[block.event]
        inset = style.stroke_width / 2
        parts.append(rect(x + inset, y + inset, size - 2 * inset, size - 2 * inset,
                          class_="event", fill="none", stroke=style.stroke,
                          stroke_width=style.stroke_width, stroke_dasharray=style.dash))
    parts.append("</g>")
    return "".join(parts)


def _detail(
    snapshot: PoolSnapshot, start: int, stop: int, colors: Mapping[str, str],
    highlight: frozenset[int] | None, chain: Sequence[int],
) -> tuple[list[str], float, float]:
    """Blocks ``start:stop`` one cell each, with the hash-chain polyline; returns the y below
    and the cell side."""
    cols, pitch = _grid(stop - start)
    size = pitch - max(1.0, pitch * 0.1)
    pieces: list[str] = []
    centres: dict[int, tuple[float, float]] = {}
    for i, block in enumerate(snapshot.blocks[start:stop]):
        x = MARGIN + (i % cols) * pitch
        y = GRID_TOP + (i // cols) * pitch
        dimmed = highlight is not None and block.block_id not in highlight
        pieces.append(_block_cell(block, x, y, size, snapshot.block_size, colors, dimmed))
        centres[block.block_id] = (x + size / 2, y + size / 2)
    points = [centres[b] for b in chain if b in centres]
    if points:
        line = attrs(points=" ".join(f"{num(px)},{num(py)}" for px, py in points),
                     fill="none", stroke=INK, stroke_width=1.6, stroke_opacity=0.8)
        nodes = "".join(f"<circle {attrs(cx=px, cy=py, r=4.0 if i == 0 else 2.5, fill=INK)}/>"
                        for i, (px, py) in enumerate(points))
        pieces.append(f'<g class="hash-chain"><polyline {line}/>{nodes}</g>')
    rows = math.ceil((stop - start) / cols)
    return pieces, GRID_TOP + rows * pitch + 6, size


def _aggregate(
    snapshot: PoolSnapshot, start: int, stop: int, max_cells: int
) -> tuple[list[str], float, int, set[str]]:
    """Runs of consecutive blocks, one cell each, shaded by the share in use; returns the
    pieces, the y below, the run length and the run marks drawn (``run-cow``, ``run-cached``)."""
    run = math.ceil((stop - start) / max_cells)
    cells = math.ceil((stop - start) / run)
    cols, pitch = _grid(cells)
    size = pitch - max(1.0, pitch * 0.1)
    ramp = [mix(RAMP_LOW, RAMP_HIGH, level / 10) for level in range(11)]
    pieces: list[str] = []
    marks: set[str] = set()
    blocks = snapshot.blocks
    for c in range(cells):
        first = start + c * run
        group = blocks[first : min(first + run, stop)]
        usable = used = 0
        cow = cached = False
        for block in group:
            if block.is_null:
                continue
            usable += 1
            used += block.ref_count > 0
            cow = cow or block.event == "cow-copy"
            cached = cached or block.cached_hash is not None
        share = used / usable if usable else 0.0
        x = MARGIN + (c % cols) * pitch
        y = GRID_TOP + (c // cols) * pitch
        pieces.append(rect(x, y, size, size, class_="run cow-copy" if cow else "run",
                           data_first=first, data_last=first + len(group) - 1,
                           data_used=used, fill=ramp[round(share * 10)]))
        if cached:
            marks.add("run-cached")
            mark = size * 0.35
            pieces.append(f'<path d="M{num(x + size - mark)} {num(y)}h{num(mark)}v{num(mark)}z" '
                          f'fill="{CACHE_MARK}"/>')
        if cow:
            marks.add("run-cow")
            pieces.append(rect(x + 1, y + 1, size - 2, size - 2, fill="none",
                               stroke=EVENT_STYLES["cow-copy"].stroke, stroke_width=2.0))
    rows = math.ceil(cells / cols)
    return pieces, GRID_TOP + rows * pitch + 6, run, marks


def _owner_legend(
    snapshot: PoolSnapshot, ids: list[str], colors: Mapping[str, str], y: float,
    limit: int = 16,
) -> tuple[list[str], float]:
    """One entry per request drawn: colour, blocks, tokens."""
    items = []
    for rid in ids[:limit]:
        label = rid
        if rid in snapshot.tables:  # the blocks it holds (not the null block)
            label += f" · {sum(b != NULL_BLOCK for b in snapshot.tables[rid])} blocks"
        if rid in snapshot.seq_lens:
            label += f" · {snapshot.seq_lens[rid]:,} tok"
        items.append((Swatch(colors[rid]), label))
    if len(ids) > limit:
        items.append((Swatch("#ffffff", EDGE), f"+{len(ids) - limit} more requests"))
    shades = len({colors[rid] for rid in ids})
    if shades < len(ids):  # more requests than colours: say so rather than mislead
        items.append((Swatch("#ffffff", EDGE), f"{len(ids)} requests share {shades} colours"))
    return legend(items, y)


MARKS: dict[str, tuple[Swatch, str]] = {
    "null": (Swatch(NULL_FILL), "null block"),
    "empty": (Swatch(EMPTY, EDGE), "empty slots"),
    "refs": (Swatch(INK, glyph="×n"), "reference count"),
    "many": (Swatch(SHARED_BY_MANY), f"shared by more than {MAX_STRIPES}"),
    "cached": (Swatch(CACHE_MARK), "cached hash (free = evictable)"),
    **{event: (EVENT_STYLES[event], label) for event, label in EVENT_LABELS.items()},
}
"""Legend entry of each mark a detailed block can show, in legend order."""


def _detail_marks(blocks: Sequence[BlockView], block_size: int, cell: float) -> set[str]:
    """The keys of :data:`MARKS` that ``blocks``, drawn as cells of side ``cell``, show."""
    marks: set[str] = set()
    for block in blocks:
        if block.is_null:
            marks.add("null")
            continue
        if block.tokens < block_size:
            marks.add("empty")
        if block.ref_count > 1 and cell >= 14:
            marks.add("refs")
        if block.tokens and len(block.owners) > MAX_STRIPES:
            marks.add("many")
        if block.cached_hash is not None:
            marks.add("cached")
        if block.event is not None:
            marks.add(block.event)
    return marks


def _marker_legend(
    y: float, marks: set[str], aggregated_run: int | None
) -> tuple[list[str], float]:
    """What the marks drawn mean, only those drawn, in :data:`MARKS` order; in aggregate
    mode, the shading scale and the run marks come first (block marks only from a table)."""
    items: list[tuple[Swatch, str]] = []
    if aggregated_run is not None:
        items += [(Swatch(mix(RAMP_LOW, RAMP_HIGH, share)), f"{share:.0%} in use")
                  for share in (0.0, 0.5, 1.0)]
        if "run-cow" in marks:
            items.append((Swatch(EMPTY, EVENT_STYLES["cow-copy"].stroke, 2.0),
                          "holds a copy-on-write copy"))
        if "run-cached" in marks:
            items.append((Swatch(CACHE_MARK), "holds cached blocks"))
        items.append((Swatch("#ffffff", EDGE), f"1 cell = {aggregated_run:,} blocks"))
    items += [entry for key, entry in MARKS.items() if key in marks]
    if not items:
        return [], y
    return legend(items, y)


TABLE_LABEL_W = 70.0
"""Width of the block table's row labels."""


def _table_col_w(hash_chain: bool) -> float:
    """Width of one block-table column (wider when it shows hashes)."""
    return 46.0 if hash_chain else 30.0


def _table_columns(length: int, hash_chain: bool, focus: int | None) -> list[int | None]:
    """Logical indices a block table of ``length`` entries shows, ``None`` for an elision.

    A table too long for the width keeps its first and last entries; the middle shows
    ``focus`` (clamped to the table) with its neighbours, else the entries after the first.
    """
    fit = int((WIDTH - 2 * MARGIN - TABLE_LABEL_W) // _table_col_w(hash_chain))
    if length <= fit:
        return list(range(length))
    last = length - 1
    focus = None if focus is None else min(focus, last)
    if focus is None or focus < fit - 2 or focus == last:
        return [*range(fit - 2), None, last]
    span = fit - 4
    first = max(1, min(focus - span // 2, last - span))
    keep = sorted({0, last, *range(first, first + span)})
    shown: list[int | None] = []
    for logical in keep:
        if shown and shown[-1] is not None and logical != shown[-1] + 1:
            shown.append(None)
        shown.append(logical)
    return shown


def _block_table(
    snapshot: PoolSnapshot, request: str, hash_chain: bool, colors: Mapping[str, str],
    by_id: Mapping[int, BlockView], y: float, dom_id: str, shown: Sequence[int | None],
    focus: int | None,
) -> tuple[list[str], float]:
    """The request's block table as rows: logical index, physical block, tokens, hash."""
    table = snapshot.tables.get(request, ())
    if table:
        head = f"block table of {request}"
        if request in snapshot.seq_lens:
            head += f": {snapshot.seq_lens[request]:,} tokens"
        held = sum(b != NULL_BLOCK for b in table)
        if held == len(table):
            head += f" in {count(held, 'block')} of {snapshot.block_size}"
        else:  # a window group's table, null where it let blocks go (chapter 08)
            head += (f", {len(table):,} entries: {len(table) - held:,} null (let go), "
                     f"{count(held, 'block')} of {snapshot.block_size}")
    else:
        head = f"request {request} holds no blocks at this step"
    pieces = [f'<g {attrs(id=f"{dom_id}-table", class_="block-table", data_request=request)}>',
              text(MARGIN, y + 14, head, font_size=13, font_weight="bold")]
    y += 24
    if not table:
        return [*pieces, "</g>"], y
    label_w, col_w, row_h = TABLE_LABEL_W, _table_col_w(hash_chain), 20.0
    focus = None if focus is None else min(focus, len(table) - 1)
    row_names = ["logical", "physical", "tokens"] + (["hash"] if hash_chain else [])
    for r, name in enumerate(row_names):
        pieces.append(text(MARGIN, y + r * row_h + 14, name, fill=MUTED, font_size=11))
    light = mix(colors[request], "#ffffff", 0.45)
    for c, logical in enumerate(shown):
        x = MARGIN + label_w + c * col_w
        if logical is None:
            pieces.append(text(x + col_w / 2, y + row_h + 14, "…", text_anchor="middle"))
            continue
        block = by_id[table[logical]]
        cell = col_w - 4
        pieces += [
            text(x + col_w / 2, y + 14, logical, text_anchor="middle", font_size=11,
                 font_weight="bold" if logical == focus else None),
            rect(x, y + row_h, cell, row_h - 2, class_="table-cell", rx=2, fill=EMPTY,
                 stroke=EVENT_STYLES[block.event].stroke if block.event else EDGE,
                 stroke_width=2.0 if block.event else 0.5,
                 data_logical=logical, data_block=block.block_id),
            rect(x, y + row_h, cell * block.tokens / snapshot.block_size, row_h - 2, rx=2,
                 fill=light),
            text(x + cell / 2, y + row_h + 13, block.block_id, text_anchor="middle",
                 font_size=11, font_weight="bold"),
            text(x + col_w / 2, y + 2 * row_h + 14, "–" if block.is_null else block.tokens,
                 text_anchor="middle", font_size=11, fill=MUTED),
        ]
        if hash_chain:
            shown_hash = block.cached_hash[:6] if block.cached_hash else "-"
            pieces.append(text(x + col_w / 2, y + 3 * row_h + 14, shown_hash,
                               text_anchor="middle", font_size=10, fill=CACHE_MARK,
                               font_family="monospace"))
    return [*pieces, "</g>"], y + len(row_names) * row_h + 8


def render_svg(
    snapshot: PoolSnapshot,
    *,
    request: str | None = None,
    hash_chain: bool = False,
    window: tuple[int, int] | None = None,
    max_cells: int = MAX_CELLS,
    palette: Mapping[str, str] | None = None,
    dom_id: str = "pool",
    table_focus: int | None = None,
) -> str:
    """The snapshot as SVG text; same arguments give byte-identical output.

    ``request`` selects a request whose block table is drawn (and whose blocks stay
    bright); ``hash_chain`` overlays its chain of hashed blocks; ``window=(start, stop)``
    limits the drawing to those blocks; more than ``max_cells`` blocks are aggregated;
    ``palette`` maps request ids to colours (a timeline passes one for all its frames).
    ``table_focus`` is the logical index of the request's block table that stays visible
    when the table is too long to show in full (one past the end shows the end, so one
    focus serves every frame of a growing table). The legend lists only the marks drawn.
    """
    if isinstance(max_cells, bool) or not isinstance(max_cells, int) or max_cells <= 0:
        raise ValueError(f"max_cells must be a positive integer, got {max_cells!r}")
    if table_focus is not None:
        if (isinstance(table_focus, bool) or not isinstance(table_focus, int)
                or table_focus < 0):
            raise ValueError(
                f"table_focus must be a non-negative integer or None, got {table_focus!r}")
        if request is None:
            raise ValueError(f"table_focus={table_focus!r} needs a request whose table to show")
    stats = pool_stats(snapshot)
    start, stop = _check_window(window, len(snapshot.blocks))
    detail = stop - start <= max_cells
    colors: Mapping[str, str] = {}
    if palette is not None:
        colors = palette
    elif detail or request is not None:
        drawn = _drawn_ids(snapshot, start, stop) if detail else []
        chosen = [request] if request in _request_ids([snapshot]) else []
        colors = owner_colors(_request_ids([snapshot]), together=[[*drawn, *chosen]])
    if request is not None and request not in colors:
        raise ValueError(f"request {request!r} appears nowhere in what is drawn")
    table = snapshot.tables.get(request, ()) if request is not None else ()
    by_id = {b.block_id: b for b in snapshot.blocks} if table else {}
    unknown = [b for b in table if b not in by_id]
    if unknown:
        raise ValueError(f"{request}'s block table names block {unknown[0]!r}, "
                         "which is not in the snapshot")
    pieces = [
        text(MARGIN, 24, snapshot.label or "block pool", font_size=15, font_weight="bold"),
        text(WIDTH - MARGIN, 24, f"{len(snapshot.blocks):,} blocks of {snapshot.block_size}"
             f" slots" + ("" if (start, stop) == (0, len(snapshot.blocks))
                          else f" · showing {start:,}-{stop - 1:,}"),
             text_anchor="end", fill=MUTED),
        text(MARGIN, 44, stats.line(), id=f"{dom_id}-stats", class_="stats", fill=MUTED,
             data_used=stats.used, data_free=stats.free, data_shared=stats.shared,
             data_cached=stats.cached, data_tokens=stats.tokens,
             data_utilization=f"{stats.utilization:.4f}"),
    ]
    run: int | None = None
    shown = _table_columns(len(table), hash_chain, table_focus)
    marks = {by_id[table[i]].event for i in shown if i is not None} - {None}
    if detail:
        drawn = _drawn_ids(snapshot, start, stop)
        missing = [rid for rid in drawn if rid not in colors]
        if missing:
            raise ValueError(f"palette has no colour for request {missing[0]!r}")
        colors = _distinct(colors, [*drawn, *([request] if request else [])])
        chain = [b for b in table if by_id[b].cached_hash is not None] if hash_chain else []
        grid, y, cell = _detail(snapshot, start, stop, colors,
                                frozenset(table) if table else None, chain)
        marks |= _detail_marks(snapshot.blocks[start:stop], snapshot.block_size, cell)
        owners, y = _owner_legend(snapshot, drawn, colors, y)
        grid += owners
    else:
        grid, y, run, run_marks = _aggregate(snapshot, start, stop, max_cells)
        marks |= run_marks
    pieces += grid
    key, y = _marker_legend(y, marks, run)
    pieces += key
    if request is not None:
        rows, y = _block_table(snapshot, request, hash_chain, colors, by_id, y + 4, dom_id,
                               shown, table_focus)
        pieces += rows
    return document(y + MARGIN - 8, pieces, title=_summary(snapshot, stats),
                    class_="course-pool")


def _summary(snapshot: PoolSnapshot, stats: PoolStats | None = None) -> str:
    """One line saying what a snapshot holds: its label and statistics."""
    stats = pool_stats(snapshot) if stats is None else stats
    return f"{snapshot.label or 'block pool'}: {stats.line()}"


def pool_picture(snapshot: PoolSnapshot, **options: Any) -> SvgPicture:
    """One snapshot as a static picture (what ``pool_timeline(...).at(step)`` returns).

    ``options`` are those of :func:`render_svg` (``request``, ``hash_chain``, ``window``,
    ``table_focus``, ``max_cells``, ``palette``, ``dom_id``).
    """
    return SvgPicture(render_svg(snapshot, **options), _summary(snapshot))


def _windows(count: int, max_cells: int) -> list[tuple[str, tuple[int, int]]]:
    """Dropdown options: the whole pool aggregated, then detail windows of max_cells."""
    options = [(f"all {count:,} blocks (aggregated)", (0, count))]
    for start in range(0, count, max_cells):
        stop = min(start + max_cells, count)
        options.append((f"blocks {start:,}-{stop - 1:,}", (start, stop)))
    return options


def pool_timeline(
    snapshots: Sequence[PoolSnapshot],
    *,
    step: int | None = None,
    numbers: Sequence[int] | None = None,
    max_cells: int = MAX_CELLS,
    name: str = "pool",
    interval_ms: int = 500,
) -> Timeline[PoolSnapshot]:
    """A timeline over pool snapshots: ``.at(step, request=..., hash_chain=..., window=...,
    table_focus=...)`` for a static picture, ``.widget()`` for Play, slider, request and
    window choosers.

    ``step`` and ``numbers`` are :class:`~course_lib.viz.timeline.Timeline`'s (the frame
    shown, and what the slider calls each frame: pass the steps the snapshots were taken
    at). The "hash chain" box is offered only when some block carries a prefix-cache hash.
    Colours come from one palette over all snapshots, so a request keeps its colour, and
    requests drawn together (in one frame, or one window of a large pool) differ while the
    palette lasts (see :mod:`course_lib.viz.palette`).
    """
    if len(snapshots) == 0:
        raise ValueError("snapshots is empty: a pool timeline needs at least one snapshot")
    ids = _request_ids(snapshots)
    colors = owner_colors(ids, together=[g for s in snapshots for g in _together(s, max_cells)])
    largest = max(len(s.blocks) for s in snapshots)
    hashed = any(b.cached_hash is not None for s in snapshots for b in s.blocks)

    def draw(
        snapshot: PoolSnapshot, *, dom_id: str, request: str = "", hash_chain: bool = False,
        window: tuple[int, int] | None = None, table_focus: int | None = None,
    ) -> str:
        return render_svg(snapshot, request=request or None, hash_chain=hash_chain,
                          window=window, max_cells=max_cells, palette=colors, dom_id=dom_id,
                          table_focus=table_focus)

    def controls() -> dict[str, widgets.ValueWidget]:
        chosen: dict[str, widgets.ValueWidget] = {
            "request": widgets.Dropdown(
                options=[("none", ""), *((rid, rid) for rid in ids)], value="",
                description="request",
            ),
        }
        if hashed:
            chosen["hash_chain"] = widgets.Checkbox(value=False, description="hash chain",
                                                    indent=False)
        if largest > max_cells:
            windows = _windows(largest, max_cells)
            chosen["window"] = widgets.Dropdown(options=windows, value=windows[0][1],
                                                description="blocks")
        return chosen

    return Timeline(snapshots, draw, name=name, describe=_summary, controls=controls,
                    step=step, numbers=numbers, interval_ms=interval_ms)
