"""The paged pool and block tables: ids, reference counts, fork, copy-on-write, K/V tensors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course_lib.kv_math import blocks_needed, paged_utilization
from course_lib.paged import NULL_BLOCK, BlockPool, OutOfBlocks, PagedKVManager
from course_lib.prefix_cache import PrefixCachingBlockPool, PrefixCachingKVManager, block_hashes

# --- the pool ---------------------------------------------------------------------------


def test_pool_of_8_has_7_free_and_hands_out_ids_in_order() -> None:
    pool = BlockPool(8, 16)
    assert (pool.num_blocks, pool.block_size, pool.num_free, pool.num_used) == (8, 16, 7, 0)
    assert [pool.allocate() for _ in range(7)] == [1, 2, 3, 4, 5, 6, 7]
    assert (pool.num_free, pool.num_used) == (0, 7)


def test_out_of_blocks_is_a_typed_runtime_error() -> None:
    pool = BlockPool(2, 16)
    pool.allocate()
    with pytest.raises(OutOfBlocks, match="needed 1, only 0 free") as caught:
        pool.allocate()
    assert isinstance(caught.value, RuntimeError)
    assert (caught.value.needed, caught.value.free) == (1, 0)


def test_freed_blocks_without_a_hash_go_to_the_front_of_the_queue() -> None:
    pool = BlockPool(6, 4)  # vLLM since PR 42656: nothing cached, so reuse it first
    first, second, _ = pool.allocate(), pool.allocate(), pool.allocate()
    pool.free(second)
    pool.free(first)
    assert pool.free_blocks() == (1, 2, 4, 5)
    assert [pool.allocate() for _ in range(4)] == [1, 2, 4, 5]


def test_the_fifo_order_sends_every_freed_block_to_the_back() -> None:
    pool = BlockPool(6, 4, free_order="fifo")  # vLLM before PR 42656
    first, second, _ = pool.allocate(), pool.allocate(), pool.allocate()
    pool.free(second)
    pool.free(first)
    assert pool.free_blocks() == (4, 5, 2, 1)
    assert [pool.allocate() for _ in range(4)] == [4, 5, 2, 1]


def test_an_unknown_free_order_is_refused() -> None:
    with pytest.raises(ValueError, match=r"free_order must be one of .* got 'lru'"):
        BlockPool(6, 4, free_order="lru")  # type: ignore[arg-type]


def test_a_block_returns_to_the_queue_only_when_its_count_reaches_zero() -> None:
    pool = BlockPool(4, 4)
    block = pool.allocate()
    pool.share(block)
    assert pool.ref_count(block) == 2
    pool.free(block)
    assert (pool.ref_count(block), pool.num_free) == (1, 2)
    pool.free(block)
    assert (pool.ref_count(block), pool.num_free) == (0, 3)


@pytest.mark.parametrize(
    ("block_id", "message"),
    [
        (1, "block 1 is free"),
        (0, "block 0 is the reserved null block"),
        (8, "block id 8 is not in this pool"),
        (-1, "block id -1 is not in this pool"),
        ("1", "block id must be an int, got '1'"),
        (True, "block id must be an int, got True"),
    ],
)
def test_bad_frees_are_rejected_naming_the_id(block_id: object, message: str) -> None:
    pool = BlockPool(8, 16)
    with pytest.raises(ValueError, match=message):
        pool.free(block_id)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        pool.share(block_id)  # type: ignore[arg-type]


def test_double_free_is_rejected_and_changes_nothing() -> None:
    pool = BlockPool(8, 16)
    block = pool.allocate()
    pool.free(block)
    before = pool.free_blocks()
    with pytest.raises(ValueError, match=f"block {block} is free"):
        pool.free(block)
    assert pool.free_blocks() == before


def test_ref_count_of_null_and_foreign_ids() -> None:
    pool = BlockPool(8, 16)
    assert pool.ref_count(NULL_BLOCK) == 0
    with pytest.raises(ValueError, match="block id 9"):
        pool.ref_count(9)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1, 16), {}, "num_blocks must be an integer >= 2, got 1"),
        ((8, 0), {}, "block_size must be an integer >= 1, got 0"),
        ((8, "16"), {}, "block_size must be an integer >= 1, got '16'"),
        ((8, 16), {"num_kv_heads": 2}, "give both num_kv_heads and head_dim"),
        ((8, 16), {"num_kv_heads": 0, "head_dim": 4}, "num_kv_heads must be"),
        ((8, 16), {"num_kv_heads": 1, "head_dim": 4, "num_layers": 0}, "num_layers must be"),
    ],
)
def test_bad_pool_arguments(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BlockPool(*args, **kwargs)


def test_copy_on_write_needs_a_shared_block() -> None:
    pool = BlockPool(4, 4)
    block = pool.allocate()
    with pytest.raises(ValueError, match=f"block {block} is not shared"):
        pool.copy_on_write(block)


# --- arithmetic -------------------------------------------------------------------------


def test_a_900_token_chat_holds_57_blocks_with_4_slots_in_the_last() -> None:
    assert blocks_needed(900, 16) == 57
    manager = PagedKVManager(BlockPool(100, 16))
    manager.add_sequence("chat", 900)
    assert len(manager.block_table("chat")) == 57
    assert manager.seq_len("chat") - 56 * 16 == 4
    assert manager.utilization() == pytest.approx(900 / 912)


@pytest.mark.parametrize(
    ("tokens", "block_size", "expected"),
    [(900, 16, 900 / 912), (512, 16, 1.0), (1, 16, 1 / 16), (17, 16, 17 / 32)],
)
def test_paged_utilization(tokens: int, block_size: int, expected: float) -> None:
    assert paged_utilization(tokens, block_size) == pytest.approx(expected)


def test_waste_per_sequence_is_at_most_block_size_minus_one() -> None:
    for tokens in range(1, 200):
        assert 0 <= blocks_needed(tokens, 16) * 16 - tokens <= 15


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: blocks_needed(-1, 16), "num_tokens must be an integer >= 0, got -1"),
        (lambda: blocks_needed(10, 0), "block_size must be an integer >= 1, got 0"),
        (lambda: paged_utilization(0, 16), "num_tokens must be an integer >= 1, got 0"),
    ],
)
def test_bad_arithmetic_arguments(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# --- block tables -----------------------------------------------------------------------


def test_append_allocates_only_when_the_last_block_is_full() -> None:
    manager = PagedKVManager(BlockPool(8, 16))
    manager.add_sequence("a", 15)
    manager.append_tokens("a")
    assert manager.block_table("a") == (1,)
    manager.append_tokens("a")
    assert manager.block_table("a") == (1, 2)
    manager.append_tokens("a", 16)
    assert (manager.block_table("a"), manager.seq_len("a")) == ((1, 2, 3), 33)


def test_empty_sequence_holds_no_block() -> None:
    manager = PagedKVManager(BlockPool(8, 16))
    manager.add_sequence("a")
    assert (manager.block_table("a"), manager.seq_len("a"), manager.utilization()) == ((), 0, 0.0)


def _state(manager: PagedKVManager) -> tuple:
    pool = manager.pool
    return (
        pool.free_blocks(),
        [pool.ref_count(b) for b in range(pool.num_blocks)],
        {s: (manager.block_table(s), manager.seq_len(s)) for s in manager.sequences},
    )


def test_out_of_blocks_changes_nothing() -> None:
    manager = PagedKVManager(BlockPool(4, 4))
    manager.add_sequence("a", 6)
    before = _state(manager)
    with pytest.raises(OutOfBlocks, match="needed 2, only 1 free"):
        manager.append_tokens("a", 7)
    with pytest.raises(OutOfBlocks, match="needed 3, only 1 free"):
        manager.add_sequence("b", 9)
    assert _state(manager) == before
    assert manager.sequences == ("a",)


def test_copy_on_write_needs_a_free_block_too() -> None:
    manager = PagedKVManager(BlockPool(3, 4))
    manager.add_sequence("a", 6)
    manager.fork("a", "b")
    before = _state(manager)
    with pytest.raises(OutOfBlocks, match="needed 1, only 0 free"):
        manager.append_tokens("b")
    assert _state(manager) == before


def test_fork_shares_and_copy_on_write_copies_the_partly_filled_last_block() -> None:
    manager = PagedKVManager(BlockPool(8, 4))
    manager.add_sequence("parent", 6)
    manager.fork("parent", "child")
    assert manager.block_table("child") == (1, 2)
    assert [manager.pool.ref_count(b) for b in (1, 2)] == [2, 2]
    manager.append_tokens("child")
    assert manager.block_table("child") == (1, 3)
    assert manager.block_table("parent") == (1, 2)
    assert [manager.pool.ref_count(b) for b in (1, 2, 3)] == [2, 1, 1]
    manager.append_tokens("parent")  # the last sharer writes in place
    assert manager.block_table("parent") == (1, 2)
    assert manager.pool.num_used == 3


def test_golden_trace_of_three_samples_two_copies_and_the_free_order() -> None:
    """The lecture's trace, computed by hand: block ids, counts and the free queue."""
    manager = PagedKVManager(BlockPool(10, 4))
    pool = manager.pool
    samples = ["s0", "s1", "s2"]
    manager.add_sequence("p", 6)
    for name in samples:
        manager.fork("p", name)
    assert (pool.ref_count(1), pool.ref_count(2)) == (4, 4)
    manager.free_sequence("p")
    assert (pool.ref_count(1), pool.ref_count(2), pool.num_used) == (3, 3, 2)
    manager.append_tokens("s0")  # copy 2 -> 3
    assert manager.block_table("s0") == (1, 3) and pool.ref_count(2) == 2
    manager.append_tokens("s1")  # copy 2 -> 4
    assert manager.block_table("s1") == (1, 4) and pool.ref_count(2) == 1
    manager.append_tokens("s2")  # the last holder writes in place
    assert manager.block_table("s2") == (1, 2) and pool.num_used == 4
    for name in samples:
        manager.append_tokens(name)  # fills each last block: nothing allocated
    assert pool.num_used == 4
    for name in samples:
        manager.append_tokens(name)
    assert [manager.block_table(n) for n in samples] == [(1, 3, 5), (1, 4, 6), (1, 2, 7)]
    assert [pool.ref_count(b) for b in range(1, 8)] == [3, 1, 1, 1, 1, 1, 1]
    assert pool.free_blocks() == (8, 9)
    manager.free_sequence("s1")  # one batch, last block first: 6 then 4 at the front
    assert pool.free_blocks() == (6, 4, 8, 9) and pool.ref_count(1) == 2
    assert [pool.allocate() for _ in range(3)] == [6, 4, 8]


