"""The course's pictures: SVG structure, determinism, timelines driven like a user would.

Widgets are driven headlessly by setting ``.value`` (what a slider move does), then the
drawn HTML is read back through the same ids and classes a browser test uses.
"""

from __future__ import annotations

import functools
import io
import itertools
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import replace

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from IPython.core.formatters import DisplayFormatter
from PIL import Image

from course_lib.kv_math import MODELS
from course_lib.simulator import SimConfig, simulate
from course_lib.slab import SlabAllocator
from course_lib.snapshot import BlockView, PoolSnapshot
from course_lib.viz import (
    ArenaFrame,
    CapacityCalculator,
    Reservation,
    SvgPicture,
    Timeline,
    arena_frame,
    arena_frame_at,
    arena_stats,
    arena_timeline,
    arena_view,
    plot_concurrency_vs_context,
    pool_picture,
    pool_stats,
    pool_timeline,
    pool_view,
    show_source,
)
from course_lib.viz.palette import (
    MIN_MARK_DISTANCE,
    OWNER_COLORS,
    RESERVED_COLORS,
    color_distance,
    owner_colors,
)
from course_lib.viz.raster import svg_to_png
from course_lib.workload import generate_trace

pytestmark = pytest.mark.filterwarnings("error")

SVG = "{http://www.w3.org/2000/svg}"
COW_RED = pool_view.EVENT_STYLES["cow-copy"].stroke


def small_pool(label: str = "after fork", b_owner: str = "B") -> PoolSnapshot:
    """Null block, a block shared by A and B, a copy-on-write copy, a cached free block."""
    blocks = (
        BlockView(0, is_null=True),
        BlockView(1, 16, ("A", b_owner), 2, cached_hash="a1" * 32),
        BlockView(2, 4, ("A",), 1),
        BlockView(3, 4, (b_owner,), 1, event="cow-copy"),
        BlockView(4, 0),
        BlockView(5, 16, (), 0, cached_hash="b2" * 32),
    )
    return PoolSnapshot(16, blocks, {"A": (1, 2), b_owner: (1, 3)},
                        {"A": 20, b_owner: 20}, label=label)


@functools.cache
def big_pool(used_every: int = 2) -> PoolSnapshot:
    """30,720 blocks, the guide's 60 GiB pool, with every ``used_every``-th block in use."""
    blocks = [BlockView(0, is_null=True)]
    blocks += [
        BlockView(i, 16, (f"r{i // 64}",), 1) if i % used_every == 0 else BlockView(i)
        for i in range(1, 30_720)
    ]
    tables: dict[str, tuple[int, ...]] = {}
    for block in blocks[1:]:
        for owner in block.owners:
            tables.setdefault(owner, ())
            tables[owner] += (block.block_id,)
    return PoolSnapshot(16, tuple(blocks), tables, label=f"every {used_every}")


def parse(svg: str) -> ET.Element:
    """The SVG as an element tree (also proves it is well-formed XML)."""
    return ET.fromstring(svg)


def with_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    """Elements ``tag`` whose class list contains ``cls``."""
    return [e for e in root.iter(f"{SVG}{tag}") if cls in e.get("class", "").split()]


def block_cell(root: ET.Element, block_id: int) -> ET.Element:
    """The ``g.block`` drawing one block."""
    (cell,) = [g for g in with_class(root, "g", "block") if g.get("data-block") == str(block_id)]
    return cell


def find_widget(box: widgets.Widget, cls: str) -> widgets.Widget:
    """The widget inside ``box`` carrying DOM class ``cls`` (what a browser test targets)."""
    if cls in getattr(box, "_dom_classes", ()):
        return box
    for child in getattr(box, "children", ()):
        try:
            return find_widget(child, cls)
        except LookupError:
            continue
    raise LookupError(cls)


def data_step(html: str) -> str:
    return re.search(r'data-step="(\d+)"', html).group(1)


def stats_text(html: str, dom_id: str) -> str:
    return re.search(rf'id="{dom_id}-stats"[^>]*>(.*?)</text>', html).group(1)


# --- block pool: structure -----------------------------------------------------------


def test_pool_svg_draws_every_block_with_its_marks() -> None:
    root = parse(pool_view.render_svg(small_pool()))
    assert len(with_class(root, "g", "block")) == 6
    null = block_cell(root, 0)
    assert "null" in null.get("class").split()
    shared = block_cell(root, 1)
    assert {"shared", "cached"} <= set(shared.get("class").split())
    assert [t.text for t in with_class(shared, "text", "refs")] == ["×2"]
    cow = block_cell(root, 3)
    assert "cow-copy" in cow.get("class").split()
    assert [r.get("stroke") for r in with_class(cow, "rect", "event")] == [COW_RED]
    assert "free" in block_cell(root, 5).get("class").split()
    assert not with_class(block_cell(root, 4), "rect", "fill")


def test_pool_svg_fill_shows_tokens_and_owner_colours() -> None:
    root = parse(pool_view.render_svg(small_pool()))
    colors = owner_colors(["A", "B"])
    full = with_class(block_cell(root, 1), "rect", "fill")
    assert [r.get("fill") for r in full] == [colors["A"], colors["B"]]  # striped by owner
    background = block_cell(root, 2).find(f"{SVG}rect")
    (quarter,) = with_class(block_cell(root, 2), "rect", "fill")
    assert quarter.get("fill") == colors["A"]
    assert float(quarter.get("height")) == pytest.approx(float(background.get("height")) / 4,
                                                         abs=0.01)


