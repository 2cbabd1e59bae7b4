"""Chapter 09's kept wrong answers, each with the hint its report must show first, and right
answers of other designs than the solution notebook's (see ``tests/mutants/__init__.py``).

``OrderedStore``, ``BisectRing``, ``choose`` and ``choose_tier`` are right answers the
mutants build on (``tests/test_grading_ch09.py`` checks them on more seeds).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from fractions import Fraction

from course_lib.router import ring_position
from tests.mutants import Mutant, Right

Study = dict[float, dict[str, int]]
"""A tier study: multiple of the GPU cache -> that run's counters."""

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


class OversizeStore(OrderedStore):
    """No size check: an entry larger than the capacity pushes everything out, itself too."""

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries:
            return super().put(key, nbytes)
        self.entries[key] = nbytes
        dropped = []
        while sum(self.entries.values()) > self.capacity:
            dropped.append(self.entries.popitem(last=False)[0])
        return dropped


class PutNoRefreshStore(OrderedStore):
    """Putting a key already held leaves it where it was."""

    def put(self, key: str, nbytes: int) -> list[str]:
        return [] if key in self.entries else super().put(key, nbytes)


class FullAtCapacityStore(OrderedStore):
    """Drops while ``used >= capacity``: exactly the capacity never fits."""

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries or nbytes > self.capacity:
            return super().put(key, nbytes)
        self.entries[key] = nbytes
        dropped = []
        while self.entries and sum(self.entries.values()) >= self.capacity:
            dropped.append(self.entries.popitem(last=False)[0])
        return dropped


class CountedStore(OrderedStore):
    """Keeps a byte counter that a drop forgets to lower."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.counted = 0

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries or nbytes > self.capacity:
            return super().put(key, nbytes)
        self.entries[key] = nbytes
        self.counted += nbytes
        dropped = []
        while self.entries and self.counted > self.capacity:
            dropped.append(self.entries.popitem(last=False)[0])
        return dropped

    def used(self) -> int:
        return self.counted


class IfStore(OrderedStore):
    """Drops at most one entry per put: an if where a while belongs."""

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries or nbytes > self.capacity:
            return super().put(key, nbytes)
        self.entries[key] = nbytes
        if sum(self.entries.values()) > self.capacity:
            return [self.entries.popitem(last=False)[0]]
        return []


class WholeCapacityRefusedStore(OrderedStore):
    """Refuses an entry of exactly the capacity (>= where > belongs)."""

    def put(self, key: str, nbytes: int) -> list[str]:
        if key not in self.entries and nbytes >= self.capacity:
            return []
        return super().put(key, nbytes)


class ResizingStore(OrderedStore):
    """Putting a key already held stores its new size (and drops for it)."""

    def put(self, key: str, nbytes: int) -> list[str]:
        if key in self.entries and nbytes <= self.capacity:
            del self.entries[key]
        return super().put(key, nbytes)


# --- the ring ------------------------------------------------------------------------------


class BisectRing:
    """Sorted (position, replica) points; a key to the first at or after it, wrapping."""

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


class StrictlyAfterRing(BisectRing):
    """Gives a key to the first point strictly after it (bisect_right)."""

    def lookup(self, key: str) -> int:
        if not self.points:
            raise ValueError("empty ring")
        at = bisect.bisect_right(self.points, (ring_position(key), float("inf")))
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


class PredecessorRing(BisectRing):
    """Gives a key to the last point before it (counter-clockwise)."""

    def lookup(self, key: str) -> int:
        if not self.points:
            raise ValueError("empty ring")
        return self.points[bisect.bisect_left(self.points, (ring_position(key), -1)) - 1][1]


class OnePointRing(BisectRing):
    """One point per replica, whatever ``vnodes`` says."""

    def __init__(self, vnodes: int) -> None:
        super().__init__(1)


class UncheckedEmptyRing(BisectRing):
    """Looks a key up on an empty ring without a check (a ZeroDivisionError)."""

    def lookup(self, key: str) -> int:
        at = bisect.bisect_left(self.points, (ring_position(key), -1))
        return self.points[at % len(self.points)][1]


class TwiceRing(BisectRing):
    """Adds a replica again (its points twice) instead of refusing."""

    def add(self, replica: int) -> None:
        self.replicas.discard(replica)
        super().add(replica)


# --- the scorer ----------------------------------------------------------------------------


def leading(chain: list[str], held: set[str]) -> int:
    """How many of the chain's blocks, from the first, ``held`` holds."""
    count = 0
    for block_hash in chain:
        if block_hash not in held:
            break
        count += 1
    return count


def choose(chain: list[str], held: list[set[str]], loads: list[int],
           block_size: int, load_penalty: float) -> int:
    """Leading hits in tokens less the load penalty; a tie to the less loaded,
    then the lower index."""
    scores = [leading(chain, h) * block_size - load_penalty * load
              for h, load in zip(held, loads, strict=True)]
    return max(range(len(held)), key=lambda r: (scores[r], -loads[r], -r))


