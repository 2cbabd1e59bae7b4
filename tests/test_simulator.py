"""The decode-step simulator: worked examples, the support-chat figures, invariants, the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from course_lib.__main__ import main
from course_lib.scheduler import Scheduler, SchedulerConfig
from course_lib.simulator import (
    METRICS,
    ROOFLINE_COSTS,
    CostModel,
    SimConfig,
    SimResult,
    simulate,
    simulate_many,
)
from course_lib.slab import Slab, SlabAllocator
from course_lib.workload import Request, save_trace, support_chat


def tiny(allocator: str, slots: int, **kwargs: object) -> SimConfig:
    """A server of ``slots`` one-byte tokens, so budgets read as token counts."""
    return SimConfig(allocator=allocator, budget_bytes=slots, bytes_per_token=1, **kwargs)


# --- worked examples -----------------------------------------------------------------------

PAGED_TRACE = [Request(0, prompt_len=3, output_len=4), Request(1, prompt_len=2, output_len=3)]
PAGED = tiny("paged", 16, block_size=4, max_len=16)  # 4 blocks of 4, 3 usable


def test_paged_example_step_by_step() -> None:
    """A (3+4) and B (2+3) in 3 usable blocks of 4: B needs a block at step 2, none is free,
    so B (the newest) preempts itself, waits for A to finish, and recomputes 4 tokens."""
    result = simulate(PAGED_TRACE, PAGED, record="steps")
    timeline = result.timeline
    assert timeline.batch.tolist() == [2, 2, 1, 1, 1]
    assert timeline.used.tolist() == [7, 9, 6, 7, 5]
    assert timeline.reserved.tolist() == [1, 2, 1, 0, 0]
    assert timeline.internal.tolist() == [0, 1, 1, 1, 3]
    assert timeline.free.tolist() == [4, 0, 4, 4, 4]
    assert timeline.waiting.tolist() == [0, 0, 1, 1, 0]
    assert timeline.next_need.tolist() == [0, 0, 8, 8, 0]  # B resumes at 4 tokens: 2 blocks
    assert timeline.preemptions.tolist() == [0, 0, 1, 0, 0]
    assert (result.steps, result.output_tokens, result.peak_batch, result.kv_tokens) == (
        5, 7, 2, 12)
    assert (result.preemptions, result.preempted_requests, result.recomputed_tokens) == (1, 1, 4)
    assert result.avg_batch == pytest.approx(7 / 5)
    assert result.utilization == pytest.approx(34 / 44)
    assert result.recomputed_share == pytest.approx(4 / 16)
    assert result.last_block_unused == pytest.approx(10 / 7)
    assert result.avg_batch_while_waiting == 1.0
    assert result.reserved_empty_share == pytest.approx(3 / 24)
    assert result.seconds == pytest.approx(0.125)
    assert (result.p50_ttft, result.avg_stall) == (pytest.approx(0.025), pytest.approx(0.05))
    assert result.p50_latency == pytest.approx((0.1 + 0.125) / 2)


def test_paged_example_redraws_the_pool() -> None:
    result = simulate(PAGED_TRACE, PAGED, record="full")
    at_preemption = result.pool_at(2)
    assert at_preemption.tables == {"0": (1, 3)}
    assert at_preemption.seq_lens == {"0": 6}
    assert [b.tokens for b in at_preemption.blocks] == [0, 4, 0, 2]
    assert [b.event for b in at_preemption.blocks] == [None, None, "freed", None]
    assert at_preemption.blocks[0].is_null and at_preemption.num_free == 1
    resumed = result.pool_at(4)
    assert resumed.tables == {"1": (3, 1)}  # 0's (1, 3) went back to the front last first: 3, 1, 2
    assert [b.event for b in resumed.blocks] == [None, "allocated", None, "allocated"]
    assert [b.owners for b in resumed.blocks] == [(), ("1",), (), ("1",)]


def test_reserve_max_example_and_its_arena() -> None:
    trace = [Request(0, 1, 2), Request(1, 2, 3), Request(2, 1, 1)]
    result = simulate(trace, tiny("reserve-max", 10, max_len=5), record="full")
    timeline = result.timeline
    assert timeline.batch.tolist() == [2, 2, 2]
    assert timeline.used.tolist() == [5, 7, 7]
    assert timeline.reserved.tolist() == [3, 1, 0]
    assert timeline.internal.tolist() == [2, 2, 3]
    assert timeline.free.tolist() == [0, 0, 0]
    assert timeline.next_need.tolist() == [5, 5, 0]
    assert (result.stranded_share, result.no_gap_steps, result.block_size) == (0.0, 0, None)
    assert result.last_block_unused is None
    arena = result.arena_at(2)
    assert arena.slabs == {1: Slab(5, 5, 5, 5), 2: Slab(0, 5, 2, 2)}


def test_exact_size_example_finds_free_space_that_no_gap_holds() -> None:
    """Three 4-slot slabs fill 12 slots; W needs 5. Z, then X finish: 8 slots free in two
    gaps of 4, so W waits although the total would hold it."""
    trace = [Request(0, 2, 2), Request(1, 1, 3), Request(2, 3, 1), Request(3, 4, 1)]
    result = simulate(trace, tiny("exact-size", 12, max_len=12), record="full")
    assert result.timeline.batch.tolist() == [3, 2, 1, 1]
    assert result.timeline.stranded.tolist() == [0, 4, 8, 0]
    assert result.timeline.next_need.tolist() == [5, 5, 5, 0]
    assert (result.no_gap_steps, result.stranded_share) == (1, pytest.approx(12 / 36))
    assert result.arena_at(2).gaps() == [(0, 4), (8, 4)]
    assert result.arena_at(3).slabs == {3: Slab(0, 5, 5, 5)}


# --- the source guide's study ------------------------------------------------------------


@pytest.fixture(scope="module")
def study() -> dict[str, SimResult]:
    trace = support_chat()
    return {r.allocator: r for r in simulate_many(
        trace, [SimConfig(allocator=a) for a in ("reserve-max", "exact-size", "paged")],
        progress=False)}


def test_support_chat_reserve_max(study: dict[str, SimResult]) -> None:
    r = study["reserve-max"]
    assert (r.steps, r.peak_batch, r.avg_batch_while_waiting) == (18_379, 60, 60.0)  # 17,663
    assert r.used_share == pytest.approx(0.1246, abs=1e-4)  # guide: 12.3%
    assert r.cost_per_million_tokens == pytest.approx(31.15, abs=0.01)  # guide: about 30
    assert (r.preemptions, r.stranded_share, r.no_gap_steps) == (0, 0.0, 0)


def test_support_chat_exact_size(study: dict[str, SimResult]) -> None:
    r = study["exact-size"]
    assert r.stranded_share == pytest.approx(0.1162, abs=1e-4)  # guide: 13.3%
    assert r.no_gap_steps == 2905  # guide: 2,630
    assert (r.internal_share, r.preemptions) == (0.0, 0)


def test_support_chat_paged(study: dict[str, SimResult]) -> None:
    r = study["paged"]
    assert r.steps == 3737  # guide: 3,334
    assert r.avg_batch_while_waiting == pytest.approx(472.0, abs=0.1)  # guide: about 498
    assert (r.preemptions, r.recomputed_tokens) == (350, 234_124)  # guide: 522, 149,240
    assert r.last_block_unused == pytest.approx(7.5, abs=0.01)  # guide: 7.4
    assert r.utilization > 0.99
    assert r.output_tokens == study["reserve-max"].output_tokens == 1_024_259


def test_block_size_512() -> None:
    r = simulate(support_chat(), SimConfig(block_size=512))
    assert r.last_block_unused == pytest.approx(254.2, abs=0.1)  # guide: 252.7
    assert r.reserved_empty_share == pytest.approx(0.195, abs=1e-3)  # guide: 20.2%
    assert r.avg_batch_while_waiting == pytest.approx(376.8, abs=0.1)  # guide: 397


# --- invariants over random traces and servers ---------------------------------------------


def expected_rejections(trace: list[Request], config: SimConfig) -> set[int]:
    if config.allocator == "paged":
        usable = config.num_blocks - 1
        return {r.id for r in trace if -(-r.total_len // config.block_size) > usable}
    if config.allocator == "exact-size":
        return {r.id for r in trace if r.total_len > config.kv_tokens}
    return set()


def check_run(trace: list[Request], result: SimResult) -> None:
    """Replay every event: each request decodes exactly its reply and finishes once; no slot
    or block is handed out twice or lost; the slot counts add up at every step."""
    config, timeline = result.config, result.timeline
    finals = {r.id: r for r in trace if r.id not in result.rejections}
    decoded = dict.fromkeys(finals, 0)
    finished: list[int] = []
    open_admission: dict[int, tuple[int, int]] = {}
    preempted_length: dict[int, int] = {}
    owner: dict[int, int] = {}
    arena = SlabAllocator(config.kv_tokens, policy=config.allocator, max_len=config.max_len,
                          fit=config.fit) if config.allocator != "paged" else None
    cuts = [0, *timeline.cuts.tolist()]
    for step in range(len(timeline.batch)):
        for event in timeline.events[cuts[step]:cuts[step + 1]]:
            rid = event.request
            if event.kind == "admit":
                assert rid not in open_admission
                assert event.length == preempted_length.pop(rid, finals[rid].prompt_len)
                open_admission[rid] = (event.step, event.length)
                if arena is not None:
                    slab = arena.admit(rid, finals[rid].total_len, event.length)
                    assert (slab.start, slab.size) == event.where
                else:
                    for block in event.where:
                        assert 0 < block < config.num_blocks and block not in owner
                        owner[block] = rid
            elif event.kind == "grow":
                (block,) = event.where
                assert 0 < block < config.num_blocks and block not in owner
                owner[block] = rid
            else:
                start, length = open_admission.pop(rid)
                steps = event.step - start + (event.kind == "finish")
                decoded[rid] += steps
                assert event.length == length + steps
                if event.kind == "finish":
                    finished.append(rid)
                else:
                    preempted_length[rid] = event.length
                if arena is not None:
                    arena.free(rid)
                else:
                    for block in [b for b, r in owner.items() if r == rid]:
                        del owner[block]
        held = (len(owner) * config.block_size if arena is None
                else config.kv_tokens - arena.num_free)
        assert held == result.kv_tokens - timeline.free[step]
    # the finish events of the last step come after its cut
    for event in timeline.events[cuts[-1]:]:
        assert event.kind == "finish"
        start, length = open_admission.pop(event.request)
        decoded[event.request] += event.step - start + 1
        finished.append(event.request)
    assert sorted(finished) == sorted(finals), "every request finishes exactly once"
    assert decoded == {rid: r.output_len for rid, r in finals.items()}
    assert not open_admission
    total = timeline.used + timeline.reserved + timeline.internal + timeline.free
    assert (total == result.kv_tokens).all()
    for column in (timeline.used, timeline.reserved, timeline.internal, timeline.free,
                   timeline.stranded):
        assert (column >= 0).all()
    assert timeline.batch.sum() == result.output_tokens == sum(r.output_len
                                                              for r in finals.values())
    assert result.steps == int((timeline.batch > 0).sum())
    assert result.preemptions == int(timeline.preemptions.sum())
    if config.scheduler.max_num_seqs is not None:
        assert timeline.batch.max() <= config.scheduler.max_num_seqs
    # termination: a step decodes at least one new token (progress is never lost, a resumed
    # request keeps what it generated) unless the server idles until the next arrival
    idle = int((timeline.batch == 0).sum())
    assert idle <= max(r.arrival for r in finals.values())
    assert len(timeline.batch) <= idle + result.output_tokens


traces = st.lists(
    st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(0, 8), st.integers(0, 2)),
    min_size=1, max_size=12,
).map(lambda rows: [Request(i, p, o, a, q) for i, (p, o, a, q) in enumerate(rows)])

schedulers = st.builds(
    SchedulerConfig, policy=st.sampled_from(["fcfs", "priority"]),
    preemption=st.sampled_from(["recompute", "swap"]), max_num_seqs=st.none() | st.integers(1, 4),
    max_num_batched_tokens=st.none() | st.integers(60, 90),
    swap_space_blocks=st.none() | st.integers(0, 6))


@st.composite
def servers(draw: st.DrawFn) -> SimConfig:
    """Small servers, often too small for the trace (so paged runs preempt); reserve-max
    needs room for one 60-slot slab."""
    allocator = draw(st.sampled_from(["reserve-max", "exact-size", "paged", "paged"]))
    slots = draw({"reserve-max": st.integers(60, 180), "exact-size": st.integers(8, 120),
                  "paged": st.integers(8, 64)}[allocator])
    block = draw(st.sampled_from([1, 2, 3, 4, 8]))
    if allocator == "paged" and slots // block < 2:
        block = 1
    return tiny(allocator, slots, block_size=block, max_len=60,
                fit=draw(st.sampled_from(["first", "best"])), scheduler=draw(schedulers))


@settings(max_examples=150, deadline=None)
@given(trace=traces, config=servers())
def test_invariants_hold_on_random_runs(trace: list[Request], config: SimConfig) -> None:
    rejected = expected_rejections(trace, config)
    if len(rejected) == len(trace):
        with pytest.raises(ValueError, match="every request was rejected"):
            simulate(trace, config)
        return
    result = simulate(trace, config, record="full")
    assert set(result.rejections) == rejected
    assert result.requests + result.rejected == len(trace)
    check_run(trace, result)


@settings(max_examples=40, deadline=None)
@given(trace=traces, block=st.sampled_from([1, 2, 4]), slots=st.integers(8, 40))
def test_tight_paged_pools_preempt_and_still_finish(trace: list[Request], block: int,
                                                    slots: int) -> None:
    config = tiny("paged", slots, block_size=block, max_len=60)
    if len(expected_rejections(trace, config)) == len(trace):
        return
    result = simulate(trace, config, record="full")
    target(float(result.preemptions))  # steer towards runs with many preemptions
    check_run(trace, result)


@st.composite
def paged_servers(draw: st.DrawFn) -> SimConfig:
    """Tight paged servers with any scheduler, prefix caching on."""
    block = draw(st.sampled_from([1, 2, 3, 4]))
    slots = draw(st.integers(max(8, 2 * block), 48))
    return tiny("paged", slots, block_size=block, max_len=60, scheduler=draw(schedulers),
                prefix_caching=True)


@settings(max_examples=120, deadline=None)
@given(trace=traces, config=paged_servers())
def test_prefix_caching_keeps_every_invariant(trace: list[Request], config: SimConfig) -> None:
    """With prefix caching on: the run's invariants hold; a resumed request takes back only
    blocks it held itself, a leading run of them, never covering the token its admission
    step computes (vLLM's last-token rule, on the serving core's sequence); and
    without a token budget the schedule is the one without the cache, with the recomputed
    tokens split into those recomputed and those reused."""
    if len(expected_rejections(trace, config)) == len(trace):
        return
    result = simulate(trace, config, record="full")
    target(float(result.reused_tokens))
    check_run(trace, result)
    size = config.block_size
    tables: dict[int, list[int]] = {}
    left_cached: dict[int, list[int]] = {}
    reused = 0
    for event in result.timeline.events:
        if event.kind == "admit":
            hit = list(event.where[:event.cached])
            assert hit == left_cached.get(event.request, [])[:event.cached]
            assert event.cached * size <= event.length
            reused += event.cached * size
            tables[event.request] = list(event.where)
            if event.cached:
                snapshot = result.pool_at(event.step)
                assert all(snapshot.blocks[b].event == "cache-hit" for b in hit)
                assert all(snapshot.blocks[b].cached_hash is not None for b in hit)
        elif event.kind == "grow":
            tables[event.request].extend(event.where)
        else:
            table = tables.pop(event.request)
            if event.kind == "preempt":
                assert event.cached <= event.length // size
                left_cached[event.request] = table[:event.cached]
    assert reused == result.reused_tokens
    if config.scheduler.max_num_batched_tokens is None:
        plain = simulate(trace, replace(config, prefix_caching=False), record="full")
        assert [(e.step, e.kind, e.request, e.length) for e in result.timeline.events] == [
            (e.step, e.kind, e.request, e.length) for e in plain.timeline.events]
        assert result.timeline.batch.tolist() == plain.timeline.batch.tolist()
        if config.scheduler.preemption == "recompute":  # a swap-in's hits save copies
            assert result.recomputed_tokens + result.reused_tokens == plain.recomputed_tokens


def test_a_stuck_server_raises_instead_of_looping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unreachable with the real scheduler (requests that cannot run alone are rejected up
    front); a scheduler that never admits shows the guards (the serving core's for a
    paged run, the slab loop's for a contiguous one) name the request."""
    monkeypatch.setattr(Scheduler, "admits", lambda self, prefill, step: False)
    for config in (PAGED, replace(PAGED, allocator="exact-size")):
        with pytest.raises(RuntimeError, match=r"step 0: request 0 .* cannot be admitted"):
            simulate(PAGED_TRACE, config)


