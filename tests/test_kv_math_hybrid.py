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


def test_gemma_3_27b_groups_pad_the_short_window_group() -> None:
    model = HYBRID_MODELS["gemma-3-27b"]
    assert model.layer_counts() == {1024: 52, FULL: 10}
    assert model.windows[5] is FULL and model.windows[4] == 1024
    groups = model.kv_cache_groups()
    assert [len(g.layers) for g in groups] == [10, 10, 10, 10, 10, 2, 10]
    assert {g.slots for g in groups} == {10}
    assert sorted(layer for g in groups for layer in g.layers) == list(range(62))


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