@pytest.mark.parametrize(("free_order", "queue"), [("vllm", (3, 2, 1, 4, 5)),
                                                   ("fifo", (4, 5, 3, 2, 1))])
def test_a_freed_sequence_returns_its_blocks_as_vllm_does(free_order, queue) -> None:
    """vLLM (PR 42656) frees a request's blocks in one batch, last block first: without a
    hash they go to the front together, so the last block is handed out next."""
    manager = PagedKVManager(BlockPool(6, 4, free_order=free_order))
    manager.add_sequence("a", 10)
    manager.free_sequence("a")
    assert manager.pool.free_blocks() == queue


def test_free_batch_checks_every_block_before_freeing_any() -> None:
    pool = BlockPool(6, 4)
    taken = [pool.allocate() for _ in range(3)]
    before = (pool.free_blocks(), [pool.ref_count(b) for b in range(6)])
    for bad, message in (([taken[0], 5], "block 5 is free"),
                         ([taken[1], taken[1]], "named 2 times but held 1"),
                         ([taken[2], True], "must be an int")):
        with pytest.raises(ValueError, match=message):
            pool.free_batch(bad)
        assert (pool.free_blocks(), [pool.ref_count(b) for b in range(6)]) == before


def test_fork_with_a_full_last_block_needs_no_copy() -> None:
    manager = PagedKVManager(BlockPool(8, 4))
    manager.add_sequence("parent", 8)
    manager.fork("parent", "child")
    manager.append_tokens("child")
    assert manager.block_table("child") == (1, 2, 3)
    assert manager.pool.ref_count(2) == 2


