"""The decode-step simulator on hybrid models (``SimConfig.model``, chapter 08): a worked
example, the paged simulator's schedule when every layer is full, the window rule and the
slot counts checked against the manager's tables every step, and the refusals."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from course_lib import simulator
from course_lib.hybrid import first_needed_block
from course_lib.kv_math import GIB, HYBRID_MODELS, HybridModel, window_blocks
from course_lib.paged import NULL_BLOCK
from course_lib.scheduler import SchedulerConfig
from course_lib.simulator import ROOFLINE_COSTS, CostModel, SimConfig, SimResult, simulate
from course_lib.workload import Request, support_chat


def tiny_model(*windows: int | None) -> HybridModel:
    """A model of one layer per entry of ``windows``, one KV head of size 1: 4 bytes per
    token per layer in fp16."""
    return HybridModel("tiny", tuple(windows), q_heads=1, kv_heads=1, head_dim=1,
                       source="a test model")


def server(model: HybridModel, blocks: int, block_size: int, **kwargs: object) -> SimConfig:
    """A server of ``blocks`` blocks (the null block included) for ``model``."""
    return SimConfig.for_model(model, budget_bytes=blocks * model.block_bytes(block_size),
                               block_size=block_size, max_len=60, **kwargs)


# --- a worked example ------------------------------------------------------------------------

WINDOWED = tiny_model(4, None)  # a window group (W = 4) and a full group, one layer each


def test_one_request_step_by_step() -> None:
    """P = 3, O = 6, blocks of 4, 7 usable. Each step's chunk starts at position s; the
    window group keeps the blocks from the one holding s - 3. Step 0 holds the prompt and
    its token (4) in both groups; step 1 opens a second block in each; step 4 (s = 7) hands
    back the window's block 0; step 5 (s = 8) opens the third blocks, the last, whose 3
    slots past the final length (9) are internal in both groups."""
    result = simulate([Request(0, 3, 6)], server(WINDOWED, 8, 4), record="steps")
    timeline = result.timeline
    assert result.kv_tokens == 28
    assert timeline.batch.tolist() == [1] * 6
    assert timeline.used.tolist() == [8, 10, 12, 14, 12, 14]  # 2 x L, less the window's
    assert timeline.free.tolist() == [20, 12, 12, 12, 16, 8]  # 2, 4, 4, 4, 3, 5 blocks held
    assert timeline.reserved.tolist() == [0, 6, 4, 2, 0, 0]
    assert timeline.internal.tolist() == [0, 0, 0, 0, 0, 6]
    assert (result.steps, result.output_tokens, result.preemptions) == (6, 6, 0)
    assert result.last_block_unused == pytest.approx((0 + 6 + 4 + 2 + 0 + 6) / 6)


# --- every layer full: the paged simulator's schedule ----------------------------------------

traces = st.lists(
    st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(0, 8), st.integers(0, 2)),
    min_size=1, max_size=10,
).map(lambda rows: [Request(i, p, o, a, q) for i, (p, o, a, q) in enumerate(rows)])

schedulers = st.builds(
    SchedulerConfig, policy=st.sampled_from(["fcfs", "priority"]),
    max_num_seqs=st.none() | st.integers(1, 4),
    max_num_batched_tokens=st.none() | st.integers(60, 90))


COSTS = (CostModel(), ROOFLINE_COSTS, CostModel(step_seconds=0.0, prefill_seconds_per_token=1.0,
                                                kv_read_bandwidth=1e3))
"""Flat steps; steps that read the KV held; only prefill and KV reads (so a time metric
shows a miscounted prefill or slot)."""


def paged_twin(config: SimConfig) -> SimConfig:
    """The same server without the model: the paged simulator, same slot bytes, so the same
    blocks."""
    return replace(config, model=None)


def same_run(hybrid: SimResult, paged: SimResult) -> None:
    """Every metric and every timeline column agree, and the same requests are rejected."""
    assert hybrid.as_dict() == paged.as_dict()
    assert hybrid.rejections.keys() == paged.rejections.keys()
    for name in ("batch", "used", "reserved", "internal", "free", "stranded", "waiting",
                 "next_need", "preemptions"):
        assert getattr(hybrid.timeline, name).tolist() == getattr(paged.timeline, name).tolist()


def rejected(trace: list[Request], config: SimConfig) -> set[int]:
    """Requests that could never run: each group holds the whole sequence when it is
    recomputed at its final length."""
    assert config.model is not None
    groups = len(config.model.kv_cache_groups())
    usable = config.num_blocks - 1
    return {r.id for r in trace if r.total_len > config.max_len
            or groups * math.ceil(r.total_len / config.block_size) > usable}


@settings(max_examples=80, deadline=None, derandomize=True)
@given(trace=traces, layers=st.integers(1, 3), block=st.sampled_from([1, 2, 3, 4]),
       blocks=st.integers(3, 24), scheduler=schedulers, caching=st.booleans(),
       free_order=st.sampled_from(["vllm", "fifo"]), costs=st.sampled_from(COSTS))
def test_a_model_with_every_layer_full_schedules_as_the_paged_simulator(
        trace: list[Request], layers: int, block: int, blocks: int,
        scheduler: SchedulerConfig, caching: bool, free_order: str, costs: CostModel) -> None:
    """Every layer full makes one KV-cache group, whose page is bytes_per_token x
    block_size: the same pool as the paged simulator's, and the eager hybrid core over one
    full group schedules as the lazy plain core does (steps, admissions, preemptions,
    claims), so every metric and every timeline column must agree, prefix caching or not."""
    config = server(tiny_model(*[None] * layers), blocks, block, scheduler=scheduler,
                    prefix_caching=caching, free_order=free_order, costs=costs)
    if len(rejected(trace, config)) == len(trace):
        return
    hybrid = simulate(trace, config, record="steps")
    paged = simulate(trace, paged_twin(config), record="steps")
    same_run(hybrid, paged)


def test_the_support_chat_with_every_layer_full_is_the_paged_run() -> None:
    trace = support_chat()[:40]
    model = HYBRID_MODELS["gpt-oss-20b"].all_full()
    config = SimConfig.for_model(model, budget_bytes=GIB // 8, prefix_caching=True)
    assert config.num_blocks == GIB // 8 // model.block_bytes(16) == 170
    hybrid = simulate(trace, config, record="steps")
    same_run(hybrid, simulate(trace, paged_twin(config), record="steps"))
    assert hybrid.preemptions > 0 and hybrid.reused_tokens > 0


# --- window groups: the tables every step ----------------------------------------------------


class Watch:
    """Runs ``simulate`` with a check of the hybrid run after every step's decode: each
    running request's tables obey the window rule, the pool holds exactly their blocks, and
    the slots the metrics count are the tables' written slots."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[simulator._HybridRun] = []
        decoded = simulator._HybridRun._decoded

        def checked(run: simulator._HybridRun, batch: int) -> None:
            decoded(run, batch)
            if not self.runs or self.runs[-1] is not run:
                self.runs.append(run)
            self.check(run, batch)

        monkeypatch.setattr(simulator._HybridRun, "_decoded", checked)

    @staticmethod
    def check(run: simulator._HybridRun, batch: int) -> None:
        manager, size = run.core.manager, run.config.block_size
        admitted = set(run._pending.admitted)
        held = written = 0
        assert len(run.scheduler.running) == batch
        for index in run.scheduler.running:
            seq_id = run.core.requests[index].samples[0].seq_id
            length = manager.seq_len(seq_id)
            for window, table in zip(manager.windows, manager.block_tables(seq_id),
                                     strict=True):
                assert len(table) == math.ceil(length / size)
                live = [k for k, b in enumerate(table) if b != NULL_BLOCK]
                assert live == list(range(live[0], len(table)))  # nulls lead, then blocks
                if window is None:
                    assert live[0] == 0
                elif index not in admitted:  # a decode at length - 1 freed what it won't read
                    assert live[0] == first_needed_block(length - 1, window, size)
                    assert len(live) == window_blocks(length, window, size)
                    assert len(live) <= math.ceil(window / size) + 1
                held += len(live)
                written += length - live[0] * size
        assert run.core.pool.num_used == held  # no block lost, none shared
        assert run.sum_len == written
        assert run.memory.allocated == held * size

    def simulate(self, trace: list[Request], config: SimConfig) -> SimResult:
        result = simulate(trace, config, record="steps")
        run = self.runs[-1]
        assert run.core.pool.num_used == 0  # no leak
        assert not run.core.unfinished and not run.core.manager.sequences
        for index, request in enumerate(run.core.requests):
            trace_request = run.trace[run.index[index]]
            (sample,) = request.samples
            assert len(sample.tokens) == trace_request.total_len + 1  # P + 1 + O
            assert sample.finish_reason == "length"
        return result


