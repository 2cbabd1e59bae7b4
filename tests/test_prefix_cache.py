"""Prefix caching: the block-hash chain, lookups, touch, eviction order, salts, statistics."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.paged import BlockPool, OutOfBlocks
from course_lib.prefix_cache import (
    ROOT_HASH,
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
    block_hashes,
    hash_block_tokens,
)
from course_lib.rollback import UndoLog, undoable
from course_lib.tier import CpuTier, TieredBlockPool
from tests.frozen_state import freeze


def _manager(num_blocks: int = 8, block_size: int = 4) -> PrefixCachingKVManager:
    return PrefixCachingKVManager(PrefixCachingBlockPool(num_blocks, block_size))


# --- hashing ----------------------------------------------------------------------------


def test_block_hash_is_sha256_of_the_documented_encoding() -> None:
    payload = ROOT_HASH + struct.pack("<5Q", 4, 1, 2, 3, 4) + struct.pack("<Q", 0)
    assert hash_block_tokens(None, [1, 2, 3, 4]) == hashlib.sha256(payload).digest()
    assert hash_block_tokens(None, [1, 2, 3, 4]).hex() == (
        "0ab81f0d6b8b5fbe3364aca49adff58969bc196506a4e48ffdffeeeb5a077138"
    )
    salted = ROOT_HASH + struct.pack("<3Q", 2, 7, 8) + struct.pack("<2Q", 1, 1) + b"a"
    assert hash_block_tokens(None, [7, 8], ["a"]) == hashlib.sha256(salted).digest()


def test_the_encoding_is_unambiguous() -> None:
    assert hash_block_tokens(None, [1, 2]) != hash_block_tokens(None, [1])
    assert hash_block_tokens(None, [1], ["ab"]) != hash_block_tokens(None, [1], ["a", "b"])
    assert hash_block_tokens(None, [1]) != hash_block_tokens(None, [1], [""])
    assert hash_block_tokens(None, [1]) != hash_block_tokens(hash_block_tokens(None, []), [1])


def test_only_full_blocks_get_hashes_and_each_hash_names_its_whole_prefix() -> None:
    tokens = list(range(10))
    hashes = block_hashes(tokens, 4)
    assert len(hashes) == 2
    assert hashes[1] == hash_block_tokens(hashes[0], [4, 5, 6, 7])
    changed_first = block_hashes([99, *tokens[1:]], 4)
    assert changed_first[0] != hashes[0] and changed_first[1] != hashes[1]
    assert block_hashes(tokens, 4, known=hashes[:1]) == hashes


def test_the_cache_salt_enters_the_first_block_and_the_chain_carries_it() -> None:
    plain = block_hashes(list(range(8)), 4)
    salted = block_hashes(list(range(8)), 4, cache_salt="tenant-a")
    assert salted[0] == hash_block_tokens(None, [0, 1, 2, 3], ["tenant-a"])
    assert salted[1] == hash_block_tokens(salted[0], [4, 5, 6, 7])
    assert not set(plain) & set(salted)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: hash_block_tokens(b"short", [1]), "parent must be a 32-byte block hash"),
        (lambda: hash_block_tokens(None, [1, -3]), r"token ids must be integers in \[0, 2\*\*64\)"),
        (lambda: hash_block_tokens(None, [2**64]), "token ids must be integers"),
        (lambda: hash_block_tokens(None, [1], [5]), "extra keys must be strings, got 5"),
        (lambda: block_hashes([1, 2], 0), "block_size must be an integer >= 1, got 0"),
    ],
)
def test_bad_hash_arguments(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# --- a golden trace, computed by hand ---------------------------------------------------


def test_golden_trace_of_hits_touch_and_eviction_order() -> None:
    manager = _manager()  # blocks of 4; ids 1..7
    pool = manager.pool
    a = list(range(10))  # two full blocks and a tail of two tokens

    assert manager.add_sequence("A", token_ids=a) == 0
    assert manager.block_table("A") == (1, 2, 3) and pool.num_cached == 2
    manager.free_sequence("A")  # tail first: uncached 3 to the front, then 2, 1 to the back
    assert pool.free_blocks() == (3, 4, 5, 6, 7, 2, 1)
    assert pool.num_free == 7  # cached free blocks still count as free

    assert manager.add_sequence("B", token_ids=[*a[:8], 99, 98]) == 8  # touch revives 1, 2
    assert manager.block_table("B") == (1, 2, 3)  # A's stale tail block is reused first
    assert pool.free_blocks() == (4, 5, 6, 7)
    manager.free_sequence("B")
    assert pool.free_blocks() == (3, 4, 5, 6, 7, 2, 1)

    assert manager.add_sequence("C", token_ids=list(range(50, 66))) == 0
    assert manager.block_table("C") == (3, 4, 5, 6) and pool.num_evictions == 0
    assert manager.add_sequence("D", token_ids=[70, 71, 72, 73, 74]) == 0
    assert manager.block_table("D") == (7, 2)  # 2 was least recently freed: evicted
    assert pool.block_hash(7) == block_hashes([70, 71, 72, 73], 4)[0]
    assert pool.num_evictions == 1 and pool.block_hash(2) is None
    assert pool.block_hash(1) is not None and pool.free_blocks() == (1,)

    before = (pool.free_blocks(), manager.stats(), pool.num_cached)
    with pytest.raises(OutOfBlocks, match="needed 3, only 1 free"):
        manager.add_sequence("E", token_ids=a)  # hit block 1 (revived) + 2 fresh > 1 free
    assert (pool.free_blocks(), manager.stats(), pool.num_cached) == before
    assert "E" not in manager.sequences

    manager.free_sequence("D")
    assert pool.free_blocks() == (2, 1, 7)  # D's uncached tail in front, its cached head behind
    assert manager.add_sequence("E", token_ids=a) == 4  # only the first block survived
    assert manager.block_table("E") == (1, 2, 7)  # reusing 7 evicted D's first block
    assert pool.block_hash(2) == block_hashes(a, 4)[1]  # recomputed and cached again
    assert pool.num_evictions == 2

    stats = manager.stats()
    assert (stats.queries, stats.query_tokens, stats.hit_tokens, stats.evictions) == (
        5, 51, 12, 2
    )
    assert stats.hit_rate == pytest.approx(12 / 51)
    assert stats.tokens_not_recomputed == 12


def test_golden_trace_of_shared_counts_copy_on_write_salts_and_eviction() -> None:
    manager = _manager(num_blocks=10)  # blocks of 4; ids 1..9
    pool = manager.pool
    t = list(range(10))

    def refs() -> dict[int, int]:
        return {b: pool.ref_count(b) for b in range(1, 10) if pool.ref_count(b)}

    assert manager.add_sequence("a", token_ids=t) == 0  # 1, 2 cached; 3 holds the tail
    assert manager.add_sequence("b", token_ids=[*t[:8], 50, 51, 52]) == 8
    assert manager.block_table("b") == (1, 2, 4)
    assert refs() == {1: 2, 2: 2, 3: 1, 4: 1}
    manager.fork("b", "c")
    assert refs() == {1: 3, 2: 3, 3: 1, 4: 2}
    manager.append_tokens("c", token_ids=[53])  # copy-on-write of 4 into 5, which fills up
    assert manager.block_table("c") == (1, 2, 5) and manager.block_table("b") == (1, 2, 4)
    assert refs() == {1: 3, 2: 3, 3: 1, 4: 1, 5: 1}
    assert pool.block_hash(5) == block_hashes([*t[:8], 50, 51, 52, 53], 4)[2]
    assert manager.add_sequence("d", token_ids=t, cache_salt="t") == 0  # salt: no hit
    assert manager.block_table("d") == (6, 7, 8) and pool.free_blocks() == (9,)

    manager.free_sequence("a")
    assert pool.free_blocks() == (3, 9) and refs()[1] == refs()[2] == 2
    manager.free_sequence("b")
    assert pool.free_blocks() == (4, 3, 9)  # partly filled tails go to the front
    manager.free_sequence("c")
    manager.free_sequence("d")
    assert pool.free_blocks() == (8, 4, 3, 9, 5, 2, 1, 7, 6)
    assert refs() == {} and pool.num_cached == 5  # 1, 2, 5 and the salted 6, 7

    assert manager.add_sequence("e", token_ids=[*t[:8], 50, 51, 52, 53, 60]) == 12
    assert manager.block_table("e") == (1, 2, 5, 8) and pool.num_evictions == 0
    assert manager.add_sequence("f", token_ids=list(range(100, 116))) == 0
    assert manager.block_table("f") == (4, 3, 9, 7)  # 7 (salted, freed before 6) is evicted
    assert pool.num_evictions == 1 and pool.free_blocks() == (6,)

    before = (pool.free_blocks(), refs(), manager.stats())
    with pytest.raises(OutOfBlocks, match="needed 3, only 1 free"):
        manager.add_sequence("g", token_ids=t, cache_salt="t")  # revive 6 + 2 fresh
    assert (pool.free_blocks(), refs(), manager.stats()) == before

    manager.free_sequence("e")
    assert pool.free_blocks() == (8, 6, 5, 2, 1)
    assert manager.add_sequence("g", token_ids=t, cache_salt="t") == 4
    assert manager.block_table("g") == (6, 8, 5)  # reusing 5 evicts e's third block
    assert pool.num_evictions == 2 and pool.free_blocks() == (2, 1)
    assert pool.block_hash(8) == block_hashes(t, 4, cache_salt="t")[1]
    assert refs() == {3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1}

    stats = manager.stats()
    assert (stats.queries, stats.query_tokens, stats.hit_tokens, stats.evictions) == (
        6, 70, 24, 2
    )


# --- behaviour --------------------------------------------------------------------------


def test_live_blocks_are_shared_by_reference_count() -> None:
    manager = _manager(num_blocks=16)
    prompt = list(range(9))
    manager.add_sequence("a", token_ids=prompt)
    assert manager.add_sequence("b", token_ids=prompt) == 8
    assert manager.block_table("a")[:2] == manager.block_table("b")[:2] == (1, 2)
    assert manager.block_table("a")[2] != manager.block_table("b")[2]
    assert [manager.pool.ref_count(b) for b in (1, 2)] == [2, 2]


def test_the_cache_salt_keeps_tenants_apart() -> None:
    manager = _manager(num_blocks=32)
    prompt = list(range(9))
    assert manager.add_sequence("a1", token_ids=prompt, cache_salt="tenant-a") == 0
    assert manager.add_sequence("b1", token_ids=prompt, cache_salt="tenant-b") == 0
    assert manager.add_sequence("none", token_ids=prompt) == 0
    assert manager.add_sequence("a2", token_ids=prompt, cache_salt="tenant-a") == 8
    assert manager.block_table("a2")[:2] == manager.block_table("a1")[:2]


def test_at_least_one_prompt_token_is_computed() -> None:
    manager = _manager(num_blocks=16)
    prompt = list(range(8))  # exactly two full blocks
    manager.add_sequence("a", token_ids=prompt)
    assert manager.add_sequence("b", token_ids=prompt) == 4
    assert manager.block_table("b") == (1, 3)
    assert manager.pool.num_cached == 3  # block 3 holds block 2's hash too
    assert manager.pool.longest_cached_prefix(block_hashes(prompt, 4)) == [1, 2]


def test_fork_continues_the_hash_chain_and_copy_on_write_blocks_get_cached() -> None:
    manager = _manager(num_blocks=16)
    manager.add_sequence("a", token_ids=[1, 2, 3, 4, 5, 6])
    manager.fork("a", "b")
    manager.append_tokens("b", token_ids=[7, 8])  # copies block 2, fills it
    assert manager.block_table("b") == (1, 3)
    assert manager.add_sequence("c", token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8
    assert manager.block_table("c")[:2] == (1, 3)


def test_appended_tokens_are_cached_when_their_block_fills() -> None:
    manager = _manager(num_blocks=16)
    manager.add_sequence("a", token_ids=[1, 2])
    manager.append_tokens("a", token_ids=[3, 4, 5])
    assert manager.pool.num_cached == 1
    manager.free_sequence("a")
    assert manager.add_sequence("b", token_ids=[1, 2, 3, 4, 0]) == 4


def test_sequences_without_token_ids_are_never_cached() -> None:
    manager = _manager()
    assert manager.add_sequence("a", 9) == 0
    manager.append_tokens("a", 3)
    assert manager.pool.num_cached == 0
    assert manager.stats().hit_rate == 0.0


def test_snapshot_shows_hashes_hits_and_evictions() -> None:
    manager = _manager(num_blocks=4)
    manager.add_sequence("a", token_ids=list(range(5)))
    manager.free_sequence("a")
    manager.snapshot()
    manager.add_sequence("b", token_ids=[0, 1, 2, 3, 9])
    view = manager.snapshot().blocks
    assert view[1].event == "cache-hit" and view[1].cached_hash == manager.pool.block_hash(1).hex()
    assert view[2].cached_hash is None
    manager.free_sequence("b")
    free_view = manager.snapshot().blocks[1]
    assert (free_view.ref_count, free_view.tokens, free_view.owners) == (0, 4, ())
    assert free_view.cached_hash is not None
    manager.add_sequence("c", 12)
    events = [b.event for b in manager.snapshot().blocks]
    assert events == [None, "evicted", "allocated", "allocated"]


def test_the_caching_pool_keeps_the_minimal_pool_surface() -> None:
    pool = PrefixCachingBlockPool(8, 16)
    ids = [pool.allocate() for _ in range(7)]
    assert ids == [1, 2, 3, 4, 5, 6, 7] and pool.num_free == 0
    for block_id in ids:
        pool.free(block_id)
    assert (pool.num_free, pool.block_size, pool.num_blocks) == (7, 16, 8)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.pool.touch([2]), "block 2 is not a cached block"),
        (lambda m: m.pool.touch([1, 1]), r"block ids \[1, 1\] name a block more than once"),
        (lambda m: m.pool.touch(["1"]), "block id must be an int, got '1'"),
        (lambda m: m.pool.cache_block(2, ["x"]), r"block_hash must be a 32-byte .* \['x'\]"),
        (lambda m: m.pool.cache_block(2, "x" * 32), "block_hash must be a 32-byte block hash"),
        (lambda m: m.pool.longest_cached_prefix([b"x"]), "hash must be a 32-byte block hash"),
        (lambda m: m.pool.cache_block(5, b"x" * 32), "block 5 is free"),
        (lambda m: m.pool.cache_block(1, b"x" * 32), "block 1 already holds a different hash"),
        (lambda m: m.add_sequence("b", token_ids=[1], cache_salt=3), "cache_salt must be a str"),
        (lambda m: m.add_sequence("b", 3, cache_salt="t"), "cache_salt='t' needs token_ids"),
        (lambda m: PrefixCachingKVManager(BlockPool(4, 4)), "needs a PrefixCachingBlockPool"),
    ],
)
def test_bad_caching_calls(call, message: str) -> None:
    manager = _manager()
    manager.add_sequence("a", token_ids=[1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match=message):
        call(manager)


def test_a_refused_touch_or_cache_block_changes_nothing() -> None:
    manager = _manager()
    manager.add_sequence("a", token_ids=[1, 2, 3, 4, 5])
    manager.free_sequence("a")
    pool = manager.pool
    held = pool.allocate()
    state = (pool.free_blocks(), [pool.ref_count(b) for b in range(8)],
             [pool.block_hash(b) for b in range(8)])
    with pytest.raises(ValueError, match="block id 999 is not in this pool"):
        pool.touch([1, 999])
    with pytest.raises(ValueError, match="block_hash must be a 32-byte block hash"):
        pool.cache_block(held, ["x"])  # type: ignore[arg-type]
    assert (pool.free_blocks(), [pool.ref_count(b) for b in range(8)],
            [pool.block_hash(b) for b in range(8)]) == state
    pool.free(held)
    assert sorted(pool.allocate() for _ in range(7)) == list(range(1, 8))  # no crash
    assert pool.num_evictions == 1 and pool.num_cached == 0

@pytest.mark.parametrize(("order", "hit", "table_c", "evictions"),
                         [("vllm", 8, (4, 5), 0), ("fifo", 4, (3, 2), 1)])
def test_a_stale_tail_block_costs_a_hit_only_under_the_old_fifo_order(
    order: str, hit: int, table_c: tuple[int, ...], evictions: int
) -> None:
    manager = PrefixCachingKVManager(PrefixCachingBlockPool(6, 4, free_order=order))  # type: ignore[arg-type]
    a = list(range(10))  # two cached blocks and a partly filled tail
    manager.add_sequence("A", token_ids=a)
    manager.free_sequence("A")
    manager.add_sequence("B", token_ids=[50, 51, 52, 53, 54])
    manager.free_sequence("B")
    manager.add_sequence("C", token_ids=[60, 61, 62, 63, 64, 65])
    assert manager.block_table("C") == table_c and manager.pool.num_evictions == evictions
    assert manager.add_sequence("A again", token_ids=a) == hit


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["allocate", "free", "touch"]), st.integers(0, 99),
                          st.booleans()), max_size=80))
def test_the_free_queue_matches_a_plain_list_model(ops: list[tuple[str, int, bool]]) -> None:
    """Uncached frees to the front, cached ones to the back, hits leave, evictions forget."""
    pool = PrefixCachingBlockPool(7, 4)
    queue, holders, hashes = list(range(1, 7)), [0] * 7, {}  # the model, front first
    for step, (kind, pick, cache) in enumerate(ops):
        held = [b for b in range(1, 7) if holders[b]]
        if kind == "allocate" and queue:
            block = queue.pop(0)
            hashes.pop(block, None)
            holders[block] = 1
            assert pool.allocate() == block
        elif kind == "free" and held:
            block = held[pick % len(held)]
            if cache and block not in hashes:
                hashes[block] = hashlib.sha256(f"{block}@{step}".encode()).digest()
                pool.cache_block(block, hashes[block])
            holders[block] -= 1
            if not holders[block]:
                queue.insert(len(queue) if block in hashes else 0, block)
            pool.free(block)
        elif kind == "touch" and hashes:
            block = sorted(hashes)[pick % len(hashes)]
            if not holders[block]:
                queue.remove(block)
            holders[block] += 1
            pool.touch([block])
        assert pool.free_blocks() == tuple(queue)
        assert [pool.block_hash(b) for b in range(1, 7)] == [hashes.get(b) for b in range(1, 7)]


def test_cached_block_names_the_oldest_holder_of_a_hash_or_none() -> None:
    pool = PrefixCachingBlockPool(6, 4)
    first, second = pool.allocate(), pool.allocate()
    digest = hash_block_tokens(None, [1, 2, 3, 4])
    assert pool.cached_block(digest) is None
    pool.cache_block(second, digest)
    pool.cache_block(first, digest)  # two requests computed the same block
    assert pool.cached_block(digest) == second == pool.longest_cached_prefix([digest])[0]
    with pytest.raises(ValueError, match="block_hash must be a 32-byte block hash"):
        pool.cached_block(b"short")


# --- batch calls ------------------------------------------------------------------------


POOL_KINDS = ["plain", "caching", "tiered", "undoable, logging"]


def _pool_of(kind: str) -> BlockPool:
    if kind == "plain":
        return BlockPool(7, 2)
    if kind == "tiered":
        return TieredBlockPool(7, 2, tier=CpuTier(3 * 8), block_bytes=8)
    pool = (undoable(PrefixCachingBlockPool) if kind.startswith("undoable")
            else PrefixCachingBlockPool)(7, 2)
    if kind.endswith("logging"):
        pool.attach(UndoLog())
    return pool


def _pool_state(pool: BlockPool) -> object:
    state = {name: value for name, value in vars(pool).items() if name != "undo_log"}
    if isinstance(pool, TieredBlockPool):
        state["tier"] = pool.tier.hashes()
    return freeze(state)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(kind=st.sampled_from(POOL_KINDS),
       ops=st.lists(st.tuples(st.sampled_from(["allocate", "free", "cache"]),
                              st.integers(-1, 7), st.integers(0, 3)), max_size=30))
def test_batch_calls_equal_their_single_calls(kind: str, ops: list[tuple[str, int, int]]) -> None:
    """``allocate_many`` and ``cache_blocks`` leave a pool exactly as the same single calls
    would (ids, queue order, evictions, events, holders' order, the tier), refuse what the
    single calls would, and a refused batch changes nothing."""
    batch, single = _pool_of(kind), _pool_of(kind)
    for step, (op, count, pick) in enumerate(ops):
        held = [b for b in range(1, 7) if batch.ref_count(b)]
        before = _pool_state(batch)
        if op == "allocate":
            if not 0 <= count <= batch.num_free:
                with pytest.raises((OutOfBlocks, ValueError)):
                    batch.allocate_many(count)
                assert _pool_state(batch) == before
                continue
            assert batch.allocate_many(count) == [single.allocate() for _ in range(count)]
        elif op == "free" and held:
            blocks = held[pick % len(held):]
            batch.free_batch(blocks)
            single.free_batch(blocks)
        elif op == "cache" and held and isinstance(batch, PrefixCachingBlockPool):
            blocks = held[pick % len(held):]
            digests = [hashlib.sha256(f"{b}@{step // 3}".encode()).digest() for b in blocks]
            if any(batch.block_hash(b) not in (None, d) for b, d in zip(blocks, digests,
                                                                       strict=True)):
                with pytest.raises(ValueError, match="already holds a different hash"):
                    batch.cache_blocks(blocks, digests)
                assert _pool_state(batch) == before
                continue
            batch.cache_blocks(blocks, digests)
            for block, digest in zip(blocks, digests, strict=True):
                single.cache_block(block, digest)
        assert _pool_state(batch) == _pool_state(single)


@pytest.mark.parametrize(("call", "message"), [
    (lambda pool: pool.allocate_many(-1), "count must be an integer >= 0, got -1"),
    (lambda pool: pool.allocate_many(True), "count must be an integer"),
    (lambda pool: pool.cache_blocks([1], []), "1 block ids but 0 hashes"),
    (lambda pool: pool.cache_blocks([1, 3], [bytes(32)] * 2), "block 3 is free"),
    (lambda pool: pool.cache_blocks([1], [b"short"]), "32-byte block hash"),
    (lambda pool: pool.cache_blocks([1, 2, 1], [bytes(32), bytes(32), b"\1" * 32]),
     "block 1 already holds a different hash"),
])
def test_bad_batch_calls(call, message: str) -> None:
    pool = PrefixCachingBlockPool(6, 2)
    pool.allocate_many(2)
    before = freeze(vars(pool))
    with pytest.raises(ValueError, match=message):
        call(pool)
    assert freeze(vars(pool)) == before


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**64 - 1), max_size=40), size=st.integers(1, 6),
       salt=st.none() | st.text(max_size=3), known=st.integers(0, 8))
def test_a_chain_grown_from_any_known_prefix_hashes_block_by_block(
        tokens: list[int], size: int, salt: str | None, known: int) -> None:
    """``block_hashes``/``extend_chain`` (one fast loop) equal ``hash_block_tokens`` applied
    block by block, the salt entering the first block only."""
    expected: list[bytes] = []
    for index in range(len(tokens) // size):
        keys = [salt] if index == 0 and salt is not None else []
        expected.append(hash_block_tokens(expected[-1] if expected else None,
                                          tokens[index * size:(index + 1) * size], keys))
    assert block_hashes(tokens, size, cache_salt=salt) == expected
    assert block_hashes(tokens, size, cache_salt=salt, known=expected[:known]) == expected


def _cached_blocks(pool: PrefixCachingBlockPool) -> set[int]:
    return {b for b in range(1, pool.num_blocks) if pool.block_hash(b) is not None}


def _pool_state_unordered(pool: PrefixCachingBlockPool) -> object:
    """A pool frozen, its two hash maps compared by content: deferred hashing records the
    same pairs in another order, which nothing reads (lookups go by key, and each hash's
    holders keep their order)."""
    return freeze({**vars(pool), "_hash_of": sorted(pool._hash_of.items()),
                   "_blocks_of": sorted(pool._blocks_of.items())})


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["add", "append", "fork", "free", "sync"]),
                          st.integers(0, 1), st.integers(1, 5)), min_size=8, max_size=40))
def test_deferred_hashing_ends_where_eager_hashing_does(ops: list[tuple[str, int, int]]) -> None:
    """Appends with ``cache=False`` hash nothing until ``cache_full_blocks`` or a free of
    that sequence (or of a fork sharing the blocks). When no other live sequence can
    compute the same blocks (a salt per sequence, as the lazy serving core requires), every
    step leaves the free queue and the hashes its blocks carry as eager hashing does (what
    a later allocation or lookup sees), a re-added sequence finds its blocks, appended ones
    included, and once every sequence is synced, the pool and the manager are as eager
    hashing leaves them."""
    eager, lazy = _manager(12, 2), _manager(12, 2)
    for step, (op, seq, count) in enumerate(ops):
        name, other = f"s{seq}", f"s{1 - seq}"
        try:
            if op == "add" and not eager.holds(name):
                hits = [manager.add_sequence(name, token_ids=[seq] * count, cache_salt=name)
                        for manager in (eager, lazy)]  # the same prompt each time: it hits
                assert hits[0] == hits[1]
            elif op == "append" and eager.holds(name):
                tokens = [step * 10 + k for k in range(count)]  # no two appends alike
                eager.append_tokens(name, token_ids=tokens)
                cached = _cached_blocks(lazy.pool)
                lazy.append_tokens(name, token_ids=tokens, cache=False)
                assert _cached_blocks(lazy.pool) <= cached  # none new (some evicted)
            elif op == "fork" and eager.holds(name) and not eager.holds(other):
                eager.fork(name, other)
                lazy.fork(name, other)
            elif op == "free" and eager.holds(name):
                eager.free_sequence(name)
                lazy.free_sequence(name)
            elif op == "sync" and eager.holds(name):
                lazy.cache_full_blocks(name)
        except OutOfBlocks:
            pass
        assert lazy.pool.free_blocks() == eager.pool.free_blocks()
        assert [lazy.pool.block_hash(b) for b in lazy.pool.free_blocks()] == \
            [eager.pool.block_hash(b) for b in eager.pool.free_blocks()]
    for live in lazy.sequences:
        lazy.cache_full_blocks(live)
    assert _pool_state_unordered(lazy.pool) == _pool_state_unordered(eager.pool)
    assert freeze({**vars(lazy), "pool": None}) == freeze({**vars(eager), "pool": None})


def test_deferred_hashing_refusals() -> None:
    manager = _manager()
    manager.add_sequence("a", token_ids=[1, 2, 3])
    before = freeze((vars(manager.pool), vars(manager)))
    with pytest.raises(ValueError, match="cache must be True or False, got 'no'"):
        manager.append_tokens("a", token_ids=[4, 5], cache="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown sequence 'b'"):
        manager.cache_full_blocks("b")
    assert freeze((vars(manager.pool), vars(manager))) == before
