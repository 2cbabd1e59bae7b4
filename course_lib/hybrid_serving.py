"""The serving core over the hybrid KV-cache manager (chapter 08).

:class:`HybridServingCore` is :class:`~course_lib.serving.ServingCore` with a
:class:`~course_lib.hybrid.HybridKVManager` in place of the one-table manager; scheduling,
admission, chunked prefill, preemption and retirement are the core's own. Only the four
places where the core counts or takes blocks ask the hybrid manager instead: what a cache
hit is (the longest prefix every group serves), what a plan costs (new blocks and copies in
every group, less the window blocks handed back first, claim by claim), and how a sequence
is added and extended (with its token ids when prefix caching is on).

It runs in eager mode only: a window group hands back a block exactly when a decode moves
past it, so every decode must reach the manager every step (the lazy core touches a decode
only when it needs a block). Preemption is by recompute, the engine's kind.
"""

from __future__ import annotations

from collections.abc import Sequence

from course_lib.hybrid import HybridKVManager
from course_lib.paged import BlockPool
from course_lib.scheduler import SchedulerConfig
from course_lib.serving import Chunk, Sample, ServingCore, ServingRequest


class HybridServingCore(ServingCore):
    """The serving core over per-group block tables: ``windows[g]`` is group g's sliding
    window (None for full attention), all groups drawing on ``pool``."""

    manager: HybridKVManager

    def __init__(self, config: SchedulerConfig, pool: BlockPool,
                 windows: Sequence[int | None], *, chunked_prefill: bool = True) -> None:
        if isinstance(config, SchedulerConfig) and config.preemption != "recompute":
            raise ValueError(f"preemption {config.preemption!r} is not modelled for hybrid "
                             f"models; use 'recompute'")
        super().__init__(config, pool, chunked_prefill=chunked_prefill)
        self.manager = HybridKVManager(pool, windows)

    def _cache_hit(self, request: ServingRequest, sample: Sample) -> tuple[int, ...]:
        """The first group's blocks of the longest prefix every group serves (its length is
        the hit's; ``_group_hit`` gives every group's blocks)."""
        if not self.manager.caching:
            return ()
        chain = self._chain(request, sample, (len(sample.tokens) - 1) // self.pool.block_size)
        return self.manager.cache_hit(chain)[0]

    def _group_hit(self, chunk: Chunk) -> tuple[tuple[int, ...], ...]:
        """Every group's blocks of ``chunk``'s planned hit (the same prefix, asked again)."""
        assert chunk.hit is not None
        if not chunk.hit:
            return tuple(() for _ in self.manager.windows)
        return self.manager.cache_hit(self._chain(chunk.request, chunk.sample, len(chunk.hit)))

    def _blocks_for(self, plan: list[Chunk]) -> int:
        """Free blocks claiming ``plan``'s slots needs in all groups, claimed in the order
        ``_claim`` takes them (a new sequence first), window blocks handed back included."""
        ordered = sorted(plan, key=lambda c: c.hit is None) if len(plan) > 1 else plan
        return self.manager.claim_cost([
            (self._group_hit(c) if c.hit is not None else c.sample.seq_id, c.start + c.count)
            for c in ordered])

    def _add_sequence(self, chunk: Chunk) -> None:
        """Put a sequence new to the pool there, its cache hit first."""
        sample, end = chunk.sample, chunk.start + chunk.count
        if not self.manager.caching:
            self.manager.add_sequence(sample.seq_id, end)
            return
        hit = self.manager.add_sequence(
            sample.seq_id, token_ids=sample.tokens[:end], cache_salt=chunk.request.cache_salt,
            known=self._chain(chunk.request, sample, end // self.pool.block_size))
        assert chunk.hit is not None
        if hit != len(chunk.hit) * self.pool.block_size:
            raise RuntimeError(f"cache hit of {hit} tokens for {sample.seq_id}, planned "
                               f"{len(chunk.hit)} blocks; this is a bug")
