"""Pictures for the course: every view is static SVG first, with ipywidgets on top.

- :mod:`~course_lib.viz.pool_view`: the block pool (cells, fill, sharing, copy-on-write,
  prefix cache), one request's block table, statistics; ``pool_timeline(snapshots)``, or
  ``pool_picture(snapshot)`` for one frame.
- :mod:`~course_lib.viz.arena_view`: the contiguous arena of the slab allocators;
  ``arena_timeline(frames)``; ``arena_frame(allocator)`` and ``arena_frame_at(result, step)``
  turn a slab allocator or a recorded simulation into frames.
- :mod:`~course_lib.viz.timeline`: the one timeline (Play + slider) both use.
- :mod:`~course_lib.viz.capacity`: chapter 01's capacity calculator and the
  concurrency-against-context plot (``plot_hybrid_concurrency`` for chapter 08).
- :mod:`~course_lib.viz.source`: ``show_source(obj)`` for showing library code.

A displayed timeline or calculator is a static picture (what stored outputs show on GitHub
and in nbval); ``.widget()`` gives the interactive version. Only ipywidgets APIs common to
versions 7 (Colab) and 8 are used.
"""

from course_lib.viz.arena_view import (
    ArenaFrame,
    ArenaStats,
    Reservation,
    arena_frame,
    arena_frame_at,
    arena_stats,
    arena_timeline,
)
from course_lib.viz.capacity import (
    CapacityCalculator,
    HybridCapacityCalculator,
    plot_concurrency_vs_context,
    plot_hybrid_concurrency,
)
from course_lib.viz.pool_view import PoolStats, pool_picture, pool_stats, pool_timeline
from course_lib.viz.source import SourceView, show_source
from course_lib.viz.svg import SvgPicture
from course_lib.viz.timeline import Timeline

__all__ = [
    "ArenaFrame",
    "ArenaStats",
    "CapacityCalculator",
    "HybridCapacityCalculator",
    "PoolStats",
    "Reservation",
    "SourceView",
    "SvgPicture",
    "Timeline",
    "arena_frame",
    "arena_frame_at",
    "arena_stats",
    "arena_timeline",
    "plot_concurrency_vs_context",
    "plot_hybrid_concurrency",
    "pool_picture",
    "pool_stats",
    "pool_timeline",
    "show_source",
]
