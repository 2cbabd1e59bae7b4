"""``cow-demo``: parallel samples sharing a prompt through copy-on-write (chapter 04)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from course_lib.commands import add_json_flag, emit, format_table, in_flag_terms, integer
from course_lib.limits import MAX_DEMO_SEQUENCES, MAX_LEN, MAX_SHAPE
from course_lib.sharing import cow_demo

_FLAGS = ("prompt_tokens", "samples", "new_tokens", "block_size")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``cow-demo`` parser."""
    parser = subparsers.add_parser(
        "cow-demo", help="copy-on-write: samples of one prompt sharing its blocks",
        description="Prefill a prompt, fork it into samples that share every block, and let "
        "each sample write new tokens; a shared, partly filled block is copied before a write.",
    )
    parser.add_argument("--prompt-tokens", type=integer(1, MAX_LEN), default=1000,
                        help="prompt length")
    parser.add_argument("--samples", type=integer(1, MAX_DEMO_SEQUENCES), default=4,
                        help="parallel samples")
    parser.add_argument("--new-tokens", type=integer(0, MAX_LEN), default=200,
                        help="tokens each sample writes")
    parser.add_argument("--block-size", type=integer(1, MAX_SHAPE), default=16,
                        help="tokens per block")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its end state."""
    try:
        demo = cow_demo(*(getattr(args, name) for name in _FLAGS))
    except ValueError as error:
        raise in_flag_terms(error, _FLAGS) from None
    return emit(demo.as_dict(), args.json, _render)


def _render(result: Mapping[str, Any]) -> str:
    lasts = ", ".join(map(str, result["last_prompt_block_per_sample"]))
    from_0 = ", ".join(map(str, result["last_prompt_block_per_sample_from_0"]))
    return format_table([
        ("blocks in use", f"{result['blocks_in_use']:,}"),
        ("blocks without sharing", f"{result['blocks_without_sharing']:,}"),
        ("saved by sharing", f"{result['saving']:.0%}"),
        ("first block shared by", f"{result['first_block_refcount']} samples"),
        ("last prompt block per sample", f"{lasts} (block 0 is the null block)"),
        ("  counting from 0, no null block", from_0),
        ("copy-on-write copies", f"{result['cow_copies']}"),
    ])