def choose_sorted(chain: list[str], held: list[set[str]], loads: list[int],
                  block_size: int, load_penalty: float) -> int:
    """Another design: sort by (score descending, load, index)."""
    ranked = sorted(range(len(held)), key=lambda r: (
        load_penalty * loads[r] - block_size * leading(chain, held[r]), loads[r], r))
    return ranked[0]


def choose_ignoring_load(chain: list[str], held: list[set[str]], loads: list[int],
                         block_size: int, load_penalty: float) -> int:
    """The loads left out of the score."""
    return choose(chain, held, [0] * len(loads), block_size, load_penalty)


def choose_any_match(chain: list[str], held: list[set[str]], loads: list[int],
                     block_size: int, load_penalty: float) -> int:
    """Every block of the chain a replica holds counted, not only the leading run."""
    scores = [sum(h in held[r] for h in chain) * block_size - load_penalty * loads[r]
              for r in range(len(held))]
    return max(range(len(held)), key=lambda r: (scores[r], -loads[r], -r))


def choose_in_blocks(chain: list[str], held: list[set[str]], loads: list[int],
                     block_size: int, load_penalty: float) -> int:
    """Hits counted in blocks, not tokens."""
    return choose(chain, held, loads, 1, load_penalty)


def choose_capped(chain: list[str], held: list[set[str]], loads: list[int],
                  block_size: int, load_penalty: float) -> int:
    """The hit capped one block short of the chain, as if its last token were computed."""
    scores = [min(leading(chain, h), len(chain) - 1) * block_size - load_penalty * load
              for h, load in zip(held, loads, strict=True)]
    return max(range(len(held)), key=lambda r: (scores[r], -loads[r], -r))


def choose_tie_by_index(chain: list[str], held: list[set[str]], loads: list[int],
                        block_size: int, load_penalty: float) -> int:
    """A tie goes to the lower index, whatever the loads."""
    scores = [leading(chain, h) * block_size - load_penalty * load
              for h, load in zip(held, loads, strict=True)]
    return max(range(len(held)), key=lambda r: (scores[r], -r))


# --- choosing a tier -----------------------------------------------------------------------


def hit_rate(row: dict[str, int]) -> float:
    """(GPU hits + tier hits) / queries of one run."""
    return (row["prefix_cache_hits"] + row["external_prefix_cache_hits"]) / row[
        "prefix_cache_queries"]


def choose_tier(study: Study, share: float) -> float:
    """The notebook's design: the smallest multiple with ``share`` of the best gain."""
    gains = {m: hit_rate(row) - hit_rate(study[0.0]) for m, row in study.items()}
    best = max(gains.values())
    if best <= 0:
        return 0.0
    return min(m for m, g in gains.items() if g >= share * best)


def choose_tier_gpu_only(study: Study, share: float) -> float:
    """The tier's hits left out of the hit rate."""
    return choose_tier({m: {**r, "external_prefix_cache_hits": 0} for m, r in study.items()},
                       share)


def choose_tier_largest(study: Study, share: float) -> float:
    """The largest tier studied, whatever it gains."""
    return max(study)


def choose_tier_by_counts(study: Study, share: float) -> float:
    """Hit counts, not rates: (GPU hits + tier hits) without dividing by the queries."""
    return choose_tier({m: {**r, "prefix_cache_queries": 1} for m, r in study.items()}, share)


def choose_tier_share_of_rate(study: Study, share: float) -> float:
    """A share of the best hit rate, not of the best gain over no tier."""
    rates = {m: hit_rate(row) for m, row in study.items()}
    return min(m for m, rate in rates.items() if rate >= share * max(rates.values()))


def choose_tier_first_row(study: Study, share: float) -> float:
    """The first row that reaches the share, in the order the rows came."""
    gains = {m: hit_rate(row) - hit_rate(study[0.0]) for m, row in study.items()}
    best = max(gains.values())
    return next((m for m, g in gains.items() if g >= share * best), 0.0) if best > 0 else 0.0


def choose_tier_passing(study: Study, share: float) -> float:
    """A gain must pass share x the best gain (>), not reach it; the largest when none does."""
    gains = {m: hit_rate(row) - hit_rate(study[0.0]) for m, row in study.items()}
    best = max(gains.values())
    if best <= 0:
        return 0.0
    return min((m for m, g in gains.items() if g > share * best), default=max(study))


def choose_tier_tier_rate(study: Study, share: float) -> float:
    """Miss rates over the tokens the GPU missed (what the tier was asked), not over all
    queries: the gain is the fall in that miss rate."""
    def miss_rate(row: dict[str, int]) -> float:
        asked = row["prefix_cache_queries"] - row["prefix_cache_hits"]
        return (asked - row["external_prefix_cache_hits"]) / asked

    gains = {m: miss_rate(study[0.0]) - miss_rate(row) for m, row in study.items()}
    best = max(gains.values())
    if best <= 0:
        return 0.0
    return min(m for m, g in gains.items() if g >= share * best)


