"""Chapters 02 and 03's checks: the library (behind each exercise's interface) passes every
case, fresh ones included; a stub is not yet solved; the notebooks grade as they should.
Wrong answers and other right designs are in ``tests/mutants/ch02.py`` and ``ch03.py``."""

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
from course_lib.grading.ch03 import LibraryTables, LowestFirstPool, cost_per_million
from course_lib.grading.check import CheckResult, evaluate
from course_lib.grading.execute import Limits
from course_lib.grading.grade import grade_folder
from course_lib.kv_math import blocks_needed
from course_lib.paged import OutOfBlocks
from course_lib.slab import SlabAllocator
from course_lib.viz.arena_view import ArenaFrame, Reservation, arena_stats
from tests.mutants.ch03 import HeapPool, pack_with

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("02_contiguous_slabs.ipynb", "03_block_tables.ipynb")

# --- the library behind the exercises' interfaces -----------------------------------------------


def slot_states(slabs: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """The arena view's statistics over slabs laid end to end."""
    reservations, start = [], 0
    for i, (reserved, written, final) in enumerate(slabs):
        reservations.append(Reservation(str(i), start, reserved, written, final))
        start += reserved
    stats = arena_stats(ArenaFrame(max(start, 1), tuple(reservations)))
    return stats.written, stats.pending, stats.internal


def _sized_arena(gaps: list[tuple[int, int]]) -> SlabAllocator:
    """A first-fit SlabAllocator whose free gaps are ``gaps``, built by admit and free."""
    end = max((s + n for s, n in gaps), default=0) + 1
    arena = SlabAllocator(end, policy="exact-size", max_len=10**9)
    cursor, filler = 0, []
    for rid, (start, length) in enumerate(gaps):
        if start > cursor:
            arena.admit(2 * rid, start - cursor)
        arena.admit(2 * rid + 1, length)
        filler.append(2 * rid + 1)
        cursor = start + length
    arena.admit(10**6, end - cursor)  # the slot after the last gap stays taken
    for rid in filler:
        arena.free(rid)
    return arena


def first_fit(gaps: list[tuple[int, int]], size: int) -> int | None:
    arena = _sized_arena(gaps)
    return arena.admit(10**7, size).start if arena.fits(size) else None


def no_gap_fits(gaps: list[tuple[int, int]], need: int) -> tuple[int, bool]:
    arena = _sized_arena(gaps)
    return arena.stranded(need), arena.num_free >= need > arena.largest_gap


class LibraryReserveMax:
    def __init__(self, num_slots: int, max_len: int) -> None:
        self.arena = SlabAllocator(num_slots, policy="reserve-max", max_len=max_len)

    def admit(self, request_id: int) -> int | None:
        if not self.arena.fits(self.arena.max_len):
            return None
        return self.arena.admit(request_id, self.arena.max_len).start

    def release(self, request_id: int) -> None:
        self.arena.free(request_id)


def last_block(tokens: int, block_size: int) -> tuple[int, int]:
    blocks = blocks_needed(tokens, block_size)
    return blocks, tokens - (blocks - 1) * block_size if blocks else 0


def batch_u(lengths: list[int], block_size: int) -> float:
    """Through the library's per-sequence helpers: tokens over slots, pooled."""
    if block_size < 1 or any(n < 0 for n in lengths) or not sum(lengths):
        raise ValueError(f"no utilisation for {lengths} in blocks of {block_size}")
    return sum(lengths) / sum(blocks_needed(n, block_size) * block_size for n in lengths)


LIBRARY: dict[str, Any] = {
    "02.slot_states": slot_states,
    "02.first_fit": first_fit,
    "02.no_gap_fits": no_gap_fits,
    "02.reserve_max_arena": LibraryReserveMax,
    "02.first_fit_arena": LibraryFirstFit,
    "02.growing_arena": GrowingReference,
    "03.last_block": last_block,
    "03.u_paged": batch_u,
    "03.block_pool": LowestFirstPool,
    "03.block_tables": LibraryTables,
    "03.cost_per_million": cost_per_million,
    "03.pack_tables": pack_with(),
}


def run(name: str, obj: Any, seed: int | None = 3) -> CheckResult:
    return evaluate(find_exercise(name), obj, seed=seed)


def test_every_exercise_has_a_library_answer() -> None:
    names = {e.name for chapter in ("02", "03") for e in chapter_exercises(chapter)}
    assert names == set(LIBRARY)
    assert all(len(e.cases()) >= 5 for ch in ("02", "03") for e in chapter_exercises(ch))


@pytest.mark.parametrize("name", sorted(LIBRARY))
@pytest.mark.parametrize("seed", [3, 7, 12345])
def test_the_library_passes_every_case(name: str, seed: int) -> None:
    result = run(name, LIBRARY[name], seed)
    assert result.status == "passed", result.report_text()


def failing_report(name: str, obj: Any) -> str:
    result = run(name, obj)
    assert result.status == "failed"
    return result.report_text()


def test_a_stub_is_not_yet_solved_and_a_crash_is_evidence() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError

    class StubClass:
        def __init__(self, *args: Any) -> None:
            raise NotImplementedError

    for name in LIBRARY:
        assert run(name, StubClass if name.split(".")[1].endswith(
            ("arena", "pool", "tables")) else stub).status == "not-solved"
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