def test_free_sequence_releases_blocks_tail_first_and_keeps_shared_ones() -> None:
    manager = PagedKVManager(BlockPool(6, 4))
    manager.add_sequence("a", 12)
    manager.fork("a", "b")
    manager.free_sequence("a")
    assert manager.pool.num_free == 2
    manager.free_sequence("b")
    assert manager.pool.free_blocks() == (3, 2, 1, 4, 5)  # one batch at the front, tail first
    assert manager.sequences == ()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m: m.add_sequence("a", 1), ValueError, "sequence 'a' already exists"),
        (lambda m: m.add_sequence(7, 1), ValueError, "sequence id must be a str, got 7"),
        (lambda m: m.add_sequence("b", -2), ValueError, "num_tokens must be .* got -2"),
        (lambda m: m.add_sequence("b", 3, token_ids=[1, 2]), ValueError, "num_tokens=3 disagrees"),
        (lambda m: m.add_sequence("b", token_ids=[1, -5]), ValueError, "token id .* got -5"),
        (lambda m: m.add_sequence("b", token_ids=[2**64]), ValueError, "below 2\\*\\*64, got"),
        (lambda m: m.add_sequence("b", True, token_ids=[1]), ValueError, "num_tokens .* True"),
        (lambda m: m.add_sequence("b", token_ids=7), ValueError, "token_ids must be an iter"),
        (lambda m: m.append_tokens("zz"), ValueError, "unknown sequence 'zz'"),
        (lambda m: m.append_tokens("a", 0), ValueError, "num_tokens must be .* got 0"),
        (lambda m: m.append_tokens("a", token_ids=[1]), ValueError, "does not track token ids"),
        (lambda m: m.fork("zz", "b"), ValueError, "unknown sequence 'zz'"),
        (lambda m: m.fork("a", "a"), ValueError, "sequence 'a' already exists"),
        (lambda m: m.free_sequence("zz"), ValueError, "unknown sequence 'zz'"),
        (lambda m: m.block_table("zz"), ValueError, "unknown sequence 'zz'"),
        (lambda m: m.slot_mapping("a", [5]), ValueError, "position 5 is outside sequence 'a'"),
        (lambda m: PagedKVManager("pool"), ValueError, "pool must be a BlockPool, got 'pool'"),
        (lambda m: BlockPool(8, 4, num_layers=0), ValueError, "num_layers must be .* got 0"),
    ],
)
def test_bad_manager_calls(call, error: type[Exception], message: str) -> None:
    manager = PagedKVManager(BlockPool(8, 4))
    manager.add_sequence("a", 5)
    with pytest.raises(error, match=message):
        call(manager)


