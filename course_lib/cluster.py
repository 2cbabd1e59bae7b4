"""N replicas behind a router: each replica a simulated server on the serving core, every
one stepping on the same clock.

A request arrives (at its ``arrival`` step, or, for a conversation's later turn, ``think``
steps after the previous turn finished), the router (``course_lib.router``) picks a
replica, and that replica's lazy serving core (``course_lib.lazy_serving``, as the
single-server simulator runs it) schedules it. Each replica turns its own steps into
seconds with the cost model (``course_lib.simulator.CostModel``): a step that copies
blocks back from its CPU tier (``course_lib.tier``) pays chapter 05's swap cost for them.

A replica replays a request exactly as ``course_lib.simulator`` does (a prompt of ``P + 1``
tokens, the guide's free prefill plus the token its admission step writes), so one replica
reproduces ``simulate`` step for step (a test holds them equal). Requests with token ids
share prefix-cache blocks across requests (no cache salt); those without keep the
simulator's positions and a salt of their own.

What it leaves out: network time, replicas of different speeds, and the router's view is
exact at each step (a real router's lags by its polling interval).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from course_lib.kv_math import GIB
from course_lib.lazy_serving import LazyServingCore
from course_lib.paged import BlockPool
from course_lib.prefix_cache import BlockHash, block_hashes
from course_lib.router import Arrival, PrefixIndex, Router, make_router
from course_lib.serving import Chunk, Sample, Schedule, ServingRequest
from course_lib.simulator import (
    ROOFLINE_COSTS,
    PagedMemory,
    ScheduleCounts,
    SimConfig,
    core_request,
    percentiles,
    rejected_requests,
)
from course_lib.tier import TieredBlockPool, TierStats, tier_stats
from course_lib.validate import check_int, check_non_negative_number, describe
from course_lib.workload import Request, check_trace_size, validate_trace


@dataclass(frozen=True)
class ClusterConfig:
    """The cluster: ``replicas`` copies of ``server`` (a paged :class:`SimConfig`), each
    with a CPU tier of ``tier_bytes`` (0: none; needs prefix caching), behind a router of
    ``policy`` (a name in ``course_lib.router.ROUTERS``). The rest are router parameters,
    each given to the routers that have it and checked by the one named: ``load_penalty``
    is the prefix-aware router's price, in cached tokens, of one request a replica already
    has (running or waiting); ``vnodes`` the points per replica on the session-affinity
    ring."""

    replicas: int = 8
    server: SimConfig = field(default_factory=lambda: SimConfig(prefix_caching=True))
    tier_bytes: int = 0
    policy: str = "prefix-aware"
    load_penalty: float = 64.0
    vnodes: int = 64

    def __post_init__(self) -> None:
        check_int("replicas", self.replicas, 1, 1024)
        if not isinstance(self.server, SimConfig) or self.server.allocator != "paged":
            raise ValueError(f"server must be a paged SimConfig, got {describe(self.server)}")
        check_int("tier_bytes", self.tier_bytes, 0)
        if self.tier_bytes and not self.server.prefix_caching:
            raise ValueError(f"tier_bytes={self.tier_bytes} needs prefix caching: the tier "
                             f"keeps evicted cached blocks")
        self.router()

    def router(self) -> Router:
        """A new router of ``policy`` with this cluster's router parameters."""
        return make_router(self.policy, {"load_penalty": self.load_penalty,
                                         "vnodes": self.vnodes})

    @property
    def block_bytes(self) -> int:
        """One block's K/V in bytes."""
        return self.server.bytes_per_token * self.server.block_size

    @property
    def gpu_pool_bytes(self) -> int:
        """One replica's GPU pool in bytes (the null block excluded)."""
        return (self.server.num_blocks - 1) * self.block_bytes


STUDY_CLUSTER = ClusterConfig(
    replicas=8,
    server=SimConfig(budget_bytes=4 * GIB, prefix_caching=True, costs=ROOFLINE_COSTS),
)
"""Chapter 09's study: 8 replicas of a 4 GiB KV pool (32,768 tokens of the guide's model),
prefix caching on, the roofline cost model (prefill is not free), prefix-aware routing;
the multi-turn preset (``course_lib.workload.multi_turn``) is its traffic."""


