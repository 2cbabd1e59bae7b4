"""The free-block queue the pool owns, and eviction orders as registered policies.

A least-hit-first order defined here (as a maintainer would add one: the class and this
test, no other edit) runs in the pool, the simulator and the engine's rollback."""

from __future__ import annotations

from collections.abc import Container, Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.free_queue import (
    FREE_ORDERS,
    FifoOrder,
    FreeBlockQueue,
    VllmOrder,
    free_queue_class,
)
from course_lib.prefix_cache import PrefixCachingBlockPool, PrefixCachingKVManager
from course_lib.rollback import undoable
from course_lib.simulator import SimConfig, simulate
from course_lib.workload import support_chat
from tests.test_rollback import OPS, assert_undo_is_exact


def test_the_registry_holds_vllms_order_first_then_fifo() -> None:
    assert {"vllm": VllmOrder, "fifo": FifoOrder} == FREE_ORDERS
    assert free_queue_class("fifo") is FifoOrder
    with pytest.raises(ValueError, match=r"unknown free_order 'lfu'; expected one of vllm, fifo"):
        free_queue_class("lfu")
    with pytest.raises(ValueError, match=r"unknown free_order \['vllm'\]"):
        free_queue_class(["vllm"])


def test_a_second_order_of_the_same_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'vllm' already exists"):
        type("Again", (VllmOrder,), {"name": "vllm"})
    assert FREE_ORDERS["vllm"] is VllmOrder


@pytest.mark.parametrize(("order", "queue"), [(VllmOrder, (1, 3, 5, 7, 2, 4)),
                                              (FifoOrder, (5, 7, 1, 2, 3, 4))])
def test_release_puts_uncached_blocks_first_only_in_vllms_order(order, queue) -> None:
    free = order([5, 7])
    free.release([1, 2, 3, 4], cached={2, 4})
    assert tuple(free) == queue and len(free) == 6 and 3 in free and 6 not in free
    front = free.pop_front()
    free.push_front([front])  # as an undone allocation does
    free.remove(7)
    assert tuple(free) == tuple(b for b in queue if b != 7)


def test_a_snapshot_restores_the_order() -> None:
    free = VllmOrder(range(1, 6))
    saved = free.snapshot()
    assert free.pop_front_many(2) == [1, 2] and free.pop_front() == 3
    free.release([2, 1], cached=())
    free.restore(saved)
    assert tuple(free) == (1, 2, 3, 4, 5)


def _least_hit_first() -> type[FreeBlockQueue]:
    """Define (and so register) a least-hit-first eviction order, as a maintainer would."""

    class LeastHitFirst(FreeBlockQueue):
        """A freed cached block waits behind every free cached block hit fewer times (ties
        in the order freed); blocks without a hash go to the front. It counts hits."""

        name = "test-least-hit"

        def __init__(self, block_ids: Any) -> None:
            super().__init__(block_ids)
            self.hits: dict[int, int] = {}

        def hit(self, block_ids: Any) -> None:
            for block_id in block_ids:
                self.hits[block_id] = self.hits.get(block_id, 0) + 1

        def release(self, block_ids: list[int], cached: Container[int]) -> None:
            for block_id in (b for b in block_ids if b in cached):
                rank, order = self.hits.get(block_id, 0), list(self)
                at = next((i for i, b in enumerate(order)
                           if b in cached and self.hits.get(b, 0) > rank), len(order))
                FreeBlockQueue.restore(self, [*order[:at], block_id, *order[at:]])
            self.push_front([b for b in block_ids if b not in cached])

        def snapshot(self) -> Any:
            return super().snapshot(), dict(self.hits)

        def restore(self, snapshot: Any) -> None:
            order, hits = snapshot
            super().restore(order)
            self.hits = dict(hits)

    return LeastHitFirst


@pytest.fixture
def least_hit() -> Iterator[type[FreeBlockQueue]]:
    """The least-hit-first order, registered for one test."""
    order = _least_hit_first()
    yield order
    del FREE_ORDERS[order.name]


def _freed_cached_blocks(order: str) -> tuple[tuple[int, ...], int, int]:
    """Blocks of 2: "a" and "b" cache one full block each, "a"'s is hit twice more; "a"
    is freed before "b". The free queue's back, "a"'s cached block and "b"'s."""
    manager = PrefixCachingKVManager(PrefixCachingBlockPool(6, 2, free_order=order))
    manager.add_sequence("a", token_ids=[1, 1, 9])
    manager.add_sequence("b", token_ids=[2, 2, 9])
    for name in ("a2", "a3"):
        assert manager.add_sequence(name, token_ids=[1, 1, 8]) == 2
        manager.free_sequence(name)
    hit_block, other = manager.block_table("a")[0], manager.block_table("b")[0]
    manager.free_sequence("a")
    manager.free_sequence("b")
    return manager.pool.free_blocks()[-2:], hit_block, other


def test_an_order_defined_outside_the_library_keeps_the_most_hit_block(least_hit) -> None:
    back, hit_block, other = _freed_cached_blocks(least_hit.name)
    assert back == (other, hit_block)  # the most hit block is evicted last
    back, hit_block, other = _freed_cached_blocks("vllm")
    assert back == (hit_block, other)  # least recently freed first
    with pytest.raises(ValueError, match=r"free_order must be one of \('vllm', 'fifo', "
                                         r"'test-least-hit'\), got 'lfu'"):
        PrefixCachingBlockPool(4, 2, free_order="lfu")


def test_the_simulator_takes_a_registered_order_by_name(least_hit) -> None:
    trace, budget = support_chat(60), 5 * 2**28  # 640 blocks of 16: preemptions reuse the cache
    runs = [simulate(trace, SimConfig(prefix_caching=True, free_order=order,
                                      budget_bytes=budget)) for order in ("vllm", least_hit.name)]
    assert [r.requests - r.rejected for r in runs] == [60, 60]
    assert runs[0].output_tokens == runs[1].output_tokens and runs[1].preemptions > 0


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.sampled_from(["vllm", "fifo", "test-least-hit"]), setup=OPS, logged=OPS)
def test_undo_is_exact_under_every_order(least_hit, order: str, setup, logged) -> None:
    pool = undoable(PrefixCachingBlockPool)(8, 2, num_kv_heads=1, head_dim=2,
                                            dtype=torch.float32, free_order=order)
    assert_undo_is_exact(pool, setup, logged)
