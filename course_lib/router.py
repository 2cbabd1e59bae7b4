"""Routing requests across replicas: which server a request goes to decides whether its
prefix is cached there.

A policy is a :class:`Router`: a class with its ``name``, its parameters (dataclass
fields, checked when it is built) and :meth:`Router.choose`, which picks a replica from what
the cluster tells it about an arriving request (:class:`Arrival`). Defining the class
registers it in :data:`ROUTERS`, where the cluster (``course_lib.cluster``), ``route
--router`` and chapter 09 find it by name; each router's docstring says what it does.
"""

from __future__ import annotations

import bisect
import hashlib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from course_lib.prefix_cache import BlockHash
from course_lib.validate import check_int, check_list, check_non_negative_number, describe
from course_lib.workload import Request


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
            count = next((i for i, h in enumerate(chain) if h not in held), len(chain))
            hits.append(count * self.block_size)
        return hits


@dataclass(frozen=True)
class Arrival:
    """What the cluster tells a router about one arriving request: the request, how many
    requests the run routed before it (``index``), its conversation (``session``: the id of
    the first turn it follows back to), each replica's load (requests running or waiting)
    and, for a router that ``uses_prefix_hits``, the prompt tokens each replica holds cached
    as the cluster's :class:`PrefixIndex` sees it (None for other routers)."""

    request: Request
    index: int
    session: int
    loads: tuple[int, ...]
    hit_tokens: tuple[int, ...] | None = None

    @property
    def replicas(self) -> int:
        """How many replicas there are to choose from."""
        return len(self.loads)


ROUTERS: dict[str, type[Router]] = {}
"""Every routing policy by name, in the order defined: a :class:`Router` subclass that sets
``name`` puts itself here."""


@dataclass
class Router:
    """A routing policy: a dataclass subclass sets ``name``, has its parameters as fields
    (checked in ``__post_init__``, a ValueError naming the value) and implements
    :meth:`choose`. Defining it registers it in :data:`ROUTERS`; the first paragraph of its
    docstring is its one-line description (``route --help`` lists it).

    The cluster builds a fresh router for each run (:func:`make_router`), calls :meth:`start`
    once, then :meth:`choose` for each request as it arrives.
    """

    name: ClassVar[str]
    uses_prefix_hits: ClassVar[bool] = False
    """Whether :meth:`choose` reads ``Arrival.hit_tokens``: only then does the cluster hash
    each prompt and keep its prefix index from every replica's admissions and evictions."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is None:  # a base for other routers, not one itself
            return
        if not isinstance(name, str) or not name:
            raise ValueError(f"a router's name must be a non-empty str, got {describe(name)}")
        known = ROUTERS.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (
                cls.__module__, cls.__qualname__):  # the same class again is a reload
            raise ValueError(f"router name {name!r} is taken by "
                             f"{known.__module__}.{known.__qualname__}")
        ROUTERS[name] = cls

    @classmethod
    def summary(cls) -> str:
        """The first paragraph of the class's docstring, on one line."""
        return " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())

    @classmethod
    def parameters(cls) -> tuple[str, ...]:
        """The names of the router's parameters (its dataclass fields set when built)."""
        return tuple(f.name for f in fields(cls) if f.init)

    def start(self, replicas: int) -> None:
        """Prepare a run over ``replicas`` replicas (state kept between choices goes here)."""

    def choose(self, arrival: Arrival) -> int:
        """The replica, from 0 to ``arrival.replicas - 1``, for the arriving request."""
        raise NotImplementedError(f"{type(self).__name__} does not define choose")


def make_router(name: str, settings: Mapping[str, Any] | None = None) -> Router:
    """A new router of policy ``name`` (one of :data:`ROUTERS`) with those ``settings`` that
    are its parameters; the others belong to other routers (a cluster's settings serve
    every policy), and a parameter they leave out keeps its default."""
    if not isinstance(name, str) or name not in ROUTERS:
        raise ValueError(f"unknown policy {describe(name)}; expected one of "
                         f"{', '.join(ROUTERS)}")
    policy, settings = ROUTERS[name], settings or {}
    return policy(**{p: settings[p] for p in policy.parameters() if p in settings})


@dataclass
class RoundRobin(Router):
    """Sends the k-th request to arrive (counting from 0) to replica k mod N.

    Even load, and a conversation's turns scattered over every replica, so each replica
    caches every system prompt and few histories.
    """

    name = "round-robin"

    def choose(self, arrival: Arrival) -> int:
        return arrival.index % arrival.replicas


@dataclass
class LeastLoaded(Router):
    """Sends each request to the replica with the fewest requests, running or waiting.

    The lowest index wins a tie. The best load balance, blind to caches.
    """

    name = "least-loaded"

    def choose(self, arrival: Arrival) -> int:
        return arrival.loads.index(min(arrival.loads))


@dataclass
class SessionAffinity(Router):
    """Sends every turn of a conversation to the replica that owns it on a hash ring.

    The ring is consistent hashing (:class:`HashRing`, ``vnodes`` points per replica):
    every turn lands where the previous one left its history, whatever the load, and a
    replica joining moves only about 1/N of the conversations.
    """

    name = "session-affinity"
    vnodes: int = 64
    _ring: HashRing = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("vnodes", self.vnodes, 1, 4096)

    def start(self, replicas: int) -> None:
        self._ring = HashRing(range(replicas), self.vnodes)

    def choose(self, arrival: Arrival) -> int:
        return self._ring.lookup(f"session {arrival.session}")


@dataclass
class PrefixAware(Router):
    """Sends each request to the replica with the most prompt tokens cached, less a load
    penalty per request it already has.

    The score is cached tokens minus ``load_penalty`` tokens per request running or waiting
    there (:func:`prefix_aware_choice`); the cached tokens come from the cluster's
    router-side index of which block hashes each replica holds (:class:`PrefixIndex`,
    updated from admissions and evictions).

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

    name = "prefix-aware"
    uses_prefix_hits = True
    load_penalty: float = 64.0

    def __post_init__(self) -> None:
        check_non_negative_number("load_penalty", self.load_penalty, 1e12)

    def choose(self, arrival: Arrival) -> int:
        if arrival.hit_tokens is None:
            raise ValueError("the prefix-aware router needs the replicas' hit tokens")
        return prefix_aware_choice(arrival.hit_tokens, arrival.loads, self.load_penalty)


ROUTE_POLICIES: tuple[str, ...] = tuple(ROUTERS)
"""The course's own routers' names (``tools/bench_cluster.py --against`` reads this name
from older commits too); :data:`ROUTERS` also holds any router defined after this module."""
