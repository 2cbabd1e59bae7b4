"""The decode-step simulator: replay a trace against one KV allocator and measure the waste.

The model is the source guide's. Each step is one decode iteration in which every running
request writes one token; prefill is free (admitting a request adds no step). Inside step
``t``, in this order:

1. **grow**: each running request whose slots are all written claims more (under paging,
   one block), oldest admission first. When the pool is empty the scheduler names a victim
   (``course_lib.scheduler``), whose memory is freed, until the claim succeeds or the
   claimant is itself the victim. Contiguous slabs never grow: they reserve up front.
2. **admit**: unless something was preempted in this step (vLLM's rule, so a freed request
   is not readmitted at once), waiting requests are admitted in queue order while the next
   one fits and the scheduler's limits allow; strict order, so a request that does not fit
   blocks those behind it. A request is admitted with room for its current length plus the
   token this step writes.
3. **decode**: every running request writes one token. The step's metrics are taken here.
4. **finish**: requests that wrote their last token free their memory.

The loop is event-driven: a request costs work only when it is admitted, crosses a block
boundary, is preempted or finishes, never per token. A step that holds no event costs a few
additions, so 3,000 chats take a fraction of a second.

Prefix caching (``SimConfig(prefix_caching=True)``, off by default) changes one thing: a
request preempted for recompute leaves its full blocks in the pool with their hashes
(``course_lib.prefix_cache``), last block first in the free queue, so the pool evicts its
tail first. When it resumes it takes back the leading blocks nobody has reused since
(always computing at least its last token, as vLLM does) and recomputes only the rest.
The simulator knows lengths, not token ids, so a request's token ids are its positions and
its id is the first block's cache salt: hashed by ``course_lib.prefix_cache``'s chain, only
the request itself can find its blocks, and running requests never share one (sharing is
chapter 04's). Block tables and hashes live in the serving core's KV-cache manager over a
pool without K/V storage, as in the engine (``course_lib.engine.core``). Admission is
unchanged (a cached free block is still a free block), so the schedule changes only where
a token budget or a time cost sees the tokens no longer prefilled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from course_lib.kv_math import GIB, MODELS
from course_lib.limits import MAX_POOL_BLOCKS
from course_lib.paged import FREE_ORDERS, BlockPool, FreeOrder, OutOfBlocks
from course_lib.prefix_cache import (
    BlockHash,
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
    block_hashes,
)
from course_lib.scheduler import (
    Scheduler,
    SchedulerConfig,
    SwapSpace,
    kv_manager,
    tokens_to_recompute,
)
from course_lib.slab import FITS, Fit, SlabAllocator
from course_lib.snapshot import PoolSnapshot
from course_lib.validate import (
    check_at_most,
    check_int,
    check_non_negative_number,
    check_positive_number,
)
from course_lib.workload import Request, check_trace_size, validate_trace

Allocator = Literal["reserve-max", "exact-size", "paged"]
ALLOCATORS: tuple[Allocator, ...] = ("reserve-max", "exact-size", "paged")

Recording = Literal["off", "steps", "full"]
RECORDINGS: tuple[Recording, ...] = ("off", "steps", "full")

EventKind = Literal["admit", "grow", "preempt", "finish"]


@dataclass(frozen=True)
class CostModel:
    """Seconds per simulated step and money per hour: every time and cost figure uses this.

    A step takes ``step_seconds`` plus the KV bytes it reads over ``kv_read_bandwidth``
    (None: ignored), plus ``prefill_seconds_per_token`` for every prefilled token, plus,
    for every block swapped in or out, ``swap_seconds_per_block`` (transfer latency) and
    its bytes over ``pcie_bandwidth``.

    The defaults are the source guide's: 25 ms per step at any batch size, free prefill,
    250 an hour. That makes cost per token an upper bound on paging's saving, because real
    steps slow down as the batch grows; :data:`ROOFLINE_COSTS` is a model where they do.
    The swap defaults are assumptions: a block moves as 64 copies (32 layers, K and V) of
    about 5 us latency each, 0.3 ms, over 25 GB/s of PCIe 4.0 x16, so small blocks swap
    poorly, as the vLLM paper found.
    """

    step_seconds: float = 0.025
    kv_read_bandwidth: float | None = None
    prefill_seconds_per_token: float = 0.0
    swap_seconds_per_block: float = 3e-4
    pcie_bandwidth: float = 25e9
    price_per_hour: float = 250.0

    def __post_init__(self) -> None:
        time_terms = ("step_seconds", "prefill_seconds_per_token", "swap_seconds_per_block")
        for name in (*time_terms, "price_per_hour"):
            check_non_negative_number(name, getattr(self, name))
        if self.kv_read_bandwidth is None and not any(getattr(self, n) for n in time_terms):
            raise ValueError("a cost model needs at least one non-zero time term, got all zero")
        if self.kv_read_bandwidth is not None:
            check_positive_number("kv_read_bandwidth", self.kv_read_bandwidth)
        check_positive_number("pcie_bandwidth", self.pcie_bandwidth)

    def step_time(self, kv_bytes_read: float, prefill_tokens: int, swapped_blocks: int,
                  swapped_bytes: int) -> float:
        """Seconds one step takes under this model."""
        seconds = (self.step_seconds + prefill_tokens * self.prefill_seconds_per_token
                   + swapped_blocks * self.swap_seconds_per_block
                   + swapped_bytes / self.pcie_bandwidth)
        if self.kv_read_bandwidth is not None:
            seconds += kv_bytes_read / self.kv_read_bandwidth
        return seconds


ROOFLINE_COSTS = CostModel(
    step_seconds=0.006,
    kv_read_bandwidth=3.0e12,
    prefill_seconds_per_token=4e-5,
)
"""A step that slows down with the batch, for the guide's 8B-class model on one H100-class
GPU (assumptions, not measurements): 6 ms to read ~16 GB of fp16 weights at ~3 TB/s, KV
reads at 3 TB/s, 40 us per prefilled token (~16 GFLOP at ~400 TFLOP/s); swaps as in
:class:`CostModel`."""


@dataclass(frozen=True)
class SimConfig:
    """One simulated server: the allocator, its memory, the scheduler and the cost model.

    ``budget_bytes`` of KV memory at ``bytes_per_token`` give the arena of
    ``budget_bytes // bytes_per_token`` slots (contiguous allocators) or
    ``budget_bytes // (bytes_per_token * block_size)`` blocks (paged; block 0 is the
    reserved null block). Requests longer than ``max_len`` are rejected. Defaults: the
    source guide's 60 GiB and its made-up model (32 layers, 8 KV heads, head size 128,
    fp16: 128 KiB per token), blocks of 16, requests up to 8,192 tokens, its minimal
    scheduler (FCFS, recompute, no limits) and its flat 25 ms step. ``prefix_caching``
    (paged only, off by default) lets a request resumed by recompute reuse its blocks
    still cached (see the module's docstring). ``free_order`` is the pool's
    (``course_lib.paged``): ``"vllm"`` reuses a freed block without a hash first,
    ``"fifo"`` (vLLM before May 2026) queues every freed block at the back.
    """

    allocator: Allocator = "paged"
    budget_bytes: int = 60 * GIB
    bytes_per_token: int = MODELS["guide-8kv"].bytes_per_token("fp16")
    block_size: int = 16
    max_len: int = 8192
    fit: Fit = "first"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    costs: CostModel = field(default_factory=CostModel)
    prefix_caching: bool = field(default=False, repr=False)
    free_order: FreeOrder = field(default="vllm", repr=False)

    def __post_init__(self) -> None:
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"unknown allocator {self.allocator!r}; expected one of "
                             f"{', '.join(ALLOCATORS)}")
        if self.fit not in FITS:
            raise ValueError(f"unknown fit {self.fit!r}; expected one of {', '.join(FITS)}")
        for name in ("budget_bytes", "bytes_per_token", "block_size", "max_len"):
            check_int(name, getattr(self, name), 1)
        if not isinstance(self.scheduler, SchedulerConfig):
            raise ValueError(f"scheduler must be a SchedulerConfig, got {self.scheduler!r}")
        if not isinstance(self.costs, CostModel):
            raise ValueError(f"costs must be a CostModel, got {self.costs!r}")
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix_caching must be True or False, got {self.prefix_caching!r}")
        if self.free_order not in FREE_ORDERS:
            raise ValueError(f"unknown free_order {self.free_order!r}; expected one of "
                             f"{', '.join(FREE_ORDERS)}")
        if self.prefix_caching and self.allocator != "paged":
            raise ValueError(f"prefix caching needs the paged allocator, got "
                             f"allocator={self.allocator!r}")
        self.scheduler.check_max_len(self.max_len)
        if self.allocator == "paged" and self.num_blocks < 2:
            raise ValueError(f"a budget of {self.budget_bytes} bytes holds {self.num_blocks} "
                             f"blocks of {self.block_size} tokens; the pool needs at least 2")
        if self.allocator == "paged":
            check_at_most("the pool's blocks (budget_bytes // (bytes_per_token x block_size))",
                          self.num_blocks, MAX_POOL_BLOCKS,
                          "lower budget_bytes or raise block_size")
        if self.allocator != "paged" and self.kv_tokens < 1:
            raise ValueError(f"a budget of {self.budget_bytes} bytes holds no token")

    @property
    def kv_tokens(self) -> int:
        """Token slots in the budget (the contiguous arena's size)."""
        return self.budget_bytes // self.bytes_per_token

    @property
    def num_blocks(self) -> int:
        """Blocks in the paged pool, the null block included."""
        return self.budget_bytes // (self.bytes_per_token * self.block_size)


@dataclass(frozen=True, slots=True)
class Event:
    """One allocation event, recorded with ``record="full"`` to redraw any step.

    ``length`` is the request's KV length when it happened (for ``admit``, before the
    step's token). ``where`` is ``(start, size)`` of a slab, the block ids an admission
    took, or the one block a ``grow`` took. ``cached`` (prefix caching only) counts, for
    an admission, the leading blocks of ``where`` found in the prefix cache and, for a
    preemption, the leading blocks of the request's table left there with their hashes.
    """

    step: int
    kind: EventKind
    request: int
    length: int
    where: tuple[int, ...] = ()
    cached: int = field(default=0, repr=False)


@dataclass(frozen=True)
class SimTimeline:
    """Per step (index = step): batch, slots by state, requests waiting, the slots the
    first waiting request needs (0 when none waits) and preemptions, for plots and widgets.

    ``events`` (only with ``record="full"``) are all allocation events in order;
    ``events[:cuts[t]]`` are those that happened before step ``t``'s decode.
    """

    batch: np.ndarray
    used: np.ndarray
    reserved: np.ndarray
    internal: np.ndarray
    free: np.ndarray
    stranded: np.ndarray
    waiting: np.ndarray
    next_need: np.ndarray
    preemptions: np.ndarray
    events: tuple[Event, ...] = ()
    cuts: np.ndarray | None = None


METRICS: dict[str, str] = {
    "steps": "decode steps that ran a batch",
    "output_tokens": "tokens generated (every request's reply, once)",
    "prompt_tokens": "prompt tokens of the requests that ran",
    "avg_batch": "output tokens / decode steps: requests decoded per step, whole run",
    "avg_batch_while_waiting": "requests per step while some request waited (memory full)",
    "peak_batch": "most requests decoded in one step",
    "utilization": "allocated slot-steps holding a token (time-averaged U)",
    "used_share": "share of KV slots holding tokens, averaged over decode steps",
    "reserved_share": "share reserved for tokens not yet written",
    "internal_share": "share reserved but never to be written (internal fragmentation)",
    "free_share": "share free",
    "stranded_share": "while requests waited: share free in gaps too small for the next one",
    "no_gap_steps": "steps where free space in total fit the next request but no gap did",
    "reserved_empty_share": "while requests waited: share allocated but holding no token",
    "last_block_unused": "paged: empty slots in a request's last block, per request-step",
    "preemptions": "times a running request was pushed out",
    "preempted_requests": "requests pushed out at least once",
    "recomputed_tokens": "tokens prefilled again when a preempted request resumed",
    "recomputed_share": "recomputed / (prompt + output + recomputed tokens)",
    "reused_tokens": "prefix caching only: tokens a resumed request found still cached",
    "swapped_bytes": "bytes copied to and from CPU swap space",
    "seconds": "simulated time under the cost model",
    "cost_per_million_tokens": "money per million output tokens at the cost model's price",
    "throughput": "output tokens per simulated second",
    "p50_ttft": "median seconds from arrival to first token",
    "p99_ttft": "99th-percentile seconds from arrival to first token",
    "p50_latency": "median seconds from arrival to last token",
    "p99_latency": "99th-percentile seconds from arrival to last token",
    "avg_stall": "seconds a preempted request spent waiting to resume, on average",
}
"""What each metric of :class:`SimResult` means. Shares are of ``kv_tokens``, the slots
requests may use (the paged pool's null block excluded). ``reused_tokens`` is reported
(in :meth:`SimResult.as_dict` and the command line) only for runs with prefix caching."""


@dataclass(frozen=True)
class SimResult:
    """Metrics of one run; :data:`METRICS` says what each field means."""

    allocator: Allocator
    block_size: int | None
    kv_tokens: int
    requests: int
    rejected: int
    steps: int
    output_tokens: int
    prompt_tokens: int
    avg_batch: float
    avg_batch_while_waiting: float
    peak_batch: int
    utilization: float
    used_share: float
    reserved_share: float
    internal_share: float
    free_share: float
    stranded_share: float
    no_gap_steps: int
    reserved_empty_share: float
    last_block_unused: float | None
    preemptions: int
    preempted_requests: int
    recomputed_tokens: int
    recomputed_share: float
    swapped_bytes: int
    seconds: float
    cost_per_million_tokens: float
    throughput: float
    p50_ttft: float
    p99_ttft: float
    p50_latency: float
    p99_latency: float
    avg_stall: float
    config: SimConfig = field(repr=False)
    rejections: dict[int, str] = field(repr=False)
    trace: tuple[Request, ...] = field(repr=False)
    timeline: SimTimeline | None = field(default=None, repr=False)
    reused_tokens: int = field(default=0, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The metrics as plain JSON-ready values (no config, trace or timeline);
        ``reused_tokens`` only when the run had prefix caching on."""
        skip = {"config", "rejections", "trace", "timeline"}
        if not self.config.prefix_caching:
            skip.add("reused_tokens")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    def _events_until(self, step: int) -> tuple[Event, ...]:
        """Events before ``step``'s decode; needs ``record="full"``."""
        timeline = self.timeline
        if timeline is None or timeline.cuts is None:
            raise ValueError("this run kept no events; simulate with record='full'")
        last = len(timeline.batch)
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < last:
            raise ValueError(f"step must be an integer in [0, {last}), got {step!r}")
        return timeline.events[: int(timeline.cuts[step])]

    def arena_at(self, step: int) -> SlabAllocator:
        """The contiguous arena as it was at ``step``'s decode, rebuilt by replaying events
        (slabs, written lengths, gaps); contiguous runs with ``record="full"`` only."""
        config = self.config
        if config.allocator == "paged":
            raise ValueError("arena_at is for contiguous allocators; use pool_at")
        arena = SlabAllocator(config.kv_tokens, policy=config.allocator,
                              max_len=config.max_len, fit=config.fit)
        finals = {r.id: r.total_len for r in self.trace}
        admitted: dict[int, Event] = {}
        for event in self._events_until(step):
            if event.kind == "admit":
                arena.admit(event.request, finals[event.request], event.length)
                admitted[event.request] = event
            else:
                arena.free(event.request)
        for rid in arena.slabs:
            arena.append(rid, step - admitted[rid].step + 1)
        return arena

    def pool_at(self, step: int) -> PoolSnapshot:
        """The paged pool as it was at ``step``'s decode: the run's events replayed into a
        fresh copy of its memory (the same KV-cache manager), whose snapshot gives each
        block's fill, owner, prefix-cache hash and what happened to it in that step; paged
        runs with ``record="full"`` only."""
        config = self.config
        if config.allocator != "paged":
            raise ValueError("pool_at is for the paged allocator; use arena_at")
        events = self._events_until(step)
        memory = _PagedMemory(config)
        finals = {r.id: r.total_len for r in self.trace}
        running: dict[int, Event] = {}
        started = False
        for event in events:
            if event.step == step and not started:
                memory.pool.take_events()  # the snapshot shows only this step's events
                started = True
            rid = event.request
            if event.kind == "admit":
                hit = memory.cached_prefix(rid, event.length) if event.cached else []
                if memory.admit(rid, event.length, finals[rid], hit)[1] != event.where:
                    raise RuntimeError(f"replaying step {event.step} gave request {rid} other "
                                       f"blocks than the run did; this is a bug")
                running[rid] = event
            elif event.kind == "grow":
                memory.grow(rid)
            else:
                if event.cached:
                    memory.cache(rid, event.length)
                memory.release(rid, 0)
                del running[rid]
        if not started:
            memory.pool.take_events()
        for rid, admitted in running.items():  # lengths as of this step's token
            behind = admitted.length + step - admitted.step + 1 - memory.manager.seq_len(str(rid))
            if behind:
                memory.extend(rid, behind)
        return memory.manager.snapshot(label=f"step {step}")


class _SlabMemory:
    """The step loop's view of a contiguous arena."""

    def __init__(self, config: SimConfig) -> None:
        self.arena = SlabAllocator(config.kv_tokens, policy=config.allocator,
                                   max_len=config.max_len, fit=config.fit)
        if config.allocator == "reserve-max" and config.kv_tokens < config.max_len:
            raise ValueError(f"the arena holds {config.kv_tokens} slots, fewer than one "
                             f"max_len={config.max_len} slab")
        self.capacity = config.kv_tokens
        self.version = 0  # bumped on every admission and release

    def reject_reason(self, final_len: int) -> str | None:
        """Why a request ending at ``final_len`` tokens can never run, or None."""
        if final_len > self.capacity:
            return f"needs {final_len} slots, the arena has {self.capacity}"
        return None

    @property
    def allocated(self) -> int:
        """Slots reserved by running requests."""
        return self.capacity - self.arena.num_free

    def admit(self, index: int, length: int, final_len: int) -> tuple[int, tuple[int, ...]]:
        """Reserve the request's slab: (slots, (start, size)), or (0, ()) if no gap fits."""
        size = self.arena.slab_size(final_len)
        if self.arena.largest_gap < size:
            return 0, ()
        slab = self.arena.admit(index, final_len, length)
        self.version += 1
        return slab.size, (slab.start, slab.size)

    def release(self, index: int, written: int) -> None:
        """Record the tokens written since admission (the arena checks they fit), then free."""
        self.arena.append(index, written)
        self.arena.free(index)
        self.version += 1

    def fragmentation(self, length: int, final_len: int) -> tuple[int, int, bool]:
        """For a waiting request: the slots it needs, the free slots in gaps too small for
        them, and whether free space in total would hold them while no single gap does."""
        need = self.arena.slab_size(final_len)
        stranded = self.arena.stranded(final_len)
        return need, stranded, self.arena.num_free >= need > self.arena.largest_gap


class _PagedMemory:
    """The step loop's view of a paged pool: the serving core's KV-cache manager
    (``course_lib.scheduler.kv_manager``; with prefix caching, :class:`_HashedAtPreemption`)
    over a pool without K/V storage.

    Sequences are named by trace request id. A request's manager length is brought up to
    date only at its events (admission: its length plus the step's token; each new block:
    the first token that needs it), never per token. With prefix caching, a request's
    token ids are its positions (0, 1, 2, ...) and its cache salt names it, so the real
    hash chain (``course_lib.prefix_cache.block_hashes``) lets only the request itself
    find its blocks; they get their hashes when it is preempted.
    """

    def __init__(self, config: SimConfig) -> None:
        pool_type = PrefixCachingBlockPool if config.prefix_caching else BlockPool
        pool = pool_type(config.num_blocks, config.block_size, free_order=config.free_order)
        self.manager = _HashedAtPreemption(pool) if config.prefix_caching else kv_manager(pool)
        self.pool = pool
        self.block_size = config.block_size
        self.usable = config.num_blocks - 1
        self.capacity = self.usable * config.block_size
        self.hashes: dict[int, list[BlockHash]] = {}  # prefix caching: per request
        self.tracked: set[int] = set()  # sequences added with token ids (resumed on a hit)
        self.version = 0

    def reject_reason(self, final_len: int) -> str | None:
        """Why a request ending at ``final_len`` tokens can never run, or None."""
        need = -(-final_len // self.block_size)
        if need > self.usable:
            return f"needs {need} blocks of {self.block_size}, the pool has {self.usable}"
        return None

    @property
    def allocated(self) -> int:
        """Slots in blocks held by running requests."""
        return (self.usable - self.pool.num_free) * self.block_size

    def admit(self, request: int, length: int, final_len: int,
              hit: Sequence[int] = ()) -> tuple[int, tuple[int, ...]]:
        """Add the sequence with room for ``length + 1`` tokens: (slots, block ids), or
        (0, ()) if too few blocks are free. ``hit`` are the cached blocks
        :meth:`cached_prefix` found (free, so they count against the free blocks); the
        manager finds them again through the sequence's token ids and takes them first."""
        need = (length + self.block_size) // self.block_size
        if need > self.pool.num_free:
            return 0, ()
        seq = str(request)
        if hit:
            assert isinstance(self.manager, PrefixCachingKVManager)
            found = self.manager.add_sequence(seq, token_ids=range(length),
                                              cache_salt=_salt(request))
            if found != len(hit) * self.block_size:
                raise RuntimeError(f"request {request}: the manager found {found} cached "
                                   f"tokens, the lookup {len(hit)} blocks; this is a bug")
            self.manager.append_tokens(seq, token_ids=[length])
            self.tracked.add(request)
        else:
            self.manager.add_sequence(seq, length + 1)
        self.version += 1
        return need * self.block_size, self.manager.block_table(seq)

    def cache(self, request: int, length: int) -> int:
        """Prefix caching, before a preemption: give the request's full blocks (of
        ``length`` tokens written) their hashes; return how many."""
        full = length // self.block_size
        hashes = self.hashes[request] = block_hashes(
            range(full * self.block_size), self.block_size, cache_salt=_salt(request),
            known=self.hashes.get(request, ()))
        table = self.manager.block_table(str(request))
        for k in range(full):
            self.pool.cache_block(table[k], hashes[k])
        return full

    def cached_prefix(self, request: int, length: int) -> list[int]:
        """Prefix caching: the leading blocks of a request resuming at ``length`` tokens
        still in the cache, leaving at least its last token to compute."""
        hashes = self.hashes.get(request)
        if not hashes:
            return []
        return self.pool.longest_cached_prefix(hashes[: (length - 1) // self.block_size])

    def grow(self, request: int) -> bool:
        """Extend the sequence to the first token of a new block; False (nothing changed)
        when the pool is empty."""
        length = self.manager.seq_len(str(request))
        try:
            self.extend(request, -(-length // self.block_size) * self.block_size + 1 - length)
        except OutOfBlocks:
            return False
        return True

    def last_block(self, request: int) -> int:
        """The id of the request's last block."""
        return self.manager.block_table(str(request))[-1]

    def extend(self, request: int, count: int) -> None:
        """Append ``count`` tokens to the request's sequence (positions as token ids when
        the manager tracks its tokens)."""
        seq = str(request)
        if request in self.tracked:
            length = self.manager.seq_len(seq)
            self.manager.append_tokens(seq, token_ids=range(length, length + count))
        else:
            self.manager.append_tokens(seq, count)

    def release(self, request: int, written: int) -> None:
        """Free the request's blocks, last block first (``written`` is not needed here)."""
        self.manager.free_sequence(str(request))
        self.tracked.discard(request)
        self.version += 1

    def fragmentation(self, length: int, final_len: int) -> tuple[int, int, bool]:
        """For a waiting request: the slots of the blocks it needs, and no external
        fragmentation, since any free block fits any request."""
        return (length + self.block_size) // self.block_size * self.block_size, 0, False


class _HashedAtPreemption(PrefixCachingKVManager):
    """The prefix-caching manager, except that a sequence's full blocks get their hashes
    only when the simulator preempts it (:meth:`_PagedMemory.cache`), not as they fill.

    The simulator's requests share nothing, so a finished request's blocks could never be
    found again; hashing them anyway (as vLLM does) would queue them at the back of the
    free queue with the victims' caches and change which cached blocks are evicted first
    (on the support-chat study: 111,440 tokens found in 224 of 350 resumptions instead of
    113,312 in 230, chapter 05's figures)."""

    def _cache_full_blocks(self, seq_id: str) -> None:
        """Hash nothing as blocks fill (see the class)."""


def _salt(request: int) -> str:
    """The cache salt of trace request ``request``: only the request finds its blocks."""
    return f"simulated request {request}"


def simulate(requests: Iterable[Request], config: SimConfig | None = None, *,
             record: Recording = "off", progress: bool = False) -> SimResult:
    """Run the trace to completion under ``config`` and return its metrics.

    ``record="steps"`` keeps a per-step :class:`SimTimeline`; ``"full"`` also keeps every
    allocation event (about 70,000 for the 3,000-chat paged run) so
    :meth:`SimResult.arena_at` and :meth:`SimResult.pool_at` can redraw any step.
    Requests that could never run, even alone (longer than ``max_len`` or than the whole
    memory), are rejected, counted and listed in ``rejections``. ``progress`` shows a bar
    of tokens decoded (worth it on runs slower than a couple of seconds).
    """
    config = config or SimConfig()
    if record not in RECORDINGS:
        raise ValueError(f"unknown record {record!r}; expected one of {', '.join(RECORDINGS)}")
    trace = validate_trace(requests)
    if not trace:
        raise ValueError("simulate needs at least one request")
    check_trace_size(trace)
    return _Run(trace, config, record, progress).result()


def simulate_many(requests: Iterable[Request], configs: Iterable[SimConfig], *,
                  progress: bool = True) -> list[SimResult]:
    """Simulate the same trace under each config (a sweep), with a progress bar."""
    trace = validate_trace(requests)
    configs = list(configs)
    return [simulate(trace, config) for config in tqdm(configs, disable=not progress,
                                                       desc="simulations", leave=False)]


class _Run:
    """The state of one simulation; ``result`` runs the step loop."""

    def __init__(self, trace: list[Request], config: SimConfig, record: Recording,
                 progress: bool) -> None:
        self.trace, self.config, self.record, self.progress = trace, config, record, progress
        self.memory = (_PagedMemory(config) if config.allocator == "paged"
                       else _SlabMemory(config))
        self.scheduler = Scheduler(config.scheduler, trace)
        n = len(trace)
        self.ids = [r.id for r in trace]  # the memory names requests by trace id
        self.prompt = [r.prompt_len for r in trace]
        self.final = [r.total_len for r in trace]
        self.generated = [0] * n          # tokens generated before the current admission
        self.len0 = [0] * n               # KV length at the current admission
        self.t0 = [0] * n                 # step of the current admission
        self.slots = [0] * n              # slots held now
        self.internal = [0] * n           # of those, slots past the final length
        self.finish = [-1] * n            # step of the last token (-1: not running)
        self.next_grow = [-1] * n         # step the next block is needed (-1: never)
        self.admission = [0] * n          # admission number, the order of block claims
        self.admissions = 0
        self.first_step = [-1] * n
        self.done_step = [-1] * n
        self.stalls: list[tuple[int, int, int]] = []  # (request, preempted at, resumed at)
        self.preempted_at = [-1] * n
        self.preemptions = 0
        self.recomputed = 0
        self.reused = 0  # prefix caching: tokens resumed requests found cached
        self.swapped_bytes = 0
        self.step_swapped = [0, 0]  # blocks and bytes moved in the current step
        self.sum_len = 0
        self.sum_internal = 0
        self.grow_at: dict[int, list[int]] = {}
        self.finish_at: dict[int, list[int]] = {}
        self.events: list[Event] | None = [] if record == "full" else None
        self.swap = None
        if config.scheduler.preemption == "swap" and config.allocator == "paged":
            capacity = config.scheduler.swap_space_blocks
            self.swap = SwapSpace(config.num_blocks - 1 if capacity is None else capacity)
        self.rejections: dict[int, str] = {}
        for request in trace:
            reason = (f"needs {request.total_len} tokens, above max_len={config.max_len}"
                      if request.total_len > config.max_len
                      else self.memory.reject_reason(request.total_len))
            if reason is not None:
                self.rejections[request.id] = reason

    # --- events ------------------------------------------------------------------------------

    def _log(self, step: int, kind: EventKind, i: int, length: int,
             where: tuple[int, ...] = (), cached: int = 0) -> None:
        if self.events is not None:
            self.events.append(Event(step, kind, self.trace[i].id, length, where, cached))

    def _admit(self, i: int, t: int, length: int, hit: list[int]) -> bool:
        """Give request ``i`` memory for ``length + 1`` tokens at step ``t``, taking back the
        cached blocks ``hit`` first; False if there is not enough."""
        rid = self.trace[i].id
        slots, where = (self.memory.admit(rid, length, self.final[i], hit) if hit
                        else self.memory.admit(rid, length, self.final[i]))
        if not slots:
            return False
        self.scheduler.admit_next()
        self.len0[i], self.t0[i], self.slots[i] = length, t, slots
        self.internal[i] = max(0, slots - self.final[i])
        self.sum_internal += self.internal[i]
        self.sum_len += length
        self.admissions += 1
        self.admission[i] = self.admissions
        finish = t + self.final[i] - length - 1
        self.finish[i] = finish
        self.finish_at.setdefault(finish, []).append(i)
        grow = t + slots - length
        self.next_grow[i] = grow if grow <= finish else -1
        if grow <= finish:
            self.grow_at.setdefault(grow, []).append(i)
        if self.first_step[i] < 0:
            self.first_step[i] = t
        self._log(t, "admit", i, length, where, len(hit))
        return True

    def _preempt(self, i: int, t: int) -> None:
        """Push request ``i`` out at step ``t``: free its memory, keep what it generated."""
        length = self.len0[i] + t - self.t0[i]
        self.generated[i] = length - self.prompt[i]
        cached = 0
        if self.swap is not None and self.swap.swap_out(i, self.slots[i] // self.config.block_size):
            self._count_swap(self.slots[i])
        elif self.config.prefix_caching:
            cached = self.memory.cache(self.trace[i].id, length)
        self.memory.release(self.trace[i].id, length - self.len0[i])
        self.scheduler.stop(i)
        self.scheduler.requeue(i)
        self.sum_len -= length
        self.sum_internal -= self.internal[i]
        self.finish[i] = self.next_grow[i] = -1
        self.preemptions += 1
        self.preempted_at[i] = t
        self._log(t, "preempt", i, length, cached=cached)

    def _count_swap(self, slots: int) -> None:
        """Add one transfer of ``slots`` token slots (in either direction) to the step."""
        moved = slots * self.config.bytes_per_token
        self.swapped_bytes += moved
        self.step_swapped[0] += slots // self.config.block_size
        self.step_swapped[1] += moved

    def _finish(self, i: int, t: int) -> None:
        """Request ``i`` wrote its last token at step ``t``: free its memory."""
        self.memory.release(self.trace[i].id, self.final[i] - self.len0[i])
        self.scheduler.stop(i)
        self.sum_len -= self.final[i]
        self.sum_internal -= self.internal[i]
        self.finish[i] = self.next_grow[i] = -1
        self.done_step[i] = t
        self._log(t, "finish", i, self.final[i])

    # --- the loop ----------------------------------------------------------------------------

    def _grow(self, t: int) -> bool:
        """Step ``t``'s claims for new blocks, oldest admission first; True if any request
        was preempted. The hot path of a paged run, hence the local names."""
        needs = self.grow_at.pop(t, None)
        if not needs:
            return False
        if len(needs) > 1:
            needs.sort(key=self.admission.__getitem__)
        grow, next_grow, slots, final, ids = (self.memory.grow, self.next_grow, self.slots,
                                              self.final, self.ids)
        grow_at, finish, events = self.grow_at, self.finish, self.events
        size = self.config.block_size
        preempted = False
        for i in needs:
            if next_grow[i] != t:
                continue  # preempted earlier in this step
            if not grow(ids[i]):  # the pool is empty: the scheduler's shared preemption loop
                claimed = [False]

                def fits(i: int = i, claimed: list[bool] = claimed) -> bool:
                    claimed[0] = grow(ids[i])
                    return claimed[0]

                self.scheduler.preempt_until(i, fits, lambda victim: self._preempt(victim, t))
                preempted = True
                if not claimed[0]:
                    continue
            held = slots[i] = slots[i] + size
            if held > final[i]:
                self.internal[i] = held - final[i]
                self.sum_internal += held - final[i]
            if events is not None:
                self._log(t, "grow", i, self.len0[i] + t - self.t0[i],
                          (self.memory.last_block(ids[i]),))
            if t + size <= finish[i]:
                next_grow[i] = t + size
                grow_at.setdefault(t + size, []).append(i)
            else:
                next_grow[i] = -1
        return preempted

    def _admit_waiting(self, t: int) -> int:
        """Admit waiting requests at step ``t``; return the tokens prefilled."""
        scheduler = self.scheduler
        step_tokens = len(scheduler.running)
        prefilled = 0
        while scheduler.num_waiting:
            i = scheduler.next_waiting()
            resumed = self.preempted_at[i] >= 0
            resumed_by_swap = self.swap is not None and self.swap.holds(i)
            length = self.prompt[i] + self.generated[i]
            hit: list[int] = []
            if self.config.prefix_caching and resumed and not resumed_by_swap:
                hit = self.memory.cached_prefix(self.trace[i].id, length)
            computed = (tokens_to_recompute(length, len(hit), self.config.block_size)
                        if hit else length)
            cost = 1 if resumed_by_swap else computed
            if not scheduler.admits(cost, step_tokens) or not self._admit(i, t, length, hit):
                break
            step_tokens += cost
            if resumed:
                self.stalls.append((i, self.preempted_at[i], t))
                self.preempted_at[i] = -1
                if resumed_by_swap:
                    self._count_swap(self.swap.swap_in(i) * self.config.block_size)
                else:
                    self.recomputed += computed
                    self.reused += length - computed
                    prefilled += computed
            else:
                prefilled += length
        return prefilled

    def _stuck(self, t: int) -> None:
        """Raise if step ``t`` runs nothing although a request waits: with nothing running
        and nothing preempted, the next step would be the same, forever. Rejecting up front
        the requests that cannot run alone makes this unreachable; it guards the loop."""
        head = self.scheduler.next_waiting()
        if head is not None:
            request = self.trace[head]
            raise RuntimeError(
                f"step {t}: request {request.id} ({request.total_len} tokens) waits but cannot "
                f"be admitted into an idle server; it can never run under {self.config}")

    def result(self) -> SimResult:
        """Run every request to completion and gather the metrics."""
        trace, scheduler = self.trace, self.scheduler
        order = sorted((i for i, r in enumerate(trace) if r.id not in self.rejections),
                       key=lambda i: (trace[i].arrival, i))
        if not order:
            rid, reason = next(iter(self.rejections.items()))
            raise ValueError(f"every request was rejected, e.g. request {rid}: {reason}")
        arrivals = deque(order)
        remaining = len(order)
        acc = _Accumulator(self)
        bar = tqdm(total=sum(trace[i].output_len for i in order), disable=not self.progress,
                   unit="tok", desc=f"simulate {self.config.allocator}", leave=False)
        t = 0
        while remaining:
            while arrivals and trace[arrivals[0]].arrival <= t:
                scheduler.arrive(arrivals.popleft())
            if not scheduler.running and not scheduler.num_waiting:  # idle until the next
                acc.idle(trace[arrivals[0]].arrival - t)
                t = trace[arrivals[0]].arrival
                continue
            preemptions_before = self.preemptions
            self.step_swapped = [0, 0]
            preempted = self._grow(t)
            prefilled = 0 if preempted else self._admit_waiting(t)
            batch = len(scheduler.running)
            if not batch and not preempted:
                self._stuck(t)
            self.sum_len += batch
            acc.step(batch, prefilled, self.preemptions - preemptions_before)
            for i in self.finish_at.pop(t, ()):
                if self.finish[i] == t:
                    self._finish(i, t)
                    remaining -= 1
            if batch and t % 256 == 0:
                bar.update(acc.output - bar.n)
            t += 1
        bar.update(acc.output - bar.n)
        bar.close()
        return acc.result(order)


class _Accumulator:
    """Per-step sums of one run (and its timeline), turned into a :class:`SimResult`."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.capacity = run.memory.capacity
        self.columns: dict[str, list[int]] | None = None if run.record == "off" else {
            name: [] for name in ("batch", "used", "reserved", "internal", "free",
                                  "stranded", "waiting", "next_need", "preemptions")}
        self.cuts: list[int] = []
        self.step_seconds: list[float] = []
        self.output = self.steps = self.peak = 0
        self.used = self.allocated = self.internal = 0
        self.waiting_steps = self.batch_while_waiting = self.stranded = self.no_gap_steps = 0
        self.empty_while_waiting = 0
        self._fragmentation_key: tuple[int, int] | None = None
        self._fragmentation = (0, 0, False)

    def step(self, batch: int, prefilled: int, preempted: int) -> None:
        """Take the metrics of the step being decoded now."""
        run = self.run
        memory, used = run.memory, run.sum_len
        allocated = memory.allocated
        waiting = run.scheduler.num_waiting
        if batch:
            self.steps += 1
            self.output += batch
            self.peak = max(self.peak, batch)
            self.used += used
            self.allocated += allocated
            self.internal += run.sum_internal
        need = stranded = 0
        if waiting:
            head = run.scheduler.next_waiting()
            key = (head, memory.version)
            if key != self._fragmentation_key:  # the arena or the head changed
                self._fragmentation_key = key
                self._fragmentation = memory.fragmentation(
                run.prompt[head] + run.generated[head], run.final[head])
            need, stranded, no_gap = self._fragmentation
            self.waiting_steps += 1
            self.batch_while_waiting += batch
            self.stranded += stranded
            self.no_gap_steps += no_gap
            self.empty_while_waiting += allocated - used
        self.step_seconds.append(run.config.costs.step_time(
            used * run.config.bytes_per_token, prefilled, *run.step_swapped))
        if self.columns is not None:
            for name, value in (
                    ("batch", batch), ("used", used),
                    ("reserved", allocated - used - run.sum_internal),
                    ("internal", run.sum_internal), ("free", self.capacity - allocated),
                    ("stranded", stranded), ("waiting", waiting), ("next_need", need),
                    ("preemptions", preempted)):
                self.columns[name].append(value)
            if run.events is not None:
                self.cuts.append(len(run.events))

    def idle(self, steps: int) -> None:
        """``steps`` steps with nothing to run, waiting for the next arrival."""
        self.step_seconds.extend([self.run.config.costs.step_time(0, 0, 0, 0)] * steps)
        if self.columns is not None:
            for name, values in self.columns.items():
                values.extend([self.capacity if name == "free" else 0] * steps)
            if self.run.events is not None:
                self.cuts.extend([len(self.run.events)] * steps)

    def result(self, order: list[int]) -> SimResult:
        """The run's metrics over the requests in ``order`` (those not rejected)."""
        run, config = self.run, self.run.config
        trace = run.trace
        end = np.cumsum(self.step_seconds)
        start = end - np.asarray(self.step_seconds)
        arrival = start[[trace[i].arrival for i in order]]
        ttft = end[[run.first_step[i] for i in order]] - arrival
        latency = end[[run.done_step[i] for i in order]] - arrival
        stall: dict[int, float] = {}
        for i, preempted, resumed in run.stalls:
            stall[i] = stall.get(i, 0.0) + float(start[resumed] - start[preempted])
        prompt = sum(trace[i].prompt_len for i in order)
        slot_steps = self.steps * self.capacity
        waiting_slot_steps = max(1, self.waiting_steps * self.capacity)
        seconds = float(end[-1])
        timeline = None
        if self.columns is not None:
            timeline = SimTimeline(
                **{name: np.asarray(values) for name, values in self.columns.items()},
                events=tuple(run.events or ()),
                cuts=np.asarray(self.cuts) if run.events is not None else None)
        return SimResult(
            allocator=config.allocator,
            block_size=config.block_size if config.allocator == "paged" else None,
            kv_tokens=self.capacity,
            requests=len(order),
            rejected=len(run.rejections),
            steps=self.steps,
            output_tokens=self.output,
            prompt_tokens=prompt,
            avg_batch=self.output / self.steps,
            avg_batch_while_waiting=(self.batch_while_waiting / self.waiting_steps
                                     if self.waiting_steps else 0.0),
            peak_batch=self.peak,
            utilization=self.used / self.allocated,
            used_share=self.used / slot_steps,
            reserved_share=(self.allocated - self.used - self.internal) / slot_steps,
            internal_share=self.internal / slot_steps,
            free_share=1.0 - self.allocated / slot_steps,
            stranded_share=self.stranded / waiting_slot_steps,
            no_gap_steps=self.no_gap_steps,
            reserved_empty_share=self.empty_while_waiting / waiting_slot_steps,
            last_block_unused=((self.allocated - self.used) / self.output
                               if config.allocator == "paged" else None),
            preemptions=run.preemptions,
            preempted_requests=len(stall),
            recomputed_tokens=run.recomputed,
            recomputed_share=run.recomputed / (prompt + self.output + run.recomputed),
            swapped_bytes=run.swapped_bytes,
            seconds=seconds,
            cost_per_million_tokens=(config.costs.price_per_hour * seconds / 3600
                                     / self.output * 1e6),
            throughput=self.output / seconds,
            p50_ttft=float(np.percentile(ttft, 50)),
            p99_ttft=float(np.percentile(ttft, 99)),
            p50_latency=float(np.percentile(latency, 50)),
            p99_latency=float(np.percentile(latency, 99)),
            avg_stall=sum(stall.values()) / len(stall) if stall else 0.0,
            config=config,
            rejections=dict(run.rejections),
            trace=tuple(trace),
            timeline=timeline,
            reused_tokens=run.reused,
        )
