"""The serving core: who runs, who is admitted, who is preempted, and how many tokens each
request computes in a step, over a paged KV-cache manager. It never runs a model.

vLLM v1 splits its engine the same way: a scheduler and a KV-cache manager that do not care
whether a model runs, and a model runner. :class:`ServingCore` is the first half, and
chapter 07's engine (``course_lib.engine``) drives it. Each step
:meth:`~ServingCore.schedule` hands out the step's token budget as *chunks* (a sequence's
next tokens: one for a decode, part or all of a prompt for a prefill), claiming their slots
in the block tables and preempting when the pool runs out; the caller computes the chunks
(or not: a pool without K/V tensors works too), then :meth:`~ServingCore.advance` records
them and asks the caller to ``draw`` the next token of every sample whose tokens are all
computed, and :meth:`~ServingCore.retire` frees the finished ones.

Scheduling: every decoding sample decodes one token (decodes first, as vLLM schedules them
under chunked prefill); running requests that need memory claim it most protected first
(``Scheduler.claim_order``): a decode whose token starts a new block (or writes into a
block it shares after a fork), or the next chunk of a prompt from the budget the decodes
left. Before a request claims anything the core checks that its blocks are free, preempting
the scheduler's victims (``Scheduler.preempt_until``) while they are not; a victim always
stands later in the claim order, so nobody is preempted after claiming in the same step.
Then, unless someone was preempted, waiting requests are admitted while the limits, the
budget and the free blocks allow; with prefix caching, a prompt's cached full blocks are
taken as they are and only the rest is computed (at least the last token). With
``preemption="swap"`` a victim's blocks go to CPU swap space when it has room, and it comes
back with its K/V instead of recomputing them (for pools without K/V and requests of one
sample, as the simulator's are: the engine copies no K/V, like vLLM v1, which dropped
swapping).

The simulator (chapters 02-05) and the cluster (chapter 09) schedule with the same rules
through :class:`~course_lib.lazy_serving.LazyServingCore`, which touches a decoding request
only when it needs a block. What the two cores share lives in :class:`BaseServingCore`:
requests in and out, a step's outline (``schedule``: each core claims for its running
requests, then admits), what a prompt's admission costs (its cache and tier hits, its
blocks), and preemption.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from course_lib.paged import BlockPool, PagedKVManager
from course_lib.prefix_cache import (
    BlockHash,
    PrefixCachingKVManager,
    check_block_hashes,
    extend_chain,
)
from course_lib.rollback import UndoablePool, UndoLog, saved_fields, saved_manager
from course_lib.scheduler import Scheduler, SchedulerConfig, SwapSpace, kv_manager
from course_lib.tier import TieredBlockPool
from course_lib.validate import check_int

FinishReason = Literal["length", "stop", "abort"]


@dataclass(slots=True)
class Sample:
    """One sample while it generates: prompt plus generated tokens, its random generator
    (the engine's; None when greedy or simulated), why it stopped (None while it runs), how
    many of its tokens have K/V in the pool (``computed``) and whether it is decoding (its
    tokens were all computed once since it was last admitted)."""

    seq_id: str
    tokens: MutableSequence[int]
    generator: Any = None
    finish_reason: FinishReason | None = None
    computed: int = 0
    decoding: bool = False


@dataclass(slots=True)
class ServingRequest:
    """A request as the core schedules it: its prompt, how many tokens each sample may
    generate, its samples, its priority (smaller is more important), the prefix cache's
    salt (only requests with the same salt share blocks), how often it was preempted, and
    whether its blocks wait in swap space."""

    request_id: int
    prompt: Sequence[int]
    max_tokens: int
    priority: int
    samples: list[Sample]
    cache_salt: str | None = None
    preemptions: int = 0
    swapped: bool = False

    @property
    def active(self) -> list[Sample]:
        """Samples still generating."""
        return [s for s in self.samples if s.finish_reason is None]

    @property
    def fresh(self) -> bool:
        """Whether no token has been generated yet (the prompt still awaits its prefill)."""
        prompt = len(self.prompt)
        return all(len(s.tokens) == prompt for s in self.samples)

    def append_token(self, sample: Sample, token: int, stop_token_ids: Sequence[int]) -> None:
        """Append a chosen ``token`` to ``sample`` and decide whether it is done (a stop
        token, or ``max_tokens`` generated)."""
        sample.tokens.append(token)
        if token in stop_token_ids:
            sample.finish_reason = "stop"
        elif len(sample.tokens) - len(self.prompt) >= self.max_tokens:
            sample.finish_reason = "length"


Draw = Callable[[int, ServingRequest, Sample], None]
"""Appends the next token to a sample: called with the index of the chunk that completed it."""


@dataclass(slots=True)
class Chunk:
    """One sequence's share of a step: ``count`` tokens from position ``start``; ``hit`` are
    the cached blocks a sequence new to the pool starts from; ``decode`` marks a decode;
    ``loaded`` counts the blocks after ``hit`` that a second tier (``course_lib.tier``)
    copies back instead of computing them."""

    request: ServingRequest
    sample: Sample
    start: int
    count: int
    hit: tuple[int, ...] | None = None  # None: the sequence is already in the pool
    decode: bool = False
    loaded: int = 0  # blocks after the hit copied back from the pool's CPU tier


class Schedule(NamedTuple):
    """What one step computes: the chunks (a lazy core, ``course_lib.lazy_serving``, lists
    only prefills and the decodes that claim a block), every token it computes, the
    requests admitted and preempted, and the blocks moved to and from swap space by
    request. Immutable and cheap to make (a step makes one, a simulation thousands)."""

    chunks: tuple[Chunk, ...]
    num_tokens: int
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    swapped_out: dict[int, int]
    swapped_in: dict[int, int]


@dataclass(slots=True)
class _Decoding:
    """A decoding sample of the eager core: its request and its place among the request's
    samples."""

    request: int
    position: int


class BaseServingCore:
    """What both serving cores share: the waiting and running requests, their block tables
    in ``pool``, requests in and out, a step's outline, what a prompt's admission costs,
    and preemption.

    ``pool`` is a ``BlockPool`` (a ``PrefixCachingBlockPool`` turns prefix caching on), with
    or without K/V tensors. ``chunked_prefill`` lets a prompt span several steps. A pool
    with a CPU tier (``course_lib.tier``) extends a new sequence's cache hit with the blocks
    the tier holds, copied back when the sequence is added.
    """

    def __init__(self, config: SchedulerConfig, pool: BlockPool, *,
                 chunked_prefill: bool) -> None:
        self.scheduler = Scheduler(config, [])  # raises first for a config of the wrong type
        self.manager: PagedKVManager = kv_manager(pool)  # then for a pool that is none
        if not isinstance(chunked_prefill, bool):
            raise ValueError(f"chunked_prefill must be a bool, got {chunked_prefill!r}")
        if config.preemption == "swap" and pool.owns_kv:
            raise ValueError("preemption='swap' is modelled only for pools without K/V (the "
                             "simulator's); a pool with K/V preempts by recompute")
        self.config, self.pool, self.chunked_prefill = config, pool, chunked_prefill
        self._caching = isinstance(self.manager, PrefixCachingKVManager)
        self.swap = None if config.preemption != "swap" else SwapSpace(
            pool.num_blocks - 1 if config.swap_space_blocks is None
            else config.swap_space_blocks)
        self.requests: list[ServingRequest] = []
        self.unfinished: dict[int, None] = {}
        self.clock = 0  # steps scheduled so far
        self._owner: dict[str, int] = {}  # every sample's request
        self._chains: dict[str, list[BlockHash]] = {}  # prefix caching: hashes per sample

    # --- requests in and out ---------------------------------------------------------------

    def check_fits(self, request: ServingRequest) -> None:
        """Raise ValueError for a request the core could never finish: its samples, each at
        full length and no longer sharing (as after a preemption), need more blocks than
        the pool has, or (without chunked prefill) a sample exceeds the token budget. A
        sample's last token never gets K/V, so full length is one less than its tokens."""
        n, longest = len(request.samples), len(request.prompt) + request.max_tokens - 1
        blocks = n * self.manager.blocks_needed(longest)
        usable = self.pool.num_blocks - 1
        if blocks > usable:
            raise ValueError(f"request {request.request_id} needs up to {blocks} blocks "
                             f"but the pool has {usable} for requests")
        limit = self.config.max_num_batched_tokens
        if limit is not None and not self.chunked_prefill and longest > limit:
            raise ValueError(f"request {request.request_id} may prefill up to {longest} "
                             f"tokens in one step (recomputing a sample), above "
                             f"max_num_batched_tokens={limit}; enable chunked_prefill")

    def add(self, request: ServingRequest, *, known_hashes: Sequence[BlockHash] = ()) -> None:
        """Queue a request checked by ``check_fits``, numbered ``len(requests)``.

        With prefix caching, ``known_hashes`` are the hash chain of the prompt's leading
        full blocks (``block_hashes`` with its cache salt) from a caller that computed them
        anyway, as the cluster does for its router, so the core does not hash them again.
        They are taken as given: only their form and count (at most the prompt's full
        blocks) are checked."""
        if request.request_id != len(self.requests):
            raise ValueError(f"request id {request.request_id} is not the next one "
                             f"({len(self.requests)})")
        check_int("max_tokens", request.max_tokens, 1)
        if not len(request.prompt):
            raise ValueError(f"request {request.request_id}: the prompt holds no token")
        known = self._known_hashes(request, known_hashes)
        self._check_supported(request)
        self.scheduler.enqueue(request.priority, request.request_id)
        self.requests.append(request)
        self.unfinished[request.request_id] = None
        for sample in request.samples:
            self._owner[sample.seq_id] = request.request_id
            if known:
                self._chains[sample.seq_id] = list(known)

    def _known_hashes(self, request: ServingRequest,
                      known_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """``add``'s ``known_hashes`` as a list, if they can name the prompt's leading full
        blocks, else a ValueError naming them."""
        known = check_block_hashes("known_hashes", known_hashes)
        blocks = len(request.prompt) // self.pool.block_size
        if known and not self._caching:
            raise ValueError(f"request {request.request_id}: known_hashes need prefix "
                             f"caching, got {len(known)} hashes")
        if len(known) > blocks:
            raise ValueError(f"request {request.request_id}: {len(known)} known_hashes for "
                             f"a prompt of {blocks} full blocks")
        return known

    def _check_supported(self, request: ServingRequest) -> None:
        """Refuse what the core does not model: swapping a request of several samples."""
        if self.swap is not None and len(request.samples) != 1:
            raise ValueError(f"request {request.request_id}: preemption='swap' is modelled for "
                             f"requests of one sample (the simulator's); got "
                             f"{len(request.samples)} samples")

    def abort(self, request_id: int) -> ServingRequest:
        """Stop an unfinished request: free its blocks, end its samples with ``"abort"``.
        The id is checked before anything changes (``True`` is not request 1)."""
        if type(request_id) is not int or request_id not in self.unfinished:
            raise ValueError(f"request {request_id!r} is not running or waiting "
                             f"(unknown, finished or aborted)")
        request = self.requests[request_id]
        if request_id in self.scheduler.running:
            self._release(request)
            self.scheduler.stop(request_id)
        else:
            self.scheduler.withdraw(request_id)
            if request.swapped:
                self.swap.swap_in(request_id)
        for sample in request.active:
            sample.finish_reason = "abort"
        self._forget(request)
        return request

    def _forget(self, request: ServingRequest) -> None:
        """Drop what the core kept for a request that has ended."""
        del self.unfinished[request.request_id]
        for sample in request.samples:
            self._chains.pop(sample.seq_id, None)

    # --- one step ------------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """Hand out this step's budget as chunks and claim their slots (see the module)."""
        limit = self.config.max_num_batched_tokens
        step = _Step(sys.maxsize if limit is None else limit)
        self._schedule_running(step)
        admitted = [] if step.preempted else self._admit(step)
        decodes = self._decodes(step)
        if not (decodes or step.chunks or step.preempted) and self.unfinished:
            raise RuntimeError(f"step {self.clock}: request {self.scheduler.next_waiting()} "
                               f"waits but cannot be admitted into an idle server; a bug")
        return Schedule(tuple(step.chunks), decodes + step.prefill, tuple(admitted),
                        tuple(step.preempted), step.swapped_out, step.swapped_in)

    def _decodes(self, step: _Step) -> int:
        """Decodes this step computes: the decoding samples, less those held back (a held
        sample whose request was preempted since is no longer decoding at all)."""
        if not step.held:
            return len(self._decoding)
        return len(self._decoding) - len(step.held & self._decoding.keys())

    def _schedule_running(self, step: _Step) -> None:
        """Each core's own: the step's chunks for running requests that need memory, most
        protected first, preempting while the pool lacks blocks."""
        raise NotImplementedError

    def _admit(self, step: _Step) -> list[int]:
        """Each core's own: admit waiting requests while the limits, the budget and the free
        blocks allow; the indices admitted."""
        raise NotImplementedError

    # --- what an admission costs ----------------------------------------------------------

    def _prefill_chunk(self, request: ServingRequest, sample: Sample,
                       budget: int) -> Chunk | None:
        """The next prefill chunk of a sequence that has tokens to compute, within
        ``budget`` tokens (None if none fits): from where it stands if the pool holds it or
        it comes back from swap space, else after its cache and tier hits."""
        held = self.manager.holds(sample.seq_id)
        hit = None if held else self._cache_hit(request, sample)
        loaded = 0 if held or request.swapped else self._tier_hit(request, sample, len(hit))
        start = (sample.computed if held or request.swapped
                 else (len(hit) + loaded) * self.pool.block_size)
        pending = len(sample.tokens) - start
        count = min(pending, budget) if self.chunked_prefill else \
            (pending if pending <= budget else 0)
        if count == 0:
            return None
        return Chunk(request, sample, start, count, hit, held and sample.decoding, loaded)

    def _cache_hit(self, request: ServingRequest, sample: Sample) -> tuple[int, ...]:
        """The cached blocks a sequence new to the pool starts from (none without caching;
        never its last token, which is always computed)."""
        manager = self.manager
        if not isinstance(manager, PrefixCachingKVManager):
            return ()
        chain = self._chain(request, sample, (len(sample.tokens) - 1) // self.pool.block_size)
        return tuple(manager.pool._cached_prefix(chain))  # the core's own hashes

    def _tier_hit(self, request: ServingRequest, sample: Sample, gpu_blocks: int) -> int:
        """The blocks right after a sequence's GPU hit that the pool's second tier holds
        (0 without a tier; never its last token)."""
        pool = self.pool
        if not isinstance(pool, TieredBlockPool):
            return 0
        chain = self._chain(request, sample, (len(sample.tokens) - 1) // pool.block_size)
        return pool.tier_prefix(chain[gpu_blocks:])

    def _chain(self, request: ServingRequest, sample: Sample, blocks: int) -> list[BlockHash]:
        """The hashes of ``sample``'s first ``blocks`` full blocks, kept per sample as vLLM
        keeps them on the request, so a waiting request is not hashed again every step."""
        size, chain = self.pool.block_size, self._chains.setdefault(sample.seq_id, [])
        if len(chain) < blocks:
            extend_chain(chain, sample.tokens[: blocks * size], size, request.cache_salt)
        return chain[:blocks]

    def _blocks_for(self, plan: list[Chunk]) -> int:
        """Free blocks claiming ``plan``'s slots takes (copies of shared blocks included)."""
        manager, pool, size = self.manager, self.pool, self.pool.block_size
        if len(plan) == 1:  # the common claims, without a table copy
            chunk = plan[0]
            if chunk.decode:
                if chunk.start % size == 0:
                    return 1  # a decode that starts a new block
                return int(pool.ref_count(manager.last_block(chunk.sample.seq_id)) > 1)
            if chunk.hit is not None:  # a new sequence, from its cache hit
                return (manager.blocks_needed(chunk.start + chunk.count) - len(chunk.hit)
                        + pool._num_unheld(chunk.hit))
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

    def _swap_in(self, index: int, request: ServingRequest, chunk: Chunk, step: _Step) -> None:
        """A request admitted back from swap space: what its cache hit lacks is copied in."""
        request.swapped = False
        step.swapped_in[index] = max(0, self.swap.swap_in(index) - len(chunk.hit or ()))

    def _claim(self, plan: list[Chunk], step: _Step) -> None:
        """Claim the slots of ``plan``'s tokens (a new sequence first, taking its cache
        hit before anything else can evict it) and add them to the step."""
        for chunk in sorted(plan, key=lambda c: c.hit is None) if len(plan) > 1 else plan:
            sample, end = chunk.sample, chunk.start + chunk.count
            if chunk.hit is None:
                self._append(sample, end)
            else:
                self._add_sequence(chunk)
            if not chunk.decode:
                step.prefill += chunk.count
            step.chunks.append(chunk)

    def _add_sequence(self, chunk: Chunk) -> None:
        """Put a sequence new to the pool there, its cache hit first."""
        sample, end = chunk.sample, chunk.start + chunk.count
        if not isinstance(self.manager, PrefixCachingKVManager):
            self.manager.add_sequence(sample.seq_id, end)
            return
        chain = self._chain(chunk.request, sample, end // self.pool.block_size)
        first, last = len(chunk.hit), len(chunk.hit) + chunk.loaded
        fetched = self.pool.fetch(chain[first:last]) if chunk.loaded else []  # before evicting
        hit = self.manager.add_sequence(
            sample.seq_id, token_ids=sample.tokens[:end], cache_salt=chunk.request.cache_salt,
            known=chain)
        if hit != len(chunk.hit) * self.pool.block_size:
            raise RuntimeError(f"cache hit of {hit} tokens for {sample.seq_id}, planned "
                               f"{len(chunk.hit)} blocks; this is a bug")
        if chunk.loaded:
            self.pool.write_fetched(self.manager.block_table(sample.seq_id)[first:last], fetched)

    def _append(self, sample: Sample, end: int) -> None:
        """Extend a sample's block table to ``end`` tokens (its token ids, which prefix
        caching hashes, or a count); blocks are taken where they are needed."""
        length = self.manager.seq_len(sample.seq_id)
        if end <= length:
            return
        if self._caching:
            self.manager.append_tokens(sample.seq_id, token_ids=sample.tokens[length:end])
        else:
            self.manager.append_tokens(sample.seq_id, end - length)

    # --- preemption ------------------------------------------------------------------------

    def _make_room(self, index: int, fits: Callable[[], bool], step: _Step) -> bool:
        """Preempt the scheduler's victims until running request ``index``'s claim
        ``fits()`` (``Scheduler.preempt_until``), noting them in the step; False if
        ``index`` was itself preempted."""
        if fits():
            return True
        victims = self.scheduler.preempt_until(index, fits,
                                               lambda victim: self._preempt(victim, step))
        step.preempted += victims
        return index not in victims

    def _preempt(self, index: int, step: _Step) -> None:
        """Free every block of request ``index`` and requeue it: to swap space when it has
        room (its samples keep their progress), else to be recomputed when readmitted (from
        its cached prefix, with prefix caching)."""
        request = self.requests[index]
        held = [s for s in request.samples if self.manager.holds(s.seq_id)]
        blocks = sum(len(self.manager.block_table(s.seq_id)) for s in held)
        if self.swap is not None and blocks and self.swap.swap_out(index, blocks):
            request.swapped = True
            step.swapped_out[index] = blocks
        self._release(request)
        if not request.swapped:
            for sample in request.samples:
                sample.computed, sample.decoding = 0, False
        self.scheduler.stop(index)
        self.scheduler.requeue(index)
        request.preemptions += 1

    def _release(self, request: ServingRequest) -> None:
        """Free the blocks of every sequence of ``request`` that holds some."""
        for sample in request.samples:
            if self.manager.holds(sample.seq_id):
                self._free(sample)

    def _free(self, sample: Sample) -> None:
        """Free a sample's blocks."""
        self.manager.free_sequence(sample.seq_id)


class ServingCore(BaseServingCore):
    """The engine's serving core (see the module): every decode is listed every step, every
    token drawn by the caller, and a step can be undone (``checkpoint``).

    ``pool`` is a ``BlockPool`` (a ``PrefixCachingBlockPool`` turns prefix caching on), with
    or without K/V tensors; ``chunked_prefill`` lets a prompt span several steps.
    """

    def __init__(self, config: SchedulerConfig, pool: BlockPool, *,
                 chunked_prefill: bool = True) -> None:
        super().__init__(config, pool, chunked_prefill=chunked_prefill)
        self._decoding: dict[str, _Decoding] = {}
        self._prefilling: dict[int, None] = {}  # running requests with tokens to prefill
        self._log: UndoLog | None = None  # the checkpoint's, while a step may be undone

    def _forget(self, request: ServingRequest) -> None:
        """Drop what the core kept for a request that has ended."""
        self._prefilling.pop(request.request_id, None)
        super()._forget(request)

    # --- one step ------------------------------------------------------------------------

    def advance(self, schedule: Schedule, draw: Draw) -> dict[str, int]:
        """Record the step as computed and ``draw`` the next token of every sample now fully
        computed (forking a fresh request's samples first); the new tokens by sequence id."""
        if not callable(draw):
            raise ValueError(f"advance needs a draw, got {draw!r}")
        new_tokens: dict[str, int] = {}
        for index, chunk in enumerate(schedule.chunks):
            request, sample = chunk.request, chunk.sample
            sample.computed = chunk.start + chunk.count
            if chunk.decode:
                draw(index, request, sample)
                new_tokens[sample.seq_id] = sample.tokens[-1]
            elif sample.computed == len(sample.tokens):
                self._finish_prefill(index, request, sample, draw, new_tokens)
        self.clock += 1
        return new_tokens

    def retire(self, new_tokens: dict[str, int]) -> list[tuple[ServingRequest, bool]]:
        """Free finished samples' blocks at once and retire finished requests; each request
        that produced a token, in the running set's order, and whether it is done."""
        owners = {self._owner[seq_id] for seq_id in new_tokens}
        scheduler, touched = self.scheduler, []
        for index in sorted(owners, key=scheduler.admission_rank):
            request = self.requests[index]
            for sample in request.samples:
                if sample.finish_reason is not None and self.manager.holds(sample.seq_id):
                    self._free(sample)
            done = not request.active
            if done:
                scheduler.stop(index)
                self._forget(request)
            touched.append((request, done))
        return touched

    # --- scheduling ----------------------------------------------------------------------

    def _hold_over_budget(self, budget: int) -> set[str]:
        """The decoding samples that sit this step out because their decodes alone exceed
        the budget (least protected first; possible with ``n`` > 1 samples)."""
        excess = len(self._decoding) - budget
        if excess <= 0:
            return set()
        key = self.scheduler.claim_key
        order = sorted(self._decoding,
                       key=lambda s: (key(self._decoding[s].request), self._decoding[s].position))
        return set(order[-excess:])

    def _schedule_running(self, step: _Step) -> None:
        """Hold back the decodes over the budget, then give the running requests that need
        memory their chunks, most protected first, preempting victims while the pool lacks
        blocks; every decode is listed."""
        scheduler, prefilling = self.scheduler, self._prefilling
        step.held = self._hold_over_budget(step.budget)
        decodes = self._all_decodes(step.held)
        claimants = decodes.keys() | prefilling.keys() if prefilling else decodes
        for index in scheduler.in_claim_order(claimants):
            if index not in scheduler.running:
                continue  # preempted earlier in this step
            request = self.requests[index]
            plan = [self._decode_chunk(request, self._sample(s)) for s in decodes.get(index, ())]
            if index in prefilling:
                plan += self._plan(request, step.left(self._decodes(step)), decoding=False)
            if not plan:
                continue
            if not self._make_room(
                    index, lambda plan=plan: self._blocks_for(plan) <= self.pool.num_free, step):
                continue
            self._claim(plan, step)

    def _all_decodes(self, held: set[str]) -> dict[int, list[str]]:
        """Every decode of this step, by request, in sample order."""
        decodes: dict[int, list[str]] = {}
        for seq_id, decoding in self._decoding.items():
            if seq_id not in held:
                decodes.setdefault(decoding.request, []).append(seq_id)
        for seq_ids in decodes.values():
            seq_ids.sort(key=lambda s: self._decoding[s].position)
        return decodes

    def _admit(self, step: _Step) -> list[int]:
        """Admit waiting requests while the limits, the budget and the free blocks allow."""
        scheduler, admitted = self.scheduler, []
        while (budget := step.left(self._decodes(step))) and \
                (index := scheduler.next_waiting()) is not None:
            request = self.requests[index]
            plan = self._plan(request, budget, decoding=request.swapped)
            cost = sum(c.count for c in plan)
            if (not plan or not scheduler.admits(cost, self._decodes(step) + step.prefill)
                    or self._blocks_for(plan) > self.pool.num_free):
                break
            scheduler.admit_next()
            if self._log is not None:  # a waiting request's first change in the step
                self._log.add(_saved_request(request))
            if request.swapped:
                self._swap_in(index, request, plan[0], step)
            self._prefilling[index] = None
            self._claim(plan, step)
            admitted.append(index)
        return admitted

    def _plan(self, request: ServingRequest, budget: int, *, decoding: bool) -> list[Chunk]:
        """The prefill chunks of ``request``'s sequences not decoding that fit in ``budget``
        tokens (at most one sequence new to the pool, so that its cache hit cannot be
        evicted meanwhile); ``decoding`` plans a swapped-in request's decodes too."""
        plan: list[Chunk] = []
        for sample in _compute_sequences(request):
            if sample.seq_id in self._decoding and not decoding:
                continue
            if not self.manager.holds(sample.seq_id) and any(c.hit is not None for c in plan):
                continue
            chunk = self._prefill_chunk(request, sample, budget)
            if chunk is None:
                break
            plan.append(chunk)
            budget -= chunk.count
        return plan

    def _decode_chunk(self, request: ServingRequest, sample: Sample) -> Chunk:
        """A decoding sample's chunk: its one token not yet computed."""
        return Chunk(request, sample, sample.computed, 1, None, True)

    def _preempt(self, index: int, step: _Step) -> None:
        """As the shared core preempts; a part-way prefill starts over when readmitted."""
        super()._preempt(index, step)
        self._prefilling.pop(index, None)

    def _free(self, sample: Sample) -> None:
        """Free a sample's blocks; it no longer decodes."""
        self._decoding.pop(sample.seq_id, None)
        super()._free(sample)

    # --- prefills and decodes ------------------------------------------------------------

    def _finish_prefill(self, index: int, request: ServingRequest, sample: Sample,
                        draw: Draw, new_tokens: dict[str, int]) -> None:
        """A sequence whose tokens are all computed: fork a fresh request's samples from it,
        draw each one's next token, and start decoding those that go on."""
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
            if target.finish_reason is None:
                self._decoding[target.seq_id] = _Decoding(request.request_id,
                                                          _position(request, target))
        if all(s.seq_id in self._decoding for s in request.active):
            self._prefilling.pop(request.request_id, None)

    def _sample(self, seq_id: str) -> Sample:
        """The decoding sample ``seq_id``."""
        decoding = self._decoding[seq_id]
        return self.requests[decoding.request].samples[decoding.position]

    # --- all or nothing --------------------------------------------------------------------

    _STEP_STATE = ("unfinished", "clock", "_decoding", "_prefilling", "_chains")

    def checkpoint(self) -> UndoLog:
        """Start a log of what the core changes from now on, for ``restore`` to undo (or
        ``commit`` to keep): the pool, which must be undoable (``course_lib.rollback``),
        logs its own changes, K/V included; the running requests' bookkeeping is saved
        here (a waiting one when the step admits it), at a cost that grows with them, never
        with the pool."""
        if not isinstance(self.pool, UndoablePool):
            raise ValueError(f"checkpoint needs an undoable pool "
                             f"(course_lib.rollback.undoable), got {type(self.pool).__name__}")
        log = UndoLog()
        for undo in self._saved_bookkeeping():
            log.add(undo)
        self.pool.attach(log)
        self._log = log
        return log

    def _saved_bookkeeping(self) -> list[Callable[[], None]]:
        """How to put back the running requests, the scheduler, the manager and the core's
        own state as they are now (everything a step changes but the pool and the waiting
        requests it admits, which ``_admit`` saves as it takes them)."""
        scheduler = self.scheduler
        undo = [saved_fields(scheduler, (n for n in vars(scheduler) if n != "_keys")),
                saved_manager(self.manager), saved_fields(self, self._STEP_STATE)]
        if self.swap is not None:
            undo.append(saved_fields(self.swap, ("_held",)))
        chains = [(chain, len(chain)) for chain in self._chains.values()]
        requests = [_saved_request(self.requests[index]) for index in self.scheduler.running]

        def undo_requests() -> None:
            for chain, length in chains:
                del chain[length:]
            for restore_request in requests:
                restore_request()
        return [*undo, undo_requests]

    def restore(self, log: UndoLog) -> None:
        """Undo everything since ``checkpoint`` returned ``log``."""
        log.undo()
        self.pool.attach(None)
        self._log = None

    def commit(self, log: UndoLog) -> None:
        """Keep everything since ``checkpoint`` returned ``log``; stop logging."""
        self.pool.attach(None)
        self._log = None


def _saved_request(request: ServingRequest) -> Callable[[], None]:
    """How to put ``request`` back as it is now: its preemptions, whether it is swapped
    out, and its samples."""
    preemptions, swapped = request.preemptions, request.swapped
    samples = [_saved_sample(sample) for sample in request.samples]

    def undo() -> None:
        request.preemptions, request.swapped = preemptions, swapped
        for restore_sample in samples:
            restore_sample()
    return undo


def _saved_sample(sample: Sample) -> Callable[[], None]:
    """How to put ``sample`` back as it is now (its tokens only grow, so their count is
    enough; its random generator's state is copied)."""
    length, computed, decoding, reason = (len(sample.tokens), sample.computed,
                                          sample.decoding, sample.finish_reason)
    generator = sample.generator
    state = None if generator is None else generator.get_state()

    def undo() -> None:
        del sample.tokens[length:]
        sample.computed, sample.decoding, sample.finish_reason = computed, decoding, reason
        if state is not None:
            generator.set_state(state)
    return undo


@dataclass(slots=True)
class _Step:
    """One step while it is scheduled: the budget, the decodes sitting it out, the chunks
    claimed, the prefill tokens among them, and who was preempted or swapped."""

    budget: int
    held: set[str] = field(default_factory=set)
    chunks: list[Chunk] = field(default_factory=list)
    prefill: int = 0
    preempted: list[int] = field(default_factory=list)
    swapped_out: dict[int, int] = field(default_factory=dict)
    swapped_in: dict[int, int] = field(default_factory=dict)

    def left(self, decodes: int) -> int:
        """Budget left for prefill chunks when ``decodes`` tokens are decoded."""
        return max(0, self.budget - decodes - self.prefill)


def _position(request: ServingRequest, sample: Sample) -> int:
    """Where ``sample`` (that very object) stands among ``request``'s samples."""
    return next(k for k, s in enumerate(request.samples) if s is sample)


def _compute_sequences(request: ServingRequest) -> list[Sample]:
    """The sequences of a running or waiting request that have tokens to compute: the
    prompt (one sequence, shared by all samples later) of a fresh request, else every
    unfinished sample."""
    samples = [request.samples[0]] if request.fresh else request.active
    return [s for s in samples if s.computed < len(s.tokens)]
