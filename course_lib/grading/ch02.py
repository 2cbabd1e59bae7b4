"""Chapter 02 exercises: contiguous slabs. Expected values come from ``course_lib.slab``.

The learner's code is exercised only through what it returns and raises, so a list or a
bitmap, a dict or parallel arrays all pass, as long as the behaviour is right.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from course_lib.grading.check import Case, Exercise, Raises, Satisfies, satisfies
from course_lib.slab import SlabAllocator, SlabPolicy

Gap = tuple[int, int]


# --- expected values from the library -----------------------------------------------------


def _usage(policy: SlabPolicy, max_len: int, requests: Sequence[tuple[int, int]]) -> tuple[
        list[tuple[int, int, int]], tuple[int, int, int]]:
    """Admit ``(final_len, written)`` requests; return their ``(reserved, written, final)``
    triples and the arena's (written, still to write, never written) slot counts."""
    total = sum(max_len if policy == "reserve-max" else final for final, _ in requests)
    arena = SlabAllocator(max(total, 1), policy=policy, max_len=max_len)
    for rid, (final, written) in enumerate(requests):
        arena.admit(rid, final, length=written)
    slabs = [(s.size, s.length, s.final_len) for s in arena.slabs.values()]
    usage = arena.usage()
    return slabs, (usage.used, usage.reserved, usage.internal)


def _arena_with_gaps(num_slots: int, gaps: Sequence[Gap]) -> SlabAllocator:
    """An exact-size first-fit arena whose free gaps are exactly ``gaps`` (non-touching)."""
    arena = SlabAllocator(num_slots, policy="exact-size", max_len=num_slots)
    cursor, rid, to_free = 0, 0, []
    for start, length in [*gaps, (num_slots, 0)]:
        for begin, size, is_gap in ((cursor, start - cursor, False), (start, length, True)):
            if size:
                slab = arena.admit(rid, size)
                assert slab.start == begin, "gaps must be sorted and must not touch"
                if is_gap:
                    to_free.append(rid)
                rid += 1
        cursor = start + length
    for rid in to_free:
        arena.free(rid)
    assert arena.gaps() == list(gaps)
    return arena


_NEW_ID = 10**9
"""Request id of the slab placed into a prepared arena (never one of the fillers')."""


def _first_fit(num_slots: int, gaps: Sequence[Gap], size: int) -> int | None:
    """Where the library's first-fit allocator puts ``size`` slots, or None."""
    arena = _arena_with_gaps(num_slots, gaps)
    return arena.admit(_NEW_ID, size).start if arena.fits(size) else None


def _fragmentation(num_slots: int, gaps: Sequence[Gap], need: int) -> tuple[int, bool]:
    """(free slots in gaps smaller than ``need``, free space fits but no gap does)."""
    arena = _arena_with_gaps(num_slots, gaps)
    return arena.stranded(need), arena.num_free >= need > arena.largest_gap


# --- exercise 1: slot states --------------------------------------------------------------


def _slot_states_cases() -> list[Case]:
    hint = ("every reserved slot is in exactly one state: it holds a token, it waits for a "
            "token this request will still write, or it lies past the request's final length")
    scenarios = [
        ("reserve-max", 8192, [(900, 600), (300, 300), (4000, 1000)]),
        ("exact-size", 8192, [(900, 600), (300, 300), (4000, 1000)]),
        ("reserve-max", 2048, [(512, 512)]),
        ("reserve-max", 2048, [(128, 1), (2048, 2048)]),
    ]
    cases = []
    for policy, max_len, requests in scenarios:
        slabs, expected = _usage(policy, max_len, requests)
        cases.append(Case(f"fn({slabs})  # {policy}", lambda fn, s=slabs: tuple(fn(s)),
                          expected, hint))
    cases.append(Case("fn([])", lambda fn: tuple(fn([])), (0, 0, 0),
                      "no slabs: nothing written, nothing reserved"))
    bad = "a slab needs 0 <= written <= final <= reserved: raise ValueError naming the slab"
    cases.append(Case("fn([(100, 60, 50)])  # written past the final length",
                      lambda fn: fn([(100, 60, 50)]), Raises(ValueError), bad))
    cases.append(Case("fn([(100, 10, 120)])  # final length past the reservation",
                      lambda fn: fn([(100, 10, 120)]), Raises(ValueError), bad))
    cases.append(Case("fn([(100, 20, 50), (40, -3, 30)])  # a negative written count",
                      lambda fn: fn([(100, 20, 50), (40, -3, 30)]), Raises(ValueError), bad))
    return cases


# --- exercise 2: first fit ----------------------------------------------------------------