def test_pool_stats_line_and_attributes() -> None:
    stats = pool_stats(small_pool())
    assert (stats.usable, stats.used, stats.free, stats.shared, stats.cached) == (5, 3, 2, 1, 2)
    assert stats.utilization == pytest.approx(24 / 48)
    root = parse(pool_view.render_svg(small_pool()))
    (line,) = [t for t in root.iter(f"{SVG}text") if t.get("id") == "pool-stats"]
    assert line.get("data-used") == "3" and line.get("data-free") == "2"
    assert line.text.startswith("in use 3 of 5 blocks (60.0%)")


def test_pool_svg_is_deterministic_and_address_free() -> None:
    first = pool_view.render_svg(small_pool(), request="A", hash_chain=True)
    assert first == pool_view.render_svg(small_pool(), request="A", hash_chain=True)
    assert not re.search(r"0x[0-9a-f]{6,}", first)
    picture = pool_timeline([small_pool()]).at(0)
    assert isinstance(picture, SvgPicture)
    assert picture._repr_svg_() == pool_timeline([small_pool()]).at(0).svg
    assert repr(picture).startswith("pool step 0 of 0: after fork: in use 3")


def test_picture_saves_its_svg(tmp_path) -> None:
    picture = pool_timeline([small_pool()]).at(0)
    assert picture.save(tmp_path / "pool.svg").read_text(encoding="utf-8") == picture.svg


def test_block_table_and_hash_chain_of_a_request() -> None:
    root = parse(pool_view.render_svg(small_pool(), request="B", hash_chain=True))
    (table,) = [g for g in root.iter(f"{SVG}g") if g.get("id") == "pool-table"]
    assert table.get("data-request") == "B"
    cells = with_class(table, "rect", "table-cell")
    assert [(c.get("data-logical"), c.get("data-block")) for c in cells] == [("0", "1"),
                                                                              ("1", "3")]
    assert cells[1].get("stroke") == COW_RED
    assert len(with_class(root, "g", "hash-chain")) == 1
    assert block_cell(root, 2).get("opacity") is not None  # A's private block is dimmed
    assert block_cell(root, 3).get("opacity") is None


