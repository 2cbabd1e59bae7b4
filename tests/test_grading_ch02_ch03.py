"""Chapters 02 and 03's checks: a crash is evidence, the notebooks grade as they should, and
the references the checks use agree with the library. Right answers (the library behind
each exercise's interface, other designs) and wrong ones are in ``tests/mutants/ch02.py``
and ``ch03.py``."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch02 import GrowingReference
from course_lib.grading.ch02 import _LibraryFirstFit as LibraryFirstFit
from course_lib.grading.ch03 import LowestFirstPool
from course_lib.grading.check import CheckResult, evaluate
from course_lib.grading.execute import Limits
from course_lib.grading.grade import grade_folder
from course_lib.kv_math import blocks_needed
from course_lib.paged import OutOfBlocks
from tests.mutants.ch03 import HeapPool, batch_u

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("02_contiguous_slabs.ipynb", "03_block_tables.ipynb")


def run(name: str, obj: Any, seed: int | None = 3) -> CheckResult:
    return evaluate(find_exercise(name), obj, seed=seed)


def test_every_exercise_has_five_cases_or_more() -> None:
    assert all(len(e.cases()) >= 5 for ch in ("02", "03") for e in chapter_exercises(ch))


def failing_report(name: str, obj: Any) -> str:
    result = run(name, obj)
    assert result.status == "failed"
    return result.report_text()


def test_a_crash_is_evidence() -> None:
    report = failing_report("03.block_tables", lambda pool: None)
    assert "raised AttributeError" in report


def test_grader_gives_the_solutions_full_marks_and_the_exercises_none(tmp_path: Path) -> None:
    for learner, folder in (("solver", "solutions"), ("starter", "exercises")):
        (tmp_path / learner).mkdir()
        for name in NOTEBOOKS:
            shutil.copy(ROOT / folder / name, tmp_path / learner / name)
    rows = grade_folder(tmp_path, Limits(timeout=300), jobs=2, chapters=("02", "03")).rows
    expected = {e.name for chapter in ("02", "03") for e in chapter_exercises(chapter)}
    for learner, score, status in (("solver", 1.0, "passed"), ("starter", 0.0, "not solved")):
        mine = [r for r in rows if r.learner == learner]
        assert {r.exercise for r in mine} == expected
        assert all((r.score, r.status) == (score, status) for r in mine), mine


@pytest.mark.parametrize("chapter", ["02", "03"])
def test_no_hint_states_a_formula(chapter: str) -> None:
    for exercise in chapter_exercises(chapter):
        for case in exercise.cases():
            assert not any(sign in case.hint for sign in (" x ", "//", "ceil(", " / ")), case.hint


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=40))
def test_the_lowest_first_reference_agrees_with_a_heap(ops: list[tuple[bool, int]]) -> None:
    """Any allocate/free script: same ids, same refusals, same num_free."""
    pools = [LowestFirstPool(10), HeapPool(10)]
    for is_allocate, block in ops:
        outcomes = []
        for pool in pools:
            try:
                outcomes.append(pool.allocate() if is_allocate else pool.free(block))
            except (OutOfBlocks, ValueError) as error:
                outcomes.append(type(error))
        assert outcomes[0] == outcomes[1]
        assert pools[0].num_free == pools[1].num_free()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=8).filter(any),
       st.sampled_from([1, 4, 16, 128]))
def test_batch_utilisation_is_pooled_and_bounded(lengths: list[int], block_size: int) -> None:
    from course_lib.grading.ch03 import batch_utilization

    u = batch_utilization(lengths, block_size)
    assert u == pytest.approx(batch_u(lengths, block_size))
    held = sum(blocks_needed(n, block_size) for n in lengths)
    assert sum(lengths) / (sum(lengths) + held * (block_size - 1)) <= u + 1e-12 <= 1 + 1e-12


@pytest.mark.parametrize("seed", [0, 7, 12345])
def test_each_merge_case_needs_its_merge_and_no_exact_fit(seed: int) -> None:
    """A merge case admits a request that fits only if the released slots merged, and is one
    slot short of the merged gap, so a placement that refuses exact fits still places it:
    the report names the merge, never "an exact fit"."""
    from course_lib.grading import ch02

    rng = random.Random(seed)
    sizes, tail = [rng.randint(2, 20) for _ in range(4)], rng.randint(2, 20)
    for hint, script in ch02._merge_scripts(sizes, tail, rng.randint):
        merged = ch02._run_script(LibraryFirstFit(sum(sizes) + tail), script)
        assert list(merged.values())[-1] is not None, hint
        strict = ch02._run_script(GrowingReference(sum(sizes) + tail, "strict"), script)
        assert strict == merged, hint


def test_a_head_first_free_is_told_to_free_last_block_first() -> None:
    """Both wrong orders (one batch head first, or block by block from the last, each to the
    front) leave the first block at the front of the queue; every case that shows it says so."""
    from course_lib.grading.ch03 import LAST_FIRST, HeadFirstTables

    result = run("03.block_tables", HeadFirstTables, seed=0)
    failed = [case for case in result.cases if not case.passed]
    assert failed and all(case.hint == LAST_FIRST for case in failed), result.report_text()
