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
    from course_lib.fp8 import FP8Format

KV_CACHE_DTYPES: dict[str, str | None] = {"auto": None, "fp8": "e4m3", "fp8_e4m3": "e4m3",
                                         "fp8_e5m2": "e5m2"}
"""vLLM's ``kv_cache_dtype`` names and the FP8 format each stores (``course_lib.fp8``;
None: the model's own dtype). ``"fp8"`` is E4M3, as on NVIDIA GPUs."""


def kv_format(kv_cache_dtype: str) -> FP8Format | None:
    """The FP8 format a ``kv_cache_dtype`` of :data:`KV_CACHE_DTYPES` stores K/V in (None:
    the model's dtype); a ValueError naming any other value. torch only for an FP8 one."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected one of "
                         f"{', '.join(KV_CACHE_DTYPES)}")
    name = KV_CACHE_DTYPES[kv_cache_dtype]
    if name is None:
        return None
    from course_lib.fp8 import fp8_format

    return fp8_format(name)


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
        kv_format(self.kv_cache_dtype)

    def make_pool(self, *, rollback: bool = False, block_bytes: int | None = None,
                  record_evictions: bool = False, **kv: Any) -> BlockPool:
        """The pool this configuration describes: ``kv`` are ``BlockPool``'s K/V options
        (``num_kv_heads``, ``head_dim``, ``num_layers``, ``dtype``, ``device``), the
        ``dtype`` an FP8 one for an FP8 ``kv_cache_dtype`` whatever ``kv`` says; with
        ``rollback`` its changes can be undone (``course_lib.rollback``, the engine's step).
        A tiered pool (one with a CPU tier) weighs a block at ``block_bytes`` when it owns
        no K/V, and with ``record_evictions`` lists the hashes it evicts (the cluster's
        router reads them)."""
        options: dict[str, Any] = {**kv, "free_order": self.free_order}
        fmt = kv_format(self.kv_cache_dtype)
        if fmt is not None:
            options["dtype"] = fmt.dtype
        if self.cpu_tier_bytes is not None:
            pool_type: type[BlockPool] = TieredBlockPool
            options.update(tier=CpuTier(self.cpu_tier_bytes), block_bytes=block_bytes,
                           record_evictions=record_evictions)
        else:
            pool_type = PrefixCachingBlockPool if self.prefix_caching else BlockPool
        if rollback:
            pool_type = undoable(pool_type)
        return pool_type(self.num_blocks, self.block_size, **options)
