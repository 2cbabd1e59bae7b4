"""Chapter 08's arithmetic: hybrid models' bytes per token, KV-cache groups and capacity."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.__main__ import main
from course_lib.kv_math import (
    FULL,
    GIB,
    HYBRID_MODELS,
    HybridModel,
    hybrid_capacity,
    hybrid_model,
    reserved_blocks,
    vllm_max_concurrency,
    window_blocks,
    window_tokens,
)

GPT_OSS_20B_LAYER_BYTES = 2 * 8 * 64 * 2  # K and V, 8 KV heads, head_dim 64, bf16


def test_gpt_oss_20b_bytes_at_8k() -> None:
    model = HYBRID_MODELS["gpt-oss-20b"]
    assert model.layer_counts() == {128: 12, FULL: 12}
    assert model.windows[:2] == (128, FULL)  # layer 0 slides, layer 1 is full
    assert model.kv_bytes(8192) == (12 * 8192 + 12 * 128) * GPT_OSS_20B_LAYER_BYTES
    assert model.all_full().kv_bytes(8192) == 24 * 8192 * GPT_OSS_20B_LAYER_BYTES


def test_gemma_3_27b_window_layers_are_dealt_round_robin() -> None:
    """vLLM's ``layers[i::num_groups]``: 52 window layers in six groups of 9, 9, 9, 9, 8, 8
    (the simple fill would give 10, 10, 10, 10, 10, 2), every group with ten slots."""
    model = HYBRID_MODELS["gemma-3-27b"]
    assert model.layer_counts() == {1024: 52, FULL: 10}
    assert model.windows[5] is FULL and model.windows[4] == 1024
    groups = model.kv_cache_groups()
    assert [len(g.layers) for g in groups] == [9, 9, 9, 9, 8, 8, 10]
    window_layers = [layer for layer, window in enumerate(model.windows) if window == 1024]
    assert [g.layers for g in groups[:6]] == [tuple(window_layers[i::6]) for i in range(6)]
    assert {g.slots for g in groups} == {10}
    assert sorted(layer for g in groups for layer in g.layers) == list(range(62))
    assert [len(g.layers) for g in model.kv_cache_groups("fill")] == [10, 10, 10, 10, 10, 2, 10]


VLLM_PAGE = 16 * 2 * 64 * 4 * 2
"""vLLM's test page: 16 tokens x 2 KV heads x head 64 x fp32 x (K, V), one layer."""


def _vllm_model(full: int, window: int) -> HybridModel:
    """``full`` full layers then ``window`` sliding-window layers, as vLLM's tests list them
    (``new_kv_cache_spec()`` then ``new_sliding_window_spec()``: 2 KV heads, head 64)."""
    return HybridModel("vllm test", (FULL,) * full + (1,) * window, 2, 2, 64, "vLLM tests")


@pytest.mark.parametrize(("full", "window", "budget_layers", "groups", "blocks"), [
    (1, 1, 2, [[0], [1]], 64),
    (2, 4, 2, [[0, 1], [2, 4], [3, 5]], 32),
    (3, 7, 3, [[0, 1, 2], [3, 6, 9], [4, 7], [5, 8]], 32),
    (6, 5, 6, [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], 32),
])
def test_groups_and_blocks_match_vllms_tests(full: int, window: int, budget_layers: int,
                                             groups: list[list[int]], blocks: int) -> None:
    """vLLM's ``test_get_kv_cache_config_one_worker`` (tests/v1/core/test_kv_cache_utils.py):
    its hybrid cases' groups (layers renumbered from 0) and block counts for a budget of
    ``budget_layers * 32`` one-layer pages. 6 full + 5 window layers: the kinds' counts are
    within 1.5x, so two groups of six slots and 32 blocks, where filling groups of the
    rarest kind's count would make three groups of five and 38 blocks."""
    model = _vllm_model(full, window)
    assert model.layer_bytes_per_token("fp32") * 16 == VLLM_PAGE
    assert [list(g.layers) for g in model.kv_cache_groups()] == groups
    cap = hybrid_capacity(model, VLLM_PAGE * budget_layers * 32, 16, 16, "fp32")
    assert cap.blocks == blocks
    if (full, window) == (6, 5):
        fill = model.kv_cache_groups("fill")
        assert [len(g.layers) for g in fill] == [5, 1, 5]
        assert VLLM_PAGE * 6 * 32 // (fill[0].slots * VLLM_PAGE) == 38


def test_max_concurrency_matches_vllms_test() -> None:
    """vLLM's ``test_get_max_concurrency_for_kv_cache_config``: max_model_len 16,384,
    max_num_batched_tokens 1,024, blocks of 16, a window of 1,024. A window group budgets
    ceil((1,024 - 1 + 1,024) / 16) + 1 = 129 blocks a request, where it holds 64 once it
    decodes: 387 blocks are 3 requests to vLLM and 6 in the steady state."""
    def model(windows: tuple[int | None, ...]) -> HybridModel:
        return HybridModel("vllm test", windows, 32, 32, 128, "vLLM tests")

    full, window, both = model((FULL,) * 32), model((1024,) * 32), model((FULL, 1024) * 32)
    assert reserved_blocks(16384, 1024, 16, 1024) == 129
    assert reserved_blocks(16384, FULL, 16, 1024) == 1024
    assert vllm_max_concurrency(full, int(1024 * 1.5), 16384, 1024) == 1.5
    assert vllm_max_concurrency(window, 129 * 3, 16384, 1024) == 3
    assert vllm_max_concurrency(both, (1024 + 129) * 3, 16384, 1024) == 3
    assert 129 * 3 // window.blocks_per_request(16384, 16) == 6


