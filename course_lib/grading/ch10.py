"""Chapter 10 exercises: fewer bytes per token. Expected values come from ``kv_formats`` and
``fp8``; the fourth, the Triton decode kernel over an FP8 cache, is
``ch10_kernel.FP8_DECODE``.

1. ``10.fp8_bytes_per_token``: an FP8 cache's bytes per token and its scales' bytes for
   each scale layout (what per-token scales cost, and when scales cost nothing per token).
2. ``10.quantize``: FP8 quantization with a per-tensor or per-head scale, saturating in
   both formats (E5M2's cast alone overflows to inf), dividing in float32.
3. ``10.mla_bytes``: an MLA model's cache bytes per token from its config, in one dtype or
   in FlashMLA's FP8 layout.

Every case recognises the values the usual slips give on its inputs, so a wrong answer is
told which slip it looks like.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from course_lib.fp8 import FP8_FORMATS, quantize
from course_lib.grading.ch10_kernel import FP8_DECODE
from course_lib.grading.check import Case, Exercise, Raises, labelled, recognising
from course_lib.kv_formats import (
    FLASHMLA_FP8_TILE,
    SCALE_BYTES,
    SCALE_LAYOUTS,
    mla_bytes_per_token,
    scale_cost,
)
from course_lib.kv_math import bytes_per_token
from course_lib.mla import DEEPSEEK_V3, MLAConfig

# --- exercise 1: bytes per token of an FP8 cache, scales included ----------------------------

FP8_LABELS = ("bytes per token", "scale bytes for the whole cache")

PER_TOKEN_SCALES = ("a scale per tensor or per head is calibrated once per layer: it costs "
                    "bytes once for the whole cache, none per token")
BOTH_TENSORS = ("K and V each have their own scales, and a scale is a float32: 2 x 4 bytes "
                "for each scaled head or tensor")
ONE_BYTE = "an FP8 cache stores one byte per number"
PER_HEAD = "a scale per head means one per KV head in every layer"


def _fp8_expected(layers: int, kv_heads: int, head_dim: int, scales: str) -> dict[str, int]:
    cost = scale_cost(layers, kv_heads, scales)
    return dict(zip(FP8_LABELS, (bytes_per_token(layers, kv_heads, head_dim, "fp8")
                                 + cost.per_token, cost.fixed), strict=True))


def _fp8_mistakes(layers: int, kv_heads: int, head_dim: int,
                  scales: str) -> list[tuple[Any, str]]:
    """What each recognised slip gives, with its hint."""
    data = 2 * layers * kv_heads * head_dim
    per_scale = {"tensor": 2 * layers, "head": 2 * layers * kv_heads,
                 "token-head": 2 * layers * kv_heads}[scales]
    token = scales == "token-head"

    def pair(per_token: int, fixed: int) -> dict[str, int]:
        return dict(zip(FP8_LABELS, (per_token, fixed), strict=True))

    right = pair(data + token * per_scale * SCALE_BYTES, (not token) * per_scale * SCALE_BYTES)
    return [
        (pair(data + per_scale * SCALE_BYTES, 0), PER_TOKEN_SCALES),
        (pair(data + token * per_scale * 2, (not token) * per_scale * 2), BOTH_TENSORS),
        (pair(2 * data + token * per_scale * SCALE_BYTES, right[FP8_LABELS[1]]), ONE_BYTE),
        (pair(data + token * 2 * layers * SCALE_BYTES,
              (not token) * 2 * layers * SCALE_BYTES), PER_HEAD),
    ]


def _fp8_case(layers: int, kv_heads: int, head_dim: int, scales: str) -> Case:
    return Case(
        f"fn(layers={layers}, kv_heads={kv_heads}, head_dim={head_dim}, scales={scales!r}) "
        f"-> ({', '.join(FP8_LABELS)})",
        lambda fn, a=(layers, kv_heads, head_dim, scales): labelled(FP8_LABELS, fn(*a)),
        _fp8_expected(layers, kv_heads, head_dim, scales),
        "one byte per K and V number; float32 scales for K and for V, per tensor or per head "
        "once per layer, or per head beside every token",
        compare=recognising(_fp8_mistakes(layers, kv_heads, head_dim, scales)))


def _bad_fp8_cases(shape: tuple[int, int, int], layout: str, cased: str, layers: int,
                   kv_heads: int, head_dim: int) -> list[Case]:
    """An unknown scale layout, a known one in other letters, then bad layers, KV heads and
    head size: each must raise."""
    layers_ok, h, d = shape
    bad = [((layers_ok, h, d, layout), f"an unknown scale layout {layout!r}"),
           ((layers_ok, h, d, cased), f"{cased!r}: layout names are exact, lower-case"),
           ((layers, h, d, "tensor"), f"layers = {layers}"),
           ((layers_ok, kv_heads, d, "token-head"), f"kv_heads = {kv_heads}"),
           ((layers_ok, h, head_dim, "head"), f"head_dim = {head_dim}")]
    return [
        Case(f"fn(layers={a[0]}, kv_heads={a[1]}, head_dim={a[2]}, scales={a[3]!r})  # {why}",
             lambda fn, a=a: fn(*a), Raises(ValueError),
             "a layout or shape that cannot be is the caller's mistake: raise ValueError "
             "naming it")
        for a, why in bad
    ]


def _fp8_cases() -> list[Case]:
    shapes = [(32, 8, 128, "tensor"), (32, 8, 128, "head"), (32, 8, 128, "token-head"),
              (80, 8, 128, "token-head"), (28, 4, 128, "head"), (30, 3, 64, "token-head"),
              (40, 40, 128, "tensor")]
    return [*(_fp8_case(*shape) for shape in shapes),
            *_bad_fp8_cases((32, 8, 128), "channel", "Tensor", 0, -8, 0)]


def _fp8_fresh(seed: int) -> list[Case]:
    """Every scale layout on seeded shapes (more than one KV head), then each bad input."""
    rng = random.Random(seed)

    def shape() -> tuple[int, int, int]:
        return rng.randint(2, 96), rng.choice([2, 3, 4, 8, 16, 40]), rng.choice([64, 96, 128])

    cases = [_fp8_case(*shape(), layout) for layout in SCALE_LAYOUTS]
    cases.append(_fp8_case(*shape(), rng.choice(SCALE_LAYOUTS)))
    return cases + _bad_fp8_cases(
        shape(), rng.choice(["channel", "token", "block", "per-head", "tensor-head"]),
        rng.choice(["Tensor", "HEAD", "Token-Head", "tensor ", "head\n"]),
        -rng.randint(0, 64), -rng.randint(0, 16), -rng.randint(0, 128))


# --- exercise 2: quantize with a scale, saturating ----------------------------------------------

FP8_NAMES = {spec.name: str(spec.dtype).removeprefix("torch.") for spec in FP8_FORMATS.values()}

DTYPE_HINT = ("return the FP8 tensor itself: torch.float8_e4m3fn for 'e4m3', "
              "torch.float8_e5m2 for 'e5m2'")
SATURATE = ("saturate: clamp x / scale to +-max before casting (E5M2's cast gives inf from "
            "61,440 on; E4M3's gave NaN past 448 before torch's 2026 change)")
DIVIDE = "the cache stores x / scale (dequantizing multiplies it back): divide by the scale"
AXIS = ("a per-head scale belongs to axis -2 of x shaped [..., num_heads, head_dim]: "
        "broadcast it as scale[:, None]")
FLOAT32_DIVIDE = ("divide in float32 (x.float() / scale): x / scale of a bfloat16 x is "
                  "bfloat16, rounded once before the cast rounds again")
MAX_OF = "clamp to the format's own largest value: 448 for E4M3, 57,344 for E5M2"
IN_PLACE = ("leave x as it is: a float32 x.float() is x itself, so divide into a new tensor "
            "(x.float() / scale), never in place (div_)")


def fp8_view(value: Any, x_unchanged: bool = True) -> Any:
    """What a quantize case compares: the dtype and the values of a returned tensor (float32
    holds every FP8 value exactly) and whether the call left its ``x`` as it was, anything
    else as it is."""
    if isinstance(value, torch.Tensor):
        return {"dtype": str(value.dtype).removeprefix("torch."),
                "values": value.detach().cpu().float().tolist(), "x unchanged": x_unchanged}
    return value


def _quantize_run(fn: Any, x: torch.Tensor, scale: torch.Tensor, fmt: str) -> Any:
    """Call ``fn`` on copies of the case's inputs and view what it returned."""
    given = x.clone()
    return fp8_view(fn(given, scale.clone(), fmt), torch.equal(given, x))