CLUSTER_METRICS: dict[str, str] = {
    "requests": "requests run (rejected ones excluded)",
    "hit_rate": "prompt tokens found cached (GPU or CPU tier) / prompt tokens looked up",
    "gpu_hit_rate": "prompt tokens found in a GPU cache / prompt tokens looked up",
    "tier_hit_tokens": "prompt tokens copied back from a CPU tier",
    "prefill_tokens": "prompt tokens computed (cache and tier hits excluded)",
    "recomputed_tokens": "tokens prefilled again when a preempted request resumed",
    "preemptions": "times a running request was pushed out, all replicas",
    "load_imbalance": "sum over steps of the busiest replica's running requests / of the mean",
    "clock_steps": "steps of the shared clock until the last request finished (idle steps "
                   "included)",
    "batch_steps": "steps in which a replica ran a batch, summed over the replicas (the "
                   "single-server simulator's steps, for one replica)",
    "seconds": "simulated time of the slowest replica",
    "p50_ttft_steps": "median steps from arrival to first token (the admission step counts)",
    "p99_ttft_steps": "99th-percentile steps from arrival to first token",
    "p50_e2e_steps": "median steps from arrival to last token",
    "p99_e2e_steps": "99th-percentile steps from arrival to last token",
    "p50_ttft": "median seconds from arrival to first token",
    "p99_ttft": "99th-percentile seconds from arrival to first token",
    "p50_e2e": "median seconds from arrival to last token",
    "p99_e2e": "99th-percentile seconds from arrival to last token",
    "seconds_per_chat": "mean seconds from arrival to last token",
}
"""What each metric of :class:`ClusterResult` means."""


@dataclass(frozen=True)
class ReplicaResult:
    """One replica's run, in the single-server simulator's terms: decode steps that ran a
    batch, tokens, preemptions, recomputed and reused tokens, swap bytes, seconds, and its
    prefix-cache traffic in tokens."""

    requests: int
    steps: int
    output_tokens: int
    prefill_tokens: int
    preemptions: int
    recomputed_tokens: int
    reused_tokens: int
    swapped_bytes: int
    seconds: float
    cache: TierStats | None


@dataclass(frozen=True)
class ClusterResult:
    """Metrics of one cluster run (:data:`CLUSTER_METRICS` says what each means), each
    replica's totals, and per request (by trace index; -1 for a rejected request) its
    replica, arrival, first and last step, and seconds to first and last token."""

    requests: int
    hit_rate: float
    gpu_hit_rate: float
    tier_hit_tokens: int
    prefill_tokens: int
    recomputed_tokens: int
    preemptions: int
    load_imbalance: float
    clock_steps: int
    batch_steps: int
    seconds: float
    p50_ttft_steps: float
    p99_ttft_steps: float
    p50_e2e_steps: float
    p99_e2e_steps: float
    p50_ttft: float
    p99_ttft: float
    p50_e2e: float
    p99_e2e: float
    seconds_per_chat: float
    config: ClusterConfig = field(repr=False)
    replicas: tuple[ReplicaResult, ...] = field(repr=False)
    replica_of: tuple[int, ...] = field(repr=False)
    arrival: tuple[int, ...] = field(repr=False)
    first_step: tuple[int, ...] = field(repr=False)
    done_step: tuple[int, ...] = field(repr=False)
    ttft: tuple[float, ...] = field(repr=False)
    e2e: tuple[float, ...] = field(repr=False)
    rejections: dict[int, str] = field(repr=False)

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics of :data:`CLUSTER_METRICS` by name."""
        return {name: getattr(self, name) for name in CLUSTER_METRICS}

    def as_dict(self) -> dict[str, Any]:
        """The metrics and each replica's figures, JSON-ready."""
        return {**self.metrics, "rejected": len(self.rejections),
                "replica_requests": [r.requests for r in self.replicas],
                "replica_prefill_tokens": [r.prefill_tokens for r in self.replicas]}


@dataclass(slots=True)
class _Tally:
    """One request on its replica: KV length and step at its current admission."""

    len0: int = 0
    t0: int = 0
    resumed: bool = False


