"""A second tier for the prefix cache: evicted cached blocks kept in CPU memory.

Chapter 04's prefix cache forgets a block when the pool hands it to someone else. With a
tier, the pool first copies the block's K/V to a bounded CPU store keyed by its block hash
(:class:`CpuTier`, least recently used out first). A later request looks up its prefix in
the GPU cache first, then goes on in the tier; the blocks found there are copied back over
PCIe into fresh GPU blocks instead of being computed again. The serving core
(``course_lib.serving``) asks the pool for the tier's share of a hit and has the blocks
copied back when it admits the request.

vLLM's offloading connector (native, or LMCache) keeps such a tier but fills it at another
moment: it stores each block as soon as the block is computed and full (the connector's
scheduler side picks them every step; the worker copies them asynchronously), not when the
GPU evicts it. Its CPU copies therefore exist while the GPU still holds the block, and an
eviction costs nothing; here a block crosses PCIe only when the GPU evicts it.

The tier is inclusive, as vLLM's CPU offloading is: a block copied back stays in the tier
(it just becomes the most recently used), so its next eviction from the GPU costs no copy.
A hash names the whole prefix before it, so the K/V stored under it never goes stale: a
GPU block that is reused gets a new hash, and the tier keeps the old one's copy.

In the engine (``course_lib.engine``) the copies are real CPU tensors; in the simulator a
pool without K/V stores nothing but the hash and counts bytes, and the cluster
(``course_lib.cluster``) charges each copied-back block chapter 05's swap cost.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from course_lib.prefix_cache import (
    BlockHash,
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
    check_block_hash,
)
from course_lib.validate import check_int, check_list, describe


@dataclass(frozen=True)
class TierStats:
    """Prefix-cache traffic in tokens, named as vLLM's metrics name it.

    ``prefix_cache_queries`` prompt tokens looked up and ``prefix_cache_hits`` of them found
    in the GPU cache (vLLM's ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits``);
    ``external_prefix_cache_queries`` tokens asked of the tier (those the GPU missed) and
    ``external_prefix_cache_hits`` found there (vLLM's counters for a KV connector);
    ``prompt_tokens_computed`` the rest, which were prefilled. Blocks stored and bytes
    moved each way complete the picture.
    """

    prefix_cache_queries: int
    prefix_cache_hits: int
    external_prefix_cache_queries: int
    external_prefix_cache_hits: int
    stored_blocks: int
    stored_bytes: int
    loaded_bytes: int

    @property
    def prompt_tokens_computed(self) -> int:
        """Looked-up prompt tokens neither cache held: computed by a prefill."""
        return (self.prefix_cache_queries - self.prefix_cache_hits
                - self.external_prefix_cache_hits)

    @property
    def hit_rate(self) -> float:
        """Share of looked-up tokens found in either tier."""
        hits = self.prefix_cache_hits + self.external_prefix_cache_hits
        return hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters and the two derived figures, JSON-ready."""
        return {**vars(self), "prompt_tokens_computed": self.prompt_tokens_computed,
                "hit_rate": self.hit_rate}


class CpuTier:
    """A bounded store of blocks keyed by block hash: at most ``capacity_bytes`` bytes,
    least recently used out first.

    ``put`` stores (or refreshes) a block of ``nbytes`` bytes with an optional payload (the
    K/V copy), ``prefix`` counts how many leading hashes it holds without touching them,
    ``fetch`` returns their payloads and makes them the most recently used. A block larger
    than the whole capacity is not stored.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = check_int("capacity_bytes", capacity_bytes, 0)
        self._entries: OrderedDict[BlockHash, tuple[int, Any]] = OrderedDict()
        self.bytes_used = 0
        self.stored_blocks = self.stored_bytes = self.loaded_bytes = self.dropped_blocks = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._entries

    def hashes(self) -> tuple[BlockHash, ...]:
        """The stored hashes, least recently used first (the next to go)."""
        return tuple(self._entries)

    def put(self, block_hash: BlockHash, nbytes: int, payload: Any = None) -> list[BlockHash]:
        """Store ``block_hash`` as the most recently used, dropping the least recently used
        while the bytes exceed the capacity; return the hashes dropped. Storing a hash
        already held only refreshes it (its K/V are the same: a hash names its prefix)."""
        check_block_hash("block_hash", block_hash)
        check_int("nbytes", nbytes, 1)
        if block_hash in self._entries:
            self._entries.move_to_end(block_hash)
            return []
        if nbytes > self.capacity_bytes:
            return []
        self._entries[block_hash] = (nbytes, payload)
        self.bytes_used += nbytes
        self.stored_blocks += 1
        self.stored_bytes += nbytes
        dropped = []
        while self.bytes_used > self.capacity_bytes:
            old, (size, _) = self._entries.popitem(last=False)
            self.bytes_used -= size
            self.dropped_blocks += 1
            dropped.append(old)
        return dropped

    def prefix(self, hashes: Sequence[BlockHash]) -> int:
        """How many of the leading ``hashes`` the tier holds (a lookup; nothing moves)."""
        return next((i for i, h in enumerate(hashes) if h not in self._entries), len(hashes))

    def fetch(self, hashes: Iterable[BlockHash]) -> list[Any]:
        """The payloads of ``hashes`` (all held, else nothing changes and ValueError), each
        made the most recently used, their bytes counted as copied back."""
        hashes = check_list("hashes", hashes)
        missing = [h for h in hashes if h not in self._entries]
        if missing:
            raise ValueError(f"the tier does not hold {len(missing)} of the {len(hashes)} "
                             f"hashes asked for, e.g. {describe(missing[0])}")
        payloads = []
        for block_hash in hashes:
            self._entries.move_to_end(block_hash)
            nbytes, payload = self._entries[block_hash]
            self.loaded_bytes += nbytes
            payloads.append(payload)
        return payloads


class TieredBlockPool(PrefixCachingBlockPool):
    """A prefix-caching pool whose evicted cached blocks go to a :class:`CpuTier`.

    ``block_bytes`` is what one block's K/V weighs (all layers, K and V); a pool that owns
    K/V tensors computes it, one without (the simulator's) must be told. With
    ``record_evictions`` every evicted hash is also appended to ``evicted`` (the cluster's
    router reads it to keep its index). Other arguments are ``BlockPool``'s.
    """

    def __init__(self, num_blocks: int, block_size: int, *, tier: CpuTier,
                 block_bytes: int | None = None, record_evictions: bool = False,
                 **kv_options: Any) -> None:
        super().__init__(num_blocks, block_size, **kv_options)
        if not isinstance(tier, CpuTier):
            raise ValueError(f"tier must be a CpuTier, got {describe(tier)}")
        if self.owns_kv:
            kv = self.kv_cache(0)
            own = kv[0].numel() * kv.element_size() * self.num_layers
            if block_bytes is not None and block_bytes != own:
                raise ValueError(f"block_bytes={describe(block_bytes)}, but a block of this "
                                 f"pool's K/V weighs {own} bytes")
            block_bytes = own
        elif block_bytes is None:
            raise ValueError("a pool without K/V tensors needs block_bytes (one block's K/V "
                             "in bytes) to fill its tier")
        self.block_bytes = check_int("block_bytes", block_bytes, 1)
        self.tier = tier
        self.evicted: list[BlockHash] | None = [] if record_evictions else None
        self.tier_hit_blocks = 0

    @property
    def num_layers(self) -> int:
        """Layers of K/V the pool owns (0 without tensors)."""
        return 0 if self._kv is None else self._kv.shape[0]

    def _evicted(self, block_id: int, block_hash: BlockHash) -> None:
        """Copy the evicted block's K/V (if any) to the tier before it is reused."""
        payload = None
        if self.owns_kv:
            payload = self._kv[:, block_id].to("cpu", copy=True)
        self.tier.put(block_hash, self.block_bytes, payload)
        if self.evicted is not None:
            self.evicted.append(block_hash)

    def tier_prefix(self, hashes: Sequence[BlockHash]) -> int:
        """How many leading ``hashes`` (those after the GPU hit) the tier holds."""
        return self.tier.prefix(hashes)

    def fetch(self, hashes: Sequence[BlockHash]) -> list[Any]:
        """The tier's copies of ``hashes``, taken before the blocks they go to are
        allocated (an allocation may evict into the tier and push them out)."""
        payloads = self.tier.fetch(hashes)
        self.tier_hit_blocks += len(payloads)
        return payloads

    def write_fetched(self, block_ids: Sequence[int], payloads: Sequence[Any]) -> None:
        """Copy fetched K/V into freshly allocated ``block_ids`` (nothing without tensors)."""
        if len(block_ids) != len(payloads):
            raise ValueError(f"{len(payloads)} fetched blocks for {len(block_ids)} block ids")
        if not self.owns_kv:
            return
        for block_id, payload in zip(block_ids, payloads, strict=True):
            self._check_held(block_id)
            self._kv[:, block_id] = payload.to(self._kv.device)


def tier_stats(manager: PrefixCachingKVManager) -> TierStats:
    """The prefix-cache traffic of ``manager`` and its pool's tier (if any), in tokens."""
    if not isinstance(manager, PrefixCachingKVManager):
        raise ValueError(f"tier_stats needs a PrefixCachingKVManager, got {describe(manager)}")
    stats, pool, size = manager.stats(), manager.pool, manager.block_size
    tier_hits = pool.tier_hit_blocks * size if isinstance(pool, TieredBlockPool) else 0
    tier = pool.tier if isinstance(pool, TieredBlockPool) else None
    return TierStats(
        prefix_cache_queries=stats.query_tokens,
        prefix_cache_hits=stats.hit_tokens,
        external_prefix_cache_queries=(stats.query_tokens - stats.hit_tokens
                                       if tier is not None else 0),
        external_prefix_cache_hits=tier_hits,
        stored_blocks=tier.stored_blocks if tier is not None else 0,
        stored_bytes=tier.stored_bytes if tier is not None else 0,
        loaded_bytes=tier.loaded_bytes if tier is not None else 0,
    )
