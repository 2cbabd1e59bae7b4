"""Chapter 09's checks: correct answers of two designs pass, fixed and seeded cases alike.
The classic mistakes, each failing with the hint that names it, are kept in
``tests/mutants/ch09.py`` and checked by ``tests/test_mutant_hints.py``."""

from __future__ import annotations

from typing import Any

import pytest

from course_lib.grading import find_exercise
from course_lib.grading.ch09 import EXERCISES, FRESH
from course_lib.grading.check import CheckResult, evaluate
from tests.mutants.ch09 import (
    BisectRing,
    ClockStore,
    OrderedStore,
    ScanRing,
    choose,
    choose_sorted,
    choose_tier,
    choose_tier_exact,
)

# --- the checks ----------------------------------------------------------------------------


def result(name: str, obj: Any, seed: int | None = None) -> CheckResult:
    exercise = find_exercise(name)
    if seed is None:
        return evaluate(exercise, obj)
    cases = FRESH[name](seed)
    return evaluate(type(exercise)(exercise.name, exercise.title, lambda: cases), obj)


CORRECT = {
    "09.lru_tier": (OrderedStore, ClockStore),
    "09.hash_ring": (BisectRing, ScanRing),
    "09.prefix_scorer": (choose, choose_sorted),
    "09.choose_tier": (choose_tier, choose_tier_exact),
}


def test_four_exercises_each_with_fresh_cases() -> None:
    assert [e.name for e in EXERCISES] == list(FRESH) == list(CORRECT)


@pytest.mark.parametrize(("name", "answer"),
                         [(n, a) for n, answers in CORRECT.items() for a in answers])
def test_correct_answers_of_two_designs_pass(name: str, answer: Any) -> None:
    for seed in (None, 0, 1, 2):
        checked = result(name, answer, seed)
        assert checked.passed == checked.total > 0, checked.report_text()


def test_fresh_cases_are_seeded() -> None:
    for name, fresh in FRESH.items():
        assert [c.call for c in fresh(5)] == [c.call for c in fresh(5)], name
        assert [c.call for c in fresh(5)] != [c.call for c in fresh(6)], name
