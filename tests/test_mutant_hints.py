"""Every kept mutant fails and its report's first failing case shows the hint of its own
mistake; every right answer passes, fresh cases included; a stub is not yet solved."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from course_lib.grading import GRADED_CHAPTERS, chapter_exercises, find_exercise
from course_lib.grading.check import Exercise, evaluate, exercise_cases, first_failure
from tests.mutants import Mutant, Right, tables

pytestmark = pytest.mark.filterwarnings(  # a wrong kernel's NaN makes the interpreter warn
    "ignore::RuntimeWarning:triton.runtime.interpreter")

SEEDS = (0, 7)
"""Seeds of the fresh cases: the right answers must pass them all, mutants fail with any."""


TABLES = tables()
MUTANTS: list[Mutant] = [m for table in TABLES.values() for m in table.MUTANTS]
RIGHT: list[Right] = [r for table in TABLES.values() for r in table.RIGHT]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.exercise}:{m.name}")
def test_a_mutant_fails_and_its_first_failure_names_its_mistake(mutant: Mutant) -> None:
    result = evaluate(find_exercise(mutant.exercise), mutant.obj, seed=SEEDS[0])
    assert result.status == "failed", f"{mutant.name} passed"
    first = first_failure(result)
    assert first is not None and mutant.hint in first.hint, result.report_text()
    assert first.differs, result.report_text()


@pytest.mark.parametrize("right", RIGHT, ids=lambda r: f"{r.exercise}:{r.name}")
def test_a_right_answer_of_another_design_passes(right: Right) -> None:
    for seed in SEEDS:
        result = evaluate(find_exercise(right.exercise), right.obj, seed=seed)
        assert result.status == "passed", result.report_text()


@pytest.mark.parametrize("chapter", sorted(TABLES))
def test_every_exercise_keeps_four_mutants_and_a_right_answer(chapter: str) -> None:
    table = TABLES[chapter]
    wrong = Counter(m.exercise for m in table.MUTANTS)
    right = Counter(r.exercise for r in table.RIGHT)
    for exercise in chapter_exercises(chapter):
        assert wrong[exercise.name] >= 4, exercise.name
        assert right[exercise.name] >= 1, exercise.name
    names = [(m.exercise, m.name) for m in table.MUTANTS]
    assert len(names) == len(set(names)), "two mutants share a name"


@pytest.mark.parametrize("chapter", GRADED_CHAPTERS)
def test_every_exercise_has_fresh_cases_drawn_from_the_seed(chapter: str) -> None:
    """Same seed, same cases; another seed, other inputs (so copied answers earn nothing)."""
    for exercise in chapter_exercises(chapter):
        assert exercise.fresh is not None, exercise.name
        calls = {seed: [case.call for case in exercise.fresh(seed)] for seed in (1, 2)}
        assert calls[1] and calls[1] == [case.call for case in exercise.fresh(1)]
        assert calls[1] != calls[2], exercise.name
        assert len(exercise_cases(exercise, 1)) == len(exercise.cases()) + len(calls[1])


@pytest.mark.parametrize("exercise", [e for chapter in GRADED_CHAPTERS
                                      for e in chapter_exercises(chapter)], ids=lambda e: e.name)
def test_a_stub_is_not_yet_solved(exercise: Exercise) -> None:
    """A stub that raises ``NotImplementedError`` when called (or built, for a class)."""
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("your code here")

    assert evaluate(exercise, stub).status == "not-solved"
