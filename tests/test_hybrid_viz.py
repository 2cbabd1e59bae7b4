"""Chapter 08's pictures: the hybrid capacity plot and the pool drawn group by group."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from course_lib.hybrid import HybridKVManager
from course_lib.kv_math import GIB, HYBRID_MODELS, hybrid_capacity
from course_lib.paged import BlockPool
from course_lib.viz import (
    CapacityCalculator,
    HybridCapacityCalculator,
    plot_hybrid_concurrency,
    pool_picture,
    pool_timeline,
)
from tests.test_viz import find_widget


def test_hybrid_plot_draws_two_lines_per_model_and_freeing_is_above() -> None:
    fig = plot_hybrid_concurrency(budget_gib=60)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2 * len(HYBRID_MODELS) + 1  # + the one-request line
    for freed, kept in zip(lines[0:-1:2], lines[1:-1:2], strict=True):
        assert all(f >= k for f, k in zip(freed.get_ydata(), kept.get_ydata(), strict=True))
    assert fig.axes[0].get_title(loc="left").startswith("Hybrid models: 60 GiB")
    plt.close(fig)
    with pytest.raises(ValueError, match="models"):
        plot_hybrid_concurrency([])
    with pytest.raises(ValueError, match="budget_gib"):
        plot_hybrid_concurrency(budget_gib=0)


def test_pool_drawn_by_group_shows_window_blocks_returning() -> None:
    manager = HybridKVManager(BlockPool(16, 4), [8, None])
    manager.add_sequence("chat", 10)
    snapshots = [manager.snapshot("prefill")]
    for step in range(8):
        manager.append_tokens("chat")
        snapshots.append(manager.snapshot(f"decode {step}"))
    first, last = snapshots[0], snapshots[-1]
    assert set(first.tables) == {"chat g0 (window 8)", "chat g1 (full)"}
    assert last.tables["chat g0 (window 8)"][:2] == (0, 0)
    window_held = [b for b in last.tables["chat g0 (window 8)"] if b]
    assert len(window_held) <= 8 // 4 + 1
    assert last.num_free == 15 - len(last.tables["chat g1 (full)"]) - len(window_held)
    svg = pool_timeline(snapshots).at(len(snapshots) - 1, request="chat g0 (window 8)").svg
    assert "chat g0 (window 8)" in svg
    # one sequence with two tables, and a window group's legend counts the blocks it holds
    assert "1 request (2 block tables)" in svg
    assert f"chat g0 (window 8) · {len(window_held)} blocks" in svg
    assert any("freed" in pool_picture(s).svg for s in snapshots[1:])


def test_hybrid_calculator_numbers_come_from_hybrid_capacity() -> None:
    calc = HybridCapacityCalculator("gpt-oss-20b", dtype="bf16", budget_gib=60, max_len=32768)
    expected = hybrid_capacity(HYBRID_MODELS["gpt-oss-20b"], 60 * GIB, 32768, 16, "bf16")
    html = calc.numbers_html()
    assert f'data-max-requests="{expected.max_requests}"' in html
    assert "window blocks kept" in html and f">{expected.max_requests_no_freeing:,}<" in html
    assert "groups [window 128, full]" in html
    assert calc._repr_svg_().startswith("<svg")
    fig = calc.figure()  # no label runs into its value
    fig.canvas.draw()
    texts = fig.texts[1:]
    for label, value in zip(texts[0::2], texts[1::2], strict=True):
        assert label.get_window_extent().x1 < value.get_window_extent().x0, label.get_text()
    plt.close(fig)
    with pytest.raises(ValueError, match="gpt-5"):
        HybridCapacityCalculator("gpt-5")


def test_chapter_01_widget_offers_the_hybrid_presets() -> None:
    before = plt.get_fignums()
    box = CapacityCalculator().widget()
    numbers = find_widget(box, "capacity-numbers-box")
    find_widget(box, "capacity-model").value = "gemma-3-27b"
    assert find_widget(box, "capacity-layers").value == 62
    expected = hybrid_capacity(HYBRID_MODELS["gemma-3-27b"], 60 * GIB, 8192, 16, "fp16")
    assert f'data-max-requests="{expected.max_requests}"' in numbers.value
    assert repr(box).startswith("capacity calculator: gemma-3-27b, fp16, 60 GiB")
    find_widget(box, "capacity-model").value = "llama-3-8b"
    assert 'data-bytes-per-token="131072"' in numbers.value
    assert plt.get_fignums() == before
