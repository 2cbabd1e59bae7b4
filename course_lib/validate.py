"""Argument checks shared by the library: bad values raise ValueError naming the value."""

from __future__ import annotations

import math
from collections.abc import Iterable


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an int (bools excluded) of at least ``minimum``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_positive_number(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite number above zero, else raise."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def check_non_negative_number(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite number >= 0, else raise."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    return float(value)


def check_list(name: str, values: object) -> list:
    """Return ``values`` as a new list if it is an iterable other than a string, else raise.

    Taking a list first lets a caller validate every item before it changes anything.
    """
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be an iterable of values, got {values!r}")
    return list(values)
