"""The decode-step simulator: replay a trace against one KV allocator and measure the waste.

The model is the source guide's. Each step is one decode iteration in which every running
request writes one token; prefill is free (admitting a request adds no step). Inside step
``t``, in this order:

1. **claim**: each running request whose slots are all written claims more (under paging,
   one block), most protected first (``Scheduler.claim_order``: oldest admission first under
   FCFS). When the pool is empty the scheduler names a victim (``course_lib.scheduler``),
   whose memory is freed, until the claim succeeds or the claimant is itself the victim.
   Contiguous slabs never grow: they reserve up front.
2. **admit**: unless something was preempted in this step (vLLM's rule, so a freed request
   is not readmitted at once), waiting requests are admitted in queue order while the next
   one fits and the scheduler's limits allow; strict order, so a request that does not fit
   blocks those behind it. A request is admitted with room for its current length plus the
   token this step writes, and charges the step's token budget both.
3. **decode**: every running request writes one token. The step's metrics are taken here.
4. **finish**: requests that wrote their last token free their memory.

Paged runs are not scheduled here: the lazy serving core
(``course_lib.lazy_serving.LazyServingCore``) does it, over a pool without K/V storage, with
the rules of the core chapter 07's engine runs on (``course_lib.serving``); a request costs
work only when it is admitted, claims a block, is preempted or finishes, never per token,
so 3,000 chats take well under a second. A trace request of ``P``
prompt and ``O`` output tokens is, to the core, a prompt of ``P + 1`` tokens (the guide's
free prefill and the token its admission step writes) with ``max_tokens=O``, which gives
the guide's K/V lengths step by step. Contiguous runs keep the guide's simple loop
(:class:`_SlabRun`): a slab never grows, so nobody is preempted.

Prefix caching (``SimConfig(prefix_caching=True)``, off by default) is the core's, which is
vLLM's: every block is hashed as it fills (``course_lib.prefix_cache``), a freed block keeps
its hash at the back of the free queue until it is handed out again, and a request resumed
by recompute takes back the leading blocks nobody has reused since, computing at least the
token its step writes. The simulator knows lengths, not token ids, so a request's token ids
are its positions and its id is its cache salt: only the request itself can find its
blocks, and running requests never share one (sharing is chapter 04's). Admission is
unchanged (a cached free block is still a free block), so the schedule changes only where
a token budget sees the tokens no longer prefilled; a cost model's times change too.

Hybrid models (chapter 08: ``SimConfig(model=...)``, built with :meth:`SimConfig.for_model`)
are scheduled by the hybrid serving core (``course_lib.hybrid_serving``): each request holds
a block table per KV-cache group, all drawing on one pool of one page size, and a window
group hands back the blocks its window has passed. The requests are the paged run's, the
core runs in eager mode (every decode reaches the manager every step, so a step costs work
for every running request), and preemption is by recompute. A slot is one token of one
group's page: the pool has ``blocks x block_size`` of them, and a request of L tokens holds
L in each full group and fewer in a window group. With every layer full (one group) a run
is exactly the paged run. A hybrid run keeps per-step timelines (``record="steps"``) but no
allocation events, so ``record="full"`` and :meth:`SimResult.pool_at` are refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from course_lib.cache_config import CacheConfig
from course_lib.hybrid_serving import HybridServingCore
from course_lib.kv_math import DTYPE_BYTES, GIB, MODELS, HybridModel
from course_lib.lazy_serving import LazyServingCore
from course_lib.limits import MAX_POOL_BLOCKS
from course_lib.paged import BlockPool, FreeOrder
from course_lib.scheduler import Scheduler, SchedulerConfig
from course_lib.serving import BaseServingCore, Chunk, Sample, Schedule, ServingRequest
from course_lib.slab import FITS, Fit, SlabAllocator
from course_lib.snapshot import PoolSnapshot
from course_lib.validate import (
    check_at_most,
    check_int,
    check_non_negative_number,
    check_positive_number,
    describe,
)
from course_lib.workload import Request, check_open_trace, check_trace_size, validate_trace

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

    ``model`` (paged only, recompute preemption only) serves a hybrid model
    (``course_lib.kv_math.HybridModel``, chapter 08): each request holds a block table per
    KV-cache group, all drawing on one pool whose page is ``model.block_bytes(block_size)``.
    A slot is then one token of one group's page, so ``bytes_per_token`` must be that
    page over ``block_size`` (``model.block_bytes(1, dtype)``): :meth:`for_model` sets it.
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
    model: HybridModel | None = field(default=None, repr=False)

    @classmethod
    def for_model(cls, model: HybridModel, dtype: str = "fp16", **kwargs: Any) -> SimConfig:
        """A paged server for the hybrid ``model`` with its K/V in ``dtype``: ``kwargs`` are
        the other fields; ``bytes_per_token`` is one token of one group's page."""
        if not isinstance(model, HybridModel):
            raise ValueError(f"model must be a HybridModel, got {describe(model)}")
        return cls(model=model, bytes_per_token=model.block_bytes(1, dtype), **kwargs)

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
        if self.prefix_caching and self.allocator != "paged":
            raise ValueError(f"prefix caching needs the paged allocator, got "
                             f"allocator={self.allocator!r}")
        self.scheduler.check_max_len(self.max_len)
        if self.model is not None:
            self._check_model()
        if self.allocator == "paged":
            if self.num_blocks < 2:
                raise ValueError(f"a budget of {self.budget_bytes} bytes holds {self.num_blocks} "
                                 f"blocks of {self.block_size} tokens; the pool needs at least 2")
            check_at_most("the pool's blocks (budget_bytes // (bytes_per_token x block_size))",
                          self.num_blocks, MAX_POOL_BLOCKS,
                          "lower budget_bytes or raise block_size")
            self.cache_config()  # checks the cache's own options
        elif self.kv_tokens < 1:
            raise ValueError(f"a budget of {self.budget_bytes} bytes holds no token")

    def _check_model(self) -> None:
        """Refuse a hybrid model the simulator does not model, or a slot of the wrong size."""
        model = self.model
        if not isinstance(model, HybridModel):
            raise ValueError(f"model must be a HybridModel or None, got {describe(model)}")
        if self.allocator != "paged":
            raise ValueError(f"a hybrid model needs the paged allocator, got "
                             f"allocator={self.allocator!r}")
        if self.scheduler.preemption != "recompute":
            raise ValueError(f"a hybrid model is simulated with preemption='recompute' only "
                             f"(the hybrid serving core's), got "
                             f"preemption={self.scheduler.preemption!r}")
        slots: dict[int, list[str]] = {}
        for dtype in DTYPE_BYTES:
            slots.setdefault(model.block_bytes(1, dtype), []).append(dtype)
        if self.bytes_per_token not in slots:
            sizes = ", ".join(f"{size} ({'/'.join(names)})" for size, names in slots.items())
            raise ValueError(f"bytes_per_token={self.bytes_per_token} is not one token of one "
                             f"KV-cache group's page of {model.name} ({sizes}); build the "
                             f"config with SimConfig.for_model")

    @property
    def kv_tokens(self) -> int:
        """Token slots in the budget (the contiguous arena's size)."""
        return self.budget_bytes // self.bytes_per_token

    @property
    def num_blocks(self) -> int:
        """Blocks in the paged pool, the null block included."""
        return self.budget_bytes // (self.bytes_per_token * self.block_size)

    def cache_config(self) -> CacheConfig:
        """The paged pool's cache: its blocks, block size, prefix caching and eviction
        order (``make_pool`` builds it)."""
        return CacheConfig(self.num_blocks, self.block_size, self.prefix_caching,
                           self.free_order)


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
(in :meth:`SimResult.as_dict` and the command line) only for runs with prefix caching.

