"""One serving core (issue 14): the simulator and the engine schedule through the same
``ServingCore`` step, so on the same trace they hold the same block tables after every step.

Two comparisons:

* **Simulator against engine.** ``simulate`` (the core in lazy mode over a pool without
  K/V) against ``PagedEngine`` running a tiny model on the CPU (the core in eager mode,
  every token drawn). A simulator request of ``P`` prompt and ``O`` output tokens writes
  the K/V of ``P + 1`` tokens in its admission step (the guide's free prefill, then the
  step's decode), so the engine gets a ``P + 1``-token prompt and ``max_tokens=O`` with
  ``ignore_eos``: the same K/V length after every step. Each prompt starts with its own
  token, so, as the simulator's per-request cache salt does, no two requests share a block.
  Every policy, limit, free order and prefix-caching setting the engine supports is
  compared (the engine preempts by recompute only).
* **Lazy against eager.** The simulator's lazy core against an eager core fed the same
  requests (positions as token ids): lazy mode is an exact shortcut, swap included.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.engine import (
    GenerationRequest,
    PagedEngine,
    SamplingParams,
    random_model,
    tiny_config,
)
from course_lib.paged import BlockPool, FreeOrder
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.scheduler import SchedulerConfig
from course_lib.serving import Sample, ServingCore, ServingRequest
from course_lib.simulator import Positions, SimConfig, SimResult, simulate
from course_lib.workload import Request

MAX_LEN = 40


@dataclass(frozen=True)
class Setting:
    """One server both sides run: the scheduler and the pool's caching and free order."""

    scheduler: SchedulerConfig
    caching: bool = False
    order: FreeOrder = "vllm"


SETTINGS = [
    Setting(SchedulerConfig()),
    Setting(SchedulerConfig(), order="fifo"),
    Setting(SchedulerConfig(max_num_seqs=2)),
    Setting(SchedulerConfig(max_num_batched_tokens=MAX_LEN)),
    Setting(SchedulerConfig(policy="priority")),
    Setting(SchedulerConfig(), caching=True),
    Setting(SchedulerConfig(), caching=True, order="fifo"),
    Setting(SchedulerConfig(policy="priority", max_num_batched_tokens=MAX_LEN, max_num_seqs=3),
            caching=True),
]


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(num_kv_heads=1, num_layers=1), seed=0)


def sim_config(num_blocks: int, block_size: int, setting: Setting) -> SimConfig:
    """The simulator's server: one byte per token, so the budget counts slots."""
    return SimConfig(budget_bytes=num_blocks * block_size, bytes_per_token=1,
                     block_size=block_size, max_len=MAX_LEN, scheduler=setting.scheduler,
                     prefix_caching=setting.caching, free_order=setting.order)


def seeded_trace(seed: int, n: int, usable_tokens: int, priorities: int = 1) -> list[Request]:
    """``n`` requests of random lengths that each fit the pool, a few steps apart."""
    rng = random.Random(seed)
    trace, arrival = [], 0
    for index in range(n):
        arrival += rng.randrange(3)
        prompt, output = rng.randint(1, 12), rng.randint(1, 16)
        while prompt + output > min(usable_tokens, MAX_LEN):
            prompt, output = max(1, prompt // 2), max(1, output // 2)
        trace.append(Request(index, prompt, output, arrival=arrival,
                             priority=rng.randrange(priorities)))
    return trace


def engine_against_simulator(model, trace: list[Request], num_blocks: int, block_size: int,
                             setting: Setting) -> SimResult:
    """Step the engine through ``trace`` beside the simulation, asserting after every step
    that both hold the same block tables (by request), free blocks and preemptions."""
    sim = simulate(trace, sim_config(num_blocks, block_size, setting), record="full")
    assert not sim.rejections
    engine = PagedEngine(model, num_blocks=num_blocks, block_size=block_size,
                         scheduler=setting.scheduler, prefix_caching=setting.caching,
                         decode_attention="torch", chunked_prefill=False,
                         free_order=setting.order)
    trace_id: dict[str, str] = {}
    for step in range(len(sim.timeline.batch)):
        for request in trace:
            if request.arrival == step:
                prompt = [1 + request.id] + [100] * request.prompt_len
                params = SamplingParams(max_tokens=request.output_len, ignore_eos=True)
                queued = GenerationRequest(prompt, params, request.priority)
                trace_id[f"r{engine.add_request(queued)}"] = str(request.id)
        if not engine.has_unfinished:
            assert sim.timeline.batch[step] == 0, f"step {step}"
            continue
        report = engine.step()  # ends by freeing the requests that finished in it
        snapshot = sim.pool_at(step)  # the step's decode, before they are freed
        done = {str(rid) for rid in sim_finished(sim, step)}
        tables = {trace_id[s]: engine.manager.block_table(s) for s in engine.manager.sequences}
        assert tables == {r: t for r, t in snapshot.tables.items() if r not in done}, step
        freed = sum(len(t) for r, t in snapshot.tables.items() if r in done)
        assert engine.pool.num_free == snapshot.num_free + freed, f"step {step}"
        assert len(report.preempted) == sim.timeline.preemptions[step], f"step {step}"
    assert not engine.has_unfinished and engine.pool.num_used == 0
    return sim


def sim_finished(sim: SimResult, step: int) -> list[int]:
    """The requests that wrote their last token in ``step``."""
    return [e.request for e in sim.timeline.events if e.kind == "finish" and e.step == step]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s.scheduler.policy}-"
                         f"seqs{s.scheduler.max_num_seqs}-tok{s.scheduler.max_num_batched_tokens}-"
                         f"{'cache' if s.caching else 'nocache'}-{s.order}")