# --- prefix caching for resumed requests ----------------------------------------------------

# A (6 + 10) and B (9 + 6) in 6 usable blocks of 4. B fills its third block at step 2 and
# finds none free at step 3: B (the newest) is preempted with 12 tokens, 3 full blocks. A
# takes B's last block (freed first, so evicted first) at step 6, finishes at step 9, and B
# resumes at step 10 with its first two blocks still cached.
RESUME_TRACE = [Request(0, 6, 10), Request(1, 9, 6)]
RESUME = tiny("paged", 28, block_size=4, max_len=16)


def test_prefix_caching_is_off_by_default_and_changes_nothing_else() -> None:
    assert SimConfig().prefix_caching is False
    plain = simulate(RESUME_TRACE, RESUME, record="full")
    cached = simulate(RESUME_TRACE, replace(RESUME, prefix_caching=True), record="full")
    assert (plain.recomputed_tokens, plain.reused_tokens) == (12, 0)
    assert (cached.recomputed_tokens, cached.reused_tokens) == (4, 8)
    assert cached.recomputed_share == pytest.approx(4 / (15 + 16 + 4))
    assert plain.timeline.batch.tolist() == cached.timeline.batch.tolist()
    assert plain.steps == cached.steps == 13
    preempt = [e for e in cached.timeline.events if e.kind == "preempt"]
    resume = [e for e in cached.timeline.events if e.kind == "admit" and e.step == 10]
    assert [(e.step, e.request, e.length, e.cached) for e in preempt] == [(3, 1, 12, 3)]
    assert [(e.where, e.cached) for e in resume] == [((3, 4, 5, 6), 2)]


