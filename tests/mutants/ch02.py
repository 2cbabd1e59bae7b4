"""Chapter 02: wrong answers, each with the hint its report must show first, and right
answers of other designs. Each wrong answer is a correct design with one slip switched on."""

from __future__ import annotations

from typing import Any

import numpy as np

from course_lib.grading.ch02 import GrowingReference
from course_lib.grading.ch02 import _LibraryFirstFit as LibraryFirstFit
from course_lib.slab import SlabAllocator
from course_lib.viz.arena_view import ArenaFrame, Reservation, arena_stats
from tests.mutants import Mutant, Right


def _placed(fitting: list[tuple[int, int]], mistake: str) -> int | None:
    """The start a first-fit arena picks among ``fitting`` gaps, or the one a best-fit or
    worst-fit slip picks."""
    if not fitting:
        return None
    if mistake in ("best_fit", "worst_fit"):
        pick = min if mistake == "best_fit" else max
        return pick(fitting, key=lambda gap: gap[1])[0]
    return fitting[0][0]


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
        cursor, fitting = 0, []
        taken = sorted(v for k, v in self.slabs.items() if k != ignore)
        for start, length in [*taken, (self.num_slots, 0)]:
            gap = start - cursor
            if gap > size or (gap == size and self.MISTAKE != "strict"):
                fitting.append((cursor, gap))
            cursor = max(cursor, start + length)
        return _placed(fitting, self.MISTAKE)

    def admit(self, request_id: int, length: int) -> int | None:
        too_small = length == 0 if self.MISTAKE == "negative" else length < 1
        if request_id in self.known or too_small:
            raise ValueError(f"cannot admit {request_id!r} with {length!r} slots")
        start = self._first(length)
        if start is not None:
            self.slabs[request_id] = (start, length)
        if start is not None or self.MISTAKE == "refused_records":
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
        if mistake == "worst_fit":
            return max(fitting, key=lambda f: f[2])[1]
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
            if self.MISTAKE == "refused_records":
                self.held[request_id] = -1
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
        too_small = {"size_zero": False, "negative": size == 0}.get(self.MISTAKE, size < 1)
        if too_small or request_id in self.held:
            raise ValueError(request_id)
        fitting = [(start, length) for start, length in self.gaps
                   if length > size or (length == size and self.MISTAKE != "strict")]
        start = _placed(fitting, self.MISTAKE)
        if start is None:
            if self.MISTAKE == "refused_records":
                self.held[request_id] = (0, 0)
            return None
        i = next(i for i, gap in enumerate(self.gaps) if gap[0] == start)
        self.gaps[i] = (start + size, self.gaps[i][1] - size)
        self.gaps = [g for g in self.gaps if g[1]]
        self.held[request_id] = (start, size)
        return start

    def release(self, request_id: int) -> None:
        if request_id not in self.held:
            raise ValueError(request_id)
        slab = self.held[request_id] if self.MISTAKE == "keeps_record" else self.held.pop(
            request_id)
        merged: list[tuple[int, int]] = []
        for start, length in sorted([*self.gaps, slab]):
            touches = merged and merged[-1][0] + merged[-1][1] == start
            if touches and self.MISTAKE != "no_merge" and not (
                    self.MISTAKE == "merge_after_only" and (start, length) != slab) and not (
                    self.MISTAKE == "no_merge_left" and (start, length) == slab):
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self.gaps = merged


def first_fit_arena_with(mistake: str) -> type:
    return type(f"FirstFit_{mistake}", (FirstFitWith,), {"MISTAKE": mistake})