class Replica(ScheduleCounts):
    """One simulated server: a lazy serving core over a paged pool (with a CPU tier
    when configured) and the bookkeeping that turns its steps into the simulator's metrics.
    With ``record_evictions`` its prefix cache lists the hashes it evicts, for the router's
    index (:meth:`drain_evictions`).
    """

    def __init__(self, config: ClusterConfig, *, record_evictions: bool = False) -> None:
        server = config.server
        super().__init__(server)
        self.config, self.server = config, server
        tier = config.tier_bytes if server.prefix_caching else None  # 0: counts lookups
        cache = replace(server.cache_config(), cpu_tier_bytes=tier)
        self.pool: BlockPool = cache.make_pool(block_bytes=config.block_bytes,
                                               record_evictions=record_evictions)
        self.core = LazyServingCore(server.scheduler, self.pool, closed_loop=True)
        self.index: list[int] = []  # core request id -> trace index
        self.tally: dict[int, _Tally] = {}
        self.step_seconds: list[float] = []
        self.running: list[int] = []  # requests running after each step
        self.t = 0  # the clock step this replica runs next (those before it are accounted)
        self.base = 0  # sum of (len0 - t0) over the running requests
        self.steps = self.output = self.prefilled = 0

    @property
    def load(self) -> int:
        """Requests running or waiting here."""
        return len(self.core.unfinished)

    def add(self, i: int, request: Request, chain: Sequence[BlockHash] = ()) -> None:
        """Queue trace request ``i``, ``chain`` the hashes of its prompt's full blocks
        (``_ClusterRun._prompt_chain``; with prefix caching the core hashes only the rest)."""
        if request.token_ids is None:
            queued = core_request(len(self.index), request)
        else:
            prompt = (*request.token_ids, request.prompt_len)
            queued = ServingRequest(len(self.index), prompt, request.output_len,
                                    request.priority, [Sample(str(request.id), list(prompt))])
        self.core.add(queued, known_hashes=chain if self.server.prefix_caching else ())
        self.index.append(i)
        self.tally[i] = _Tally()

    def next_busy(self) -> float:
        """The first clock step from ``t`` on at which this replica may admit, preempt or
        finish a request (infinity while it has none); until then it only decodes."""
        core = self.core
        if not core.unfinished:
            return math.inf
        return self.t + core.quiet_until() - core.clock

    def catch_up(self, t: int) -> None:
        """Run the clock steps from ``self.t`` up to ``t`` (none past ``next_busy()``) in
        one call: the running requests decode (the core takes their block claims in order),
        or nothing runs; each step's seconds and batch are booked as ``step`` books them."""
        steps, core = t - self.t, self.core
        if steps <= 0:
            return
        batch = len(core.scheduler.running)
        if core.unfinished:
            core.skip_to(core.clock + steps)
        if batch:
            self.steps += steps
            self.output += batch * steps
        step_time, per_token = self.server.costs.step_time, self.server.bytes_per_token
        self.step_seconds += [step_time((self.base + batch * (s + 1)) * per_token, 0, 0, 0)
                              for s in range(self.t, t)]
        self.running += [batch] * steps
        self.t = t

    def step(self, t: int, admitted: list[tuple[int, ServingRequest]]) -> list[int]:
        """Run clock step ``t``, the next one (``catch_up``), for a replica with requests;
        append the requests it admitted; return those it finished."""
        core = self.core
        schedule = core.schedule()
        self.step_swapped = [0, 0]
        for request_id in schedule.preempted:
            self._preempted(self.index[request_id], schedule.swapped_out.get(request_id))
        prefilled = sum(self._admitted(chunk, schedule, t, admitted)
                        for chunk in schedule.chunks if not chunk.decode)
        batch = len(core.scheduler.running)
        if batch:
            self.steps += 1
            self.output += batch
        self.prefilled += prefilled
        self.step_seconds.append(self.server.costs.step_time(
            (self.base + batch * (t + 1)) * self.server.bytes_per_token, prefilled,
            *self.step_swapped))
        finished = []
        for request in core.retire(core.advance(schedule)):
            i = self.index[request.request_id]
            self.base -= self.tally[i].len0 - self.tally[i].t0
            finished.append(i)
        self.running.append(len(core.scheduler.running))
        self.t = t + 1
        return finished

    def _admitted(self, chunk: Chunk, schedule: Schedule, t: int,
                  admitted: list[tuple[int, ServingRequest]]) -> int:
        """Book an admission's chunk (new, resumed or swapped in) as the single-server
        simulator does; return the tokens it prefills (the step's own token excluded)."""
        i = self.index[chunk.request.request_id]
        tally = self.tally[i]
        prefilled = self._count_admission(chunk, schedule, tally.resumed)
        tally.len0, tally.t0, tally.resumed = chunk.start + chunk.count - 1, t, False
        self.base += tally.len0 - t
        admitted.append((i, chunk.request))
        return prefilled

    def _preempted(self, i: int, swapped_blocks: int | None) -> None:
        """Request ``i`` was pushed out (to swap space with ``swapped_blocks``)."""
        tally = self.tally[i]
        self.base -= tally.len0 - tally.t0
        tally.resumed = True
        self._count_preemption(swapped_blocks)

    def drain_evictions(self) -> list[BlockHash]:
        """Hashes evicted since the last call that the GPU cache no longer holds."""
        pool = self.pool
        if not isinstance(pool, TieredBlockPool) or not pool.evicted:
            return []
        gone = [h for h in pool.evicted if pool.cached_block(h) is None]
        pool.evicted.clear()
        return gone

    def result(self, requests: int) -> ReplicaResult:
        """This replica's totals."""
        cache = tier_stats(self.core.manager) if self.server.prefix_caching else None
        return ReplicaResult(requests, self.steps, self.output, self.prefilled,
                             self.preemptions, self.recomputed, self.reused,
                             self.swapped_bytes, float(sum(self.step_seconds)), cache)


