"""Chapters 02 and 03's checks: the library (behind each exercise's interface) passes every
case, other correct designs pass too, and typical mistakes fail with a report that names the
call, what came back, what was expected and a hint."""

from __future__ import annotations

import heapq
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
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
from course_lib.paged import BlockPool, OutOfBlocks
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
    "03.pack_tables": lambda *args: pack_with()(*args),  # defined with the mistakes below
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


class GrowingGaps:
    """A growing arena that keeps slabs only and derives the gaps; ``MISTAKE`` switches one
    slip on (empty: correct)."""

    MISTAKE = ""

    def __init__(self, num_slots: int) -> None:
        self.num_slots, self.slabs, self.copied = num_slots, {}, 0
        self.known: set[int] = set()

    def _first(self, size: int, ignore: int | None = None) -> int | None:
        cursor = 0
        taken = sorted(v for k, v in self.slabs.items() if k != ignore)
        for start, length in [*taken, (self.num_slots, 0)]:
            gap = start - cursor
            if gap > size or (gap == size and self.MISTAKE != "strict"):
                return cursor
            cursor = max(cursor, start + length)
        return None

    def admit(self, request_id: int, length: int) -> int | None:
        if request_id in self.known or length < 1:
            raise ValueError(f"cannot admit {request_id!r} with {length!r} slots")
        start = self._first(length)
        if start is not None:
            self.slabs[request_id] = (start, length)
            self.known.add(request_id)
        return start

    def append(self, request_id: int) -> int | None:
        if request_id not in self.slabs:
            raise ValueError(f"request {request_id!r} holds no slab")
        start, size = self.slabs[request_id]
        end = start + size
        inside = end < self.num_slots or self.MISTAKE == "past_end"
        free = inside and not any(s <= end < s + n for s, n in self.slabs.values())
        if free and self.MISTAKE != "always_move":
            self.slabs[request_id] = (start, size + 1)
            return start
        new = self._first(size + 1, request_id if self.MISTAKE == "own_slots_free" else None)
        if new is None:
            if self.MISTAKE == "refused_frees":
                del self.slabs[request_id]
            return None
        self.slabs[request_id] = (new, size + 1)
        self.copied += size + (self.MISTAKE == "copies_new_size")
        return new

    def release(self, request_id: int) -> None:
        if request_id not in self.known:
            raise ValueError(f"request {request_id!r} holds no slab")
        del self.slabs[request_id]
        if self.MISTAKE != "keeps_record":
            self.known.remove(request_id)


def growing_with(mistake: str) -> type:
    return type(f"Growing_{mistake}", (GrowingGaps,), {"MISTAKE": mistake})


def pack_with(mistake: str = "") -> Any:
    """Pads rows; ``mistake`` switches one slip on (empty: correct)."""
    def fn(tables: list[list[int]], seq_lens: list[int], block_size: int) -> list[list[int]]:
        if len(tables) != len(seq_lens) and mistake != "zip_loose":
            raise ValueError(f"{len(tables)} tables, {len(seq_lens)} lengths")
        pairs = list(zip(tables, seq_lens, strict=False))
        for table, length in pairs[:1] if mistake == "check_first" else pairs:
            if len(table) != blocks_needed(length, block_size):
                raise ValueError(f"table {table} does not fit length {length}")
            if 0 in table and mistake != "null_allowed":
                raise ValueError(f"table {table} holds the null block")
        width = len(tables[0]) if mistake == "first_width" and tables else max(
            map(len, tables), default=0)
        pad = -1 if mistake == "pad_minus_one" else 0
        if mistake == "mutates":
            for table in tables:
                table.extend([pad] * (width - len(table)))
            return tables
        return [table + [pad] * (width - len(table)) for table in tables]

    return fn


def pack_numpy(tables: list[list[int]], seq_lens: list[int], block_size: int) -> Any:
    """Another design: a zero array filled row by row (an array, not lists)."""
    if len(tables) != len(seq_lens):
        raise ValueError("one length per table")
    need = [math.ceil(n / block_size) for n in seq_lens]
    if [len(t) for t in tables] != need or any(0 in t for t in tables):
        raise ValueError(f"tables {tables} do not match lengths {seq_lens}")
    out = np.zeros((len(tables), max(need, default=0)), dtype=np.int32)
    for row, table in zip(out, tables, strict=True):
        row[:len(table)] = table
    return out


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