def test_sequences_with_token_ids_must_be_extended_with_token_ids() -> None:
    manager = PagedKVManager(BlockPool(8, 4))
    manager.add_sequence("a", token_ids=[5, 6, 7])
    with pytest.raises(ValueError, match="sequence 'a' tracks token ids"):
        manager.append_tokens("a", 2)
    manager.append_tokens("a", token_ids=[8, 9])
    assert manager.seq_len("a") == 5


def test_slot_mapping_follows_the_block_table() -> None:
    manager = PagedKVManager(BlockPool(8, 4))
    manager.add_sequence("x", 2)
    manager.add_sequence("a", 6)
    assert manager.block_table("a") == (2, 3)
    assert manager.slot_mapping("a", range(6)) == [8, 9, 10, 11, 12, 13]


# --- snapshots --------------------------------------------------------------------------


def test_snapshot_records_the_events_since_the_previous_one() -> None:
    manager = PagedKVManager(BlockPool(6, 4))
    manager.add_sequence("a", 6)
    first = manager.snapshot("prefill")
    assert first.label == "prefill"
    assert first.blocks[0].is_null and first.blocks[0].ref_count == 0
    assert [(b.event, b.tokens, b.owners) for b in first.blocks[1:3]] == [
        ("allocated", 4, ("a",)),
        ("allocated", 2, ("a",)),
    ]
    assert first.num_free == manager.pool.num_free == 3
    manager.fork("a", "b")
    manager.append_tokens("b")
    second = manager.snapshot("fork + write")
    assert [b.event for b in second.blocks] == [None, "shared", "shared", "cow-copy", None, None]
    assert second.tables == {"a": (1, 2), "b": (1, 3)}
    assert second.seq_lens == {"a": 6, "b": 7}
    assert second.blocks[1].owners == ("a", "b") and second.blocks[1].ref_count == 2
    manager.free_sequence("a")
    third = manager.snapshot()
    assert [b.event for b in third.blocks] == [None, None, "freed", None, None, None]
    assert all(b.event is None for b in manager.snapshot().blocks)


