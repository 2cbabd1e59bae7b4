"""Chapter 02 exercises: contiguous slabs. Expected values come from ``course_lib.slab``.

The learner's code is exercised only through what it returns and raises, so a list or a
bitmap, a dict or parallel arrays all pass, as long as the behaviour is right. Every result
is labelled (each call of a script by its text, ``arena.copied`` by its name), so a report
names the first call that differs; placements are also replayed under best fit, worst fit
and "an exact fit does not count", so a learner who made one of those mistakes is told so.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, Literal

from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    Satisfies,
    Verdict,
    labelled,
    recognising,
    satisfies,
    unique_labels,
)
from course_lib.slab import OutOfSlots, SlabAllocator, SlabPolicy

Gap = tuple[int, int]
Fit = Literal["first", "best", "worst"]


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


ANY_LENGTH = 2**62
"""``max_len`` of an exact-size arena: a slab longer than the arena is not refused for its
length, it fits no gap (None)."""


def _arena_with_gaps(num_slots: int, gaps: Sequence[Gap]) -> SlabAllocator:
    """An exact-size first-fit arena whose free gaps are exactly ``gaps`` (non-touching)."""
    arena = SlabAllocator(num_slots, policy="exact-size", max_len=ANY_LENGTH)
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


# --- labels, placement mistakes and random inputs ------------------------------------------


FIT_HINTS = {
    "best": "first fit takes the lowest address that holds the slab, not the tightest gap "
            "(that is best fit)",
    "worst": "first fit takes the lowest address that holds the slab, not the largest gap "
             "(that is worst fit)",
    "strict": "a gap of exactly the slab's size holds it: an exact fit counts",
}
"""The hint for each placement mistake the checks recognise."""


def _pick(runs: Sequence[Gap], size: int, fit: str) -> int | None:
    """Where ``fit`` puts ``size`` slots among free ``runs`` (in address order), or None;
    ``"strict"`` is first fit that wrongly wants a run longer than the slab."""
    fitting = [(start, length) for start, length in runs
               if length > size or (length == size and fit != "strict")]
    if not fitting:
        return None
    if fit == "best":
        return min(fitting, key=lambda run: run[1])[0]
    if fit == "worst":
        return max(fitting, key=lambda run: (run[1], -run[0]))[0]
    return fitting[0][0]


def _random_gaps(rng: random.Random, num_slots: int, count: int) -> list[Gap]:
    """Up to ``count`` sorted, non-touching gaps inside ``num_slots``."""
    gaps: list[Gap] = []
    cursor = 0
    for index in range(count):
        start = cursor + rng.randint(0 if index == 0 else 1, 12)
        length = rng.randint(1, 16)
        if start + length > num_slots:
            break
        gaps.append((start, length))
        cursor = start + length
    return gaps


def _gaps_of(rng: random.Random, lengths: Sequence[int]) -> tuple[int, list[Gap]]:
    """An arena size and non-touching gaps of ``lengths`` slots, in that address order, at
    seeded places."""
    gaps, cursor = [], rng.randint(0, 12)
    for length in lengths:
        gaps.append((cursor, length))
        cursor += length + rng.randint(1, 12)
    return cursor + rng.randint(0, 12), gaps


# --- 02.slot_states: slot states ----------------------------------------------------------

SLOT_LABELS = ("written", "still to write", "never written")

SLOT_HINTS = {
    "written": "written counts the tokens every slab holds now",
    "still to write": "a slot still to write lies between the tokens written so far and the "
                      "request's final length",
    "never written": "a slot never written lies past the request's final length: count it "
                     "from the final length, not from what is written so far",
}


def _slot_states_case(policy: SlabPolicy, max_len: int,
                      requests: Sequence[tuple[int, int]]) -> Case:
    slabs, (written, pending, never) = _usage(policy, max_len, requests)
    return Case(f"fn({slabs})  # {policy} -> (written, still to write, never written)",
                lambda fn, s=slabs: labelled(SLOT_LABELS, fn(list(s))),
                dict(zip(SLOT_LABELS, (written, pending, never), strict=True)),
                "every reserved slot is in exactly one of the three states", hints=SLOT_HINTS)


def _slot_states_cases() -> list[Case]:
    scenarios: list[tuple[SlabPolicy, int, list[tuple[int, int]]]] = [
        ("reserve-max", 8192, [(900, 600), (300, 300), (4000, 1000)]),
        ("exact-size", 8192, [(900, 600), (300, 300), (4000, 1000)]),
        ("reserve-max", 2048, [(512, 512)]),
        ("reserve-max", 2048, [(128, 1), (2048, 2048)]),
    ]
    cases = [_slot_states_case(*scenario) for scenario in scenarios]
    cases.append(Case("fn([])", lambda fn: labelled(SLOT_LABELS, fn([])),
                      dict.fromkeys(SLOT_LABELS, 0), "no slabs: nothing written, nothing "
                      "reserved", hints=SLOT_HINTS))
    impossible = [[(100, 60, 50)], [(100, 10, 120)], [(100, 20, 50), (40, -3, 30)]]
    return cases + [_impossible_case(slabs, kind) for slabs, kind in zip(impossible, IMPOSSIBLE,
                                                                          strict=True)]


IMPOSSIBLE = (
    ("written past the final length", "a slab cannot have written more than its final length"),
    ("final length past the reservation",
     "a slab's final length cannot pass its reservation: check final <= reserved too"),
    ("a negative written count",
     "a negative count of written tokens cannot exist: check 0 <= written too"),
)
"""Each kind of impossible slab: why, and the hint."""


def _impossible_case(slabs: Sequence[tuple[int, int, int]], kind: tuple[str, str]) -> Case:
    why, hint = kind
    return Case(f"fn({list(slabs)})  # {why}", lambda fn, s=tuple(slabs): fn(list(s)),
                Raises(ValueError), f"{hint}: raise ValueError naming the slab")


def _impossible_slab(rng: random.Random, kind: int) -> tuple[int, int, int]:
    """A seeded (reserved, written, final) slab of the kind ``IMPOSSIBLE[kind]``."""
    final = rng.randint(2, 4000)
    reserved = final + rng.randint(0, 4000)
    return [(reserved, final + rng.randint(1, 99), final),
            (final - rng.randint(1, final - 1), rng.randint(0, final - 1), final),
            (reserved, -rng.randint(1, 99), final)][kind]


def _slot_states_fresh(seed: int) -> list[Case]:
    """Seeded requests under both policies; then each kind of impossible slab among seeded
    possible ones."""
    rng = random.Random(seed)
    cases = []
    for policy in ("reserve-max", "exact-size", "reserve-max"):
        max_len = rng.choice([512, 2048, 8192])
        finals = [rng.randint(1, max_len - 1), *(rng.choice([max_len, rng.randint(1, max_len)])
                                                 for _ in range(rng.randint(0, 4)))]
        requests = [(final, rng.choice([0, final, rng.randint(0, final)])) for final in finals]
        cases.append(_slot_states_case(policy, max_len, requests))  # type: ignore[arg-type]
    for kind in range(len(IMPOSSIBLE)):
        slabs = [(f + rng.randint(0, 99), rng.randint(0, f), f)
                 for f in (rng.randint(1, 4000) for _ in range(rng.randint(1, 3)))]
        slabs.insert(rng.randint(0, len(slabs)), _impossible_slab(rng, kind))
        cases.append(_impossible_case(slabs, IMPOSSIBLE[kind]))
    return cases


# --- 02.first_fit: first fit --------------------------------------------------------------


FIGURE_GAPS: list[Gap] = [(30, 4), (54, 4), (83, 5), (98, 2)]
"""Free gaps of a 100-slot arena: 15 free slots, no gap larger than 5."""


def _placement_mistakes(gaps: Sequence[Gap], size: int) -> list[tuple[Any, str]]:
    """What each recognised mistake returns for ``gaps`` and ``size``, with its hint."""
    lowest = next((index for index, (_, length) in enumerate(gaps) if length >= size), None)
    last = _pick(list(reversed(gaps)), size, "first")
    return [*((_pick(gaps, size, fit), hint) for fit, hint in FIT_HINTS.items()),
            (lowest, "return the gap's first slot, not its position in the list"),
            (last, "first fit takes the lowest gap that fits, not the last one")]


def _first_fit_case(num_slots: int, gaps: Sequence[Gap], size: int) -> Case:
    return Case(f"fn(gaps={list(gaps)}, size={size})",
                lambda fn, g=tuple(gaps), s=size: fn(list(g), s),
                _first_fit(num_slots, gaps, size),
                "first fit means the lowest address that holds the whole slab",
                compare=recognising(_placement_mistakes(gaps, size)))


def _first_fit_cases() -> list[Case]:
    layouts = [
        (100, [(10, 6), (30, 4), (50, 12), (80, 8)], 4), (100, [(10, 4), (30, 6), (50, 12)], 4),
        (100, FIGURE_GAPS, 4), (100, FIGURE_GAPS, 5), (100, FIGURE_GAPS, 1),
        (100, FIGURE_GAPS, 8), (100, [(0, 50), (60, 10)], 8), (100, [(0, 10), (20, 50)], 10),
        (100, [(0, 10), (20, 50)], 11), (491_520, [(1_000, 484), (90_000, 1_107)], 1_206),
    ]
    cases = [_first_fit_case(*layout) for layout in layouts]
    cases.append(Case("fn(gaps=[], size=3)", lambda fn: fn([], 3), None,
                      "a full arena has no gaps: return None"))
    return cases + [_refused_case("size", [(0, 10)], size) for size in (0, -3)]


def _refused_case(name: str, gaps: Sequence[Gap], size: int) -> Case:
    """``fn(gaps=..., <name>=size)`` with a size below 1: it must raise."""
    what = {"size": "a slab of", "need": "a request needing"}[name]
    return Case(f"fn(gaps={list(gaps)}, {name}={size})",
                lambda fn, g=tuple(gaps), s=size: fn(list(g), s), Raises(ValueError),
                f"{what} {size} slots is a mistake: refuse every {name} below 1 with ValueError")


def _first_fit_fresh(seed: int) -> list[Case]:
    """Seeded layouts where first fit, best fit, worst fit and "no exact fit" disagree, one
    where no gap fits, none at all, a seeded one, and a size below 1."""
    rng = random.Random(seed)
    size = rng.randint(2, 20)
    looser, loosest = rng.randint(1, size - 1), rng.randint(size, 30)
    short = [rng.randint(1, size - 1) for _ in range(rng.randint(1, 4))]
    layouts = [_gaps_of(rng, [short[0], size + looser, size, size + loosest]),
               _gaps_of(rng, [short[0], size, size + loosest]), _gaps_of(rng, short),
               (200, _random_gaps(rng, 200, rng.randint(2, 7)))]
    cases = [_first_fit_case(n, gaps, size) for n, gaps in layouts]
    cases.append(Case(f"fn(gaps=[], size={size})", lambda fn, s=size: fn([], s), None,
                      "a full arena has no gaps: return None"))
    return [*cases, _refused_case("size", layouts[3][1], -rng.randint(0, 20))]


# --- 02.no_gap_fits: no gap fits ----------------------------------------------------------


def _no_gap_mistakes(gaps: Sequence[Gap], need: int) -> list[tuple[Any, str]]:
    """What each recognised mistake returns, labelled, with its hint."""
    lengths = [length for _, length in gaps]
    stranded = sum(n for n in lengths if n < need)
    total, largest = sum(lengths), max(lengths, default=0)
    return [
        ({"stranded": sum(n for n in lengths if n <= need), "blocked": total >= need > largest},
         "a gap of exactly need slots holds the request: its slots are not stranded"),
        ({"stranded": stranded, "blocked": total > need > largest},
         "free slots that add up to exactly need are enough in total: that request is blocked "
         "when no single gap holds it"),
        ({"stranded": stranded, "blocked": total >= need},
         "blocked means no single gap holds the request: one that fits a gap is not blocked"),
    ]


def _no_gap_fits_case(num_slots: int, gaps: Sequence[Gap], need: int) -> Case:
    stranded, blocked = _fragmentation(num_slots, gaps, need)
    return Case(f"fn(gaps={list(gaps)}, need={need}) -> (stranded, blocked)",
                lambda fn, g=tuple(gaps), s=need: labelled(("stranded", "blocked"),
                                                            fn(list(g), s)),
                {"stranded": stranded, "blocked": blocked},
                "stranded counts the free slots this request can never use where they are; "
                "blocked means the free memory would be enough in total, yet the request "
                "cannot start", compare=recognising(_no_gap_mistakes(gaps, need)))


def _no_gap_fits_cases() -> list[Case]:
    layouts = [
        (100, FIGURE_GAPS, 8), (100, FIGURE_GAPS, 5), (100, FIGURE_GAPS, 16),
        (100, FIGURE_GAPS, 1), (491_520, [(1_000, 484), (90_000, 1_107)], 1_206),
        (100, [(10, 90)], 90), (100, FIGURE_GAPS, 15), (100, [], 3),
    ]
    cases = [_no_gap_fits_case(*layout) for layout in layouts]
    return cases + [_refused_case("need", [(0, 10)], need) for need in (0, -2)]


def _no_gap_fits_fresh(seed: int) -> list[Case]:
    """Seeded layouts: a gap of exactly need slots, short gaps that add up to exactly need, a
    gap that holds need; no gaps, a seeded layout, and a need below 1."""
    rng = random.Random(seed)
    need = rng.randint(3, 30)
    cuts = sorted(rng.sample(range(1, need), rng.randint(1, min(4, need - 1))))
    parts = [b - a for a, b in pairwise([0, *cuts, need])]
    others = [rng.randint(1, 2 * need) for _ in range(rng.randint(1, 3))]
    layouts = [_gaps_of(rng, rng.sample([need, *others], len(others) + 1)), _gaps_of(rng, parts),
               _gaps_of(rng, [*parts[:-1], need + rng.randint(0, 9)]),
               (200, _random_gaps(rng, 200, rng.randint(2, 7))), (200, [])]
    cases = [_no_gap_fits_case(n, gaps, need) for n, gaps in layouts]
    return [*cases, _refused_case("need", layouts[3][1], -rng.randint(0, 20))]


# --- 02.reserve_max_arena: a reserve-max arena --------------------------------------------


class _LibraryReserveMax:
    """The library's reserve-max allocator behind the exercise's interface."""

    def __init__(self, num_slots: int, max_len: int) -> None:
        self.arena = SlabAllocator(num_slots, policy="reserve-max", max_len=max_len)

    def admit(self, request_id: int) -> int | None:
        try:
            return self.arena.admit(request_id, self.arena.max_len).start
        except OutOfSlots:  # no gap holds it (a request holding a slab raised ValueError)
            return None

    def release(self, request_id: int) -> None:
        self.arena.free(request_id)


Turn = tuple[str, int]
"""``("admit", request_id)`` or ``("release", request_id)`` on a reserve-max arena."""


def _turns_text(num_slots: int, max_len: int, turns: Sequence[Turn]) -> str:
    return (f"arena = cls({num_slots}, {max_len}); "
            + "; ".join(f"{op}({rid})" for op, rid in turns))


def _granted(arena: Any, turns: Sequence[Turn]) -> dict[str, Any]:
    """Replay ``turns``; whether each admit got a slab, by its call."""
    labels = iter(unique_labels([f"admit({rid})" for op, rid in turns if op == "admit"]))
    granted = {}
    for op, rid in turns:
        if op == "admit":
            granted[next(labels)] = arena.admit(rid) is not None
        else:
            arena.release(rid)
    return granted


def _starts(arena: Any, turns: Sequence[Turn]) -> dict[str, Any]:
    """Replay ``turns``; the first slot of every slab still held at the end, by its admit."""
    starts = {}
    for op, rid in turns:
        if op == "admit":
            starts[f"admit({rid})"] = arena.admit(rid)
        else:
            arena.release(rid)
            starts.pop(f"admit({rid})")
    return starts


def _inside_and_apart(size: int, width: int, count: int, refused: str) -> Satisfies:
    """Expect ``count`` slabs of ``width`` slots, within ``0..size``, none overlapping;
    ``refused`` is the hint for a slab refused although there was room."""

    def explain(starts: Any) -> Verdict | None:
        if not isinstance(starts, dict) or len(starts) != count:
            return Verdict(False, f"result: expected {count} slabs")
        for label, start in starts.items():
            if start is None:
                return Verdict(False, f"{label}: got None, expected a slab", refused)
            if not isinstance(start, int) or not 0 <= start <= size - width:
                return Verdict(False, f"{label}: a slab of {width} at {start!r} does not lie "
                               f"inside slots 0..{size - 1}", "a slab must lie inside the arena")
        ordered = sorted(starts.items(), key=lambda item: item[1])
        for (first, a), (second, b) in pairwise(ordered):
            if b - a < width:
                return Verdict(False, f"{second}: the slab at {b} overlaps {first}'s at {a}",
                               "slabs must not overlap: every slot belongs to one request")
        return None

    return Satisfies(f"{count} slabs of {width} slots inside 0..{size}, none overlapping",
                     explain=explain)


def _granted_until_full(cls: Any, num_slots: int, max_len: int) -> dict[str, int]:
    arena = cls(num_slots, max_len)
    granted = 0
    while arena.admit(granted) is not None:
        granted += 1
        if granted > num_slots // max_len:  # more than can fit: stop counting
            break
    return {"admissions granted": granted}


REUSE_HINT = ("once released, a request holds nothing: the same id may be admitted again, and "
              "its slab's slots serve the next request")


def _reserve_max_case(num_slots: int, max_len: int, turns: Sequence[Turn], hint: str,
                      hints: dict[str, str] | None = None) -> Case:
    return Case(_turns_text(num_slots, max_len, turns) + "  -> did each admit get a slab",
                lambda cls, n=num_slots, m=max_len, t=tuple(turns): _granted(cls(n, m), t),
                _granted(_LibraryReserveMax(num_slots, max_len), turns), hint,
                hints=hints or {})


FULL_HINT = ("every request reserves max_len contiguous slots; admit returns None when no free "
             "run of max_len slots is left")
REFUSED_HINT = ("a refused admit (None) changes nothing: the request still holds no slab, so it "
                "may be admitted once room appears")


def _starts_case(num_slots: int, max_len: int, turns: Sequence[Turn], count: int,
                 refused: str, hint: str) -> Case:
    """Where the slabs still held after ``turns`` start: ``count`` of them, inside, apart."""
    return Case(_turns_text(num_slots, max_len, turns) + "  -> the first slot of each slab"
                + (" still held" if any(op == "release" for op, _ in turns) else ""),
                lambda cls, n=num_slots, m=max_len, t=tuple(turns): _starts(cls(n, m), t),
                _inside_and_apart(num_slots, max_len, count, refused), hint, compare=satisfies)


def _until_full_case(num_slots: int, max_len: int, hint: str) -> Case:
    return Case(f"arena = cls(num_slots={num_slots}, max_len={max_len}); admissions granted "
                "before the first None",
                lambda cls, n=num_slots, m=max_len: _granted_until_full(cls, n, m),
                _granted_until_full(_LibraryReserveMax, num_slots, max_len), hint)


def _reserve_max_bugs(num_slots: int, max_len: int, rid: int, other: int) -> list[Case]:
    """A second release, a second admit, and a release of ``other``, which holds nothing."""
    bugs = [
        ([("admit", rid), ("release", rid), ("release", rid)], "after release the request holds "
         "no slab, so a second release is a bug: raise ValueError naming the id"),
        ([("admit", rid), ("admit", rid)], "a request that already holds a slab cannot be "
         "admitted again: raise ValueError naming the id"),
        ([("admit", rid), ("release", other)], "releasing a request that holds no slab is a bug: "
         "raise ValueError naming the id"),
    ]
    return [Case(_turns_text(num_slots, max_len, turns),
                 lambda cls, n=num_slots, m=max_len, t=tuple(turns): _granted(cls(n, m), t),
                 Raises(ValueError), hint) for turns, hint in bugs]


def _reserve_max_cases() -> list[Case]:
    admits = [("admit", rid) for rid in range(3)]
    cycle = [*admits, *(("release", rid) for rid in range(3))] * 5
    return [
        _reserve_max_case(100, 30, [("admit", rid) for rid in range(5)], FULL_HINT),
        _starts_case(100, 30, admits, 3, FULL_HINT, FULL_HINT),
        _starts_case(100, 30, [*admits, ("release", 1), ("admit", 9)], 3,
                     "release must give the slab's slots back, so the next request can use "
                     "them", REUSE_HINT),
        _reserve_max_case(100, 30, [*cycle, *(("admit", rid) for rid in range(3, 7))],
                          "releasing everything must restore an empty arena",
                          {"raised": REUSE_HINT}),
        _until_full_case(491_520, 8192, "the source guide's 60 GiB arena: whole max_len slabs "
                                        "only"),
        _starts_case(100, 30, [("admit", 0), ("admit", 1), ("release", 0), ("admit", 0)], 2,
                     REUSE_HINT, REUSE_HINT),
        _reserve_max_case(100, 30, [*admits, ("admit", 3), ("release", 0), ("admit", 3)],
                          REFUSED_HINT),
        *_reserve_max_bugs(100, 30, 0, 42),
    ]


def _random_turns(rng: random.Random, num_slots: int, max_len: int, count: int) -> list[Turn]:
    """Admissions of new ids and releases of held ones, some admissions past full."""
    arena, held, turns = _LibraryReserveMax(num_slots, max_len), [], []
    for rid in range(count):
        if held and rng.random() < 0.4:
            turn = ("release", held.pop(rng.randrange(len(held))))
            arena.release(turn[1])
        else:
            turn = ("admit", rid)
            if arena.admit(rid) is not None:
                held.append(rid)
        turns.append(turn)
    return turns


def _reserve_max_fresh(seed: int) -> list[Case]:
    """A seeded arena that is not a whole number of slabs, filled past full; a large one
    filled until None; the same id admitted again after its release; a refused id admitted
    once room appears; a seeded script; each bug, at seeded ids."""
    rng = random.Random(seed)
    max_len, count = rng.randint(5, 60), rng.randint(2, 6)
    num_slots = count * max_len + rng.randint(1, max_len - 1)
    held = [("admit", rid) for rid in range(count)]
    again, late = rng.randrange(count), rng.randint(count, 99)
    return [
        _reserve_max_case(num_slots, max_len, [*held, ("admit", count), ("admit", count + 1)],
                          FULL_HINT),
        _until_full_case(rng.randint(100_000, 600_000), rng.choice([1024, 2048, 4096, 8192]),
                         "whole max_len slabs only: the slots left after the last whole slab "
                         "hold no request"),
        _starts_case(num_slots, max_len, [*held, ("release", again), ("admit", again)], count,
                     REUSE_HINT, REUSE_HINT),
        _reserve_max_case(num_slots, max_len, [*held, ("admit", late), ("release", again),
                                               ("admit", late)], REFUSED_HINT),
        _reserve_max_case(num_slots, max_len, _random_turns(rng, num_slots, max_len, 16),
                          "every request reserves max_len contiguous slots; a release gives "
                          "them back", {"raised": REUSE_HINT}),
        *_reserve_max_bugs(num_slots, max_len, rng.randint(0, 99), rng.randint(100, 999)),
    ]


# --- 02.first_fit_arena: an exact-size first-fit arena ------------------------------------


Step = tuple[str, int, int]
"""``("admit", request_id, size)`` or ``("release", request_id, 0)``."""


def _script_text(num_slots: int, script: Sequence[Step]) -> str:
    calls = [f"admit({rid}, {size})" if op == "admit" else f"release({rid})"
             for op, rid, size in script]
    return (f"arena = cls({num_slots}); " + "; ".join(calls)
            + "  -> what each admit returned")


def _run_script(arena: Any, script: Sequence[Step]) -> dict[str, Any]:
    """Replay ``script``; every admit's result, by its call."""
    labels = iter(unique_labels([f"admit({rid}, {size})" for op, rid, size in script
                                 if op == "admit"]))
    results = {}
    for op, rid, size in script:
        if op == "admit":
            results[next(labels)] = arena.admit(rid, size)
        else:
            arena.release(rid)
    return results


