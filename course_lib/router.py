"""Routing requests across replicas: which server a request goes to decides whether its
prefix is cached there.

Four policies (:data:`ROUTE_POLICIES`):

- ``round-robin`` sends the k-th request to arrive (counting from 0) to replica k mod N:
  even load, and a conversation's turns scattered over every replica, so each replica
  caches every system prompt and few histories.
- ``least-loaded`` sends each request to the replica with the fewest requests (running or
  waiting), lowest index on a tie: the best load balance, blind to caches.
- ``session-affinity`` hashes the conversation onto a ring of replicas (:class:`HashRing`,
  consistent hashing): every turn lands where the previous one left its history, whatever
  the load, and a replica joining moves only about 1/N of the conversations.
- ``prefix-aware`` scores each replica by the prompt tokens it would find cached there,
  minus ``load_penalty`` tokens per request it already has, running or waiting
  (:func:`prefix_aware_choice`), from a router-side index of which block hashes each
  replica holds (:class:`PrefixIndex`, updated from admissions and evictions).

Real routers weigh the same two things, each its own way. llm-d's inference scheduler, built
on the endpoint picker of the Kubernetes Gateway API Inference Extension, filters the
candidate pods, then adds up weighted scorers, each scoring a pod from 0 to 1: the share of the
prompt's blocks the prefix-cache scorer believes the pod holds, and load scorers (queue
depth, KV-cache use); the highest total wins. SGLang's cache-aware router does not add
them: while load is balanced it sends a request to the worker whose approximate radix tree
matches the most of its prompt (when the match rate passes a threshold, else to the worker
with the smallest tree), and once load is uneven (the busiest worker past both an absolute
and a relative threshold over the idlest) it sends it to the shortest queue, caches
ignored. The course's score is of llm-d's kind, one cache term and one load term added up,
but counted in tokens rather than scaled to 0-1.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from typing import Literal

from course_lib.prefix_cache import BlockHash
from course_lib.validate import check_int, check_list, check_non_negative_number, describe

RoutePolicy = Literal["round-robin", "least-loaded", "session-affinity", "prefix-aware"]
ROUTE_POLICIES: tuple[RoutePolicy, ...] = (
    "round-robin", "least-loaded", "session-affinity", "prefix-aware")


def ring_position(key: str) -> int:
    """Where ``key`` sits on the ring: the first 8 bytes of its SHA-256 (stable across runs
    and machines, unlike Python's ``hash``)."""
    if not isinstance(key, str):
        raise ValueError(f"a ring key must be a str, got {describe(key)}")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class HashRing:
    """Consistent hashing: each replica owns ``vnodes`` points on a ring of 2**64 positions,
    and a key belongs to the first point at or after its own position (wrapping around).

    Adding a replica takes over only the keys just before its points, about 1/N of them;
    ``hash(key) % N`` would move almost every key.
    """

    def __init__(self, replicas: Iterable[int] = (), vnodes: int = 64) -> None:
        self.vnodes = check_int("vnodes", vnodes, 1, 4096)
        self._points: list[int] = []
        self._owners: list[int] = []
        self.replicas: list[int] = []
        for replica in check_list("replicas", replicas):
            self.add(replica)

    def add(self, replica: int) -> None:
        """Put ``replica``'s points on the ring."""
        check_int("replica", replica, 0)
        if replica in self.replicas:
            raise ValueError(f"replica {replica} is already on the ring")
        self.replicas.append(replica)
        for v in range(self.vnodes):
            point = ring_position(f"replica {replica} point {v}")
            at = bisect.bisect_left(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, replica)

    def lookup(self, key: str) -> int:
        """The replica that owns ``key``."""
        if not self._points:
            raise ValueError("the ring has no replica")
        at = bisect.bisect_left(self._points, ring_position(key))
        return self._owners[at % len(self._points)]


def prefix_aware_choice(hit_tokens: Sequence[int], loads: Sequence[int],
                        load_penalty: float) -> int:
    """The replica with the highest ``hit_tokens - load_penalty * load``; on a tie the less
    loaded, then the lower index. With a penalty of 0 the cache alone decides (and every
    turn of a popular system prompt piles onto one replica); a large penalty makes it
    least-loaded."""
    hits, loads = check_list("hit_tokens", hit_tokens), check_list("loads", loads)
    if not hits or len(hits) != len(loads):
        raise ValueError(f"need one hit count and one load per replica, got {len(hits)} "
                         f"and {len(loads)}")
    penalty = check_non_negative_number("load_penalty", load_penalty)
    return max(range(len(hits)), key=lambda r: (hits[r] - penalty * loads[r], -loads[r], -r))


class PrefixIndex:
    """The router's view of each replica's prefix cache: the block hashes it holds.

    ``admitted`` adds a request's prompt hashes when a replica admits it (it holds them
    then); ``evicted`` drops hashes the replica no longer holds. The view can lag (blocks a
    reply fills are learned only when the next turn is admitted) but never claims a block
    the replica lacks.
    """

    def __init__(self, replicas: int, block_size: int) -> None:
        check_int("replicas", replicas, 1)
        self.block_size = check_int("block_size", block_size, 1)
        self._held: list[set[BlockHash]] = [set() for _ in range(replicas)]

    def held(self, replica: int) -> frozenset[BlockHash]:
        """The hashes the index believes ``replica`` holds."""
        return frozenset(self._held[replica])

    def admitted(self, replica: int, hashes: Iterable[BlockHash]) -> None:
        """``replica`` admitted a request whose prompt blocks carry ``hashes``."""
        self._held[replica].update(hashes)

    def evicted(self, replica: int, hashes: Iterable[BlockHash]) -> None:
        """``replica`` no longer holds ``hashes``."""
        self._held[replica].difference_update(hashes)

    def hit_tokens(self, chain: Sequence[BlockHash]) -> list[int]:
        """For each replica, the tokens of the leading blocks of ``chain`` it holds."""
        hits = []
        for held in self._held:
            count = 0
            for block_hash in chain:
                if block_hash not in held:
                    break
                count += 1
            hits.append(count * self.block_size)
        return hits
