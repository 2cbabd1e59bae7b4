"""The online engine: arrivals at any step, abort, streaming, prefix caching, chunked prefill,
and steps that either complete or change nothing.

Decode attention is the torch reference here (the kernel path is exercised once, with a
short run, and by ``test_engine.py``); every comparison is against ordinary contiguous
generation, itself checked against ``transformers``.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib.engine.paged_forward as paged_forward
import course_lib.engine.requests as requests_module
from course_lib.engine import (
    GenerationRequest,
    PagedEngine,
    SamplingParams,
    from_hf,
    generate,
    random_model,
    tiny_config,
)
from course_lib.engine.requests import prepare_request
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.scheduler import SchedulerConfig
from course_lib.serving import ServingCore
from tests.frozen_state import freeze

GREEDY = SamplingParams(max_tokens=5)
SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18, 19]  # a shared "system prompt": 2 full blocks of 4


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(num_kv_heads=1), seed=0)


def prompts_with_system(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [SYSTEM + [rng.randrange(128) for _ in range(rng.randint(1, 6))]
            for _ in range(count)]


def engine_for(model, *, blocks: int, caching: bool, budget: int | None,
               **kwargs) -> PagedEngine:
    return PagedEngine(model, num_blocks=blocks, block_size=4, decode_attention="torch",
                       prefix_caching=caching,
                       scheduler=SchedulerConfig(max_num_batched_tokens=budget), **kwargs)


def serve_online(engine: PagedEngine, prompts, params, arrivals) -> list[tuple]:
    """Add prompt i at step arrivals[i] (while others run); the token ids in add order."""
    pending = sorted(zip(arrivals, range(len(prompts)), strict=True))
    ids: dict[int, int] = {}
    step = 0
    while pending or engine.has_unfinished:
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            ids[i] = engine.add_request(prompts[i], params)
        if engine.has_unfinished:
            report = engine.step()
            limit = engine.scheduler_config.max_num_batched_tokens
            assert limit is None or report.num_tokens <= limit
        step += 1
    outputs = engine.outputs()
    return [outputs[ids[i]].token_ids for i in range(len(prompts))]


# --- outputs equal ordinary generation ----------------------------------------------------


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("budget", [None, 6])
@pytest.mark.parametrize("blocks", [40, 9])
def test_random_arrivals_match_contiguous_generation(model, caching, budget, blocks) -> None:
    prompts = prompts_with_system(6, seed=blocks)
    rng = random.Random(blocks + (budget or 0))
    arrivals = sorted(i + rng.randrange(3) for i in range(len(prompts)))
    expected = [o.token_ids for o in generate(model, prompts, GREEDY)]
    engine = engine_for(model, blocks=blocks, caching=caching, budget=budget)
    assert serve_online(engine, prompts, GREEDY, arrivals) == expected
    assert engine.pool.num_used == 0 and not engine.manager.sequences
    stats = engine.stats()
    assert (stats.cached_tokens > 0) == caching
    assert (stats.preemptions > 0) == (blocks == 9)


def test_matches_transformers_greedy_generation() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
        max_position_embeddings=128)).eval()
    prompts = [[*SYSTEM, 1, 2], [*SYSTEM, 3], [40, 41, 42, 43, 44, 45, 46]]
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6,
                              do_sample=False, pad_token_id=0)
        expected.append((tuple(out[0, len(prompt):].tolist()),))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine = PagedEngine(from_hf(hf), num_blocks=10, block_size=4, decode_attention="torch",
                         prefix_caching=True, scheduler=SchedulerConfig(max_num_batched_tokens=5))
    assert serve_online(engine, prompts, params, [0, 2, 3]) == expected


def test_kernel_path_with_chunks_and_decodes_in_one_step(model) -> None:
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    params = SamplingParams(max_tokens=3)
    engine = PagedEngine(model, num_blocks=16, block_size=4,
                         scheduler=SchedulerConfig(max_num_batched_tokens=4))
    engine.add_request(prompts[0], params)
    reports = [engine.step(), engine.step()]
    engine.add_request(prompts[1], params)
    while engine.has_unfinished:
        reports.append(engine.step())
    assert any(r.decoded and r.prefill_tokens for r in reports)  # mixed steps ran
    expected = [o.token_ids for o in generate(model, prompts, params)]
    assert [o.token_ids for o in engine.outputs()] == expected


# --- prefix caching and chunked prefill ----------------------------------------------------


def test_shared_system_prompt_is_computed_once(model) -> None:
    prompts = prompts_with_system(4, seed=1)
    expected = [o.token_ids for o in generate(model, prompts, GREEDY)]
    cold = engine_for(model, blocks=40, caching=False, budget=None)
    warm = engine_for(model, blocks=40, caching=True, budget=None)
    arrivals = [0, 1, 2, 3]  # each after the first has the system prompt cached
    assert serve_online(cold, prompts, GREEDY, arrivals) == expected
    assert serve_online(warm, prompts, GREEDY, arrivals) == expected
    saved = 3 * (len(SYSTEM) // 4 * 4)
    assert warm.stats().cached_tokens == saved
    assert cold.stats().prefill_tokens - warm.stats().prefill_tokens == saved
    together = engine_for(model, blocks=40, caching=True, budget=None)
    assert [o.token_ids for o in together.generate(prompts, GREEDY)] == expected
    assert together.stats().cached_tokens == saved  # shared within the step that computes it


def test_a_fully_cached_prompt_recomputes_its_last_token(model) -> None:
    prompt = list(range(8))  # exactly two blocks of 4
    engine = engine_for(model, blocks=16, caching=True, budget=None)
    first = engine.generate([prompt], GREEDY)
    engine.add_request(prompt, GREEDY)
    report = engine.step()
    assert (report.cached_tokens, report.prefill_tokens) == (4, 4)  # block 2 holds the last
    while engine.has_unfinished:
        engine.step()
    assert engine.outputs()[1].token_ids == first[0].token_ids


def test_chunked_prefill_keeps_every_step_within_the_budget(model) -> None:
    long_prompt = list(range(30))
    engine = engine_for(model, blocks=40, caching=False, budget=7)
    engine.add_request([1, 2, 3], GREEDY)
    engine.step()
    engine.add_request(long_prompt, GREEDY)
    reports = []
    while engine.has_unfinished:
        reports.append(engine.step())
    assert max(r.num_tokens for r in reports) == 7
    assert sum(r.prefill_tokens for r in reports) == 30  # the long prompt, in chunks
    assert any(r.decoded == 1 and r.prefill_tokens == 6 for r in reports)
    expected = generate(model, [[1, 2, 3], long_prompt], GREEDY)
    assert [o.token_ids for o in engine.outputs()] == [o.token_ids for o in expected]


def test_parallel_samples_from_a_short_prompt_respect_the_budget(model) -> None:
    params = SamplingParams(max_tokens=4, n=5, temperature=1.0, seed=3)
    engine = engine_for(model, blocks=40, caching=False, budget=3)
    (out,) = engine.generate([[7, 8]], params)
    (expected,) = generate(model, [[7, 8]], params)
    assert out.token_ids == expected.token_ids


# --- online use: stream and abort ---------------------------------------------------------


def test_stream_yields_each_token_as_it_comes(model) -> None:
    prompts = prompts_with_system(3, seed=2)
    engine = engine_for(model, blocks=40, caching=True, budget=8)
    engine.add_request(prompts[0], GREEDY)
    streamed: dict[int, list[int]] = {}
    reasons = {}
    for update in engine.stream():
        streamed.setdefault(update.request_id, []).extend(update.new_token_ids[0])
        if update.request_id == 0 and len(streamed[0]) == 2:
            engine.add_request(prompts[1], GREEDY)  # arrives while 0 decodes
            engine.add_request(prompts[2], GREEDY)
        if update.finished:
            reasons[update.request_id] = update.output.finish_reasons
            assert update.finish_reasons == update.output.finish_reasons
    expected = generate(model, prompts, GREEDY)
    assert [tuple(streamed[i]) for i in range(3)] == [o.token_ids[0] for o in expected]
    assert reasons == {i: ("length",) for i in range(3)}


def test_abort_frees_at_once_and_leaves_the_others_alone(model) -> None:
    prompts = prompts_with_system(3, seed=3)
    engine = engine_for(model, blocks=40, caching=False, budget=None)
    ids = engine.submit(prompts, GREEDY)
    engine.step()
    engine.step()
    used = engine.pool.num_used
    out = engine.abort(ids[1])
    assert out.finish_reasons == ("abort",) and len(out.token_ids[0]) == 2
    assert engine.pool.num_used == used - engine.manager.blocks_needed(len(prompts[1]) + 1)
    waiting = engine.add_request([1, 2, 3], GREEDY)
    assert engine.abort(waiting).token_ids == ((),)
    with pytest.raises(ValueError, match="not running or waiting"):
        engine.abort(ids[1])
    while engine.has_unfinished:
        engine.step()
    expected = generate(model, [prompts[0], prompts[2]], GREEDY)
    outputs = engine.outputs()
    assert [outputs[0].token_ids, outputs[2].token_ids] == [o.token_ids for o in expected]
    assert engine.pool.num_used == 0


@settings(max_examples=12, deadline=None, derandomize=True)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "abort", "step"]), st.integers(0, 50)),
                    max_size=25),
       caching=st.booleans(), budget=st.sampled_from([None, 3, 9]))
def test_any_add_abort_step_sequence_drains_without_a_leak(model, ops, caching, budget) -> None:
    engine = engine_for(model, blocks=10, caching=caching, budget=budget)
    aborted = set()
    params = SamplingParams(max_tokens=3, n=2, temperature=1.0, seed=0)
    for op, value in ops:
        if op == "add":
            engine.add_request([*SYSTEM[:1 + value % 9], value], params)
        elif op == "abort" and engine.has_unfinished:
            unfinished = list(engine.unfinished)
            request_id = unfinished[value % len(unfinished)]
            engine.abort(request_id)
            aborted.add(request_id)
        elif op == "step" and engine.has_unfinished:
            engine.step()
    while engine.has_unfinished:
        engine.step()
    for output in engine.outputs():
        if output.request_id in aborted:
            assert "abort" in output.finish_reasons
        else:  # the toy model has no end-of-sequence token: every sample runs to length
            assert output.finish_reasons == ("length", "length")
            assert all(len(ids) == 3 for ids in output.token_ids)
    assert engine.pool.num_used == 0 and not engine.manager.sequences


# --- all or nothing ------------------------------------------------------------------------


def engine_state(engine: PagedEngine) -> tuple:
    """Everything the engine holds but the model: every field of the core, its scheduler,
    manager, pool and requests (orders included: the free queue's, each dict's), random
    generators by state, and the K/V a later step reads (every live sequence's, every
    cached block's)."""
    pool, manager = engine.pool, engine.manager
    fields = {k: v for k, v in vars(engine).items() if k != "model"}
    kv = pool._kv
    try:
        pool._kv = None  # free blocks' K/V are garbage; the ones read are compared below
        frozen = freeze(fields)
    finally:
        pool._kv = kv
    layers = range(engine.model.config.num_layers)
    live = [freeze(manager.read_kv(s, layer)) for s in manager.sequences for layer in layers]
    cached = [b for b in range(1, pool.num_blocks)
              if engine.prefix_caching and pool.block_hash(b) is not None]
    return frozen, live, [freeze(pool.kv_cache(layer)[cached]) for layer in layers]


class Injected(RuntimeError):
    pass


def failing_on(call: int, function):
    """``function``, raising Injected on its ``call``-th call (0-based)."""
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] - 1 == call:
            raise Injected(f"injected on call {call}")
        return function(*args, **kwargs)

    return wrapper


