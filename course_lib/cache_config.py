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

    from course_lib.fp8 import FP8Format

KV_CACHE_DTYPES: dict[str, str | None] = {"auto": None, "fp8": "e4m3", "fp8_e4m3": "e4m3",
                                         "fp8_e5m2": "e5m2"}
"""vLLM's ``kv_cache_dtype`` names and the FP8 format each stores (``course_lib.fp8``;
None: the model's own dtype). ``"fp8"`` is E4M3, as on NVIDIA GPUs."""


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
    lookups, as the cluster's tier study does); ``kv_cache_dtype`` is ``"auto"`` (K/V in
    the model's dtype) or an FP8 format of :data:`KV_CACHE_DTYPES` (chapter 10)."""

    num_blocks: int
    block_size: int = 16
    prefix_caching: bool = False
    free_order: str = "vllm"
    cpu_tier_bytes: int | None = None
    kv_cache_dtype: str = "auto"

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
        if not isinstance(self.kv_cache_dtype, str) or self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; expected one "
                             f"of {', '.join(KV_CACHE_DTYPES)}")

    @property
    def kv_format(self) -> FP8Format | None:
        """The FP8 format the K/V are stored in, or None for the model's dtype."""
        name = KV_CACHE_DTYPES[self.kv_cache_dtype]
        if name is None:
            return None
        from course_lib.fp8 import fp8_format  # torch, only for an FP8 cache

        return fp8_format(name)

    def make_pool(self, *, kv: KVTensors | None = None, rollback: bool = False,
                  block_bytes: int | None = None, record_evictions: bool = False) -> BlockPool:
        """The pool this configuration describes: with ``kv`` it owns K/V tensors (FP8 ones
        for an FP8 ``kv_cache_dtype``, whatever ``kv.dtype`` says); with
        ``rollback`` its changes can be undone (``course_lib.rollback``, the engine's step).
        A tiered pool (one with a CPU tier) weighs a block at ``block_bytes`` when it owns
        no K/V, and with ``record_evictions`` lists the hashes it evicts (the cluster's
        router reads them)."""
        options: dict[str, Any] = {"free_order": self.free_order}
        if kv is not None:
            fmt = self.kv_format
            options.update(num_kv_heads=kv.num_kv_heads, head_dim=kv.head_dim,
                           num_layers=kv.num_layers, device=kv.device,
                           dtype=kv.dtype if fmt is None else fmt.dtype)
        if self.cpu_tier_bytes is not None:
            pool_type: type[BlockPool] = TieredBlockPool
            options.update(tier=CpuTier(self.cpu_tier_bytes), block_bytes=block_bytes,
                           record_evictions=record_evictions)
        else:
            pool_type = PrefixCachingBlockPool if self.prefix_caching else BlockPool
        if rollback:
            pool_type = undoable(pool_type)
        return pool_type(self.num_blocks, self.block_size, **options)