def _sessions(trace: Sequence[Request]) -> list[int]:
    """Each request's conversation: the id of the first turn it follows back to."""
    root: dict[int, int] = {}
    for request in trace:
        root[request.id] = request.id if request.follows is None else root[request.follows]
    return [root[r.id] for r in trace]


def simulate_cluster(requests: Iterable[Request], config: ClusterConfig | None = None, *,
                     progress: bool = False, observer: Any = None) -> ClusterResult:
    """Run the trace on the cluster to completion and return its metrics.

    ``observer(t, replicas, router_index)``, if given, is called after every step (the
    tests use it to compare the router's index with each replica's cache).
    """
    config = config or ClusterConfig()
    if not isinstance(config, ClusterConfig):
        raise ValueError(f"config must be a ClusterConfig, got {describe(config)}")
    trace = validate_trace(requests)
    if not trace:
        raise ValueError("simulate_cluster needs at least one request")
    check_trace_size(trace)
    return _ClusterRun(trace, config, progress, observer).run()


class _ClusterRun:
    """The shared clock, the arrivals and the per-request records of one cluster run."""

    def __init__(self, trace: list[Request], config: ClusterConfig, progress: bool,
                 observer: Any) -> None:
        self.trace, self.config, self.observer = trace, config, observer
        self.router = config.router()
        self.router.start(config.replicas)
        self.replicas = [Replica(config, record_evictions=self.router.uses_prefix_hits)
                         for _ in range(config.replicas)]
        memory = PagedMemory(config.server, self.replicas[0].pool)  # every replica's alike
        self.rejections = rejected_requests(trace, config.server.max_len, memory)
        self.position = {r.id: i for i, r in enumerate(trace)}
        self.followers: dict[int, list[int]] = {}
        for i, r in enumerate(trace):
            if r.follows is not None and r.id not in self.rejections:
                self.followers.setdefault(self.position[r.follows], []).append(i)
        self.sessions = _sessions(trace)
        self.index = PrefixIndex(config.replicas, config.server.block_size)
        self.routed = 0  # requests routed so far
        n = len(trace)
        self.replica_of, self.arrival = [-1] * n, [-1] * n
        self.first, self.done = [-1] * n, [-1] * n
        self.chains: dict[int, list[BlockHash]] = {}
        self.heap = [(r.arrival, i) for i, r in enumerate(trace)
                     if r.follows is None and r.id not in self.rejections]
        heapq.heapify(self.heap)  # (step, trace index) of the arrivals to come
        self.busy = [math.inf] * config.replicas  # each replica's next_busy()
        self.bar = tqdm(total=n - len(self.rejections), disable=not progress,
                        desc=f"cluster of {config.replicas}", unit="req", leave=False)

    def run(self) -> ClusterResult:
        """Step the clock from event to event: an arrival, or a replica's next step that
        does more than decode (``Replica.next_busy``); the steps between are caught up in
        one call per replica when they matter (with an observer, every step)."""
        trace, replicas, heap = self.trace, self.replicas, self.heap
        remaining = len(trace) - len(self.rejections)
        t = -1
        while remaining:
            t = self._next_step(t)
            while heap and heap[0][0] <= t:
                self._arrive(heapq.heappop(heap)[1], t)
            for r, replica in enumerate(replicas):
                if self.busy[r] > t:
                    continue
                self._catch_up(r, t)
                admitted: list[tuple[int, ServingRequest]] = []
                for i in replica.step(t, admitted):
                    self.done[i] = t
                    remaining -= 1
                    self.bar.update()
                    for j in self.followers.get(i, ()):
                        heapq.heappush(heap, (t + 1 + trace[j].think, j))
                self._admitted(r, admitted, t)
                self.busy[r] = replica.next_busy()
            if self.observer is not None:
                for r in range(len(replicas)):
                    self._catch_up(r, t + 1)
                self.observer(t, replicas, self.index)
                # an observer may sync a core (sync_all), so its quiet stretch may end sooner
                self.busy = [replica.next_busy() for replica in replicas]
        self.bar.close()
        for replica in replicas:
            replica.catch_up(t + 1)
        return self._result(t + 1)

    def _next_step(self, t: int) -> int:
        """The clock step after ``t`` at which something happens: the next arrival or a
        replica's next busy step (with an observer, the next step while any replica has
        requests)."""
        busy = min(self.busy)
        if self.observer is not None and busy < math.inf:
            return t + 1
        return int(min(busy, self.heap[0][0])) if self.heap else int(busy)

    def _catch_up(self, r: int, t: int) -> None:
        """Bring replica ``r`` to clock step ``t`` (``Replica.catch_up``), the router's index
        too (the blocks its claims evicted)."""
        self.replicas[r].catch_up(t)
        if self.router.uses_prefix_hits:
            self.index.evicted(r, self.replicas[r].drain_evictions())

    def _arrive(self, i: int, t: int) -> None:
        """Route trace request ``i``, arriving at step ``t``, and queue it there."""
        request, router, hits = self.trace[i], self.router, None
        chain = self.chains[i] = self._prompt_chain(request)
        if router.uses_prefix_hits:
            for other in range(len(self.replicas)):
                self._catch_up(other, t)  # the index as of this step
            hits = tuple(self.index.hit_tokens(chain))
        loads = tuple(replica.load for replica in self.replicas)
        r = check_int(f"the {router.name} router's choice",
                      router.choose(Arrival(request, self.routed, self.sessions[i], loads, hits)),
                      0, len(loads) - 1)
        self.routed += 1
        self.replica_of[i], self.arrival[i] = r, t
        self._catch_up(r, t)
        self.replicas[r].add(i, request, chain)
        self.busy[r] = t

    def _prompt_chain(self, request: Request) -> list[BlockHash]:
        """The hashes of the full blocks a replica could find cached for ``request`` (none
        without token ids: such blocks carry a salt of their own), hashed once per run for
        the router and the replica. A later turn extends the chain of the turn it follows
        when its prompt starts with that one's."""
        if request.token_ids is None:
            return []
        size = self.config.server.block_size
        known: list[BlockHash] = []
        if request.follows is not None:
            before = self.position[request.follows]
            previous, shared = self.trace[before].token_ids, len(self.chains[before]) * size
            if previous is not None and request.token_ids[:shared] == previous[:shared]:
                known = self.chains[before]
        usable = request.prompt_len // size * size
        return block_hashes(request.token_ids[:usable], size, known=known)

    def _admitted(self, r: int, admitted: list[tuple[int, ServingRequest]], t: int) -> None:
        """Record first tokens and keep the router's index: what replica ``r`` admitted
        (its prompt blocks are cached there now) and what it evicted."""
        for i, _ in admitted:
            if self.first[i] < 0:
                self.first[i] = t
        if self.router.uses_prefix_hits:
            for i, _ in admitted:
                self.index.admitted(r, self.chains[i])
            self.index.evicted(r, self.replicas[r].drain_evictions())

    def _result(self, steps: int) -> ClusterResult:
        config, trace = self.config, self.trace
        order = [i for i, r in enumerate(trace) if r.id not in self.rejections]
        ends = [np.cumsum(r.step_seconds) for r in self.replicas]
        starts = [e - np.asarray(r.step_seconds) for e, r in zip(ends, self.replicas, strict=True)]
        ttft = np.array([ends[self.replica_of[i]][self.first[i]]
                         - starts[self.replica_of[i]][self.arrival[i]] for i in order])
        e2e = np.array([ends[self.replica_of[i]][self.done[i]]
                        - starts[self.replica_of[i]][self.arrival[i]] for i in order])
        ttft_steps = np.array([self.first[i] + 1 - self.arrival[i] for i in order])
        e2e_steps = np.array([self.done[i] + 1 - self.arrival[i] for i in order])
        counts = np.bincount([self.replica_of[i] for i in order], minlength=config.replicas)
        results = tuple(rep.result(int(n)) for rep, n in zip(self.replicas, counts, strict=True))
        running = np.array([r.running for r in self.replicas])
        busiest, mean = running.max(axis=0).sum(), running.mean(axis=0).sum()
        caches = [r.cache for r in results if r.cache is not None]
        queries = sum(c.prefix_cache_queries for c in caches)
        gpu_hits = sum(c.prefix_cache_hits for c in caches)
        tier_hits = sum(c.external_prefix_cache_hits for c in caches)
        metrics = {
            "requests": len(order),
            "hit_rate": (gpu_hits + tier_hits) / queries if queries else 0.0,
            "gpu_hit_rate": gpu_hits / queries if queries else 0.0,
            "tier_hit_tokens": tier_hits,
            "prefill_tokens": sum(r.prefill_tokens for r in results),
            "recomputed_tokens": sum(r.recomputed_tokens for r in results),
            "preemptions": sum(r.preemptions for r in results),
            "load_imbalance": float(busiest / mean) if mean else 1.0,
            "clock_steps": steps,
            "batch_steps": sum(r.steps for r in results),
            "seconds": max(r.seconds for r in results),
            **percentiles("ttft_steps", ttft_steps), **percentiles("e2e_steps", e2e_steps),
            **percentiles("ttft", ttft), **percentiles("e2e", e2e),
            "seconds_per_chat": float(e2e.mean()),
        }
        return ClusterResult(
            **metrics, config=config, replicas=results, replica_of=tuple(self.replica_of),
            arrival=tuple(self.arrival), first_step=tuple(self.first),
            done_step=tuple(self.done), ttft=tuple(float(x) for x in ttft),
            e2e=tuple(float(x) for x in e2e), rejections=dict(self.rejections))


