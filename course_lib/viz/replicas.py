"""Replicas one above the other: each replica's block pool drawn as chapter 04's pool view at
the course width, the drawings stacked so the eye can compare where a conversation's blocks
live; a timeline of such stacks steps through a run (``.at(step)`` static, ``.widget()`` to
play). ``labels`` renames requests in the legends (:func:`conversation_labels`: "chat 2,
turn 1" instead of a trace id)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from course_lib.snapshot import PoolSnapshot
from course_lib.viz.palette import owner_colors
from course_lib.viz.pool_view import _request_ids, _summary, render_svg
from course_lib.viz.svg import WIDTH, SvgPicture, esc
from course_lib.viz.timeline import Timeline
from course_lib.workload import Request

_HEIGHT = re.compile(r'viewBox="0 0 [0-9.]+ ([0-9.]+)"')

Row = tuple[PoolSnapshot, ...]
"""Every replica's pool at one step."""


def conversation_labels(trace: Sequence[Request]) -> dict[str, str]:
    """Each request's id (as a snapshot names its sequence) -> "chat c, turn k": its
    conversation, numbered from 1 in trace order, and its turn within it."""
    chat: dict[int, int] = {}
    turn: dict[int, int] = {}
    chats = 0
    for request in trace:
        if request.follows is None:
            chats += 1
            chat[request.id], turn[request.id] = chats, 1
        else:
            chat[request.id] = chat[request.follows]
            turn[request.id] = turn[request.follows] + 1
    return {str(r.id): f"chat {chat[r.id]}, turn {turn[r.id]}" for r in trace}


def _relabel(snapshot: PoolSnapshot, labels: Mapping[str, str]) -> PoolSnapshot:
    """``snapshot`` with its requests renamed by ``labels`` (others keep their ids)."""
    if not labels:
        return snapshot

    def name(rid: str) -> str:
        return labels.get(rid, rid)

    blocks = tuple(replace(b, owners=tuple(name(o) for o in b.owners)) if b.owners else b
                   for b in snapshot.blocks)
    return replace(snapshot, blocks=blocks,
                   tables={name(r): t for r, t in snapshot.tables.items()},
                   seq_lens={name(r): n for r, n in snapshot.seq_lens.items()})


def _stack_svg(row: Row, title: str, colors: Mapping[str, str], max_cells: int,
               dom_id: str) -> str:
    """The row's pool drawings, each at the course width, one below the other."""
    drawings = [render_svg(s, palette=colors, max_cells=max_cells, dom_id=f"{dom_id}-{k}")
                for k, s in enumerate(row)]
    heights = [float(_HEIGHT.search(d).group(1)) for d in drawings]
    inner, y = [], 0.0
    for drawing, height in zip(drawings, heights, strict=True):
        inner.append(f'<svg x="0" y="{y:g}" width="{WIDTH}" height="{height:g}">{drawing}</svg>')
        y += height
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y:g}" '
            f'viewBox="0 0 {WIDTH} {y:g}" role="img"><title>{esc(title)}</title>'
            f'{"".join(inner)}</svg>')


def _check_rows(rows: Sequence[Sequence[PoolSnapshot]],
                labels: Mapping[str, str] | None) -> list[Row]:
    rows = [tuple(row) for row in rows]
    if not rows or not all(rows):
        raise ValueError("need at least one step with at least one snapshot")
    if len({len(row) for row in rows}) != 1:
        raise ValueError("every step needs a snapshot of every replica")
    return [tuple(_relabel(s, labels or {}) for s in row) for row in rows]


def replica_pools(snapshots: Sequence[PoolSnapshot], *, title: str, max_cells: int = 256,
                  labels: Mapping[str, str] | None = None) -> SvgPicture:
    """The replicas' pools one above the other, one colour per request across all of them,
    requests named by ``labels`` where it has them."""
    if not snapshots:
        raise ValueError("replica_pools needs at least one snapshot")
    row = _check_rows([snapshots], labels)[0]
    colors = owner_colors(_request_ids(list(row)))
    summary = "\n".join([title, *(_summary(s) for s in row)])
    return SvgPicture(_stack_svg(row, title, colors, max_cells, "replica"), summary)


def replica_timeline(rows: Sequence[Sequence[PoolSnapshot]], *, name: str,
                     max_cells: int = 256,
                     labels: Mapping[str, str] | None = None) -> Timeline[Row]:
    """A timeline over rows of snapshots (one row per step, one snapshot per replica), one
    colour per request over the whole run, requests named by ``labels`` where it has them."""
    rows = _check_rows(rows, labels)
    colors = owner_colors(_request_ids([s for row in rows for s in row]))

    def draw(row: Row, *, dom_id: str) -> str:
        return _stack_svg(row, row[0].label, colors, max_cells, dom_id)

    def describe(row: Row) -> str:
        return " | ".join(_summary(s) for s in row)

    return Timeline(rows, draw, name=name, describe=describe)
