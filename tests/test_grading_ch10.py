"""Chapter 10's checks: a right answer passes every case (fresh ones too), the learner's side
holds no expected value, runs pass where the reference is withheld, fresh cases draw every
kind of fixed case (invalid inputs included), and a stub is not yet solved. The mistakes
(scales counted per token, a clamp left out, a per-head scale on the wrong axis, the MLA
latent counted twice, ...) are kept in ``tests/mutants/ch10.py``, which
``tests/test_mutant_hints.py`` and ``tests/test_fresh_coverage.py`` pick up.

Until chapter 10 joins ``GRADED_CHAPTERS`` the chapter-wide checks of those files run here.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import cloudpickle
import pytest

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch10 import FRESH
from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    evaluate,
    exercise_cases,
    judge,
    observe,
)
from tests.mutants.ch10 import RIGHT, fp8_bytes, mla_bytes, quantize
from tests.test_grading_runs_without_reference import StandIn, _targets

CORRECT = {
    "10.fp8_bytes_per_token": fp8_bytes(),
    "10.quantize": quantize(),
    "10.mla_bytes": mla_bytes(),
}
"""The notebook's design of each answer, with no mistake switched on."""

OTHER = {right.exercise: right.obj for right in RIGHT if right.exercise in CORRECT}
"""A right answer of another design per exercise (it uses no library object); the kernel
exercise's are checked by ``tests/test_mutant_hints.py``."""

NON_KERNEL = [e for e in chapter_exercises("10") if e.name in CORRECT]


def run(name: str, obj: Any, cases: Any = None) -> Any:
    exercise = find_exercise(name)
    if cases is not None:
        exercise = Exercise(exercise.name, exercise.title, lambda: cases)
    return evaluate(exercise, obj)


def test_every_exercise_has_a_correct_answer_and_fresh_cases() -> None:
    assert {e.name for e in NON_KERNEL} == set(CORRECT) == set(FRESH) == set(OTHER)
    assert all(e.fresh is FRESH[e.name] for e in NON_KERNEL)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_answer_passes_every_case_and_fresh_ones(name: str) -> None:
    for seed in (None, 1, 2):
        result = evaluate(find_exercise(name), CORRECT[name], seed=seed)
        assert result.status == "passed", result.report_text()


@pytest.mark.parametrize("name", sorted(FRESH))
def test_fresh_cases_are_deterministic_per_seed_and_differ_between_seeds(name: str) -> None:
    calls = [[c.call for c in FRESH[name](seed)] for seed in (5, 5, 6)]
    assert calls[0] == calls[1] != calls[2]


@pytest.mark.parametrize("exercise", NON_KERNEL, ids=lambda e: e.name)
def test_fresh_cases_draw_invalid_inputs_as_the_fixed_ones_do(exercise: Exercise) -> None:
    def raising(cases: Any) -> int:
        return sum(isinstance(case.expected, Raises) for case in cases)

    assert raising(exercise.cases())
    for seed in (0, 7, 12345):
        assert raising(exercise.fresh(seed)) == raising(exercise.cases())  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_the_learner_side_holds_no_expected_value(name: str) -> None:
    """A case stripped of its expectation (what the grader ships) still runs the learner's
    code, and the result passes once judged where the expectation is."""
    for case in find_exercise(name).cases():
        blind = replace(case, expected=None, compare=None)
        assert judge(case, observe(blind, CORRECT[name])).passed, case.call


@pytest.mark.parametrize("exercise", NON_KERNEL, ids=lambda e: e.name)
def test_runs_pass_where_the_reference_is_gone(exercise: Exercise,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``tests/test_grading_runs_without_reference.py`` does for chapters 01-04."""
    module = importlib.import_module(exercise.cases.__module__)
    cases: list[Case] = exercise_cases(exercise, seed=9)
    cloudpickle.register_pickle_by_value(module)
    try:
        shipped = [cloudpickle.dumps(case.run) for case in cases]
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    for dotted in exercise.reference:
        for owner, name in _targets(dotted):
            monkeypatch.setattr(owner, name, StandIn(f"{owner.__name__}.{name}"))
    for case, blob in zip(cases, shipped, strict=True):
        observation = observe(Case(case.call, cloudpickle.loads(blob), None, ""),
                              OTHER[exercise.name])
        assert judge(case, observation).passed, (case.call, observation)


def test_stubs_are_not_yet_solved() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError("your code here")

    for name in CORRECT:
        assert run(name, stub).status == "not-solved"
