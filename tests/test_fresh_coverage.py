"""Fresh cases cover every kind of fixed case: the grader scores the fresh ones only (the fixed
cases are public, expected values included), so a mistake that a fixed case catches must be
caught by the cases drawn for every seed too, invalid inputs included."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest

from course_lib.grading import GRADED_CHAPTERS, chapter_exercises, find_exercise
from course_lib.grading.check import Case, Exercise, Raises, run_case
from tests.mutants import Mutant
from tests.test_mutant_hints import MUTANTS

pytestmark = pytest.mark.filterwarnings(  # a wrong kernel's NaN makes the interpreter warn
    "ignore::RuntimeWarning:triton.runtime.interpreter")

SEEDS = (0, 7, 12345)
"""Seeds of the fresh cases: a mutant a fixed case catches must fail a fresh case at each."""

EXERCISES = [exercise for chapter in GRADED_CHAPTERS for exercise in chapter_exercises(chapter)]


@functools.cache
def _fixed(name: str) -> tuple[Case, ...]:
    """An exercise's fixed cases, built once (some chapters take seconds to build them)."""
    return tuple(find_exercise(name).cases())


def _failed(cases: Sequence[Case], obj: object) -> list[str]:
    """The calls of the cases ``obj`` fails."""
    return [result.call for result in (run_case(case, obj) for case in cases)
            if not result.passed]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.exercise}:{m.name}")
def test_a_mistake_a_fixed_case_catches_fails_a_fresh_case_at_every_seed(mutant: Mutant) -> None:
    fixed = _failed(_fixed(mutant.exercise), mutant.obj)
    if not fixed:
        pytest.skip(f"{mutant.name} passes every fixed case")
    fresh = find_exercise(mutant.exercise).fresh
    assert fresh is not None, mutant.exercise
    escaped = [seed for seed in SEEDS if not _failed(fresh(seed), mutant.obj)]
    assert not escaped, (f"{mutant.exercise}:{mutant.name} passes every fresh case at seeds "
                         f"{escaped}, but fails the fixed cases {fixed}")


def _raises(cases: Sequence[Case]) -> list[str]:
    """The calls of the cases that must raise."""
    return [case.call for case in cases if isinstance(case.expected, Raises)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_fresh_cases_draw_invalid_inputs_when_fixed_ones_have_them(exercise: Exercise) -> None:
    """A learner who hard-codes the fixed invalid inputs' errors earns nothing from them."""
    fixed = _raises(_fixed(exercise.name))
    if not fixed:
        pytest.skip(f"{exercise.name} has no fixed case that must raise")
    assert exercise.fresh is not None, exercise.name
    missing = [seed for seed in SEEDS if not _raises(exercise.fresh(seed))]
    assert not missing, (f"{exercise.name}: no fresh case must raise at seeds {missing}, but "
                         f"the fixed cases {fixed} must")
