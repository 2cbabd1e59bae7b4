"""A frozen picture of a block pool at one moment, the contract between pool and drawing.

The pool (``course_lib.paged``) produces these; the block-pool widget
(``course_lib.viz``) draws a list of them as a timeline. Neither side needs the other's
internals, so a learner's own allocator can be drawn too if it fills these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

BlockEvent = Literal["allocated", "cow-copy", "freed", "evicted", "shared", "cache-hit"]


@dataclass(frozen=True)
class BlockView:
    """One physical block: how full it is, who points at it, and what just happened to it."""

    block_id: int
    tokens: int = 0
    owners: tuple[str, ...] = ()
    ref_count: int = 0
    cached_hash: str | None = None
    event: BlockEvent | None = None
    is_null: bool = False


@dataclass(frozen=True)
class PoolSnapshot:
    """The whole pool at one step: every block, every sequence's block table and length."""

    block_size: int
    blocks: tuple[BlockView, ...]
    tables: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seq_lens: dict[str, int] = field(default_factory=dict)
    label: str = ""

    @property
    def num_free(self) -> int:
        """Blocks holding nothing for anyone (the null block is never free)."""
        return sum(1 for b in self.blocks if not b.is_null and b.ref_count == 0)