class _LibraryFirstFit:
    """The library's first-fit allocator behind the exercise's interface."""

    def __init__(self, num_slots: int) -> None:
        self.arena = SlabAllocator(num_slots, policy="exact-size", max_len=ANY_LENGTH)

    def admit(self, request_id: int, size: int) -> int | None:
        try:
            return self.arena.admit(request_id, size).start
        except OutOfSlots:  # no gap holds it (a request holding a slab raised ValueError)
            return None

    def release(self, request_id: int) -> None:
        self.arena.free(request_id)


def _fit_mistakes(num_slots: int, replay: Callable[[Any], Any]) -> list[tuple[Any, str]]:
    """What the arena returns when it places by best fit, worst fit or without exact fits,
    with each mistake's hint; a placement that makes the script invalid is left out."""
    found = []
    for fit, hint in FIT_HINTS.items():
        try:
            found.append((replay(GrowingReference(num_slots, fit)), hint))
        except ValueError:
            continue
    return found


def _first_fit_arena_case(num_slots: int, script: Sequence[Step], hint: str) -> Case:
    return Case(_script_text(num_slots, script),
                lambda cls, n=num_slots, s=tuple(script): _run_script(cls(n), s),
                _run_script(_LibraryFirstFit(num_slots), script), hint,
                compare=recognising(_fit_mistakes(
                    num_slots, lambda arena: _run_script(arena, script))))


