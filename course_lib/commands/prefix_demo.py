"""``prefix-demo``: chats sharing one system prompt through the prefix cache (chapter 04)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from course_lib.commands import add_json_flag, emit, format_table, in_flag_terms, integer
from course_lib.limits import MAX_DEMO_SEQUENCES, MAX_LEN, MAX_SHAPE
from course_lib.sharing import system_prompt_sharing

_FLAGS = ("prompt_tokens", "requests", "block_size")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``prefix-demo`` parser."""
    parser = subparsers.add_parser(
        "prefix-demo", help="prefix caching: chats sharing one system prompt",
        description="Admit chats that start with the same system prompt; each finds the "
        "prompt's full blocks by hash and writes only its partly filled tail block.",
    )
    parser.add_argument("--prompt-tokens", type=integer(1, MAX_LEN), default=1000,
                        help="system prompt length")
    parser.add_argument("--requests", type=integer(1, MAX_DEMO_SEQUENCES), default=50,
                        help="chats")
    parser.add_argument("--block-size", type=integer(1, MAX_SHAPE), default=16,
                        help="tokens per block")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print the block counts."""
    try:
        demo = system_prompt_sharing(*(getattr(args, name) for name in _FLAGS))
    except ValueError as error:
        raise in_flag_terms(error, _FLAGS) from None
    return emit(demo.as_dict(), args.json, _render)


def _render(result: Mapping[str, Any]) -> str:
    private = result["blocks_with_sharing"] - result["shared_blocks"]
    return format_table([
        ("blocks with sharing", f"{result['blocks_with_sharing']:,} "
         f"({result['shared_blocks']} shared + {private} private)"),
        ("blocks without sharing", f"{result['blocks_without_sharing']:,}"),
        ("saved by sharing", f"{result['saving']:.1%}"),
        ("shareable tokens (full blocks)",
         f"{result['shareable_tokens']:,} of {result['prompt_tokens']:,}"),
        ("prefix cache hit rate", f"{result['hit_rate']:.1%}"),
        ("tokens not recomputed", f"{result['tokens_not_recomputed']:,}"),
    ])
