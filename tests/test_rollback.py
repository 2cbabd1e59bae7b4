"""The undo log behind the engine's all-or-nothing step: any run of pool and manager
operations, undone, leaves the pool, the manager and the K/V a rollback promises exactly as
they were, and a step's log grows with what the step changes, never with the pool."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.rollback import UndoLog, saved_manager, undoable
from course_lib.scheduler import SchedulerConfig, kv_manager
from course_lib.serving import Sample, ServingCore, ServingRequest
from tests.frozen_state import freeze

BLOCK = 2


def _state(pool: BlockPool, manager: PagedKVManager) -> tuple:
    """The pool and manager frozen, with the K/V a later step reads: every live sequence's
    written tokens and every cached block (a free block's K/V is garbage nobody reads)."""
    kv = pool._kv
    try:
        pool._kv = None
        frozen = freeze((vars(pool), vars(manager)))
    finally:
        pool._kv = kv
    cached = [b for b in range(1, pool.num_blocks)
              if isinstance(pool, PrefixCachingBlockPool) and pool.block_hash(b) is not None]
    return frozen, freeze(kv[:, cached]), [freeze(manager.read_kv(s)) for s in manager.sequences]


OPS = st.lists(st.tuples(st.sampled_from(["add", "append", "fork", "free"]),
                         st.integers(0, 3), st.integers(1, 5)), max_size=12)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(caching=st.booleans(), setup=OPS, logged=OPS)
def test_undo_puts_back_pool_manager_and_kv(caching, setup, logged) -> None:
    pool = undoable(PrefixCachingBlockPool if caching else BlockPool)(
        8, BLOCK, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    assert_undo_is_exact(pool, setup, logged)


def assert_undo_is_exact(pool: BlockPool, setup: list, logged: list) -> None:
    """Run ``setup`` on an undoable ``pool``'s manager, then ``logged`` under a log, undo
    it, and require the pool, the manager and the K/V read later to be as before."""
    manager = kv_manager(pool)
    _run(manager, setup)
    before = _state(pool, manager)
    log = UndoLog()
    log.add(saved_manager(manager))
    pool.attach(log)
    _run(manager, logged)
    pool.attach(None)
    log.undo()
    assert _state(pool, manager) == before


def _run(manager: PagedKVManager, ops: list[tuple[str, int, int]]) -> None:
    """Apply ``ops`` (refused ones skipped), writing distinct K/V for every new token."""
    for step, (op, seq, count) in enumerate(ops):
        name, other = f"s{seq}", f"s{(seq + 1) % 4}"
        start = manager.seq_len(name) if manager.holds(name) else 0
        try:
            if op == "add" and not manager.holds(name):
                start = manager.add_sequence(name, token_ids=[seq] * count)
            elif op == "append" and manager.holds(name):
                manager.append_tokens(name, token_ids=[count] * count)
            else:
                if op == "fork" and manager.holds(name) and not manager.holds(other):
                    manager.fork(name, other)
                elif op == "free" and manager.holds(name):
                    manager.free_sequence(name)
                continue
        except OutOfBlocks:
            continue
        new = list(range(start, manager.seq_len(name)))
        values = torch.full((len(new), 1, 2), float(step * 10 + seq))
        manager.write_kv(name, new, values, values)


def _core_log_size(num_blocks: int) -> int:
    """Undo entries of one decode step of 4 requests on a pool of ``num_blocks``."""
    pool = undoable(BlockPool)(num_blocks, 4)
    core = ServingCore(SchedulerConfig(), pool)
    for i in range(4):
        core.add(ServingRequest(i, [1] * 6, 5, 0, [Sample(f"r{i}", [1] * 6)]))
    for _ in range(2):
        core.advance(core.schedule(), lambda i, request, sample: sample.tokens.append(7))
    log = core.checkpoint()
    core.advance(core.schedule(), lambda i, request, sample: sample.tokens.append(7))
    size = len(log)
    core.restore(log)
    return size


def test_a_steps_log_does_not_grow_with_the_pool() -> None:
    assert _core_log_size(30_721) == _core_log_size(257)


def test_only_a_hit_that_revives_a_block_copies_the_free_queue() -> None:
    pool = undoable(PrefixCachingBlockPool)(64, BLOCK)
    manager = kv_manager(pool)
    manager.add_sequence("a", token_ids=[1, 2, 3, 4, 5])
    queue, copies = pool.free_queue, []
    queue.snapshot = lambda: copies.append(len(queue)) or tuple(queue)
    pool.attach(UndoLog())
    assert manager.add_sequence("b", token_ids=[1, 2, 3, 4, 5]) == 4  # a's blocks, held
    assert copies == []
    manager.free_sequence("a")
    manager.free_sequence("b")
    assert manager.add_sequence("c", token_ids=[1, 2, 3, 4, 5]) == 4  # revived from the queue
    assert copies == [63]


def test_checkpoint_refuses_a_pool_it_cannot_undo() -> None:
    core = ServingCore(SchedulerConfig(), BlockPool(8, 4))
    with pytest.raises(ValueError, match="undoable pool"):
        core.checkpoint()


class _Injected(RuntimeError):
    pass


@settings(max_examples=60, deadline=None, derandomize=True)
@given(caching=st.booleans(), samples=st.integers(1, 2),
       failures=st.lists(st.integers(0, 5), min_size=1, max_size=20))
def test_a_step_failing_at_any_draw_is_undone_whole(caching, samples, failures) -> None:
    """A core step that raises in its ``k``-th draw, undone, leaves the core exactly as it
    was: the requests it admitted, preempted, prefilled or forked included (a waiting
    request is saved when a step first takes it); the same step then runs through."""
    pool = undoable(PrefixCachingBlockPool if caching else BlockPool)(10, 4)
    core = ServingCore(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=9), pool)
    for i in range(6):
        prompt = [1 + i % 2] * (3 + i)
        core.add(ServingRequest(i, prompt, 4, 0,
                                [Sample(f"r{i}.{k}", list(prompt)) for k in range(samples)]))

    def step(fail_at: int | None) -> None:
        calls = [0]

        def draw(_index: int, request: ServingRequest, sample: Sample) -> None:
            if calls[0] == fail_at:
                raise _Injected
            calls[0] += 1
            request.append_token(sample, 7 + calls[0] % 3, ())
        core.retire(core.advance(core.schedule(), draw))

    def state() -> object:
        """The core frozen, the keys of the pool's two hash maps sorted first: an undone
        eviction puts a key back at its map's end, and nothing reads the keys' order
        (lookups go by key; each hash's holders keep theirs)."""
        if caching:
            pool._hash_of = dict(sorted(pool._hash_of.items()))
            pool._blocks_of = dict(sorted(pool._blocks_of.items()))
        return freeze(vars(core))

    for index in range(200):
        if not core.unfinished:
            break
        fail_at = failures[index % len(failures)]
        before = state()
        log = core.checkpoint()
        try:
            step(fail_at)
        except _Injected:
            core.restore(log)
            assert state() == before
            log = core.checkpoint()
            step(None)
        core.commit(log)
    assert not core.unfinished and pool.num_used == 0
