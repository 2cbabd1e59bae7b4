"""Automatic prefix caching: find a request's longest already-computed prefix by block hash.

As vLLM does it: every *full* block gets a hash chained from its parent's,

    hash(block i) = sha256(hash(block i-1), token ids of block i, extra keys)

so equal hashes mean equal whole prefixes, not just equal blocks. The first block's
extra keys carry the request's cache salt; the chain passes it on, so two tenants with
different salts never share a block. A partly filled block has no hash and is never shared.

Collisions are ruled out, not detected: the hash input is a canonical, length-prefixed
byte encoding (a 32-byte parent, a token count and 8-byte tokens, a key count and
length-prefixed UTF-8 keys), so different inputs always give different bytes, and finding
two byte strings with the same SHA-256 is computationally infeasible. (vLLM likewise keeps
no tokens to compare.)

A freed block keeps its hash and goes to the back of the free queue, where a later request
can still find and revive it ("touch"). Only when the pool hands it out again does it lose
its hash: eviction, least recently freed first. A freed block without a hash (a partly
filled tail) goes to the front instead and is reused first, so it never pushes a cached
block out (vLLM PR 42656; ``free_order="fifo"`` gives the older order, everything to the
back).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from course_lib.paged import BlockPool, PagedKVManager, all_of_type, check_int
from course_lib.validate import check_list

BlockHash = bytes
"""A 32-byte SHA-256 digest naming a full block and everything before it."""

ROOT_HASH: BlockHash = hashlib.sha256(b"course_lib prefix cache root").digest()
"""The parent hash of a sequence's first block (fixed, so runs are reproducible)."""

HASH_BYTES = len(ROOT_HASH)
"""Bytes in a block hash (SHA-256)."""


def check_block_hash(name: str, value: object) -> BlockHash:
    """Return ``value`` if it is a 32-byte block hash, else raise a ValueError naming it."""
    if not isinstance(value, bytes) or len(value) != HASH_BYTES:
        raise ValueError(f"{name} must be a {HASH_BYTES}-byte block hash, got {value!r}")
    return value


def check_block_hashes(name: str, values: object) -> list[BlockHash]:
    """``values`` (named ``name``, an iterable of ``name`` hashes) as a new list if every
    item is a block hash, else a ValueError naming the first bad one (a fast test of the
    whole list first: a chain is checked on every lookup)."""
    hashes = check_list(name, values)
    if not (all_of_type(hashes, bytes)
            and list(map(len, hashes)).count(HASH_BYTES) == len(hashes)):
        for value in hashes:
            check_block_hash(f"{name} hash", value)
    return hashes


def hash_block_tokens(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: Sequence[str] = ()
) -> BlockHash:
    """SHA-256 of (parent hash or ``ROOT_HASH``, the block's token ids, extra keys)."""
    parent = ROOT_HASH if parent is None else check_block_hash("parent", parent)
    digest = hashlib.sha256(parent)
    try:
        digest.update(struct.pack(f"<Q{len(token_ids)}Q", len(token_ids), *token_ids))
    except struct.error:
        raise ValueError(f"token ids must be integers in [0, 2**64), got {token_ids!r}") from None
    digest.update(struct.pack("<Q", len(extra_keys)))
    for key in extra_keys:
        if not isinstance(key, str):
            raise ValueError(f"extra keys must be strings, got {key!r}")
        encoded = key.encode()
        digest.update(struct.pack("<Q", len(encoded)) + encoded)
    return digest.digest()


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    cache_salt: str | None = None,
    known: Sequence[BlockHash] = (),
) -> list[BlockHash]:
    """The hash chain of every full block of ``token_ids``; the tail block has none.

    ``known`` holds hashes already computed for a prefix, so appending tokens hashes only
    the blocks that have just filled up.
    """
    check_int("block_size", block_size, 1)
    hashes = list(known)
    extend_chain(hashes, token_ids, block_size, cache_salt)
    return hashes


def _prompt_chain(
    token_ids: list[int], block_size: int, cache_salt: str | None, known: Sequence[BlockHash]
) -> list[BlockHash]:
    """``block_hashes`` of a new sequence's checked ``token_ids``, once ``known`` (the hashes
    its caller already computed for a prefix) is checked: no more than its full blocks."""
    known = check_block_hashes("known", known)
    if len(known) > len(token_ids) // block_size:
        raise ValueError(f"{len(known)} known hashes for {len(token_ids)} tokens, more than "
                         f"their full blocks")
    return block_hashes(token_ids, block_size, cache_salt=cache_salt, known=known)