MERGE_RIGHT = ("a released slab merges with the free gap on its RIGHT, the one that starts where "
               "it ends (here the gap the slab after it left)")
MERGE_LEFT = ("a released slab merges with the free gap on its LEFT too, the one that ends "
              "where it starts (here the gap the slab before it left), not only with the one on "
              "its right")
MERGE_END = "a released slab merges with the free space at the end of the arena"
MERGE_BOTH = ("a slab released between two gaps merges with both at once: the gap on its left, "
              "its own slots and the gap on its right become one gap")


def _merge_scripts(sizes: Sequence[int], tail: int,
                   pick: Callable[[int, int], int]) -> list[tuple[str, list[Step]]]:
    """Scripts over slabs 0..3 of ``sizes`` (each at least 2 slots) and ``tail`` free slots
    (at least 2) after them that release neighbours and admit a request that fits only if
    the released slots merged: to the right, to the left, with the free end, on both sides.
    ``pick(low, high)`` chooses its size; ``high`` is one short of the merged gap, so a
    placement that refuses exact fits still places it and the hint names the merge."""
    fill: list[Step] = [("admit", rid, size) for rid, size in enumerate(sizes)]
    first, second, third, last = sizes
    pair = pick(max(first, second) + 1, first + second - 1)
    return [
        (MERGE_RIGHT, [*fill, ("release", 1, 0), ("release", 0, 0), ("admit", 4, pair)]),
        (MERGE_LEFT, [*fill, ("release", 0, 0), ("release", 1, 0), ("admit", 4, pair)]),
        (MERGE_END, [*fill, ("release", 3, 0), ("admit", 4, pick(max(last, tail) + 1,
                                                                   last + tail - 1))]),
        (MERGE_BOTH, [*fill, ("release", 0, 0), ("release", 2, 0), ("release", 1, 0),
                      ("admit", 4, pick(max(first + second, second + third) + 1,
                                        first + second + third - 1))]),
    ]