class HeapPool:
    """Lowest first with a heap and an in-use set; num_free as a method."""

    def __init__(self, num_blocks: int) -> None:
        self.heap = list(range(1, num_blocks))
        self.in_use: set[int] = set()

    def num_free(self) -> int:
        return len(self.heap)

    def allocate(self) -> int:
        if not self.heap:
            raise OutOfBlocks(1, 0)
        block = heapq.heappop(self.heap)
        self.in_use.add(block)
        return block

    def free(self, block_id: int) -> None:
        if block_id not in self.in_use:
            raise ValueError(f"block {block_id!r} is not in use")
        self.in_use.remove(block_id)
        heapq.heappush(self.heap, block_id)


class BitmapPool:
    """Lowest first by scanning a list of flags (slow, and just as correct)."""

    def __init__(self, num_blocks: int) -> None:
        self.used = [True] + [False] * (num_blocks - 1)

    @property
    def num_free(self) -> int:
        return self.used.count(False)

    def allocate(self) -> int:
        if all(self.used):
            raise OutOfBlocks(1, 0)
        block = self.used.index(False)
        self.used[block] = True
        return block

    def free(self, block_id: int) -> None:
        if not 0 < block_id < len(self.used) or not self.used[block_id]:
            raise ValueError(f"cannot free block {block_id!r}")
        self.used[block_id] = False


class SlotListTables:
    """Keeps every token's slot (not the length): the table is derived from the slots."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.slots = pool, {}

    def add_sequence(self, seq_id: str, num_tokens: int) -> list[int]:
        if seq_id in self.slots or num_tokens < 0:
            raise ValueError(f"cannot add {seq_id!r} with {num_tokens!r} tokens")
        self.slots[seq_id] = []
        try:
            return self._grow(seq_id, num_tokens)
        except OutOfBlocks:
            del self.slots[seq_id]
            raise

    def append_tokens(self, seq_id: str, num_tokens: int = 1) -> list[int]:
        if seq_id not in self.slots or num_tokens < 1:
            raise ValueError(f"cannot append {num_tokens!r} to {seq_id!r}")
        return self._grow(seq_id, num_tokens)

    def _grow(self, seq_id: str, count: int) -> list[int]:
        size, slots = self.pool.block_size, self.slots[seq_id]
        room = -len(slots) % size
        needed = -(-(count - room) // size) if count > room else 0
        if needed > self.pool.num_free:
            raise OutOfBlocks(needed, self.pool.num_free)
        new = [slots[-1] + 1 + i for i in range(min(room, count))] if room else []
        for _ in range(needed):
            block = self.pool.allocate()
            new += [block * size + i for i in range(size)]
        new = new[:count]
        slots.extend(new)
        return new

    def block_table(self, seq_id: str) -> list[int]:
        if seq_id not in self.slots:
            raise ValueError(f"unknown sequence {seq_id!r}")
        return [s // self.pool.block_size for s in self.slots[seq_id][::self.pool.block_size]]

    def free_sequence(self, seq_id: str) -> None:
        for block in reversed(self.block_table(seq_id)):
            self.pool.free(block)
        del self.slots[seq_id]


def cost_by_phases(steps: list[tuple[int, int, int]], bytes_per_token: int,
                   step_seconds: float = 0.025, kv_read_bandwidth: float = 3e12,
                   prefill_seconds_per_token: float = 4e-5,
                   price_per_hour: float = 250.0) -> float:
    """Sums each time term over the run first, then prices: another order of operations."""
    decoded = sum(d for d, _, _ in steps)
    if decoded < 1:
        raise ValueError(f"no decoded tokens in {len(steps)} steps")
    seconds = (len(steps) * step_seconds
               + sum(kv for _, kv, _ in steps) * bytes_per_token / kv_read_bandwidth
               + sum(p for _, _, p in steps) * prefill_seconds_per_token)
    return seconds / 3600 * price_per_hour * 1_000_000 / decoded


def batch_u_numpy(lengths: list[int], block_size: int) -> float:
    array = np.asarray(lengths, dtype=np.int64)
    if block_size < 1 or (array < 0).any() or array.sum() == 0:
        raise ValueError(f"no utilisation for {lengths}")
    return float(array.sum() / (np.ceil(array / block_size) * block_size).sum())


OTHER_DESIGNS: list[tuple[str, Any]] = [
    ("02.slot_states", slot_states_numpy),
    ("02.first_fit", first_fit_generator),
    ("02.no_gap_fits", no_gap_fits_sorted),
    ("02.reserve_max_arena", TopDownReserveMax),
    ("02.first_fit_arena", BitmapFirstFit),
    ("02.growing_arena", GrowingGaps),
    ("03.last_block", lambda t, b: (math.ceil(t / b), (t - 1) % b + 1 if t else 0)
     if b > 0 and t >= 0 else (_ for _ in ()).throw(ValueError(t))),
    ("03.u_paged", batch_u_numpy),
    ("03.block_pool", HeapPool),
    ("03.block_pool", BitmapPool),
    ("03.block_tables", SlotListTables),
    ("03.cost_per_million", cost_by_phases),
    ("03.pack_tables", pack_numpy),
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


def last_block_with(mistake: str) -> Any:
    def fn(tokens: int, block_size: int) -> tuple[int, int]:
        if block_size < 1 or (tokens < 0 and mistake != "no_negative"):
            raise ValueError((tokens, block_size))
        blocks = tokens // block_size if mistake == "floor" else -(-tokens // block_size)
        if mistake == "modulo":
            return blocks, tokens % block_size
        if mistake == "empty_full":
            return blocks, (tokens - 1) % block_size + 1
        return blocks, tokens - (blocks - 1) * block_size if blocks else 0

    return fn


def batch_u_with(mistake: str) -> Any:
    def fn(lengths: list[int], block_size: int) -> float:
        if block_size < 1 or not sum(lengths) or (
                mistake != "no_negative" and any(n < 0 for n in lengths)):
            raise ValueError(lengths)
        held = [max(1, blocks_needed(n, block_size)) if mistake == "empty_takes_block"
                else (n // block_size or 1 if mistake == "floor" else -(-n // block_size))
                for n in lengths]
        if mistake == "mean_of_ratios":
            return sum(n / (h * block_size) for n, h in zip(lengths, held, strict=True)
                       if n) / len([n for n in lengths if n])
        return sum(lengths) / (sum(held) * block_size)

    return fn


class PoolWith(HeapPool):
    MISTAKE = ""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.size = num_blocks
        if self.MISTAKE == "hands_out_null":
            self.heap.insert(0, 0)

    def num_free(self) -> int:
        return len(self.heap) + (self.MISTAKE == "counts_null")

    def free(self, block_id: int) -> None:
        if self.MISTAKE == "range_check_only":
            if not 0 < block_id < self.size:
                raise ValueError(block_id)
            self.in_use.discard(block_id)
            heapq.heappush(self.heap, block_id)
            return
        super().free(block_id)


def pool_with(mistake: str) -> type:
    return type(f"Pool_{mistake}", (PoolWith,), {"MISTAKE": mistake})


class QueuePool(LowestFirstPool):
    """The lecture's free queue (a freed block goes to the front), transcribed: correct
    checks, but not lowest first."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.pool = BlockPool(num_blocks, 1)

    def allocate(self) -> int:
        return self.pool.allocate()