def test_prefix_caching_redraws_cached_blocks_and_hits() -> None:
    result = simulate(RESUME_TRACE, replace(RESUME, prefix_caching=True), record="full")
    freed = result.pool_at(3)
    assert [b.event for b in freed.blocks[3:6]] == ["freed"] * 3
    chain = [b.cached_hash for b in freed.blocks[3:6]]
    assert all(chain) and len(set(chain)) == 3
    evicted = result.pool_at(6)  # A's new block is B's old last block: its hash is gone
    assert [b.cached_hash for b in evicted.blocks[3:6]] == [*chain[:2], None]
    assert evicted.tables["0"] == (1, 2, 6, 5)
    # A's blocks were hashed as they filled (as vLLM does), so they wait at the back of the
    # free queue, A's tail first: B's two fresh blocks evict A's last two.
    resumed = result.pool_at(10)
    assert resumed.tables == {"1": (3, 4, 5, 6)}
    assert [b.event for b in resumed.blocks[1:7]] == [None, None, "cache-hit", "cache-hit",
                                                     "evicted", "evicted"]
    assert [b.cached_hash for b in resumed.blocks[3:5]] == chain[:2]
    assert all(b.cached_hash for b in resumed.blocks[1:3])  # A's head, still cached
    plain = simulate(RESUME_TRACE, RESUME, record="full").pool_at(3)
    assert all(b.cached_hash is None for b in plain.blocks)


