"""``kv-size``: bytes per token and what a KV budget holds (chapter 01), for an FP8 cache
with its scales and for multi-head latent attention too (chapter 10)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from course_lib.commands import (
    UsageError,
    add_json_flag,
    emit,
    format_table,
    integer,
    number,
    refuse_together,
)
from course_lib.kv_formats import (
    FLASHMLA_BLOCK_SIZE,
    GQA_TWIN_KV_HEADS,
    SCALE_LAYOUTS,
    mla_bytes_per_token,
    mla_layer_bytes,
    scale_cost,
    twin_bytes_per_token,
)
from course_lib.kv_math import (
    DTYPE_BYTES,
    GIB,
    HYBRID_MODELS,
    MODELS,
    HybridModel,
    bytes_per_token,
    capacity,
    hybrid_capacity,
)
from course_lib.limits import MAX_BUDGET_GIB, MAX_LEN, MAX_SHAPE
from course_lib.mla import MLA_MODELS

MIN_POOL_BLOCKS = 2
"""Fewest blocks a budget must hold: one for requests plus the reserved null block, the
paged simulator's minimum, so ``kv-size`` and ``simulate`` refuse the same budgets."""


SHAPE_FLAGS: tuple[str, ...] = ("--layers", "--kv-heads", "--head-dim")
"""The model-shape flags of :func:`add_model_arguments`; a ``--hybrid`` preset fixes them."""


DEFAULT_BLOCK_SIZE = 16
"""``--block-size`` when none is typed (``kv-size --mla`` takes FlashMLA's 64 instead)."""

FP8_DTYPES: tuple[str, ...] = ("fp8", "fp8_e4m3", "fp8_e5m2")
"""The ``--dtype`` choices that store one byte per number, the ones ``--kv-scales`` fits."""

MLA_LAYOUT_OF_DTYPE: dict[str, str] = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16",
                                       "fp8": "flashmla-fp8", "fp8_e4m3": "flashmla-fp8"}
"""The MLA cache layout ``kv-size --mla`` sizes for each ``--dtype``: FP8 means FlashMLA's
layout, which stores E4M3 only."""


def add_model_arguments(parser: argparse.ArgumentParser, *dtype_aliases: str) -> None:
    """Model-shape options shared by every command that sizes a KV cache. The shape flags
    default to None (read as the source guide's model) so a command can tell one typed;
    ``dtype_aliases`` are further names for ``--dtype`` (``kv-size``'s ``--kv-dtype``)."""
    guide = MODELS["guide-8kv"]
    shape = integer(1, MAX_SHAPE)
    parser.add_argument("--layers", type=shape,
                        help=f"decoder layers (default: {guide.layers}, the guide's model)")
    parser.add_argument("--kv-heads", type=shape,
                        help=f"key/value heads (default: {guide.kv_heads})")
    parser.add_argument("--head-dim", type=shape, help=f"head size (default: {guide.head_dim})")
    parser.add_argument("--dtype", *dtype_aliases, dest="dtype", default="fp16",
                        choices=tuple(DTYPE_BYTES), help="cache dtype")


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """``--budget-gib``, ``--block-size`` and ``--max-len``, shared with ``simulate``."""
    parser.add_argument("--budget-gib", type=number(0, MAX_BUDGET_GIB, above=True),
                        default=60.0, help="KV budget in GiB")
    parser.add_argument("--block-size", type=integer(1, MAX_SHAPE), default=DEFAULT_BLOCK_SIZE,
                        help="tokens per block")
    parser.add_argument("--max-len", type=integer(1, MAX_LEN), default=8192,
                        help="maximum tokens per request")


def shape_from(args: argparse.Namespace) -> tuple[int, int, int]:
    """Layers, KV heads and head size given on the command line (the source guide's where
    a flag is not given)."""
    guide = MODELS["guide-8kv"]
    return (guide.layers if args.layers is None else args.layers,
            guide.kv_heads if args.kv_heads is None else args.kv_heads,
            guide.head_dim if args.head_dim is None else args.head_dim)


def per_token_bytes_from(args: argparse.Namespace) -> int:
    """Bytes per token for the model shape given on the command line (the source guide's
    where a flag is not given)."""
    return bytes_per_token(*shape_from(args), args.dtype)


def refuse_shape_flags(args: argparse.Namespace, preset_flag: str) -> None:
    """Refuse a model-shape flag typed beside a preset (``--hybrid``, ``--mla``), naming it."""
    for flag in SHAPE_FLAGS:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            refuse_together(preset_flag, flag, "the preset fixes the model's shape")


