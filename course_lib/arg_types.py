"""Command-line value types: ``type=`` functions for ``argparse`` flags that refuse values
out of range, naming the range, so a command sees only values it can use.

They sit below both users, the commands (``course_lib.commands``) and the library's own
benchmark scripts (``course_lib.engine.bench``), so neither imports the other.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from course_lib.validate import bound_text, describe


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
