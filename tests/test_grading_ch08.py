"""Chapter 08's checks: a correct answer passes every case (fresh ones too), the learner's
side holds no expected value, and a stub is not yet solved. The mistakes learners make (a
window off by one, ceil for floor at a block boundary, freeing a block a shared prefix still
holds, a hit that satisfies only the full group, a kernel that ignores the window or masks it
on the scores only) and right answers of other designs are kept in ``tests/mutants/ch08.py``,
where ``tests/test_mutant_hints.py`` checks that each fails with the hint of its mistake."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import pytest

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch08 import FRESH
from course_lib.grading.check import CheckResult, Exercise, evaluate, judge, observe
from course_lib.kv_math import blocks_needed
from tests.mutants.ch08 import bytes_at_length, prefix_hit, window_free, windowed

CORRECT = {
    "08.bytes_at_length": bytes_at_length(),
    "08.window_free": window_free(),
    "08.prefix_hit": prefix_hit(),
    "08.windowed_decode": windowed(),
}
"""The notebook's design of each answer, with no mistake switched on."""


def run(name: str, obj: Any, cases: Any = None) -> CheckResult:
    exercise = find_exercise(name)
    if cases is not None:
        exercise = Exercise(exercise.name, exercise.title, lambda: cases)
    with warnings.catch_warnings():  # a wrong kernel's NaN makes numpy warn in the interpreter
        warnings.simplefilter("ignore", RuntimeWarning)
        return evaluate(exercise, obj)


def test_every_exercise_has_a_correct_answer_and_fresh_cases() -> None:
    assert {e.name for e in chapter_exercises("08")} == set(CORRECT) == set(FRESH)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_answer_passes_every_case_and_fresh_ones(name: str) -> None:
    result = run(name, CORRECT[name])
    assert result.status == "passed", result.report_text()
    for seed in (1, 2):
        fresh = run(name, CORRECT[name], FRESH[name](seed))
        assert fresh.status == "passed", fresh.report_text()


@pytest.mark.parametrize("name", sorted(FRESH))
def test_fresh_cases_are_deterministic_per_seed_and_differ_between_seeds(name: str) -> None:
    calls = [[c.call for c in FRESH[name](seed)] for seed in (5, 5, 6)]
    assert calls[0] == calls[1] != calls[2]


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_the_learner_side_holds_no_expected_value(name: str) -> None:
    """A case stripped of its expectation (what the grader ships) still runs the learner's
    code, and the result passes once judged where the expectation is."""
    for case in find_exercise(name).cases()[:2]:
        blind = replace(case, expected=None, compare=None)
        assert judge(case, observe(blind, CORRECT[name])).passed, case.call


def test_stubs_are_not_yet_solved() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError("your code here")

    for name in CORRECT:
        assert run(name, stub).status == "not-solved"


def test_window_free_keeps_table_length() -> None:
    # the library rule never drops more than the table holds
    after, returned = window_free()([5, 9], {5: 1, 9: 1}, 100, 3, 4)
    assert after == [0, 0] and returned == [5, 9]
    assert blocks_needed(8, 4) == len(after)