def hybrid_model_from(args: argparse.Namespace) -> HybridModel:
    """The ``--hybrid`` preset; refuse a model-shape flag typed beside it, naming it."""
    refuse_shape_flags(args, "--hybrid")
    return HYBRID_MODELS[args.hybrid]


def hybrid_budget_blocks(args: argparse.Namespace, model: HybridModel) -> int:
    """Whole pages of ``model`` in ``--budget-gib``; refuse a budget that holds fewer than
    :data:`MIN_POOL_BLOCKS`, naming the flags."""
    block_bytes = model.block_bytes(args.block_size, args.dtype)
    blocks = int(args.budget_gib * GIB) // block_bytes
    if blocks < MIN_POOL_BLOCKS:
        raise UsageError(f"--budget-gib {args.budget_gib:g} holds fewer than {MIN_POOL_BLOCKS} "
                         f"blocks of {block_bytes:,} B ({args.hybrid}, --block-size "
                         f"{args.block_size})")
    return blocks


def budget_blocks(args: argparse.Namespace, per_token: int) -> int:
    """Whole blocks in ``--budget-gib``; refuse a budget that holds fewer than
    :data:`MIN_POOL_BLOCKS`, naming the flags."""
    blocks = int(args.budget_gib * GIB) // (per_token * args.block_size)
    if blocks < MIN_POOL_BLOCKS:
        raise UsageError(
            f"--budget-gib {args.budget_gib:g} holds {blocks} blocks of --block-size "
            f"{args.block_size} tokens at {per_token:,} B per token; a paged pool needs at "
            f"least {MIN_POOL_BLOCKS} (one is the null block)")
    return blocks


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``kv-size`` parser."""
    parser = subparsers.add_parser(
        "kv-size", help="KV bytes per token and the capacity of a budget",
        description="Bytes per token = 2 x layers x kv_heads x head_dim x dtype bytes; "
        "then budget -> blocks -> tokens -> requests at a maximum length.",
    )
    add_model_arguments(parser, "--kv-dtype")
    add_budget_arguments(parser)
    parser.set_defaults(block_size=None)  # typed or not: --mla's default differs
    parser.add_argument("--hybrid", choices=tuple(HYBRID_MODELS), default=None,
                        help="a published hybrid model (chapter 08): its layer kinds and shape, "
                        "requests of --max-len tokens with and without window freeing")
    parser.add_argument("--kv-scales", choices=SCALE_LAYOUTS, default=None,
                        help="an FP8 cache's float32 scales (chapter 10): one per layer "
                        "tensor or per layer and KV head (no bytes per token), or one per "
                        "token and KV head (4 B each)")
    parser.add_argument("--mla", choices=tuple(MLA_MODELS), default=None,
                        help="a multi-head latent attention model (chapter 10): its latent "
                        "cache in --dtype (fp8: FlashMLA's layout), blocks of "
                        f"{FLASHMLA_BLOCK_SIZE} unless --block-size is given")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Compute and print the capacity table."""
    if args.block_size is None:
        args.block_size = DEFAULT_BLOCK_SIZE if args.mla is None else FLASHMLA_BLOCK_SIZE
    if args.mla is not None:
        return run_mla(args)
    if args.hybrid is not None:
        if args.kv_scales is not None:
            refuse_together("--hybrid", "--kv-scales", "the hybrid presets size caches "
                            "without scales")
        return run_hybrid(args)
    if args.kv_scales is not None:
        return run_fp8(args)
    per_token = per_token_bytes_from(args)
    budget_blocks(args, per_token)
    result = capacity(per_token, args.budget_gib * GIB, args.block_size, args.max_len).as_dict()
    return emit(result, args.json, _render)


def _render(result: Mapping[str, Any]) -> str:
    return format_table(_capacity_rows(result))


