"""The hybrid KV-cache manager: KV-cache groups with their own block tables over one pool.

Chapter 08. A hybrid model has layers of different attention kinds (``course_lib.kv_math``:
full attention, or a sliding window of W tokens). As vLLM v1 does it, layers of one kind
form a *KV-cache group*, and a sequence has one block table per group, all drawing on the
same ``BlockPool`` (one page size, one free queue). What differs by group:

* **Window freeing.** A token at position p attends to positions p - W + 1 .. p. Before a
  sequence computes its next chunk, starting at position s, a window group hands back every
  block wholly before s - W + 1: nothing will read it again. Its table keeps the null block
  in its place, so logical block i still sits at index i. The blocks go back last block
  first, as vLLM frees them, so of two cached blocks let go in one step the later one is
  evicted first.
* **The prefix-hit rule.** With a ``PrefixCachingBlockPool`` every group caches its full
  blocks, under the block's chained hash tagged with the group (vLLM keys its cache by hash
  and group). A full group can serve a hit of k blocks when blocks 0 .. k-1 are cached; a
  window group only needs the blocks that hold the last W - 1 tokens before position kB
  (the keys the first recomputed token attends to, besides itself). The hit is the longest
  prefix every group can serve; the window group's skipped blocks are null in its table.

Fork shares every held block of every group; appending into a shared, partly filled last
block copies it first (copy-on-write) in each group; freeing (finishing or preemption)
releases each group's blocks as one batch, tail first. Every operation checks that the pool
can supply what it needs before it changes anything, and raises ``OutOfBlocks`` otherwise.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from course_lib.kv_math import HybridModel, blocks_needed
from course_lib.paged import NULL_BLOCK, BlockPool, SequenceLookup, _count_and_ids, _pool_snapshot
from course_lib.prefix_cache import (
    BlockHash,
    PrefixCacheStats,
    PrefixCachingBlockPool,
    _prompt_chain,
    check_block_hash,
    check_block_hashes,
    extend_chain,
    hash_block_tokens,
)
from course_lib.snapshot import PoolSnapshot
from course_lib.validate import check_int, check_list, describe


def first_needed_block(start: int, window: int | None, block_size: int) -> int:
    """The first logical block a group still needs when a chunk starts at position ``start``:
    0 for full attention, else the block holding position ``start - window + 1``."""
    check_int("start", start, 0)
    check_int("block_size", block_size, 1)
    if window is None:
        return 0
    return max(0, start - check_int("window", window, 1) + 1) // block_size


def table_name(seq_id: str, group: int, window: int | None) -> str:
    """The name a snapshot gives group ``group``'s table of ``seq_id``:
    ``"<sequence> g<group> (<kind>)"``, so a drawing colours each group apart."""
    return f"{seq_id} g{group} ({'full' if window is None else f'window {window}'})"


_GROUP_SUFFIX = re.compile(r" g\d+ \((?:full|window \d+)\)\Z")


def request_of(table: str) -> str:
    """The sequence whose table a snapshot names ``table``: the name without a group's
    suffix (``table_name``), or the name itself."""
    return _GROUP_SUFFIX.sub("", table)


def group_hash(block_hash: BlockHash, group: int) -> BlockHash:
    """The key under which group ``group`` caches the block named ``block_hash``: two groups
    hold different K/V for the same tokens, so they never find each other's blocks."""
    return _group_hash(check_block_hash("block_hash", block_hash), check_int("group", group, 0))


@lru_cache(maxsize=1 << 16)
def _group_hash(block_hash: BlockHash, group: int) -> BlockHash:
    """``group_hash`` of checked arguments, remembered for the most recent 65,536 keys: a
    waiting request is looked up in every group at every step it waits."""
    return hash_block_tokens(block_hash, (), (f"kv-cache group {group}",))


