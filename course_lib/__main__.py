"""Command line: ``python -m course_lib <command>`` prints the chapters' headline tables."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from course_lib.commands import register_all


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-command per chapter tool."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib",
        description="PagedAttention course: reproduce the chapters' numbers from the command line.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_all(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; bad values end in a one-line message and exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
