"""Chapters 01-04: every case's ``run`` works in a kernel where the exercise's reference is
gone. As the grader does, each run is pickled by value (cloudpickle) where the library is
whole, then loaded where every reference object is a stand-in that raises, and run on a
right answer that uses no reference: it must still pass, so no run calls the reference or
carries a value computed from it."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import cloudpickle
import pytest

from course_lib.grading import chapter_exercises
from course_lib.grading.check import Case, Exercise, exercise_cases, judge, observe
from tests.mutants import ch01, ch02, ch03, ch04

ANSWERS: dict[str, Any] = {
    "01.bytes_per_token": ch01.config_bytes_other,
    "01.blocks_needed": ch01.blocks_other,
    "01.max_requests": ch01.max_requests_other,
    "01.predict_vllm_log": ch01.predict(),
    "01.longest_max_len": ch01.longest(),
    "02.slot_states": ch02.slot_states_numpy,
    "02.first_fit": ch02.first_fit_generator,
    "02.no_gap_fits": ch02.no_gap_fits_sorted,
    "02.reserve_max_arena": ch02.TopDownReserveMax,
    "02.first_fit_arena": ch02.BitmapFirstFit,
    "02.growing_arena": ch02.GrowingGaps,
    "03.last_block": ch03.last_block_by_ceil,
    "03.u_paged": ch03.batch_u_numpy,
    "03.block_pool": ch03.HeapPool,
    "03.block_tables": ch03.SlotListTables,
    "03.cost_per_million": ch03.cost_by_phases,
    "03.pack_tables": ch03.pack_numpy,
    "04.fork": ch04.fork_with_comprehension,
    "04.append_token": ch04.append_by_allocate_and_free,
    "04.block_hashes": ch04.hashes_from_a_while_loop,
    "04.longest_cached_prefix": ch04.lookup_recursive,
    "04.free_queue": ch04.QueueByStamps,
    "04.system_prompt_blocks": ch04.system_prompt_by_counting,
}
"""A right answer per exercise that uses none of the exercise's reference objects."""


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


def _graded_exercises() -> list[Exercise]:
    return [e for chapter in ("01", "02", "03", "04") for e in chapter_exercises(chapter)]


@pytest.mark.parametrize("exercise", _graded_exercises(), ids=lambda e: e.name)
def test_runs_pass_where_the_reference_is_gone(exercise: Exercise,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
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
                              ANSWERS[exercise.name])
        assert judge(case, observation).passed, (case.call, observation)


def test_every_exercise_of_01_to_04_has_an_answer_here() -> None:
    assert {e.name for e in _graded_exercises()} == set(ANSWERS)