def assert_failed_steps_change_nothing(engine: PagedEngine, monkeypatch,
                                       target: tuple[object, str]) -> None:
    """Make ``target`` (an owner and an attribute name) raise on its first call of a step,
    then on its second, and require each failed step to leave the engine as it was."""
    original = getattr(*target)
    for call in (0, 1):
        before = engine_state(engine)
        monkeypatch.setattr(*target, failing_on(call, original))
        with pytest.raises(Injected):
            engine.step()
        monkeypatch.setattr(*target, original)
        assert engine_state(engine) == before


@pytest.mark.parametrize("where", ["kernel", "model", "sampler"])
@pytest.mark.parametrize("caching", [False, True])
def test_a_failed_step_changes_nothing_and_the_run_continues(model, monkeypatch, where,
                                                             caching) -> None:
    prompts = prompts_with_system(4, seed=5)
    params = SamplingParams(max_tokens=5, n=2, temperature=0.9, seed=4)
    expected = [o.token_ids for o in generate(model, prompts, params)]
    engine = PagedEngine(model, num_blocks=12, block_size=4, prefix_caching=caching,
                         scheduler=SchedulerConfig(max_num_batched_tokens=8))
    # the kernel path, with the reference standing in for the interpreted kernel
    monkeypatch.setattr(paged_forward, "paged_attention_decode",
                        lambda *a, check_values: paged_forward.paged_attention_reference(*a))
    for prompt in prompts:
        engine.add_request(prompt, params)
    for _step in range(4):
        engine.step()
    target = {"kernel": (paged_forward, "paged_attention_decode"),
              "model": (type(model.layers[1].mlp), "forward"),
              "sampler": (requests_module, "sample_token")}[where]
    assert_failed_steps_change_nothing(engine, monkeypatch, target)
    while engine.has_unfinished:
        engine.step()
    assert [o.token_ids for o in engine.outputs()] == expected
    assert engine.stats().preemptions > 0 and engine.pool.num_used == 0