def test_long_block_table_is_elided_not_overflowing() -> None:
    blocks = (BlockView(0, is_null=True),
              *(BlockView(i, 16, ("A",), 1) for i in range(1, 101)))
    snap = PoolSnapshot(16, blocks, {"A": tuple(range(1, 101))}, {"A": 1600})
    root = parse(pool_view.render_svg(snap, request="A"))
    cells = with_class(root, "rect", "table-cell")
    assert len(cells) < 100 and cells[-1].get("data-logical") == "99"
    assert all(float(c.get("x")) + float(c.get("width")) <= 900 for c in cells)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"request": "Z"}, "'Z'"),
        ({"window": (4, 99)}, "(4, 99)"),
        ({"window": (3, 3)}, "(3, 3)"),
        ({"max_cells": 0}, "0"),
        ({"palette": {"A": "#000000"}}, "'B'"),
    ],
)
def test_pool_bad_arguments_name_the_value(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        pool_view.render_svg(small_pool(), **kwargs)


def test_pool_rejects_impossible_snapshots() -> None:
    with pytest.raises(ValueError, match="no blocks"):
        pool_view.render_svg(PoolSnapshot(16, ()))
    with pytest.raises(ValueError, match="block 1 holds 17 tokens"):
        pool_view.render_svg(PoolSnapshot(16, (BlockView(1, 17, ("A",), 1),)))
    dangling = PoolSnapshot(16, (BlockView(0, is_null=True),), {"A": (7,)})
    with pytest.raises(ValueError, match="names block 7"):
        pool_view.render_svg(dangling, request="A")


def legend_labels(svg: str) -> list[str]:
    """The labels of the marks legend, in drawn order (every label a MARKS entry has)."""
    known = {label for _, label in pool_view.MARKS.values()}
    known |= {"holds a copy-on-write copy", "holds cached blocks"}
    found = re.findall(r'font-size="11" fill="#57606a">([^<]*)</text>', svg)
    return [label for label in found if label in known]


def test_legend_lists_only_the_marks_drawn_in_a_stable_order() -> None:
    labels = legend_labels(pool_view.render_svg(small_pool()))
    assert labels == ["null block", "empty slots", "reference count",
                      "cached hash (free = evictable)", "copy-on-write copy"]
    order = [label for _, label in pool_view.MARKS.values()]
    assert labels == sorted(labels, key=order.index)
    plain = PoolSnapshot(16, (BlockView(1, 16, ("A",), 1, event="allocated"),), {"A": (1,)})
    assert legend_labels(pool_view.render_svg(plain)) == ["allocated this step"]
    many = PoolSnapshot(16, (BlockView(1, 8, tuple("ABCDE"), 5),))
    assert legend_labels(pool_view.render_svg(many)) == [
        "empty slots", "reference count", "shared by more than 4"]
    # aggregated: the run marks appear only when some run holds them
    assert legend_labels(pool_view.render_svg(big_pool())) == []
    assert "1 cell = " in pool_view.render_svg(big_pool())


def test_timeline_legend_is_decided_per_frame() -> None:
    frames = [small_pool("step 0"),
              PoolSnapshot(16, (BlockView(0, is_null=True), BlockView(1, 4, ("A",), 1)),
                           {"A": (1,)}, label="step 1")]
    timeline = pool_timeline(frames)
    assert "copy-on-write copy" in legend_labels(timeline.svg(0))
    assert legend_labels(timeline.svg(1)) == ["null block", "empty slots"]


def test_request_without_blocks_reads_naturally() -> None:
    root = parse(pool_view.render_svg(small_pool(), request="C", palette=owner_colors("ABC")))
    (table,) = [g for g in root.iter(f"{SVG}g") if g.get("id") == "pool-table"]
    texts = [t.text for t in table.iter(f"{SVG}text")]
    assert texts == ["request C holds no blocks at this step"]
    one = PoolSnapshot(16, (BlockView(1, 3, ("A",), 1),), {"A": (1,)}, {"A": 3})
    assert "block table of A: 3 tokens in 1 block of 16" in pool_view.render_svg(one,
                                                                                request="A")


def long_table_pool(length: int = 100) -> PoolSnapshot:
    blocks = (BlockView(0, is_null=True),
              *(BlockView(i, 16, ("A",), 1) for i in range(1, length + 1)))
    return PoolSnapshot(16, blocks, {"A": tuple(range(1, length + 1))}, {"A": 16 * length})


def table_logicals(svg: str) -> list[int]:
    return [int(c.get("data-logical")) for c in with_class(parse(svg), "rect", "table-cell")]


@pytest.mark.parametrize("hash_chain", [False, True])
@pytest.mark.parametrize("focus", [0, 30, 62, 90, 98, 99])
def test_table_focus_keeps_a_logical_entry_visible(focus: int, hash_chain: bool) -> None:
    svg = pool_view.render_svg(long_table_pool(), request="A", table_focus=focus,
                               hash_chain=hash_chain)
    shown = table_logicals(svg)
    assert focus in shown and shown[0] == 0 and shown[-1] == 99
    assert shown == sorted(set(shown)) and len(shown) < 100
    cells = with_class(parse(svg), "rect", "table-cell")
    assert all(float(c.get("x")) + float(c.get("width")) <= 900 - 16 for c in cells)
    assert svg == pool_view.render_svg(long_table_pool(), request="A", table_focus=focus,
                                       hash_chain=hash_chain)


def test_table_focus_defaults_and_clamps() -> None:
    default = pool_view.render_svg(long_table_pool(), request="A")
    assert 62 not in table_logicals(default)
    near_start = pool_view.render_svg(long_table_pool(), request="A", table_focus=3)
    assert table_logicals(near_start) == table_logicals(default)
    bold_3 = 'font-size="11" font-weight="bold">3</text>'  # physical block 3, logical 3
    assert near_start.count(bold_3) == default.count(bold_3) + 1  # the focus is bold
    past_end = pool_view.render_svg(long_table_pool(), request="A", table_focus=500)
    assert table_logicals(past_end) == table_logicals(default)
    short = pool_view.render_svg(small_pool(), request="A", table_focus=62)
    assert table_logicals(short) == [0, 1]
    timeline = pool_timeline([long_table_pool(40), long_table_pool()])
    assert 62 in table_logicals(timeline.at(1, request="A", table_focus=62).svg)
    assert table_logicals(timeline.at(0, request="A", table_focus=62).svg)[-1] == 39


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"request": "A", "table_focus": -1}, "-1"), ({"request": "A", "table_focus": True}, "True"),
     ({"request": "A", "table_focus": "62"}, "'62'"), ({"table_focus": 2}, "table_focus=2")],
)
def test_table_focus_bad_values_name_the_value(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        pool_view.render_svg(small_pool(), **kwargs)


def test_pool_picture_is_one_timeline_frame() -> None:
    picture = pool_picture(small_pool(), request="A", hash_chain=True)
    assert isinstance(picture, SvgPicture)
    assert picture.svg == pool_timeline([small_pool()]).at(0, request="A", hash_chain=True).svg
    assert picture.svg == pool_view.render_svg(small_pool(), request="A", hash_chain=True)
    assert repr(picture).startswith("after fork: in use 3 of 5 blocks")
    with pytest.raises(ValueError, match="'Z'"):
        pool_picture(small_pool(), request="Z")


# --- block pool: 30,720 blocks --------------------------------------------------------


def test_30720_block_pool_is_aggregated_and_fast() -> None:
    snap = big_pool()
    pool_view.render_svg(snap)  # warm-up
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        svg = pool_view.render_svg(snap)
        timings.append(time.perf_counter() - start)
    print(f"\n30,720-block frame rendered in {min(timings) * 1000:.1f} ms (best of 3)")
    assert min(timings) < 0.5
    runs = with_class(parse(svg), "rect", "run")
    assert len(runs) <= pool_view.MAX_CELLS
    assert runs[0].get("data-first") == "0" and runs[-1].get("data-last") == "30719"
    assert sum(int(r.get("data-used")) for r in runs) == pool_stats(snap).used == 15_359
    assert len(svg) < 150_000


def test_window_zooms_into_a_large_pool_in_detail() -> None:
    root = parse(pool_view.render_svg(big_pool(), window=(1024, 1536)))
    cells = with_class(root, "g", "block")
    assert [c.get("data-block") for c in (cells[0], cells[-1])] == ["1024", "1535"]


# --- timelines and widgets ------------------------------------------------------------


def pool_frames() -> list[PoolSnapshot]:
    return [small_pool("step 0", b_owner="B"), small_pool("step 1", b_owner="C"),
            small_pool("step 2", b_owner="B")]


def test_timeline_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="empty"):
        pool_timeline([])
    with pytest.raises(ValueError, match="empty"):
        arena_timeline([])
    timeline = pool_timeline(pool_frames())
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            timeline.at(bad)
    with pytest.raises(ValueError, match="'Pool'"):
        Timeline(pool_frames(), lambda f, dom_id: "", name="Pool", describe=str)