def serves_hit(cached: Sequence[bool], blocks: int, window: int | None,
               block_size: int) -> bool:
    """Whether a group whose block i is cached when ``cached[i]`` can serve a hit of
    ``blocks`` full blocks: it needs every block from the first one the token at position
    ``blocks * block_size`` (the first one recomputed) reads."""
    check_int("blocks", blocks, 0, len(cached))
    return all(cached[first_needed_block(blocks * block_size, window, block_size):blocks])


def hit_blocks(cached: Sequence[Sequence[bool]], windows: Sequence[int | None],
               block_size: int, num_tokens: int) -> int:
    """The prefix-hit rule: the most full blocks of a ``num_tokens``-token prompt that every
    group serves (``cached[g][i]``: group g holds block i of the prompt's hash chain), never
    the prompt's last token, which is always computed."""
    check_int("num_tokens", num_tokens, 0)
    if len(cached) != len(windows):
        raise ValueError(f"{len(cached)} groups of cached flags for {len(windows)} windows")
    blocks = max(num_tokens - 1, 0) // check_int("block_size", block_size, 1)
    for flags in cached:
        if len(flags) < blocks:
            raise ValueError(f"{len(flags)} cached flags for a prompt of {blocks} full blocks")
    while blocks and not all(serves_hit(flags, blocks, window, block_size)
                             for flags, window in zip(cached, windows, strict=True)):
        blocks -= 1
    return blocks


@dataclass
class _HybridSequence:
    """One sequence: a block table per group (null where a window group let a block go),
    its length, where its last chunk started, (with token ids) its hash chain, and how many
    leading entries of each table are null already (so a decode does not walk them)."""

    tables: list[list[int]]
    length: int
    start: int
    token_ids: list[int] | None
    hashes: list[BlockHash] = field(default_factory=list)
    salt: str | None = None
    dropped: list[int] = field(init=False)  # per table: leading entries already null

    def __post_init__(self) -> None:
        self.dropped = [next((i for i, b in enumerate(t) if b != NULL_BLOCK), len(t))
                        for t in self.tables]


