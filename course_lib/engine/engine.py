"""The mini serving engine: the course's scheduler, paged pool and kernel around a real model.

One :meth:`PagedEngine.step` is one iteration of continuous batching, in the simulator's
order (``course_lib.simulator``), but with real tensors:

1. **grow**: every running sequence claims a slot for the token it feeds this step
   (``append_tokens``: a new block when its last one is full, a copy when its last block is
   shared). When the pool is empty, the scheduler names a victim (``Scheduler.victim``:
   the newest under FCFS, the least important under the priority policy), whose blocks
   are freed and which goes back to the front of the queue, until the claim succeeds or
   the claimant is itself the victim.
2. **admit**: unless something was preempted, waiting requests are admitted in the
   scheduler's order while the limits allow (``Scheduler.admits``) and their prefill fits
   in the free blocks.
3. **run**: one prefill pass for the admitted requests (a preempted one is recomputed from
   its prompt and the tokens it had generated, so nothing is lost) and one decode pass,
   through the Triton paged kernel, for everyone else; then each sample draws its next
   token. A request with ``n`` parallel samples is prefilled once, and its samples fork
   the prompt's blocks (shared until one writes into a partly filled block).
4. **finish**: finished samples free their blocks; a request whose samples are all done
   leaves the running set.

The scheduler keeps order, never memory, exactly as in the simulator; the engine owns the
``PagedKVManager``. The scheduler takes its requests up front, so requests are
:meth:`~PagedEngine.submit`-ted as a batch (later arrivals carry an ``arrival`` step).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from course_lib.attention.backend import require_kernels
from course_lib.engine.model import LlamaModel
from course_lib.engine.paged_forward import (
    DECODE_ATTENTIONS,
    DecodeAttention,
    PagedDecode,
    PagedPrefill,
)
from course_lib.engine.requests import (
    GenerationRequest,
    PreparedRequest,
    RequestOutput,
    Sample,
    prepare_requests,
)
from course_lib.engine.sampling import SamplingParams
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.scheduler import Scheduler, SchedulerConfig
from course_lib.workload import Request


@dataclass(frozen=True)
class StepReport:
    """What one engine step did (request ids are submission indices)."""

    step: int
    admitted: tuple[int, ...]
    prefill_tokens: int
    decoded: int
    generated: int
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    free_blocks: int


@dataclass(frozen=True)
class EngineStats:
    """Totals over the engine's steps so far."""

    steps: int
    generated_tokens: int
    prefill_tokens: int
    recomputed_tokens: int
    preemptions: int
    peak_batch: int

    @property
    def avg_batch(self) -> float:
        """Tokens generated per step (sequences decoded or prefilled per step)."""
        return self.generated_tokens / self.steps if self.steps else 0.0


