"""Chapter 09 exercises: the CPU tier's LRU store, a consistent-hashing ring, the
prefix-aware scorer with its load penalty, and reading the metrics to choose a tier size.

The store and the ring are built from a specification alone (their docstrings in the
notebook). Expected values come from ``course_lib.tier.CpuTier``, ``course_lib.router``
(``HashRing``, ``PrefixIndex``, ``prefix_aware_choice``) and ``course_lib.tier.TierStats``,
always on the grader's side: a case's ``run`` replays a script of calls on the learner's
object and returns what each call gave back, as plain data, and captures nothing computed
from the answer key. A wrong value that a known slip gives (a ring of ``hash % N``, tier hits
left out, ...) is named by that slip's hint (``recognising``), computed on the grader's side
too. ``FRESH`` holds each exercise's seeded cases: inputs drawn from ``random.Random(seed)``
for every kind of fixed case (each behaviour, each input that must raise).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from typing import Any

from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    naming_type,
    recognising,
    strict_equal,
    unique_labels,
)
from course_lib.prefix_cache import hash_block_tokens
from course_lib.router import HashRing, PrefixIndex, prefix_aware_choice, ring_position
from course_lib.tier import CpuTier, TierStats

Op = tuple[Any, ...]
"""A store script's step: ``("put", key, nbytes)``, ``("get", key)``, ``("keys",)`` or
``("used",)``."""


def _case(call: str, run: Callable[[Any], Any], expected: Any, hint: str) -> Case:
    return Case(call, run, expected, hint, strict_equal)


# --- 09.lru_tier: the byte-capped LRU store ----------------------------------------------


def _op_labels(script: Sequence[Op]) -> list[str]:
    """Each step's call as a distinct label (``put('a', 40)``, ``keys()``, ``keys() #2``)."""
    return unique_labels([f"{op[0]}({', '.join(map(repr, op[1:]))})" for op in script])


def _replay_store(cls: Any, capacity: int, script: Sequence[Op]) -> dict[str, Any]:
    """Make the learner's store and play ``script`` on it; what each call returned, by call."""
    store = cls(capacity)
    out: list[Any] = []
    for op in script:
        if op[0] == "put":
            out.append(list(store.put(op[1], op[2])))
        elif op[0] == "get":
            out.append(store.get(op[1]))
        elif op[0] == "keys":
            out.append(list(store.keys()))
        else:
            out.append(store.used())
    return dict(zip(_op_labels(script), out, strict=True))


def _key_hash(key: str) -> bytes:
    return hash_block_tokens(None, list(key.encode()))


def _expected_store(capacity: int, script: Sequence[Op]) -> dict[str, Any]:
    """The same script on ``CpuTier``."""
    tier, names = CpuTier(capacity), {}
    out: list[Any] = []
    for op in script:
        if op[0] == "put":
            names[_key_hash(op[1])] = op[1]
            out.append([names[h] for h in tier.put(_key_hash(op[1]), op[2])])
        elif op[0] == "get":
            held = _key_hash(op[1]) in tier
            if held:
                tier.fetch([_key_hash(op[1])])
            out.append(held)
        elif op[0] == "keys":
            out.append([names[h] for h in tier.hashes()])
        else:
            out.append(tier.bytes_used)
    return dict(zip(_op_labels(script), out, strict=True))


def _store_case(capacity: int, script: Sequence[Op], hint: str,
                hints: dict[str, str] | None = None) -> Case:
    shown = "; ".join(f"{op[0]}({', '.join(map(repr, op[1:]))})" for op in script)
    return Case(f"store = LruTier({capacity}); {shown}",
                lambda cls, s=tuple(script), c=capacity: _replay_store(cls, c, s),
                _expected_store(capacity, script), hint, strict_equal, hints or {})


MRU = "a store that drops the newest is MRU, not LRU"
LRU_BYTES_FREED = "drop only as many entries as the bytes need: each drop frees its bytes"
LRU_GET = "get() on a hit makes the entry the most recently used"
LRU_EXACT = ("exactly capacity bytes fit: drop entries only while MORE than the capacity is "
             "used (used() > capacity, not >=)")
LRU_IN_BYTES = "the cap is in bytes, whatever the entries weigh: a cap counted in entries is wrong"
LRU_OVERSIZE = ("an entry larger than the whole capacity is not stored (put returns []) and "
                "nothing is dropped for it; get() of a missing key is False")
LRU_REFRESH = ("putting a key already held refreshes it (most recent, its bytes counted once), "
               "so the entry stored after it is the one dropped")
LRU_EMPTY = "a store of capacity 0 holds nothing"
LRU_WHILE = ("one put may have to drop several entries: keep dropping the least recently used "
             "WHILE the bytes exceed the capacity (a loop, not one if)")
LRU_WHOLE_CAPACITY = ("an entry of exactly the capacity fits (only one LARGER than the capacity "
                      "is refused): store it, dropping every other entry")
LRU_SIZE_KEPT = ("a key already held keeps the size it was stored with: putting it again only "
                 "makes it the most recently used, whatever nbytes says, and drops nothing")


