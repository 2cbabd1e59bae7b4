"""Chapters 02 and 03's checks: the library (behind each exercise's interface) passes every
case, other correct designs pass too, and typical mistakes fail with a report that names the
call, what came back, what was expected and a hint."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch02 import _LibraryFirstFit as LibraryFirstFit
from course_lib.grading.check import CheckResult, evaluate
from course_lib.grading.execute import Limits
from course_lib.grading.grade import grade_folder
from course_lib.kv_math import blocks_needed, paged_utilization
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.simulator import CostModel
from course_lib.slab import SlabAllocator
from course_lib.viz.arena_view import ArenaFrame, Reservation, arena_stats

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


def cost_per_million(output_tokens: int, steps: int, step_seconds: float = 0.025,
                     price_per_hour: float = 250.0) -> float:
    costs = CostModel(step_seconds=step_seconds, price_per_hour=price_per_hour)
    if output_tokens <= 0:
        raise ValueError(f"output_tokens must be positive, got {output_tokens!r}")
    seconds = steps * costs.step_time(0, 0, 0, 0)
    return costs.price_per_hour * seconds / 3600 / output_tokens * 1e6


LIBRARY: dict[str, Any] = {
    "02.slot_states": slot_states,
    "02.first_fit": first_fit,
    "02.no_gap_fits": no_gap_fits,
    "02.reserve_max_arena": LibraryReserveMax,
    "02.first_fit_arena": LibraryFirstFit,
    "03.last_block": last_block,
    "03.u_paged": paged_utilization,
    "03.block_pool": lambda num_blocks: BlockPool(num_blocks, 16),
    "03.block_tables": PagedKVManager,
    "03.cost_per_million": cost_per_million,
}


def run(name: str, obj: Any) -> CheckResult:
    return evaluate(find_exercise(name), obj)


def test_every_exercise_has_a_library_answer() -> None:
    names = {e.name for chapter in ("02", "03") for e in chapter_exercises(chapter)}
    assert names == set(LIBRARY)
    assert all(len(e.cases()) >= 5 for ch in ("02", "03") for e in chapter_exercises(ch))


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_the_library_passes_every_case(name: str) -> None:
    result = run(name, LIBRARY[name])
    assert result.status == "passed", result.report_text()


# --- other correct designs pass -----------------------------------------------------------------


class TopDownReserveMax:
    """Hands out slabs from the end of the arena down, tracking slot indices in a list."""

    def __init__(self, num_slots: int, max_len: int) -> None:
        self.free_starts = [num_slots - (i + 1) * max_len for i in range(num_slots // max_len)]
        self.held: dict[int, int] = {}

    def admit(self, request_id: int) -> int | None:
        if request_id in self.held:
            raise ValueError(f"request {request_id} already holds a slab")
        if not self.free_starts:
            return None
        self.held[request_id] = self.free_starts.pop(0)
        return self.held[request_id]

    def release(self, request_id: int) -> None:
        if request_id not in self.held:
            raise ValueError(f"request {request_id} holds no slab")
        self.free_starts.append(self.held.pop(request_id))


class BitmapFirstFit:
    """First fit over a list of slot owners: no gap list at all, merging comes for free."""

    def __init__(self, num_slots: int) -> None:
        self.owner: list[int | None] = [None] * num_slots

    def admit(self, request_id: int, size: int) -> int | None:
        if size < 1 or request_id in self.owner:
            raise ValueError(f"bad admission of {request_id} with size {size}")
        run = 0
        for slot, owner in enumerate(self.owner):
            run = run + 1 if owner is None else 0
            if run == size:
                start = slot - size + 1
                self.owner[start:slot + 1] = [request_id] * size
                return start
        return None

    def release(self, request_id: int) -> None:
        if request_id not in self.owner:
            raise ValueError(f"request {request_id} holds no slab")
        self.owner = [None if o == request_id else o for o in self.owner]


class StackPool:
    """LIFO free list, num_free as a method: a different design from the library's."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.stack = list(range(num_blocks - 1, 0, -1))

    def num_free(self) -> int:
        return len(self.stack)

    def allocate(self) -> int:
        if not self.stack:
            raise OutOfBlocks(1, 0)
        return self.stack.pop()

    def free(self, block_id: int) -> None:
        if not 0 < block_id < self.num_blocks or block_id in self.stack:
            raise ValueError(f"cannot free block {block_id!r}")
        self.stack.append(block_id)