class PagedEngine:
    """Serves a :class:`LlamaModel` from a paged KV pool of ``num_blocks`` blocks.

    ``scheduler`` sets the policy and limits (``max_num_seqs`` counts requests); only
    recompute preemption is implemented. ``decode_attention`` is ``"triton"`` (the course's
    kernel: on a GPU, or under the Triton interpreter on a CPU) or ``"torch"`` (the
    gather-based reference, for fast CPU runs). Give a Hugging Face ``tokenizer`` to pass
    text prompts and get text back.
    """

    def __init__(self, model: LlamaModel, *, num_blocks: int, block_size: int = 16,
                 scheduler: SchedulerConfig | None = None, tokenizer: Any | None = None,
                 decode_attention: DecodeAttention = "triton") -> None:
        scheduler = scheduler or SchedulerConfig()
        if not isinstance(model, LlamaModel):
            raise ValueError(f"model must be a LlamaModel, got {type(model).__name__}")
        if not isinstance(scheduler, SchedulerConfig):
            raise ValueError(f"scheduler must be a SchedulerConfig, got {scheduler!r}")
        if scheduler.preemption != "recompute":
            raise ValueError(f"preemption {scheduler.preemption!r} is not implemented by the "
                             "engine; use 'recompute' (swap is modelled in the simulator)")
        if decode_attention not in DECODE_ATTENTIONS:
            raise ValueError(f"unknown decode_attention {decode_attention!r}; expected one of "
                             f"{', '.join(DECODE_ATTENTIONS)}")
        if decode_attention == "triton":
            require_kernels()
        config = model.config
        self.model = model
        self.tokenizer = tokenizer
        self.scheduler_config = scheduler
        self.decode_attention = decode_attention
        self.pool = BlockPool(num_blocks, block_size, num_kv_heads=config.num_kv_heads,
                              head_dim=config.head_dim, num_layers=config.num_layers,
                              dtype=model.dtype, device=model.device)
        self.manager = PagedKVManager(self.pool)
        self.step_index = 0
        self._requests: list[PreparedRequest] = []
        self._arrivals: deque[int] = deque()
        self._scheduler = Scheduler(scheduler, [])
        self._totals = dict.fromkeys(("steps", "generated_tokens", "prefill_tokens",
                                      "recomputed_tokens", "preemptions", "peak_batch"), 0)

    # --- submitting and collecting -------------------------------------------------------

    def submit(self, requests: Sequence[GenerationRequest | str | Sequence[int]],
               params: SamplingParams | None = None) -> list[int]:
        """Queue a batch of requests (when the engine is idle); returns their request ids.

        Raises ValueError for a request that might never run: one whose samples, each at
        full length and no longer sharing (as after a preemption), need more blocks than
        the pool has, or more tokens than ``max_num_batched_tokens`` allows in one step.
        """
        if not self.done:
            raise ValueError("the engine is still serving a batch; step until done first")
        prepared = prepare_requests(requests, params, self.model.config, self.tokenizer)
        usable = self.pool.num_blocks - 1
        limit = self.scheduler_config.max_num_batched_tokens
        for request in prepared:
            n, full_length = request.params.n, len(request.prompt) + request.params.max_tokens
            blocks = n * self.manager.blocks_needed(full_length)
            if blocks > usable:
                raise ValueError(f"request {request.request_id} needs up to {blocks} blocks "
                                 f"but the pool has {usable} for requests")
            if limit is not None and n * full_length > limit:
                raise ValueError(f"request {request.request_id} may prefill up to "
                                 f"{n * full_length} tokens in one step (recomputing {n} "
                                 f"samples), above max_num_batched_tokens={limit}")
        self._requests = prepared
        self._scheduler = Scheduler(self.scheduler_config, [
            Request(r.request_id, len(r.prompt), r.params.max_tokens, r.arrival, r.priority)
            for r in prepared])
        order = sorted(range(len(prepared)), key=lambda i: (prepared[i].arrival, i))
        self._arrivals = deque(order)
        self.step_index = 0
        return [r.request_id for r in prepared]

    @property
    def done(self) -> bool:
        """Whether every submitted request has finished (True before any submit)."""
        return all(not r.active for r in self._requests)

    def outputs(self) -> list[RequestOutput]:
        """The finished batch's outputs, in submission order."""
        if not self.done:
            raise ValueError("the batch has not finished; call step() until done")
        return [r.output(self.tokenizer) for r in self._requests]

    def generate(self, requests: Sequence[GenerationRequest | str | Sequence[int]],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        """Submit ``requests``, step until all finish, and return their outputs."""
        self.submit(requests, params)
        while not self.done:
            self.step()
        return self.outputs()

    def stats(self) -> EngineStats:
        """Totals since the engine was made."""
        return EngineStats(**self._totals)

    # --- one step --------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Run one iteration: grow, admit, prefill and decode, sample, finish."""
        if self.done:
            raise ValueError("nothing to run: submit requests first")
        scheduler = self._scheduler
        if not scheduler.running and not scheduler.num_waiting:  # idle until the next arrival
            self.step_index = max(self.step_index, self._requests[self._arrivals[0]].arrival)
        while (self._arrivals
               and self._requests[self._arrivals[0]].arrival <= self.step_index):
            scheduler.arrive(self._arrivals.popleft())
        preempted = self._grow()
        admitted = [] if preempted else self._admit()
        decoding = [(self._requests[i], s) for i in scheduler.running if i not in admitted
                    for s in self._requests[i].active]
        prefill_tokens, prefill_samples = self._prefill(admitted)
        self._decode(decoding)
        finished = self._finish()
        generated = len(decoding) + prefill_samples
        if not generated and not preempted:
            raise RuntimeError(f"step {self.step_index} made no progress; this is a bug")
        report = StepReport(self.step_index, tuple(admitted), prefill_tokens, len(decoding),
                            generated, tuple(preempted), tuple(finished), self.pool.num_free)
        totals = self._totals
        totals["steps"] += 1
        totals["generated_tokens"] += generated
        totals["prefill_tokens"] += prefill_tokens
        totals["preemptions"] += len(preempted)
        totals["peak_batch"] = max(totals["peak_batch"], generated)
        self.step_index += 1
        return report

    def _grow(self) -> list[int]:
        """Claim this step's slot for every running sequence, oldest request first,
        preempting the scheduler's victims while the pool is empty; returns the victims."""
        scheduler = self._scheduler
        preempted: list[int] = []
        for i in list(scheduler.running):
            for sample in self._requests[i].active:
                if i not in scheduler.running:
                    break
                while True:
                    try:
                        self.manager.append_tokens(sample.seq_id)
                        break
                    except OutOfBlocks:
                        victim = scheduler.victim()
                        self._preempt(victim)
                        preempted.append(victim)
                        if victim == i:
                            break
        return preempted

    def _preempt(self, index: int) -> None:
        """Free every block of request ``index`` and requeue it; its tokens are kept, and it
        is recomputed (prefilled again) when readmitted."""
        for sample in self._requests[index].active:
            self.manager.free_sequence(sample.seq_id)
        self._scheduler.stop(index)
        self._scheduler.requeue(index)
        self._requests[index].preemptions += 1

    def _admit(self) -> list[int]:
        """Admit waiting requests while the scheduler's limits and the free blocks allow."""
        scheduler, manager = self._scheduler, self.manager
        step_tokens = sum(len(self._requests[i].active) for i in scheduler.running)
        admitted = []
        while (index := scheduler.next_waiting()) is not None:
            request = self._requests[index]
            sequences = _prefill_sequences(request)
            cost = sum(len(s.tokens) for s in sequences)
            blocks = sum(manager.blocks_needed(len(s.tokens)) for s in sequences)
            if not scheduler.admits(cost, step_tokens) or blocks > self.pool.num_free:
                break
            scheduler.admit_next()
            for sample in sequences:
                manager.add_sequence(sample.seq_id, len(sample.tokens))
            step_tokens += cost
            admitted.append(request.request_id)
        return admitted

    def _prefill(self, admitted: list[int]) -> tuple[int, int]:
        """Prefill the admitted requests in one pass, sample each one's next tokens and fork
        fresh requests' samples; returns (tokens prefilled, tokens generated)."""
        if not admitted:
            return 0, 0
        requests = [self._requests[i] for i in admitted]
        sequences = [s for r in requests for s in _prefill_sequences(r)]
        lengths = [len(s.tokens) for s in sequences]
        slots = [slot for s in sequences
                 for slot in self.manager.slot_mapping(s.seq_id, range(len(s.tokens)))]
        attention = PagedPrefill(self.pool, slots, lengths)
        ids = [token for s in sequences for token in s.tokens]
        positions = [p for length in lengths for p in range(length)]
        rows = iter(self.model.next_token_logits(ids, positions, attention, last_of=lengths))
        eos = self.model.config.eos_token_ids
        generated = 0
        for request in requests:
            if request.fresh:
                row, parent = next(rows), request.samples[0].seq_id
                for sample in request.samples:
                    if sample.seq_id != parent:
                        self.manager.fork(parent, sample.seq_id)
                    request.add_token(sample, row, eos)
                generated += len(request.samples)
            else:
                active = request.active
                self._totals["recomputed_tokens"] += sum(len(s.tokens) for s in active)
                for sample in active:
                    request.add_token(sample, next(rows), eos)
                generated += len(active)
        return sum(lengths), generated

    def _decode(self, decoding: list[tuple[PreparedRequest, Sample]]) -> None:
        """One decode pass: each sample feeds its last token; then each draws the next."""
        if not decoding:
            return
        samples = [s for _, s in decoding]
        block_table, seq_lens = self.manager.batch_tables([s.seq_id for s in samples],
                                                          device=self.model.device)
        positions = [len(s.tokens) - 1 for s in samples]
        slots = [self.manager.slot_mapping(s.seq_id, [p])[0]
                 for s, p in zip(samples, positions, strict=True)]
        attention = PagedDecode(self.pool, slots, block_table, seq_lens, self.decode_attention)
        logits = self.model.next_token_logits([s.tokens[-1] for s in samples], positions,
                                              attention)
        eos = self.model.config.eos_token_ids
        for (request, sample), row in zip(decoding, logits, strict=True):
            request.add_token(sample, row, eos)

    def _finish(self) -> list[int]:
        """Free the blocks of samples that just finished; retire finished requests."""
        finished = []
        live = set(self.manager.sequences)
        for i in list(self._scheduler.running):
            request = self._requests[i]
            for sample in request.samples:
                if sample.finish_reason is not None and sample.seq_id in live:
                    self.manager.free_sequence(sample.seq_id)
            if not request.active:
                self._scheduler.stop(i)
                finished.append(i)
        return finished


def _prefill_sequences(request: PreparedRequest) -> list[Sample]:
    """The sequences a request's prefill creates: one for the shared prompt of a fresh
    request, else (recompute after preemption) one per unfinished sample."""
    return [request.samples[0]] if request.fresh else request.active