def _first_fit_arena_cases() -> list[Case]:
    fill = [("admit", 0, 30), ("admit", 1, 20), ("admit", 2, 25), ("admit", 3, 10)]
    scripts: list[tuple[str, list[Step]]] = [
        ("slabs go to the lowest address that fits; None when no gap holds the size",
         [*fill, ("admit", 4, 20)]),
        ("a released slab leaves a gap that the next request can reuse",
         [*fill, ("release", 1, 0), ("admit", 4, 20), ("admit", 5, 1)]),
        *_merge_scripts([size for _, _, size in fill], 15, lambda low, high: high),
        ("first fit, not worst fit: the lowest gap that fits wins even when a larger one exists",
         [*fill, ("release", 1, 0), ("release", 3, 0), ("admit", 4, 10)]),
        (FIT_HINTS["best"], [*fill, ("release", 0, 0), ("release", 3, 0), ("admit", 4, 8)]),
        ("a refused admit (None) changes nothing: the request still holds no slab, so it may "
         "be admitted once room appears",
         [*fill, ("admit", 4, 20), ("release", 1, 0), ("admit", 4, 20)]),
        ("a released request holds nothing: the same id may be admitted again",
         [*fill, ("release", 2, 0), ("admit", 2, 25), ("release", 2, 0), ("admit", 2, 10)]),
        ("fragmentation: half the arena free in ten gaps, and a 20-slot request fits none",
         [*(("admit", i, 10) for i in range(10)), *(("release", i, 0) for i in range(0, 10, 2)),
          ("admit", 10, 20), ("admit", 11, 10)]),
    ]
    cases = [_first_fit_arena_case(100, script, hint) for hint, script in scripts]
    return cases + _first_fit_arena_bugs(100, 0, 7, 10, -3)


