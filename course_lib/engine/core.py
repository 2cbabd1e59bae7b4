"""The serving core: who runs, who is admitted, who is preempted, and how many tokens each
request computes in a step, over a paged KV-cache manager. It never runs a model.

vLLM v1 splits its engine the same way: a scheduler and a KV-cache manager that do not care
whether a model runs, and a model runner. :class:`ServingCore` is the first half. Each step
:meth:`~ServingCore.schedule` hands out the step's token budget as *chunks* (a sequence's
next tokens: one for a decode, part or all of a prompt for a prefill), claiming their slots
in the block tables and preempting when the pool runs out; the caller computes the chunks
(or not: a pool without K/V tensors works too, which is how a simulation drives it), then
:meth:`~ServingCore.advance` records them, asks the caller to ``draw`` the next token of
every sample whose tokens are all computed, and :meth:`~ServingCore.retire` frees the
finished ones. :class:`~course_lib.engine.PagedEngine` adds the forward pass and sampling.

Scheduling, in vLLM v1's order: running requests first, most protected first
(``Scheduler.claim_order``), each taking its decode token or its next prompt chunk; before
a request claims anything the core checks that its blocks are free, preempting the
scheduler's victims (``Scheduler.preempt_until``) while they are not. Then, unless someone
was preempted, waiting requests are admitted while the limits, the budget and the free
blocks allow; with prefix caching, a prompt's cached full blocks are taken as they are and
only the rest is computed (at least the last token).
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass

from course_lib.engine.requests import PreparedRequest, Sample
from course_lib.paged import BlockPool, PagedKVManager
from course_lib.prefix_cache import (
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
    block_hashes,
)
from course_lib.scheduler import Scheduler, SchedulerConfig, kv_manager
from course_lib.workload import Request

Draw = Callable[[int, PreparedRequest, Sample], None]
"""Appends the next token to a sample: called with the index of the chunk that completed it."""


@dataclass
class Chunk:
    """One sequence's share of a step: ``count`` tokens from position ``start``; ``hit`` are
    the cached blocks a sequence new to the pool starts from; ``decode`` marks a decode."""

    request: PreparedRequest
    sample: Sample
    start: int
    count: int
    hit: tuple[int, ...] | None = None  # None: the sequence is already in the pool
    decode: bool = False


@dataclass(frozen=True)
class Schedule:
    """What one step computes: the chunks, and the requests admitted and preempted."""

    chunks: tuple[Chunk, ...]
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]


class ServingCore:
    """The waiting and running requests, their block tables in ``pool`` and their progress.

    ``pool`` is a ``BlockPool`` (a ``PrefixCachingBlockPool`` turns prefix caching on), with
    or without K/V tensors. ``chunked_prefill`` lets a prompt span several steps.
    """

    def __init__(self, config: SchedulerConfig, pool: BlockPool, *,
                 chunked_prefill: bool = True) -> None:
        if not isinstance(config, SchedulerConfig):
            raise ValueError(f"config must be a SchedulerConfig, got {config!r}")
        if not isinstance(pool, BlockPool):
            raise ValueError(f"pool must be a BlockPool, got {pool!r}")
        if not isinstance(chunked_prefill, bool):
            raise ValueError(f"chunked_prefill must be a bool, got {chunked_prefill!r}")
        self.config, self.pool, self.chunked_prefill = config, pool, chunked_prefill
        self.manager: PagedKVManager = kv_manager(pool)
        self.scheduler = Scheduler(config, [])
        self.requests: list[PreparedRequest] = []
        self.unfinished: dict[int, None] = {}

    # --- requests in and out ---------------------------------------------------------------

    def check_fits(self, request: PreparedRequest) -> None:
        """Raise ValueError for a request the core could never finish: its samples, each at
        full length and no longer sharing (as after a preemption), need more blocks than
        the pool has, or (without chunked prefill) a sample exceeds the token budget."""
        n, full_length = request.params.n, len(request.prompt) + request.params.max_tokens
        blocks = n * self.manager.blocks_needed(full_length)
        usable = self.pool.num_blocks - 1
        if blocks > usable:
            raise ValueError(f"request {request.request_id} needs up to {blocks} blocks "
                             f"but the pool has {usable} for requests")
        limit = self.config.max_num_batched_tokens
        if limit is not None and not self.chunked_prefill and full_length > limit:
            raise ValueError(f"request {request.request_id} may prefill up to {full_length} "
                             f"tokens in one step (recomputing a sample), above "
                             f"max_num_batched_tokens={limit}; enable chunked_prefill")

    def add(self, request: PreparedRequest) -> None:
        """Queue a request checked by ``check_fits``, numbered ``len(requests)``."""
        if request.request_id != len(self.requests):
            raise ValueError(f"request id {request.request_id} is not the next one "
                             f"({len(self.requests)})")
        self.scheduler.add(Request(request.request_id, len(request.prompt),
                                   request.params.max_tokens, arrival=request.request_id,
                                   priority=request.priority))
        self.requests.append(request)
        self.unfinished[request.request_id] = None

    def abort(self, request_id: int) -> PreparedRequest:
        """Stop an unfinished request: free its blocks, end its samples with ``"abort"``."""
        if request_id not in self.unfinished:
            raise ValueError(f"request {request_id!r} is not running or waiting "
                             f"(unknown, finished or aborted)")
        request = self.requests[request_id]
        if request_id in self.scheduler.running:
            self._release(request)
            self.scheduler.stop(request_id)
        else:
            self.scheduler.withdraw(request_id)
        for sample in request.active:
            sample.finish_reason = "abort"
        del self.unfinished[request_id]
        return request

    # --- one step ------------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """Hand out this step's budget as chunks and claim their slots (see the module)."""
        limit = self.config.max_num_batched_tokens
        budget = sys.maxsize if limit is None else limit
        chunks, preempted = self._schedule_running(budget)
        used = sum(c.count for c in chunks)
        admitted = [] if preempted else self._admit(chunks, budget - used)
        if not chunks and not preempted and self.unfinished:
            raise RuntimeError("a step with unfinished requests scheduled nothing; a bug")
        return Schedule(tuple(chunks), tuple(admitted), tuple(preempted))

    def advance(self, schedule: Schedule, draw: Draw) -> dict[str, int]:
        """Record the chunks as computed and ``draw`` the next token of every sample now
        fully computed (forking a fresh request's samples first); the new tokens by
        sequence id."""
        new_tokens: dict[str, int] = {}
        for index, chunk in enumerate(schedule.chunks):
            request, sample = chunk.request, chunk.sample
            sample.computed = chunk.start + chunk.count
            if sample.computed < len(sample.tokens):
                continue
            targets = [sample]
            if request.fresh:
                targets = request.samples
                for child in targets[1:]:
                    self.manager.fork(sample.seq_id, child.seq_id)
                    child.computed = sample.computed
            for target in targets:
                draw(index, request, target)
                target.decoding = True
                new_tokens[target.seq_id] = target.tokens[-1]
        return new_tokens

    def retire(self, new_tokens: dict[str, int]) -> list[tuple[PreparedRequest, bool]]:
        """Free finished samples' blocks at once and retire finished requests; each request
        that produced a token, and whether it is done."""
        touched = []
        live = set(self.manager.sequences)
        for index in list(self.scheduler.running):
            request = self.requests[index]
            if not any(s.seq_id in new_tokens for s in request.samples):
                continue
            for sample in request.samples:
                if sample.finish_reason is not None and sample.seq_id in live:
                    self.manager.free_sequence(sample.seq_id)
            done = not request.active
            if done:
                self.scheduler.stop(index)
                del self.unfinished[index]
            touched.append((request, done))
        return touched

    def _schedule_running(self, budget: int) -> tuple[list[Chunk], list[int]]:
        """Give running requests their chunks, most protected first, preempting victims
        while the pool lacks blocks; returns (chunks, preempted request ids)."""
        scheduler = self.scheduler
        chunks: list[Chunk] = []
        preempted: list[int] = []
        for index in scheduler.claim_order():
            if index not in scheduler.running or budget == 0:
                continue
            plan = self._plan(self.requests[index], budget)
            if not plan:
                continue
            victims = scheduler.preempt_until(
                index, lambda plan=plan: self._blocks_for(plan) <= self.pool.num_free,
                self._preempt)
            preempted += victims
            if index in victims:
                continue
            self._claim(plan)
            chunks += plan
            budget -= sum(c.count for c in plan)
        return chunks, preempted

    def _admit(self, chunks: list[Chunk], budget: int) -> list[int]:
        """Admit waiting requests while the limits, the budget and the free blocks allow."""
        scheduler = self.scheduler
        admitted = []
        while budget and (index := scheduler.next_waiting()) is not None:
            plan = self._plan(self.requests[index], budget)
            cost = sum(c.count for c in plan)
            if (not plan or not scheduler.admits(cost, 0)
                    or self._blocks_for(plan) > self.pool.num_free):
                break
            scheduler.admit_next()
            self._claim(plan)
            chunks += plan
            budget -= cost
            admitted.append(index)
        return admitted

    def _plan(self, request: PreparedRequest, budget: int) -> list[Chunk]:
        """The chunks of ``request``'s sequences that fit in ``budget`` tokens (at most one
        sequence new to the pool, so that its cache hit cannot be evicted meanwhile)."""
        live = set(self.manager.sequences)
        plan: list[Chunk] = []
        for sample in _compute_sequences(request):
            held = sample.seq_id in live
            if not held and any(c.hit is not None for c in plan):
                continue
            hit = None if held else self._cache_hit(sample.tokens)
            start = sample.computed if held else len(hit or ()) * self.pool.block_size
            pending = len(sample.tokens) - start
            count = min(pending, budget) if self.chunked_prefill else \
                (pending if pending <= budget else 0)
            if count == 0:
                break
            plan.append(Chunk(request, sample, start, count, hit, held and sample.decoding))
            budget -= count
        return plan

    def _cache_hit(self, tokens: list[int]) -> tuple[int, ...]:
        """The cached blocks a new sequence of ``tokens`` starts from (none without
        caching; never its last token, which is always computed)."""
        manager = self.manager
        if not isinstance(manager, PrefixCachingKVManager):
            return ()
        size = self.pool.block_size
        hashes = block_hashes(tokens[: (len(tokens) - 1) // size * size], size)
        return tuple(manager.pool.longest_cached_prefix(hashes))

    def _blocks_for(self, plan: list[Chunk]) -> int:
        """Free blocks claiming ``plan``'s slots takes (copies of shared blocks included)."""
        manager, pool, size = self.manager, self.pool, self.pool.block_size
        needed, revived, writers = 0, set(), {}
        for chunk in plan:
            end = chunk.start + chunk.count
            if chunk.hit is not None:
                needed += manager.blocks_needed(end) - len(chunk.hit)
                revived.update(b for b in chunk.hit if pool.ref_count(b) == 0)
                continue
            table = manager.block_table(chunk.sample.seq_id)
            needed += manager.blocks_needed(end) - len(table)
            if chunk.start % size:
                writers[table[-1]] = writers.get(table[-1], 0) + 1
        for block, count in writers.items():  # the last holder writes in place
            needed += count if count < pool.ref_count(block) else count - 1
        return needed + len(revived)

    def _claim(self, plan: list[Chunk]) -> None:
        """Claim the slots of ``plan``'s tokens (a new sequence first, taking its cache
        hit before anything else can evict it)."""
        manager = self.manager
        for chunk in sorted(plan, key=lambda c: c.hit is None):
            sample, end = chunk.sample, chunk.start + chunk.count
            if chunk.hit is None:
                manager.append_tokens(sample.seq_id, token_ids=sample.tokens[chunk.start:end])
                continue
            hit = manager.add_sequence(sample.seq_id, token_ids=sample.tokens[:end])
            if hit != chunk.start:
                raise RuntimeError(f"cache hit of {hit} tokens for {sample.seq_id}, planned "
                                   f"{chunk.start}; this is a bug")
            sample.computed = hit

    def _preempt(self, index: int) -> None:
        """Free every block of request ``index`` and requeue it; its tokens are kept, and it
        is recomputed when readmitted (from its cached prefix, with prefix caching)."""
        request = self.requests[index]
        self._release(request)
        for sample in request.samples:
            sample.computed, sample.decoding = 0, False
        self.scheduler.stop(index)
        self.scheduler.requeue(index)
        request.preemptions += 1

    def _release(self, request: PreparedRequest) -> None:
        """Free the blocks of every sequence of ``request`` that holds some."""
        live = set(self.manager.sequences)
        for sample in request.samples:
            if sample.seq_id in live:
                self.manager.free_sequence(sample.seq_id)

    # --- all or nothing --------------------------------------------------------------------

    def checkpoint(self) -> bytes:
        """Everything a step changes here, pickled (a deep copy), except the K/V tensors:
        call ``save_taken_kv`` after ``schedule`` for those a rollback needs."""
        state = {
            "pool": {k: v for k, v in vars(self.pool).items() if k != "_kv"},
            "manager": {k: v for k, v in vars(self.manager).items() if k != "pool"},
            "scheduler": vars(self.scheduler),
            "requests": {i: self.requests[i] for i in self.unfinished},
            "unfinished": self.unfinished,
            "cached_free": self._cached_free_blocks(),
        }
        return pickle.dumps(state, pickle.HIGHEST_PROTOCOL)

    def _cached_free_blocks(self) -> list[int]:
        """Free blocks that still hold a cached prefix."""
        pool = self.pool
        if not isinstance(pool, PrefixCachingBlockPool) or not pool.owns_kv:
            return []
        return [b for b in pool.free_blocks() if pool.block_hash(b) is not None]

    def save_taken_kv(self, checkpoint: bytes, num_layers: int) -> tuple[list[int], list]:
        """Copies of the K/V (``num_layers`` layers) of the free cached blocks the scheduled
        step took: evicted ones get overwritten, and a rolled-back step must give them back
        still cached (a block taken as a cache hit is only read; its copy is not needed)."""
        pool = self.pool
        taken = [b for b in pickle.loads(checkpoint)["cached_free"] if pool.ref_count(b)]
        if not taken:
            return [], []
        return taken, [pool.kv_cache(layer)[taken].clone() for layer in range(num_layers)]

    def restore(self, checkpoint: bytes, taken_kv: tuple[list[int], list] = ([], [])) -> None:
        """Put back the state ``checkpoint`` saved and the K/V ``save_taken_kv`` copied."""
        taken, saved = taken_kv
        for layer, kv in enumerate(saved):
            self.pool.kv_cache(layer)[taken] = kv
        state = pickle.loads(checkpoint)
        vars(self.pool).update(state["pool"])
        vars(self.manager).update(state["manager"])
        vars(self.scheduler).update(state["scheduler"])
        for index, request in state["requests"].items():
            self.requests[index] = request
        self.unfinished = state["unfinished"]


def _compute_sequences(request: PreparedRequest) -> list[Sample]:
    """The sequences of a running or waiting request that have tokens to compute: the
    prompt (one sequence, shared by all samples later) of a fresh request, else every
    unfinished sample."""
    samples = [request.samples[0]] if request.fresh else request.active
    return [s for s in samples if s.computed < len(s.tokens)]
