"""The serving core's lazy twin: the simulator's and the cluster's, where a step costs work
only for its events.

A decode that needs no new block changes nothing in the pool, so :class:`LazyServingCore`
does not touch it. A decoding request is one slotted record (:class:`_Decoding`): the step
at whose start its sample's ``computed`` and ``tokens`` were last exact, the step whose
token starts its next block, and the step that draws its last token. The record is filed
under those two steps; when one comes, the request claims its block (preempting, most
protected first, as :class:`~course_lib.serving.ServingCore` does) or finishes. Its block
table grows at its claims (a stretch of quiet steps', :meth:`LazyServingCore.skip_to`, in
one go); its tokens are caught up when it finishes, is preempted or aborted. A request's
new tokens are its positions (the caller draws nothing), so a manager that keeps token ids
gets them without a catch-up.

It schedules exactly as the eager core does (``tests/test_serving_core_differential.py``
holds the two to the same block tables after every step) for the requests it takes: one
sample each, prefilled whole (no chunked prefill), by recompute or swap. Admission,
cache and tier hits and preemption are the shared core's
(:class:`~course_lib.serving.BaseServingCore`). With prefix caching, a lazy decode's full
blocks get their hashes only when it is freed (finished, preempted, aborted) or synced,
all in one call (as after ``PrefixCachingKVManager.append_tokens(..., cache=False)``; its
token ids, positions this core made, go to the manager unchecked), which
nobody can notice if nobody else could look for them meanwhile: every request brings a
cache salt of its own (the simulator's requests share nothing), or the caller promises a
closed loop (``closed_loop``: no prompt continues a sequence still decoding, as in a
conversation whose next turn arrives after the previous one finished,
``course_lib.cluster``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from course_lib.paged import BlockPool
from course_lib.prefix_cache import BlockHash
from course_lib.scheduler import SchedulerConfig
from course_lib.serving import (
    BaseServingCore,
    Chunk,
    Sample,
    Schedule,
    ServingRequest,
    _Step,
)


@dataclass(slots=True)
class _Decoding:
    """A decoding request: its request and sample, its place in the claim order (the
    scheduler's ``claim_key``, fixed while it runs), the step at whose start the sample's
    ``computed`` and ``tokens`` were last exact, the step whose token starts its next block
    (``claim``) and the step that draws its last token (``end``). A bucket entry is live
    while this very record is the request's and names the step it is filed under."""

    request: ServingRequest
    sample: Sample
    key: tuple[int, ...]
    since: int
    claim: int
    end: int


class LazyServingCore(BaseServingCore):
    """The waiting and running requests over ``pool`` (with or without prefix caching, a
    CPU tier, or swap space), scheduled as the eager core schedules them but touched only
    at their events (see the module). ``closed_loop`` lets requests with prefix caching
    share blocks (any salt): the caller promises that no prompt continues a sequence still
    decoding."""

    def __init__(self, config: SchedulerConfig, pool: BlockPool, *,
                 closed_loop: bool = False) -> None:
        if not isinstance(closed_loop, bool):
            raise ValueError(f"closed_loop must be a bool, got {closed_loop!r}")
        super().__init__(config, pool, chunked_prefill=False)
        self.closed_loop = closed_loop
        self._salts: set[str] = set()  # prefix caching without a closed loop: salts seen
        self._decoding: dict[int, _Decoding] = {}  # by request id
        self._claims: dict[int, list[_Decoding]] = {}  # step -> decodes that claim a block
        self._ends: dict[int, list[_Decoding]] = {}  # step -> decodes that draw their last
        self._short: int | None = None  # a waiting request that lacked blocks (_admit)

    def _check_supported(self, request: ServingRequest) -> None:
        """Refuse a request of several samples, and, with prefix caching outside a closed
        loop, one whose cache salt is missing or not its own (see the module)."""
        if len(request.samples) != 1:
            raise ValueError(f"request {request.request_id}: a lazy core takes one sample "
                             f"per request; got {len(request.samples)} samples")
        if not self._caching or self.closed_loop:
            return
        salt = request.cache_salt
        if salt is None or salt in self._salts:
            raise ValueError(f"request {request.request_id}: a lazy core with prefix caching "
                             f"takes a cache salt of its own per request (the simulator's "
                             f"requests share nothing); got cache_salt={salt!r}")

    def add(self, request: ServingRequest, *, known_hashes: Sequence[BlockHash] = ()) -> None:
        """Queue a request as the shared core does (``known_hashes``: its prompt's hashes
        already computed); its cache salt is taken from then on, with prefix caching
        outside a closed loop."""
        super().add(request, known_hashes=known_hashes)
        if self._caching and not self.closed_loop:
            self._salts.add(request.cache_salt)

    # --- one step ------------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """This step's block claims (preempting while the pool is empty), then, unless
        someone was preempted, its admissions; only those are listed as chunks."""
        if self.clock not in self._claims and not self.scheduler.num_waiting:
            return Schedule((), len(self._decoding), (), (), {}, {})  # a step of decodes only
        return super().schedule()

    def advance(self, schedule: Schedule) -> list[ServingRequest]:
        """Record the step as computed: every decoding sample decodes its position (caught
        up later, at its next event), an admitted prompt draws its first token; the
        requests whose last token this step drew (their blocks still held, for
        ``retire``)."""
        step, finished = self.clock, []
        for chunk in schedule.chunks:
            if chunk.decode:
                continue  # a block claim: its token is one more step to catch up
            request, sample = chunk.request, chunk.sample
            sample.computed = chunk.start + chunk.count
            request.append_token(sample, len(sample.tokens), ())
            sample.decoding = True
            if sample.finish_reason is None:
                self._start_decoding(request, sample)
            else:
                finished.append(request)
        decoding = self._decoding
        for entry in self._ends.pop(step, ()):
            if decoding.get(entry.request.request_id) is entry:
                self._catch_up(entry, step + 1)
                entry.sample.finish_reason = "length"
                finished.append(entry.request)
        self._claims.pop(step, None)
        self.clock += 1
        return finished

    def retire(self, finished: list[ServingRequest]) -> list[ServingRequest]:
        """Free the blocks of the requests ``advance`` found finished and retire them, in
        the running set's order (the order their blocks are freed); that list, sorted."""
        scheduler = self.scheduler
        if len(finished) > 1:
            finished.sort(key=lambda r: scheduler.admission_rank(r.request_id))
        for request in finished:
            self._free(request.samples[0])  # a running request's one sample holds blocks
            scheduler.stop(request.request_id)
            self._forget(request)
        return finished

    def sync_all(self) -> None:
        """Catch every decoding request up to now, e.g. before a snapshot."""
        for entry in self._decoding.values():
            self._catch_up(entry, self.clock)
            self._append(entry.sample, entry.sample.computed)
            if self._caching:  # every full block gets its hash
                self.manager.cache_full_blocks(entry.sample.seq_id)
                self._short = None

    # --- claims and admissions -------------------------------------------------------------

    def _schedule_running(self, step: _Step) -> None:
        """This step's decodes whose token starts a new block claim it, most protected
        first, preempting while the pool is empty. One block, never shared (one sample per
        request and no partial block is ever a cache hit), so there is no plan to price."""
        due = self._due_claims()
        if not due:
            return
        pool, running = self.pool, self.scheduler.running

        def has_free() -> bool:
            return pool.num_free > 0

        for entry in due:
            index = entry.request.request_id
            if index not in running:
                continue  # preempted earlier in this step
            if not pool.num_free and not self._make_room(index, has_free, step):
                continue
            start = self._file_next_claim(entry)  # the hot path: not through _claim
            self._append(entry.sample, start + 1)  # hashed when freed or synced
            step.chunks.append(Chunk(entry.request, entry.sample, start, 1, None, True))

    def _due_claims(self) -> list[_Decoding]:
        """The decodes whose token starts a new block this step, in claim order."""
        entries = self._claims.get(self.clock)
        if not entries:
            return []
        clock, decoding = self.clock, self._decoding
        due = [e for e in entries if decoding.get(e.request.request_id) is e and e.claim == clock]
        due.sort(key=_claim_key)
        return due

    def _file_next_claim(self, entry: _Decoding) -> int:
        """File a decode that claims a block this step under its next block's step; the
        position of this step's token (a multiple of the block size)."""
        clock = self.clock
        entry.claim = clock + self.pool.block_size
        if entry.claim <= entry.end:
            self._claims.setdefault(entry.claim, []).append(entry)
        return entry.sample.computed + clock - entry.since

    def _admit(self, step: _Step) -> list[int]:
        """Admit waiting requests, whole prompts, while the limits, the budget and the free
        blocks allow (the eager core's rule, for one sequence).

        A request that lacked blocks is not priced again until this core frees blocks,
        hashes some or admits a request (each clears ``_short``): until then its cache hit
        holds no more blocks than it did, and each block that went since was taken from
        the free ones, so it still lacks blocks (a queue waiting on a full pool costs
        nothing per step)."""
        scheduler, admitted, decodes = self.scheduler, [], len(self._decoding)
        while (budget := step.left(decodes)) and (index := scheduler.next_waiting()) is not None:
            if index == self._short:
                break
            request = self.requests[index]
            chunk = self._prefill_chunk(request, request.samples[0], budget)
            if chunk is None or not scheduler.admits(chunk.count, decodes + step.prefill):
                break
            if self._blocks_for([chunk]) > self.pool.num_free:
                self._short = index
                break
            scheduler.admit_next()
            if request.swapped:
                self._swap_in(index, request, chunk, step)
            self._claim([chunk], step)
            self._short = None
            admitted.append(index)
        return admitted

    # --- quiet steps -----------------------------------------------------------------------

    def quiet_until(self) -> int:
        """The first step from the clock on that may admit, preempt or finish a request;
        every step before it is quiet: its decodes draw their tokens and those that start a
        block claim a free one (``skip_to`` runs them in one call). The clock itself while
        nothing decodes or a waiting request may be admitted."""
        decoding, waiting = self._decoding, self.scheduler.next_waiting()
        if not decoding or (waiting is not None and waiting != self._short):
            return self.clock
        # Each decode's next claim lies within a block's steps of the clock and recurs once
        # a block, so the (free + 1)-th claim from now is the first that may find no block.
        claims = sorted(map(_claim_step, decoding.values()))
        rounds, nth = divmod(self.pool.num_free, len(claims))
        starved = claims[nth] + rounds * self.pool.block_size
        return min(starved, min(map(_end_step, decoding.values())))

    def skip_to(self, step: int) -> None:
        """Run the quiet steps from the clock up to ``step`` (at most ``quiet_until()``)
        at the cost of their block claims: a simulator's stretch of plain decoding. The
        pool hands out the stretch's blocks in one call, in the order its steps claim them,
        and each decode's table grows once."""
        if type(step) is not int or not self.clock <= step <= self.quiet_until():
            raise ValueError(f"step must be an int from the clock ({self.clock}) up to "
                             f"quiet_until() ({self.quiet_until()}), got {step!r}")
        claims, ends = self._claims, self._ends
        order: list[int] = []  # the claiming request of each block, in claim order
        reach: dict[int, tuple[str, int]] = {}  # request: its sequence, tokens it reaches
        for clock in range(self.clock, step):
            self.clock = clock
            for entry in self._due_claims():
                index = entry.request.request_id
                order.append(index)
                reach[index] = (entry.sample.seq_id, self._file_next_claim(entry) + 1)
            claims.pop(clock, None)
            ends.pop(clock, None)  # stale: a live decode's last token ends a quiet stretch
        self.clock = step
        taken: dict[int, list[int]] = {index: [] for index in reach}
        for index, block in zip(order, self.pool.allocate_many(len(order)), strict=True):
            taken[index].append(block)
        for index, (seq_id, end) in reach.items():
            self.manager._extend_positions(seq_id, end, taken[index])  # hashed when freed

    # --- decodes and their events ----------------------------------------------------------

    def _start_decoding(self, request: ServingRequest, sample: Sample) -> None:
        """File a request that decodes from the next step on under the steps of its next
        block claim and of its last token."""
        since = self.clock + 1
        left = request.max_tokens - (len(sample.tokens) - len(request.prompt))
        entry = _Decoding(request, sample, self.scheduler.claim_key(request.request_id), since,
                          since + (-sample.computed) % self.pool.block_size, since + left - 1)
        self._decoding[request.request_id] = entry
        if entry.claim <= entry.end:
            self._claims.setdefault(entry.claim, []).append(entry)
        self._ends.setdefault(entry.end, []).append(entry)

    def _catch_up(self, entry: _Decoding, step: int) -> None:
        """Catch a decoding sample up to the start of ``step``: one token per step since it
        was last exact, its position as its id."""
        behind = step - entry.since
        if behind:
            sample = entry.sample
            length = len(sample.tokens)
            sample.tokens.extend(range(length, length + behind))
            sample.computed += behind
            entry.since = step

    def _append(self, sample: Sample, end: int) -> None:
        """Extend a sample's block table to ``end`` tokens, as the shared core does. With
        prefix caching, the tokens past its prompt are their positions (as ``_catch_up``
        makes them), so the manager takes them unchecked, and the blocks that fill stay
        unhashed until the sample is freed or synced (see the module)."""
        if not self._caching:
            super()._append(sample, end)
            return
        length = self.manager.seq_len(sample.seq_id)
        if end > length:
            self.manager._append_positions(sample.seq_id, range(length, end))

    def _free(self, sample: Sample) -> None:
        """Free a sample's blocks, caught up first (with prefix caching its table too, so
        the blocks that filled get hashed); it no longer decodes."""
        entry = self._decoding.pop(self._owner[sample.seq_id], None)
        if entry is not None:
            self._catch_up(entry, self.clock)
            if self._caching:
                self._append(sample, sample.computed)
        super()._free(sample)
        self._short = None


_claim_key = attrgetter("key")
"""A decoding record's place in the claim order."""

_claim_step, _end_step = attrgetter("claim"), attrgetter("end")
"""A decoding record's next claim step and last step."""
