"""Bytes per token of FP8 caches with their scales and of MLA beside its twins, against
figures worked by hand."""

from __future__ import annotations

import pytest

from course_lib.kv_formats import (
    GQA_TWIN_KV_HEADS,
    ScaleCost,
    fp8_bytes_per_token,
    mla_bytes_per_token,
    mla_capacities,
    mla_layer_bytes,
    scale_cost,
    twin_bytes_per_token,
)
from course_lib.kv_math import GIB, MODELS, capacity
from course_lib.mla import DEEPSEEK_V3, MLAConfig

LLAMA = MODELS["llama-3-8b"]  # 32 layers, 8 KV heads, head_dim 128


def test_per_tensor_and_per_head_scales_cost_nothing_per_token() -> None:
    assert scale_cost(32, 8, "tensor") == ScaleCost(per_token=0, fixed=2 * 32 * 4)
    assert scale_cost(32, 8, "head") == ScaleCost(per_token=0, fixed=2 * 32 * 8 * 4)
    for scales in ("tensor", "head"):
        assert fp8_bytes_per_token(32, 8, 128, scales) == 2 * 32 * 8 * 128 == 65_536


def test_scales_per_token_and_head_cost_about_3_percent_for_llama_3_8b() -> None:
    assert scale_cost(32, 8, "token-head") == ScaleCost(per_token=2 * 32 * 8 * 4, fixed=0)
    total = fp8_bytes_per_token(LLAMA.layers, LLAMA.kv_heads, LLAMA.head_dim, "token-head")
    assert total == 65_536 + 2_048 == 67_584
    assert (total - LLAMA.bytes_per_token("fp8")) / LLAMA.bytes_per_token("fp8") == 0.03125


def test_deepseek_v3_mla_by_hand() -> None:
    assert mla_layer_bytes(DEEPSEEK_V3, "bf16") == (512 + 64) * 2 == 1_152
    assert mla_bytes_per_token(DEEPSEEK_V3) == 1_152 * 61 == 70_272
    assert mla_layer_bytes(DEEPSEEK_V3, "flashmla-fp8") == 512 + 4 * 4 + 64 * 2 == 656
    assert mla_bytes_per_token(DEEPSEEK_V3, "flashmla-fp8") == 656 * 61 == 40_016
    assert mla_bytes_per_token(DEEPSEEK_V3, "fp32") == 576 * 4 * 61


def test_the_twins_by_hand() -> None:
    assert twin_bytes_per_token(DEEPSEEK_V3) == 128 * (192 + 128) * 2 * 61 == 4_997_120
    assert GQA_TWIN_KV_HEADS == 8
    assert twin_bytes_per_token(DEEPSEEK_V3, 8) == 8 * 320 * 2 * 61 == 312_320
    assert twin_bytes_per_token(DEEPSEEK_V3, 128, "fp8") == 4_997_120 // 2


def test_capacities_at_chapter_01s_60_gib() -> None:
    caps = mla_capacities(DEEPSEEK_V3, 60 * GIB)
    assert list(caps) == ["MHA twin, bf16", "GQA twin (8 KV heads), bf16", "MLA, bf16",
                          "MLA, FlashMLA FP8"]
    assert caps["MLA, FlashMLA FP8"] == capacity(40_016, 60 * GIB, 64, 8192)
    assert caps["MLA, FlashMLA FP8"].blocks == 60 * GIB // (40_016 * 64) == 25_155
    assert caps["MLA, bf16"].blocks == 60 * GIB // (70_272 * 64) == 14_324
    assert caps["MHA twin, bf16"].blocks == 60 * GIB // (4_997_120 * 16) == 805
    assert caps["MHA twin, bf16"].max_requests == 1


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: scale_cost(32, 8, "channel"), "channel"),
    (lambda: scale_cost(0, 8, "tensor"), "layers"),
    (lambda: fp8_bytes_per_token(32, -1, 128, "head"), "kv_heads"),
    (lambda: mla_layer_bytes(DEEPSEEK_V3, "fp8_e5m2"), "fp8_e5m2"),
    (lambda: mla_layer_bytes("deepseek-v3", "bf16"), "deepseek-v3"),
    (lambda: mla_layer_bytes(MLAConfig(200, 64, 128, 128, 16, 4), "flashmla-fp8"), "200"),
    (lambda: twin_bytes_per_token(DEEPSEEK_V3, 3), "kv_heads=3"),
    (lambda: twin_bytes_per_token(DEEPSEEK_V3, 0), "kv_heads"),
])
def test_bad_values_raise_naming_them(call: object, needle: str) -> None:
    with pytest.raises(ValueError) as error:
        call()  # type: ignore[operator]
    assert needle in str(error.value)