def tier_study(requests: Sequence[Request], config: ClusterConfig,
               multiples: Sequence[float] = (0, 1, 4, 16), *,
               progress: bool = True) -> list[tuple[float, ClusterResult]]:
    """The cluster under CPU tiers of ``multiples`` x one replica's GPU pool."""
    runs = []
    for multiple in tqdm(list(multiples), disable=not progress, desc="tier sizes",
                         leave=False):
        check_non_negative_number("tier multiple", multiple, 1024)
        sized = replace(config, tier_bytes=int(multiple * config.gpu_pool_bytes))
        runs.append((multiple, simulate_cluster(requests, sized)))
    return runs


def replicas_needed(requests: Sequence[Request], config: ClusterConfig, *,
                    p99_ttft_seconds: float, max_replicas: int = 32) -> int | None:
    """The fewest replicas (up to ``max_replicas``) whose p99 time to first token meets
    ``p99_ttft_seconds`` under ``config``'s policy, or None if none does. Assumes more
    replicas never hurt: a binary search for the fewest that meet it, if ``max_replicas``
    does (run last, and only when the search ends there: each run is a whole simulation)."""
    check_non_negative_number("p99_ttft_seconds", p99_ttft_seconds)
    check_int("max_replicas", max_replicas, 1, 1024)
    trace = list(requests)

    def meets(n: int) -> bool:
        return simulate_cluster(trace, replace(config, replicas=n)).p99_ttft <= p99_ttft_seconds

    low, high = 1, max_replicas
    while low < high:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle + 1
    return low if low < max_replicas or meets(max_replicas) else None