def check_timeline(trace: list[Request], config: SimConfig, result: SimResult) -> None:
    """The run's sums: every request that was not rejected finished with exactly its
    output, and the slot columns add up to the pool."""
    done = [r for r in trace if r.id not in result.rejections]
    assert set(result.rejections) == rejected(trace, config)
    assert result.requests == len(done) and result.rejected == len(trace) - len(done)
    timeline = result.timeline
    assert timeline.batch.sum() == result.output_tokens == sum(r.output_len for r in done)
    assert result.prompt_tokens == sum(r.prompt_len for r in done)
    total = timeline.used + timeline.reserved + timeline.internal + timeline.free
    assert (total == result.kv_tokens).all()
    for column in (timeline.used, timeline.reserved, timeline.internal, timeline.free):
        assert (column >= 0).all()
    assert (timeline.stranded == 0).all() and result.no_gap_steps == 0
    assert result.steps == int((timeline.batch > 0).sum())
    assert result.preemptions == int(timeline.preemptions.sum())
    assert result.swapped_bytes == 0
    if config.scheduler.max_num_seqs is not None:
        assert timeline.batch.max() <= config.scheduler.max_num_seqs
    if not config.prefix_caching:
        assert result.reused_tokens == 0


windows = st.lists(st.none() | st.integers(1, 12), min_size=1, max_size=4)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(trace=traces, layer_windows=windows, block=st.sampled_from([1, 2, 3, 4]),
       blocks=st.integers(3, 40), scheduler=schedulers, caching=st.booleans())
