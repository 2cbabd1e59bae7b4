"""The serving core's own contract (``course_lib.serving``): its two modes, what it refuses,
and the pieces it added to the scheduler, the manager and the pool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.paged import BlockPool, PagedKVManager
from course_lib.prefix_cache import PrefixCachingBlockPool, PrefixCachingKVManager, block_hashes
from course_lib.scheduler import Scheduler, SchedulerConfig
from course_lib.serving import Sample, ServingCore, ServingRequest
from course_lib.simulator import Positions
from course_lib.workload import Request


def request(index: int, prompt: int, max_tokens: int, n: int = 1) -> ServingRequest:
    """A request of ``prompt`` token ids unique to it."""
    tokens = [1000 * index + j for j in range(prompt)]
    samples = [Sample(f"r{index}.{k}", list(tokens)) for k in range(n)]
    return ServingRequest(index, tuple(tokens), max_tokens, 0, samples)


def draw(index: int, req: ServingRequest, sample: Sample) -> None:
    req.append_token(sample, 7, ())


def test_advance_takes_a_draw_in_eager_mode_and_none_in_lazy_mode() -> None:
    for lazy in (False, True):
        core = ServingCore(SchedulerConfig(), BlockPool(8, 4), lazy=lazy)
        core.add(request(0, 3, 2))
        schedule = core.schedule()
        with pytest.raises(ValueError, match="a draw in eager mode and none in lazy mode"):
            core.advance(schedule, None if not lazy else draw)


def test_swap_is_refused_for_a_pool_with_kv_and_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="preemption='swap' is modelled only for pools without"):
        ServingCore(SchedulerConfig(preemption="swap"),
                    BlockPool(8, 4, num_kv_heads=1, head_dim=4, num_layers=1))
    with pytest.raises(ValueError, match="lazy must be a bool, got 1"):
        ServingCore(SchedulerConfig(), BlockPool(8, 4), lazy=1)  # type: ignore[arg-type]
    core = ServingCore(SchedulerConfig(), BlockPool(8, 4))
    with pytest.raises(ValueError, match="request id 3 is not the next one"):
        core.add(request(3, 2, 2))
    with pytest.raises(ValueError, match="max_tokens must be"):
        core.add(request(0, 2, 0))
    assert not core.requests and not core.unfinished


def test_a_lazy_caching_core_takes_only_requests_that_share_nothing() -> None:
    core = ServingCore(SchedulerConfig(), PrefixCachingBlockPool(8, 4), lazy=True)
    mine = request(0, 3, 2)
    for bad, why in ((request(0, 3, 2, n=2), "2 samples, cache_salt=None"),
                     (mine, "1 samples, cache_salt=None")):
        with pytest.raises(ValueError, match=f"one sample per request .* got {why}"):
            core.add(bad)
    mine.cache_salt = "a"
    core.add(mine)
    again = request(1, 3, 2)
    again.cache_salt = "a"
    with pytest.raises(ValueError, match="cache_salt='a'"):
        core.add(again)
    assert len(core.requests) == 1
    ServingCore(SchedulerConfig(), BlockPool(8, 4), lazy=True).add(request(0, 3, 2, n=2))


def test_the_last_token_never_counts_against_the_pool() -> None:
    """A 5-token prompt with 4 new tokens holds at most 8 tokens of K/V: 2 blocks of 4."""
    core = ServingCore(SchedulerConfig(), BlockPool(3, 4))
    core.check_fits(request(0, 5, 4))
    with pytest.raises(ValueError, match="needs up to 3 blocks but the pool has 2"):
        core.check_fits(request(0, 5, 5))


@pytest.mark.parametrize("lazy", [False, True])
def test_decodes_sit_out_a_step_when_they_alone_exceed_the_budget(lazy: bool) -> None:
    """Four samples of one request, a budget of 3 tokens: one decode waits each step, the
    budget always holds, and every sample still gets all its tokens."""
    core = ServingCore(SchedulerConfig(max_num_batched_tokens=3), BlockPool(16, 4), lazy=lazy)
    core.add(request(0, 3, 5, n=4))
    steps = 0
    while core.unfinished:
        schedule = core.schedule()
        assert schedule.num_tokens <= 3
        core.retire(core.advance(schedule, None if lazy else draw))
        steps += 1
    assert [len(s.tokens) for s in core.requests[0].samples] == [8] * 4
    assert core.pool.num_used == 0 and steps > 5


def test_a_preempted_request_s_held_decodes_free_budget_for_others() -> None:
    """Priority, a budget of 3: seven decoding samples, so four sit out; then a claim
    preempts the request those held samples belong to. The step must still count only the
    decodes that run (an earlier version handed the prefills the held samples' share and
    computed 4 tokens)."""
    core = ServingCore(SchedulerConfig(policy="priority", max_num_batched_tokens=3),
                       BlockPool(8, 4))
    arrivals = {0: (6, 1, 8, 1), 1: (4, 2, 1, 0), 2: (3, 3, 4, 0), 3: (8, 2, 4, 0)}
    clock = preempted = 0
    while arrivals or core.unfinished:
        if clock in arrivals:
            prompt, n, max_tokens, priority = arrivals.pop(clock)
            queued = request(len(core.requests), prompt, max_tokens, n=n)
            queued.priority = priority
            core.add(queued)
        schedule = core.schedule()
        assert schedule.num_tokens == sum(c.count for c in schedule.chunks) <= 3
        preempted += len(schedule.preempted)
        core.retire(core.advance(schedule, draw))
        clock += 1
    assert preempted and core.pool.num_used == 0


def test_swap_takes_only_requests_of_one_sample() -> None:
    core = ServingCore(SchedulerConfig(preemption="swap"), BlockPool(8, 4))
    with pytest.raises(ValueError, match="preemption='swap' is modelled for requests of one"):
        core.add(request(0, 3, 2, n=2))
    core.add(request(0, 3, 2))
    assert len(core.requests) == 1


def test_a_lazy_core_touches_a_decode_only_at_its_events() -> None:
    """Between block claims a lazy decode is not listed and its tokens catch up later."""
    core = ServingCore(SchedulerConfig(), BlockPool(8, 4), lazy=True)
    core.add(request(0, 3, 9))
    listed = []
    while core.unfinished:
        schedule = core.schedule()
        listed.append(len(schedule.chunks))
        assert schedule.num_tokens == (3 if core.clock == 0 else 1)
        core.retire(core.advance(schedule))
    # the prefill, then claims only for positions 4 and 8 (blocks of 4), in steps 2 and 6
    assert listed == [1, 0, 1, 0, 0, 0, 1, 0, 0]
    assert len(core.requests[0].samples[0].tokens) == 12 and core.pool.num_used == 0


def test_scheduler_claim_keys_follow_the_policy() -> None:
    trace = [Request(0, 1, 1, priority=2), Request(1, 1, 1, priority=0),
             Request(2, 1, 1, priority=1)]
    for policy, order in (("fcfs", [0, 1, 2]), ("priority", [1, 2, 0])):
        scheduler = Scheduler(SchedulerConfig(policy=policy), trace)
        for index in range(3):
            scheduler.arrive(index)
        admitted = [scheduler.admit_next() for _ in range(3)]
        assert sorted(admitted, key=scheduler.claim_key) == order == scheduler.claim_order()
        assert scheduler.in_claim_order(reversed(admitted)) == order
        assert [scheduler.admission_rank(i) for i in admitted] == [1, 2, 3]
    with pytest.raises(ValueError, match="request 5 is not running"):
        scheduler.claim_key(5)
    with pytest.raises(ValueError, match=r"not all of \[0, 5\] are running"):
        scheduler.in_claim_order([0, 5])


def test_the_manager_says_which_sequences_it_holds() -> None:
    manager = PagedKVManager(BlockPool(4, 2))
    manager.add_sequence("a", 3)
    assert manager.holds("a") and not manager.holds("b")


def test_known_hashes_save_work_and_change_nothing() -> None:
    tokens = list(range(12))
    chain = block_hashes(tokens, 4)
    plain, known = (PrefixCachingKVManager(PrefixCachingBlockPool(8, 4)) for _ in range(2))
    plain.add_sequence("a", token_ids=tokens)
    known.add_sequence("a", token_ids=tokens, known=chain[:2])
    assert plain.snapshot() == known.snapshot()
    with pytest.raises(ValueError, match="4 known hashes for 12 tokens"):
        known.add_sequence("b", token_ids=tokens, known=chain + chain[:1])
    with pytest.raises(ValueError, match="known hash must be a 32-byte block hash"):
        known.add_sequence("b", token_ids=tokens, known=[b"short"])
    assert known.sequences == ("a",)


@pytest.mark.parametrize(("ids", "message"), [(range(-1, 3), "token id must be"),
                                              (range(2**64 - 1, 2**64 + 1), "below 2\\*\\*64")])
def test_a_range_of_token_ids_is_checked_by_its_ends(ids: range, message: str) -> None:
    manager = PagedKVManager(BlockPool(4, 2))
    with pytest.raises(ValueError, match=message):
        manager.add_sequence("a", token_ids=ids)
    manager.add_sequence("a", token_ids=range(3))
    assert manager.seq_len("a") == 3


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "abort", "step", "step", "step"]),
                              st.integers(1, 14), st.integers(1, 9), st.integers(1, 3),
                              st.integers(0, 2)), min_size=8, max_size=40),
       caching=st.booleans(), chunked=st.booleans(), budget=st.sampled_from([None, 6, 20]),
       policy=st.sampled_from(["fcfs", "priority"]), block_size=st.sampled_from([2, 4]))
def test_lazy_and_eager_cores_agree_on_any_online_run(ops, caching: bool, chunked: bool,
                                                      budget: int | None, policy: str,
                                                      block_size: int) -> None:
    """Requests added at any time (parallel samples without caching, a salt each with it,
    priorities), aborts and steps, chunked or not, under a budget: the lazy core (positions
    as tokens) makes every decision the eager one makes with the same tokens drawn, and
    both drain clean."""
    config = SchedulerConfig(policy=policy, max_num_batched_tokens=budget)  # type: ignore[arg-type]
    pool_type = PrefixCachingBlockPool if caching else BlockPool
    cores = [ServingCore(config, pool_type(10, block_size), chunked_prefill=chunked, lazy=lazy)
             for lazy in (False, True)]
    if budget is not None and not chunked:
        ops = [op for op in ops if op[0] != "add" or op[1] + op[2] - 1 <= budget]

    def step(core: ServingCore) -> tuple:
        schedule = core.schedule()
        if not core.lazy:  # every chunk is listed: they add up to the step, within budget
            assert schedule.num_tokens == sum(c.count for c in schedule.chunks)
            assert budget is None or schedule.num_tokens <= budget
        new = core.advance(schedule, None if core.lazy else
                           lambda i, r, s: r.append_token(s, len(s.tokens), ()))
        done = [r.request_id for r, finished in core.retire(new) if finished]
        return schedule.admitted, schedule.preempted, schedule.num_tokens, done

    def add(core: ServingCore, prompt: int, max_tokens: int, n: int, priority: int) -> bool:
        tokens = range(prompt)  # without caching, every prompt starts 0, 1, 2, ...
        index = len(core.requests)
        n, salt = (1, f"request {index}") if caching else (n, None)  # a lazy core's terms
        samples = [Sample(f"r{index}.{k}", list(tokens) if not core.lazy else Positions(prompt))
                   for k in range(n)]
        queued = ServingRequest(index, tokens, max_tokens, priority, samples, cache_salt=salt)
        try:
            core.check_fits(queued)
        except ValueError:
            return False
        core.add(queued)
        return True

    for kind, a, b, c, d in ops:
        if kind == "add":
            assert len({add(core, a, b, c, d) for core in cores}) == 1
        elif kind == "abort" and cores[0].unfinished:
            victim = sorted(cores[0].unfinished)[a % len(cores[0].unfinished)]
            for core in cores:
                core.abort(victim)
        elif kind == "step" and cores[0].unfinished:
            assert step(cores[0]) == step(cores[1])
        eager, lazy = cores
        lazy.sync_all()
        assert {s: eager.manager.block_table(s) for s in eager.manager.sequences} == {
            s: lazy.manager.block_table(s) for s in lazy.manager.sequences}
        assert eager.pool.free_blocks() == lazy.pool.free_blocks()
    while cores[0].unfinished:
        assert step(cores[0]) == step(cores[1])
    for eager_request, lazy_request in zip(*(core.requests for core in cores), strict=True):
        assert [list(s.tokens) for s in eager_request.samples] == [
            list(s.tokens[:]) for s in lazy_request.samples]
    assert all(core.pool.num_used == 0 and not core.unfinished for core in cores)