def _first_fit_arena_bugs(num_slots: int, rid: int, other: int, size: int,
                          negative: int) -> list[Case]:
    """A second admit, a release of ``other`` (which holds nothing), sizes 0 and
    ``negative``, and a second release."""
    errors = [
        ([("admit", rid, size), ("admit", rid, size)],
         "a request can hold one slab: raise ValueError"),
        ([("release", other, 0)],
         "releasing a request that holds no slab is a bug: raise ValueError naming the id"),
        ([("admit", rid, 0)], "a slab of 0 slots is a mistake: raise ValueError"),
        ([("admit", rid, negative)], "a negative size is a mistake too: refuse every size below "
         "1 with ValueError"),
        ([("admit", rid, size), ("release", rid, 0), ("release", rid, 0)],
         "a released request holds no slab any more: raise ValueError on a second release"),
    ]
    return [Case(_script_text(num_slots, script).split("  ->")[0],
                 lambda cls, n=num_slots, s=tuple(script): _run_script(cls(n), s),
                 Raises(ValueError), hint) for script, hint in errors]


def _layout(rng: random.Random, gaps: Sequence[int],
            last: tuple[int, int] | None = None) -> tuple[int, list[Step]]:
    """A seeded arena size, and admissions then releases that leave free gaps of ``gaps``
    slots in address order, each after a held slab; ``last`` = (request id, size) holds the
    arena's last slots; the arena is otherwise full. Fillers and gaps take ids from 0."""
    admits: list[Step] = []
    for rid, length in enumerate(gaps):
        admits += [("admit", 2 * rid, rng.randint(1, 8)), ("admit", 2 * rid + 1, length)]
    admits.append(("admit", 2 * len(gaps), rng.randint(1, 8)))
    if last is not None:
        admits.append(("admit", *last))
    releases: list[Step] = [("release", 2 * rid + 1, 0) for rid in range(len(gaps))]
    return sum(size for _, _, size in admits), admits + releases


