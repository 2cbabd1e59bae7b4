"""One KV-cache configuration, validated once, and the one place every pool is built.

The simulator (``SimConfig``), each replica of the cluster and the engine (``PagedEngine``)
all describe their cache with a :class:`CacheConfig` and get their pool from
:meth:`CacheConfig.make_pool`, so an option of the cache is one field here: its check in
``__post_init__`` and its effect in ``make_pool``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from course_lib.free_queue import free_queue_class
from course_lib.paged import BlockPool
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.rollback import undoable
from course_lib.tier import CpuTier, TieredBlockPool
from course_lib.validate import check_int

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class KVTensors:
    """The K/V a pool owns: ``num_layers`` tensors of ``num_kv_heads`` heads of
    ``head_dim`` numbers per token, in ``dtype`` on ``device`` (``BlockPool``'s layout)."""

    num_kv_heads: int
    head_dim: int
    num_layers: int
    dtype: torch.dtype
    device: str | torch.device


@dataclass(frozen=True)
class CacheConfig:
    """A paged KV cache: ``num_blocks`` blocks of ``block_size`` tokens (block 0 the null
    block); ``prefix_caching`` keeps and finds full blocks by hash (chapter 04);
    ``free_order`` names the eviction order (``course_lib.free_queue``); ``cpu_tier_bytes``
    keeps evicted cached blocks in a CPU tier of that size (chapter 09; needs prefix
    caching; None for no tier, while a tier of 0 bytes keeps nothing but counts its
    lookups, as the cluster's tier study does)."""

    num_blocks: int
    block_size: int = 16
    prefix_caching: bool = False
    free_order: str = "vllm"
    cpu_tier_bytes: int | None = None

    def __post_init__(self) -> None:
        check_int("num_blocks", self.num_blocks, 2)
        check_int("block_size", self.block_size, 1)
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix_caching must be True or False, got "
                             f"{self.prefix_caching!r}")
        free_queue_class(self.free_order)
        if self.cpu_tier_bytes is not None:
            check_int("cpu_tier_bytes", self.cpu_tier_bytes, 0)
            if not self.prefix_caching:
                raise ValueError(f"cpu_tier_bytes={self.cpu_tier_bytes} needs "
                                 f"prefix_caching=True")

    def make_pool(self, *, kv: KVTensors | None = None, rollback: bool = False,
                  block_bytes: int | None = None, record_evictions: bool = False) -> BlockPool:
        """The pool this configuration describes: with ``kv`` it owns K/V tensors; with
        ``rollback`` its changes can be undone (``course_lib.rollback``, the engine's step).
        A tiered pool (one with a CPU tier) weighs a block at ``block_bytes`` when it owns
        no K/V, and with ``record_evictions`` lists the hashes it evicts (the cluster's
        router reads them)."""
        options: dict[str, Any] = {"free_order": self.free_order}
        if kv is not None:
            options.update(num_kv_heads=kv.num_kv_heads, head_dim=kv.head_dim,
                           num_layers=kv.num_layers, dtype=kv.dtype, device=kv.device)
        if self.cpu_tier_bytes is not None:
            pool_type: type[BlockPool] = TieredBlockPool
            options.update(tier=CpuTier(self.cpu_tier_bytes), block_bytes=block_bytes,
                           record_evictions=record_evictions)
        else:
            pool_type = PrefixCachingBlockPool if self.prefix_caching else BlockPool
        if rollback:
            pool_type = undoable(pool_type)
        return pool_type(self.num_blocks, self.block_size, **options)