def test_the_engine_and_the_simulator_hold_the_same_tables_every_step(model,
                                                                      setting: Setting) -> None:
    """Twelve seeded traces per setting in a pool of 6 usable blocks of 4: tight enough that
    requests are preempted and, with caching, resumed requests find their blocks."""
    preemptions = reused = 0
    for seed in range(12):
        trace = seeded_trace(seed, 7, 24, priorities=3)
        sim = engine_against_simulator(model, trace, 7, 4, setting)
        preemptions += sim.preemptions
        reused += sim.reused_tokens
    assert preemptions > 10
    assert (reused > 0) == setting.caching


# --- lazy against eager ---------------------------------------------------------------------


def eager_against_lazy(trace: list[Request], num_blocks: int, block_size: int,
                       setting: Setting) -> SimResult:
    """An eager core fed ``trace`` as the simulator feeds its lazy one, compared with the
    simulation's pool after every step."""
    sim = simulate(trace, sim_config(num_blocks, block_size, setting), record="full")
    assert not sim.rejections
    pool = (PrefixCachingBlockPool if setting.caching else BlockPool)(
        num_blocks, block_size, free_order=setting.order)
    core = ServingCore(setting.scheduler, pool, chunked_prefill=False)
    order = sorted(trace, key=lambda r: (r.arrival, r.id))
    for step in range(len(sim.timeline.batch)):
        for request in order:
            if request.arrival == step:
                core.add(ServingRequest(
                    len(core.requests), range(request.prompt_len + 1), request.output_len,
                    request.priority, [Sample(str(request.id), list(range(request.prompt_len
                                                                          + 1)))],
                    cache_salt=f"simulated request {request.id}"))
        if not core.unfinished:
            continue
        schedule = core.schedule()
        new = core.advance(schedule, lambda i, r, s: r.append_token(s, len(s.tokens), ()))
        snapshot = sim.pool_at(step)
        tables = {s: core.manager.block_table(s) for s in core.manager.sequences}
        assert tables == dict(snapshot.tables), f"step {step}"
        assert pool.num_free == snapshot.num_free, f"step {step}"
        assert len(schedule.preempted) == sim.timeline.preemptions[step], f"step {step}"
        core.retire(new)
    assert not core.unfinished and pool.num_used == 0
    return sim


@settings(max_examples=80, deadline=None)
@given(requests=st.lists(st.tuples(st.integers(1, 16), st.integers(1, 16), st.integers(0, 3),
                                   st.integers(0, 2)), min_size=1, max_size=8),
       block_size=st.sampled_from([1, 2, 4, 8]), spare=st.integers(0, 4),
       policy=st.sampled_from(["fcfs", "priority"]),
       preemption=st.sampled_from(["recompute", "swap"]),
       swap_blocks=st.sampled_from([None, 0, 2]),
       max_num_seqs=st.sampled_from([None, 1, 3]),
       budget=st.sampled_from([None, MAX_LEN]),
       caching=st.booleans(), order=st.sampled_from(["vllm", "fifo"]))
def test_the_lazy_core_is_the_eager_core(requests, block_size: int, spare: int, policy: str,
                                         preemption: str, swap_blocks: int | None,
                                         max_num_seqs: int | None, budget: int | None,
                                         caching: bool, order: FreeOrder) -> None:
    """Any trace and any server, in a pool just big enough for its longest request plus
    ``spare`` blocks: the simulator's lazy core and an eager one agree every step."""
    trace, arrival = [], 0
    for index, (prompt, output, gap, priority) in enumerate(requests):
        arrival += gap
        trace.append(Request(index, prompt, output, arrival=arrival, priority=priority))
    longest = max(r.total_len for r in trace)
    scheduler = SchedulerConfig(policy=policy, preemption=preemption,  # type: ignore[arg-type]
                                max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                swap_space_blocks=swap_blocks)
    eager_against_lazy(trace, -(-longest // block_size) + spare + 1, block_size,
                       Setting(scheduler, caching, order))


def test_positions_are_a_growing_range() -> None:
    tokens = Positions(3)
    tokens.append(99)
    tokens.extend(range(4, 6))
    assert (len(tokens), list(tokens[:]), tokens[-1], list(tokens[2:4])) == (
        6, [0, 1, 2, 3, 4, 5], 5, [2, 3])