def _slip(x: torch.Tensor, scale: torch.Tensor, fmt: str, *, saturate: bool = True,
          limit: float | None = None, multiply: bool = False, last_axis: bool = False,
          native: bool = False) -> Any:
    """What a quantizer with one slip returns (for the hints), or None where it raises."""
    spec = FP8_FORMATS[fmt]
    s = scale if scale.dim() == 0 or last_axis else scale[:, None]
    try:
        scaled = x * s if multiply else (x / s if native else x.float() / s)
        if saturate:
            bound = spec.max_finite if limit is None else limit
            scaled = scaled.clamp(-bound, bound)
        return fp8_view(scaled.to(spec.dtype))
    except RuntimeError:  # the slip's shapes do not broadcast
        return None


def _quantize_mistakes(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> list[tuple[Any, str]]:
    other = "e5m2" if fmt == "e4m3" else "e4m3"
    return [(value, hint) for value, hint in [
        (_slip(x, scale, fmt, saturate=False), SATURATE),
        (_slip(x, scale, fmt, multiply=True), DIVIDE),
        (_slip(x, scale, fmt, last_axis=True), AXIS),
        (_slip(x, scale, fmt, native=True), FLOAT32_DIVIDE),
        (_slip(x, scale, fmt, limit=FP8_FORMATS[other].max_finite), MAX_OF),
    ] if value is not None]


def _describe_tensor(t: torch.Tensor) -> str:
    return (f"{str(t.dtype).removeprefix('torch.')} of shape {list(t.shape)}, "
            f"values {t.float().flatten().tolist()}")


def _quantize_case(label: str, x: torch.Tensor, scale: torch.Tensor, fmt: str) -> Case:
    return Case(
        f"fn(x, scale, {fmt!r})  # {label}; x: {_describe_tensor(x)}; scale: "
        f"{_describe_tensor(scale)}",
        lambda fn, x=x, s=scale, f=fmt: _quantize_run(fn, x, s, f),
        fp8_view(quantize(x, scale, fmt)),
        "q = fp8(clamp(x / scale, -max, max)): divide in float32, a per-head scale on axis -2, "
        "saturate, then cast", compare=recognising(_quantize_mistakes(x, scale, fmt)),
        hints={"dtype": DTYPE_HINT, "returned": DTYPE_HINT, "x unchanged": IN_PLACE})


def _values(gen: torch.Generator, shape: Sequence[int], spread: float) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * spread).float()


