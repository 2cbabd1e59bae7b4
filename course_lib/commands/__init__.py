"""Sub-commands of ``python -m course_lib``: one module per command, each with ``register``.

A command module defines ``register(subparsers)``, which adds its parser and sets
``run=<function(args) -> int>`` as the parser default. Adding a command means adding a
module here and its name to ``COMMAND_MODULES``.

Every flag is checked while parsing: its ``type`` (:func:`integer`, :func:`number`, from
``course_lib.arg_types``) refuses values out of range, naming the flag, so a command's
``run`` only sees values it can use.

A lecture that quotes a command line shows the figures it prints with :func:`quoted_json`;
``tests/test_lecture_commands.py`` runs every quoted line and compares.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from course_lib.arg_types import integer as integer  # the flag types, for the commands
from course_lib.arg_types import number as number

COMMAND_MODULES: tuple[str, ...] = (
    "kv_size",
    "grade",
    "cow_demo",
    "prefix_demo",
    "simulate",
    "route",
)


class UsageError(ValueError):
    """A command line the parser refused; ``python -m course_lib`` prints it on one line."""


class CommandParser(argparse.ArgumentParser):
    """An argument parser that raises :class:`UsageError` instead of printing usage and
    exiting, so every refusal (parser or command) ends the same way: one line, status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Python 3.11's argparse drops a lone "--" given as a flag's value (--seed=--) and
        # hands the command [] unconverted; refuse it as a missing value instead.
        if arg_strings == ["--"] and action.option_strings and action.nargs is None:
            raise argparse.ArgumentError(action, "expected one value, got '--'")
        return super()._get_values(action, arg_strings)


def register_all(subparsers: argparse._SubParsersAction) -> None:
    """Import every command module and let it add its parser."""
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"course_lib.commands.{name}")
        module.register(subparsers)


def refuse_together(flag: str, other: str, why: str) -> NoReturn:
    """Refuse two flags that contradict each other, naming both."""
    raise UsageError(f"{flag} cannot be combined with {other}: {why}")


def in_flag_terms(error: ValueError, names: Iterable[str]) -> UsageError:
    """A library error about parameters that are also this command's flags, reworded with
    the flags the user typed (``samples`` -> ``--samples``)."""
    text = str(error)
    for name in names:
        text = re.sub(rf"(?<![\w-]){name}(?![\w-])", "--" + name.replace("_", "-"), text)
    return UsageError(text)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """The shared ``--json`` switch: one JSON object on stdout instead of a table."""
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of a table"
    )


def emit(
    result: Mapping[str, Any], as_json: bool, render: Callable[[Mapping[str, Any]], str]
) -> int:
    """Print ``result`` as strict JSON (never NaN or Infinity) or through ``render``;
    return exit status 0."""
    if as_json:
        print(json.dumps(dict(result), allow_nan=False))
    else:
        print(render(result))
    return 0


def format_table(rows: list[tuple[str, str]]) -> str:
    """Two aligned columns, label and value, for the human-readable output."""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def quoted_json(line: str, payload: Mapping[str, Any], keys: Iterable[str]) -> str:
    """What a lecture prints for a command line it quotes (``python -m course_lib ...``): the
    line with ``--json`` after ``$``, then the figures of ``keys`` from ``payload`` (the
    library's run that the command repeats) as one JSON object, the command's own names and
    values. ``tests/test_lecture_commands.py`` runs the line and requires the same values."""
    prefix = "python -m course_lib "
    if not isinstance(line, str) or not line.startswith(prefix):
        raise ValueError(f"a quoted command line starts with {prefix!r}, got {line!r}")
    names = list(keys)
    missing = [name for name in names if name not in payload]
    if not names or missing:
        raise ValueError(f"keys must name figures of the payload; missing {missing or names}")
    shown = {name: payload[name] for name in names}
    return f"$ {line} --json\n{json.dumps(shown, allow_nan=False)}"
