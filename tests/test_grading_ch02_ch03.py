"""Chapters 02 and 03's checks: the library (behind each exercise's interface) passes every
case, other correct designs pass too, and typical mistakes fail with a report that names the
call, what came back, what was expected and a hint."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch02 import _LibraryFirstFit as LibraryFirstFit
from course_lib.grading.check import CheckResult, evaluate
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


def slot_states_numpy(slabs: list[tuple[int, int, int]]) -> list[int]:
    """Column sums of an array, checked with numpy: a list of numpy ints, not a tuple."""
    table = np.array(slabs, dtype=np.int64).reshape(-1, 3)
    reserved, written, final = table.T
    if ((written < 0) | (written > final) | (final > reserved)).any():
        raise ValueError(f"impossible slab among {slabs}")
    return [written.sum(), (final - written).sum(), (reserved - final).sum()]


def first_fit_generator(gaps: list[tuple[int, int]], size: int) -> int | None:
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"size {size!r}")
    return next((start for start, length in gaps if size <= length), None)


def no_gap_fits_sorted(gaps: list[tuple[int, int]], need: int) -> list[Any]:
    if need <= 0:
        raise ValueError(f"need {need!r}")
    lengths = sorted(length for _, length in gaps)
    short = [n for n in lengths if n < need]
    return [sum(short), len(short) == len(lengths) and sum(lengths) >= need]


OTHER_DESIGNS: list[tuple[str, Any]] = [
    ("02.slot_states", slot_states_numpy),
    ("02.first_fit", first_fit_generator),
    ("02.no_gap_fits", no_gap_fits_sorted),
    ("02.reserve_max_arena", TopDownReserveMax),
    ("02.first_fit_arena", BitmapFirstFit),
    ("03.block_pool", StackPool),
    ("03.block_tables", DictTables),
    ("03.last_block", lambda t, b: (math.ceil(t / b), (t - 1) % b + 1 if t else 0)
     if b > 0 and t >= 0 else (_ for _ in ()).throw(ValueError(t))),
]


@pytest.mark.parametrize(("name", "design"), OTHER_DESIGNS)
def test_other_correct_designs_pass(name: str, design: Any) -> None:
    result = run(name, design)
    assert result.status == "passed", result.report_text()


# --- typical mistakes: each switched on alone in an otherwise correct answer ----------------------


def slot_states_with(mistake: str) -> Any:
    def fn(slabs: list[tuple[int, int, int]]) -> tuple[int, int, int]:
        totals = [0, 0, 0]
        for reserved, written, final in slabs:
            ok = {"only_written": written <= final, "no_negative": written <= final <= reserved,
                  }.get(mistake, 0 <= written <= final <= reserved)
            if not ok:
                raise ValueError((reserved, written, final))
            never = reserved - written if mistake == "never_from_written" else reserved - final
            pending = reserved - written if mistake == "pending_to_reserved" else final - written
            for i, value in enumerate((written, pending, never)):
                totals[i] += value
        return totals[0], totals[1], totals[2]

    return fn


def first_fit_with(mistake: str) -> Any:
    def fn(gaps: list[tuple[int, int]], size: int) -> int | None:
        if size < 1 and mistake != "no_check":
            raise ValueError(size)
        fitting = [(i, start, length) for i, (start, length) in enumerate(gaps)
                   if (length > size if mistake == "strict" else length >= size)]
        if not fitting:
            return None
        if mistake == "best_fit":
            return min(fitting, key=lambda f: f[2])[1]
        if mistake == "index":
            return fitting[0][0]
        if mistake == "last_fit":
            return fitting[-1][1]
        return fitting[0][1]

    return fn


def no_gap_fits_with(mistake: str) -> Any:
    def fn(gaps: list[tuple[int, int]], need: int) -> tuple[int, bool]:
        if need < 1 and mistake != "no_check":
            raise ValueError(need)
        lengths = [length for _, length in gaps]
        short = [n for n in lengths if (n <= need if mistake == "le_short" else n < need)]
        total, largest = sum(lengths), max(lengths, default=0)
        blocked = {"strict_total": total > need > largest,
                   "ignores_largest": total >= need}.get(mistake, total >= need > largest)
        return sum(short), blocked

    return fn


class ReserveMaxWith:
    """A correct reserve-max arena; ``MISTAKE`` switches one slip on (set in a subclass)."""

    MISTAKE = ""

    def __init__(self, num_slots: int, max_len: int) -> None:
        end = num_slots if self.MISTAKE == "partial_slab" else num_slots - max_len + 1
        self.free_starts = list(range(0, end, max_len))
        self.held: dict[int, int] = {}

    def admit(self, request_id: int) -> int | None:
        if request_id in self.held and self.MISTAKE != "admit_twice":
            raise ValueError(request_id)
        if not self.free_starts:
            return None
        self.held[request_id] = self.free_starts.pop(0)
        return self.held[request_id]

    def release(self, request_id: int) -> None:
        if request_id not in self.held:
            if self.MISTAKE == "silent_release":
                return
            raise ValueError(request_id)
        if self.MISTAKE == "keeps_record":
            self.free_starts.append(self.held[request_id])
        else:
            self.free_starts.append(self.held.pop(request_id))


def reserve_max_with(mistake: str) -> type:
    return type(f"ReserveMax_{mistake}", (ReserveMaxWith,), {"MISTAKE": mistake})


class FirstFitWith:
    """A correct gap-list first-fit arena; ``MISTAKE`` switches one slip on."""

    MISTAKE = ""

    def __init__(self, num_slots: int) -> None:
        self.gaps, self.held = [(0, num_slots)], {}

    def admit(self, request_id: int, size: int) -> int | None:
        if (size < 1 and self.MISTAKE != "size_zero") or request_id in self.held:
            raise ValueError(request_id)
        for i, (start, length) in enumerate(self.gaps):
            if length > size or (length == size and self.MISTAKE != "strict"):
                self.gaps[i] = (start + size, length - size)
                self.gaps = [g for g in self.gaps if g[1]]
                self.held[request_id] = (start, size)
                return start
        return None

    def release(self, request_id: int) -> None:
        if request_id not in self.held:
            raise ValueError(request_id)
        slab = self.held[request_id] if self.MISTAKE == "keeps_record" else self.held.pop(
            request_id)
        merged: list[tuple[int, int]] = []
        for start, length in sorted([*self.gaps, slab]):
            touches = merged and merged[-1][0] + merged[-1][1] == start
            if touches and self.MISTAKE != "no_merge" and not (
                    self.MISTAKE == "merge_after_only" and (start, length) != slab):
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self.gaps = merged


def first_fit_arena_with(mistake: str) -> type:
    return type(f"FirstFit_{mistake}", (FirstFitWith,), {"MISTAKE": mistake})


MISTAKES: list[tuple[str, Any, str]] = [  # (exercise, wrong answer, evidence in a failed case)
    ("02.slot_states", slot_states_with("never_from_written"), "fn([(8192, 600, 900)"),
    ("02.slot_states", slot_states_with("pending_to_reserved"), "fn([(8192, 600, 900)"),
    ("02.slot_states", slot_states_with("only_written"), "final length past the reservation"),
    ("02.slot_states", slot_states_with("no_negative"), "a negative written count"),
    ("02.first_fit", first_fit_with("strict"), "fn(gaps=[(0, 10), (20, 50)], size=10)"),
    ("02.first_fit", first_fit_with("best_fit"), "fn(gaps=[(0, 50), (60, 10)], size=8)"),
    ("02.first_fit", first_fit_with("index"), "fn(gaps=[(30, 4), (54, 4), (83, 5), (98, 2)]"),
    ("02.first_fit", first_fit_with("last_fit"), "size=1)"),
    ("02.first_fit", first_fit_with("no_check"), "size=0)"),
    ("02.no_gap_fits", no_gap_fits_with("le_short"), "need=5)"),
    ("02.no_gap_fits", no_gap_fits_with("strict_total"), "need=15)"),
    ("02.no_gap_fits", no_gap_fits_with("ignores_largest"), "need=5)"),
    ("02.no_gap_fits", no_gap_fits_with("no_check"), "need=0)"),
    ("02.reserve_max_arena", reserve_max_with("partial_slab"), "range(5)]"),
    ("02.reserve_max_arena", reserve_max_with("keeps_record"), "arena.release(0); [arena.admit(0)"),
    ("02.reserve_max_arena", reserve_max_with("admit_twice"), "arena.admit(0); arena.admit(0)"),
    ("02.reserve_max_arena", reserve_max_with("silent_release"), "arena.release(42)"),
    ("02.first_fit_arena", first_fit_arena_with("no_merge"), "release(1); release(0); admit(4"),
    ("02.first_fit_arena", first_fit_arena_with("keeps_record"), "release(2); admit(2, 25)"),
    ("02.first_fit_arena", first_fit_arena_with("strict"), "release(1); admit(4, 20)"),
    ("02.first_fit_arena", first_fit_arena_with("merge_after_only"), "merge"),
    ("02.first_fit_arena", first_fit_arena_with("size_zero"), "arena.admit(0, 0)"),
]


def failed_text(result: CheckResult) -> str:
    return "\n".join(f"{c.call}\n{c.got}\n{c.hint}" for c in result.cases if not c.passed)


@pytest.mark.parametrize("name, wrong, evidence", MISTAKES)
def test_typical_mistakes_fail_with_evidence(name: str, wrong: Any, evidence: str) -> None:
    result = run(name, wrong)
    text = result.report_text()
    assert result.status == "failed", text
    assert evidence in failed_text(result), text
    assert "got" in text and "expected" in text and "hint" in text


@pytest.mark.parametrize("chapter", ["02"])
def test_every_exercise_has_three_mistakes_and_another_design(chapter: str) -> None:
    for exercise in chapter_exercises(chapter):
        assert sum(name == exercise.name for name, *_ in MISTAKES) >= 3, exercise.name
        assert any(name == exercise.name for name, _ in OTHER_DESIGNS), exercise.name


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
    rows = grade_folder(tmp_path, timeout=300)
    expected = {e.name for chapter in ("02", "03") for e in chapter_exercises(chapter)}
    for learner, score, status in (("solver", 1.0, "passed"), ("starter", 0.0, "not-solved")):
        mine = [r for r in rows if r.learner == learner]
        assert {r.exercise for r in mine} == expected
        assert all((r.score, r.status) == (score, status) for r in mine), mine
