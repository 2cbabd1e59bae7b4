"""The serving cores' own contract (``course_lib.serving``, ``course_lib.lazy_serving``): the
eager and the lazy core, what they refuse, and the pieces they added to the scheduler, the
manager and the pool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.lazy_serving import LazyServingCore
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


def test_the_eager_core_needs_a_draw() -> None:
    core = ServingCore(SchedulerConfig(), BlockPool(8, 4))
    core.add(request(0, 3, 2))
    schedule = core.schedule()
    with pytest.raises(ValueError, match="advance needs a draw, got None"):
        core.advance(schedule, None)  # type: ignore[arg-type]
    core.retire(core.advance(schedule, draw))  # the refused call changed nothing
    assert core.requests[0].samples[0].tokens == [0, 1, 2, 7]


def test_swap_is_refused_for_a_pool_with_kv_and_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="preemption='swap' is modelled only for pools without"):
        ServingCore(SchedulerConfig(preemption="swap"),
                    BlockPool(8, 4, num_kv_heads=1, head_dim=4, num_layers=1))
    with pytest.raises(ValueError, match="chunked_prefill must be a bool, got 1"):
        ServingCore(SchedulerConfig(), BlockPool(8, 4), chunked_prefill=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="closed_loop must be a bool, got 1"):
        LazyServingCore(SchedulerConfig(), BlockPool(8, 4), closed_loop=1)  # type: ignore[arg-type]
    core = ServingCore(SchedulerConfig(), BlockPool(8, 4))
    with pytest.raises(ValueError, match="request id 3 is not the next one"):
        core.add(request(3, 2, 2))
    with pytest.raises(ValueError, match="max_tokens must be"):
        core.add(request(0, 2, 0))
    assert not core.requests and not core.unfinished


def test_a_lazy_core_takes_one_sample_and_with_caching_a_salt_of_its_own() -> None:
    core = LazyServingCore(SchedulerConfig(), PrefixCachingBlockPool(8, 4))
    mine = request(0, 3, 2)
    for bad, why in ((request(0, 3, 2, n=2), "one sample per request; got 2 samples"),
                     (mine, "a cache salt of its own .* got cache_salt=None")):
        with pytest.raises(ValueError, match=why):
            core.add(bad)
    mine.cache_salt = "a"
    core.add(mine)
    again = request(1, 3, 2)
    again.cache_salt = "a"
    with pytest.raises(ValueError, match="cache_salt='a'"):
        core.add(again)
    assert len(core.requests) == 1 and list(core.unfinished) == [0]
    with pytest.raises(ValueError, match="one sample per request; got 2 samples"):
        LazyServingCore(SchedulerConfig(), BlockPool(8, 4)).add(request(0, 3, 2, n=2))
    closed = LazyServingCore(SchedulerConfig(), PrefixCachingBlockPool(8, 4), closed_loop=True)
    closed.add(request(0, 3, 2))  # a closed loop shares blocks: no salt needed
    assert closed.unfinished == {0: None}


def test_the_last_token_never_counts_against_the_pool() -> None:
    """A 5-token prompt with 4 new tokens holds at most 8 tokens of K/V: 2 blocks of 4."""
    core = ServingCore(SchedulerConfig(), BlockPool(3, 4))
    core.check_fits(request(0, 5, 4))
    with pytest.raises(ValueError, match="needs up to 3 blocks but the pool has 2"):
        core.check_fits(request(0, 5, 5))


def test_decodes_sit_out_a_step_when_they_alone_exceed_the_budget() -> None:
    """Four samples of one request, a budget of 3 tokens: one decode waits each step, the
    budget always holds, and every sample still gets all its tokens."""
    core = ServingCore(SchedulerConfig(max_num_batched_tokens=3), BlockPool(16, 4))
    core.add(request(0, 3, 5, n=4))
    steps = 0
    while core.unfinished:
        schedule = core.schedule()
        assert schedule.num_tokens <= 3
        core.retire(core.advance(schedule, draw))
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
    core = LazyServingCore(SchedulerConfig(), BlockPool(8, 4))
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


def test_a_lazy_core_skips_its_quiet_steps_to_the_same_state() -> None:
    """``skip_to`` runs the steps before ``quiet_until`` in one call (block claims in
    order) and leaves the core as stepping through them does; it refuses to go past."""
    stepped, skipped = (LazyServingCore(SchedulerConfig(), PrefixCachingBlockPool(16, 4),
                                        closed_loop=True) for _ in range(2))
    for core in (stepped, skipped):
        for index in range(2):
            core.add(request(index, 3 + index, 12))
        core.retire(core.advance(core.schedule()))
    quiet = skipped.quiet_until()
    assert quiet == stepped.quiet_until() == 11  # request 0 draws its 12th token in step 11
    with pytest.raises(ValueError, match=r"up to quiet_until\(\) \(11\), got 12"):
        skipped.skip_to(quiet + 1)
    skipped.skip_to(quiet)
    while stepped.clock < quiet:
        assert not stepped.retire(stepped.advance(stepped.schedule()))
    for core in (stepped, skipped):
        core.sync_all()
    assert skipped.clock == stepped.clock
    for seq_id in ("r0.0", "r1.0"):
        assert skipped.manager.block_table(seq_id) == stepped.manager.block_table(seq_id)
    assert skipped.pool.free_blocks() == stepped.pool.free_blocks()


def test_known_hashes_are_the_prompt_s_and_only_with_caching() -> None:
    mine = request(0, 9, 2)
    chain = block_hashes(list(mine.prompt), 4)
    with pytest.raises(ValueError, match="3 known_hashes for a prompt of 2 full blocks"):
        LazyServingCore(SchedulerConfig(), PrefixCachingBlockPool(8, 4),
                        closed_loop=True).add(mine, known_hashes=[*chain, chain[0]])
    with pytest.raises(ValueError, match="known_hashes need prefix caching, got 2 hashes"):
        LazyServingCore(SchedulerConfig(), BlockPool(8, 4)).add(mine, known_hashes=chain)
    with pytest.raises(ValueError, match="known_hashes hash"):
        ServingCore(SchedulerConfig(), PrefixCachingBlockPool(8, 4)).add(
            mine, known_hashes=[b"short"])
    core = ServingCore(SchedulerConfig(), PrefixCachingBlockPool(8, 4))
    core.add(mine, known_hashes=chain[:1])
    core.retire(core.advance(core.schedule(), draw))
    assert core.manager.stats().query_tokens == 9


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
                              st.integers(1, 14), st.integers(1, 9), st.integers(0, 2)),
                    min_size=8, max_size=40),
       caching=st.booleans(), budget=st.sampled_from([None, 16, 20]),
       policy=st.sampled_from(["fcfs", "priority"]),
       preemption=st.sampled_from(["recompute", "swap"]), block_size=st.sampled_from([2, 4]))
def test_lazy_and_eager_cores_agree_on_any_online_run(ops, caching: bool, budget: int | None,
                                                      policy: str, preemption: str,
                                                      block_size: int) -> None:
    """Requests added at any time (a salt each with caching, priorities), aborts and steps,
    under a budget, preempting by recompute or swap: the lazy core (positions as tokens)
    makes every decision the eager one makes with the same tokens drawn, its tables caught
    up match after every call, and both drain clean."""
    config = SchedulerConfig(policy=policy, preemption=preemption,  # type: ignore[arg-type]
                             max_num_batched_tokens=budget)
    pool_type = PrefixCachingBlockPool if caching else BlockPool
    eager = ServingCore(config, pool_type(10, block_size), chunked_prefill=False)
    lazy = LazyServingCore(config, pool_type(10, block_size))

    def step() -> tuple:
        schedule = eager.schedule()
        assert schedule.num_tokens == sum(c.count for c in schedule.chunks)
        assert budget is None or schedule.num_tokens <= budget
        new = eager.advance(schedule, lambda i, r, s: r.append_token(s, len(s.tokens), ()))
        done = [r.request_id for r, finished in eager.retire(new) if finished]
        lazy_schedule = lazy.schedule()
        lazy_done = [r.request_id for r in lazy.retire(lazy.advance(lazy_schedule))]
        assert [(s.admitted, s.preempted, s.num_tokens, s.swapped_out, s.swapped_in)
                for s in (schedule, lazy_schedule)] == [
            (lazy_schedule.admitted, lazy_schedule.preempted, lazy_schedule.num_tokens,
             lazy_schedule.swapped_out, lazy_schedule.swapped_in)] * 2
        assert done == lazy_done

    def add(core: ServingCore | LazyServingCore, prompt: int, max_tokens: int,
            priority: int) -> bool:
        index = len(core.requests)
        tokens = range(prompt)  # every prompt starts 0, 1, 2, ...: only its salt is its own
        sample = Sample(f"r{index}", list(tokens) if core is eager else Positions(prompt))
        queued = ServingRequest(index, tokens, max_tokens, priority, [sample],
                                cache_salt=f"request {index}" if caching else None)
        try:
            core.check_fits(queued)
        except ValueError:
            return False
        core.add(queued)
        return True

    for kind, a, b, c in ops:
        if kind == "add":
            assert len({add(core, a, b, c) for core in (eager, lazy)}) == 1
        elif kind == "abort" and eager.unfinished:
            victim = sorted(eager.unfinished)[a % len(eager.unfinished)]
            for core in (eager, lazy):
                core.abort(victim)
        elif kind == "step" and eager.unfinished:
            step()
        lazy.sync_all()
        assert {s: eager.manager.block_table(s) for s in eager.manager.sequences} == {
            s: lazy.manager.block_table(s) for s in lazy.manager.sequences}
        assert eager.pool.free_blocks() == lazy.pool.free_blocks()
    while eager.unfinished:
        step()
    for eager_request, lazy_request in zip(eager.requests, lazy.requests, strict=True):
        assert [list(s.tokens) for s in eager_request.samples] == [
            list(s.tokens[:]) for s in lazy_request.samples]
        assert [s.finish_reason for s in eager_request.samples] == [
            s.finish_reason for s in lazy_request.samples]
    assert not lazy.unfinished and eager.pool.num_used == lazy.pool.num_used == 0


def test_a_core_refuses_an_empty_prompt_or_a_priority_that_is_not_an_integer() -> None:
    for core in (ServingCore(SchedulerConfig(), BlockPool(8, 4)),
                 LazyServingCore(SchedulerConfig(), BlockPool(8, 4))):
        with pytest.raises(ValueError, match="request 0: the prompt holds no token"):
            core.add(ServingRequest(0, (), 2, 0, [Sample("a", [])]))
        with pytest.raises(ValueError, match=r"priority must be an integer, got 1\.5"):
            core.add(ServingRequest(0, (1,), 2, 1.5, [Sample("a", [1])]))  # type: ignore[arg-type]
        assert not core.requests and not core.unfinished and not core.scheduler.num_waiting
    caching = LazyServingCore(SchedulerConfig(), PrefixCachingBlockPool(8, 4))
    with pytest.raises(ValueError, match="priority must be an integer"):
        caching.add(ServingRequest(0, (1,), 2, None, [Sample("a", [1])], "mine"))  # type: ignore[arg-type]
    caching.add(ServingRequest(0, (1,), 2, 0, [Sample("a", [1])], "mine"))  # the salt is free
    assert caching.unfinished == {0: None}
    with pytest.raises(ValueError, match="arrival must be an integer >= 0, got -1"):
        caching.scheduler.enqueue(0, -1)
    assert caching.scheduler.num_waiting == 1
