"""Sub-commands of ``python -m course_lib``: one module per command, each with ``register``.

A command module defines ``register(subparsers)``, which adds its parser and sets
``run=<function(args) -> int>`` as the parser default. Adding a command means adding a
module here and its name to ``COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable, Mapping
from typing import Any

COMMAND_MODULES: tuple[str, ...] = (
    "kv_size",
    "grade",
    "cow_demo",
    "prefix_demo",
    "simulate",
)


def register_all(subparsers: argparse._SubParsersAction) -> None:
    """Import every command module and let it add its parser."""
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"course_lib.commands.{name}")
        module.register(subparsers)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """The shared ``--json`` switch: one JSON object on stdout instead of a table."""
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of a table"
    )


def emit(
    result: Mapping[str, Any], as_json: bool, render: Callable[[Mapping[str, Any]], str]
) -> int:
    """Print ``result`` as JSON or through ``render``; return exit status 0."""
    if as_json:
        print(json.dumps(dict(result), indent=None, sort_keys=False))
    else:
        print(render(result))
    return 0


def format_table(rows: list[tuple[str, str]]) -> str:
    """Two aligned columns, label and value, for the human-readable output."""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