# --- K/V tensors ------------------------------------------------------------------------


def _kv_manager(num_layers: int = 1) -> PagedKVManager:
    pool = BlockPool(8, 4, num_kv_heads=2, head_dim=3, num_layers=num_layers, dtype=torch.float32)
    return PagedKVManager(pool)


def _kv(tokens: int, start: float) -> torch.Tensor:
    return torch.arange(tokens * 6, dtype=torch.float32).reshape(tokens, 2, 3) + start


def test_kv_layout_and_views() -> None:
    pool = _kv_manager().pool
    assert pool.owns_kv and not BlockPool(8, 4).owns_kv
    assert tuple(pool.kv_cache().shape) == (8, 2, 4, 2, 3)
    assert tuple(pool.key_cache().shape) == tuple(pool.value_cache().shape) == (8, 4, 2, 3)
    assert pool.kv_cache().dtype == torch.float32
    pool.key_cache()[3, 1] = 7.0
    assert torch.all(pool.kv_cache()[3, 0, 1] == 7.0)
    assert BlockPool(4, 4, num_kv_heads=1, head_dim=2).kv_cache().dtype == torch.float16


def test_write_and_read_kv_through_the_block_table() -> None:
    manager = _kv_manager()
    manager.add_sequence("a", 6)
    manager.write_kv("a", range(6), _kv(6, 0.0), -_kv(6, 0.0))
    key, value = manager.read_kv("a")
    assert torch.equal(key, _kv(6, 0.0)) and torch.equal(value, -_kv(6, 0.0))
    assert torch.equal(manager.pool.key_cache()[2, 1], _kv(6, 0.0)[5])


def test_copy_on_write_copies_data_and_isolates_later_writes() -> None:
    manager = _kv_manager(num_layers=2)
    manager.add_sequence("a", 6)
    for layer in (0, 1):
        manager.write_kv("a", range(6), _kv(6, 10.0 * layer), -_kv(6, 0.0), layer=layer)
    manager.fork("a", "b")
    manager.append_tokens("b")
    copy = manager.block_table("b")[-1]
    assert copy != manager.block_table("a")[-1]
    for layer in (0, 1):
        assert torch.equal(manager.read_kv("b", layer)[0][:6], manager.read_kv("a", layer)[0])
    manager.write_kv("b", [4, 6], _kv(2, 100.0), _kv(2, 100.0))
    assert torch.equal(manager.read_kv("a")[0], _kv(6, 0.0))
    assert torch.equal(manager.read_kv("b")[0][4], _kv(2, 100.0)[0])