class DictTables:
    """Block tables kept as (table, length) pairs in a dict."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.seqs = pool, {}
        self.block_size = pool.block_size

    def add_sequence(self, seq_id: str, num_tokens: int) -> None:
        self.seqs[seq_id] = ([], 0)
        self.append_tokens(seq_id, num_tokens)

    def append_tokens(self, seq_id: str, num_tokens: int = 1) -> None:
        table, length = self.seqs[seq_id]
        while len(table) * self.block_size < length + num_tokens:
            table.append(self.pool.allocate())
        self.seqs[seq_id] = (table, length + num_tokens)

    def block_table(self, seq_id: str) -> list[int]:
        return self.seqs[seq_id][0]

    def free_sequence(self, seq_id: str) -> None:
        if seq_id not in self.seqs:
            raise ValueError(f"unknown sequence {seq_id!r}")
        for block in self.seqs.pop(seq_id)[0]:
            self.pool.free(block)


@pytest.mark.parametrize(("name", "design"), [
    ("02.reserve_max_arena", TopDownReserveMax),
    ("02.first_fit_arena", BitmapFirstFit),
    ("03.block_pool", StackPool),
    ("03.block_tables", DictTables),
    ("03.last_block", lambda t, b: (math.ceil(t / b), (t - 1) % b + 1 if t else 0)
     if b > 0 and t >= 0 else (_ for _ in ()).throw(ValueError(t))),
])
def test_other_correct_designs_pass(name: str, design: Any) -> None:
    result = run(name, design)
    assert result.status == "passed", result.report_text()


# --- typical mistakes fail with a helpful report --------------------------------------------------


class NoMergeFirstFit(LibraryFirstFit):
    """Frees without merging neighbours: the classic first-fit bug."""

    def __init__(self, num_slots: int) -> None:
        self.gaps, self.held = [(0, num_slots)], {}

    def admit(self, request_id: int, size: int) -> int | None:
        if size < 1 or request_id in self.held:
            raise ValueError(request_id)
        for i, (start, length) in enumerate(self.gaps):
            if length >= size:
                self.gaps[i] = (start + size, length - size)
                self.held[request_id] = (start, size)
                return start
        return None

    def release(self, request_id: int) -> None:
        if request_id not in self.held:
            raise ValueError(request_id)
        self.gaps = sorted([*self.gaps, self.held.pop(request_id)])


class NoNullPool(StackPool):
    """Hands out block 0 too."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.stack.append(0)


class EagerTables(DictTables):
    """Allocates a block on every append, full or not."""

    def append_tokens(self, seq_id: str, num_tokens: int = 1) -> None:
        table, length = self.seqs[seq_id]
        table.append(self.pool.allocate())
        self.seqs[seq_id] = (table, length + num_tokens)


def failing_report(name: str, obj: Any) -> str:
    result = run(name, obj)
    assert result.status == "failed"
    return result.report_text()


@pytest.mark.parametrize(("name", "wrong", "evidence"), [
    ("02.slot_states", lambda slabs: (sum(w for _, w, _ in slabs), 0, 0),
     ["FAIL fn([(8192, 600, 900)", "expected (1900, 3300, 19376)", "hint     written slots"]),
    ("02.first_fit", lambda gaps, size: min(((n, s) for s, n in gaps if n >= size),
                                            default=(0, None))[1],
     ["FAIL fn(gaps=[(0, 50), (60, 10)], size=8)", "got      60", "expected 0"]),
    ("02.no_gap_fits", lambda gaps, need: (sum(n for _, n in gaps if n < need),
                                           sum(n for _, n in gaps) >= need),
     ["FAIL fn(gaps=[(30, 4), (54, 4), (83, 5), (98, 2)], need=5)",
      "got      (10, True)", "expected (10, False)", "but no single gap does"]),
    ("02.first_fit_arena", NoMergeFirstFit,
     ["release(1); release(0); admit(4, 45)", "got      [0, 30, 50, 75, None]",
      "expected [0, 30, 50, 75, 0]", "merge them into one gap"]),
    ("03.u_paged", lambda t, b: t / (t // b * b) if t % b == 0 else t / ((t // b) * b + 1),
     ["FAIL fn(tokens=900, block_size=16)", "expected 0.986842105263157", "U_paged = L"]),
    ("03.block_pool", NoNullPool,
     ["FAIL pool = cls(8); [pool.allocate() for _ in range(7)]",
      "expected 7 different ids, each in 1..7 (0 is the null block)"]),
    ("03.block_tables", EagerTables,
     ["FAIL m = cls(BlockPool(8, 16)); add_sequence('a', 0); table length after each of 40",
      "got      [(1, 3), (2, 4, 5), 10]", "expected [(1, 2, 4), (3, 5), 10]",
      "hint     two sequences interleave"]),
    ("03.cost_per_million", lambda tokens, steps, s=0.025, p=250.0: p * steps * s / tokens,
     ["FAIL fn(output_tokens=", "hint     seconds = steps x step_seconds"]),
])
def test_typical_mistakes_fail_helpfully(name: str, wrong: Any, evidence: list[str]) -> None:
    report = failing_report(name, wrong)
    for piece in evidence:
        assert piece in report, report


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
