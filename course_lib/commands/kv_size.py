"""``kv-size``: bytes per token and what a KV budget holds (chapter 01)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from course_lib.commands import UsageError, add_json_flag, emit, format_table, integer, number
from course_lib.kv_math import DTYPE_BYTES, GIB, MODELS, bytes_per_token, capacity
from course_lib.limits import MAX_BUDGET_GIB, MAX_LEN, MAX_SHAPE

MIN_POOL_BLOCKS = 2
"""Fewest blocks a budget must hold: one for requests plus the reserved null block, the
paged simulator's minimum, so ``kv-size`` and ``simulate`` refuse the same budgets."""


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Model-shape options shared by every command that sizes a KV cache."""
    guide = MODELS["guide-8kv"]
    shape = integer(1, MAX_SHAPE)
    parser.add_argument("--layers", type=shape, default=guide.layers, help="decoder layers")
    parser.add_argument("--kv-heads", type=shape, default=guide.kv_heads,
                        help="key/value heads")
    parser.add_argument("--head-dim", type=shape, default=guide.head_dim, help="head size")
    parser.add_argument("--dtype", default="fp16", choices=tuple(DTYPE_BYTES),
                        help="cache dtype")


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """``--budget-gib``, ``--block-size`` and ``--max-len``, shared with ``simulate``."""
    parser.add_argument("--budget-gib", type=number(0, MAX_BUDGET_GIB, above=True),
                        default=60.0, help="KV budget in GiB")
    parser.add_argument("--block-size", type=integer(1, MAX_SHAPE), default=16,
                        help="tokens per block")
    parser.add_argument("--max-len", type=integer(1, MAX_LEN), default=8192,
                        help="maximum tokens per request")


def per_token_bytes_from(args: argparse.Namespace) -> int:
    """Bytes per token for the model shape given on the command line."""
    return bytes_per_token(args.layers, args.kv_heads, args.head_dim, args.dtype)


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
    add_model_arguments(parser)
    add_budget_arguments(parser)
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Compute and print the capacity table."""
    per_token = per_token_bytes_from(args)
    budget_blocks(args, per_token)
    result = capacity(per_token, args.budget_gib * GIB, args.block_size, args.max_len).as_dict()
    return emit(result, args.json, _render)


def _render(result: Mapping[str, Any]) -> str:
    per_token = result["bytes_per_token"]
    return format_table([
        ("bytes per token", f"{per_token:,} B ({per_token / 1024:g} KiB)"),
        ("KV budget", f"{result['budget_bytes'] / GIB:g} GiB"),
        ("blocks", f"{result['blocks']:,} of {result['block_size']} tokens"),
        ("tokens", f"{result['tokens']:,}"),
        (f"max requests at {result['max_len']:,} tokens", f"{result['max_requests']:,}"),
        ("max concurrency", f"{result['max_concurrency']:.2f}x"),
    ])
