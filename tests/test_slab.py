"""Contiguous slabs: sizes, first- and best-fit, merging, waste accounting, fragmentation."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course_lib.slab import OutOfSlots, Slab, SlabAllocator, SlabUsage


def test_reserve_max_gives_every_request_max_len_slots() -> None:
    arena = SlabAllocator(491_520, policy="reserve-max", max_len=8192)
    for rid in range(60):
        assert arena.admit(rid, final_len=900, length=600).size == 8192
    assert (arena.num_free, arena.fits(10)) == (0, False)
    assert arena.usage() == SlabUsage(used=60 * 600, reserved=60 * 300,
                                      internal=60 * (8192 - 900), free=0)


def test_exact_size_reserves_the_final_length_and_tracks_writes() -> None:
    arena = SlabAllocator(100, policy="exact-size", max_len=50)
    assert arena.admit(7, final_len=30, length=10) == Slab(0, 30, 30, 10)
    assert arena.append(7, 5) == Slab(0, 30, 30, 15)
    assert arena.usage() == SlabUsage(used=15, reserved=15, internal=0, free=70)
    assert arena.usage().arena_slots == 100
    assert arena.slabs == {7: Slab(0, 30, 30, 15)}


def test_first_fit_takes_the_lowest_gap_best_fit_the_smallest() -> None:
    layouts = {}
    for fit in ("first", "best"):
        arena = SlabAllocator(20, policy="exact-size", max_len=20, fit=fit)
        for rid, size in enumerate((5, 2, 3, 2, 8)):
            arena.admit(rid, size)
        arena.free(0)  # gap [0, 5)
        arena.free(2)  # gap [7, 10)
        assert arena.gaps() == [(0, 5), (7, 3)]
        layouts[fit] = arena.admit(9, 3).start
    assert layouts == {"first": 0, "best": 7}


def test_freeing_merges_neighbouring_gaps() -> None:
    arena = SlabAllocator(12, policy="exact-size", max_len=12)
    for rid in range(3):
        arena.admit(rid, 4)
    arena.free(0)
    arena.free(2)
    assert arena.gaps() == [(0, 4), (8, 4)]
    arena.free(1)
    assert arena.gaps() == [(0, 12)]


def test_free_space_enough_but_no_gap_fits() -> None:
    arena = SlabAllocator(12, policy="exact-size", max_len=12)
    for rid in range(3):
        arena.admit(rid, 4)
    arena.free(0)
    arena.free(2)
    assert (arena.num_free, arena.largest_gap, arena.stranded(5), arena.stranded(4)) == (
        8, 4, 8, 0)
    with pytest.raises(OutOfSlots, match="no single gap holds them") as caught:
        arena.admit(5, 5)
    assert (caught.value.needed, caught.value.largest_gap, caught.value.free) == (5, 4, 8)
    assert arena.gaps() == [(0, 4), (8, 4)]  # unchanged
    with pytest.raises(OutOfSlots, match="not enough free slots"):
        arena.admit(5, 9)


@pytest.mark.parametrize(
    ("call", "message"),
    [(lambda a: a.admit(0, 5), "request 0 already holds a slab"),
     (lambda a: a.admit(1, 11), "final_len=11 exceeds max_len=10"),
     (lambda a: a.admit(1, 0), "final_len must be an integer >= 1, got 0"),
     (lambda a: a.admit(-1, 3), "request_id must be an integer >= 0, got -1"),
     (lambda a: a.admit(1, 3, length=4), "length=4 exceeds final_len=3"),
     (lambda a: a.append(0, 6), r"request 0: 0 \+ 6 tokens exceeds its final length 5"),
     (lambda a: a.append(0, 0), "num_tokens must be an integer >= 1, got 0"),
     (lambda a: a.append(3), "request 3 holds no slab"),
     (lambda a: a.free(3), "request 3 holds no slab")],
)
def test_bad_calls_are_rejected(call, message: str) -> None:
    arena = SlabAllocator(100, policy="exact-size", max_len=10)
    arena.admit(0, 5)
    with pytest.raises(ValueError, match=message):
        call(arena)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"num_slots": 0}, "num_slots must be an integer >= 1, got 0"),
     ({"policy": "reserve-all"}, "unknown slab policy 'reserve-all'"),
     ({"fit": "worst"}, "unknown fit 'worst'; expected one of first, best"),
     ({"max_len": 0}, "max_len must be an integer >= 1, got 0")],
)
def test_bad_arenas_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlabAllocator(**({"num_slots": 10} | kwargs))


class SlabMachine(RuleBasedStateMachine):
    """Random admit / append / free on both policies and both fits, checked slot by slot."""

    def __init__(self) -> None:
        super().__init__()
        self.arena: SlabAllocator | None = None
        self.next_id = 0

    @precondition(lambda self: self.arena is None)
    @rule(num_slots=st.integers(1, 60), policy=st.sampled_from(["reserve-max", "exact-size"]),
          fit=st.sampled_from(["first", "best"]), max_len=st.integers(1, 20))
    def make(self, num_slots: int, policy: str, fit: str, max_len: int) -> None:
        self.arena = SlabAllocator(num_slots, policy=policy, max_len=max_len, fit=fit)

    @precondition(lambda self: self.arena is not None)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        arena = self.arena
        final = data.draw(st.integers(1, arena.max_len))
        length = data.draw(st.integers(0, final))
        before = arena.gaps()
        if arena.largest_gap >= arena.slab_size(final):
            slab = arena.admit(self.next_id, final, length)
            assert slab.size == arena.slab_size(final)
        else:
            with pytest.raises(OutOfSlots):
                arena.admit(self.next_id, final, length)
            assert arena.gaps() == before
        self.next_id += 1

    @precondition(lambda self: self.arena is not None and self.arena.slabs)
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.arena.slabs)))
        slab = self.arena.slabs[rid]
        if slab.length < slab.final_len:
            self.arena.append(rid, data.draw(st.integers(1, slab.final_len - slab.length)))

    @precondition(lambda self: self.arena is not None and self.arena.slabs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.arena.free(data.draw(st.sampled_from(sorted(self.arena.slabs))))

    @precondition(lambda self: self.arena is not None)
    @rule()
    def free_everything(self) -> None:
        for rid in list(self.arena.slabs):
            self.arena.free(rid)
        assert self.arena.gaps() == [(0, self.arena.num_slots)]
        assert self.arena.usage() == SlabUsage(0, 0, 0, self.arena.num_slots)

    @invariant()
    def every_slot_is_in_exactly_one_slab_or_gap(self) -> None:
        arena = self.arena
        if arena is None:
            return
        owner = [None] * arena.num_slots
        pieces = [(s.start, s.size, rid) for rid, s in arena.slabs.items()]
        pieces += [(start, size, "gap") for start, size in arena.gaps()]
        for start, size, who in pieces:
            assert size > 0
            for slot in range(start, start + size):
                assert owner[slot] is None, f"slot {slot} handed out twice"
                owner[slot] = who
        assert None not in owner, "a slot was lost"
        gaps = arena.gaps()
        assert all(a + n < b for (a, n), (b, _) in pairwise(gaps))
        usage = arena.usage()
        assert usage.arena_slots == arena.num_slots
        assert usage.free == arena.num_free == sum(n for _, n in gaps)
        assert min(usage.used, usage.reserved, usage.internal) >= 0


SlabMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25,
                                         deadline=None)
TestSlabMachine = SlabMachine.TestCase