def test_hybrid_runs_keep_the_window_rule_and_every_invariant(
        trace: list[Request], layer_windows: list[int | None], block: int, blocks: int,
        scheduler: SchedulerConfig, caching: bool) -> None:
    """Every step: the window rule, the pool holding exactly the tables' blocks and the
    slots counted as the tables hold them; at the end: nothing held, every request done
    with exactly its output; the refused calls first, which change nothing."""
    config = server(tiny_model(*layer_windows), blocks, block, scheduler=scheduler,
                    prefix_caching=caching)
    given_trace = list(trace)
    refuse_the_unmodelled(trace, config)
    assert trace == given_trace
    if len(rejected(trace, config)) == len(trace):
        with pytest.raises(ValueError, match="every request was rejected"):
            simulate(trace, config)
        return
    with pytest.MonkeyPatch.context() as patch:
        result = Watch(patch).simulate(trace, config)
    target(float(result.preemptions))  # steer towards runs that preempt
    check_timeline(trace, config, result)


def refuse_the_unmodelled(trace: list[Request], config: SimConfig) -> None:
    """Swapping, a contiguous arena and allocation events, each refused for a hybrid model."""
    with pytest.raises(ValueError, match="preemption='recompute' only"):
        replace(config, scheduler=replace(config.scheduler, preemption="swap"))
    with pytest.raises(ValueError, match="needs the paged allocator"):
        replace(config, allocator="exact-size")
    with pytest.raises(ValueError, match="record='full'"):
        simulate(trace, config, record="full")


