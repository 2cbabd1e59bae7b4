"""Fresh cases cover every kind of fixed case: the grader scores the fresh ones only (the fixed
cases are public, expected values included), so a mistake that a fixed case catches must be
caught by the cases drawn for every seed too, invalid inputs included."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import pytest

from course_lib.grading import GRADED_CHAPTERS, chapter_exercises, find_exercise
from course_lib.grading.check import Case, Exercise, Raises, observe, run_case
from course_lib.grading.grade import judge_cases
from tests.mutants import Mutant, tables

pytestmark = pytest.mark.filterwarnings(  # a wrong kernel's NaN makes the interpreter warn
    "ignore::RuntimeWarning:triton.runtime.interpreter")

SEEDS = (0, 7, 12345)
"""Seeds of the fresh cases: a mutant a fixed case catches must fail a fresh case at each."""

EXERCISES = [exercise for chapter in GRADED_CHAPTERS for exercise in chapter_exercises(chapter)]
MUTANTS = [mutant for table in tables().values() for mutant in table.MUTANTS]


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


class _Stop:
    """What the recording stand-in returns, to see that a case returns it unchanged."""


def _arguments(case: Case) -> str | None:
    """The arguments ``case`` calls the learner's function with, as a key, where it makes one
    call and returns what that call returns (not a script); None otherwise."""
    seen: list[str] = []

    def recorder(*args: object, **kwargs: object) -> object:
        seen.append(repr((args, sorted(kwargs.items()))))
        return _Stop

    try:
        returned = case.run(recorder)
    except Exception:  # a script that wants more of the function than a value
        return None
    return seen[0] if len(seen) == 1 and returned is _Stop else None


def _hard_coded(cases: Sequence[Case], wrong: object) -> object:
    """``wrong``, answering the ``cases``' own inputs with their expected values or errors, as
    a learner who copied ``check``'s report would."""
    answers = {key: case.expected for case in cases if (key := _arguments(case)) is not None}

    def copied(*args: object, **kwargs: object) -> object:
        expected = answers.get(repr((args, sorted(kwargs.items()))), _Stop)
        if expected is _Stop:
            return wrong(*args, **kwargs)  # type: ignore[operator]
        if isinstance(expected, Raises):
            raise expected.error("copied from the report")
        return expected

    return copied


def _grade(exercise: Exercise, obj: object, seed: int) -> float:
    """The grader's score of ``obj``, its observations judged as a harvest in the grader, on
    the fresh cases that do not repeat a fixed case's input (an invalid input of a kind with
    one member, such as ``fn([])``, is drawn as it is shown: copying it is implementing it)."""
    shown = {_arguments(case) for case in _fixed(exercise.name)}
    fresh = [case for case in exercise.fresh(seed)  # type: ignore[misc]
             if _arguments(case) is None or _arguments(case) not in shown]
    cases = [*_fixed(exercise.name), *fresh]
    harvest = {"calls": [case.call for case in cases],
               "observations": [observe(case, obj) for case in cases]}
    return judge_cases(json.dumps(harvest), cases, len(_fixed(exercise.name))).score


FUNCTIONS = [m for m in MUTANTS if callable(m.obj) and not isinstance(m.obj, type)
             and any(_arguments(case) for case in _fixed(m.exercise))]


@pytest.mark.parametrize("mutant", FUNCTIONS, ids=lambda m: f"{m.exercise}:{m.name}")
def test_hard_coding_the_fixed_cases_over_a_mistake_earns_nothing(mutant: Mutant) -> None:
    """Issue 30's measured case: chapter 01 with no input validation scored 3.8, and 5.0 with
    the fixed invalid inputs' errors hard-coded."""
    exercise = find_exercise(mutant.exercise)
    copied = _hard_coded(_fixed(exercise.name), mutant.obj)
    for seed in SEEDS[:2]:
        alone, hard_coded = _grade(exercise, mutant.obj, seed), _grade(exercise, copied, seed)
        assert hard_coded <= alone, (mutant.name, seed, alone, hard_coded)