def test_timeline_static_form_is_the_chosen_step() -> None:
    timeline = pool_timeline(pool_frames(), step=1)
    assert timeline._repr_svg_() == timeline.svg(1)
    assert "step 1" in repr(timeline)
    assert pool_timeline(pool_frames()).step == 2


def test_pool_widget_slider_redraws_the_frame() -> None:
    box = pool_timeline(pool_frames(), step=2).widget()
    slider = find_widget(box, "pool-slider")
    play = find_widget(box, "pool-play")
    frame = find_widget(box, "pool-frame")
    assert isinstance(slider, widgets.SelectionSlider) and isinstance(play, widgets.Play)
    assert (play.min, play.max, slider.options) == (0, 2, (("0", 0), ("1", 1), ("2", 2)))
    assert data_step(frame.value) == "2" and 'id="pool-view"' in frame.value
    colors = owner_colors(["A", "B", "C"])
    fill_of_block_3 = re.compile(r'data-block="3".*?class="fill" fill="(#[0-9a-f]{6})"')
    assert fill_of_block_3.search(frame.value).group(1) == colors["B"]
    slider.value = 1
    assert data_step(frame.value) == "1"
    assert fill_of_block_3.search(frame.value).group(1) == colors["C"]
    assert "C · 2 blocks" in frame.value
    assert stats_text(frame.value, "pool").startswith("in use 3 of 5 blocks")
    assert repr(box).startswith("pool step 1 of 2")


def test_pool_widget_request_and_hash_chain_controls() -> None:
    box = pool_timeline(pool_frames()).widget()
    frame = find_widget(box, "pool-frame")
    request = find_widget(box, "pool-request")
    assert [value for _, value in request.options] == ["", "A", "B", "C"]
    assert 'id="pool-table"' not in frame.value
    request.value = "C"  # absent at step 2: says so instead of failing
    assert "C holds no blocks at this step" in frame.value
    request.value = "A"
    find_widget(box, "pool-hash-chain").value = True
    assert 'data-request="A"' in frame.value and 'class="hash-chain"' in frame.value
    with pytest.raises(LookupError):
        find_widget(box, "pool-window")  # small pools need no window chooser


def test_large_pool_widget_offers_windows() -> None:
    box = pool_timeline([big_pool(2), big_pool(3)]).widget()
    frame = find_widget(box, "pool-frame")
    window = find_widget(box, "pool-window")
    assert 'class="run' in frame.value
    window.value = window.options[1][1]
    assert 'class="block' in frame.value and 'class="run' not in frame.value
    find_widget(box, "pool-slider").value = 0
    assert data_step(frame.value) == "0"


def test_widget_opens_on_the_first_frame_unless_told_otherwise() -> None:
    timeline = pool_timeline(pool_frames())
    assert timeline.step == 2  # the static form is the final state
    box = timeline.widget()
    slider, play = find_widget(box, "pool-slider"), find_widget(box, "pool-play")
    frame = find_widget(box, "pool-frame")
    assert (slider.value, play.value, data_step(frame.value)) == (0, 0, "0")
    assert repr(box).startswith("pool step 0 of 2")
    slider.value = 1  # a drag to the right moves forward
    assert data_step(frame.value) == "1"
    chosen = pool_timeline(pool_frames(), step=1).widget()
    assert find_widget(chosen, "pool-slider").value == 1


def test_slider_reads_the_number_each_frame_is_known_by() -> None:
    steps = [2, 3, 5]
    frames = [replace(f, label=f"step {n}") for f, n in zip(pool_frames(), steps, strict=True)]
    timeline = pool_timeline(frames, numbers=steps, step=1)
    box = timeline.widget()
    slider, frame = find_widget(box, "pool-slider"), find_widget(box, "pool-frame")
    assert slider.label == "3" and ">step 3</text>" in frame.value
    slider.value = 2
    assert slider.label == "5" and ">step 5</text>" in frame.value
    assert data_step(frame.value) == "2"  # the DOM still counts frames from 0
    assert repr(box).startswith("pool step 5 (frame 3 of 3): step 5:")
    assert repr(timeline).startswith("pool step 3 (frame 2 of 3): step 3:")
    for bad in ([2, 3], [2, 3, 5.0], [2, 3, True], 5):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            pool_timeline(frames, numbers=bad)


def test_hash_chain_box_only_when_some_block_has_a_hash() -> None:
    plain = [replace(f, blocks=tuple(replace(b, cached_hash=None) for b in f.blocks))
             for f in pool_frames()]
    box = pool_timeline(plain).widget()
    find_widget(box, "pool-request")
    with pytest.raises(LookupError):
        find_widget(box, "pool-hash-chain")  # chapter 03: no hashes yet, so no box
    find_widget(pool_timeline(pool_frames()).widget(), "pool-hash-chain")


