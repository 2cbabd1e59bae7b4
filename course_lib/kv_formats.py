"""Bytes per token for caches that store fewer bytes (chapter 10): FP8 with its scales, and
multi-head latent attention (MLA) beside the MHA and GQA caches of the same model.

An FP8 cache stores one byte per number plus float32 scales. A scale per tensor or per KV
head is calibrated once per layer, so it costs a few bytes per layer and nothing per
token; a scale per token and head costs 4 bytes for every head's K and V of every token.

MLA caches a latent and a shared rope key per token and layer instead of K and V per head.
Its "twins" are the caches the same model would need without the latent trick: the MHA
twin caches every head's full key (``qk_nope + qk_rope`` wide, 192 in DeepSeek-V3) and
value (``v_head_dim``, 128), which is what attention computes over when the latent is
up-projected before attention; the GQA twin does the same with fewer KV heads
(:data:`GQA_TWIN_KV_HEADS`), the cache a GQA model of the same attention widths would have.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.kv_math import Capacity, bytes_per_token, capacity, dtype_bytes
from course_lib.mla import MLAConfig
from course_lib.validate import check_int, describe

SCALE_BYTES = 4
"""Bytes of one scale: float32, as vLLM's and FlashMLA's FP8 caches store them."""

SCALE_LAYOUTS: tuple[str, ...] = ("tensor", "head", "token-head")
"""What one FP8 scale covers: a layer's whole K (or V) tensor, one KV head of a layer, or
one KV head of one token (stored beside the token, so it costs bytes per token)."""


@dataclass(frozen=True)
class ScaleCost:
    """What an FP8 cache's scales cost: ``per_token`` bytes beside every token, ``fixed``
    bytes once for the whole cache (one float32 per layer or per layer and head)."""

    per_token: int
    fixed: int


def scale_cost(layers: int, kv_heads: int, scales: str) -> ScaleCost:
    """The bytes the float32 scales of K and V take for a scale layout of
    :data:`SCALE_LAYOUTS`: per tensor 2 x L x 4 fixed; per head 2 x L x H x 4 fixed; per
    token and head 2 x L x H x 4 for every token."""
    check_int("layers", layers, 1)
    check_int("kv_heads", kv_heads, 1)
    if scales == "tensor":
        return ScaleCost(per_token=0, fixed=2 * layers * SCALE_BYTES)
    if scales == "head":
        return ScaleCost(per_token=0, fixed=2 * layers * kv_heads * SCALE_BYTES)
    if scales == "token-head":
        return ScaleCost(per_token=2 * layers * kv_heads * SCALE_BYTES, fixed=0)
    raise ValueError(f"unknown scale layout {describe(scales)}; expected one of "
                     f"{', '.join(SCALE_LAYOUTS)}")


def fp8_bytes_per_token(layers: int, kv_heads: int, head_dim: int,
                        scales: str = "tensor") -> int:
    """KV bytes per token of an FP8 cache: one byte per K and V number, plus the scales
    stored per token (none unless ``scales="token-head"``)."""
    return (bytes_per_token(layers, kv_heads, head_dim, "fp8")
            + scale_cost(layers, kv_heads, scales).per_token)


FLASHMLA_FP8_TILE = 128
"""Latent values that share one float32 scale in FlashMLA's FP8 cache."""

FLASHMLA_BLOCK_SIZE = 64
"""Tokens per page of FlashMLA's paged cache (its kernels take blocks of 64 only)."""

MLA_LAYOUTS: tuple[str, ...] = ("fp32", "fp16", "bf16", "flashmla-fp8")
"""How an MLA cache stores latent and rope key: all in one dtype, or FlashMLA's FP8 layout."""


def mla_layer_bytes(config: MLAConfig, layout: str = "bf16") -> int:
    """Cache bytes one token takes in one MLA layer: ``(kv_lora_rank + qk_rope) x bytes``,
    or in FlashMLA's FP8 layout the latent in E4M3 (1 B each), one float32 scale per
    :data:`FLASHMLA_FP8_TILE` latent values, and the rope key in bf16 (512 + 16 + 128 =
    656 B for DeepSeek-V3)."""
    if not isinstance(config, MLAConfig):
        raise ValueError(f"config must be an MLAConfig, got {describe(config)}")
    if layout == "flashmla-fp8":
        if config.kv_lora_rank % FLASHMLA_FP8_TILE:
            raise ValueError(f"FlashMLA's FP8 layout needs kv_lora_rank a multiple of "
                             f"{FLASHMLA_FP8_TILE}, got {config.kv_lora_rank}")
        tiles = config.kv_lora_rank // FLASHMLA_FP8_TILE
        return (config.kv_lora_rank * dtype_bytes("fp8") + tiles * SCALE_BYTES
                + config.qk_rope_head_dim * dtype_bytes("bf16"))
    if layout not in MLA_LAYOUTS:
        raise ValueError(f"unknown MLA layout {describe(layout)}; expected one of "
                         f"{', '.join(MLA_LAYOUTS)}")
    return config.latent_width * dtype_bytes(layout)


def mla_bytes_per_token(config: MLAConfig, layout: str = "bf16") -> int:
    """Cache bytes one token takes across all of the model's layers."""
    return config.num_layers * mla_layer_bytes(config, layout)


GQA_TWIN_KV_HEADS = 8
"""KV heads of the GQA twin: the count Llama-3 (8B and 70B) and Mistral-7B use."""


def twin_bytes_per_token(config: MLAConfig, kv_heads: int | None = None,
                         dtype: str = "bf16") -> int:
    """KV bytes per token of the model's MHA twin (``kv_heads=None``: one KV head per query
    head) or GQA twin (``kv_heads`` dividing ``num_heads``): every KV head caches a key of
    ``qk_nope + qk_rope`` and a value of ``v_head_dim`` numbers in every layer."""
    if not isinstance(config, MLAConfig):
        raise ValueError(f"config must be an MLAConfig, got {describe(config)}")
    heads = config.num_heads if kv_heads is None else check_int("kv_heads", kv_heads, 1)
    if config.num_heads % heads:
        raise ValueError(f"kv_heads={heads} does not divide num_heads={config.num_heads}")
    return (config.num_layers * heads * (config.qk_head_dim + config.v_head_dim)
            * dtype_bytes(dtype))


def mla_capacities(config: MLAConfig, budget_bytes: int | float,
                   max_len: int = 8192) -> dict[str, Capacity]:
    """What ``budget_bytes`` holds for the MHA twin, the GQA twin, MLA in bf16 and MLA in
    FlashMLA's FP8 layout (twins in blocks of 16, MLA in FlashMLA's blocks of 64)."""
    return {
        "MHA twin, bf16": capacity(twin_bytes_per_token(config), budget_bytes, 16, max_len),
        f"GQA twin ({GQA_TWIN_KV_HEADS} KV heads), bf16": capacity(
            twin_bytes_per_token(config, GQA_TWIN_KV_HEADS), budget_bytes, 16, max_len),
        "MLA, bf16": capacity(mla_bytes_per_token(config, "bf16"), budget_bytes,
                              FLASHMLA_BLOCK_SIZE, max_len),
        "MLA, FlashMLA FP8": capacity(mla_bytes_per_token(config, "flashmla-fp8"),
                                      budget_bytes, FLASHMLA_BLOCK_SIZE, max_len),
    }