def test_a_block_boundary_resume_reuses_every_full_block() -> None:
    """B is preempted at exactly 4 tokens, one full block. Resuming, its step processes 5
    tokens (the 4 restored and the one it writes); vLLM's rule keeps only the last of those
    to compute, so the cached block is reused whole and nothing is recomputed."""
    result = simulate(PAGED_TRACE, replace(PAGED, prefix_caching=True), record="full")
    assert (result.recomputed_tokens, result.reused_tokens) == (0, 4)
    assert [e.cached for e in result.timeline.events if e.kind == "preempt"] == [1]


def test_prefix_caching_lowers_the_prefill_a_token_budget_sees() -> None:
    """Step 11, a budget of 16 tokens: request 1 resumes at 12 tokens and request 0 at 5,
    each also computing the token its step writes. Without the cache 13 + 6 > 16, so
    request 0 waits a step; with request 1's three full blocks still cached, 1 + 6 fit
    together. Prefill time counts only computed tokens."""
    trace = [Request(0, 2, 4, arrival=3), Request(1, 4, 9, arrival=2),
             Request(2, 1, 10, arrival=1)]
    config = tiny("paged", 28, block_size=4, max_len=16,
                  scheduler=SchedulerConfig(max_num_batched_tokens=16))
    runs = [simulate(trace, replace(config, prefix_caching=on), record="full")
            for on in (False, True)]
    admits = [[(e.step, e.request, e.cached) for e in r.timeline.events
               if e.kind == "admit" and e.step > 3] for r in runs]
    assert admits == [[(11, 1, 0), (12, 0, 0)], [(11, 1, 3), (11, 0, 0)]]
    assert [(r.recomputed_tokens, r.reused_tokens, r.steps) for r in runs] == [(17, 0, 12),
                                                                                (5, 12, 11)]
    costly = CostModel(step_seconds=0.0, prefill_seconds_per_token=1.0)
    assert simulate(RESUME_TRACE, replace(RESUME, costs=costly)).seconds == 6 + 9 + 12
    assert simulate(RESUME_TRACE, replace(RESUME, costs=costly,
                                          prefix_caching=True)).seconds == 6 + 9 + 4