@given(window=st.integers(1, 300), tokens=st.integers(1, 3000), batched=st.integers(1, 3000),
       block_size=st.integers(1, 40))
def test_vllms_reservation_covers_every_decode_step(window: int, tokens: int, batched: int,
                                                    block_size: int) -> None:
    """What vLLM budgets a window group is never below what the group holds at any length
    up to the maximum (the course's steady-state count)."""
    held = max(window_blocks(n, window, block_size) for n in range(1, tokens + 1))
    assert reserved_blocks(tokens, window, block_size, batched) >= held


@pytest.mark.parametrize("name", list(HYBRID_MODELS))
def test_presets_fit_more_long_requests_with_window_freeing(name: str) -> None:
    model = hybrid_model(name)
    for tokens in (8192, 32768, 131072):
        cap = hybrid_capacity(model, 60 * GIB, tokens)
        assert cap.max_requests > cap.max_requests_no_freeing
        assert cap.blocks * cap.block_bytes <= 60 * GIB < (cap.blocks + 1) * cap.block_bytes
        assert cap.blocks // cap.blocks_per_request == cap.max_requests


def test_gpt_oss_without_freeing_is_the_all_full_model() -> None:
    model = HYBRID_MODELS["gpt-oss-20b"]
    for tokens in (8192, 32768, 131072):
        hybrid = hybrid_capacity(model, 60 * GIB, tokens)
        full = hybrid_capacity(model.all_full(), 60 * GIB, tokens)
        assert hybrid.max_requests_no_freeing == full.max_requests


@given(tokens=st.integers(0, 600), window=st.one_of(st.none(), st.integers(1, 200)),
       block_size=st.integers(1, 40))
def test_window_blocks_counts_the_blocks_the_last_w_tokens_touch(
        tokens: int, window: int | None, block_size: int) -> None:
    kept = window_tokens(tokens, window)
    touched = {pos // block_size for pos in range(tokens - kept, tokens)}
    assert window_blocks(tokens, window, block_size) == len(touched)
    if window is None:
        assert len(touched) == math.ceil(tokens / block_size)
    else:
        assert len(touched) <= math.ceil(window / block_size) + 1


@given(window=st.integers(1, 300), small=st.integers(1, 2000), extra=st.integers(0, 2000))
def test_bytes_per_token_never_grows_with_the_context(window: int, small: int,
                                                      extra: int) -> None:
    model = HybridModel("m", (window, FULL), 4, 2, 16, "test")
    assert model.bytes_per_token(small + extra) <= model.bytes_per_token(small)
    assert model.bytes_per_token(small + extra) >= model.layer_bytes_per_token()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: hybrid_model("gpt-5"), "gpt-5"),
    (lambda: HybridModel("m", (), 4, 2, 16, "s"), "windows"),
    (lambda: HybridModel("m", (0, FULL), 4, 2, 16, "s"), "window"),
    (lambda: HybridModel("m", (8, FULL), 3, 2, 16, "s"), "q_heads"),
    (lambda: window_tokens(-1, 8), "num_tokens"),
    (lambda: window_blocks(4, 8, 0), "block_size"),
    (lambda: HYBRID_MODELS["gpt-oss-20b"].bytes_per_token(0), "num_tokens"),
    (lambda: hybrid_capacity(HYBRID_MODELS["gpt-oss-20b"], 0, 8), "budget_bytes"),
    (lambda: hybrid_capacity("gpt-oss-20b", GIB, 8), "HybridModel"),
    (lambda: HYBRID_MODELS["gpt-oss-20b"].kv_cache_groups("vLLM"), "vLLM"),
    (lambda: reserved_blocks(0, 8, 4, 16), "max_model_len"),
    (lambda: reserved_blocks(16, 8, 4, 0), "max_num_batched_tokens"),
    (lambda: vllm_max_concurrency("gpt-oss-20b", 10, 16, 16), "HybridModel"),
    (lambda: vllm_max_concurrency(HYBRID_MODELS["gpt-oss-20b"], -1, 16, 16), "num_blocks"),
])
def test_bad_values_raise_naming_them(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_kv_size_hybrid_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv-size", "--hybrid", "gpt-oss-20b", "--max-len", "32768",
                 "--budget-gib", "60", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    expected = hybrid_capacity(HYBRID_MODELS["gpt-oss-20b"], 60 * GIB, 32768)
    assert result["max_requests"] == expected.max_requests
    assert result["max_requests_no_freeing"] == expected.max_requests_no_freeing
    assert result["groups"] == ["window 128", "full"]


@pytest.mark.parametrize(("args", "flag"), [
    (["--hybrid", "gpt-oss-20b", "--layers", "12"], "--layers"),
    (["--hybrid", "gpt-oss-20b", "--budget-gib", "0.0001"], "--budget-gib"),
    (["--hybrid", "llama"], "--hybrid"),
])
def test_kv_size_hybrid_refusals_name_the_flag(args: list[str], flag: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["kv-size", *args])
    except SystemExit as done:  # argparse's own refusals
        status = done.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and flag in err and err.count("\n") == 1