def _double_rounding(gen: torch.Generator, shape: Sequence[int]) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """A bfloat16 x of ``shape`` and a per-tensor scale where two of x's values quantize
    differently when x / scale is rounded to bfloat16 before the cast (about 1 value in 30
    does, so they are picked from a larger draw and put at seeded places)."""
    draw = _values(gen, (4096,), 5.0).bfloat16()
    differ = draw[:0]
    while len(differ) < 2:  # a scale of few mantissa bits divides exactly: draw another
        scale = draw.float().abs().amax() / 448 * (0.5 + 0.45 * torch.rand((), generator=gen))
        twice = (draw / scale).to(torch.float8_e4m3fn).float()
        differ = draw[quantize(draw, scale).float() != twice]
    x = draw[:torch.Size(shape).numel()].clone()
    x[torch.randperm(x.numel(), generator=gen)[:2]] = differ[:2]
    return x.reshape(shape), scale


def _head_scales(x: torch.Tensor, fmt: str, headroom: float) -> torch.Tensor:
    """One scale per head that leaves its largest value at ``headroom`` times the format's
    largest (above 1: saturating)."""
    amax = x.abs().movedim(-2, 0).reshape(x.shape[-2], -1).amax(dim=1)
    return (amax / (FP8_FORMATS[fmt].max_finite * headroom)).float()