def test_batch_tables_pad_with_the_null_block() -> None:
    manager = PagedKVManager(BlockPool(8, 4))
    manager.add_sequence("a", 9)
    manager.add_sequence("b", 2)
    table, lengths = manager.batch_tables(["a", "b"])
    assert table.dtype == lengths.dtype == torch.int32
    assert table.tolist() == [[1, 2, 3], [4, NULL_BLOCK, NULL_BLOCK]]
    assert lengths.tolist() == [9, 2]
    assert tuple(manager.batch_tables([])[0].shape) == (0, 0)


def test_writes_are_cast_to_the_cache_dtype() -> None:
    manager = PagedKVManager(BlockPool(4, 4, num_kv_heads=2, head_dim=3))
    manager.add_sequence("a", 2)
    manager.write_kv("a", [0, 1], _kv(2, 0.5), _kv(2, 0.5))
    assert manager.read_kv("a")[0].dtype == torch.float16
    assert torch.equal(manager.read_kv("a")[0].float(), _kv(2, 0.5))


def test_writing_a_shared_block_is_refused() -> None:
    manager = _kv_manager()
    manager.add_sequence("a", 6)
    manager.fork("a", "b")
    with pytest.raises(ValueError, match="shared by 2 sequences; it is read-only"):
        manager.write_kv("b", [5], _kv(1, 0.0), _kv(1, 0.0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.write_kv("a", [0, 1], _kv(1, 0.0), _kv(1, 0.0)), r"key has shape \(1, 2, 3\)"),
        (lambda m: m.read_kv("a", layer=1), "layer 1 is out of range"),
        (lambda m: m.write_kv("a", [1, 1], _kv(2, 0.0), _kv(2, 0.0)), "name a token more than"),
        (lambda m: m.write_kv("a", [1], _kv(1, 0.0), [[0.0] * 3] * 2), "value must be a torch"),
        (lambda m: m.write_kv("a", [1], _kv(1, 0.0), _kv(1, 0).int()), "value must be floating"),
        (lambda m: PagedKVManager(BlockPool(4, 4)).pool.kv_cache(), "owns no K/V tensors"),
    ],
)
def test_bad_kv_calls(call, message: str) -> None:
    manager = _kv_manager()
    manager.add_sequence("a", 2)
    with pytest.raises(ValueError, match=message):
        call(manager)


def test_a_refused_write_leaves_k_and_v_untouched() -> None:
    manager = _kv_manager()
    manager.add_sequence("a", 2)
    manager.write_kv("a", [0, 1], _kv(2, 1.0), _kv(2, 2.0))
    before = manager.pool.kv_cache().clone()
    with pytest.raises(ValueError, match=r"value must be a torch\.Tensor, got ndarray$"):
        manager.write_kv("a", [0], _kv(1, 9.0), _kv(1, 9.0).numpy())
    assert torch.equal(manager.pool.kv_cache(), before)


# --- properties -------------------------------------------------------------------------

NUM_BLOCKS, BLOCK = 12, 4
PREFIXES = ([], [1, 2, 3, 0], [1, 2, 3, 0, 2, 2, 1, 3])


