"""Chapter 10: wrong answers, each with the hint its report must show first, and right
answers of other designs. Each wrong answer is a correct design with one slip switched on;
the kernel exercise's are in ``tests/mutants/ch10_kernel.py``."""

from __future__ import annotations

from typing import Any

import torch

from tests.mutants import Mutant, Right
from tests.mutants.ch10_kernel import KERNEL_MUTANTS, KERNEL_RIGHT

FP8 = "10.fp8_bytes_per_token"
QUANTIZE = "10.quantize"
MLA = "10.mla_bytes"

LAYOUTS = ("tensor", "head", "token-head")


def fp8_bytes(mistake: str = "") -> Any:
    """10.fp8_bytes_per_token; ``mistake`` names the learner's slip."""
    def fn(layers: int, kv_heads: int, head_dim: int, scales: str) -> tuple[int, int]:
        if mistake == "loose_names":
            scales = scales.strip().lower()
        small = min(layers, kv_heads) if mistake == "no_head_dim_check" else min(
            layers, kv_heads, head_dim)
        if mistake != "no_validation" and (scales not in LAYOUTS or small < 1):
            raise ValueError(f"cannot size {layers} layers, {kv_heads} heads, {scales!r}")
        tensors = 1 if mistake == "one_tensor" else 2
        size = 2 if mistake == "two_byte_data" else 1
        heads = 1 if mistake == "per_layer_head_scale" else kv_heads
        count = tensors * layers * (1 if scales == "tensor" else heads)
        data = 2 * layers * kv_heads * head_dim * size
        if scales == "token-head" or mistake == "per_token_scales":
            return data + 4 * count, 0
        return data, 4 * count

    return fn


def fp8_bytes_by_table(layers: int, kv_heads: int, head_dim: int,
                       scales: str) -> tuple[int, int]:
    """Another design: a table of (scales per layer, per token?) by layout."""
    table = {"tensor": (2, False), "head": (2 * kv_heads, False),
             "token-head": (2 * kv_heads, True)}
    if scales not in table or min(layers, kv_heads, head_dim) < 1:
        raise ValueError(f"bad layout {scales!r} or shape")
    per_layer, per_token = table[scales]
    scale_bytes = layers * per_layer * 4
    data = layers * 2 * kv_heads * head_dim
    return (data + scale_bytes, 0) if per_token else (data, scale_bytes)