def _quantize_inputs(gen: torch.Generator, heads: int, dim: int,
                     tokens: int) -> list[tuple[str, torch.Tensor, torch.Tensor, str]]:
    """One input of each kind: in range, saturating both ways in E5M2 (and E4M3), per-head
    scales with num_heads != head_dim and == head_dim, bfloat16 input."""
    x = _values(gen, (tokens, heads, dim), 3.0)
    wide = _values(gen, (tokens, heads, dim), 1.0)
    wide[0, 0, 0], wide[-1, -1, -1] = 90_000.0, -70_000.0
    square = _values(gen, (tokens, dim, dim), 2.0)
    square[:, 0] *= 40  # one outlier head
    half, half_scale = _double_rounding(gen, (tokens, heads, dim))
    return [
        ("per-tensor scale, values in range", x, x.abs().amax() / 448, "e4m3"),
        ("E5M2, values past +-57,344 both ways", wide, torch.tensor(1.0), "e5m2"),
        ("E4M3 with a scale too small: values past 448", x, x.abs().amax() / 1000, "e4m3"),
        ("per-head scales, num_heads != head_dim", x, _head_scales(x, "e4m3", 1.0), "e4m3"),
        ("per-head scales, num_heads == head_dim", square, _head_scales(square, "e5m2", 1.5),
         "e5m2"),
        ("bfloat16 x", half, half_scale, "e4m3"),
    ]


def _bad_quantize_cases(x: torch.Tensor, fmt_name: str, negative: float) -> list[Case]:
    """An unknown format, scales that are zero, ``negative``, inf and NaN, a per-head scale
    of the wrong length, and float64 x: each must raise."""
    heads = x.shape[-2]
    bad = [(x, torch.tensor(0.5), fmt_name, f"an unknown format {fmt_name!r}"),
           *((x, torch.tensor(value), "e4m3", f"scale = {value}")
             for value in (0.0, negative, float("inf"), float("nan"))),
           (x, torch.ones(heads + 1), "e4m3", f"{heads + 1} scales for {heads} heads"),
           (x.double(), torch.tensor(0.5), "e4m3", "float64 x (the cast would round twice)")]
    return [
        Case(f"fn(x, scale, {f!r})  # {why}; x: {str(xx.dtype).removeprefix('torch.')} of "
             f"shape {list(xx.shape)}", lambda fn, a=(xx, s, f): fn(*a), Raises(ValueError),
             "refuse what cannot be quantized right: raise ValueError naming the format, the "
             "scale or the dtype")
        for xx, s, f, why in bad
    ]


def _quantize_cases() -> list[Case]:
    gen = torch.Generator().manual_seed(10)
    cases = [_quantize_case(*entry) for entry in _quantize_inputs(gen, 2, 4, 3)]
    return cases + _bad_quantize_cases(_values(gen, (3, 2, 4), 1.0), "e3m4", -0.5)


