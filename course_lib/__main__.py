"""Command line: ``python -m course_lib <command>`` prints the chapters' headline tables."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from course_lib.commands import CommandParser, register_all

SIGPIPE_STATUS = 141
"""Exit status when the reader of stdout went away: 128 + SIGPIPE, as a shell reports a
command killed by a broken pipe."""


def build_parser() -> CommandParser:
    """The top-level parser with one sub-command per chapter tool."""
    parser = CommandParser(
        prog="python -m course_lib",
        description="PagedAttention course: reproduce the chapters' numbers from the command line.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_all(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Any refused value, from the parser or the command, ends in exactly
    one line on stderr and exit status 2; ``--help`` exits 0 as usual."""
    try:
        args = build_parser().parse_args(argv)
        status = int(args.run(args) or 0)
        sys.stdout.flush()  # a broken pipe surfaces here, not at the interpreter's exit
        return status
    except ValueError as error:
        return _refuse(str(error))
    except MemoryError:
        return _refuse("out of memory: lower the sizes you asked for")
    except BrokenPipeError:  # the reader left (``| head``): stop quietly, as cat would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return SIGPIPE_STATUS


def _refuse(message: str) -> int:
    """Print ``message`` as one line (line breaks inside it become spaces); return 2."""
    print(f"error: {' '.join(message.splitlines())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
