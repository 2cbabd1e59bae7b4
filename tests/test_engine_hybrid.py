"""Chapter 08's engine: a tiny model alternating window and full layers, served from
KV-cache groups with prefix caching and chunked prefill, equals plain generation with
window masks for requests arriving online; window blocks go back as decode advances."""

from __future__ import annotations

import math
import random

import pytest

from course_lib.engine import SamplingParams, generate, random_model, tiny_config
from course_lib.engine.hybrid import HybridEngine, generate_windowed
from course_lib.scheduler import SchedulerConfig

WINDOWS = [5, None, 5, None]
SYSTEM = list(range(11, 20))  # a shared system prompt: 2 full blocks of 4
GREEDY = SamplingParams(max_tokens=8)


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(num_kv_heads=1, num_layers=4), seed=0)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    return [SYSTEM + [rng.randrange(128) for _ in range(rng.randint(1, 6))] for _ in range(5)]


@pytest.fixture(scope="module")
def expected(model, prompts):
    return generate_windowed(model, WINDOWS, prompts, GREEDY.max_tokens)


def serve_online(engine: HybridEngine, prompts, arrivals, check=None) -> list[list[int]]:
    pending = sorted(zip(arrivals, range(len(prompts)), strict=True))
    ids, step = {}, 0
    while pending or engine.has_unfinished:
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            ids[i] = engine.add_request(prompts[i], GREEDY)
        if engine.has_unfinished:
            report = engine.step()
            if check is not None:
                check(engine, report)
        step += 1
    outputs = engine.outputs()
    return [list(outputs[ids[i]].token_ids[0]) for i in range(len(prompts))]


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("budget, blocks", [(None, 60), (6, 60), (6, 16)])
def test_online_arrivals_match_generation_with_window_masks(model, prompts, expected, caching,
                                                            budget, blocks) -> None:
    rng = random.Random(blocks + (budget or 0))
    arrivals = sorted(i + rng.randrange(3) for i in range(len(prompts)))
    engine = HybridEngine(model, WINDOWS, num_blocks=blocks, block_size=4,
                          decode_attention="torch", prefix_caching=caching,
                          scheduler=SchedulerConfig(max_num_batched_tokens=budget))

    def window_bound(engine: HybridEngine, report) -> None:
        decoding = report.decoded
        held = engine.held_blocks()
        if report.prefill_tokens == 0:  # every sequence decoded: the window bound holds
            assert held[5] <= decoding * (math.ceil(5 / 4) + 1)

    assert serve_online(engine, prompts, arrivals, window_bound) == expected
    assert engine.pool.num_used == 0 and not engine.manager.sequences
    stats = engine.stats()
    assert (stats.cached_tokens > 0) == caching
    assert (stats.preemptions > 0) == (blocks == 16)


def test_window_blocks_go_back_while_full_ones_grow(model) -> None:
    engine = HybridEngine(model, WINDOWS, num_blocks=40, block_size=4,
                          decode_attention="torch")
    engine.add_request(list(range(30)), SamplingParams(max_tokens=12))
    held = []
    while engine.has_unfinished:
        engine.step()
        if engine.has_unfinished:
            held.append(engine.held_blocks())
    assert held[0][5] == 8 and held[0][None] == 8  # the 31-token prefill, in both groups
    assert max(h[5] for h in held[1:]) <= math.ceil(5 / 4) + 1
    assert held[-1][None] > held[0][None]


def test_all_full_windows_are_chapter_07s_generation(model, prompts) -> None:
    engine = HybridEngine(model, [None] * 4, num_blocks=40, block_size=4,
                          decode_attention="torch", prefix_caching=True)
    got = [list(o.token_ids[0]) for o in engine.generate(prompts[:3], GREEDY)]
    assert got == [list(o.token_ids[0]) for o in generate(model, prompts[:3], GREEDY)]


def test_the_triton_kernel_serves_the_window_layers(model, prompts, expected) -> None:
    engine = HybridEngine(model, WINDOWS, num_blocks=40, block_size=4,
                          decode_attention="triton", prefix_caching=True)
    got = [list(o.token_ids[0]) for o in engine.generate(prompts[:2], GREEDY)]
    assert got == expected[:2]


@pytest.mark.parametrize(("windows", "message"), [([5, None], "2 windows"),
                                                  ([5, None, 0, None], "window")])
def test_bad_windows_are_refused(model, windows, message) -> None:
    with pytest.raises(ValueError, match=message):
        HybridEngine(model, windows, num_blocks=40, block_size=4)
    with pytest.raises(ValueError, match=message):
        generate_windowed(model, windows, [[1, 2]], 2)


def test_parallel_samples_fork_every_group(model, prompts, expected) -> None:
    engine = HybridEngine(model, WINDOWS, num_blocks=40, block_size=4,
                          decode_attention="torch", prefix_caching=True)
    output = engine.generate([prompts[0]], SamplingParams(max_tokens=8, n=2))[0]
    assert [list(t) for t in output.token_ids] == [expected[0], expected[0]]
    assert engine.pool.num_used == 0