def _quantize_fresh(seed: int) -> list[Case]:
    """Every kind of fixed case on seeded values and shapes, then each bad input."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    heads, dim = rng.choice([(2, 4), (3, 4), (4, 2), (2, 3), (3, 5)])
    cases = [_quantize_case(*entry) for entry in
             _quantize_inputs(gen, heads, dim, rng.randint(2, 4))]
    return cases + _bad_quantize_cases(
        _values(gen, (rng.randint(1, 3), heads, dim), 1.0),
        rng.choice(["e4m3fnuz", "e5m3", "fp8", "int8", "E4M3 "]), -rng.uniform(0.01, 2.0))


# --- exercise 3: MLA bytes per token ------------------------------------------------------------

MLA_LAYOUTS = ("bf16", "fp16", "fp32", "flashmla-fp8")
DTYPE_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4}

ONE_LATENT = ("the latent is one vector per token and layer for K and V together: do not "
              "count it twice")
ROPE = "the rope key (qk_rope_head_dim numbers) is cached beside the latent"
SHARED_ROPE = "the rope key is one per token and layer, shared by every head"
SCALES = ("FlashMLA's FP8 layout keeps one float32 scale per 128 latent values, beside the "
          "latent")
ROPE_BF16 = "FlashMLA's FP8 layout keeps the rope key in bf16 (2 bytes each), not in FP8"
LATENT_RANK = "the latent is kv_lora_rank wide, whatever the heads' widths"
LAYERS = "every layer caches its own latent: multiply by num_hidden_layers"
TWIN = ("that is the MHA twin's cache (every head's K and V): MLA caches the latent and "
        "the rope key instead")


def mla_config_json(config: MLAConfig) -> dict[str, int]:
    """The config.json entries of ``config`` an MLA cache's size depends on, and some it
    does not."""
    return {"num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
            "kv_lora_rank": config.kv_lora_rank, "qk_nope_head_dim": config.qk_nope_head_dim,
            "qk_rope_head_dim": config.qk_rope_head_dim, "v_head_dim": config.v_head_dim}


def _mla_mistakes(config: MLAConfig, layout: str) -> list[tuple[int, str]]:
    layers, rank, rope = config.num_layers, config.kv_lora_rank, config.qk_rope_head_dim
    heads = config.num_heads
    if layout == "flashmla-fp8":
        scales = rank // FLASHMLA_FP8_TILE * SCALE_BYTES
        per_layer = [(rank + 2 * rope, SCALES), (rank + scales + rope, ROPE_BF16),
                     (rank + scales, ROPE), (rank + scales + 2 * rope * heads, SHARED_ROPE),
                     (2 * rank + scales + 2 * rope, ONE_LATENT),
                     (config.qk_nope_head_dim + scales + 2 * rope, LATENT_RANK)]
    else:
        size = DTYPE_SIZE[layout]
        per_layer = [(2 * rank * size + rope * size, ONE_LATENT), (rank * size, ROPE),
                     ((rank + heads * rope) * size, SHARED_ROPE),
                     ((config.qk_nope_head_dim + rope) * size, LATENT_RANK),
                     (2 * (rank + rope) * size, ONE_LATENT)]
    mistakes = [(layers * value, hint) for value, hint in per_layer]
    mistakes.append((mla_bytes_per_token(config, layout) // layers, LAYERS))
    twin_size = 2 if layout == "flashmla-fp8" else DTYPE_SIZE[layout]
    mistakes.append((layers * heads * (config.qk_head_dim + config.v_head_dim) * twin_size,
                     TWIN))
    return mistakes


def _mla_case(label: str, config: MLAConfig, layout: str) -> Case:
    entries = mla_config_json(config)
    return Case(f"fn(config, layout={layout!r})  # {label}: config = {entries}",
                lambda fn, c=entries, lay=layout: fn(dict(c), lay),
                mla_bytes_per_token(config, layout),
                "per token and layer MLA caches the kv_lora_rank-wide latent and the shared "
                "rope key; FlashMLA's FP8 layout: latent in FP8, a float32 scale per 128 "
                "latent values, rope key in bf16", compare=recognising(
                    _mla_mistakes(config, layout)))


def _bad_mla_cases(config: MLAConfig, rank: int, layout: str, layers: int) -> list[Case]:
    """FlashMLA's FP8 layout with a latent not in tiles of 128, an unknown layout, and bad
    layers: each must raise."""
    entries = mla_config_json(config)
    bad = [(entries | {"kv_lora_rank": rank}, "flashmla-fp8",
            f"kv_lora_rank = {rank} is not whole tiles of {FLASHMLA_FP8_TILE}"),
           (entries, layout, f"an unknown layout {layout!r}"),
           (entries | {"num_hidden_layers": layers}, "bf16", f"num_hidden_layers = {layers}")]
    return [
        Case(f"fn(config, layout={lay!r})  # {why}: config = {c}",
             lambda fn, c=c, lay=lay: fn(dict(c), lay), Raises(ValueError),
             "a layout the config cannot have is the caller's mistake: raise ValueError "
             "naming it")
        for c, lay, why in bad
    ]


def _mla_config(rng: random.Random, index: int) -> MLAConfig:
    """A seeded MLA config whose widths all differ, so each slip gives its own number."""
    return MLAConfig(kv_lora_rank=rng.choice([256, 384, 512, 640]),
                     qk_rope_head_dim=rng.choice([32, 48, 64]),
                     qk_nope_head_dim=rng.choice([96, 128, 160]),
                     v_head_dim=rng.choice([80, 112, 128]), num_heads=rng.choice([8, 16, 64]),
                     num_layers=rng.randint(4, 96), name=f"seeded-{index}")


SMALL_MLA = MLAConfig(kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64,
                      v_head_dim=96, num_heads=16, num_layers=12, name="small")
"""A made-up small MLA model whose widths all differ."""


def _mla_cases() -> list[Case]:
    return [_mla_case("DeepSeek-V3", DEEPSEEK_V3, "bf16"),
            _mla_case("DeepSeek-V3", DEEPSEEK_V3, "flashmla-fp8"),
            _mla_case("a small MLA model", SMALL_MLA, "fp32"),
            _mla_case("a small MLA model", SMALL_MLA, "flashmla-fp8"),
            _mla_case("a small MLA model", SMALL_MLA, "fp16"),
            *_bad_mla_cases(SMALL_MLA, 200, "fp8_e5m2", 0)]


def _mla_fresh(seed: int) -> list[Case]:
    """Seeded configs in a 2-byte dtype, fp32 and FlashMLA's FP8 layout, then each bad
    input."""
    rng = random.Random(seed)
    cases = [_mla_case(f"seeded model {i}", _mla_config(rng, i), layout)
             for i, layout in enumerate([rng.choice(["bf16", "fp16"]), "fp32", "flashmla-fp8"],
                                        start=1)]
    return cases + _bad_mla_cases(_mla_config(rng, 4), rng.choice([100, 200, 300, 500, 700]),
                                  rng.choice(["fp8", "int8", "flashmla", "e4m3", "fp8_e5m2"]),
                                  -rng.randint(0, 61))


# --- the chapter ------------------------------------------------------------------------------

FRESH: dict[str, Callable[[int], Sequence[Case]]] = {
    "10.fp8_bytes_per_token": _fp8_fresh,
    "10.quantize": _quantize_fresh,
    "10.mla_bytes": _mla_fresh,
}
"""Each exercise's fresh cases, drawn from a seed."""

EXERCISES = (
    Exercise("10.fp8_bytes_per_token", "Bytes per token of an FP8 cache, scales included",
             _fp8_cases,
             reference=("course_lib.kv_formats.fp8_bytes_per_token",
                        "course_lib.kv_formats.scale_cost"),
             fresh=_fp8_fresh),
    Exercise("10.quantize", "Quantize to FP8 with a scale, saturating", _quantize_cases,
             reference=("course_lib.fp8",),  # all of it: its private checks answer too
             fresh=_quantize_fresh),
    Exercise("10.mla_bytes", "MLA bytes per token, in bf16 and FlashMLA's FP8 layout",
             _mla_cases,
             reference=("course_lib.kv_formats.mla_bytes_per_token",
                        "course_lib.kv_formats.mla_layer_bytes"),
             fresh=_mla_fresh),
    FP8_DECODE,
)