MAX = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def quantize(mistake: str = "") -> Any:
    """10.quantize; ``mistake`` names the learner's slip."""
    def fn(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
        if fmt not in MAX:
            raise ValueError(f"unknown format {fmt!r}")
        if x.dtype == torch.float64 and mistake != "no_float64_check":
            raise ValueError("float64 x")
        bad = (scale == 0).any() if mistake == "only_zero_scale" else (
            not torch.isfinite(scale).all() or (scale <= 0).any())
        if bad:
            raise ValueError(f"bad scale {scale}")
        if scale.dim() == 1 and scale.shape[0] != x.shape[-2]:
            raise ValueError(f"{scale.shape[0]} scales for {x.shape[-2]} heads")
        dtype, top = MAX[fmt]
        s = scale[:, None] if scale.dim() == 1 and mistake != "last_axis" else scale
        if mistake == "multiply":
            y = x.float() * s
        elif mistake == "bf16_divide":
            y = x / s
        elif mistake == "in_place":
            y = x.float()
            y.div_(s)
        else:
            y = x.float() / s
        if mistake != "no_clamp":
            y = y.clamp(-top, top)
        q = y.to(dtype)
        return q.float() if mistake == "float_return" else q

    return fn


def quantize_by_where(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """Another design: a per-element scale tensor by expand, saturation by torch.where."""
    formats = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    if fmt not in formats or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"cannot quantize {x.dtype} to {fmt!r}")
    if scale.isnan().any() or scale.isinf().any() or scale.le(0).any():
        raise ValueError(f"scale must be finite and positive: {scale}")
    if scale.dim() == 1:
        if x.dim() < 2 or scale.numel() != x.shape[-2]:
            raise ValueError(f"scale of {scale.numel()} for x of shape {tuple(x.shape)}")
        scale = scale.reshape(-1, 1).expand(x.shape[-2], x.shape[-1])
    top = torch.finfo(formats[fmt]).max
    y = x.to(torch.float32) / scale.to(torch.float32)
    y = torch.where(y > top, torch.full_like(y, top), y)
    y = torch.where(y < -top, torch.full_like(y, -top), y)
    return y.to(formats[fmt])


def mla_bytes(mistake: str = "") -> Any:
    """10.mla_bytes; ``mistake`` names the learner's slip."""
    def fn(config: dict[str, int], layout: str) -> int:
        layers, rank = config["num_hidden_layers"], config["kv_lora_rank"]
        rope, heads = config["qk_rope_head_dim"], config["num_attention_heads"]
        if layers < 1:
            raise ValueError(f"num_hidden_layers={layers}")
        rope_count = heads * rope if mistake == "rope_per_head" else rope
        latents = 2 if mistake == "twice" else 1
        if mistake == "no_rope":
            rope_count = 0
        if layout == "flashmla-fp8":
            if rank % 128:
                raise ValueError(f"kv_lora_rank={rank} is not whole tiles of 128")
            scales = 0 if mistake == "no_scales" else rank // 128 * 4
            rope_size = 1 if mistake == "rope_fp8" else 2
            per_layer = latents * rank + scales + rope_count * rope_size
        elif layout in ("bf16", "fp16", "fp32"):
            size = 4 if layout == "fp32" else 2
            per_layer = (latents * rank + rope_count) * size
        else:
            raise ValueError(f"unknown layout {layout!r}")
        return per_layer if mistake == "per_layer" else layers * per_layer

    return fn


def mla_bytes_by_parts(config: dict[str, int], layout: str) -> int:
    """Another design: a list of (numbers, bytes each) parts per layer, summed."""
    rank, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    parts = {"bf16": [(rank, 2), (rope, 2)], "fp16": [(rank, 2), (rope, 2)],
             "fp32": [(rank, 4), (rope, 4)],
             "flashmla-fp8": [(rank, 1), (rank // 128, 4), (rope, 2)]}
    if layout not in parts or (layout == "flashmla-fp8" and rank % 128) \
            or config["num_hidden_layers"] <= 0:
        raise ValueError(f"no {layout!r} layout for {config}")
    return config["num_hidden_layers"] * sum(n * size for n, size in parts[layout])


RIGHT = [
    Right(FP8, "a table of scales per layer by layout", fp8_bytes_by_table),
    Right(QUANTIZE, "an expanded scale and torch.where", quantize_by_where),
    Right(MLA, "a list of (numbers, bytes) parts", mla_bytes_by_parts),
    Right(FP8, "the notebook's design, no mistake switched on", fp8_bytes()),
    Right(QUANTIZE, "the notebook's design, no mistake switched on", quantize()),
    Right(MLA, "the notebook's design, no mistake switched on", mla_bytes()),
    *KERNEL_RIGHT,
]

MUTANTS = [
    Mutant(FP8, "per-tensor and per-head scales counted per token",
           fp8_bytes("per_token_scales"), "calibrated once per layer"),
    Mutant(FP8, "scales for K only", fp8_bytes("one_tensor"), "their own scales"),
    Mutant(FP8, "two bytes per number", fp8_bytes("two_byte_data"), "one byte per number"),
    Mutant(FP8, "a per-head scale once per layer", fp8_bytes("per_layer_head_scale"),
           "one per KV head"),
    Mutant(FP8, "no validation", fp8_bytes("no_validation"), "raise ValueError"),
    Mutant(FP8, "no check of head_dim", fp8_bytes("no_head_dim_check"), "raise ValueError"),
    Mutant(FP8, "layout names taken loosely", fp8_bytes("loose_names"), "raise ValueError"),
    Mutant(QUANTIZE, "no clamp before the cast", quantize("no_clamp"), "saturate"),
    Mutant(QUANTIZE, "multiplies by the scale", quantize("multiply"), "divide by the scale"),
    Mutant(QUANTIZE, "a per-head scale on the last axis", quantize("last_axis"), "axis -2"),
    Mutant(QUANTIZE, "divides a bfloat16 x as it is", quantize("bf16_divide"),
           "divide in float32"),
    Mutant(QUANTIZE, "returns float32 values", quantize("float_return"),
           "return the FP8 tensor itself"),
    Mutant(QUANTIZE, "quantizes float64", quantize("no_float64_check"), "raise ValueError"),
    Mutant(QUANTIZE, "refuses only a zero scale", quantize("only_zero_scale"),
           "raise ValueError"),
    Mutant(QUANTIZE, "divides x in place", quantize("in_place"), "leave x as it is"),
    Mutant(MLA, "the latent counted for K and for V", mla_bytes("twice"), "count it twice"),
    Mutant(MLA, "no rope key", mla_bytes("no_rope"), "rope key (qk_rope_head_dim"),
    Mutant(MLA, "a rope key per head", mla_bytes("rope_per_head"), "shared by every head"),
    Mutant(MLA, "FlashMLA's layout without scales", mla_bytes("no_scales"),
           "one float32 scale per 128"),
    Mutant(MLA, "FlashMLA's rope key in FP8", mla_bytes("rope_fp8"), "rope key in bf16"),
    Mutant(MLA, "one layer's bytes", mla_bytes("per_layer"), "multiply by num_hidden_layers"),
    *KERNEL_MUTANTS,
]