def test_support_chat_with_prefix_caching(study: dict[str, SimResult]) -> None:
    r = simulate(support_chat(), SimConfig(prefix_caching=True))
    plain = study["paged"]
    assert (r.preemptions, r.steps) == (plain.preemptions, plain.steps)
    assert (r.recomputed_tokens, r.reused_tokens) == (195_356, 38_768)
    assert r.recomputed_tokens + r.reused_tokens == plain.recomputed_tokens


# --- costs, configs, rejections -------------------------------------------------------------


def test_flat_cost_model_is_the_guides_arithmetic() -> None:
    result = simulate(PAGED_TRACE, PAGED)
    assert result.cost_per_million_tokens == pytest.approx(250 * 5 * 0.025 / 3600 / 7 * 1e6)
    assert result.throughput == pytest.approx(7 / 0.125)


def test_cost_model_step_time() -> None:
    costs = CostModel(step_seconds=0.01, kv_read_bandwidth=1e9, prefill_seconds_per_token=1e-3,
                      swap_seconds_per_block=1e-2, pcie_bandwidth=1e6)
    assert costs.step_time(2e9, 5, 3, 4_000_000) == pytest.approx(0.01 + 2 + 0.005 + 0.03 + 4)
    assert CostModel().step_time(1e12, 10**6, 0, 0) == 0.025  # the guide's flat step
    assert ROOFLINE_COSTS.step_time(0, 0, 0, 0) == 0.006


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"step_seconds": -1.0}, "step_seconds must be a non-negative number, got -1.0"),
     ({"kv_read_bandwidth": 0}, "kv_read_bandwidth must be a positive number, got 0"),
     ({"pcie_bandwidth": math.inf}, "pcie_bandwidth must be a positive number, got inf"),
     ({"price_per_hour": "free"}, "price_per_hour must be a non-negative number"),
     ({"step_seconds": 0, "swap_seconds_per_block": 0}, "at least one non-zero time term")],
)
def test_bad_cost_models_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CostModel(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"allocator": "buddy"}, "unknown allocator 'buddy'"),
     ({"fit": "worst"}, "unknown fit 'worst'"),
     ({"block_size": 0}, "block_size must be an integer >= 1, got 0"),
     ({"budget_bytes": 1.5}, "budget_bytes must be an integer >= 1, got 1.5"),
     ({"budget_bytes": 2**20}, "holds 0 blocks of 16 tokens; the pool needs at least 2"),
     ({"scheduler": SchedulerConfig(max_num_batched_tokens=4096)},
      "max_num_batched_tokens=4096 is below max_len=8192"),
     ({"scheduler": {"policy": "fcfs"}}, "scheduler must be a SchedulerConfig"),
     ({"costs": 0.025}, "costs must be a CostModel, got 0.025"),
     ({"prefix_caching": 1}, "prefix_caching must be True or False, got 1"),
     ({"allocator": "reserve-max", "prefix_caching": True},
      "prefix caching needs the paged allocator, got allocator='reserve-max'")],
)
def test_bad_configs_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)


