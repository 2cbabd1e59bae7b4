"""Replicas side by side: each replica's block pool drawn as chapter 04's pool view, the
drawings placed in one row so the eye can compare where a conversation's blocks live."""

from __future__ import annotations

import re
from collections.abc import Sequence

from course_lib.snapshot import PoolSnapshot
from course_lib.viz.palette import owner_colors
from course_lib.viz.pool_view import _request_ids, _summary, render_svg
from course_lib.viz.svg import WIDTH, SvgPicture, esc

_HEIGHT = re.compile(r'viewBox="0 0 [0-9.]+ ([0-9.]+)"')


def replica_pools(snapshots: Sequence[PoolSnapshot], *, title: str,
                  max_cells: int = 256) -> SvgPicture:
    """The replicas' pools in one row (each scaled to its share of the course width), with
    one colour per request across all of them."""
    if not snapshots:
        raise ValueError("replica_pools needs at least one snapshot")
    colors = owner_colors(_request_ids(list(snapshots)))
    drawings = [render_svg(s, palette=colors, max_cells=max_cells, dom_id=f"replica-{k}")
                for k, s in enumerate(snapshots)]
    height = max(float(_HEIGHT.search(d).group(1)) for d in drawings)
    row = "".join(f'<svg x="{k * WIDTH}" y="0" width="{WIDTH}" height="{height:g}">'
                  f'{d}</svg>' for k, d in enumerate(drawings))
    total = WIDTH * len(drawings)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{height / len(drawings):g}" viewBox="0 0 {total} {height:g}" '
           f'role="img"><title>{esc(title)}</title>{row}</svg>')
    summary = "\n".join([title, *(_summary(s) for s in snapshots)])
    return SvgPicture(svg, summary)