def _reuse_scripts(rng: random.Random) -> tuple[int, list[Step], list[Step]]:
    """A seeded arena held by requests 0 and 1 but for a few slots; a script that admits 0
    again after its release, and one that admits 2, too large at first, once 1 is released."""
    first, second, tail = rng.randint(2, 30), rng.randint(2, 30), rng.randint(0, 3)
    held: list[Step] = [("admit", 0, first), ("admit", 1, second)]
    large = rng.randint(tail + 1, second + tail)
    return (first + second + tail,
            [*held, ("release", 0, 0), ("admit", 0, rng.randint(1, first))],
            [*held, ("admit", 2, large), ("release", 1, 0), ("admit", 2, large)])


def _random_script(rng: random.Random, num_slots: int, count: int) -> list[Step]:
    """Admissions of new ids (some refused) and releases of held ones."""
    arena, held, script = _LibraryFirstFit(num_slots), [], []
    for rid in range(count):
        if held and rng.random() < 0.35:
            step: Step = ("release", held.pop(rng.randrange(len(held))), 0)
            arena.release(step[1])
        else:
            step = ("admit", rid, rng.randint(1, num_slots // 3))
            if arena.admit(rid, step[2]) is not None:
                held.append(rid)
        script.append(step)
    return script


def _first_fit_arena_fresh(seed: int) -> list[Case]:
    """Seeded gaps where first, best and worst fit and "no exact fit" disagree; seeded
    neighbours released so that a request fits only if they merged to the right, to the
    left, with the arena's free end or on both sides; a released id and a refused one
    admitted again; a seeded script; each bug."""
    rng = random.Random(seed)
    size = rng.randint(2, 12)
    looser, loosest = rng.randint(1, size - 1), rng.randint(size, 30)
    num_slots, script = _layout(rng, [size + looser, size, size + loosest])
    placed = [*script, ("admit", 50, size), ("admit", 51, size),
              ("admit", 52, size + loosest + 1)]
    sizes, tail = [rng.randint(2, 20) for _ in range(4)], rng.randint(2, 20)
    merges = _merge_scripts(sizes, tail, rng.randint)
    reuse_slots, reuse, refused = _reuse_scripts(rng)
    random_slots = rng.randint(40, 120)
    return [
        _first_fit_arena_case(num_slots, placed, "slabs go to the lowest address that fits; "
                              "None when no gap holds the size"),
        *(_first_fit_arena_case(sum(sizes) + tail, merge, hint) for hint, merge in merges),
        _first_fit_arena_case(reuse_slots, reuse, "a released request holds nothing: the same "
                              "id may be admitted again"),
        _first_fit_arena_case(reuse_slots, refused, REFUSED_HINT),
        _first_fit_arena_case(random_slots, _random_script(rng, random_slots, 14), "slabs go to "
                              "the lowest address that fits; a released slab merges with free "
                              "neighbours"),
        *_first_fit_arena_bugs(random_slots, rng.randint(0, 99), rng.randint(100, 999),
                               rng.randint(1, random_slots), -rng.randint(1, 99)),
    ]


# --- 02.growing_arena: grow in place, or move -----------------------------------------------


class GrowingReference:
    """The expected behaviour of a growing arena, slot by slot (one owner per slot).

    ``fit`` places admissions and moves: ``"first"`` is the exercise's rule; ``"best"``,
    ``"worst"`` and ``"strict"`` (no exact fits) are the mistakes the checks recognise.
    """

    def __init__(self, num_slots: int, fit: str = "first") -> None:
        self.owner: list[int | None] = [None] * num_slots
        self.slabs: dict[int, tuple[int, int]] = {}
        self.copied = 0
        self.fit = fit

    def _free_runs(self) -> list[Gap]:
        runs: list[Gap] = []
        for slot, owner in enumerate(self.owner):
            if owner is not None:
                continue
            if runs and sum(runs[-1]) == slot:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((slot, 1))
        return runs

    def _place(self, request_id: int, start: int, size: int) -> int:
        self.owner[start:start + size] = [request_id] * size
        self.slabs[request_id] = (start, size)
        return start

    def admit(self, request_id: int, length: int) -> int | None:
        if request_id in self.slabs or length < 1:
            raise ValueError(f"cannot admit {request_id!r} with {length!r} slots")
        start = _pick(self._free_runs(), length, self.fit)
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
        new = _pick(self._free_runs(), size + 1, self.fit)
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


def _move_call(op: str, rid: int, length: int) -> str:
    return f"admit({rid}, {length})" if op == "admit" else f"{op}({rid})"


def _grow_script(arena: Any, script: Sequence[Move]) -> dict[str, Any]:
    """Replay ``script``: what every admit and append returned, by its call, then
    ``arena.copied``."""
    labels = iter(unique_labels([_move_call(*move) for move in script if move[0] != "release"]))
    seen = {}
    for op, rid, length in script:
        if op == "release":
            arena.release(rid)
        else:
            seen[next(labels)] = arena.admit(rid, length) if op == "admit" else arena.append(rid)
    return seen | {"arena.copied": _copied(arena)}


def _grow_text(num_slots: int, script: Sequence[Move]) -> str:
    shown = "; ".join(_move_call(*move) for move in script)
    return (f"arena = cls({num_slots}); {shown}  -> what each admit and append returned, "
            "and arena.copied")


COPIED_HINT = ("arena.copied counts the token slots moves have copied: a move copies the tokens "
               "the slab held before it grew, not the slot it grows into, and growing in place "
               "copies nothing")


def _growing_case(num_slots: int, script: Sequence[Move], hint: str) -> Case:
    return Case(_grow_text(num_slots, script),
                lambda cls, n=num_slots, s=tuple(script): _grow_script(cls(n), s),
                _grow_script(GrowingReference(num_slots), script), hint,
                compare=recognising(_fit_mistakes(
                    num_slots, lambda arena: _grow_script(arena, script))),
                hints={"arena.copied": COPIED_HINT})


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
        (60, [("admit", 9, 12), ("admit", 0, 10), ("admit", 1, 5), ("release", 9, 0), *grow],
         "a move goes to the lowest free run that holds the grown slab, even one before it"),
        (60, [("admit", 9, 20), ("admit", 0, 10), ("admit", 1, 5), ("admit", 2, 11),
              ("admit", 3, 5), ("release", 9, 0), ("release", 2, 0), *grow],
         FIT_HINTS["best"]),
        (20, [("admit", 0, 10), ("admit", 1, 10), ("append", 1, 0), *grow, ("release", 1, 0),
              *grow],
         "the arena ends after its last slot; a refused append changes nothing, so once room "
         "appears the slab still holds its own slots and grows in place"),
        (40, [("admit", 5, 5), ("admit", 0, 10), ("admit", 1, 1), ("release", 5, 0), *grow,
              ("admit", 2, 15)],
         "the slots a moved slab leaves behind join the free slots next to them"),
        (20, [("admit", 0, 15), ("admit", 1, 10), ("release", 0, 0), ("admit", 1, 10)],
         "a refused admit (None) changes nothing: the request still holds no slab, so it may "
         "be admitted once room appears"),
        (60, [("admit", 0, 10), ("admit", 1, 10), *grow, ("admit", 2, 12), *grow,
              ("append", 2, 0), ("admit", 3, 11)],
         "every move copies the slab's tokens; a slab that fits nowhere gets None"),
    ]
    cases = [_growing_case(n, script, why) for n, script, why in scripts]
    return cases + _growing_bugs(40, 0, 7, 5, -3)


def _growing_bugs(num_slots: int, rid: int, other: int, size: int, negative: int) -> list[Case]:
    """An append to ``other`` (which holds nothing), a second admit, lengths 0 and
    ``negative``, and a second release."""
    errors = [
        ([("append", other, 0)], "appending to a request that holds no slab is a bug"),
        ([("admit", rid, size), ("admit", rid, size)], "a request holds one slab"),
        ([("admit", rid, 0)], "a slab of 0 slots is a mistake"),
        ([("admit", rid, negative)],
         "a negative length is a mistake too: refuse every length below 1"),
        ([("admit", rid, size), ("release", rid, 0), ("release", rid, 0)],
         "a released request holds no slab"),
    ]
    return [Case(_grow_text(num_slots, script).split("  ->")[0],
                 lambda cls, n=num_slots, s=tuple(script): _grow_script(cls(n), s),
                 Raises(ValueError), f"{why}: raise ValueError naming the id or the size")
            for script, why in errors]


def _random_moves(rng: random.Random, num_slots: int, count: int) -> list[Move]:
    """Admissions (some refused), appends in bursts and releases of held slabs."""
    arena, held, script = GrowingReference(num_slots), [], []
    for rid in range(count):
        roll = rng.random()
        if held and roll < 0.5:
            target = rng.choice(held)
            moves = [("append", target, 0)] * rng.randint(1, 4)
            for _ in moves:
                arena.append(target)
            script += moves
        elif held and roll < 0.65:
            target = held.pop(rng.randrange(len(held)))
            arena.release(target)
            script.append(("release", target, 0))
        else:
            script.append(("admit", rid, rng.randint(1, num_slots // 4)))
            if arena.admit(rid, script[-1][2]) is not None:
                held.append(rid)
    return script


def _growing_fresh(seed: int) -> list[Case]:
    """A seeded slab at the arena's end that must move where first, best and worst fit and
    "no exact fit" disagree, then grows in place; one with free slots before it, blocked
    until its neighbour leaves; a released id and a refused one admitted again; a seeded
    script; each bug."""
    rng = random.Random(seed)
    size = rng.randint(2, 10)
    looser, loosest = rng.randint(1, size), rng.randint(size + 1, 20)
    fit_slots, layout = _layout(rng, [size + 1 + looser, size + 1, size + 1 + loosest],
                                (90, size))
    moved = [*layout, ("append", 90, 0), ("append", 90, 0), ("admit", 91, size + 1)]
    before, after = rng.randint(1, size), rng.randint(0, size)
    neighbour = rng.randint(1, 8)
    blocked = [("admit", 0, rng.randint(1, 8)), ("admit", 1, before), ("admit", 2, size),
               ("admit", 3, neighbour), ("release", 1, 0), ("append", 2, 0), ("release", 3, 0),
               ("append", 2, 0)]
    reuse_slots, reuse, refused = _reuse_scripts(rng)
    random_slots = rng.randint(30, 80)
    return [
        _growing_case(fit_slots, moved, "a slab that cannot grow in place (the arena ends after "
                      "its last slot) moves whole to the lowest free run that holds it"),
        _growing_case(sum(n for op, _, n in blocked if op == "admit") + after, blocked,
                      "while it is copied the slab still holds its old slots: they cannot be "
                      "part of the new place; a refused append changes nothing"),
        _growing_case(reuse_slots, reuse, "a released request holds nothing: the same id may be "
                      "admitted again"),
        _growing_case(reuse_slots, refused, REFUSED_HINT),
        _growing_case(random_slots, _random_moves(rng, random_slots, 10), "a slab grows in "
                      "place while the next slot is free, else moves whole to the lowest free "
                      "run that holds it"),
        *_growing_bugs(random_slots, rng.randint(0, 99), rng.randint(100, 999),
                       rng.randint(1, random_slots), -rng.randint(1, 99)),
    ]


EXERCISES = (
    Exercise("02.slot_states", "Written, still to write, never written", _slot_states_cases,
             reference=("course_lib.slab",), fresh=_slot_states_fresh),
    Exercise("02.first_fit", "First-fit gap search", _first_fit_cases,
             reference=("course_lib.slab",), fresh=_first_fit_fresh),
    Exercise("02.no_gap_fits", "Free, but no gap fits", _no_gap_fits_cases,
             reference=("course_lib.slab",), fresh=_no_gap_fits_fresh),
    Exercise("02.reserve_max_arena", "A reserve-max arena: admit and release",
             _reserve_max_cases, reference=("course_lib.slab",), fresh=_reserve_max_fresh),
    Exercise("02.first_fit_arena", "An exact-size first-fit arena", _first_fit_arena_cases,
             reference=("course_lib.slab",), fresh=_first_fit_arena_fresh),
    Exercise("02.growing_arena", "Grow in place, or move", _growing_cases,
             reference=("course_lib.slab",), fresh=_growing_fresh),
)