class TablesWith:
    """Block tables as (table, length) in a dict; ``MISTAKE`` switches one slip on."""

    MISTAKE = ""

    def __init__(self, pool: Any) -> None:
        self.pool, self.seqs = pool, {}
        self.freed: dict[str, Any] = {}

    def add_sequence(self, seq_id: str, num_tokens: int) -> list[int]:
        if seq_id in self.seqs or seq_id in self.freed or num_tokens < 0:
            raise ValueError(seq_id)
        if self.MISTAKE == "add_not_atomic":
            self.seqs[seq_id] = ([], 0)
            return self._grow(seq_id, num_tokens)
        self.seqs[seq_id] = ([], 0)
        try:
            return self._grow(seq_id, num_tokens)
        except OutOfBlocks:
            del self.seqs[seq_id]
            raise

    def append_tokens(self, seq_id: str, num_tokens: int = 1) -> list[int]:
        if seq_id not in self.seqs or num_tokens < 1:
            raise ValueError(seq_id)
        return self._grow(seq_id, num_tokens)

    def _grow(self, seq_id: str, count: int) -> list[int]:
        size = self.pool.block_size
        table, length = self.seqs[seq_id]
        target = length + count
        needed = -(-target // size) - len(table)
        if self.MISTAKE == "eager":
            needed = max(needed, 1)
        if self.MISTAKE == "floor":
            needed = target // size - len(table)
        if needed > self.pool.num_free and self.MISTAKE != "not_atomic":
            raise OutOfBlocks(needed, self.pool.num_free)
        for _ in range(max(needed, 0)):
            table.append(self.pool.allocate())
        self.seqs[seq_id] = (table, target)
        if self.MISTAKE == "slot_ignores_table":
            return list(range(length, target))
        return [table[p // size] * size + p % size for p in range(length, target)]

    def block_table(self, seq_id: str) -> list[int]:
        if seq_id in self.freed:
            return self.freed[seq_id]
        if seq_id not in self.seqs:
            raise ValueError(seq_id)
        return list(self.seqs[seq_id][0])

    def free_sequence(self, seq_id: str) -> None:
        if seq_id not in self.seqs:
            raise ValueError(seq_id)
        table, _ = self.seqs.pop(seq_id)
        for block in table if self.MISTAKE == "frees_head_first" else reversed(table):
            self.pool.free(block)
        if self.MISTAKE == "keeps_record":
            self.freed[seq_id] = table


def tables_with(mistake: str) -> type:
    return type(f"Tables_{mistake}", (TablesWith,), {"MISTAKE": mistake})


def cost_with(mistake: str) -> Any:
    def fn(steps: list[tuple[int, int, int]], bytes_per_token: int, step_seconds: float = 0.025,
           kv_read_bandwidth: float = 3e12, prefill_seconds_per_token: float = 4e-5,
           price_per_hour: float = 250.0) -> float:
        if mistake == "no_idle":
            steps = [s for s in steps if s[0]]
        decoded = sum(d + (p if mistake == "prefill_as_output" else 0) for d, _, p in steps)
        if decoded < 1:
            raise ValueError(steps)
        kv_bytes = 0 if mistake == "no_kv" else bytes_per_token
        seconds = sum(step_seconds + kv * kv_bytes / kv_read_bandwidth
                      + p * prefill_seconds_per_token for _, kv, p in steps)
        per_token = seconds / (1 if mistake == "seconds_not_hours" else 3600) \
            * price_per_hour / decoded
        return per_token if mistake == "per_token" else per_token * 1e6

    return fn


MISTAKES += [
    ("02.growing_arena", growing_with("always_move"), "grows in place while the next slot"),
    ("02.growing_arena", growing_with("own_slots_free"), "still holds its old slots"),
    ("02.growing_arena", growing_with("strict"), "exactly length + 1"),
    ("02.growing_arena", growing_with("past_end"), "the arena ends after its last slot"),
    ("02.growing_arena", growing_with("refused_frees"), "a refused append changes nothing"),
    ("02.growing_arena", growing_with("copies_new_size"), "every move copies"),
    ("02.growing_arena", growing_with("keeps_record"), "release(0); release(0)"),
    ("03.last_block", last_block_with("modulo"), "fn(tokens=896, block_size=16)"),
    ("03.last_block", last_block_with("floor"), "fn(tokens=900, block_size=16)"),
    ("03.last_block", last_block_with("empty_full"), "fn(tokens=0, block_size=16)"),
    ("03.last_block", last_block_with("no_negative"), "fn(tokens=-1, block_size=16)"),
    ("03.u_paged", batch_u_with("mean_of_ratios"), "lengths=[1, 17, 33]"),
    ("03.u_paged", batch_u_with("floor"), "lengths=[900]"),
    ("03.u_paged", batch_u_with("empty_takes_block"), "lengths=[900, 0, 16]"),
    ("03.u_paged", batch_u_with("no_negative"), "lengths=[10, -1]"),
    ("03.block_pool", QueuePool, "free(2); free(5); allocate()"),
    ("03.block_pool", pool_with("hands_out_null"), "null block"),
    ("03.block_pool", pool_with("counts_null"), "num_free counts"),
    ("03.block_pool", pool_with("range_check_only"), "a double free"),
    ("03.block_tables", tables_with("eager"), "table length after each of 40"),
    ("03.block_tables", tables_with("not_atomic"), "a needs 2 more blocks and 1 is free"),
    ("03.block_tables", tables_with("add_not_atomic"), "b is not created"),
    ("03.block_tables", tables_with("slot_ignores_table"), "two sequences interleave"),
    ("03.block_tables", tables_with("floor"), "raised IndexError"),
    ("03.block_tables", tables_with("keeps_record"), "its id may start again"),
    ("03.block_tables", tables_with("frees_head_first"), "its id may start again"),
    ("03.cost_per_million", cost_with("no_idle"), "an idle step costs time too"),
    ("03.cost_per_million", cost_with("no_kv"), "one step of 60 requests"),
    ("03.cost_per_million", cost_with("prefill_as_output"), "a prefill step, then decode"),
    ("03.cost_per_million", cost_with("seconds_not_hours"), "every step costs time"),
    ("03.cost_per_million", cost_with("per_token"), "(millions of them)"),
    ("03.pack_tables", pack_with("pad_minus_one"), "three sequences, one still empty"),
    ("03.pack_tables", pack_with("first_width"), "after a sequence was freed"),
    ("03.pack_tables", pack_with("mutates"), "three sequences, one still empty"),
    ("03.pack_tables", pack_with("check_first"), "the second table is one block short"),
    ("03.pack_tables", pack_with("null_allowed"), "holding the null block"),
    ("03.pack_tables", pack_with("zip_loose"), "two tables, one length"),
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


@pytest.mark.parametrize("chapter", ["02", "03"])
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