def test_reserve_max_needs_one_max_len_slab() -> None:
    with pytest.raises(ValueError, match="fewer than one max_len=8192 slab"):
        simulate(PAGED_TRACE, SimConfig(allocator="reserve-max", budget_bytes=2**29))


def test_requests_that_never_fit_are_rejected_with_a_reason() -> None:
    trace = [Request(0, 20, 10), Request(1, 1, 1), Request(2, 50, 50)]
    result = simulate(trace, tiny("paged", 32, block_size=4, max_len=60))
    assert result.rejections == {0: "needs 8 blocks of 4, the pool has 7",
                                 2: "needs 100 tokens, above max_len=60"}
    assert (result.requests, result.rejected, result.output_tokens) == (1, 2, 1)
    with pytest.raises(ValueError, match=r"every request was rejected, e\.g\. request 0"):
        simulate(trace[:1], tiny("exact-size", 8, max_len=60))


def test_bad_simulate_arguments() -> None:
    with pytest.raises(ValueError, match="unknown record 'all'"):
        simulate(PAGED_TRACE, PAGED, record="all")
    with pytest.raises(ValueError, match="at least one request"):
        simulate([], PAGED)
    quiet = simulate(PAGED_TRACE, PAGED)
    assert quiet.timeline is None
    with pytest.raises(ValueError, match="record='full'"):
        quiet.pool_at(0)
    full = simulate(PAGED_TRACE, PAGED, record="full")
    with pytest.raises(ValueError, match=r"step must be an integer in \[0, 5\), got 5"):
        full.pool_at(5)
    with pytest.raises(ValueError, match="use pool_at"):
        full.arena_at(0)