# --- what the engine refuses -----------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "dtype", "message"), [
    (dict(head_dim=8, hidden_size=32), torch.float32, "head_dim 8 must be a power of two"),
    (dict(head_dim=20, hidden_size=80), torch.float32, "head_dim 20"),
    ({}, torch.bfloat16, "bfloat16"),
])
def test_kernel_support_is_checked_when_the_engine_is_made(overrides, dtype, message) -> None:
    from course_lib.attention import KERNEL_MODE

    if KERNEL_MODE != "interpreter" and dtype == torch.bfloat16:
        pytest.skip("bfloat16 is refused only by the interpreter")
    odd = random_model(tiny_config(**overrides), seed=0, dtype=dtype)
    with pytest.raises(ValueError, match=message) as error:
        PagedEngine(odd, num_blocks=8, block_size=4)
    assert "decode_attention='torch'" in str(error.value)
    engine = PagedEngine(odd, num_blocks=8, block_size=4, decode_attention="torch")
    assert engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].token_ids[0]


def test_refused_calls_change_nothing(model) -> None:
    engine = engine_for(model, blocks=8, caching=True, budget=None)
    with pytest.raises(ValueError, match="needs up to"):
        engine.add_request(list(range(40)), GREEDY)
    with pytest.raises(ValueError, match="not running or waiting"):
        engine.abort(0)
    with pytest.raises(ValueError, match="prefix_caching must be True or False, got 1"):
        PagedEngine(model, num_blocks=8, prefix_caching=1)  # type: ignore[arg-type]
    assert engine.done and engine.add_request([1, 2], GREEDY) == 0
    with pytest.raises(ValueError, match="either to every GenerationRequest"):
        engine.add_request(GenerationRequest([1]), GREEDY)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=st.data(), caching=st.booleans(), chunked=st.booleans(),
       policy=st.sampled_from(["fcfs", "priority"]), budget=st.sampled_from([None, 4, 11]),
       block_size=st.sampled_from([1, 2, 4]), spare=st.integers(0, 4))