def test_a_window_model_batches_more_than_its_all_full_twin() -> None:
    """gpt-oss-20b's pages hold half its layers, so the same budget has twice the blocks;
    its window group frees all but a few blocks per chat. It runs more chats per step, in
    fewer steps, with fewer preemptions."""
    trace = support_chat()[:60]
    model = HYBRID_MODELS["gpt-oss-20b"]
    hybrid, full = (simulate(trace, SimConfig.for_model(m, budget_bytes=GIB // 4,
                                                        prefix_caching=True))
                    for m in (model, model.all_full()))
    assert (hybrid.config.num_blocks, full.config.num_blocks) == (682, 341)
    assert hybrid.output_tokens == full.output_tokens == sum(r.output_len for r in trace)
    assert hybrid.avg_batch > full.avg_batch and hybrid.steps < full.steps
    assert hybrid.preemptions < full.preemptions
    assert hybrid.used_share < full.used_share  # the window's old tokens are not kept


# --- refusals --------------------------------------------------------------------------------

OSS = HYBRID_MODELS["gpt-oss-20b"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"model": "gpt-oss-20b"}, "model must be a HybridModel or None, got 'gpt-oss-20b'"),
     ({"model": OSS, "allocator": "exact-size"},
      "a hybrid model needs the paged allocator, got allocator='exact-size'"),
     ({"model": OSS, "bytes_per_token": 24576,
       "scheduler": SchedulerConfig(preemption="swap")},
      "preemption='recompute' only .* got preemption='swap'"),
     ({"model": OSS}, r"bytes_per_token=131072 is not one token of one KV-cache group's page "
                      r"of gpt-oss-20b \(49152 \(fp32\), 24576 \(fp16/bf16\), "
                      r"12288 \(fp8/fp8_e4m3/fp8_e5m2\)\); build the config with "
                      r"SimConfig.for_model"),
     ({"model": OSS, "bytes_per_token": 24576, "budget_bytes": 2**18},
      "holds 0 blocks of 16 tokens")],
)
def test_bad_hybrid_configs_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)


def test_for_model_sets_the_slot_and_refuses_what_is_not_a_model() -> None:
    config = SimConfig.for_model(OSS, "fp8", budget_bytes=GIB)
    assert config.bytes_per_token == 12 * 2 * 8 * 64 * 1 == OSS.block_bytes(1, "fp8")
    assert config.num_blocks == GIB // OSS.block_bytes(16, "fp8")
    with pytest.raises(ValueError, match="model must be a HybridModel, got 'gpt-oss-20b'"):
        SimConfig.for_model("gpt-oss-20b")
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        SimConfig.for_model(OSS, "int4")


TRACE = [Request(0, 3, 6), Request(1, 5, 4)]


def test_refused_calls_change_nothing() -> None:
    """record='full' and pool_at are refused for a hybrid run before anything runs; the
    trace and the next run are as they were."""
    config = server(WINDOWED, 8, 4)
    trace = list(TRACE)
    before = simulate(trace, config, record="steps")
    with pytest.raises(ValueError, match=r"record='full' .* use record='steps'"):
        simulate(trace, config, record="full")
    with pytest.raises(ValueError, match="pool_at is not modelled for a hybrid model's run"):
        before.pool_at(0)
    assert trace == TRACE
    after = simulate(trace, config, record="steps")
    assert after.as_dict() == before.as_dict()
    assert np.array_equal(after.timeline.used, before.timeline.used)


def test_requests_too_big_for_every_group_are_rejected_with_a_reason() -> None:
    """A request of 9 tokens needs 3 blocks of 4 in each of two groups: 6 > 5 usable."""
    result = simulate([Request(0, 3, 6), Request(1, 1, 1)], server(WINDOWED, 6, 4))
    assert result.rejections == {0: "needs 6 blocks of 4 (2 KV-cache groups), the pool has 5"}
    assert (result.requests, result.output_tokens) == (1, 1)