def test_steps_recording_is_cheap_and_events_are_optional() -> None:
    result = simulate(PAGED_TRACE, PAGED, record="steps")
    assert result.timeline.events == () and result.timeline.cuts is None
    labels = {"allocator", "block_size", "kv_tokens", "requests", "rejected"}
    assert set(result.as_dict()) == set(METRICS) - {"reused_tokens"} | labels
    cached = simulate(PAGED_TRACE, replace(PAGED, prefix_caching=True))
    assert set(cached.as_dict()) == set(METRICS) | labels


def test_idle_steps_pass_but_are_not_decode_steps() -> None:
    trace = [Request(0, 2, 2), Request(1, 2, 2, arrival=5)]
    result = simulate(trace, PAGED, record="steps")
    assert result.timeline.batch.tolist() == [1, 1, 0, 0, 0, 1, 1]
    assert (result.steps, result.seconds) == (4, pytest.approx(7 * 0.025))
    assert result.p50_latency == pytest.approx(0.05)
    sparse = simulate([Request(0, 2, 2, arrival=10**6)], PAGED)  # idle stretches are skipped
    assert (sparse.steps, sparse.seconds) == (2, pytest.approx((10**6 + 2) * 0.025))


def test_progress_bar_does_not_change_results(capsys: pytest.CaptureFixture[str]) -> None:
    quiet = simulate(PAGED_TRACE, PAGED)
    shown = simulate(PAGED_TRACE, PAGED, progress=True)
    assert quiet.as_dict() == shown.as_dict()
    assert capsys.readouterr().out == ""


# --- the command line ---------------------------------------------------------------------