def extend_chain(
    hashes: list[BlockHash], token_ids: Sequence[int], block_size: int, cache_salt: str | None
) -> None:
    """Append to ``hashes``, the chain of a prefix of ``token_ids``, the blocks that have
    filled since (in place, so a growing sequence hashes each block once).

    The same digests as ``hash_block_tokens``, computed faster (a simulation hashes about
    190,000 blocks): the new blocks' tokens are packed in one call and each block is one
    SHA-256 of its parent, its token count, its slice of that packing and no extra keys."""
    first, end = len(hashes), len(token_ids) // block_size
    if first >= end:
        return
    parent = check_block_hash("parent", hashes[-1]) if hashes else ROOT_HASH
    if first == 0 and cache_salt is not None:
        parent = hash_block_tokens(None, token_ids[:block_size], (cache_salt,))
        hashes.append(parent)
        first = 1
    tokens = token_ids[first * block_size : end * block_size]
    try:
        packed = struct.pack(f"<{len(tokens)}Q", *tokens)
    except struct.error:
        raise ValueError(f"token ids must be integers in [0, 2**64), got "
                         f"{[t for t in tokens if not isinstance(t, int) or not 0 <= t < 2**64]!r}"
                         ) from None
    count, sha256, width = struct.pack("<Q", block_size), hashlib.sha256, 8 * block_size
    for offset in range(0, len(packed), width):
        parent = sha256(parent + count + packed[offset : offset + width] + _NO_KEYS).digest()
        hashes.append(parent)


_NO_KEYS = struct.pack("<Q", 0)
"""The encoding of an empty list of extra keys."""