def crowded_pool(window_owners: list[str], others: int) -> PoolSnapshot:
    """1,024 blocks: blocks 1-511 cycle through ``window_owners``, 512-1023 through
    ``others`` more requests, so the first 512-block window shows only ``window_owners``."""
    rest = [f"r{i}" for i in range(others) if f"r{i}" not in window_owners]
    blocks = [BlockView(0, is_null=True)]
    for i in range(1, 1024):
        owners = window_owners if i < 512 else rest
        blocks.append(BlockView(i, 16, (owners[i % len(owners)],), 1) if owners
                      else BlockView(i))
    tables: dict[str, tuple[int, ...]] = {}
    for block in blocks[1:]:
        if not block.owners:
            continue
        tables[block.owners[0]] = (*tables.get(block.owners[0], ()), block.block_id)
    return PoolSnapshot(16, tuple(blocks), tables, label="crowded")


def owner_fills(svg: str) -> dict[str, set[str]]:
    """Each drawn owner's fill colours."""
    fills: dict[str, set[str]] = {}
    for cell in with_class(parse(svg), "g", "block"):
        for fill in with_class(cell, "rect", "fill"):
            fills.setdefault(cell.get("data-owner"), set()).add(fill.get("fill"))
    return fills


def test_zoomed_window_gives_each_visible_request_its_own_colour() -> None:
    # 67 and 516 were both orange: colours cycled over all 434 requests in natural order,
    # so requests that share a window could share a colour.
    visible = [f"r{60 * k}" for k in range(8)]  # every 12th and 20th in natural order
    snapshot = crowded_pool(visible, others=500)
    timeline = pool_timeline([snapshot])
    for svg in (timeline.svg(0, window=(0, 512)),
                pool_view.render_svg(snapshot, window=(0, 512)),
                timeline.svg(0, window=(0, 512), request="r60")):
        fills = owner_fills(svg)
        assert set(fills) == set(visible)
        assert all(len(colors) == 1 for colors in fills.values())
        assert len({c for colors in fills.values() for c in colors}) == len(visible)
        assert "requests share" not in svg  # no "colours repeat" note when they do not
    box = timeline.widget()
    find_widget(box, "pool-window").value = (0, 512)
    assert len(set(itertools.chain(*owner_fills(find_widget(box, "pool-frame").value)
                                   .values()))) == len(visible)


def test_a_small_zoom_inside_a_crowded_window_has_distinct_colours() -> None:
    # Lecture 03's zoom: 64 blocks holding 16 requests, inside a 512-block window holding
    # 221, more than the timeline's palette can keep apart.
    visible = [f"r{60 * k}" for k in range(8)]
    crowd = [f"r{i}" for i in range(300) if f"r{i}" not in visible]
    blocks = [BlockView(0, is_null=True)] + [
        BlockView(i, 16, ((visible if 256 <= i < 320 else crowd)[i % 8 if 256 <= i < 320
                                                              else i % len(crowd)],), 1)
        for i in range(1, 1024)]
    tables: dict[str, tuple[int, ...]] = {}
    for block in blocks[1:]:
        tables[block.owners[0]] = (*tables.get(block.owners[0], ()), block.block_id)
    timeline = pool_timeline([PoolSnapshot(16, tuple(blocks), tables)])
    svg = timeline.svg(0, window=(256, 320))
    fills = owner_fills(svg)
    assert set(fills) == set(visible)
    assert len({c for colors in fills.values() for c in colors}) == len(visible)
    assert "requests share" not in svg
    assert "requests share" in timeline.svg(0, window=(0, 512))  # 221 cannot all differ


def test_more_requests_than_colours_says_colours_repeat() -> None:
    many = [f"r{i}" for i in range(len(OWNER_COLORS) + 5)]
    svg = pool_view.render_svg(crowded_pool(many, others=0), window=(0, 512))
    assert f"{len(many)} requests share {len(OWNER_COLORS)} colours" in svg


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12)), min_size=1, max_size=60))
def test_timeline_colours_are_distinct_in_every_frame(lives: list[tuple[int, int]]) -> None:
    """Requests live over consecutive frames (as in any run); whenever at most the palette's
    size are alive together, every frame shows them in different colours, each request in
    one colour throughout."""
    frames = [[f"r{i}" for i, (start, length) in enumerate(lives) if start <= t < start + length]
              for t in range(43)]
    colors = owner_colors((f"r{i}" for i in range(len(lives))), together=frames)
    for alive in frames:
        if len(alive) <= len(OWNER_COLORS):
            assert len({colors[r] for r in alive}) == len(alive), alive


# --- arena --------------------------------------------------------------------------


def blocked_arena(label: str = "exact-size") -> ArenaFrame:
    """Free 15 slots in gaps of 4, 5, 4 and 2: the next request (8) fits in none."""
    return ArenaFrame(100, (
        Reservation("C", 58, 25, 5, 25),
        Reservation("A", 0, 30, 20, 30),
        Reservation("B", 34, 20, 20, 20),
        Reservation("D", 88, 10, 10, 10),
    ), next_request=8, label=label)


