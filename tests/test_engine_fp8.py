"""The engine with an FP8 KV cache (chapter 10): twice the blocks in the same bytes, the
same schedule, prefix caching and preemption, the kernel path equal to the torch path, and
steps that either complete or change nothing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_lib.engine.requests as requests_module
from course_lib.attention import KERNEL_MODE
from course_lib.engine import PagedEngine, SamplingParams, random_model, tiny_config
from course_lib.engine.hybrid import HybridEngine
from course_lib.engine.kv_quant import calibrate_kv_scales, kv_cache_accuracy, record_kv
from course_lib.scheduler import SchedulerConfig
from tests.test_engine_online import assert_failed_steps_change_nothing, prompts_with_system

PARAMS = SamplingParams(max_tokens=6, n=2, temperature=0.9, seed=3)


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(), seed=0)


@pytest.fixture(scope="module")
def scales(model):
    return calibrate_kv_scales(model, prompts_with_system(4, seed=1))


def fp8_engine(model, scales, *, blocks: int = 12, caching: bool = True,
               decode_attention: str = "torch") -> PagedEngine:
    return PagedEngine(model, num_blocks=blocks, block_size=4, prefix_caching=caching,
                       decode_attention=decode_attention, kv_cache_dtype="fp8",
                       kv_scales=scales, scheduler=SchedulerConfig(max_num_batched_tokens=8))


def test_the_same_bytes_hold_twice_the_blocks(model) -> None:
    half = random_model(tiny_config(), seed=0, dtype=torch.float16)
    budget = 2**20
    blocks = {dtype: PagedEngine.blocks_in_budget(half, budget, block_size=4,
                                                  kv_cache_dtype=dtype)
              for dtype in ("auto", "fp8", "fp8_e5m2")}
    # 2 layers x 2 KV heads x 16 x 2 (K, V) = 128 numbers a token; 512 per block of 4
    assert blocks == {"auto": 1024, "fp8": 2048, "fp8_e5m2": 2048}
    engine = PagedEngine(half, num_blocks=blocks["fp8"], block_size=4, kv_cache_dtype="fp8",
                         decode_attention="torch")
    cache = engine.pool.kv_cache(0)
    assert cache.dtype == torch.float8_e4m3fn and cache.element_size() == 1
    assert cache.numel() * 2 == budget  # two layers


def test_the_schedule_is_the_full_precision_engines(model, scales) -> None:
    prompts = prompts_with_system(6, seed=2)
    reports = []
    for options in ({}, {"kv_cache_dtype": "fp8", "kv_scales": scales}):
        engine = PagedEngine(model, num_blocks=12, block_size=4, prefix_caching=True,
                             decode_attention="torch",
                             scheduler=SchedulerConfig(max_num_batched_tokens=8), **options)
        for prompt in prompts:
            engine.add_request(prompt, PARAMS)
        steps = []
        while engine.has_unfinished:
            r = engine.step()
            steps.append((r.admitted, r.scheduled, r.cached_tokens, r.preempted, r.free_blocks))
        reports.append((steps, engine.stats()))
    assert reports[0] == reports[1]
    assert reports[1][1].preemptions > 0 and reports[1][1].cached_tokens > 0


@pytest.mark.skipif(KERNEL_MODE == "unavailable", reason="needs Triton")
def test_the_kernel_path_gives_the_torch_paths_tokens(model, scales) -> None:
    prompts = prompts_with_system(3, seed=4)
    params = SamplingParams(max_tokens=4)
    outputs = [[o.token_ids for o in fp8_engine(model, scales, blocks=16,
                                                 decode_attention=attention).generate(prompts,
                                                                                      params)]
               for attention in ("torch", "triton")]
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("where", ["model", "sampler"])
def test_a_failed_step_changes_nothing_and_the_run_continues(model, scales, monkeypatch,
                                                             where) -> None:
    prompts = prompts_with_system(4, seed=5)
    expected = [o.token_ids for o in fp8_engine(model, scales).generate(prompts, PARAMS)]
    engine = fp8_engine(model, scales)
    for prompt in prompts:
        engine.add_request(prompt, PARAMS)
    for _step in range(4):
        engine.step()
    target = {"model": (type(model.layers[1].mlp), "forward"),
              "sampler": (requests_module, "sample_token")}[where]
    assert_failed_steps_change_nothing(engine, monkeypatch, target)
    while engine.has_unfinished:
        engine.step()
    assert [o.token_ids for o in engine.outputs()] == expected
    assert engine.stats().preemptions > 0 and engine.pool.num_used == 0


def test_a_written_token_is_its_quantized_value(model, scales) -> None:
    engine = fp8_engine(model, scales, caching=False)
    prompt = [5, 6, 7, 8, 9, 10]
    engine.add_request(prompt, SamplingParams(max_tokens=2))
    engine.step()  # the prefill wrote every prompt token's K/V
    (table,) = [engine.manager.block_table(s) for s in engine.manager.sequences]
    slots = torch.tensor([table[p // 4] * 4 + p % 4 for p in range(len(prompt))])
    codes = engine.pool.key_cache(0).reshape(-1, 2, 16)[slots]
    k, _ = record_kv(model, [prompt])[0]  # layer 0's K does not depend on the cache
    expected = (k / scales[0, 0]).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(codes.view(torch.uint8), expected.view(torch.uint8))


def test_refusals_name_the_value(model, scales) -> None:
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'int4'; expected one of auto"):
        PagedEngine(model, num_blocks=8, kv_cache_dtype="int4")
    with pytest.raises(ValueError, match=r"kv_scales must be \[num_layers=2, 2\]"):
        PagedEngine(model, num_blocks=8, kv_cache_dtype="fp8", kv_scales=[[1.0, 1.0]])
    with pytest.raises(ValueError, match="kv_scales must be finite and positive"):
        PagedEngine(model, num_blocks=8, kv_cache_dtype="fp8", kv_scales=[[1.0, 0.0]] * 2)
    with pytest.raises(ValueError, match="kv_scales are for an FP8 cache"):
        PagedEngine(model, num_blocks=8, kv_scales=scales)
    with pytest.raises(ValueError, match="with sliding windows is not supported"):
        HybridEngine(model, [4, None], num_blocks=8, kv_cache_dtype="fp8")


def test_accuracy_is_measured_against_the_same_engine_in_full_precision(model, scales) -> None:
    prompts = prompts_with_system(4, seed=6)
    same = kv_cache_accuracy(model, prompts, max_tokens=5, kv_cache_dtype="auto",
                             num_blocks=24, block_size=4, decode_attention="torch")
    assert (same.agreeing, same.compared_steps, same.max_logit_error) == (20, 20, 0.0)
    fp8 = kv_cache_accuracy(model, prompts, max_tokens=5, kv_scales=scales, num_blocks=24,
                            block_size=4, decode_attention="torch")
    assert fp8.tokens == 20 and fp8.compared_steps >= 4 and 0 < fp8.max_logit_error < 0.1


def test_calibrated_scales_put_each_layers_largest_value_on_448(model) -> None:
    prompts = prompts_with_system(3, seed=7)
    recorded = record_kv(model, prompts)
    tokens = sum(map(len, prompts))
    assert [tuple(k.shape) for k, _ in recorded] == [(tokens, 2, 16)] * 2
    scales = calibrate_kv_scales(model, prompts)
    for layer, (k, v) in enumerate(recorded):
        assert torch.allclose(scales[layer] * 448, torch.stack([k.abs().max(), v.abs().max()]))
    with pytest.raises(ValueError, match="token id must be an integer <= 127, got 128"):
        record_kv(model, [[1, 128]])
    with pytest.raises(ValueError, match="at least one prompt, none empty"):
        calibrate_kv_scales(model, [[1], []])


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "abort", "step"]), st.integers(0, 50)),
                    max_size=25))
def test_any_add_abort_step_sequence_drains_an_fp8_pool_without_a_leak(model, scales,
                                                                        ops) -> None:
    engine = fp8_engine(model, scales, blocks=10)
    params = SamplingParams(max_tokens=3, n=2, temperature=1.0, seed=0)
    for op, value in ops:
        if op == "add":
            engine.add_request(prompts_with_system(1, seed=value)[0][:8], params)  # fits 9 blocks
        elif op == "abort" and engine.has_unfinished:
            engine.abort(engine.unfinished[value % len(engine.unfinished)])
        elif op == "step" and engine.has_unfinished:
            engine.step()
    while engine.has_unfinished:
        engine.step()
    assert engine.pool.num_used == 0 and not engine.manager.sequences