class PrefixCachingBlockPool(BlockPool):
    """A ``BlockPool`` that remembers which full blocks hold which hash.

    A hash may name several blocks (two requests can compute the same block before either
    is cached); lookups take the oldest. Same constructor as ``BlockPool``.
    """

    def __init__(self, num_blocks: int, block_size: int, **kv_options: Any) -> None:
        """As ``BlockPool`` (its keyword options: K/V tensors and ``free_order``)."""
        super().__init__(num_blocks, block_size, **kv_options)
        self._hash_of: dict[int, BlockHash] = {}
        self._blocks_of: dict[BlockHash, dict[int, None]] = {}
        self.num_evictions = 0

    @property
    def num_cached(self) -> int:
        """Blocks that carry a hash, held or free."""
        return len(self._hash_of)

    def allocate(self) -> int:
        """Take the front free block; if it still carried a hash, evict that first."""
        block_id = super().allocate()
        block_hash = self._hash_of.pop(block_id, None)
        if block_hash is not None:
            self._evict(block_id, block_hash)
        return block_id

    def allocate_many(self, count: int) -> list[int]:
        """Take ``count`` front free blocks, evicting the hashes they still carry."""
        taken = super().allocate_many(count)
        hash_of = self._hash_of
        if hash_of:
            for block_id in taken:
                block_hash = hash_of.pop(block_id, None)
                if block_hash is not None:
                    self._evict(block_id, block_hash)
        return taken

    def _evict(self, block_id: int, block_hash: BlockHash) -> None:
        """Drop a handed-out block from ``block_hash``'s holders (``_hash_of`` already
        forgot it)."""
        holders = self._blocks_of[block_hash]
        del holders[block_id]
        if not holders:
            del self._blocks_of[block_hash]
        self.num_evictions += 1
        self._events[block_id] = "evicted"
        self._evicted(block_id, block_hash)

    def _evicted(self, block_id: int, block_hash: BlockHash) -> None:
        """Called when ``block_id`` loses ``block_hash`` to a new owner, before anyone writes
        to it (its K/V still that hash's): a second tier keeps a copy here
        (``course_lib.tier``). Nothing to do in a pool without one."""

    def cache_block(self, block_id: int, block_hash: BlockHash) -> None:
        """Record that held, full block ``block_id`` holds ``block_hash``."""
        self.cache_blocks([block_id], [check_block_hash("block_hash", block_hash)])

    def cache_blocks(self, block_ids: Sequence[int], hashes: Sequence[BlockHash]) -> None:
        """``cache_block`` for each pair of ``block_ids`` and ``hashes``, all checked first
        (a refused call records nothing): the blocks of a prompt in one call."""
        self._record_hashes(*self._checked_pairs(block_ids, hashes))

    def _record_hashes(self, block_ids: list[int], hashes: list[BlockHash]) -> None:
        """Record checked pairs: held blocks that carry no other hash (the same one again
        changes nothing). The manager sends its own full blocks here directly: a block gets
        its hash only once it is full, and from the chain of the sequence that filled it,
        so it carries no other."""
        hash_of, blocks_of = self._hash_of, self._blocks_of
        for block_id, block_hash in zip(block_ids, hashes, strict=True):
            hash_of[block_id] = block_hash
            holders = blocks_of.get(block_hash)
            if holders is None:
                blocks_of[block_hash] = {block_id: None}
            else:
                holders[block_id] = None

    def _checked_pairs(self, block_ids: Sequence[int],
                       hashes: Sequence[BlockHash]) -> tuple[list[int], list[BlockHash]]:
        """``cache_blocks``' arguments as lists, if every block is held and carries no
        other hash, else a ValueError naming the first bad one."""
        ids, hashes = check_list("block_ids", block_ids), check_block_hashes("hashes", hashes)
        if len(ids) != len(hashes):
            raise ValueError(f"{len(ids)} block ids but {len(hashes)} hashes")
        hash_of, named = self._hash_of, {}
        for block_id, block_hash in zip(ids, hashes, strict=True):
            self._check_held(block_id)
            current = named.get(block_id, hash_of.get(block_id))
            if current is not None and current != block_hash:
                raise ValueError(f"block {block_id} already holds a different hash")
            named[block_id] = block_hash  # named twice: the same hash both times
        return ids, hashes

    def _check_cached_once(self, ids: list[int]) -> None:
        """Raise the ValueError that names the first id of ``ids`` that is not a cached
        block of this pool, or the repetition if each is one."""
        for block_id in ids:
            self._check_id(block_id)
            if block_id not in self._hash_of:
                raise ValueError(f"block {block_id!r} is not a cached block")
        if len(set(ids)) != len(ids):
            raise ValueError(f"block ids {ids} name a block more than once")

    def _cached_ids(self) -> Container[int]:
        """The blocks that carry a hash (what the free queue's order keeps longest)."""
        return self._hash_of.keys()

    def block_hash(self, block_id: int) -> BlockHash | None:
        """The hash ``block_id`` carries, or None."""
        self._check_id(block_id)
        return self._hash_of.get(block_id)

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The oldest block that holds ``block_hash``, or None."""
        holders = self._blocks_of.get(check_block_hash("block_hash", block_hash))
        return next(iter(holders)) if holders else None

    def longest_cached_prefix(self, hashes: Iterable[BlockHash]) -> list[int]:
        """Blocks for the leading hashes found in the cache, stopping at the first miss."""
        return self._cached_prefix(check_block_hashes("block", hashes))

    def _cached_prefix(self, hashes: list[BlockHash]) -> list[int]:
        """``longest_cached_prefix`` of checked hashes (the manager's own chains), in
        C-speed passes: a prompt's chain is looked up at every admission."""
        holders = list(map(self._blocks_of.get, hashes))
        if None in holders:
            del holders[holders.index(None):]
        return list(map(next, map(iter, holders)))  # each hash's oldest holder

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on each cached block, reviving any that sat in the free queue.

        All ids are checked first (cached, each named once), so a refused call takes nothing.
        """
        ids = check_list("block_ids", block_ids)
        if not (all_of_type(ids, int) and len(set(ids)) == len(ids)
                and self._hash_of.keys() >= set(ids)):  # the fast path; below names the fault
            self._check_cached_once(ids)
        for block_id in ids:
            if self._ref[block_id] == 0:
                self.free_queue.remove(block_id)
            self._ref[block_id] += 1
            self._events[block_id] = "cache-hit"
        self.free_queue.hit(ids)


@dataclass(frozen=True)
class PrefixCacheStats:
    """Lookups so far: prompt tokens asked for and tokens found cached."""

    queries: int
    query_tokens: int
    hit_tokens: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        """Share of looked-up prompt tokens found in the cache (vLLM's token hit rate)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def tokens_not_recomputed(self) -> int:
        """Prompt tokens whose K/V came from the cache instead of a prefill."""
        return self.hit_tokens


class PrefixCachingKVManager(PagedKVManager):
    """``PagedKVManager`` that reuses cached full blocks and caches every block that fills.

    Only sequences added with ``token_ids`` take part (a hash needs the tokens). As in
    vLLM, at least the last prompt token is always computed, so a hit covers at most
    ``len(token_ids) - 1`` tokens.
    """

    pool: PrefixCachingBlockPool

    def __init__(self, pool: PrefixCachingBlockPool) -> None:
        """Manage sequences over a prefix-caching pool."""
        if not isinstance(pool, PrefixCachingBlockPool):
            raise ValueError(f"prefix caching needs a PrefixCachingBlockPool, got {pool!r}")
        super().__init__(pool)
        self._salts: dict[str, str | None] = {}
        self._hashes: dict[str, list[BlockHash]] = {}
        self._queries = self._query_tokens = self._hit_tokens = 0

    def add_sequence(
        self,
        seq_id: str,
        num_tokens: int | None = None,
        *,
        token_ids: Iterable[int] | None = None,
        cache_salt: str | None = None,
        known: Sequence[BlockHash] = (),
    ) -> int:
        """Start a sequence, reusing its longest cached prefix; return the tokens reused.

        ``cache_salt`` separates tenants: only requests with the same salt share blocks.
        ``known`` are hashes the caller already computed for a prefix of ``token_ids``
        (vLLM keeps them on the request), so only the rest are hashed.
        """
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt must be a str or None, got {cache_salt!r}")
        if token_ids is None:
            if cache_salt is not None:
                raise ValueError(f"cache_salt={cache_salt!r} needs token_ids to hash")
            return super().add_sequence(seq_id, num_tokens)
        length, ids = self._new_sequence_args(seq_id, num_tokens, token_ids)
        assert ids is not None
        hashes = _prompt_chain(ids, self.block_size, cache_salt, known)
        hit = self.pool._cached_prefix(hashes[: max(length - 1, 0) // self.block_size])
        revived = self.pool._num_unheld(hit)
        fresh = self.blocks_needed(length) - len(hit)
        self._require_free(fresh + revived)
        self.pool.touch(hit)
        table = hit + self.pool.allocate_many(fresh)
        self._install(seq_id, table, length, ids)
        self._salts[seq_id] = cache_salt
        self._hashes[seq_id] = hashes
        self.pool._record_hashes(table[len(hit):len(hashes)], hashes[len(hit):])  # fresh
        hit_tokens = len(hit) * self.block_size
        self._queries += 1
        self._query_tokens += length
        self._hit_tokens += hit_tokens
        return hit_tokens

    def append_tokens(
        self, seq_id: str, num_tokens: int | None = None, *,
        token_ids: Iterable[int] | None = None, cache: bool = True,
    ) -> None:
        """Extend as ``PagedKVManager`` does, then cache the blocks that just filled.

        With ``cache=False`` they are hashed later: by ``cache_full_blocks``, or when the
        sequence is freed, so a freed block still joins the free queue as a cached one.
        For a caller that knows nobody looks them up meanwhile (as the lazy serving core
        knows of its decodes, ``course_lib.lazy_serving``), this hashes a decode's blocks
        in one call instead of one call per block.
        """
        if not isinstance(cache, bool):
            raise ValueError(f"cache must be True or False, got {cache!r}")
        super().append_tokens(seq_id, num_tokens, token_ids=token_ids)
        if cache and seq_id in self._hashes:
            self._cache_full_blocks(seq_id)

    def cache_full_blocks(self, seq_id: str) -> None:
        """Hash and cache the full blocks of ``seq_id`` that an ``append_tokens(...,
        cache=False)`` left unhashed (none otherwise)."""
        self._get(seq_id)
        if seq_id in self._hashes:
            self._cache_full_blocks(seq_id)

    def fork(self, parent: str, child: str) -> None:
        """Fork as ``PagedKVManager`` does; the child continues the parent's hash chain
        (where hashing was deferred, whichever of the two caches the shared full blocks
        first records the same hashes the other would)."""
        super().fork(parent, child)
        if parent in self._hashes:
            self._salts[child] = self._salts[parent]
            self._hashes[child] = list(self._hashes[parent])

    def free_sequence(self, seq_id: str) -> None:
        """Free as ``PagedKVManager`` does (its full blocks cached first); cached blocks stay
        findable until evicted."""
        self.cache_full_blocks(seq_id)
        super().free_sequence(seq_id)
        self._salts.pop(seq_id, None)
        self._hashes.pop(seq_id, None)

    def stats(self) -> PrefixCacheStats:
        """Hit statistics since this manager was made."""
        return PrefixCacheStats(
            self._queries, self._query_tokens, self._hit_tokens, self.pool.num_evictions
        )

    def _cache_full_blocks(self, seq_id: str) -> None:
        """Hash the newly full blocks of ``seq_id`` and register them in the pool."""
        seq = self._seqs[seq_id]
        assert seq.token_ids is not None
        hashes = self._hashes[seq_id]
        done = len(hashes)
        extend_chain(hashes, seq.token_ids, self.block_size, self._salts[seq_id])
        if len(hashes) > done:
            self.pool._record_hashes(seq.table[done:len(hashes)], hashes[done:])

    def _cached_hash(self, block_id: int) -> str | None:
        """Hex hash of a cached block, for snapshots."""
        block_hash = self.pool.block_hash(block_id)
        return None if block_hash is None else block_hash.hex()
