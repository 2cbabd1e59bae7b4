"""Sub-commands of ``python -m course_lib``: one module per command, each with ``register``.

A command module defines ``register(subparsers)``, which adds its parser and sets
``run=<function(args) -> int>`` as the parser default. Adding a command means adding a
module here and its name to ``COMMAND_MODULES``.

Every flag is checked while parsing: its ``type`` (:func:`integer`, :func:`number`) refuses
values out of range, naming the flag, so a command's ``run`` only sees values it can use.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from course_lib.validate import bound_text, describe

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


def integer(minimum: int, maximum: int) -> Callable[[str], int]:
    """A ``type=`` for an integer flag in ``[minimum, maximum]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {minimum:,} to {maximum:,}, got {describe(text)}")
        return value

    return parse


def number(minimum: float, maximum: float, *, above: bool = False) -> Callable[[str], float]:
    """A ``type=`` for a finite number flag in ``[minimum, maximum]``, or in
    ``(minimum, maximum]`` with ``above``."""
    low = f"above {bound_text(minimum)}" if above else f"from {bound_text(minimum)}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > minimum if above else value >= minimum)
                and value <= maximum):
            raise argparse.ArgumentTypeError(
                f"must be a number {low} to {bound_text(maximum)}, got {describe(text)}")
        return value

    return parse


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
