"""Replicas side by side: each replica's block pool drawn as chapter 04's pool view, the
drawings placed in one row so the eye can compare where a conversation's blocks live; a
timeline of such rows steps through a run (``.at(step)`` static, ``.widget()`` to play)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from course_lib.snapshot import PoolSnapshot
from course_lib.viz.palette import owner_colors
from course_lib.viz.pool_view import _request_ids, _summary, render_svg
from course_lib.viz.svg import WIDTH, SvgPicture, esc
from course_lib.viz.timeline import Timeline

_HEIGHT = re.compile(r'viewBox="0 0 [0-9.]+ ([0-9.]+)"')

Row = tuple[PoolSnapshot, ...]
"""Every replica's pool at one step."""


def _row_svg(row: Row, title: str, colors: Mapping[str, str], max_cells: int,
             dom_id: str) -> str:
    """One row of pool drawings, each scaled to its share of the course width."""
    drawings = [render_svg(s, palette=colors, max_cells=max_cells, dom_id=f"{dom_id}-{k}")
                for k, s in enumerate(row)]
    height = max(float(_HEIGHT.search(d).group(1)) for d in drawings)
    inner = "".join(f'<svg x="{k * WIDTH}" y="0" width="{WIDTH}" height="{height:g}">'
                    f'{d}</svg>' for k, d in enumerate(drawings))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{height / len(drawings):g}" viewBox="0 0 {WIDTH * len(drawings)} '
            f'{height:g}" role="img"><title>{esc(title)}</title>{inner}</svg>')


def _check_rows(rows: Sequence[Sequence[PoolSnapshot]]) -> list[Row]:
    rows = [tuple(row) for row in rows]
    if not rows or not all(rows):
        raise ValueError("need at least one step with at least one snapshot")
    if len({len(row) for row in rows}) != 1:
        raise ValueError("every step needs a snapshot of every replica")
    return rows


def replica_pools(snapshots: Sequence[PoolSnapshot], *, title: str,
                  max_cells: int = 256) -> SvgPicture:
    """The replicas' pools in one row, with one colour per request across all of them."""
    if not snapshots:
        raise ValueError("replica_pools needs at least one snapshot")
    row = tuple(snapshots)
    colors = owner_colors(_request_ids(list(row)))
    summary = "\n".join([title, *(_summary(s) for s in row)])
    return SvgPicture(_row_svg(row, title, colors, max_cells, "replica"), summary)


def replica_timeline(rows: Sequence[Sequence[PoolSnapshot]], *, name: str,
                     max_cells: int = 256) -> Timeline[Row]:
    """A timeline over rows of snapshots (one row per step, one snapshot per replica), one
    colour per request over the whole run."""
    rows = _check_rows(rows)
    colors = owner_colors(_request_ids([s for row in rows for s in row]))

    def draw(row: Row, *, dom_id: str) -> str:
        return _row_svg(row, row[0].label, colors, max_cells, dom_id)

    def describe(row: Row) -> str:
        return " | ".join(_summary(s) for s in row)

    return Timeline(rows, draw, name=name, describe=describe)