def _lru_cases() -> list[Case]:
    return [
        _store_case(100, [("put", "a", 40), ("put", "b", 40), ("keys",), ("used",),
                          ("put", "c", 40), ("keys",), ("used",)],
                    f"{LRU_BYTES_FREED} (here one, 'a', is enough)",
                    {"put('c', 40)[0]": "the least recently used entry goes first: 'a', "
                                        f"stored before 'b'; {MRU}"}),
        _store_case(100, [("put", "a", 30), ("put", "b", 30), ("put", "c", 30),
                          ("get", "a"), ("put", "d", 30), ("keys",)],
                    f"{LRU_GET}, so 'b', not 'a', is dropped; {MRU}"),
        _store_case(100, [("put", "a", 50), ("put", "b", 50), ("keys",), ("used",),
                          ("put", "c", 1), ("keys",)], LRU_EXACT),
        _store_case(100, [("put", "big", 60), ("put", "s1", 10), ("put", "s2", 10),
                          ("put", "s3", 10), ("put", "s4", 10), ("put", "s5", 10),
                          ("keys",), ("used",)],
                    "the cap is in bytes: 100 bytes hold 'big' (60) and four entries of 10, "
                    "so the fifth drops 'big'; a cap counted in entries is wrong"),
        _store_case(50, [("put", "a", 20), ("put", "huge", 80), ("keys",), ("used",),
                         ("get", "huge"), ("get", "zzz")], LRU_OVERSIZE),
        _store_case(60, [("put", "a", 20), ("put", "b", 20), ("put", "a", 20),
                         ("put", "c", 30), ("keys",), ("used",)],
                    "putting a key already held refreshes it (most recent, its bytes "
                    "counted once), so 'b' is the one dropped"),
        _store_case(0, [("put", "a", 1), ("keys",), ("used",)], LRU_EMPTY),
        _store_case(100, [("put", "a", 30), ("put", "b", 30), ("put", "c", 30),
                          ("put", "d", 80), ("keys",), ("used",)],
                    "'d' needs 80 of the 100 bytes: 'a', 'b' and 'c' all go, in that order; "
                    f"{LRU_WHILE}"),
        _store_case(100, [("put", "a", 30), ("put", "whole", 100), ("keys",), ("used",),
                          ("get", "whole")], LRU_WHOLE_CAPACITY),
        _store_case(60, [("put", "a", 20), ("put", "b", 20), ("put", "a", 50), ("keys",),
                         ("used",), ("put", "c", 20), ("keys",), ("used",)],
                    f"{LRU_SIZE_KEPT}: 'a' still weighs 20, so 'c' fits beside 'b' and 'a'"),
    ]


