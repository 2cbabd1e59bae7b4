"""Chapter 09's checks: correct answers of two designs pass, the classic mistakes fail
with the hint that names them."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Any

import pytest

from course_lib.grading import find_exercise
from course_lib.grading.ch09 import EXERCISES, FRESH
from course_lib.grading.check import CheckResult, evaluate
from course_lib.router import ring_position

# --- the store -----------------------------------------------------------------------------


class OrderedStore:
    """LRU over an OrderedDict, least recent first."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity, self.entries = capacity_bytes, OrderedDict()

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries:
            self.entries.move_to_end(key)
            return []
        if nbytes > self.capacity:
            return []
        self.entries[key] = nbytes
        dropped = []
        while sum(self.entries.values()) > self.capacity:
            dropped.append(self.entries.popitem(last=False)[0])
        return dropped

    def get(self, key: str) -> bool:
        if key not in self.entries:
            return False
        self.entries.move_to_end(key)
        return True

    def keys(self) -> list[str]:
        return list(self.entries)

    def used(self) -> int:
        return sum(self.entries.values())


class ClockStore:
    """Another design: a use counter per key; the oldest use goes first."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity, self.size, self.last, self.clock = capacity_bytes, {}, {}, 0

    def _touch(self, key: str) -> None:
        self.clock += 1
        self.last[key] = self.clock

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.size:
            self._touch(key)
            return []
        if nbytes > self.capacity:
            return []
        self.size[key] = nbytes
        self._touch(key)
        dropped = []
        while self.used() > self.capacity:
            oldest = min(self.last, key=self.last.get)
            del self.size[oldest], self.last[oldest]
            dropped.append(oldest)
        return dropped

    def get(self, key: str) -> bool:
        if key in self.size:
            self._touch(key)
        return key in self.size

    def keys(self) -> list[str]:
        return sorted(self.last, key=self.last.get)

    def used(self) -> int:
        return sum(self.size.values())


class MruStore(OrderedStore):
    """Drops the most recently used (but never the entry just stored)."""

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries or nbytes > self.capacity:
            return super().put(key, nbytes)
        dropped = []
        while self.entries and sum(self.entries.values()) + nbytes > self.capacity:
            dropped.append(self.entries.popitem(last=True)[0])
        self.entries[key] = nbytes
        return dropped


class BlockCapStore(OrderedStore):
    """Counts the cap in entries of the first size seen, not in bytes."""

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries:
            return super().put(key, nbytes)
        self.block = getattr(self, "block", nbytes)
        if nbytes > self.capacity:
            return []
        self.entries[key] = nbytes
        dropped = []
        while len(self.entries) > self.capacity // self.block:
            dropped.append(self.entries.popitem(last=False)[0])
        return dropped


class NoRefreshStore(OrderedStore):
    """get() reports a hit without making it the most recent."""

    def get(self, key: str) -> bool:
        return key in self.entries


# --- the ring ------------------------------------------------------------------------------


class BisectRing:
    def __init__(self, vnodes: int) -> None:
        self.vnodes, self.points, self.replicas = vnodes, [], set()

    def add(self, replica: int) -> None:
        if replica in self.replicas:
            raise ValueError(f"replica {replica} already added")
        self.replicas.add(replica)
        for v in range(self.vnodes):
            bisect.insort(self.points, (ring_position(f"replica {replica} point {v}"), replica))

    def lookup(self, key: str) -> int:
        if not self.points:
            raise ValueError("empty ring")
        at = bisect.bisect_left(self.points, (ring_position(key), -1))
        return self.points[at % len(self.points)][1]


class ScanRing(BisectRing):
    """Another design: a linear scan for the smallest point at or after the key."""

    def lookup(self, key: str) -> int:
        if not self.points:
            raise ValueError("empty ring")
        position = ring_position(key)
        after = [p for p in self.points if p[0] >= position]
        return min(after)[1] if after else min(self.points)[1]


class ModuloRing(BisectRing):
    """Rehashes everything: hash % number of replicas."""

    def lookup(self, key: str) -> int:
        if not self.replicas:
            raise ValueError("empty ring")
        return sorted(self.replicas)[ring_position(key) % len(self.replicas)]


class NoWrapRing(BisectRing):
    """Forgets to wrap: a key past the last point goes to the last point."""

    def lookup(self, key: str) -> int:
        if not self.points:
            raise ValueError("empty ring")
        at = bisect.bisect_left(self.points, (ring_position(key), -1))
        return self.points[min(at, len(self.points) - 1)][1]


# --- the scorer ----------------------------------------------------------------------------


def leading(chain: list[str], held: set[str]) -> int:
    count = 0
    for block_hash in chain:
        if block_hash not in held:
            break
        count += 1
    return count


def choose(chain, held, loads, block_size, load_penalty):
    scores = [leading(chain, h) * block_size - load_penalty * load
              for h, load in zip(held, loads, strict=True)]
    return max(range(len(held)), key=lambda r: (scores[r], -loads[r], -r))


def choose_sorted(chain, held, loads, block_size, load_penalty):
    """Another design: sort by (score descending, load, index)."""
    ranked = sorted(range(len(held)), key=lambda r: (
        load_penalty * loads[r] - block_size * leading(chain, held[r]), loads[r], r))
    return ranked[0]


def choose_ignoring_load(chain, held, loads, block_size, load_penalty):
    return choose(chain, held, [0] * len(loads), block_size, load_penalty)


def choose_any_match(chain, held, loads, block_size, load_penalty):
    scores = [sum(h in held[r] for h in chain) * block_size - load_penalty * loads[r]
              for r in range(len(held))]
    return max(range(len(held)), key=lambda r: (scores[r], -loads[r], -r))


# --- choosing a tier -----------------------------------------------------------------------


def hit_rate(row: dict[str, int]) -> float:
    return (row["prefix_cache_hits"] + row["external_prefix_cache_hits"]) / row[
        "prefix_cache_queries"]


def choose_tier(study, share):
    gains = {m: hit_rate(row) - hit_rate(study[0.0]) for m, row in study.items()}
    best = max(gains.values())
    if best <= 0:
        return 0.0
    return min(m for m, g in gains.items() if g >= share * best)


def choose_tier_gpu_only(study, share):
    return choose_tier({m: {**r, "external_prefix_cache_hits": 0} for m, r in study.items()},
                       share)


def choose_tier_largest(study, share):
    return max(study)


# --- the checks ----------------------------------------------------------------------------


def result(name: str, obj: Any, seed: int | None = None) -> CheckResult:
    exercise = find_exercise(name)
    if seed is None:
        return evaluate(exercise, obj)
    cases = FRESH[name](seed)
    return evaluate(type(exercise)(exercise.name, exercise.title, lambda: cases), obj)


CORRECT = {
    "09.lru_tier": (OrderedStore, ClockStore),
    "09.hash_ring": (BisectRing, ScanRing),
    "09.prefix_scorer": (choose, choose_sorted),
    "09.choose_tier": (choose_tier,),
}

MUTANTS = [
    ("09.lru_tier", MruStore, "MRU, not LRU"),
    ("09.lru_tier", BlockCapStore, "a cap counted in entries is wrong"),
    ("09.lru_tier", NoRefreshStore, "get() on a hit makes the entry the most recently used"),
    ("09.hash_ring", ModuloRing, "hash % N moves almost all"),
    ("09.hash_ring", NoWrapRing, "wrapping past the end to the first"),
    ("09.prefix_scorer", choose_ignoring_load, "a scorer that ignores load picks 1"),
    ("09.prefix_scorer", choose_any_match, "only the leading blocks count"),
    ("09.choose_tier", choose_tier_gpu_only, "(GPU hits + tier hits) / queries"),
    ("09.choose_tier", choose_tier_largest, "90% of the best"),
]


def test_four_exercises_each_with_fresh_cases() -> None:
    assert [e.name for e in EXERCISES] == list(FRESH) == list(CORRECT)


@pytest.mark.parametrize(("name", "answer"),
                         [(n, a) for n, answers in CORRECT.items() for a in answers])
def test_correct_answers_of_two_designs_pass(name: str, answer: Any) -> None:
    for seed in (None, 0, 1, 2):
        checked = result(name, answer, seed)
        assert checked.passed == checked.total > 0, checked.report_text()


@pytest.mark.parametrize(("name", "mutant", "hint"), MUTANTS)
def test_classic_mistakes_fail_with_their_hint(name: str, mutant: Any, hint: str) -> None:
    checked = result(name, mutant)
    failed = [case for case in checked.cases if not case.passed]
    assert failed, f"{mutant} passed {name}"
    assert any(hint in case.hint for case in failed), [case.hint for case in failed]


def test_fresh_cases_are_seeded() -> None:
    for name, fresh in FRESH.items():
        assert [c.call for c in fresh(5)] == [c.call for c in fresh(5)], name
        assert [c.call for c in fresh(5)] != [c.call for c in fresh(6)], name