def test_cli_json_for_the_guides_study(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "support-chat", "--allocator", "paged",
                 "--block-size", "16", "--max-len", "8192", "--budget-gib", "60",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {k: result[k] for k in ("steps", "peak_batch", "preemptions",
                                   "recomputed_tokens")} == {
        "steps": 3737, "peak_batch": 729, "preemptions": 350, "recomputed_tokens": 234_124}
    assert {"avg_batch", "utilization", "swapped_bytes", "p50_latency",
            "p99_latency"} <= set(result)


def test_cli_table_and_own_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_trace(PAGED_TRACE, tmp_path / "mine.json")
    assert main(["simulate", "--trace", str(path), "--allocator", "exact-size",
                 "--budget-gib", "1"]) == 0
    out = capsys.readouterr().out
    assert "decode steps" in out and "exact-size" in out and "mine.json" in out


def test_cli_scheduler_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_trace(PAGED_TRACE, tmp_path / "mine.json")
    args = ["simulate", "--trace", str(path), "--layers", "1", "--kv-heads", "1",
            "--head-dim", "1", "--dtype", "fp32", "--budget-gib", str(128 / 2**30),
            "--block-size", "4", "--max-len", "16", "--json"]
    assert main([*args, "--preemption", "swap", "--policy", "priority",
                 "--max-num-seqs", "2", "--cost-model", "roofline", "--step-ms", "10",
                 "--price-per-hour", "100"]) == 0
    swapped = json.loads(capsys.readouterr().out)
    assert (swapped["preemptions"], swapped["recomputed_tokens"]) == (1, 0)
    assert swapped["swapped_bytes"] == 2 * 4 * 8  # one block of 4 tokens, out and back
    assert (swapped["step_ms"], swapped["price_per_hour"]) == (10, 100)
    assert main([*args, "--swap-space-gib", "0", "--preemption", "swap"]) == 0
    fallback = json.loads(capsys.readouterr().out)
    assert (fallback["swapped_bytes"], fallback["recomputed_tokens"]) == (0, 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--allocator", "paged", "--block-size", "0"], "argument --block-size: must be an "
      "integer from 1 to 65,536, got '0'"),
     (["--budget-gib", "nan"], "argument --budget-gib: must be a number above 0 to 1,048,576, "
      "got 'nan'"),
     (["--swap-space-gib", "-1"], "argument --swap-space-gib: must be a number from 0"),
     (["--max-num-seqs", "0"], "argument --max-num-seqs: must be an integer from 1"),
     (["--max-num-batched-tokens", "100"], "--max-num-batched-tokens 100 is below --max-len"),
     (["--trace", "missing.json"], "trace file 'missing.json' does not exist"),
     (["--trace", "x.json", "--seed", "3"], "--seed cannot be combined with --trace"),
     (["--priority-levels", "0"], "argument --priority-levels: must be an integer from 1")],
)
def test_cli_errors_are_one_line_with_status_2(args: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_cli_prefix_caching(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's --json adds swapped_bytes and the latency percentiles to the chapter-03
    metrics, and reused_tokens only when --prefix-caching is on."""
    args = ["simulate", "--workload", "support-chat", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert {"swapped_bytes", "p50_latency", "p99_latency"} <= set(plain)
    assert "reused_tokens" not in plain
    assert main([*args, "--prefix-caching"]) == 0
    cached = json.loads(capsys.readouterr().out)
    assert (cached["preemptions"], cached["steps"]) == (plain["preemptions"], plain["steps"])
    assert cached["recomputed_tokens"] + cached["reused_tokens"] == plain["recomputed_tokens"]
    assert main(["simulate", "--prefix-caching"]) == 0
    assert "found in prefix cache   38,768 tokens not recomputed" in capsys.readouterr().out
    assert main(["simulate", "--prefix-caching", "--allocator", "exact-size"]) == 2
    assert ("--prefix-caching cannot be combined with --allocator exact-size"
            in capsys.readouterr().err)


def test_simulate_many_keeps_the_order() -> None:
    configs = [replace(PAGED, block_size=b) for b in (4, 2, 1)]
    results = simulate_many(PAGED_TRACE, configs, progress=False)
    assert [r.block_size for r in results] == [4, 2, 1]
    assert all(np.isclose(r.output_tokens, 7) for r in results)


@pytest.mark.parametrize(("order", "reused", "hits"), [("vllm", 38_768, 103),
                                                       ("fifo", 35_744, 95)])
def test_support_chat_prefix_caching_under_each_free_order(order: str, reused: int,
                                                           hits: int) -> None:
    """Chapter 05's comparison: vLLM's free-queue order (unhashed blocks reused first)
    keeps a little more of the victims' caches than the older order, everything to the
    back; little, because every full block is hashed as it fills, so almost every freed
    block has a hash. The schedule is the same; only what resumptions find differs."""
    result = simulate(support_chat(), SimConfig(prefix_caching=True, free_order=order),
                      record="full")
    seen: set[int] = set()
    resumes = with_hit = 0
    for event in result.timeline.events:
        if event.kind == "admit":
            if event.request in seen:
                resumes += 1
                with_hit += event.cached > 0
            seen.add(event.request)
    assert (result.reused_tokens, with_hit, resumes) == (reused, hits, 350)
    assert (result.preemptions, result.steps) == (350, 3737)


def test_an_unknown_free_order_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown free_order 'lru'; expected one of vllm, fifo"):
        SimConfig(free_order="lru")  # type: ignore[arg-type]


@pytest.mark.parametrize(("argv", "message"), [
    (["--against", "no-such-commit"], "--against 'no-such-commit' is not a commit"),
    (["--against", "HEAD", "--rounds", "0"], "argument --rounds: invalid choice: 0"),
])
def test_the_simulator_bench_refuses_a_bad_flag_in_one_line(argv, message, capsys) -> None:
    from tools.bench_simulator import cli

    with pytest.raises(SystemExit) as stop:
        cli(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err