class HybridKVManager(SequenceLookup):
    """Per-group block tables over one ``BlockPool``; ``windows[g]`` is group g's sliding
    window (None: full attention). Prefix caching is on when the pool is a
    ``PrefixCachingBlockPool`` and a sequence is added with ``token_ids``."""

    def __init__(self, pool: BlockPool, windows: Sequence[int | None]) -> None:
        """Manage sequences whose blocks, in every group, come from ``pool``."""
        if not isinstance(pool, BlockPool):
            raise ValueError(f"pool must be a BlockPool, got {describe(pool)}")
        self.windows = tuple(check_list("windows", windows))
        if not self.windows:
            raise ValueError("windows must name at least one group")
        for window in self.windows:
            if window is not None:
                check_int("window", window, 1)
        self.pool = pool
        self._seqs: dict[str, _HybridSequence] = {}
        self._queries = self._query_tokens = self._hit_tokens = 0

    @classmethod
    def for_model(cls, pool: BlockPool, model: HybridModel) -> HybridKVManager:
        """A manager with one group per KV-cache group of ``model`` (``kv_cache_groups``)."""
        if not isinstance(model, HybridModel):
            raise ValueError(f"model must be a HybridModel, got {describe(model)}")
        return cls(pool, [group.window for group in model.kv_cache_groups()])

    # --- what the serving core reads --------------------------------------------------

    @property
    def block_size(self) -> int:
        """Tokens per block (one page size for every group)."""
        return self.pool.block_size

    @property
    def caching(self) -> bool:
        """Whether full blocks are cached for later requests."""
        return isinstance(self.pool, PrefixCachingBlockPool)

    def saved(self) -> Callable[[], None]:
        """Save the live sequences' bookkeeping and the query counts (the engine's
        all-or-nothing step, ``course_lib.rollback``); returns what puts them back."""
        seqs = copy.deepcopy(self._seqs)
        counts = (self._queries, self._query_tokens, self._hit_tokens)

        def undo() -> None:
            self._seqs = copy.deepcopy(seqs)
            self._queries, self._query_tokens, self._hit_tokens = counts
        return undo

    def block_tables(self, seq_id: str) -> tuple[tuple[int, ...], ...]:
        """Each group's block table for ``seq_id`` (null where a window block was freed)."""
        return tuple(tuple(table) for table in self._get(seq_id).tables)

    def block_table(self, seq_id: str, group: int = 0) -> tuple[int, ...]:
        """Group ``group``'s block table for ``seq_id``."""
        tables = self._get(seq_id).tables
        check_int("group", group, 0, len(tables) - 1)
        return tuple(tables[group])

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks a new sequence of ``num_tokens`` tokens takes in all groups (every group
        holds the whole prompt while it is computed)."""
        return len(self.windows) * blocks_needed(num_tokens, self.block_size)

    def held_blocks(self, seq_id: str) -> int:
        """Blocks ``seq_id`` holds in all groups (null entries not counted)."""
        return sum(b != NULL_BLOCK for table in self._get(seq_id).tables for b in table)

    # --- cost of an operation, before doing it ---------------------------------------

    def claim_cost(self, claims: Sequence[tuple[str | Sequence[Sequence[int]], int]]) -> int:
        """Fewest free blocks the pool must have for ``claims``, made in order: each is
        ``(seq_id, end)``, a sequence extended to ``end`` tokens (its window blocks go back
        first, then shared partly filled last blocks are copied and new blocks taken), or
        ``(hit, end)``, a new sequence of ``end`` tokens starting from a cache hit as
        ``cache_hit`` returns it (fresh blocks, plus cached ones revived from the free
        queue)."""
        refs: dict[int, int] = {}  # reference counts as the claims before change them
        balance = worst = 0  # blocks taken less blocks handed back, so far

        def ref(block: int) -> int:
            return refs.get(block, self.pool.ref_count(block))

        for target, end in claims:
            if isinstance(target, str):
                balance += self._extend_cost(self._get(target), end, ref, refs)
            else:
                tables = [list(table) for table in target] or [[] for _ in self.windows]
                balance += len(self.windows) * (
                    blocks_needed(end, self.block_size) - len(tables[0]))
                for block in {b for table in tables for b in table if b != NULL_BLOCK}:
                    balance += ref(block) == 0
                    refs[block] = ref(block) + 1
            worst = max(worst, balance)
        return worst

    def _extend_cost(self, seq: _HybridSequence, end: int, ref, refs: dict[int, int]) -> int:
        """Blocks taken less blocks handed back when ``seq`` grows to ``end`` tokens, with
        ``ref`` the counts so far (updated in ``refs``)."""
        check_int("end", end, seq.length + 1)
        net = 0
        for window, table, dropped in zip(self.windows, seq.tables, seq.dropped, strict=True):
            for block in table[dropped:first_needed_block(seq.length, window, self.block_size)]:
                if block != NULL_BLOCK:
                    refs[block] = ref(block) - 1
                    net -= refs[block] == 0
            net += blocks_needed(end, self.block_size) - len(table)
            if seq.length % self.block_size and ref(table[-1]) > 1:
                refs[table[-1]] = ref(table[-1]) - 1
                net += 1
        return net

    # --- the prefix-hit rule --------------------------------------------------------

    def cache_hit(self, hashes: Sequence[BlockHash]) -> tuple[tuple[int, ...], ...]:
        """Each group's cached blocks for the longest prefix of ``hashes`` (a prompt's chain
        of full blocks, all but its last token) that every group serves (``hit_blocks``); a
        window group's blocks before what the next token reads are the null block. Empty
        tables: no hit."""
        if not self.caching or not hashes:
            return tuple(() for _ in self.windows)
        hashes = self._full_groups_prefix(check_block_hashes("hashes", hashes))
        found = [self._cached_blocks(hashes, g) for g in range(len(self.windows))]
        cached = [[b is not None for b in blocks_of] for blocks_of in found]
        blocks = hit_blocks(cached, self.windows, self.block_size,
                            len(hashes) * self.block_size + 1)
        start = blocks * self.block_size
        return tuple(
            (NULL_BLOCK,) * (first := first_needed_block(start, window, self.block_size))
            + tuple(blocks_of[first:blocks])
            for window, blocks_of in zip(self.windows, found, strict=True))

    def _full_groups_prefix(self, hashes: list[BlockHash]) -> list[BlockHash]:
        """The leading ``hashes`` every full-attention group holds: no hit reaches past a
        full group's first miss, so the window groups need not be asked about the rest (a
        request waiting for memory is asked about at every step it waits)."""
        pool = self.pool
        assert isinstance(pool, PrefixCachingBlockPool)
        bound = len(hashes)
        for group, window in enumerate(self.windows):
            if window is None:
                bound = next((i for i, h in enumerate(hashes[:bound])
                              if pool.cached_block(_group_hash(h, group)) is None), bound)
        return hashes[:bound]

    def _cached_blocks(self, hashes: Sequence[BlockHash], group: int) -> list[int | None]:
        """For each (checked) hash, a block group ``group`` holds under it, or None."""
        pool = self.pool
        assert isinstance(pool, PrefixCachingBlockPool)
        return [pool.cached_block(_group_hash(h, group)) for h in hashes]

    # --- operations -------------------------------------------------------------------

    def add_sequence(self, seq_id: str, num_tokens: int | None = None, *,
                     token_ids: Iterable[int] | None = None, cache_salt: str | None = None,
                     known: Sequence[BlockHash] = ()) -> int:
        """Start a sequence of ``num_tokens`` tokens or ``token_ids``, reusing its longest
        cached prefix (at most all but its last token); return the tokens reused."""
        self._check_new_id(seq_id)
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt must be a str or None, got {cache_salt!r}")
        length, ids = _count_and_ids(num_tokens, token_ids, default=0)
        hashes: list[BlockHash] = []
        if ids is not None and self.caching:
            hashes = _prompt_chain(ids, self.block_size, cache_salt, known)
        hit = self.cache_hit(hashes[: max(length - 1, 0) // self.block_size])  # empty: no hit
        self._require_free(self.claim_cost([(hit, length)]))
        self._touch(hit)
        size = blocks_needed(length, self.block_size)
        tables = [list(table) + [self.pool.allocate() for _ in range(size - len(table))]
                  for table in hit]
        hit_tokens = len(hit[0]) * self.block_size
        seq = _HybridSequence(tables, length, hit_tokens, ids, hashes, cache_salt)
        self._seqs[seq_id] = seq
        if ids is not None and self.caching:
            self._cache_full_blocks(seq, done=len(hit[0]))
            self._queries += 1
            self._query_tokens += length
            self._hit_tokens += hit_tokens
        return hit_tokens

    def append_tokens(self, seq_id: str, num_tokens: int | None = None, *,
                      token_ids: Iterable[int] | None = None) -> None:
        """Extend a sequence by ``num_tokens`` (default 1) or ``token_ids``: first each
        window group hands back the blocks the new chunk will not read, then each group
        copies a shared, partly filled last block and takes the blocks it needs."""
        seq, count, ids = self._get_extension(seq_id, num_tokens, token_ids)
        end = seq.length + count
        self._require_free(self.claim_cost([(seq_id, end)]))
        self._free_outside_window(seq)
        for table in seq.tables:
            if seq.length % self.block_size and self.pool.ref_count(table[-1]) > 1:
                table[-1] = self.pool.copy_on_write(table[-1])
            table.extend(self.pool.allocate()
                         for _ in range(blocks_needed(end, self.block_size) - len(table)))
        seq.start, seq.length = seq.length, end
        if seq.token_ids is not None and ids is not None:
            seq.token_ids.extend(ids)
            if self.caching:
                self._cache_full_blocks(seq, done=len(seq.hashes))

    def fork(self, parent: str, child: str) -> None:
        """Make ``child`` share every block ``parent`` holds, in every group."""
        seq = self._get(parent)
        self._check_new_id(child)
        for table in seq.tables:
            for block_id in table:
                if block_id != NULL_BLOCK:
                    self.pool.share(block_id)
        ids = None if seq.token_ids is None else list(seq.token_ids)
        self._seqs[child] = _HybridSequence([list(t) for t in seq.tables], seq.length,
                                            seq.start, ids, list(seq.hashes), seq.salt)

    def free_sequence(self, seq_id: str) -> None:
        """Drop a sequence (finished or preempted): each group's blocks as one batch, last
        block first (``BlockPool.free_batch``, as vLLM frees a request group by group)."""
        seq = self._get(seq_id)
        del self._seqs[seq_id]
        for table in seq.tables:
            self.pool._free_checked([b for b in reversed(table) if b != NULL_BLOCK])

    def stats(self) -> PrefixCacheStats:
        """Prefix-cache lookups so far (tokens asked for, tokens found)."""
        evictions = self.pool.num_evictions if isinstance(self.pool,
                                                          PrefixCachingBlockPool) else 0
        return PrefixCacheStats(self._queries, self._query_tokens, self._hit_tokens, evictions)

    def snapshot(self, label: str = "") -> PoolSnapshot:
        """The pool now, each block owned by ``table_name(sequence, group, window)``, so a
        drawing colours each group of each sequence apart; tables are listed under the same
        names (``request_of`` gives a name's sequence back)."""
        tables = {table_name(seq_id, group, self.windows[group]): (table, seq.length)
                  for seq_id, seq in self._seqs.items() for group, table in enumerate(seq.tables)}
        return _pool_snapshot(self.pool, tables, self._hash_hex, label, free_cached_tokens=0)

    # --- helpers ----------------------------------------------------------------------

    def _touch(self, hit: Sequence[Sequence[int]]) -> None:
        """Take a reference on every cached block of a hit (reviving free ones)."""
        assert all(len(t) == len(hit[0]) for t in hit)
        held = [b for table in hit for b in table if b != NULL_BLOCK]
        if held:
            assert isinstance(self.pool, PrefixCachingBlockPool)
            self.pool.touch(held)

    def _free_outside_window(self, seq: _HybridSequence) -> None:
        """Hand back each window group's blocks before the one the next chunk first reads,
        as one batch per group, last block first (vLLM's ``remove_skipped_blocks``): cached
        blocks join the back of the free queue in that order, so the later block of the
        prompt is evicted first."""
        for group, (window, table) in enumerate(zip(self.windows, seq.tables, strict=True)):
            first = first_needed_block(seq.length, window, self.block_size)
            removed = []
            for index in reversed(range(seq.dropped[group], first)):
                if table[index] != NULL_BLOCK:
                    removed.append(table[index])
                    table[index] = NULL_BLOCK
            self.pool._free_checked(removed)
            seq.dropped[group] = max(seq.dropped[group], first)

    def _cache_full_blocks(self, seq: _HybridSequence, done: int) -> None:
        """Hash the blocks that filled since block ``done`` and cache them in every group
        that still holds them."""
        assert seq.token_ids is not None and isinstance(self.pool, PrefixCachingBlockPool)
        extend_chain(seq.hashes, seq.token_ids, self.block_size, seq.salt)
        for index in range(done, len(seq.hashes)):
            for group, table in enumerate(seq.tables):
                if table[index] != NULL_BLOCK:
                    self.pool.cache_block(table[index], group_hash(seq.hashes[index], group))

    def _hash_hex(self, block_id: int) -> str | None:
        if not isinstance(self.pool, PrefixCachingBlockPool):
            return None
        block_hash = self.pool.block_hash(block_id)
        return None if block_hash is None else block_hash.hex()
