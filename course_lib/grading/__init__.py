"""Graded exercises: ``check(name, obj)`` for learners, ``grade`` for instructors.

Exercises live in one module per chapter (``course_lib.grading.ch01`` for chapter 01),
each exporting ``EXERCISES``; an exercise name starts with its chapter number, e.g.
``"01.bytes_per_token"``.
"""

from __future__ import annotations

import importlib
from typing import Any

from course_lib.grading.check import CHECK_MIME, CheckResult, Exercise, evaluate, publish

__all__ = ["CHECK_MIME", "CheckResult", "chapter_exercises", "check", "find_exercise"]


def chapter_exercises(chapter: str) -> tuple[Exercise, ...]:
    """The exercises of chapter ``"01"`` etc., in notebook order; unknown chapters raise."""
    if not (isinstance(chapter, str) and chapter.isdigit() and len(chapter) == 2):
        raise ValueError(f"chapter must be two digits such as '01', got {chapter!r}")
    try:
        module = importlib.import_module(f"course_lib.grading.ch{chapter}")
    except ModuleNotFoundError:
        raise ValueError(f"chapter {chapter!r} has no graded exercises") from None
    return tuple(module.EXERCISES)


def find_exercise(name: str) -> Exercise:
    """Look an exercise up by name, e.g. ``"01.bytes_per_token"``."""
    chapter = name.split(".", 1)[0] if isinstance(name, str) else name
    for exercise in chapter_exercises(chapter):
        if exercise.name == name:
            return exercise
    known = ", ".join(e.name for e in chapter_exercises(chapter))
    raise ValueError(f"unknown exercise {name!r}; chapter {chapter} has: {known}")


def check(name: str, obj: Any) -> CheckResult:
    """Run exercise ``name``'s cases against ``obj``, show the report, return the result."""
    result = evaluate(find_exercise(name), obj)
    publish(result)
    return result
