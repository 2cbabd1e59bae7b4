"""Argument checks shared by the library: bad values raise ValueError naming the value."""

from __future__ import annotations

import math
from collections.abc import Iterable

_SHOWN = 60
"""Longest value text an error message quotes in full."""


def describe(value: object) -> str:
    """``repr(value)`` for an error message, shortened so a huge int or string stays legible
    (Python refuses to print ints of more than 4,300 digits at all)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 192:
        return f"an integer of {value.bit_length():,} bits"
    try:
        text = repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deeply to print"
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 3]}..."


def bound_text(bound: float) -> str:
    """A limit as people write it: 1,048,576 rather than 1.04858e+06."""
    return f"{int(bound):,}" if float(bound).is_integer() else f"{bound:g}"


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int (bools excluded) in ``[minimum, maximum]``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {describe(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be an integer <= {maximum:,}, got {describe(value)}")
    return value


def _finite_float(value: object) -> float | None:
    """``value`` as a finite float, or None for non-numbers, NaN, infinities and ints too
    large for a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_positive_number(name: str, value: object, maximum: float | None = None) -> float:
    """Return ``value`` as a float if it is a finite number in ``(0, maximum]``, else raise."""
    number = _finite_float(value)
    if number is None or number <= 0:
        raise ValueError(f"{name} must be a positive number, got {describe(value)}")
    return _check_maximum(name, number, value, maximum)


def check_non_negative_number(name: str, value: object, maximum: float | None = None) -> float:
    """Return ``value`` as a float if it is a finite number in ``[0, maximum]``, else raise."""
    number = _finite_float(value)
    if number is None or number < 0:
        raise ValueError(f"{name} must be a non-negative number, got {describe(value)}")
    return _check_maximum(name, number, value, maximum)


def _check_maximum(name: str, number: float, value: object, maximum: float | None) -> float:
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be at most {bound_text(maximum)}, "
                         f"got {describe(value)}")
    return number


def check_at_most(what: str, amount: int, limit: int, remedy: str) -> None:
    """Raise if ``amount`` (what a call would need, described by ``what``) exceeds ``limit``,
    one of :mod:`course_lib.limits`; ``remedy`` says which argument to lower."""
    if amount > limit:
        shown = f"{amount:,}" if amount.bit_length() <= 192 else describe(amount)
        raise ValueError(f"{what} is {shown}, more than the {limit:,} this course's tools "
                         f"handle in seconds; {remedy}")


_SEQUENCES = (list, tuple, range)


def check_list(name: str, values: object) -> list:
    """Return ``values`` as a new list if it is an iterable other than a string, else raise.

    Taking a list first lets a caller validate every item before it changes anything.
    """
    if type(values) in _SEQUENCES:  # the common case, without the slower ABC test below
        return list(values)
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be an iterable of values, got {describe(values)}")
    return list(values)
