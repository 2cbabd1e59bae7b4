"""Who runs, who waits, and who is pushed out: the scheduler behind the simulator's step loop.

Chapter 03 needs only the source guide's minimal policy (first come, first served; when
the paged pool runs out, preempt the newest running request and recompute it later).
Chapter 05 grows it into vLLM's: continuous batching under ``max_num_seqs`` and
``max_num_batched_tokens``, a priority policy, and swap as the other way back.

The scheduler keeps order, never memory: the serving core's step
(``course_lib.serving.ServingCore``, which both the simulator and the engine drive) asks it
which request to admit next, which one to preempt (``preempt_until``) and in which order
running requests claim memory, and owns the allocator itself. Requests come in a trace given
up front or one at a time (``add``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from course_lib.paged import BlockPool, PagedKVManager
from course_lib.prefix_cache import PrefixCachingBlockPool, PrefixCachingKVManager
from course_lib.validate import check_int
from course_lib.workload import Request

Policy = Literal["fcfs", "priority"]
Preemption = Literal["recompute", "swap"]

POLICIES: tuple[Policy, ...] = ("fcfs", "priority")
PREEMPTION_MODES: tuple[Preemption, ...] = ("recompute", "swap")


@dataclass(frozen=True)
class SchedulerConfig:
    """The serving knobs. Defaults reproduce the source guide's simulation.

    * ``policy``: ``"fcfs"`` preempts the most recently admitted running request;
      ``"priority"`` the lowest-priority one (larger number = lower), ties broken by the
      latest arrival, and admits waiting requests in priority order.
    * ``preemption``: ``"recompute"`` drops the victim's blocks and prefills its prompt
      plus the tokens generated so far again on resumption; ``"swap"`` copies its blocks to
      CPU swap space and back, falling back to recompute when swap space is full.
    * ``max_num_seqs``: most requests running in one step (None: no limit).
    * ``max_num_batched_tokens``: most tokens one step processes, one per decoding sample
      plus every prefilled token (None: no limit). Without chunked prefill, which the
      simulator does not model, it must be at least the longest allowed request (vLLM
      enforces the same), or a long prompt could never start.
    * ``swap_space_blocks``: CPU swap space in blocks (None: as many as the GPU pool, the
      bound the vLLM paper uses).
    """

    policy: Policy = "fcfs"
    preemption: Preemption = "recompute"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    swap_space_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; expected one of "
                             f"{', '.join(POLICIES)}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"unknown preemption mode {self.preemption!r}; expected one of "
                             f"{', '.join(PREEMPTION_MODES)}")
        for name, minimum in (("max_num_seqs", 1), ("max_num_batched_tokens", 1),
                              ("swap_space_blocks", 0)):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum)

    def check_max_len(self, max_len: int) -> None:
        """Raise if a request of ``max_len`` tokens could never be prefilled in one step."""
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < max_len:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} is below "
                             f"max_len={max_len}; without chunked prefill a long prompt "
                             f"could never start")


def tokens_to_recompute(length: int, cached_blocks: int, block_size: int) -> int:
    """Tokens a request resumed by recompute at ``length`` tokens (prompt plus what it had
    generated) prefills again when the prefix cache still holds its first ``cached_blocks``
    blocks. Cached full blocks are reused, but at least the last token is always computed
    (vLLM's rule), so the cache covers at most ``(length - 1) // block_size`` blocks."""
    check_int("length", length, 1)
    check_int("cached_blocks", cached_blocks, 0)
    check_int("block_size", block_size, 1)
    return length - min(cached_blocks, (length - 1) // block_size) * block_size


def kv_manager(pool: BlockPool) -> PagedKVManager:
    """The KV-cache manager both step loops keep over ``pool`` (the engine's ``ServingCore``
    and the simulator): a ``PrefixCachingKVManager`` when the pool caches, else a plain one."""
    if not isinstance(pool, BlockPool):
        raise ValueError(f"pool must be a BlockPool, got {pool!r}")
    return (PrefixCachingKVManager(pool) if isinstance(pool, PrefixCachingBlockPool)
            else PagedKVManager(pool))


class SwapSpace:
    """CPU memory for swapped-out blocks, counted in blocks."""

    def __init__(self, capacity_blocks: int) -> None:
        """Empty swap space holding at most ``capacity_blocks`` blocks."""
        self.capacity_blocks = check_int("capacity_blocks", capacity_blocks, 0)
        self._held: dict[int, int] = {}

    @property
    def used_blocks(self) -> int:
        """Blocks currently swapped out."""
        return sum(self._held.values())

    def holds(self, request_id: int) -> bool:
        """Whether ``request_id``'s blocks are in swap space."""
        return request_id in self._held

    def swap_out(self, request_id: int, num_blocks: int) -> bool:
        """Take ``num_blocks`` of ``request_id`` if they fit; False (nothing kept) if not."""
        check_int("request_id", request_id, 0)
        if request_id in self._held:
            raise ValueError(f"request {request_id} is already swapped out")
        check_int("num_blocks", num_blocks, 1)
        if self.used_blocks + num_blocks > self.capacity_blocks:
            return False
        self._held[request_id] = num_blocks
        return True

    def swap_in(self, request_id: int) -> int:
        """Release ``request_id``'s blocks from swap space and return how many there were."""
        check_int("request_id", request_id, 0)
        try:
            return self._held.pop(request_id)
        except KeyError:
            raise ValueError(f"request {request_id} is not swapped out") from None


class Scheduler:
    """The waiting queue and the running set, in the order the policy needs them.

    Requests are referred to by their index in the trace given to the constructor (or
    the order ``add`` gave them). The running set keeps admission order (oldest first);
    running requests claim memory in ``claim_order``, which is that order under ``"fcfs"``
    and priority order under ``"priority"``.
    """

    def __init__(self, config: SchedulerConfig, requests: Sequence[Request]) -> None:
        """Empty queues for ``requests`` under ``config``."""
        if not isinstance(config, SchedulerConfig):
            raise ValueError(f"config must be a SchedulerConfig, got {config!r}")
        for request in requests:
            if not isinstance(request, Request):
                raise ValueError(f"requests must be Request objects, got {request!r}")
        self.config = config
        self._keys = [(r.priority, r.arrival, i) for i, r in enumerate(requests)]
        self._waiting: set[int] = set()
        self._fifo: deque[int] = deque()
        self._heap: list[tuple[int, int, int]] = []
        self._victims: list[tuple[int, int, int]] = []
        self._admissions = 0
        self._rank: dict[int, int] = {}  # admission number of each running request
        self.running: dict[int, None] = {}

    # --- waiting ---------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests waiting."""
        return len(self._waiting)

    def arrive(self, index: int) -> None:
        """A new request joins the back of the waiting queue (priority order under
        ``"priority"``)."""
        self._wait(index, front=False)

    def add(self, request: Request) -> int:
        """Register one more request (an online arrival) and queue it; returns its index."""
        if not isinstance(request, Request):
            raise ValueError(f"request must be a workload Request, got {request!r}")
        return self.enqueue(request.priority, request.arrival)

    def enqueue(self, priority: int, arrival: int) -> int:
        """Register one more request by what its order needs (its priority and arrival)
        and queue it; returns its index. The serving cores add requests this way."""
        if type(priority) is not int:
            raise ValueError(f"priority must be an integer, got {priority!r}")
        check_int("arrival", arrival, 0)
        index = len(self._keys)
        self._keys.append((priority, arrival, index))
        self.arrive(index)
        return index

    def withdraw(self, index: int) -> None:
        """Take a waiting request out of the queue (it was aborted); it neither waits nor
        runs afterwards."""
        check_int("request index", index, 0)
        if index not in self._waiting:
            raise ValueError(f"request {index!r} is not waiting")
        if self.config.policy == "priority":
            self._heap = [e for e in self._heap if e[2] != index]
            heapq.heapify(self._heap)
        else:
            self._fifo.remove(index)
        self._waiting.remove(index)

    def requeue(self, index: int) -> None:
        """A preempted request goes back to the front of the waiting queue (under
        ``"priority"``, back into priority order)."""
        self._wait(index, front=True)

    def _wait(self, index: int, *, front: bool) -> None:
        """Queue a request that neither waits nor runs: in priority order under
        ``"priority"``, else at the ``front`` or the back of the queue."""
        self._check_can_wait(index)
        self._waiting.add(index)
        if self.config.policy == "priority":
            heapq.heappush(self._heap, self._keys[index])
        elif front:
            self._fifo.appendleft(index)
        else:
            self._fifo.append(index)

    def next_waiting(self) -> int | None:
        """The request admission considers next, or None."""
        if self.config.policy == "priority":
            return self._heap[0][2] if self._heap else None
        return self._fifo[0] if self._fifo else None

    def admits(self, prefill_tokens: int, step_tokens: int) -> bool:
        """Whether the limits allow one more request, which prefills ``prefill_tokens``,
        into a step that already processes ``step_tokens``."""
        check_int("prefill_tokens", prefill_tokens, 0)
        check_int("step_tokens", step_tokens, 0)
        config = self.config
        if config.max_num_seqs is not None and len(self.running) >= config.max_num_seqs:
            return False
        return (config.max_num_batched_tokens is None
                or step_tokens + prefill_tokens <= config.max_num_batched_tokens)

    def admit_next(self) -> int:
        """Move the next waiting request to the running set and return it."""
        if not self._waiting:
            raise ValueError("no request is waiting to be admitted")
        if self.config.policy == "priority":
            index = heapq.heappop(self._heap)[2]
            priority, arrival, _ = self._keys[index]
            heapq.heappush(self._victims, (-priority, -arrival, -index))
        else:
            index = self._fifo.popleft()
        self._waiting.remove(index)
        self.running[index] = None
        self._admissions += 1
        self._rank[index] = self._admissions
        return index

    # --- running ---------------------------------------------------------------------------

    def claim_order(self) -> list[int]:
        """The running requests, most protected first: the reverse of the order in which
        ``victim`` would pick them, so a request is never preempted after it has claimed
        its memory for the step."""
        return self.in_claim_order(self.running)

    def claim_key(self, index: int) -> tuple[int, ...]:
        """Where running request ``index`` stands in ``claim_order`` (smaller claims first)."""
        self._check_running(index)
        return self._claim_key(index)

    def in_claim_order(self, indices: Iterable[int]) -> list[int]:
        """Running requests ``indices`` sorted as ``claim_order`` would have them."""
        chosen = list(indices)
        if not self.running.keys() >= set(chosen):
            raise ValueError(f"not all of {chosen!r} are running")
        return sorted(chosen, key=self._claim_key)

    def _claim_key(self, index: int) -> tuple[int, ...]:
        """The claim order's key, for a running request: its admission under ``"fcfs"``,
        its (priority, arrival, index) under ``"priority"``."""
        return (self._rank[index],) if self.config.policy == "fcfs" else self._keys[index]

    def admission_rank(self, index: int) -> int:
        """How many admissions there had been when running request ``index`` was admitted:
        the running set's order."""
        self._check_running(index)
        return self._rank[index]

    def victim(self) -> int:
        """The running request to preempt: the newest under ``"fcfs"``; under
        ``"priority"`` the lowest priority, latest arrival (then latest in the trace)."""
        if not self.running:
            raise ValueError("no running request to preempt")
        if self.config.policy == "fcfs":
            return next(reversed(self.running))
        while -self._victims[0][2] not in self.running:  # drop finished or preempted ones
            heapq.heappop(self._victims)
        return -self._victims[0][2]

    def preempt_until(self, index: int, fits: Callable[[], bool],
                      preempt: Callable[[int], None]) -> list[int]:
        """The preemption loop both step loops share (the simulator's and the engine's).

        While ``fits()`` says running request ``index`` cannot claim its memory, name a
        ``victim`` and have ``preempt(victim)`` free and requeue it, stopping after ``index``
        itself is the victim; returns the victims in order.
        """
        self._check_running(index)
        victims: list[int] = []
        while not fits():
            victim = self.victim()
            preempt(victim)
            victims.append(victim)
            if victim == index:
                break
        return victims

    def stop(self, index: int) -> None:
        """Remove a finished or preempted request from the running set."""
        if type(index) is not int or index not in self.running:  # never in the common case
            check_int("request index", index, 0)
            self._check_running(index)
        del self.running[index]
        del self._rank[index]

    def _check_running(self, index: int) -> None:
        """Raise unless request ``index`` is running."""
        if index not in self.running:
            raise ValueError(f"request {index!r} is not running")

    def _check_can_wait(self, index: int) -> None:
        """Raise unless ``index`` names a request of the trace that neither waits nor runs."""
        if (type(index) is int and 0 <= index < len(self._keys) and index not in self._waiting
                and index not in self.running):
            return  # the common case, checked at once
        check_int("request index", index, 0)
        if index >= len(self._keys):
            raise ValueError(f"request index {index} is outside the trace "
                             f"({len(self._keys)} requests)")
        if index in self._waiting or index in self.running:
            state = "waiting" if index in self._waiting else "running"
            raise ValueError(f"request {index} is already {state}")