With a hybrid model (``SimConfig.model``) a slot is one token of one KV-cache group's page:
``kv_tokens`` is the pool's blocks x ``block_size``, the shares and ``utilization`` count
slots across all groups (a window group holds only the blocks its window still reads),
``last_block_unused`` sums the empty slots of a request's last block in every group, and a
cost model reads every token held, in every group."""


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
        arena = SlabMemory(config).arena
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
        """The paged pool as it was at ``step``'s decode: the run repeated up to that step
        (it is deterministic) and the serving core's KV-cache manager snapshotted, which
        gives each block's fill, owner, prefix-cache hash and what happened to it in that
        step; paged runs with ``record="full"`` only."""
        config = self.config
        if config.allocator != "paged":
            raise ValueError("pool_at is for the paged allocator; use arena_at")
        if config.model is not None:
            raise ValueError("pool_at is not modelled for a hybrid model's run")
        self._events_until(step)  # checks the run kept its events and the step exists
        run = _PagedRun(list(self.trace), config, "off", progress=False)
        run.run_until(step)
        return run.core.manager.snapshot(label=f"step {step}")


class SlabMemory:
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


class PagedMemory:
    """The metrics' view of a paged pool (the serving core's): how much of it requests
    hold, and why a request could never fit."""

    def __init__(self, config: SimConfig, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = config.block_size
        self.usable = config.num_blocks - 1
        self.capacity = self.usable * config.block_size
        self.version = 0  # the fragmentation of a paged pool never changes

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

    def fragmentation(self, length: int, final_len: int) -> tuple[int, int, bool]:
        """For a waiting request: the slots of the blocks it needs, and no external
        fragmentation, since any free block fits any request."""
        return (length + self.block_size) // self.block_size * self.block_size, 0, False


class HybridMemory(PagedMemory):
    """The metrics' view of a pool shared by ``groups`` KV-cache groups: a request holds
    blocks in every group, and a slot is one token of one group's page."""

    def __init__(self, config: SimConfig, pool: BlockPool, groups: int) -> None:
        super().__init__(config, pool)
        self.groups = groups

    def reject_reason(self, final_len: int) -> str | None:
        """Why a request ending at ``final_len`` tokens can never run, or None: recomputed
        at that length, it holds the whole sequence in every group for a step (the hybrid
        serving core's ``check_fits``)."""
        need = self.groups * -(-final_len // self.block_size)
        if need > self.usable:
            return (f"needs {need} blocks of {self.block_size} ({self.groups} KV-cache "
                    f"groups), the pool has {self.usable}")
        return None

    def fragmentation(self, length: int, final_len: int) -> tuple[int, int, bool]:
        """For a waiting request: the slots of the blocks its admission takes in all groups
        (each holds the whole prompt), and no external fragmentation."""
        need, stranded, no_gap = super().fragmentation(length, final_len)
        return self.groups * need, stranded, no_gap


class Positions:
    """A simulated sequence's token ids: its positions, 0, 1, 2, ... Only lengths matter to
    the simulator; a request's cache salt keeps its hashes its own. Stored as a length."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: int | slice) -> int | range:
        return range(self.length)[key]

    def append(self, token: int) -> None:
        """One more token (its id is its position whatever ``token`` says)."""
        self.length += 1

    def extend(self, tokens: Sequence[int]) -> None:
        """``len(tokens)`` more tokens."""
        self.length += len(tokens)


def simulate(requests: Iterable[Request], config: SimConfig | None = None, *,
             record: Recording = "off", progress: bool = False) -> SimResult:
    """Run the trace to completion under ``config`` and return its metrics.

    ``record="steps"`` keeps a per-step :class:`SimTimeline`; ``"full"`` also keeps every
    allocation event (about 70,000 for the 3,000-chat paged run) so
    :meth:`SimResult.arena_at` and :meth:`SimResult.pool_at` can redraw any step.
    Requests that could never run, even alone (longer than ``max_len`` or than the whole
    memory), are rejected, counted and listed in ``rejections``. ``progress`` shows a bar
    of tokens decoded (worth it on runs slower than a couple of seconds). A run with a
    hybrid model (``config.model``) keeps no events: ``record="full"`` is refused.
    """
    config = config or SimConfig()
    if record not in RECORDINGS:
        raise ValueError(f"unknown record {record!r}; expected one of {', '.join(RECORDINGS)}")
    trace = validate_trace(requests)
    if not trace:
        raise ValueError("simulate needs at least one request")
    check_trace_size(trace)
    check_open_trace(trace)
    if config.model is not None and record == "full":
        raise ValueError("record='full' (allocation events, pool_at) is for runs without a "
                         "hybrid model; use record='steps' with SimConfig.model")
    run_type: type[_Run] = (_SlabRun if config.allocator != "paged" else
                            _PagedRun if config.model is None else _HybridRun)
    return run_type(trace, config, record, progress).result()


def simulate_many(requests: Iterable[Request], configs: Iterable[SimConfig], *,
                  progress: bool = True) -> list[SimResult]:
    """Simulate the same trace under each config (a sweep), with a progress bar."""
    trace = validate_trace(requests)
    configs = list(configs)
    return [simulate(trace, config) for config in tqdm(configs, disable=not progress,
                                                       desc="simulations", leave=False)]


@dataclass(slots=True)
class _Tally:
    """One request's bookkeeping for the metrics (the serving core schedules it)."""

    generated: int = 0     # tokens generated before the current admission
    len0: int = 0          # KV length at the current admission
    t0: int = 0            # step of the current admission
    slots: int = 0         # slots held now
    internal: int = 0      # of those, slots past the final length
    first_step: int = -1
    done_step: int = -1
    preempted_at: int = -1


class ScheduleCounts:
    """What a paged run and a cluster's replica (``course_lib.cluster.Replica``) count from
    the serving core's schedules alike: preemptions, the tokens a resumed request
    recomputed or found still cached, and the blocks that crossed PCIe (swaps in either
    direction, copies back from a CPU tier), in the current step and in all. A contiguous
    run keeps them at zero."""

    def __init__(self, config: SimConfig) -> None:
        self.preemptions = self.recomputed = self.swapped_bytes = 0
        self.reused = 0  # prefix caching: tokens resumed requests found cached
        self.step_swapped = [0, 0]  # blocks and bytes moved in the current step
        self._block_size = config.block_size
        self._block_bytes = config.block_size * config.bytes_per_token

    def _count_swap(self, blocks: int) -> None:
        """Add one transfer of ``blocks`` blocks (in either direction) to the step."""
        moved = blocks * self._block_bytes
        self.swapped_bytes += moved
        self.step_swapped[0] += blocks
        self.step_swapped[1] += moved

    def _count_preemption(self, swapped_blocks: int | None) -> None:
        """One request pushed out (to swap space, if it took ``swapped_blocks``)."""
        self.preemptions += 1
        if swapped_blocks is not None:
            self._count_swap(swapped_blocks)

    def _count_admission(self, chunk: Chunk, schedule: Schedule, resumed: bool) -> int:
        """Count an admission's chunk (new, ``resumed`` after a preemption, or swapped in)
        and return the tokens it prefills (the step's own token excluded)."""
        if resumed:
            self.reused += len(chunk.hit or ()) * self._block_size
        swapped_in = schedule.swapped_in.get(chunk.request.request_id)
        prefilled = 0
        if swapped_in is not None:
            self._count_swap(swapped_in)
        else:
            prefilled = chunk.count - 1
            if resumed:
                self.recomputed += prefilled
        if chunk.loaded:
            self._count_swap(chunk.loaded)
        return prefilled


def rejected_requests(trace: Sequence[Request], max_len: int,
                      memory: SlabMemory | PagedMemory) -> dict[int, str]:
    """The requests that could never run, even alone (longer than ``max_len`` or than the
    whole ``memory``), and the later turns of their conversations (which never arrive; a
    cluster's trace only), each with its reason; raise if that is every request."""
    reasons: dict[int, str] = {}
    for request in trace:
        if request.follows is not None and request.follows in reasons:
            reasons[request.id] = f"follows rejected request {request.follows}"
        elif request.total_len > max_len:
            reasons[request.id] = f"needs {request.total_len} tokens, above max_len={max_len}"
        elif (reason := memory.reject_reason(request.total_len)) is not None:
            reasons[request.id] = reason
    if len(reasons) == len(trace):
        rid, reason = next(iter(reasons.items()))
        raise ValueError(f"every request was rejected, e.g. request {rid}: {reason}")
    return reasons


def core_request(request_id: int, request: Request) -> ServingRequest:
    """Trace ``request`` as a serving core runs it under ``request_id``: a prompt of
    ``P + 1`` tokens (the guide's free prefill and the token its admission step writes),
    its positions, with a cache salt of its own, and ``max_tokens=O``."""
    length = request.prompt_len + 1
    return ServingRequest(request_id, range(length), request.output_len, request.priority,
                          [Sample(str(request.id), Positions(length))],
                          cache_salt=f"simulated request {request.id}")


class _Run(ScheduleCounts):
    """The state of one simulation; ``result`` runs the step loop, and the subclasses
    schedule a step: :class:`_SlabRun` over a contiguous arena, :class:`_PagedRun` through
    the serving core. ``memory`` is the metrics' view of the run's memory; the requests
    it could never hold are rejected here."""

    def __init__(self, trace: list[Request], config: SimConfig, record: Recording,
                 progress: bool, memory: SlabMemory | PagedMemory) -> None:
        super().__init__(config)
        self.trace, self.config, self.record, self.progress = trace, config, record, progress
        self.memory = memory
        self.rejections = rejected_requests(trace, config.max_len, memory)
        self.prompt = [r.prompt_len for r in trace]
        self.final = [r.total_len for r in trace]
        self.tally = [_Tally() for _ in trace]
        self.stalls: list[tuple[int, int, int]] = []  # (request, preempted at, resumed at)
        self.sum_len = self.sum_internal = 0
        self.events: list[Event] | None = [] if record == "full" else None

    # --- the step, per memory ------------------------------------------------------------

    def _arrive(self, i: int) -> None:
        """Trace request ``i`` joins the queue."""
        raise NotImplementedError

    def _schedule(self, t: int) -> tuple[bool, int]:
        """Step ``t``'s claims, preemptions and admissions: (anyone preempted, tokens
        prefilled)."""
        raise NotImplementedError

    def _finish_step(self, t: int) -> int:
        """After step ``t``'s decode: free the requests that wrote their last token and
        return how many there were."""
        raise NotImplementedError

    def waiting_head(self) -> int | None:
        """The trace index of the request first in the waiting queue, or None."""
        raise NotImplementedError

    def _decoded(self, batch: int) -> None:
        """Step's decode, before its metrics are taken: each of the ``batch`` running
        requests wrote one token."""
        self.sum_len += batch

    # --- events shared by both ---------------------------------------------------------------

    def _log(self, step: int, kind: EventKind, i: int, length: int,
             where: tuple[int, ...] = (), cached: int = 0) -> None:
        if self.events is not None:
            self.events.append(Event(step, kind, self.trace[i].id, length, where, cached))

    def _admitted(self, i: int, t: int, length: int, where: tuple[int, ...], slots: int,
                  cached: int = 0) -> None:
        """Request ``i`` was admitted at step ``t`` at ``length`` tokens into ``slots``."""
        tally = self.tally[i]
        tally.len0, tally.t0, tally.slots = length, t, slots
        tally.internal = max(0, slots - self.final[i])
        self.sum_internal += tally.internal
        self.sum_len += length
        if tally.first_step < 0:
            tally.first_step = t
        if tally.preempted_at >= 0:
            self.stalls.append((i, tally.preempted_at, t))
            tally.preempted_at = -1
        self._log(t, "admit", i, length, where, cached)

    def _finished(self, i: int, t: int) -> None:
        """Request ``i`` wrote its last token at step ``t`` and left."""
        tally = self.tally[i]
        self.sum_len -= self.final[i]
        self.sum_internal -= tally.internal
        tally.done_step = t
        self._log(t, "finish", i, self.final[i])

    # --- the loop ----------------------------------------------------------------------------

    def _stuck(self, t: int) -> None:
        """Raise if step ``t`` runs nothing although a request waits: with nothing running
        and nothing preempted, the next step would be the same, forever. Rejecting up front
        the requests that cannot run alone makes this unreachable; it guards the loop."""
        head = self.waiting_head()
        if head is not None:
            request = self.trace[head]
            raise RuntimeError(
                f"step {t}: request {request.id} ({request.total_len} tokens) waits but cannot "
                f"be admitted into an idle server; it can never run under {self.config}")

    def result(self) -> SimResult:
        """Run every request to completion and gather the metrics."""
        acc, order = self._loop(None)
        return acc.result(order)

    def run_until(self, step: int) -> None:
        """Run up to step ``step``'s decode and stop there (for a snapshot)."""
        self._loop(step)

    def _loop(self, stop_at: int | None) -> tuple[_Accumulator, list[int]]:
        """The step loop (see the module), to the end or to ``stop_at``."""
        trace, scheduler = self.trace, self.scheduler
        order = sorted((i for i, r in enumerate(trace) if r.id not in self.rejections),
                       key=lambda i: (trace[i].arrival, i))
        arrivals = deque(order)
        remaining = len(order)
        acc = _Accumulator(self)
        bar = tqdm(total=sum(trace[i].output_len for i in order), disable=not self.progress,
                   unit="tok", desc=f"simulate {self.config.allocator}", leave=False)
        t = 0
        while remaining:
            while arrivals and trace[arrivals[0]].arrival <= t:
                self._arrive(arrivals.popleft())
            if not scheduler.running and not scheduler.num_waiting:  # idle until the next
                if stop_at is not None and stop_at < trace[arrivals[0]].arrival:
                    self._stop(decoded=False)
                    break
                acc.idle(trace[arrivals[0]].arrival - t)
                t = trace[arrivals[0]].arrival
                continue
            if t == stop_at:
                self._stop(decoded=False)
            preemptions_before = self.preemptions
            self.step_swapped = [0, 0]
            preempted, prefilled = self._schedule(t)
            batch = len(scheduler.running)
            if not batch and not preempted:
                self._stuck(t)
            self._decoded(batch)
            acc.step(batch, prefilled, self.preemptions - preemptions_before)
            if t == stop_at:
                self._stop(decoded=True)
                break
            remaining -= self._finish_step(t)
            if batch and t % 256 == 0:
                bar.update(acc.output - bar.n)
            t += 1
        bar.update(acc.output - bar.n)
        bar.close()
        return acc, order

    def _stop(self, decoded: bool) -> None:
        """Before (``decoded`` False) or after the decode of the step a snapshot shows."""
        raise ValueError("only paged runs are snapshotted")


class _SlabRun(_Run):
    """A contiguous arena: a request reserves its slab when admitted and never grows, so
    nobody is preempted; the guide's minimal step loop, with the scheduler's order."""

    def __init__(self, trace: list[Request], config: SimConfig, record: Recording,
                 progress: bool) -> None:
        super().__init__(trace, config, record, progress, SlabMemory(config))
        self.scheduler = Scheduler(config.scheduler, trace)
        self.finish_at: dict[int, list[int]] = {}

    def _arrive(self, i: int) -> None:
        self.scheduler.arrive(i)

    def waiting_head(self) -> int | None:
        return self.scheduler.next_waiting()

    def _schedule(self, t: int) -> tuple[bool, int]:
        """Admit waiting requests in queue order while the next one's slab fits and the
        limits allow (it prefills its prompt and writes the step's token)."""
        scheduler = self.scheduler
        step_tokens = len(scheduler.running)
        prefilled = 0
        while (i := scheduler.next_waiting()) is not None:
            length = self.prompt[i]
            if not scheduler.admits(length + 1, step_tokens):
                break
            slots, where = self.memory.admit(self.trace[i].id, length, self.final[i])
            if not slots:
                break
            scheduler.admit_next()
            step_tokens += length + 1
            prefilled += length
            self.finish_at.setdefault(t + self.final[i] - length - 1, []).append(i)
            self._admitted(i, t, length, where, slots)
        return False, prefilled

    def _finish_step(self, t: int) -> int:
        finished = self.finish_at.pop(t, ())
        for i in finished:
            self.memory.release(self.trace[i].id, self.final[i] - self.tally[i].len0)
            self.scheduler.stop(i)
            self._finished(i, t)
        return len(finished)


class _PagedRun(_Run):
    """A paged pool, scheduled by the lazy serving core (``course_lib.lazy_serving``) over
    a pool without K/V: the core decides who runs, who is admitted and who is
    preempted, and claims the blocks; this run turns what it did into the metrics.

    A trace request of ``P`` prompt and ``O`` output tokens is, to the core, a request of
    ``P + 1`` prompt tokens (the guide's free prefill plus the token its admission step
    writes) and ``max_tokens=O``: its K/V length is the guide's after every step, its last
    step the same, and its admission charges the step's budget its prompt plus that token.
    """

    def __init__(self, trace: list[Request], config: SimConfig, record: Recording,
                 progress: bool) -> None:
        core, memory = self._serve(config, config.cache_config().make_pool())
        super().__init__(trace, config, record, progress, memory)
        self.core, self.scheduler = core, core.scheduler
        self.index: list[int] = []  # the core's request id -> trace index
        self._pending: Schedule | None = None  # the step scheduled, not yet advanced

    @staticmethod
    def _serve(config: SimConfig, pool: BlockPool) -> tuple[BaseServingCore, PagedMemory]:
        """The core that schedules the run over ``pool``, and the metrics' view of it."""
        return LazyServingCore(config.scheduler, pool), PagedMemory(config, pool)

    def _arrive(self, i: int) -> None:
        self.core.add(core_request(len(self.index), self.trace[i]))
        self.index.append(i)

    def waiting_head(self) -> int | None:
        head = self.scheduler.next_waiting()
        return None if head is None else self.index[head]

    def _schedule(self, t: int) -> tuple[bool, int]:
        """The core's step ``t``, logged: preemptions, block claims, then admissions."""
        schedule = self._pending = self.core.schedule()
        for request_id in schedule.preempted:
            self._preempted(self.index[request_id], t, schedule.swapped_out.get(request_id))
        prefilled, size = 0, self.config.block_size
        for chunk in schedule.chunks:
            if chunk.decode:
                self._grew(t, chunk)
                continue
            i = self.index[chunk.request.request_id]
            length = chunk.start + chunk.count - 1  # the guide's: before the step's token
            prefilled += self._count_admission(chunk, schedule, self.tally[i].preempted_at >= 0)
            table = (() if self.events is None
                     else self.core.manager.block_table(chunk.sample.seq_id))
            self._admitted(i, t, length, table, -(-(length + 1) // size) * size,
                           len(chunk.hit or ()))
        return bool(schedule.preempted), prefilled

    def _grew(self, t: int, chunk: Chunk) -> None:
        """A decode ``chunk`` of step ``t``: its request took a block for its token at
        ``chunk.start`` (one block, not shared, so no copy)."""
        i = self.index[chunk.request.request_id]
        tally = self.tally[i]
        tally.slots += self.config.block_size
        if tally.slots > self.final[i]:
            grown = tally.slots - self.final[i] - tally.internal
            tally.internal += grown
            self.sum_internal += grown
        if self.events is not None:
            self._log(t, "grow", i, chunk.start,
                      self.core.manager.block_table(chunk.sample.seq_id)[-1:])

    def _preempted(self, i: int, t: int, swapped_blocks: int | None) -> None:
        """Request ``i`` was pushed out at step ``t`` (to swap space, if it took blocks)."""
        tally = self.tally[i]
        length = tally.len0 + t - tally.t0
        tally.generated = length - self.prompt[i]
        self._count_preemption(swapped_blocks)
        cached = length // self.config.block_size if self.config.prefix_caching else 0
        self.sum_len -= length
        self.sum_internal -= tally.internal
        tally.preempted_at = t
        self._log(t, "preempt", i, length, cached=cached)

    def _finish_step(self, t: int) -> int:
        core = self.core
        finished = core.retire(core.advance(self._pending))
        for request in finished:
            self._finished(self.index[request.request_id], t)
        return len(finished)

    def _stop(self, decoded: bool) -> None:
        """A snapshot shows only its step's events, and every length as of its token."""
        if decoded:
            self.core.advance(self._pending)
            self.core.sync_all()
        else:
            self.core.pool.take_events()


class _HybridRun(_PagedRun):
    """A hybrid model (``SimConfig.model``) on a paged pool, scheduled by the hybrid serving
    core (``course_lib.hybrid_serving``) over a pool without K/V, as :class:`_PagedRun` is
    by the plain one, with the same requests (``P + 1`` prompt tokens, ``max_tokens=O``).

    The core runs in eager mode: a window group hands back a block exactly when a decode
    moves past it, so every decode reaches the manager every step, and a step costs work
    for every running request (a lazy core touches a decode only when it needs a block).
    Slots are counted in every group: each step, the blocks the pool has handed out, less
    the slots not yet written in each running request's last block of each group (no two
    running requests share a block: one sample each, a cache salt of its own). The paged
    run's step is this run's, but for the slots: a tally counts one table's, and
    :meth:`_decoded` replaces its sums with every group's.
    """

    @staticmethod
    def _serve(config: SimConfig, pool: BlockPool) -> tuple[BaseServingCore, PagedMemory]:
        """The hybrid core, eager, over ``pool``, and the metrics' view of its groups."""
        assert config.model is not None
        windows = [group.window for group in config.model.kv_cache_groups()]
        core = HybridServingCore(config.scheduler, pool, windows, chunked_prefill=False)
        return core, HybridMemory(config, pool, len(windows))

    def _grew(self, t: int, chunk: Chunk) -> None:
        """A decode, which eager mode lists every step: :meth:`_decoded` counts its slots."""

    def _decoded(self, batch: int) -> None:
        """The step's slots in all groups: held (the pool's blocks in use) less those not
        yet written in the running requests' last blocks (``sum_len``), and of those the
        ones past a request's final length (``sum_internal``)."""
        size, groups = self.config.block_size, self.memory.groups
        manager, requests = self.core.manager, self.core.requests
        empty = internal = 0
        for index in self.scheduler.running:
            length = manager.seq_len(requests[index].samples[0].seq_id)
            empty += -length % size
            final = self.final[self.index[index]]
            if -(-length // size) == -(-final // size):  # it holds its last block
                internal += -final % size
        self.sum_len = self.memory.allocated - groups * empty
        self.sum_internal = groups * internal

    def _finish_step(self, t: int) -> int:
        core = self.core
        finished = 0
        for request, done in core.retire(core.advance(self._pending, _next_position)):
            if done:
                self._finished(self.index[request.request_id], t)
                finished += 1
        return finished


def _next_position(_index: int, request: ServingRequest, sample: Sample) -> None:
    """An eager core's draw for a simulated sample: its next token is its position."""
    request.append_token(sample, len(sample.tokens), ())


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
        self._fragmentation_key: tuple[int, int, int] | None = None
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
            head = run.waiting_head()
            length = run.prompt[head] + run.tally[head].generated
            key = (head, length, memory.version)
            if key != self._fragmentation_key:  # the arena or the head changed
                self._fragmentation_key = key
                self._fragmentation = memory.fragmentation(length, run.final[head])
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
        ttft = end[[run.tally[i].first_step for i in order]] - arrival
        latency = end[[run.tally[i].done_step for i in order]] - arrival
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
            **percentiles("ttft", ttft),
            **percentiles("latency", latency),
            avg_stall=sum(stall.values()) / len(stall) if stall else 0.0,
            config=config,
            rejections=dict(run.rejections),
            trace=tuple(trace),
            timeline=timeline,
            reused_tokens=run.reused,
        )


def percentiles(name: str, values: np.ndarray) -> dict[str, float]:
    """``p50_<name>`` and ``p99_<name>`` of ``values``."""
    return {f"p50_{name}": float(np.percentile(values, 50)),
            f"p99_{name}": float(np.percentile(values, 99))}