def test_arena_frame_derives_gaps_and_stats() -> None:
    frame = blocked_arena()
    assert [r.request_id for r in frame.reservations] == ["A", "B", "C", "D"]
    assert frame.gaps == ((30, 4), (54, 4), (83, 5), (98, 2))
    stats = arena_stats(frame)
    assert (stats.written, stats.pending, stats.internal, stats.free) == (55, 30, 0, 15)
    assert stats.blocked and stats.stranded == 15 and stats.largest_gap == 5
    reserve_max = ArenaFrame(64, (Reservation("A", 0, 32, 10, 20),), next_request=32)
    assert arena_stats(reserve_max).internal == 12
    assert not arena_stats(reserve_max).blocked and arena_stats(reserve_max).stranded == 0


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: ArenaFrame(0, ()), "0"),
        (lambda: ArenaFrame(10, (Reservation("A", 0, 6, 0, 6), Reservation("B", 5, 2, 0, 2))),
         "'A' and 'B'"),
        (lambda: ArenaFrame(10, (Reservation("A", 8, 6, 0, 6),)), "'A'"),
        (lambda: Reservation("A", 0, 6, 7, 6), "written=7"),
        (lambda: ArenaFrame(10, (), next_request=0), "0"),
        (lambda: arena_view.render_svg(blocked_arena(), rows=0), "0"),
    ],
)
def test_arena_bad_inputs_name_the_value(make, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        make()


def test_arena_svg_draws_kinds_and_stranded_gaps() -> None:
    svg = arena_view.render_svg(blocked_arena())
    assert svg == arena_view.render_svg(blocked_arena())
    root = parse(svg)
    assert len(with_class(root, "rect", "stranded")) == 4
    assert {r.get("data-request") for r in with_class(root, "rect", "written")} == set("ABCD")
    assert {r.get("data-request") for r in with_class(root, "rect", "pending")} == {"A", "C"}
    (line,) = [t for t in root.iter(f"{SVG}text") if t.get("id") == "arena-stats"]
    assert line.get("data-blocked") == "true"
    assert "no gap fits, though 15 slots are free" in "".join(line.itertext())


def test_arena_wraps_rows_and_splits_reservations() -> None:
    frame = ArenaFrame(491_520, (Reservation("A", 61_000, 8_192, 100, 900),), next_request=8192)
    root = parse(arena_view.render_svg(frame))
    assert len(with_class(root, "rect", "internal")) == 1
    outlines = with_class(root, "rect", "outline")
    assert len(outlines) == 2  # 61,000..69,192 crosses the row boundary at 61,440


def test_arena_widget_uses_the_shared_timeline() -> None:
    frames = [blocked_arena("one"), ArenaFrame(100, (Reservation("A", 0, 30, 30, 30),),
                                               label="two")]
    timeline = arena_timeline(frames)
    assert isinstance(timeline, Timeline)
    box = timeline.widget()
    frame = find_widget(box, "arena-frame")
    assert data_step(frame.value) == "0" and 'id="arena-view"' in frame.value
    assert "no gap fits" in frame.value
    find_widget(box, "arena-slider").value = 1
    assert data_step(frame.value) == "1"
    colors = owner_colors("ABCD")
    assert f'class="written" data-request="A" fill="{colors["A"]}"' in frame.value


def test_arena_frame_from_a_slab_allocator() -> None:
    arena = SlabAllocator(100, policy="exact-size", max_len=40)
    for rid, final in ((1, 30), (2, 20), (3, 25)):
        arena.admit(rid, final, length=5)
    arena.append(3, 7)
    arena.free(2)
    frame = arena_frame(arena, next_request=21, label="by hand")
    assert [(r.request_id, r.start, r.reserved, r.written, r.final)
            for r in frame.reservations] == [("1", 0, 30, 5, 30), ("3", 50, 25, 12, 25)]
    assert frame.gaps == ((30, 20), (75, 25)) and frame.label == "by hand"
    stats = arena_stats(frame)
    assert (stats.written, stats.pending, stats.free, stats.stranded) == (17, 38, 45, 20)
    assert not stats.blocked
    reserve = SlabAllocator(64, policy="reserve-max", max_len=32)
    reserve.admit(7, 10, length=4)
    (only,) = arena_frame(reserve).reservations
    assert (only.reserved, only.written, only.final) == (32, 4, 10)
    assert arena_stats(arena_frame(reserve)).internal == 22
    with pytest.raises(ValueError, match="SlabAllocator"):
        arena_frame("arena")  # type: ignore[arg-type]


def test_arena_frame_at_redraws_a_recorded_run() -> None:
    trace = generate_trace(10, seed=22, median_total=14, sigma=0.5, max_total=32,
                           arrival_rate=0.5)
    config = SimConfig(allocator="exact-size", budget_bytes=64, bytes_per_token=1, max_len=32)
    result = simulate(trace, config, record="full")
    timeline = result.timeline
    blocked_steps = []
    for step in range(len(timeline.batch)):
        frame = arena_frame_at(result, step)
        stats = arena_stats(frame)
        assert frame.label == f"exact-size · step {step}"
        assert (stats.written, stats.pending, stats.free) == (
            timeline.used[step], timeline.reserved[step], timeline.free[step])
        assert stats.stranded == timeline.stranded[step]
        assert frame.next_request == (int(timeline.next_need[step]) or None)
        if stats.blocked:
            blocked_steps.append(step)
    assert len(blocked_steps) == result.no_gap_steps > 0
    assert arena_frame_at(result, 0, label="start").label == "start"
    paged = simulate(trace, SimConfig(budget_bytes=64, bytes_per_token=1, block_size=4,
                                      max_len=32), record="full")
    with pytest.raises(ValueError, match="pool_at"):
        arena_frame_at(paged, 0)
    with pytest.raises(ValueError, match="record='full'"):
        arena_frame_at(simulate(trace, config, record="steps"), 0)


# --- capacity calculator ------------------------------------------------------------


def test_capacity_numbers_for_the_guides_model() -> None:
    calc = CapacityCalculator("guide-8kv", dtype="fp16", budget_gib=60, block_size=16,
                              max_len=8192)
    n = calc.numbers
    assert (n.bytes_per_token, n.blocks, n.tokens, n.max_requests) == (131_072, 30_720,
                                                                        491_520, 60)
    html = calc.numbers_html()
    for attribute in ('id="capacity-numbers"', 'data-bytes-per-token="131072"',
                      'data-blocks="30720"', 'data-tokens="491520"', 'data-max-requests="60"'):
        assert attribute in html
    assert '<td data-key="request_bytes" style="text-align:right;font-weight:600">1 GiB' in html
    assert repr(calc).endswith("131,072 B/token · 30,720 blocks · 491,520 tokens · 60 requests")


def test_capacity_static_figure_is_deterministic_and_leaves_no_figures() -> None:
    before = plt.get_fignums()
    svg = CapacityCalculator()._repr_svg_()
    assert svg.startswith("<svg") and svg == CapacityCalculator()._repr_svg_()
    assert "30,720" in svg and "Matplotlib v" not in svg
    assert plt.get_fignums() == before


# --- PNG copies -------------------------------------------------------------------------


def png_colors(png: bytes) -> set[str]:
    """Every colour in a PNG, as ``#rrggbb``."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return {"#" + bytes(rgb).hex() for _, rgb in image.getcolors(maxcolors=1 << 20)}


def displayed(obj: object) -> tuple[dict, dict]:
    """What Jupyter stores for ``obj``: its mime bundle and metadata."""
    return DisplayFormatter().format(obj)


def test_every_picture_displays_a_png_beside_its_svg() -> None:
    """An untrusted notebook shows no SVG; the PNG beside it is what a learner sees."""
    arena = arena_timeline([blocked_arena()])
    for picture in (pool_picture(small_pool()), pool_timeline(pool_frames()), arena,
                    arena.at(0), CapacityCalculator()):
        data, metadata = displayed(picture)
        assert {"image/svg+xml", "image/png", "text/plain"} <= set(data), type(picture)
        width = metadata["image/png"]["width"]
        image = Image.open(io.BytesIO(data["image/png"]))
        assert image.width == 2 * width  # drawn at twice the size it is shown at
        assert width == round(float(parse(data["image/svg+xml"]).get("width").rstrip("pt"))
                              * (4 / 3 if isinstance(picture, CapacityCalculator) else 1))


def test_png_draws_what_the_svg_draws() -> None:
    colors = owner_colors(["A", "B"])
    png, size = svg_to_png(pool_view.render_svg(small_pool(), request="A", hash_chain=True))
    seen = png_colors(png)
    assert {colors["A"], colors["B"], pool_view.CACHE_MARK, pool_view.NULL_FILL} <= seen
    assert COW_RED in seen  # the copy-on-write outline
    arena_png, _ = svg_to_png(arena_view.render_svg(blocked_arena()))
    assert arena_view.HATCH_FILL in png_colors(arena_png)  # the hatch's background
    assert svg_to_png(pool_view.render_svg(small_pool()))[0] == svg_to_png(
        pool_view.render_svg(small_pool()))[0]  # deterministic
    assert size == {"width": 900, "height": round(float(parse(
        pool_view.render_svg(small_pool(), request="A", hash_chain=True)).get("height")))}


@pytest.mark.parametrize(("svg", "named"), [
    ('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><ellipse/></svg>',
     "<ellipse>"),
    ('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
     '<rect x="0" y="0" width="1" height="1" transform="rotate(3)"/></svg>', "transform"),
    ('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
     '<path d="M0 0C1 1 2 2 3 3"/></svg>', "'C'"),
    ('<svg xmlns="http://www.w3.org/2000/svg" width="ten" height="10"/>', "'ten'"),
    ("<svg", "not well-formed"),
    ('<html xmlns="http://www.w3.org/2000/svg"/>', "<html>"),
])
def test_png_copy_refuses_svg_it_cannot_draw(svg: str, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        svg_to_png(svg)
    with pytest.raises(ValueError, match="scale"):
        svg_to_png(pool_view.render_svg(small_pool()), scale=0)


def test_capacity_figure_is_a_pyplot_figure_for_plt_show() -> None:
    fig = CapacityCalculator("opt-13b", budget_gib=14, max_len=2048).figure()
    try:
        assert plt.fignum_exists(fig.number)
        assert "opt-13b (800 KiB/token): 8 at 2K" in [t.get_text() for t in
                                                      fig.axes[0].get_legend().get_texts()]
    finally:
        plt.close(fig)


def test_capacity_widget_updates_numbers() -> None:
    before = plt.get_fignums()
    box = CapacityCalculator().widget()
    numbers = find_widget(box, "capacity-numbers-box")
    assert 'data-max-requests="60"' in numbers.value
    find_widget(box, "capacity-max-len").value = 2048
    assert 'data-max-requests="240"' in numbers.value
    find_widget(box, "capacity-model").value = "opt-13b"
    assert find_widget(box, "capacity-layers").value == 40
    assert 'data-bytes-per-token="819200"' in numbers.value
    find_widget(box, "capacity-layers").value = 20
    assert find_widget(box, "capacity-model").value == "custom"
    assert 'data-bytes-per-token="409600"' in numbers.value
    assert find_widget(box, "capacity-figure").value.startswith('<img alt="custom, fp16')
    assert repr(box).startswith("capacity calculator: custom, fp16, 60 GiB")
    assert plt.get_fignums() == before


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"budget_gib": 0}, "budget_gib"),
        ({"budget_gib": float("nan")}, "nan"),
        ({"dtype": "fp12"}, "'fp12'"),
        ({"block_size": 0}, "block_size"),
        ({"max_len": -1}, "max_len"),
        ({"model": "gpt-9"}, "'gpt-9'"),
    ],
)
def test_capacity_bad_inputs_name_the_value(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        CapacityCalculator(**kwargs)


def test_concurrency_plot_returns_the_figure() -> None:
    fig = plot_concurrency_vs_context(["opt-13b", MODELS["llama-3-8b"]], mark=2048)
    try:
        ax = fig.axes[0]
        assert [line.get_label() for line in ax.get_lines() if not
                line.get_label().startswith("_")] == [
            "opt-13b (800 KiB/token): 38 at 2K", "llama-3-8b (128 KiB/token): 240 at 2K"]
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="empty"):
        plot_concurrency_vs_context([])


# --- palette and source -----------------------------------------------------------------


def test_palette_colours_are_far_apart() -> None:
    pairs = itertools.combinations(OWNER_COLORS, 2)
    assert min(color_distance(a, b) for a, b in pairs) > 17.0  # Tableau's own closest pair
    assert len(OWNER_COLORS) == 20


def test_palette_is_natural_order_and_cycles() -> None:
    colors = owner_colors(["r10", "r2", "r1"])
    assert list(colors) == ["r1", "r2", "r10"]
    assert list(colors.values()) == list(OWNER_COLORS[:3])
    many = owner_colors(f"r{i}" for i in range(len(OWNER_COLORS) + 1))
    assert many[f"r{len(OWNER_COLORS)}"] == OWNER_COLORS[0]


def test_palette_keeps_away_from_reserved_mark_colours() -> None:
    assert {pool_view.CACHE_MARK, pool_view.NULL_FILL} <= set(RESERVED_COLORS)
    for color in OWNER_COLORS:
        for reserved in RESERVED_COLORS:
            assert color_distance(color, reserved) >= MIN_MARK_DISTANCE, (color, reserved)
    assert color_distance("#499894", pool_view.CACHE_MARK) < MIN_MARK_DISTANCE  # replaced
    assert color_distance("#ffffff", "#ffffff") == 0.0
    assert color_distance("#000000", "#ffffff") == pytest.approx(100.0, abs=0.1)
    assert len(set(OWNER_COLORS)) == len(OWNER_COLORS)


def test_show_source_renders_library_code() -> None:
    view = show_source(pool_view.pool_stats)
    assert view.caption == "course_lib/viz/pool_view.py · pool_stats"
    assert repr(view).startswith("# course_lib/viz/pool_view.py · pool_stats\ndef pool_stats(")
    html = view._repr_html_()
    assert 'class="course-source"' in html and "<span" in html and "pool_stats" in html
    method = show_source(CapacityCalculator.numbers_html)
    assert method.code.startswith("def numbers_html(")
    with pytest.raises(ValueError, match="len"):
        show_source(len)


def test_png_copies_draw_nested_pictures_where_their_box_and_view_box_say() -> None:
    """Side-by-side drawings (chapter 09's replicas) are <svg>s inside an <svg>."""
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100" '
           'viewBox="0 0 400 200"><rect width="100%" height="100%" fill="#ffffff"/>'
           '<svg x="200" y="0" width="200" height="200" viewBox="0 0 10 10">'
           '<rect x="0" y="0" width="10" height="10" fill="#ff0000"/></svg></svg>')
    png, size = svg_to_png(svg, scale=1)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert size == {"width": 200, "height": 100} and image.size == (200, 100)
    assert image.getpixel((50, 50)) == (255, 255, 255)
    assert image.getpixel((150, 50)) == (255, 0, 0)


def test_a_progress_bar_is_stored_finished_not_in_its_first_state() -> None:
    """A notebook bar's text is stored when it is shown (at 0%); the course's text form is
    the finished bar instead, and stays the same once the bar has moved."""
    from tqdm.notebook import tqdm

    from course_lib.viz.notebook import progress_text, setup_notebook

    setup_notebook()
    bar = tqdm(range(36_925), desc="simulate paged", unit="tok", display=False)
    finished = f"simulate paged: 100% {'█' * 20} 36,925/36,925 tok"
    assert repr(bar.container) == finished
    for _ in bar:
        pass
    assert repr(bar.container) == finished
    unsized = tqdm(iter(range(3)), display=False)
    assert repr(unsized.container) == "progress: done"
    unsized.close()
    assert progress_text(object()) == "progress: done"