class PoolMachine(RuleBasedStateMachine):
    """Random add / append / fork / free on a pool that owns K/V; invariants after each step.

    Every token's K is ``token + 16 * position`` and V its negative, so reading a sequence
    back checks that no copy, share, cache hit or reuse ever exposes another sequence's data.
    """

    caching = False

    def __init__(self) -> None:
        super().__init__()
        pool_type = PrefixCachingBlockPool if self.caching else BlockPool
        manager_type = PrefixCachingKVManager if self.caching else PagedKVManager
        self.pool = pool_type(NUM_BLOCKS, BLOCK, num_kv_heads=1, head_dim=1, dtype=torch.float32)
        self.manager = manager_type(self.pool)
        self.tokens: dict[str, list[int]] = {}
        self.salts: dict[str, str | None] = {}
        self.names = 0

    def _pick(self, index: int) -> str:
        return sorted(self.tokens)[index % len(self.tokens)]

    def _write(self, seq_id: str, start: int) -> None:
        tokens = self.tokens[seq_id]
        positions = list(range(start, len(tokens)))
        key = torch.tensor([t + 16.0 * p for p, t in enumerate(tokens)][start:]).reshape(-1, 1, 1)
        self.manager.write_kv(seq_id, positions, key, -key)

    def _frozen(self) -> tuple:
        hashes = [self.pool.block_hash(b) for b in range(NUM_BLOCKS)] if self.caching else []
        return (*_state(self.manager), hashes)

    def _before(self) -> tuple[dict[str, tuple[int, ...]], list[int]]:
        """Every table and every reference count, taken before an operation."""
        tables = {name: self.manager.block_table(name) for name in self.tokens}
        return tables, [self.pool.ref_count(b) for b in range(NUM_BLOCKS)]

    def _check_step(self, before: tuple, acting: str, shared_ok: bool = False) -> None:
        """After an operation on ``acting``: every other sequence kept its table, and each
        block ``acting`` newly holds was free before, unless sharing is the point (a fork,
        a cache hit): no block is reused while another sequence holds it."""
        tables, refs = before
        for name, table in tables.items():
            if name != acting:
                assert self.manager.block_table(name) == table, f"{acting} moved {name}'s blocks"
        new = set(self.manager.block_table(acting)) - set(tables.get(acting, ()))
        reused = sorted(b for b in new if refs[b] > 0)
        assert shared_ok or not reused, f"blocks {reused} went to {acting} while referenced"

    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=st.lists(st.integers(0, 3), max_size=9),
        salt=st.sampled_from([None, "tenant-b"]),
    )
    def add(self, prefix: list[int], tail: list[int], salt: str | None) -> None:
        name = f"s{self.names}"
        self.names += 1
        before, step = self._frozen(), self._before()
        extra = {"cache_salt": salt} if self.caching else {}
        try:
            hit = self.manager.add_sequence(name, token_ids=prefix + tail, **extra)
        except OutOfBlocks:
            event("add: out of blocks")
            assert self._frozen() == before
            return
        event(f"add: cache hit {hit > 0}")
        self.tokens[name] = prefix + tail
        self.salts[name] = salt if self.caching else None
        table = self.manager.block_table(name)
        assert all(self.pool.block_hash(b) is not None for b in table[: hit // BLOCK])
        assert all(step[1][b] == 0 for b in table[hit // BLOCK :]), "reused a held block"
        self._check_step(step, name, shared_ok=True)
        self._write(name, hit)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 50), new=st.lists(st.integers(0, 3), min_size=1, max_size=6))
    def append(self, index: int, new: list[int]) -> None:
        name = self._pick(index)
        before, step = self._frozen(), self._before()
        try:
            self.manager.append_tokens(name, token_ids=new)
        except OutOfBlocks:
            event("append: out of blocks")
            assert self._frozen() == before
            return
        self._check_step(step, name)
        self.tokens[name] += new
        self._write(name, len(self.tokens[name]) - len(new))

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 50))
    def fork(self, index: int) -> None:
        parent, child = self._pick(index), f"s{self.names}"
        self.names += 1
        step = self._before()
        self.manager.fork(parent, child)
        self._check_step(step, child, shared_ok=True)
        assert self.manager.block_table(child) == step[0][parent]
        self.tokens[child] = list(self.tokens[parent])
        self.salts[child] = self.salts[parent]

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 50))
    def free(self, index: int) -> None:
        name = self._pick(index)
        step = self._before()
        self.manager.free_sequence(name)
        del self.tokens[name], self.salts[name]
        for other, table in step[0].items():
            if other != name:
                assert self.manager.block_table(other) == table
        for block_id in step[0][name]:  # each reference dropped exactly once
            assert self.pool.ref_count(block_id) == step[1][block_id] - 1

    @invariant()
    def blocks_are_never_lost_or_handed_out_twice(self) -> None:
        pool, free = self.pool, self.pool.free_blocks()
        assert pool.num_free + pool.num_used == NUM_BLOCKS - 1
        assert len(set(free)) == len(free) == pool.num_free
        held = {b for b in range(1, NUM_BLOCKS) if pool.ref_count(b) > 0}
        assert held.isdisjoint(free) and held | set(free) == set(range(1, NUM_BLOCKS))

    @invariant()
    def cached_free_blocks_wait_behind_every_uncached_one(self) -> None:
        if not self.caching:
            return
        cached = [self.pool.block_hash(b) is not None for b in self.pool.free_blocks()]
        assert cached == sorted(cached)  # uncached (reused first) ... cached (LRU order)

    @invariant()
    def ref_counts_equal_block_table_entries(self) -> None:
        entries = [0] * NUM_BLOCKS
        for name in self.tokens:
            table = self.manager.block_table(name)
            assert len(set(table)) == len(table) and NULL_BLOCK not in table
            for block_id in table:
                entries[block_id] += 1
        assert entries == [self.pool.ref_count(b) for b in range(NUM_BLOCKS)]

    @invariant()
    def every_sequence_reads_its_own_kv(self) -> None:
        for name, tokens in self.tokens.items():
            assert self.manager.seq_len(name) == len(tokens)
            key, value = self.manager.read_kv(name)
            expected = torch.tensor([t + 16.0 * p for p, t in enumerate(tokens)])
            assert torch.equal(key.flatten(), expected) and torch.equal(value.flatten(), -expected)

    @invariant()
    def every_full_block_carries_its_prefix_hash(self) -> None:
        if not self.caching:
            return
        for name, tokens in self.tokens.items():
            expected = block_hashes(tokens, BLOCK, cache_salt=self.salts[name])
            table = self.manager.block_table(name)
            assert [self.pool.block_hash(b) for b in table[: len(expected)]] == expected
            assert all(self.pool.block_hash(b) is None for b in table[len(expected) :])

    def teardown(self) -> None:
        if self.caching:
            event(f"evictions happened: {self.pool.num_evictions > 0}")
        for name in list(self.tokens):
            self.manager.free_sequence(name)
        assert self.pool.num_free == NUM_BLOCKS - 1 and self.pool.num_used == 0


class CachingPoolMachine(PoolMachine):
    """The same operations and invariants with prefix caching on."""

    caching = True


_PROPERTY_SETTINGS = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestPoolProperties = PoolMachine.TestCase
TestPoolProperties.settings = _PROPERTY_SETTINGS
TestCachingPoolProperties = CachingPoolMachine.TestCase
TestCachingPoolProperties.settings = _PROPERTY_SETTINGS


def test_last_block_is_the_table_s_last_entry_and_names_an_empty_table() -> None:
    manager = PagedKVManager(BlockPool(8, 4))
    manager.add_sequence("a", 5)
    manager.add_sequence("empty", 0)
    assert manager.last_block("a") == manager.block_table("a")[-1]
    manager.fork("a", "b")
    manager.append_tokens("b")  # copy-on-write: b's last block is its own copy now
    assert manager.last_block("b") == manager.block_table("b")[-1] != manager.last_block("a")
    with pytest.raises(ValueError, match="sequence 'empty' holds no block"):
        manager.last_block("empty")
    with pytest.raises(ValueError, match="unknown sequence 'zz'"):
        manager.last_block("zz")