def _capacity_rows(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    per_token = result["bytes_per_token"]
    return [
        ("bytes per token", f"{per_token:,} B ({per_token / 1024:g} KiB)"),
        ("KV budget", f"{result['budget_bytes'] / GIB:g} GiB"),
        ("blocks", f"{result['blocks']:,} of {result['block_size']} tokens"),
        ("tokens", f"{result['tokens']:,}"),
        (f"max requests at {result['max_len']:,} tokens", f"{result['max_requests']:,}"),
        ("max concurrency", f"{result['max_concurrency']:.2f}x"),
    ]


def run_fp8(args: argparse.Namespace) -> int:
    """The capacity of a budget for an FP8 cache whose scales are laid out as
    ``--kv-scales``; refuse a ``--dtype`` that is not FP8."""
    if args.dtype not in FP8_DTYPES:
        raise UsageError(f"--kv-scales needs an FP8 cache: --dtype (--kv-dtype) one of "
                         f"{', '.join(FP8_DTYPES)}, got {args.dtype}")
    layers, kv_heads, head_dim = shape_from(args)
    cost = scale_cost(layers, kv_heads, args.kv_scales)
    per_token = bytes_per_token(layers, kv_heads, head_dim, args.dtype) + cost.per_token
    budget_blocks(args, per_token)
    result = capacity(per_token, args.budget_gib * GIB, args.block_size, args.max_len).as_dict()
    result.update(kv_scales=args.kv_scales, scale_bytes_per_token=cost.per_token,
                  scale_bytes_fixed=cost.fixed)
    return emit(result, args.json, _render_fp8)


def _render_fp8(result: Mapping[str, Any]) -> str:
    return format_table([
        ("FP8 scales", f"per {result['kv_scales']}: {result['scale_bytes_per_token']:,} B "
                       f"per token, plus {result['scale_bytes_fixed']:,} B for the whole cache"),
        *_capacity_rows(result),
    ])


def run_mla(args: argparse.Namespace) -> int:
    """The capacity of a budget for an MLA preset, beside its MHA and GQA twins' bytes per
    token; refuse flags the preset fixes, naming them."""
    refuse_shape_flags(args, "--mla")
    if args.hybrid is not None:
        refuse_together("--mla", "--hybrid", "a model is one preset or the other")
    if args.kv_scales is not None:
        refuse_together("--mla", "--kv-scales", "FlashMLA's FP8 layout fixes its scales")
    if args.dtype not in MLA_LAYOUT_OF_DTYPE:
        raise UsageError(f"--mla has no layout for --dtype {args.dtype}: FlashMLA's FP8 "
                         f"cache stores E4M3 (--dtype fp8 or fp8_e4m3)")
    config = MLA_MODELS[args.mla]
    layout = MLA_LAYOUT_OF_DTYPE[args.dtype]
    per_token = mla_bytes_per_token(config, layout)
    budget_blocks(args, per_token)
    result = capacity(per_token, args.budget_gib * GIB, args.block_size, args.max_len).as_dict()
    result.update(model=config.name, layout=layout,
                  layer_bytes_per_token=mla_layer_bytes(config, layout),
                  mha_twin_bf16_bytes_per_token=twin_bytes_per_token(config),
                  gqa_twin_bf16_bytes_per_token=twin_bytes_per_token(config,
                                                                     GQA_TWIN_KV_HEADS))
    return emit(result, args.json, _render_mla)


def _render_mla(result: Mapping[str, Any]) -> str:
    return format_table([
        ("model", f"{result['model']} (MLA), cache layout {result['layout']}"),
        ("bytes per token and layer", f"{result['layer_bytes_per_token']:,} B"),
        ("MHA twin, bf16", f"{result['mha_twin_bf16_bytes_per_token']:,} B per token"),
        (f"GQA twin ({GQA_TWIN_KV_HEADS} KV heads), bf16",
         f"{result['gqa_twin_bf16_bytes_per_token']:,} B per token"),
        *_capacity_rows(result),
    ])


def run_hybrid(args: argparse.Namespace) -> int:
    """The capacity of a budget for a hybrid preset at requests of ``--max-len`` tokens."""
    model = hybrid_model_from(args)
    hybrid_budget_blocks(args, model)
    cap = hybrid_capacity(model, args.budget_gib * GIB, args.max_len, args.block_size,
                          args.dtype)
    result = dict(cap.as_dict(), budget_bytes=int(args.budget_gib * GIB),
                  groups=[g.kind for g in model.kv_cache_groups()])
    return emit(result, args.json, _render_hybrid)


def _render_hybrid(result: Mapping[str, Any]) -> str:
    tokens = result["num_tokens"]
    return format_table([
        ("model", result["model"]),
        ("KV-cache groups", ", ".join(result["groups"])),
        ("KV budget", f"{result['budget_bytes'] / GIB:g} GiB"),
        ("blocks", f"{result['blocks']:,} of {result['block_bytes']:,} B "
                   f"({result['block_size']} tokens)"),
        (f"exact KV bytes at {tokens:,} tokens", f"{result['kv_bytes_exact']:,} B "
                                                 f"({result['kv_bytes_exact'] / GIB:.3f} GiB)"),
        ("blocks per request", f"{result['blocks_per_request']:,} with window freeing, "
                               f"{result['blocks_per_request_no_freeing']:,} without"),
        (f"max requests at {tokens:,} tokens", f"{result['max_requests']:,} with window "
                                               f"freeing, {result['max_requests_no_freeing']:,} "
                                               f"without"),
    ])