MUTANTS = [
    Mutant("02.slot_states", "never_from_written", slot_states_with("never_from_written"),
           "count it from the final length"),
    Mutant("02.slot_states", "pending_to_reserved", slot_states_with("pending_to_reserved"),
           "between the tokens written so far and the request's final length"),
    Mutant("02.slot_states", "only_written", slot_states_with("only_written"),
           "cannot pass its reservation"),
    Mutant("02.slot_states", "no_negative", slot_states_with("no_negative"),
           "negative count of written tokens"),
    Mutant("02.first_fit", "strict", first_fit_with("strict"), "an exact fit counts"),
    Mutant("02.first_fit", "best_fit", first_fit_with("best_fit"), "not the tightest gap"),
    Mutant("02.first_fit", "worst_fit", first_fit_with("worst_fit"), "not the largest gap"),
    Mutant("02.first_fit", "index", first_fit_with("index"), "not its position in the list"),
    Mutant("02.first_fit", "last_fit", first_fit_with("last_fit"), "not the last one"),
    Mutant("02.first_fit", "no_check", first_fit_with("no_check"),
           "refuse every size below 1"),
    Mutant("02.no_gap_fits", "le_short", no_gap_fits_with("le_short"),
           "its slots are not stranded"),
    Mutant("02.no_gap_fits", "strict_total", no_gap_fits_with("strict_total"),
           "add up to exactly need"),
    Mutant("02.no_gap_fits", "ignores_largest", no_gap_fits_with("ignores_largest"),
           "one that fits a gap is not blocked"),
    Mutant("02.no_gap_fits", "no_check", no_gap_fits_with("no_check"),
           "refuse every need below 1"),
    Mutant("02.reserve_max_arena", "partial_slab", reserve_max_with("partial_slab"),
           "None when no free run of max_len"),
    Mutant("02.reserve_max_arena", "keeps_record", reserve_max_with("keeps_record"),
           "the same id may be admitted again"),
    Mutant("02.reserve_max_arena", "admit_twice", reserve_max_with("admit_twice"),
           "already holds a slab"),
    Mutant("02.reserve_max_arena", "silent_release", reserve_max_with("silent_release"),
           "a second release is a bug"),
    Mutant("02.reserve_max_arena", "refused_records", reserve_max_with("refused_records"),
           "a refused admit (None) changes nothing"),
    Mutant("02.first_fit_arena", "no_merge", first_fit_arena_with("no_merge"), "merge"),
    Mutant("02.first_fit_arena", "merge_after_only", first_fit_arena_with("merge_after_only"),
           "the free gap on its RIGHT"),
    Mutant("02.first_fit_arena", "no_merge_left", first_fit_arena_with("no_merge_left"),
           "the free gap on its LEFT"),
    Mutant("02.first_fit_arena", "keeps_record", first_fit_arena_with("keeps_record"),
           "the same id may be admitted again"),
    Mutant("02.first_fit_arena", "strict", first_fit_arena_with("strict"),
           "an exact fit counts"),
    Mutant("02.first_fit_arena", "size_zero", first_fit_arena_with("size_zero"),
           "a slab of 0 slots"),
    Mutant("02.first_fit_arena", "negative", first_fit_arena_with("negative"),
           "a negative size"),
    Mutant("02.first_fit_arena", "best_fit", first_fit_arena_with("best_fit"),
           "not the tightest gap"),
    Mutant("02.first_fit_arena", "worst_fit", first_fit_arena_with("worst_fit"),
           "not the largest gap"),
    Mutant("02.first_fit_arena", "refused_records", first_fit_arena_with("refused_records"),
           "a refused admit (None) changes nothing"),
    Mutant("02.growing_arena", "always_move", growing_with("always_move"),
           "grows in place while the next slot is free"),
    Mutant("02.growing_arena", "own_slots_free", growing_with("own_slots_free"),
           "still holds its old slots"),
    Mutant("02.growing_arena", "strict", growing_with("strict"), "an exact fit counts"),
    Mutant("02.growing_arena", "past_end", growing_with("past_end"),
           "the arena ends after its last slot"),
    Mutant("02.growing_arena", "refused_frees", growing_with("refused_frees"),
           "a refused append changes nothing"),
    Mutant("02.growing_arena", "copies_new_size", growing_with("copies_new_size"),
           "arena.copied counts the token slots moves have copied"),
    Mutant("02.growing_arena", "keeps_record", growing_with("keeps_record"),
           "a released request holds no slab"),
    Mutant("02.growing_arena", "best_fit", growing_with("best_fit"), "not the tightest gap"),
    Mutant("02.growing_arena", "worst_fit", growing_with("worst_fit"), "not the largest gap"),
    Mutant("02.growing_arena", "refused_records", growing_with("refused_records"),
           "a refused admit (None) changes nothing"),
    Mutant("02.growing_arena", "negative", growing_with("negative"), "a negative length"),
]

# --- the library behind the exercises' interfaces ---------------------------------------------


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


RIGHT = [
    Right("02.slot_states", "numpy column sums", slot_states_numpy),
    Right("02.first_fit", "a generator", first_fit_generator),
    Right("02.no_gap_fits", "sorted lengths", no_gap_fits_sorted),
    Right("02.reserve_max_arena", "slabs from the top down", TopDownReserveMax),
    Right("02.first_fit_arena", "one owner per slot", BitmapFirstFit),
    Right("02.growing_arena", "slabs only, gaps derived", GrowingGaps),
    Right("02.slot_states", "the arena view's statistics", slot_states),
    Right("02.first_fit", "the library's arena", first_fit),
    Right("02.no_gap_fits", "the library's arena", no_gap_fits),
    Right("02.reserve_max_arena", "the library's arena", LibraryReserveMax),
    Right("02.first_fit_arena", "the grader's reference", LibraryFirstFit),
    Right("02.growing_arena", "the grader's reference", GrowingReference),
]
