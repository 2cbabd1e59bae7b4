"""The scheduler: queues, victim policies, limits, swap space, and their effect on a run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.scheduler import Scheduler, SchedulerConfig, SwapSpace, tokens_to_recompute
from course_lib.simulator import CostModel, SimConfig, simulate
from course_lib.workload import Request


def tiny(slots: int, **kwargs: object) -> SimConfig:
    """A paged server of ``slots`` one-byte tokens in blocks of 4, requests up to 16."""
    return SimConfig(allocator="paged", budget_bytes=slots, bytes_per_token=1, block_size=4,
                     max_len=16, **kwargs)


# --- the queues ----------------------------------------------------------------------------

TRACE = [Request(0, 1, 1, arrival=0, priority=2), Request(1, 1, 1, arrival=0, priority=0),
         Request(2, 1, 1, arrival=1, priority=2), Request(3, 1, 1, arrival=1, priority=1)]


def admit_all(scheduler: Scheduler) -> list[int]:
    for index in range(len(TRACE)):
        scheduler.arrive(index)
    return [scheduler.admit_next() for _ in range(len(TRACE))]


def test_fcfs_admits_in_arrival_order_and_preempts_the_newest() -> None:
    scheduler = Scheduler(SchedulerConfig(), TRACE)
    assert admit_all(scheduler) == [0, 1, 2, 3]
    assert scheduler.victim() == 3
    scheduler.stop(3)
    scheduler.requeue(3)
    scheduler.stop(2)
    scheduler.requeue(2)
    assert (scheduler.victim(), scheduler.num_waiting, scheduler.next_waiting()) == (1, 2, 2)


def test_priority_admits_by_priority_and_preempts_the_lowest_latest() -> None:
    scheduler = Scheduler(SchedulerConfig(policy="priority"), TRACE)
    assert admit_all(scheduler) == [1, 3, 0, 2]
    assert scheduler.victim() == 2  # priority 2, and arrived after request 0
    scheduler.stop(2)
    assert scheduler.victim() == 0
    scheduler.stop(0)
    scheduler.requeue(0)
    assert (scheduler.victim(), scheduler.next_waiting()) == (3, 0)


def test_limits() -> None:
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=100), TRACE)
    assert scheduler.admits(prefill_tokens=60, step_tokens=40)
    assert not scheduler.admits(prefill_tokens=61, step_tokens=40)
    scheduler.arrive(0)
    scheduler.arrive(1)
    scheduler.admit_next()
    scheduler.admit_next()
    assert not scheduler.admits(prefill_tokens=1, step_tokens=2)


def test_nobody_to_preempt() -> None:
    with pytest.raises(ValueError, match="no running request to preempt"):
        Scheduler(SchedulerConfig(), TRACE).victim()


@pytest.mark.parametrize(
    ("call", "message"),
    [(lambda s: s.admit_next(), "no request is waiting to be admitted"),
     (lambda s: s.stop(3), "request 3 is not running"),
     (lambda s: s.stop(True), "request index must be an integer >= 0, got True"),
     (lambda s: s.arrive(0), "request 0 is already running"),
     (lambda s: s.requeue(0), "request 0 is already running"),
     (lambda s: s.arrive(4), r"request index 4 is outside the trace \(4 requests\)"),
     (lambda s: s.admits(-1, 0), "prefill_tokens must be an integer >= 0, got -1")],
)
def test_bad_scheduler_calls_name_the_value_and_change_nothing(call, message: str) -> None:
    scheduler = Scheduler(SchedulerConfig(), TRACE)
    scheduler.arrive(0)
    scheduler.admit_next()
    before = (scheduler.num_waiting, scheduler.next_waiting(), list(scheduler.running))
    with pytest.raises(ValueError, match=message):
        call(scheduler)
    assert (scheduler.num_waiting, scheduler.next_waiting(), list(scheduler.running)) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"policy": "random"}, "unknown policy 'random'; expected one of fcfs, priority"),
     ({"preemption": "kill"}, "unknown preemption mode 'kill'"),
     ({"max_num_seqs": 0}, "max_num_seqs must be an integer >= 1, got 0"),
     ({"max_num_batched_tokens": True}, "max_num_batched_tokens must be an integer >= 1, got True"),
     ({"swap_space_blocks": -1}, "swap_space_blocks must be an integer >= 0, got -1")],
)
def test_bad_scheduler_configs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)


def test_token_budget_must_hold_the_longest_request() -> None:
    SchedulerConfig(max_num_batched_tokens=8192).check_max_len(8192)
    with pytest.raises(ValueError, match="without chunked prefill"):
        SchedulerConfig(max_num_batched_tokens=2048).check_max_len(8192)


operations = st.lists(st.tuples(st.sampled_from(["arrive", "admit", "preempt", "finish"]),
                                st.integers(0, 10**6)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(["fcfs", "priority"]), ops=operations,
       priorities=st.lists(st.integers(0, 3), min_size=8, max_size=8))
def test_no_request_is_lost_or_duplicated(policy: str, ops: list, priorities: list) -> None:
    trace = [Request(i, 1, 1, arrival=i // 3, priority=p) for i, p in enumerate(priorities)]
    scheduler = Scheduler(SchedulerConfig(policy=policy), trace)
    new, waiting, finished = list(range(len(trace))), set(), set()
    for op, pick in ops:
        if op == "arrive" and new:
            waiting.add(new[0])
            scheduler.arrive(new.pop(0))
        elif op == "admit" and waiting:
            index = scheduler.admit_next()
            waiting.remove(index)
        elif op in ("preempt", "finish") and scheduler.running:
            index = (scheduler.victim() if op == "preempt"
                     else sorted(scheduler.running)[pick % len(scheduler.running)])
            scheduler.stop(index)
            if op == "preempt":
                scheduler.requeue(index)
                waiting.add(index)
            else:
                finished.add(index)
        running = set(scheduler.running)
        assert scheduler.num_waiting == len(waiting)
        assert not (running & waiting) and not (running & finished)
        assert running | waiting | finished | set(new) == set(range(len(trace)))
        if running:
            victim = scheduler.victim()
            if policy == "fcfs":
                assert victim == list(scheduler.running)[-1]
            else:
                assert victim == max(running, key=lambda i: (trace[i].priority,
                                                             trace[i].arrival, i))


online_operations = st.lists(st.tuples(st.sampled_from(["add", "admit", "preempt", "finish",
                                                         "withdraw"]),
                                       st.integers(0, 3), st.integers(0, 10**6)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(["fcfs", "priority"]), ops=online_operations)
def test_online_requests_withdrawals_and_the_claim_order(policy: str, ops: list) -> None:
    """Requests registered one at a time (``add``) and withdrawn while waiting: none is lost
    or duplicated, and ``victim`` is always the last request in ``claim_order``."""
    scheduler = Scheduler(SchedulerConfig(policy=policy), [])
    keys: list[tuple[int, int, int]] = []
    waiting, gone = set(), set()
    for op, priority, pick in ops:
        if op == "add":
            index = scheduler.add(Request(len(keys), 1, 1, arrival=len(keys) // 2,
                                          priority=priority))
            assert index == len(keys)
            keys.append((priority, len(keys) // 2, index))
            waiting.add(index)
        elif op == "admit" and waiting:
            waiting.remove(scheduler.admit_next())
        elif op == "withdraw" and waiting:
            index = sorted(waiting)[pick % len(waiting)]
            scheduler.withdraw(index)
            waiting.remove(index)
            gone.add(index)
            with pytest.raises(ValueError, match="not waiting"):
                scheduler.withdraw(index)
        elif op in ("preempt", "finish") and scheduler.running:
            index = (scheduler.victim() if op == "preempt"
                     else sorted(scheduler.running)[pick % len(scheduler.running)])
            scheduler.stop(index)
            (waiting if op == "preempt" else gone).add(index)
            if op == "preempt":
                scheduler.requeue(index)
        running = set(scheduler.running)
        assert scheduler.num_waiting == len(waiting)
        assert running | waiting | gone == set(range(len(keys)))
        assert not (running & waiting) and not (running & gone)
        order = scheduler.claim_order()
        assert sorted(order) == sorted(running)
        if running:
            assert scheduler.victim() == order[-1]
            if policy == "priority":
                assert order == sorted(running, key=keys.__getitem__)


def test_add_takes_only_workload_requests() -> None:
    scheduler = Scheduler(SchedulerConfig(), [])
    with pytest.raises(ValueError, match="workload Request"):
        scheduler.add((1, 2))  # type: ignore[arg-type]
    assert scheduler.num_waiting == 0


# --- swap space ------------------------------------------------------------------------------


def test_swap_space_accounting() -> None:
    swap = SwapSpace(5)
    assert swap.swap_out(1, 3) and swap.holds(1)
    assert not swap.swap_out(2, 3) and not swap.holds(2)  # full: the caller recomputes
    assert swap.swap_out(2, 2) and swap.used_blocks == 5
    assert swap.swap_in(1) == 3 and swap.used_blocks == 2
    with pytest.raises(ValueError, match="request 1 is not swapped out"):
        swap.swap_in(1)
    with pytest.raises(ValueError, match="request 2 is already swapped out"):
        swap.swap_out(2, 1)
    with pytest.raises(ValueError, match="request_id must be an integer >= 0, got True"):
        swap.swap_in(True)
    with pytest.raises(ValueError, match="num_blocks must be an integer >= 1, got 0"):
        swap.swap_out(3, 0)
    with pytest.raises(ValueError, match="capacity_blocks must be an integer >= 0, got -2"):
        SwapSpace(-2)


# --- recompute with a prefix cache ---------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "cached", "block", "expected"),
    [(12, 0, 4, 12), (12, 1, 4, 8), (12, 2, 4, 4), (12, 3, 4, 4), (13, 3, 4, 1),
     (4, 1, 4, 4), (1, 5, 1, 1), (900, 56, 16, 4), (896, 56, 16, 16)],
)
def test_tokens_to_recompute(length: int, cached: int, block: int, expected: int) -> None:
    """Cached full blocks are reused, but the last token is always computed."""
    assert tokens_to_recompute(length, cached, block) == expected


def test_tokens_to_recompute_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="length must be an integer >= 1, got 0"):
        tokens_to_recompute(0, 0, 16)
    with pytest.raises(ValueError, match="cached_blocks must be an integer >= 0, got -1"):
        tokens_to_recompute(10, -1, 16)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        tokens_to_recompute(10, 0, 0)


@settings(max_examples=80, deadline=None)
@given(length=st.integers(1, 500), cached=st.integers(0, 40), block=st.integers(1, 32))
def test_recompute_is_at_least_one_token_and_never_more_than_the_length(
        length: int, cached: int, block: int) -> None:
    tokens = tokens_to_recompute(length, cached, block)
    assert 1 <= tokens <= length
    assert (length - tokens) % block == 0 and length - tokens <= cached * block


# --- the policies in a run -------------------------------------------------------------------

# A (priority 1) runs first; B (priority 0) arrives at step 1; at step 3 B needs a block
# and none is free. FCFS pushes out the newest (B itself); priority pushes out A.
A_THEN_B = [Request(0, 3, 4, arrival=0, priority=1), Request(1, 2, 3, arrival=1, priority=0)]


def preempted(config: SimConfig) -> list[tuple[int, int, int]]:
    result = simulate(A_THEN_B, config, record="full")
    return [(e.step, e.request, e.length) for e in result.timeline.events
            if e.kind == "preempt"]


def test_fcfs_preempts_the_newest_priority_the_least_important() -> None:
    assert preempted(tiny(16)) == [(3, 1, 4)]
    assert preempted(tiny(16, scheduler=SchedulerConfig(policy="priority"))) == [(3, 0, 6)]
    fcfs, priority = (simulate(A_THEN_B, tiny(16, scheduler=SchedulerConfig(policy=p)))
                      for p in ("fcfs", "priority"))
    assert (fcfs.recomputed_tokens, priority.recomputed_tokens) == (4, 6)
    assert fcfs.steps == priority.steps == 5


def test_swap_moves_blocks_instead_of_recomputing() -> None:
    swap = simulate(A_THEN_B, tiny(16, scheduler=SchedulerConfig(preemption="swap")))
    assert (swap.recomputed_tokens, swap.swapped_bytes) == (0, 2 * 4)  # one block, out and in
    full = simulate(A_THEN_B, tiny(16, scheduler=SchedulerConfig(preemption="swap",
                                                                 swap_space_blocks=0)))
    assert (full.recomputed_tokens, full.swapped_bytes) == (4, 0)


def test_cost_model_charges_prefill_kv_reads_and_swaps() -> None:
    zero = {"step_seconds": 0.0}
    prefill = simulate(A_THEN_B, tiny(16, costs=CostModel(**zero, prefill_seconds_per_token=1)))
    assert prefill.seconds == pytest.approx(3 + 2 + 4)  # two prompts, B recomputed
    reads = simulate(A_THEN_B, tiny(16, costs=CostModel(**zero, kv_read_bandwidth=1)))
    assert reads.seconds == pytest.approx(4 + (5 + 3) + (6 + 4) + 7 + 5)  # KV tokens per step
    swaps = simulate(A_THEN_B, tiny(16, scheduler=SchedulerConfig(preemption="swap"),
                                    costs=CostModel(**zero, swap_seconds_per_block=1,
                                                    pcie_bandwidth=8)))
    assert swaps.seconds == pytest.approx(2 + 8 / 8)  # two transfers of one block, 8 bytes
    assert swaps.avg_stall == pytest.approx(1.5)  # B waits out step 3, which swaps it out


def test_max_num_seqs_caps_the_batch() -> None:
    result = simulate(A_THEN_B, tiny(16, scheduler=SchedulerConfig(max_num_seqs=1)),
                      record="steps")
    assert result.timeline.batch.tolist() == [1, 1, 1, 1, 1, 1, 1]
    assert result.preemptions == 0


def test_token_budget_delays_a_second_prefill() -> None:
    trace = [Request(0, 10, 3), Request(1, 10, 3)]
    result = simulate(trace, tiny(64, scheduler=SchedulerConfig(max_num_batched_tokens=16)),
                      record="steps")
    assert result.timeline.batch.tolist() == [1, 2, 2, 1]  # 10 + 10 > 16; then 1 + 10 fits
    assert result.p50_ttft == pytest.approx((0.025 + 0.05) / 2)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preempt_until_frees_victims_until_the_claim_fits(policy: str) -> None:
    scheduler = Scheduler(SchedulerConfig(policy=policy), TRACE)
    admit_all(scheduler)
    free = [0]
    freed: list[int] = []

    def preempt(victim: int) -> None:
        scheduler.stop(victim)
        scheduler.requeue(victim)
        freed.append(victim)
        free[0] += 1

    order = scheduler.claim_order()
    assert scheduler.preempt_until(order[0], lambda: free[0] >= 2, preempt) == freed
    assert freed == [order[-1], order[-2]]  # the least protected go first
    last = scheduler.claim_order()[-1]
    victims = scheduler.preempt_until(last, lambda: False, preempt)
    assert victims == [last]  # the claimant itself was the victim: stop there
    with pytest.raises(ValueError, match="is not running"):
        scheduler.preempt_until(last, lambda: True, preempt)