def _drawn_keys(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct keys such as ``'k17'``."""
    return [f"k{n}" for n in rng.sample(range(100), count)]


def _lru_order(rng: random.Random) -> Case:
    """Three entries, a get of the oldest, then one that needs exactly one drop: the second."""
    capacity = rng.randrange(60, 200)
    a, b, c, d, e = _drawn_keys(rng, 5)
    sizes = [rng.randint(capacity // 5, capacity // 3) for _ in range(3)]
    last = rng.randint(capacity - sum(sizes) + 1, capacity - sizes[0] - sizes[2])
    script = [("put", a, sizes[0]), ("put", b, sizes[1]), ("put", c, sizes[2]), ("get", a),
              ("put", d, last), ("keys",), ("used",), ("get", b), ("get", e)]
    return _store_case(capacity, script, f"{LRU_GET}, so the second entry stored is the one "
                                         f"dropped; {MRU}; {LRU_BYTES_FREED}")


def _lru_exact(rng: random.Random) -> Case:
    """Entries that fill the capacity exactly, then one more byte or a few."""
    capacity = rng.randrange(20, 150)
    cuts = sorted(rng.sample(range(1, capacity), rng.randint(1, 3)))
    sizes = [hi - lo for lo, hi in zip([0, *cuts], [*cuts, capacity], strict=True)]
    keys = _drawn_keys(rng, len(sizes) + 1)
    script: list[Op] = [("put", k, n) for k, n in zip(keys, sizes, strict=False)]
    script += [("keys",), ("used",), ("put", keys[-1], rng.randint(1, min(sizes))), ("keys",)]
    return _store_case(capacity, script, LRU_EXACT)


def _lru_in_bytes(rng: random.Random) -> Case:
    """A big entry, then small ones until the bytes, not the count, push it out."""
    capacity = rng.randrange(50, 200)
    big = rng.randint(capacity // 2 + 1, capacity * 3 // 4)
    small = rng.randint(max(1, (capacity - big) // 5), max(1, (capacity - big) // 3))
    keys = _drawn_keys(rng, (capacity - big) // small + 2)
    script: list[Op] = [("put", keys[0], big), *(("put", k, small) for k in keys[1:])]
    return _store_case(capacity, [*script, ("keys",), ("used",)], LRU_IN_BYTES)


def _lru_oversize(rng: random.Random) -> Case:
    """An entry larger than the whole capacity, next to one that fits."""
    capacity = rng.randrange(10, 150)
    small, huge, missing = _drawn_keys(rng, 3)
    script = [("put", small, rng.randint(1, capacity)),
              ("put", huge, capacity + rng.randint(1, 100)), ("keys",), ("used",),
              ("get", huge), ("get", missing)]
    return _store_case(capacity, script, LRU_OVERSIZE)


def _lru_refresh(rng: random.Random) -> Case:
    """Two entries, the first put again, then one that needs exactly one drop: the second."""
    capacity = rng.randrange(30, 150)
    a, b, c = _drawn_keys(rng, 3)
    size_a = rng.randint(1, capacity // 3)
    size_b = rng.randint(1, capacity - size_a)
    script = [("put", a, size_a), ("put", b, size_b), ("put", a, size_a),
              ("put", c, rng.randint(capacity - size_a - size_b + 1, capacity - size_a)),
              ("keys",), ("used",)]
    return _store_case(capacity, script, LRU_REFRESH)


def _lru_empty(rng: random.Random) -> Case:
    (key,) = _drawn_keys(rng, 1)
    return _store_case(0, [("put", key, rng.randint(1, 100)), ("keys",), ("used",),
                           ("get", key)], LRU_EMPTY)


def _lru_several(rng: random.Random) -> Case:
    """Small entries, then one that needs two or more of them dropped."""
    capacity = rng.randrange(40, 200)
    count = rng.randint(3, 6)
    small = rng.randint(1, capacity // count)
    keys = _drawn_keys(rng, count + 1)
    drops = rng.randint(2, count)  # a put that leaves room only after this many drops
    room = capacity - (count - drops) * small
    big = rng.randint(room - small + 1, room)
    script: list[Op] = [*(("put", k, small) for k in keys[:count]), ("put", keys[-1], big),
                        ("keys",), ("used",)]
    return _store_case(capacity, script, LRU_WHILE)


def _lru_whole_capacity(rng: random.Random) -> Case:
    """Entries, then one of exactly the capacity."""
    capacity = rng.randrange(10, 150)
    keys = _drawn_keys(rng, 3)
    script: list[Op] = [("put", keys[0], rng.randint(1, capacity // 2)),
                        ("put", keys[1], rng.randint(1, capacity // 2)),
                        ("put", keys[2], capacity), ("keys",), ("used",), ("get", keys[2])]
    return _store_case(capacity, script, LRU_WHOLE_CAPACITY)


def _lru_size_kept(rng: random.Random) -> Case:
    """A key put again with another size: a larger one that would push the other entry out,
    or a smaller one that would lower the bytes used."""
    capacity = rng.randrange(30, 150)
    a, b = _drawn_keys(rng, 2)
    size_a, size_b = rng.randint(1, capacity // 3), rng.randint(1, capacity // 3)
    larger = size_a == 1 or rng.random() < 0.5
    other = (rng.randint(capacity - size_b + 1, capacity) if larger
             else rng.randint(1, size_a - 1))
    script: list[Op] = [("put", a, size_a), ("put", b, size_b), ("put", a, other),
                        ("keys",), ("used",)]
    return _store_case(capacity, script, LRU_SIZE_KEPT)


def _lru_script(rng: random.Random) -> Case:
    """A drawn script of puts, gets and reads on a few keys."""
    capacity = rng.randrange(20, 120)
    script: list[Op] = []
    for _ in range(rng.randrange(8, 20)):
        key = rng.choice("abcdefg")
        kind = rng.choice(["put", "put", "get", "keys", "used"])
        script.append(("put", key, rng.randrange(1, 50)) if kind == "put"
                      else ("get", key) if kind == "get" else (kind,))
    return _store_case(capacity, [*script, ("keys",)], "a drawn script: LRU order, byte cap, "
                                                       "oversize entries not stored")


def _fresh_lru(seed: int) -> list[Case]:
    """One drawn case of each kind the fixed cases hold, and a drawn script."""
    rng = random.Random(seed)
    return [draw(rng) for draw in (_lru_order, _lru_exact, _lru_in_bytes, _lru_oversize,
                                   _lru_refresh, _lru_empty, _lru_several,
                                   _lru_whole_capacity, _lru_size_kept, _lru_script)]


# --- 09.hash_ring: consistent hashing ----------------------------------------------------

KEYS = tuple(f"session {k}" for k in range(120))


def _replay_ring(cls: Any, vnodes: int, first: int, joining: int, keys: Sequence[str]
                 ) -> dict[str, list[int]]:
    ring = cls(vnodes)
    for replica in range(first):
        ring.add(replica)
    before = [ring.lookup(k) for k in keys]
    ring.add(joining)
    return {"before": before, "after": [ring.lookup(k) for k in keys]}


def _expected_ring(vnodes: int, first: int, joining: int, keys: Sequence[str],
                   lookup: Callable[[HashRing, str], int] = HashRing.lookup
                   ) -> dict[str, list[int]]:
    """The same replay on ``HashRing``, each key looked up by ``lookup`` (a slip's, for the
    hints)."""
    ring = HashRing(range(first), vnodes)
    before = [lookup(ring, k) for k in keys]
    ring.add(joining)
    return {"before": before, "after": [lookup(ring, k) for k in keys]}


RING_MODULO = ("consistent hashing, not hash % N: a key goes to the first point at or after its "
               "position, so adding a replica moves only the keys it takes over (hash % N "
               "moves almost all)")
RING_WRAP = ("a key past the last point wraps around the ring to the FIRST point, not the "
             "last")
RING_CLOCKWISE = ("the owner is the first point at or AFTER the key's position (clockwise), "
                  "not the last point before it")
RING_AT_POINT = ("a key whose position is a point's own position belongs to that point: the "
                 "first point AT or after the key (>=, bisect_left), not strictly after it")
RING_VNODES = ("each replica puts vnodes points on the ring, ring_position(f'replica {r} point "
               "{v}') for v in range(vnodes), not one")


def _slipped(at: Callable[[int, int], int]) -> Callable[[HashRing, str], int]:
    """A lookup that takes point ``at(i, n)`` where the right one takes point ``i % n``
    (``i``: the first point at or after the key, ``n`` points)."""
    def lookup(ring: HashRing, key: str) -> int:
        points = ring._points  # the library's sorted points and their owners
        return ring._owners[at(bisect.bisect_left(points, ring_position(key)), len(points))]

    return lookup


def _strictly_after(ring: HashRing, key: str) -> int:
    """The slip's lookup: the first point strictly after the key."""
    points = ring._points
    return ring._owners[bisect.bisect_right(points, ring_position(key)) % len(points)]


def _ring_mistakes(vnodes: int, first: int, joining: int, keys: Sequence[str]
                   ) -> list[tuple[dict[str, list[int]], str]]:
    """What each recognised slip gives for this replay, with its hint."""
    def modulo(ring: HashRing, key: str) -> int:
        return sorted(ring.replicas)[ring_position(key) % len(ring.replicas)]

    replay = (vnodes, first, joining, keys)
    return [(_expected_ring(*replay, _strictly_after), RING_AT_POINT),
            (_expected_ring(*replay, modulo), RING_MODULO),
            (_expected_ring(*replay, _slipped(lambda i, n: min(i, n - 1))), RING_WRAP),
            (_expected_ring(*replay, _slipped(lambda i, n: i - 1)), RING_CLOCKWISE),
            (_expected_ring(1, first, joining, keys), RING_VNODES)]


def _ring_case(vnodes: int, first: int, joining: int, keys: Sequence[str], hint: str) -> Case:
    call = (f"ring = Ring({vnodes}); add replicas 0..{first - 1}; look up "
            f"{len(keys)} keys ({keys[0]!r}, ...); add({joining}); look them up again")
    return Case(call, lambda cls, a=(vnodes, first, joining, tuple(keys)): _replay_ring(
        cls, *a), _expected_ring(vnodes, first, joining, keys), hint,
        recognising(_ring_mistakes(vnodes, first, joining, keys), strict_equal))


def _lookup_empty(cls: Any, vnodes: int, key: str) -> Any:
    return cls(vnodes).lookup(key)


def _add_twice(cls: Any, vnodes: int, replicas: Sequence[int]) -> None:
    ring = cls(vnodes)
    for replica in replicas:
        ring.add(replica)


RING_EMPTY = "an empty ring has no owner for any key: raise ValueError"
RING_TWICE = "a replica already on the ring: raise ValueError"


def _empty_case(vnodes: int, key: str) -> Case:
    return _case(f"Ring({vnodes}).lookup({key!r}) on an empty ring",
                 lambda cls, v=vnodes, k=key: _lookup_empty(cls, v, k), Raises(ValueError),
                 RING_EMPTY)


def _twice_case(vnodes: int, replicas: Sequence[int]) -> Case:
    """Add ``replicas`` in turn, the last one already among them."""
    return _case("; ".join(f"ring.add({r})" for r in replicas),
                 lambda cls, v=vnodes, r=tuple(replicas): _add_twice(cls, v, r),
                 Raises(ValueError), RING_TWICE)


def _ring_cases() -> list[Case]:
    return [
        _ring_case(1, 1, 1, KEYS[:10], "one point per replica: a key goes to the first "
                   "point at or after its position, wrapping past the end to the first"),
        _ring_case(16, 3, 3, KEYS, "with virtual points; after add(3) only keys that now "
                   "belong to replica 3 may move (hash % N moves almost all)"),
        _ring_case(64, 7, 7, KEYS, "replica 7 joins 7 others: about 1/8 of the keys move, "
                   "all of them to replica 7"),
        _ring_case(8, 2, 9, KEYS[:40], "replica ids need not be consecutive"),
        _ring_case(2, 3, 3, _on_points(2, 4, KEYS[:6]),
                   "keys named as points ('replica 1 point 0', ...) sit exactly on those "
                   f"points: {RING_AT_POINT}"),
        _empty_case(4, "session 1"),
        _twice_case(4, [0, 0]),
    ]


def _on_points(vnodes: int, replicas: int, keys: Sequence[str]) -> list[str]:
    """``keys`` and the name of every point of replicas ``0 .. replicas - 1``, whose ring
    position is that point's own."""
    return [*(f"replica {r} point {v}" for r in range(replicas) for v in range(vnodes)), *keys]


def _drawn_ring(rng: random.Random, vnodes: int, first: int, joining: int, hint: str) -> Case:
    """A replay on drawn keys: a dozen, then more until the recognised slips change what it
    gives: with one point per replica the slips of the lookup (hash % N, no wrap, the point
    before), with more the slips of the ring (hash % N, one point per replica)."""
    keys = [f"user {rng.randrange(10**9)}" for _ in range(12)]
    slips = (1, 2, 3) if vnodes == 1 else (1, 4)  # after 0, the key on a point
    while any(_ring_mistakes(vnodes, first, joining, keys)[slip][0]
              == _expected_ring(vnodes, first, joining, keys) for slip in slips):
        keys.append(f"user {rng.randrange(10**9)}")
    return _ring_case(vnodes, first, joining, keys, hint)


def _fresh_ring(seed: int) -> list[Case]:
    """One point per replica (keys past the last point wrap), virtual points with the next
    replica joining, a replica id further on, and both errors, all drawn."""
    rng = random.Random(seed)
    first, many, gap = rng.randint(2, 4), rng.randint(3, 7), rng.randint(2, 5)
    replicas = rng.sample(range(50), rng.randint(1, 4))
    return [
        _drawn_ring(rng, 1, first, first + rng.randint(0, 3), "one point per replica: a key "
                    "goes to the first point at or after its position, wrapping past the end "
                    "to the first"),
        _drawn_ring(rng, rng.randrange(8, 40), many, many, "with virtual points; after the "
                    "join only keys that now belong to the new replica may move (hash % N "
                    "moves almost all)"),
        _drawn_ring(rng, rng.randrange(4, 40), gap, gap + rng.randint(2, 20), "replica ids "
                    "need not be consecutive"),
        _drawn_on_points(rng),
        _empty_case(rng.randrange(1, 40), f"user {rng.randrange(10**9)}"),
        _twice_case(rng.randrange(1, 40), [*replicas, rng.choice(replicas)]),
    ]


def _drawn_on_points(rng: random.Random) -> Case:
    """Drawn keys and point names (a key on a point): the first point at or after a key on
    a point is that point; the first strictly after it is the next one."""
    vnodes, first = rng.randint(1, 6), rng.randint(2, 5)
    joining = first + rng.randint(0, 5)
    names = [f"replica {r} point {v}" for r in [*range(first), joining] for v in range(vnodes)]
    keys = [f"user {rng.randrange(10**9)}" for _ in range(4)]
    keys += rng.sample(names, rng.randint(2, min(6, len(names))))
    rng.shuffle(keys)
    while (_ring_mistakes(vnodes, first, joining, keys)[0][0]
           == _expected_ring(vnodes, first, joining, keys)):
        keys.append(rng.choice(names))
    return _ring_case(vnodes, first, joining, keys, f"keys on points: {RING_AT_POINT}")


# --- 09.prefix_scorer: hits against load ---------------------------------------------------


def _chain(n: int) -> list[str]:
    return [f"h{k}" for k in range(n)]


def _expected_choice(chain: Sequence[str], held: Sequence[Sequence[str]], loads: Sequence[int],
                     block_size: int, penalty: float) -> int:
    index = PrefixIndex(len(held), block_size)
    for replica, hashes in enumerate(held):
        index.admitted(replica, [_key_hash(h) for h in hashes])
    hits = index.hit_tokens([_key_hash(h) for h in chain])
    return prefix_aware_choice(hits, list(loads), penalty)


def _scorer_case(chain: Sequence[str], held: Sequence[Sequence[str]], loads: Sequence[int],
                 block_size: int, penalty: float, hint: str) -> Case:
    args = (list(chain), [set(h) for h in held], list(loads), block_size, penalty)
    call = (f"choose_replica({list(chain)}, {[sorted(h) for h in held]}, {list(loads)}, "
            f"{block_size}, {penalty})")
    return _case(call, lambda fn, a=args: fn([*a[0]], [set(h) for h in a[1]], [*a[2]],
                                             a[3], a[4]),
                 _expected_choice(chain, held, loads, block_size, penalty), hint)


SCORER_LOAD = ("the score is hit tokens less load_penalty x load: a replica that saves more "
               "tokens than its load costs wins; a scorer that ignores load picks the one with "
               "the most hits")
SCORER_ONLY_LEADING = ("only the leading blocks count: a replica that lacks the first block "
                       "would find nothing cached, whatever else it holds")
SCORER_TIE = "equal scores: the less loaded wins, then the lower index"
SCORER_TOKENS = "hits are in tokens: blocks x block_size, then less the load penalty"
SCORER_WHOLE_CHAIN = ("a replica that holds the whole chain serves every block of it: count "
                      "the leading blocks held up to len(chain), not len(chain) - 1")


def _scorer_cases() -> list[Case]:
    c = _chain(6)
    return [
        _scorer_case(c, [c[:2], c[:5], []], [0, 0, 0], 16, 1.0,
                     "replica 1 holds the longest leading run of the prompt's blocks"),
        _scorer_case(c, [c[:2], c[:5], []], [0, 9, 1], 16, 8.0,
                     "replica 1 would save 80 tokens but its 9 requests cost 72 at 8 per "
                     "request: 80 - 72 = 8 < 32 - 0 for replica 0; a scorer that ignores "
                     "load picks 1"),
        _scorer_case(c, [c[:2], c[:5], []], [4, 9, 0], 16, 1000.0,
                     "a large penalty makes the choice least loaded"),
        _scorer_case(c, [c[1:], c[:1], []], [0, 0, 0], 16, 1.0,
                     "only the leading blocks count: replica 0 holds five blocks but not "
                     "the first, so it would find nothing cached"),
        _scorer_case(c, [c[:3], c[:3], c[:3]], [2, 1, 1], 16, 0.0, SCORER_TIE),
        _scorer_case(c, [c[:4], c[:2]], [3, 0], 4, 2.0,
                     "hits are in tokens: 4 blocks of 4 is 16 tokens, less 6 for the load, "
                     "is 10 > 8"),
        _scorer_case(c, [c[:5], c], [0, 1], 16, 8.0,
                     f"{SCORER_WHOLE_CHAIN}: replica 1 holds all 6 blocks, 96 - 8 = 88 > 80"),
    ]


def _placed(rng: random.Random, held: list[list[str]], loads: list[int]
            ) -> tuple[list[list[str]], list[int]]:
    """The replicas in a drawn order."""
    order = rng.sample(range(len(held)), len(held))
    return [held[r] for r in order], [loads[r] for r in order]


def _scorer_load(rng: random.Random) -> Case:
    """The replica with the most hits is loaded past what they save."""
    chain, size = _chain(rng.randint(3, 8)), rng.choice([4, 16, 32])
    fewer, light = rng.randint(0, len(chain) - 2), rng.randint(0, 2)
    heavy = light + rng.randint(1, 5)
    penalty = (len(chain) - fewer) * size / (heavy - light) + rng.choice([1.0, 2.5, 8.0])
    held, loads = _placed(rng, [chain, chain[:fewer]], [heavy, light])
    return _scorer_case(chain, held, loads, size, penalty, SCORER_LOAD)


def _scorer_leading(rng: random.Random) -> Case:
    """One replica holds every block but the first, another a short leading run."""
    chain = _chain(rng.randint(4, 9))
    held, loads = _placed(rng, [chain[1:], chain[:rng.randint(1, len(chain) - 2)], []],
                          [rng.randint(0, 3)] * 3)
    return _scorer_case(chain, held, loads, rng.choice([4, 16, 32]),
                        rng.choice([0.0, 1.0, 4.0]), SCORER_ONLY_LEADING)


def _scorer_tie(rng: random.Random) -> Case:
    """Equal hits and no penalty: the two least loaded (never replica 0) tie on load too."""
    chain, replicas = _chain(rng.randint(2, 8)), rng.randint(3, 5)
    loads = [rng.randint(2, 10) for _ in range(replicas)]
    for replica in rng.sample(range(1, replicas), 2):
        loads[replica] = 1
    prefix = chain[:rng.randint(0, len(chain))]
    return _scorer_case(chain, [prefix] * replicas, loads, rng.choice([4, 16, 32]), 0.0,
                        SCORER_TIE)


def _scorer_tokens(rng: random.Random) -> Case:
    """More blocks against less load, with a penalty between a block's worth and a block's
    tokens: counted in tokens the blocks win, counted in blocks the load."""
    size, chain = rng.choice([4, 16, 32]), _chain(rng.randint(3, 9))
    fewer = rng.randint(0, len(chain) - 1)
    more = rng.randint(fewer + 1, len(chain))
    light = rng.randint(0, 3)
    heavy = light + rng.randint(1, 4)
    penalty = (more - fewer) * (size + 1) / (2 * (heavy - light))
    held, loads = _placed(rng, [chain[:more], chain[:fewer], []],
                          [heavy, light, heavy + rng.randint(0, 3)])
    return _scorer_case(chain, held, loads, size, penalty, SCORER_TOKENS)


def _scorer_whole_chain(rng: random.Random) -> Case:
    """One replica holds the whole chain, another all of it but the last block and one
    request less: a penalty below a block's tokens makes the whole chain win."""
    chain, size = _chain(rng.randint(1, 9)), rng.choice([4, 16, 32])
    light = rng.randint(0, 4)
    held, loads = _placed(rng, [chain, chain[:-1]], [light + 1, light])
    return _scorer_case(chain, held, loads, size, rng.choice([0.5, 1.0, size / 2, size - 1.0]),
                        SCORER_WHOLE_CHAIN)


def _scorer_drawn(rng: random.Random) -> Case:
    """Drawn replicas: leading runs, stray blocks, loads and a penalty."""
    chain = _chain(rng.randrange(1, 10))
    replicas = rng.randrange(2, 6)
    held = [chain[: rng.randrange(0, len(chain) + 1)]
            + [f"x{rng.randrange(5)}" for _ in range(rng.randrange(3))]
            for _ in range(replicas)]
    loads = [rng.randrange(0, 12) for _ in range(replicas)]
    return _scorer_case(chain, held, loads, rng.choice([4, 16, 32]),
                        rng.choice([0.0, 1.0, 8.0, 64.0, 1000.0]), "drawn replicas")


def _fresh_scorer(seed: int) -> list[Case]:
    """One drawn case of each kind the fixed cases hold, and two of drawn replicas."""
    rng = random.Random(seed)
    return [draw(rng) for draw in (_scorer_load, _scorer_leading, _scorer_tie, _scorer_tokens,
                                   _scorer_whole_chain, _scorer_drawn, _scorer_drawn)]


# --- 09.choose_tier: reading the metrics --------------------------------------------------


def _hit_rate(row: dict[str, int]) -> float:
    """The library's hit rate of one row of counters (GPU and tier)."""
    return TierStats(row["prefix_cache_queries"], row["prefix_cache_hits"],
                     row["prefix_cache_queries"] - row["prefix_cache_hits"],
                     row["external_prefix_cache_hits"], 0, 0, 0).hit_rate


def _expected_tier(study: dict[float, dict[str, int]], share: float,
                   rate: Callable[[dict[str, int]], float] = _hit_rate,
                   smallest: Callable[[Sequence[float]], float] = min,
                   strictly: bool = False) -> float | None:
    """The smallest multiple whose gain over no tier reaches ``share`` of the best gain;
    ``rate``, ``smallest`` and ``strictly`` (a gain must pass the share, not reach it) are a
    slip's, for the hints (None where the slip finds no multiple)."""
    base = rate(study[0.0])
    gains = {m: rate(row) - base for m, row in study.items()}
    best = max(gains.values())
    if best <= 0:
        return 0.0
    found = [m for m, g in gains.items() if (g > share * best if strictly else
                                             g >= share * best)]
    return smallest(found) if found else None


TIER_HITS = ("tier hits are hits too: a run's hit rate is (GPU hits + tier hits) / queries of "
             "its own row")
TIER_PER_QUERY = ("compare hit RATES, (GPU hits + tier hits) / queries of each row: the runs "
                  "answered different numbers of queries (preempted requests look up again), "
                  "so hit counts are not comparable")
TIER_GAIN = ("share is a share of the best GAIN over the run without a tier (rate - rate at "
             "0), not of the best hit rate")
TIER_ORDER = ("the rows need not come in order: choose the smallest multiple that reaches the "
              "share, not the first row that does")
TIER_AT_SHARE = ("a gain of exactly share x the best gain reaches the share: >=, not >")
TIER_DENOMINATOR = ("a run's hit (or miss) rate is over ALL its looked-up tokens, "
                    "prefix_cache_queries, not over the tokens the GPU missed (those the tier "
                    "was asked): the GPU's hits differ between runs, so that rate compares "
                    "different things")
TIER_A_FLOAT = ("return a float, as the study's multiples are: 0.0 where no tier gains "
                "anything, not 0")
TIER_SMALLEST = ("choose the SMALLEST tier whose gain reaches share x the best gain: a larger "
                 "one buys little more")


def _tier_mistakes(study: dict[float, dict[str, int]], share: float
                   ) -> list[tuple[float, str]]:
    """What each recognised slip gives for this study, with its hint."""
    def hits(row: dict[str, int]) -> float:
        return row["prefix_cache_hits"] + row["external_prefix_cache_hits"]

    rates = {m: _hit_rate(row) for m, row in study.items()}
    return [
        (_expected_tier({m: row | {"external_prefix_cache_hits": 0} for m, row in study.items()},
                        share), TIER_HITS),
        (_expected_tier(study, share, hits), TIER_PER_QUERY),
        (min(m for m, r in rates.items() if r >= share * max(rates.values())), TIER_GAIN),
        (_expected_tier(study, share, smallest=lambda found: found[0]), TIER_ORDER),
        (_expected_tier(study, share, strictly=True), TIER_AT_SHARE),
        (_expected_tier(study, share, _asked_rate), TIER_DENOMINATOR),
        (max(study), TIER_SMALLEST),
    ]


def _asked_rate(row: dict[str, int]) -> float:
    """The slip's rate: the tier's hits over what it was asked (the GPU's misses), one
    minus the miss rate over that denominator."""
    asked = row["prefix_cache_queries"] - row["prefix_cache_hits"]
    return row["external_prefix_cache_hits"] / asked if asked else 0.0


def _row(queries: int, gpu: int, tier: int) -> dict[str, int]:
    return {"prefix_cache_queries": queries, "prefix_cache_hits": gpu,
            "external_prefix_cache_hits": tier}


def _tier_case(study: dict[float, dict[str, int]], share: float, hint: str) -> Case:
    call = f"choose_tier({study}, share={share})"
    return Case(call, lambda fn, s=study, f=share: fn({m: dict(r) for m, r in s.items()}, f),
                _expected_tier(study, share), hint,
                naming_type(recognising([(value, slip) for value, slip in
                                         _tier_mistakes(study, share) if value is not None]),
                            TIER_A_FLOAT))


STUDY = {0.0: _row(1000, 600, 0), 1.0: _row(1000, 600, 80), 4.0: _row(1000, 600, 95),
         16.0: _row(1000, 600, 100)}


def _tier_cases() -> list[Case]:
    return [
        _tier_case(STUDY, 0.9, "gains over no tier: 0.08, 0.095, 0.10; 90% of the best "
                   "(0.09) is first reached at 4x"),
        _tier_case(STUDY, 0.5, "half of the best gain is already reached at 1x"),
        _tier_case({0.0: _row(1024, 512, 0), 1.0: _row(1024, 512, 64),
                    4.0: _row(1024, 512, 128), 16.0: _row(1024, 512, 128)}, 0.5,
                   f"1x gains 64/1024, exactly half of the best, 128/1024: {TIER_AT_SHARE}"),
        _tier_case(STUDY, 1.0, "all of the gain needs the largest tier here"),
        _tier_case({0.0: _row(500, 300, 0), 2.0: _row(520, 300, 0)}, 0.9,
                   f"no tier gains anything: {TIER_A_FLOAT}"),
        _tier_case({0.0: _row(800, 400, 0), 1.0: _row(900, 420, 60),
                    8.0: _row(1000, 430, 140)}, 0.8,
                   "a hit rate is (GPU hits + tier hits) / queries of its own row: the "
                   "queries differ between runs (preempted requests look up again)"),
        _tier_case({0.0: _row(1000, 500, 0), 2.0: _row(2000, 1000, 200),
                    8.0: _row(1000, 500, 150)}, 0.9,
                   "the 2x run answered twice the queries, so it counts twice the hits: its "
                   "rate, 0.6, is below the 8x run's 0.65"),
        _tier_case({16.0: _row(1000, 600, 100), 0.0: _row(1000, 600, 0),
                    4.0: _row(1000, 600, 95)}, 0.9, "the rows need not come in order"),
        _tier_case({0.0: _row(1024, 512, 0), 1.0: _row(1024, 512, 192),
                    4.0: _row(1024, 256, 480), 16.0: _row(1024, 256, 496)}, 0.75,
                   "the 4x and 16x runs found fewer tokens in the GPU cache: gains 0.1875, "
                   f"0.21875, 0.234375 of all queries; {TIER_DENOMINATOR}"),
    ]


MULTIPLES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
"""The tier sizes a drawn study may hold, as multiples of the GPU cache."""


def _rated(queries: int, gpu_rate: float, tier_rate: float) -> dict[str, int]:
    """A run's counters for these hit rates."""
    return _row(queries, round(gpu_rate * queries), round(tier_rate * queries))


def _tier_gain(rng: random.Random) -> Case:
    """The same GPU hits and queries in every run, tier hits growing with the tier, and a
    base rate so high that any share of the best RATE is reached without a tier."""
    queries, base = rng.randrange(1000, 5000), rng.uniform(0.5, 0.7)
    multiples = sorted(rng.sample(MULTIPLES, rng.randint(2, 4)))
    gains = sorted(rng.uniform(0.01, 0.1) for _ in multiples)
    study = {0.0: _rated(queries, base, 0.0)} | {
        m: _rated(queries, base, g) for m, g in zip(multiples, gains, strict=True)}
    return _tier_case(study, rng.choice([0.5, 0.8]), f"{TIER_HITS}; {TIER_GAIN}")


def _tier_order(rng: random.Random) -> Case:
    """Gains that all reach half the best, the rows from the largest tier down."""
    multiples = sorted(rng.sample(MULTIPLES, rng.randint(2, 4)), reverse=True)
    best, base = rng.uniform(0.05, 0.15), rng.uniform(0.3, 0.7)
    gains = [best, *sorted((rng.uniform(0.6, 1.0) * best for _ in multiples[1:]),
                           reverse=True)]
    study = {m: _rated(rng.randrange(1000, 5000), base, g)
             for m, g in zip(multiples, gains, strict=True)}
    return _tier_case(study | {0.0: _rated(rng.randrange(1000, 5000), base, 0.0)}, 0.5,
                      TIER_ORDER)


def _tier_rates(rng: random.Random) -> Case:
    """A smaller tier whose run answered two or three times the queries: more hits, a
    smaller gain in rate."""
    queries, base = rng.randrange(800, 3000), rng.uniform(0.5, 0.7)
    small, large = sorted(rng.sample(MULTIPLES, 2))
    top = rng.uniform(0.08, 0.15)
    study = {0.0: _rated(queries, base, 0.0),
             small: _rated(queries * rng.choice([2, 3]), base, rng.uniform(0.2, 0.5) * top),
             large: _rated(queries, base, top)}
    return _tier_case(study, 0.9, TIER_PER_QUERY)


def _tier_none(rng: random.Random) -> Case:
    """No run beats the one without a tier."""
    queries = rng.randrange(500, 5000)
    study = {0.0: _row(queries, rng.randrange(queries // 4, queries), 0)}
    base = study[0.0]["prefix_cache_hits"] / queries
    for multiple in rng.sample(MULTIPLES, rng.randint(1, 3)):
        other = rng.randrange(500, 5000)
        study[multiple] = _row(other, int(base * other * rng.uniform(0.8, 1.0)), 0)
    return _tier_case(study, rng.choice([0.5, 0.8, 0.9]),
                      f"no tier gains anything: {TIER_A_FLOAT}")


def _tier_at_share(rng: random.Random) -> Case:
    """A gain of exactly share x the best gain (counts over a power of two, so every rate is
    exact), a larger gain below the best, and the best."""
    queries = 2 ** rng.randint(10, 13)
    base = rng.randint(queries // 4, queries // 2)
    best = 4 * rng.randint(4, (queries - base) // 4)
    share = rng.choice([0.25, 0.5, 0.75])
    at = int(share * best)
    tiers = [at, rng.randint(at + 1, best - 1), best]
    multiples = sorted(rng.sample(MULTIPLES, 3))
    study = {0.0: _row(queries, base, 0)} | {
        m: _row(queries, base, t) for m, t in zip(multiples, tiers, strict=True)}
    return _tier_case(study, share, TIER_AT_SHARE)


def _tier_denominator(rng: random.Random) -> Case:
    """Runs whose GPU hits differ, drawn until the rate over all queries and the rate over
    the GPU's misses choose different tiers (counts over a power of two: exact rates)."""
    while True:
        queries = 2 ** rng.randint(10, 12)
        base = rng.randint(queries // 3, queries // 2)
        study = {0.0: _row(queries, base, 0)}
        for multiple in sorted(rng.sample(MULTIPLES, 3)):
            gpu = rng.randint(base // 2, base)
            study[multiple] = _row(queries, gpu, rng.randint(0, queries - gpu - 1))
        share = rng.choice([0.25, 0.5, 0.75])
        right = _expected_tier(study, share)
        if right not in (0.0, _expected_tier(study, share, _asked_rate)):
            return _tier_case(study, share, TIER_DENOMINATOR)


def _tier_drawn(rng: random.Random) -> Case:
    """A drawn study: any queries and hits, any share."""
    study = {0.0: _row(q := rng.randrange(500, 5000), rng.randrange(0, q), 0)}
    for multiple in rng.sample(MULTIPLES, rng.randrange(1, 5)):
        q = rng.randrange(500, 5000)
        gpu = rng.randrange(0, q)
        study[multiple] = _row(q, gpu, rng.randrange(0, q - gpu + 1))
    return _tier_case(study, rng.choice([0.5, 0.8, 0.9, 1.0]), "a drawn study")


def _fresh_tier(seed: int) -> list[Case]:
    """One drawn study of each kind the fixed cases hold, and one of any shape."""
    rng = random.Random(seed)
    return [draw(rng) for draw in (_tier_gain, _tier_order, _tier_rates, _tier_none,
                                   _tier_at_share, _tier_denominator, _tier_drawn)]


# --- registry ----------------------------------------------------------------------------

FRESH: dict[str, Callable[[int], Sequence[Case]]] = {
    "09.lru_tier": _fresh_lru, "09.hash_ring": _fresh_ring,
    "09.prefix_scorer": _fresh_scorer, "09.choose_tier": _fresh_tier,
}
"""Each exercise's seeded cases (the grader draws the seed per run)."""

def _exercise(name: str, title: str, cases: Callable[[], Sequence[Case]],
              reference: tuple[str, ...]) -> Exercise:
    """An exercise with its fresh cases."""
    return Exercise(name, title, cases, reference, fresh=FRESH[name])


EXERCISES = (
    _exercise("09.lru_tier", "The CPU tier: an LRU store with a byte cap", _lru_cases,
              ("course_lib.tier",)),
    _exercise("09.hash_ring", "A consistent-hashing ring", _ring_cases,
              ("course_lib.router.HashRing",)),
    _exercise("09.prefix_scorer", "The prefix-aware scorer and its load penalty",
              _scorer_cases, ("course_lib.router.PrefixIndex",
                              "course_lib.router.prefix_aware_choice")),
    _exercise("09.choose_tier", "Reading the metrics to choose a tier size", _tier_cases,
              ("course_lib.tier.TierStats",)),
)