def test_any_schedule_gives_contiguous_outputs(model, data, caching, chunked, policy, budget,
                                               block_size, spare) -> None:
    """Random prompts (some sharing a prefix), arrivals, priorities and samples, under every
    combination of caching, chunking, policy, budget and a tight pool: the outputs are
    ordinary generation's, every step keeps the budget, and the pool drains."""
    count = data.draw(st.integers(1, 5))
    prompts = [data.draw(st.sampled_from([[], SYSTEM[:5]])) +
               data.draw(st.lists(st.integers(0, 127), min_size=1, max_size=6))
               for _ in range(count)]
    params = SamplingParams(max_tokens=data.draw(st.integers(1, 4)), n=data.draw(
        st.integers(1, 2)), temperature=1.0, seed=2)
    if budget is not None and not chunked:
        budget = max(budget, max(len(p) for p in prompts) + params.max_tokens)
    longest = max(len(p) for p in prompts) + params.max_tokens
    blocks = params.n * -(-longest // block_size) + spare + 1
    engine = PagedEngine(model, num_blocks=blocks, block_size=block_size,
                         decode_attention="torch", prefix_caching=caching,
                         chunked_prefill=chunked,
                         scheduler=SchedulerConfig(policy=policy,
                                                   max_num_batched_tokens=budget))
    arrivals = sorted(data.draw(st.integers(0, 4)) for _ in prompts)
    requests = [GenerationRequest(p, params, priority=data.draw(st.integers(0, 2)))
                for p in prompts]
    got = serve_online(engine, requests, None, arrivals)
    assert got == [o.token_ids for o in generate(model, prompts, params)]
    assert engine.pool.num_used == 0 and not engine.manager.sequences


def test_a_failed_step_gives_back_the_cached_blocks_it_overwrote(model, monkeypatch) -> None:
    cached_prompt = list(range(1, 10))  # two full blocks of 4 stay cached after it finishes
    engine = engine_for(model, blocks=6, caching=True, budget=None)  # 5 usable blocks
    (first,) = engine.generate([cached_prompt], SamplingParams(max_tokens=2))
    evicting = engine.add_request(list(range(60, 76)), SamplingParams(max_tokens=1))
    mlp = type(model.layers[1].mlp)
    monkeypatch.setattr(mlp, "forward", failing_on(0, mlp.forward))
    evictions, pool = engine.pool.num_evictions, engine.pool
    cached = [b for b in range(1, pool.num_blocks) if pool.block_hash(b) is not None]
    kv_before = [pool.kv_cache(layer)[cached].clone() for layer in range(2)]
    with pytest.raises(Injected):
        engine.step()  # its prefill took (and wrote) cached blocks before failing
    monkeypatch.undo()
    assert pool.num_evictions == evictions  # rolled back: still cached, K/V as they were
    assert [b for b in range(1, pool.num_blocks) if pool.block_hash(b) is not None] == cached
    for layer, kv in enumerate(kv_before):
        assert torch.equal(pool.kv_cache(layer)[cached], kv)
    engine.abort(evicting)
    again = engine.add_request(cached_prompt, SamplingParams(max_tokens=2))
    report = engine.step()
    assert report.cached_tokens == 8
    while engine.has_unfinished:
        engine.step()
    assert engine.outputs()[again].token_ids == first.token_ids


def test_the_core_schedules_without_a_model_exactly_as_in_the_engine(model) -> None:
    """The simulator's view of the engine: ``ServingCore`` over a pool with no K/V tensors,
    fed the tokens the engine drew, schedules the same chunks, preempts the same requests
    and holds the same block tables and free queue after every step."""
    prompts = prompts_with_system(5, seed=7)
    params = SamplingParams(max_tokens=4, n=2, temperature=1.0, seed=5)
    config = SchedulerConfig(max_num_batched_tokens=7)
    engine = PagedEngine(model, num_blocks=12, block_size=4, decode_attention="torch",
                         prefix_caching=True, scheduler=config)
    core = ServingCore(config, PrefixCachingBlockPool(12, 4))
    assert not core.pool.owns_kv
    arrivals = {0: prompts[:2], 1: prompts[2:3], 3: prompts[3:]}
    step = preemptions = 0
    while step in arrivals or engine.has_unfinished or step < max(arrivals):
        for prompt in arrivals.get(step, ()):
            engine.add_request(prompt, params)
            request = prepare_request(len(core.requests), prompt, params, model.config, None)
            core.check_fits(request)
            core.add(request)
        step += 1
        if not engine.has_unfinished:
            continue
        report = engine.step()
        drawn = {engine.core.requests[u.request_id].samples[k].seq_id: ids[0]
                 for u in report.updates for k, ids in enumerate(u.new_token_ids) if ids}
        schedule = core.schedule()
        assert [(c.sample.seq_id, c.count) for c in schedule.chunks] == list(report.scheduled)
        assert schedule.preempted == report.preempted
        new = core.advance(schedule, lambda i, r, s, drawn=drawn: r.append_token(
            s, drawn[s.seq_id], ()))
        core.retire(new)
        assert new == drawn
        assert {s: core.manager.block_table(s) for s in core.manager.sequences} == {
            s: engine.manager.block_table(s) for s in engine.manager.sequences}
        assert core.pool.free_blocks() == engine.pool.free_blocks()
        preemptions += len(report.preempted)
    assert preemptions > 0 and not core.unfinished and core.pool.num_used == 0