FIGURE_GAPS: list[Gap] = [(30, 4), (54, 4), (83, 5), (98, 2)]
"""Free gaps of a 100-slot arena: 15 free slots, no gap larger than 5."""


def _first_fit_cases() -> list[Case]:
    hint = ("first fit means the lowest address that holds the whole slab, not the best or "
            "the largest gap; a gap of exactly size slots holds it")
    layouts = [
        (100, FIGURE_GAPS, 4), (100, FIGURE_GAPS, 5), (100, FIGURE_GAPS, 1),
        (100, FIGURE_GAPS, 8), (100, [(0, 50), (60, 10)], 8), (100, [(0, 10), (20, 50)], 10),
        (100, [(0, 10), (20, 50)], 11), (491_520, [(1_000, 484), (90_000, 1_107)], 1_206),
    ]
    cases = [
        Case(f"fn(gaps={gaps}, size={size})", lambda fn, g=gaps, s=size: fn(list(g), s),
             _first_fit(n, gaps, size), hint)
        for n, gaps, size in layouts
    ]
    cases.append(Case("fn(gaps=[], size=3)", lambda fn: fn([], 3), None,
                      "a full arena has no gaps: return None"))
    cases.append(Case("fn(gaps=[(0, 10)], size=0)", lambda fn: fn([(0, 10)], 0),
                      Raises(ValueError), "a slab of 0 slots is a mistake: raise ValueError"))
    return cases


# --- exercise 3: no gap fits --------------------------------------------------------------


def _no_gap_fits_cases() -> list[Case]:
    hint = ("stranded counts the free slots this request can never use where they are; "
            "blocked means the free memory would be enough in total, yet the request cannot "
            "start")
    layouts = [
        (100, FIGURE_GAPS, 8), (100, FIGURE_GAPS, 5), (100, FIGURE_GAPS, 16),
        (100, FIGURE_GAPS, 1), (491_520, [(1_000, 484), (90_000, 1_107)], 1_206),
        (100, [(10, 90)], 90), (100, FIGURE_GAPS, 15),
    ]
    cases = [
        Case(f"fn(gaps={gaps}, need={need})", lambda fn, g=gaps, s=need: tuple(fn(list(g), s)),
             _fragmentation(n, gaps, need), hint)
        for n, gaps, need in layouts
    ]
    cases.append(Case("fn(gaps=[], need=3)", lambda fn: tuple(fn([], 3)), (0, False),
                      "no gaps: nothing stranded, and nothing free to be blocked by"))
    cases.append(Case("fn(gaps=[(0, 10)], need=0)", lambda fn: fn([(0, 10)], 0),
                      Raises(ValueError), "a request needing 0 slots is a mistake"))
    return cases


# --- exercise 4: a reserve-max arena ------------------------------------------------------


def _inside_and_apart(size: int, count: int, width: int) -> Satisfies:
    """Expect ``count`` slabs of ``width`` slots, within ``0..size``, none overlapping."""

    def holds(starts: Any) -> bool:
        if not isinstance(starts, list | tuple) or len(starts) != count:
            return False
        if not all(isinstance(s, int) and 0 <= s <= size - width for s in starts):
            return False
        ordered = sorted(starts)
        return all(b - a >= width for a, b in pairwise(ordered))

    return Satisfies(f"{count} start slots, each slab of {width} inside 0..{size}, "
                     f"none overlapping", holds)


def _admit_all(arena: Any, ids: Sequence[int]) -> list[Any]:
    return [arena.admit(rid) for rid in ids]


def _reserve_max_expected(num_slots: int, max_len: int, tries: int) -> list[bool]:
    """Which of ``tries`` admissions the library's reserve-max arena grants."""
    arena = SlabAllocator(num_slots, policy="reserve-max", max_len=max_len)
    granted = []
    for rid in range(tries):
        granted.append(arena.fits(max_len))
        if granted[-1]:
            arena.admit(rid, max_len)
    return granted


def _granted_until_full(cls: Any, num_slots: int, max_len: int) -> int:
    arena = cls(num_slots, max_len)
    granted = 0
    while arena.admit(granted) is not None:
        granted += 1
        if granted > num_slots // max_len:  # more than can fit: stop counting
            break
    return granted


def _reserve_then_reuse(cls: Any) -> list[Any]:
    arena = cls(100, 30)
    starts = dict(zip(range(3), _admit_all(arena, range(3)), strict=True))
    arena.release(1)
    starts.pop(1)
    starts[9] = arena.admit(9)
    return list(starts.values())


