"""Every case's ``run`` works in a kernel where the exercise's reference is gone. As the
grader does, each run is pickled by value (cloudpickle) where the library is whole, then
loaded where every reference object is a stand-in that raises, and run on the exercise's
first right answer in its mutant table (which uses no reference): it must still pass, so no
run calls the reference or carries a value computed from it. Every graded chapter is
covered."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import cloudpickle
import pytest

from course_lib.grading import GRADED_CHAPTERS, chapter_exercises
from course_lib.grading.check import Case, Exercise, exercise_cases, judge, observe
from tests.mutants import tables


class ReferenceUsed(RuntimeError):
    """Raised by a stand-in: a run touched the exercise's reference."""


class StandIn:
    """Takes the place of a reference object; any use raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ReferenceUsed(self._name)

    def __getattr__(self, attr: str) -> Any:
        raise ReferenceUsed(f"{self._name}.{attr}")


def _targets(dotted: str) -> Iterator[tuple[Any, str]]:
    """(owner, attribute) pairs to replace for one reference name: the object itself, or
    every public object a whole module defines."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:-1]:
            owner = getattr(owner, part)
        if cut == len(parts):  # a whole module
            yield from ((owner, name) for name, value in vars(owner).items()
                        if not name.startswith("_") and _defined_in(value, owner))
        else:
            yield owner, parts[-1]
        return


def _defined_in(value: Any, module: ModuleType) -> bool:
    return (inspect.isclass(value) or inspect.isfunction(value)) and (
        value.__module__ == module.__name__)


TABLES = tables()
ANSWERS: dict[str, Any] = {right.exercise: right.obj for table in TABLES.values()
                           for right in reversed(table.RIGHT)}
"""Each exercise's first right answer in its table: one that uses no reference object."""


@pytest.mark.parametrize("exercise", [e for chapter in GRADED_CHAPTERS
                                      for e in chapter_exercises(chapter)], ids=lambda e: e.name)
def test_runs_pass_where_the_reference_is_gone(exercise: Exercise,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(exercise.cases.__module__)
    cases: list[Case] = exercise_cases(exercise, seed=9)
    cloudpickle.register_pickle_by_value(module)
    try:
        shipped = [cloudpickle.dumps(case.run) for case in cases]
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    gone: list[tuple[Any, StandIn]] = []
    for dotted in exercise.reference:
        for owner, name in _targets(dotted):
            gone.append((getattr(owner, name), StandIn(f"{owner.__name__}.{name}")))
            monkeypatch.setattr(owner, name, gone[-1][1])
    for table in TABLES.values():  # and where a table imported one by name
        for name, value in list(vars(table).items()):
            for original, stand_in in gone:
                if value is original:
                    monkeypatch.setattr(table, name, stand_in)
    for case, blob in zip(cases, shipped, strict=True):
        observation = observe(Case(case.call, cloudpickle.loads(blob), None, ""),
                              ANSWERS[exercise.name])
        assert judge(case, observation).passed, (case.call, observation)

