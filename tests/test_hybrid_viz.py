"""Chapter 08's pictures: the hybrid capacity plot and the pool drawn group by group."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from course_lib.hybrid import HybridKVManager
from course_lib.kv_math import HYBRID_MODELS
from course_lib.paged import BlockPool
from course_lib.viz import plot_hybrid_concurrency, pool_picture, pool_timeline


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
    assert any("freed" in pool_picture(s).svg for s in snapshots[1:])