def _cycle(cls: Any) -> list[bool]:
    arena = cls(100, 30)
    for _ in range(5):
        ids = range(3)
        _admit_all(arena, ids)
        for rid in ids:
            arena.release(rid)
    return [start is not None for start in _admit_all(arena, range(3, 7))]


def _admit_twice(cls: Any) -> Any:
    arena = cls(100, 30)
    arena.admit(0)
    return arena.admit(0)


def _release_unknown(cls: Any) -> Any:
    arena = cls(100, 30)
    arena.admit(0)
    return arena.release(42)


def _readmit(cls: Any) -> list[Any]:
    """Admit 0 and 1, release 0, admit 0 again: a released id is a new request."""
    arena = cls(100, 30)
    starts = [arena.admit(0), arena.admit(1)]
    arena.release(0)
    return [arena.admit(0), starts[1]]


def _release_twice(cls: Any) -> Any:
    arena = cls(100, 30)
    arena.admit(0)
    arena.release(0)
    return arena.release(0)


def _reserve_max_cases() -> list[Case]:
    hint = ("every request reserves max_len contiguous slots; admit returns the first slot "
            "of its slab, or None when no free run of max_len slots is left")
    guide_slots, guide_len = 491_520, 8192
    sixty = _reserve_max_expected(guide_slots, guide_len, 61).count(True)
    return [
        Case("arena = cls(num_slots=100, max_len=30); "
             "[arena.admit(i) is not None for i in range(5)]",
             lambda cls: [s is not None for s in _admit_all(cls(100, 30), range(5))],
             _reserve_max_expected(100, 30, 5), hint),
        Case("arena = cls(num_slots=100, max_len=30); [arena.admit(i) for i in range(3)]",
             lambda cls: _admit_all(cls(100, 30), range(3)), _inside_and_apart(100, 3, 30),
             "slabs must lie inside the arena and must not overlap", compare=satisfies),
        Case("admit 0, 1, 2 in cls(100, 30); release(1); admit(9): the live slabs' starts",
             _reserve_then_reuse, _inside_and_apart(100, 3, 30),
             "release must give the slab's slots back, so the next request can use them",
             compare=satisfies),
        Case("cls(100, 30): 5 rounds of admit 0, 1, 2 then release them; then "
             "[arena.admit(i) is not None for i in range(3, 7)]", _cycle,
             _reserve_max_expected(100, 30, 4), "releasing everything must restore an empty arena"),
        Case(f"arena = cls(num_slots={guide_slots}, max_len={guide_len}); "
             "admissions granted before the first None",
             lambda cls: _granted_until_full(cls, guide_slots, guide_len), sixty,
             "the source guide's 60 GiB arena: whole max_len slabs only"),
        Case("arena = cls(100, 30); starts = [arena.admit(0), arena.admit(1)]; "
             "arena.release(0); [arena.admit(0), starts[1]]", _readmit,
             _inside_and_apart(100, 2, 30), "once released, a request holds nothing: the same "
             "id may be admitted again", compare=satisfies),
        Case("arena = cls(100, 30); arena.admit(0); arena.release(0); arena.release(0)",
             _release_twice, Raises(ValueError), "after release the request holds no slab, so "
             "a second release is a bug: raise ValueError naming the id"),
        Case("arena = cls(100, 30); arena.admit(0); arena.admit(0)", _admit_twice,
             Raises(ValueError), "a request that already holds a slab cannot be admitted "
             "again: raise ValueError naming the id"),
        Case("arena = cls(100, 30); arena.admit(0); arena.release(42)", _release_unknown,
             Raises(ValueError), "releasing a request that holds no slab is a bug: raise "
             "ValueError naming the id"),
    ]


# --- exercise 5: an exact-size first-fit arena --------------------------------------------


Step = tuple[str, int, int]
"""``("admit", request_id, size)`` or ``("release", request_id, 0)``."""


def _script_text(num_slots: int, script: Sequence[Step]) -> str:
    calls = [f"admit({rid}, {size})" if op == "admit" else f"release({rid})"
             for op, rid, size in script]
    return f"arena = cls({num_slots}); " + "; ".join(calls) + "  -> what each admit returned"


def _run_script(arena: Any, script: Sequence[Step]) -> list[Any]:
    """Replay ``script``; return every admit's result in order."""
    results = []
    for op, rid, size in script:
        if op == "admit":
            results.append(arena.admit(rid, size))
        else:
            arena.release(rid)
    return results


class _LibraryFirstFit:
    """The library's first-fit allocator behind the exercise's interface."""

    def __init__(self, num_slots: int) -> None:
        self.arena = SlabAllocator(num_slots, policy="exact-size", max_len=num_slots)

    def admit(self, request_id: int, size: int) -> int | None:
        if not self.arena.fits(size):
            return None
        return self.arena.admit(request_id, size).start

    def release(self, request_id: int) -> None:
        self.arena.free(request_id)