def choose_tier_int_zero(study: Study, share: float) -> float:
    """The notebook's design, but 0 (an int) where no tier gains anything."""
    found = choose_tier(study, share)
    return 0 if found == 0.0 else found


def choose_tier_exact(study: Study, share: float) -> float:
    """Another design: exact fractions, multiples in ascending order, the first that reaches
    the share of the best gain."""
    def rate(row: dict[str, int]) -> Fraction:
        return Fraction(row["prefix_cache_hits"] + row["external_prefix_cache_hits"],
                        row["prefix_cache_queries"])

    ordered = sorted(study)
    gains = [rate(study[m]) - rate(study[0.0]) for m in ordered]
    best = max(gains)
    if best <= 0:
        return 0.0
    return next(m for m, g in zip(ordered, gains, strict=True)
                if g >= Fraction(share).limit_denominator(10**6) * best)


# --- the tables ----------------------------------------------------------------------------

LRU, RING, SCORER, TIER = "09.lru_tier", "09.hash_ring", "09.prefix_scorer", "09.choose_tier"

RIGHT = [
    Right(LRU, "an OrderedDict, least recent first", OrderedStore),
    Right(LRU, "a use counter per key, the oldest use dropped first", ClockStore),
    Right(RING, "a linear scan for the first point at or after the key", ScanRing),
    Right(SCORER, "sorted by (score descending, load, index)", choose_sorted),
    Right(TIER, "exact fractions, multiples in ascending order", choose_tier_exact),
    Right(RING, "bisect over the sorted points", BisectRing),
    Right(SCORER, "max over (score, -load, -index)", choose),
    Right(TIER, "the notebook's design", choose_tier),
]

MUTANTS = [
    Mutant(LRU, "the most recent dropped (MRU)", MruStore, "MRU, not LRU"),
    Mutant(LRU, "the cap counted in entries", BlockCapStore, "a cap counted in entries is wrong"),
    Mutant(LRU, "get() does not refresh", NoRefreshStore,
           "get() on a hit makes the entry the most recently used"),
    Mutant(LRU, "an entry larger than the capacity stored", OversizeStore,
           "larger than the whole capacity is not stored"),
    Mutant(LRU, "put() of a held key does not refresh", PutNoRefreshStore,
           "putting a key already held refreshes it"),
    Mutant(LRU, "exactly the capacity does not fit", FullAtCapacityStore,
           "exactly capacity bytes fit"),
    Mutant(LRU, "a drop does not lower the byte count", CountedStore,
           "each drop frees its bytes"),
    Mutant(LRU, "at most one entry dropped per put (if, not while)", IfStore,
           "WHILE the bytes exceed the capacity"),
    Mutant(LRU, "an entry of exactly the capacity refused", WholeCapacityRefusedStore,
           "an entry of exactly the capacity fits"),
    Mutant(LRU, "a re-put stores its new size", ResizingStore,
           "keeps the size it was stored with"),
    Mutant(RING, "hash % N", ModuloRing, "hash % N moves almost all"),
    Mutant(RING, "no wrap past the last point", NoWrapRing, "wraps around the ring"),
    Mutant(RING, "the last point before the key", PredecessorRing, "(clockwise)"),
    Mutant(RING, "one point per replica", OnePointRing, "for v in range(vnodes)"),
    Mutant(RING, "the first point strictly after the key", StrictlyAfterRing,
           "AT or after the key"),
    Mutant(RING, "no check on an empty ring", UncheckedEmptyRing,
           "an empty ring has no owner"),
    Mutant(RING, "a replica added twice", TwiceRing, "a replica already on the ring"),
    Mutant(SCORER, "load ignored", choose_ignoring_load, "a scorer that ignores load picks 1"),
    Mutant(SCORER, "every held block counted, not the leading run", choose_any_match,
           "only the leading blocks count"),
    Mutant(SCORER, "hits in blocks, not tokens", choose_in_blocks, "hits are in tokens"),
    Mutant(SCORER, "a tie to the lower index, whatever the loads", choose_tie_by_index,
           "the less loaded wins"),
    Mutant(SCORER, "the hit capped one block short of the chain", choose_capped,
           "up to len(chain), not len(chain) - 1"),
    Mutant(TIER, "tier hits left out", choose_tier_gpu_only, "(GPU hits + tier hits) / queries"),
    Mutant(TIER, "the largest tier", choose_tier_largest, "SMALLEST tier"),
    Mutant(TIER, "hit counts, not rates", choose_tier_by_counts, "compare hit RATES"),
    Mutant(TIER, "a share of the best rate, not of the best gain", choose_tier_share_of_rate,
           "not of the best hit rate"),
    Mutant(TIER, "the first row that reaches the share", choose_tier_first_row,
           "the rows need not come in order"),
    Mutant(TIER, "> for >= at the share", choose_tier_passing, ">=, not >"),
    Mutant(TIER, "miss rates over the GPU's misses", choose_tier_tier_rate,
           "not over the tokens the GPU missed"),
    Mutant(TIER, "0 (an int) for 0.0", choose_tier_int_zero, "0.0 where no tier gains"),
]