def _first_fit_arena_cases() -> list[Case]:
    fill = [("admit", 0, 30), ("admit", 1, 20), ("admit", 2, 25), ("admit", 3, 10)]
    scripts: list[tuple[str, list[Step]]] = [
        ("slabs go to the lowest address that fits; None when no gap holds the size",
         [*fill, ("admit", 4, 20)]),
        ("a released slab leaves a gap that the next request can reuse",
         [*fill, ("release", 1, 0), ("admit", 4, 20), ("admit", 5, 1)]),
        ("releasing two neighbours must merge them into one gap",
         [*fill, ("release", 1, 0), ("release", 0, 0), ("admit", 4, 45)]),
        ("merge in either order: the gap after a slab and the gap before it",
         [*fill, ("release", 0, 0), ("release", 1, 0), ("admit", 4, 50)]),
        ("a released slab merges with the free space at the end of the arena",
         [*fill, ("release", 3, 0), ("admit", 4, 25)]),
        ("merge on both sides at once",
         [*fill, ("release", 0, 0), ("release", 2, 0), ("release", 1, 0), ("admit", 4, 75)]),
        ("first fit, not best fit: the lowest address wins even when a tighter gap exists",
         [*fill, ("release", 0, 0), ("release", 3, 0), ("admit", 4, 8)]),
        ("a released request holds nothing: the same id may be admitted again",
         [*fill, ("release", 2, 0), ("admit", 2, 25), ("release", 2, 0), ("admit", 2, 10)]),
        ("fragmentation: half the arena free in ten gaps, and a 20-slot request fits none",
         [*(("admit", i, 10) for i in range(10)), *(("release", i, 0) for i in range(0, 10, 2)),
          ("admit", 10, 20), ("admit", 11, 10)]),
    ]
    cases = [
        Case(_script_text(100, script), lambda cls, s=script: _run_script(cls(100), s),
             _run_script(_LibraryFirstFit(100), script), hint)
        for hint, script in scripts
    ]
    errors = [
        ("arena = cls(100); arena.admit(0, 10); arena.admit(0, 10)",
         [("admit", 0, 10), ("admit", 0, 10)], "a request can hold one slab: raise ValueError"),
        ("arena = cls(100); arena.release(7)", [("release", 7, 0)],
         "releasing a request that holds no slab is a bug: raise ValueError naming the id"),
        ("arena = cls(100); arena.admit(0, 0)", [("admit", 0, 0)],
         "a slab of 0 slots is a mistake: raise ValueError"),
        ("arena = cls(100); arena.admit(0, 10); arena.release(0); arena.release(0)",
         [("admit", 0, 10), ("release", 0, 0), ("release", 0, 0)],
         "a released request holds no slab any more: raise ValueError on a second release"),
    ]
    cases += [Case(call, lambda cls, s=script: _run_script(cls(100), s), Raises(ValueError), hint)
              for call, script, hint in errors]
    return cases


# --- exercise 6: grow in place, or move -----------------------------------------------------


class GrowingReference:
    """The expected behaviour of a growing arena, slot by slot (one owner per slot)."""

    def __init__(self, num_slots: int) -> None:
        self.owner: list[int | None] = [None] * num_slots
        self.slabs: dict[int, tuple[int, int]] = {}
        self.copied = 0

    def _lowest_run(self, size: int) -> int | None:
        run = 0
        for slot, owner in enumerate(self.owner):
            run = run + 1 if owner is None else 0
            if run == size:
                return slot - size + 1
        return None

    def _place(self, request_id: int, start: int, size: int) -> int:
        self.owner[start:start + size] = [request_id] * size
        self.slabs[request_id] = (start, size)
        return start

    def admit(self, request_id: int, length: int) -> int | None:
        if request_id in self.slabs or length < 1:
            raise ValueError(f"cannot admit {request_id!r} with {length!r} slots")
        start = self._lowest_run(length)
        return None if start is None else self._place(request_id, start, length)

    def _held(self, request_id: int) -> tuple[int, int]:
        if request_id not in self.slabs:
            raise ValueError(f"request {request_id!r} holds no slab")
        return self.slabs[request_id]

    def append(self, request_id: int) -> int | None:
        start, size = self._held(request_id)
        end = start + size
        if end < len(self.owner) and self.owner[end] is None:
            return self._place(request_id, start, size + 1)
        new = self._lowest_run(size + 1)
        if new is None:
            return None
        self.owner[start:end] = [None] * size
        self.copied += size
        return self._place(request_id, new, size + 1)

    def release(self, request_id: int) -> None:
        start, size = self._held(request_id)
        del self.slabs[request_id]
        self.owner[start:start + size] = [None] * size


Move = tuple[str, int, int]
"""``("admit", request_id, length)``, ``("append", request_id, 0)`` or ``("release", id, 0)``."""


def _copied(arena: Any) -> Any:
    """``arena.copied`` whether the learner wrote an attribute, a property or a method."""
    value = arena.copied
    return value() if callable(value) else value


def _grow_script(arena: Any, script: Sequence[Move]) -> list[Any]:
    """Replay ``script``: what every admit and append returned, then the slots copied."""
    seen = []
    for op, rid, length in script:
        if op == "release":
            arena.release(rid)
        else:
            seen.append(arena.admit(rid, length) if op == "admit" else arena.append(rid))
    return [*seen, _copied(arena)]


def _grow_text(num_slots: int, script: Sequence[Move]) -> str:
    calls = {"admit": "admit({}, {})", "append": "append({})", "release": "release({})"}
    shown = "; ".join(calls[op].format(rid, n) if op == "admit" else calls[op].format(rid)
                      for op, rid, n in script)
    return f"arena = cls({num_slots}); {shown}  -> [each admit and append, arena.copied]"


def _growing_cases() -> list[Case]:
    grow = [("append", 0, 0)]
    scripts: list[tuple[int, list[Move], str]] = [
        (40, [("admit", 0, 10), *grow * 3], "a slab grows in place while the next slot is free"),
        (40, [("admit", 0, 10), ("admit", 1, 10), *grow, ("admit", 2, 10)],
         "a neighbour blocks: the slab moves whole to the lowest gap that holds it, and its "
         "old slots are free again"),
        (30, [("admit", 9, 5), ("admit", 0, 10), ("admit", 2, 5), ("release", 9, 0), *grow],
         "while it is copied the slab still holds its old slots: they cannot be part of the "
         "new place"),
        (40, [("admit", 0, 10), ("admit", 1, 5), ("admit", 2, 11), ("admit", 3, 4),
              ("release", 2, 0), *grow],
         "a gap of exactly length + 1 slots holds the grown slab"),
        (20, [("admit", 0, 10), ("admit", 1, 10), ("append", 1, 0), *grow, ("release", 1, 0),
              *grow],
         "the arena ends after its last slot; a refused append changes nothing, so once room "
         "appears the slab still holds its own slots and grows in place"),
        (40, [("admit", 5, 5), ("admit", 0, 10), ("admit", 1, 1), ("release", 5, 0), *grow,
              ("admit", 2, 15)],
         "the slots a moved slab leaves behind join the free slots next to them"),
        (60, [("admit", 0, 10), ("admit", 1, 10), *grow, ("admit", 2, 12), *grow,
              ("append", 2, 0), ("admit", 3, 11)],
         "every move copies the slab's tokens; a slab that fits nowhere gets None"),
    ]
    cases = [Case(_grow_text(n, script), lambda cls, n=n, s=script: _grow_script(cls(n), s),
                  _grow_script(GrowingReference(n), script), why)
             for n, script, why in scripts]
    errors = [
        ([("append", 7, 0)], "appending to a request that holds no slab is a bug"),
        ([("admit", 0, 5), ("admit", 0, 5)], "a request holds one slab"),
        ([("admit", 0, 0)], "a slab of 0 slots is a mistake"),
        ([("admit", 0, 5), ("release", 0, 0), ("release", 0, 0)],
         "a released request holds no slab"),
    ]
    cases += [Case(_grow_text(40, script), lambda cls, s=script: _grow_script(cls(40), s),
                   Raises(ValueError), f"{why}: raise ValueError naming the id or the size")
              for script, why in errors]
    return cases


EXERCISES = (
    Exercise("02.slot_states", "Written, still to write, never written", _slot_states_cases,
             reference=("course_lib.slab",)),
    Exercise("02.first_fit", "First-fit gap search", _first_fit_cases,
             reference=("course_lib.slab",)),
    Exercise("02.no_gap_fits", "Free, but no gap fits", _no_gap_fits_cases,
             reference=("course_lib.slab",)),
    Exercise("02.reserve_max_arena", "A reserve-max arena: admit and release",
             _reserve_max_cases,
             reference=("course_lib.slab",)),
    Exercise("02.first_fit_arena", "An exact-size first-fit arena", _first_fit_arena_cases,
             reference=("course_lib.slab",)),
    Exercise("02.growing_arena", "Grow in place, or move", _growing_cases,
             reference=("course_lib.slab",)),
)
