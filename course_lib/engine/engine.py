"""The mini serving engine: the course's scheduler, paged pool and kernel around a real model.

The engine is online, as vLLM v1's is: :meth:`~PagedEngine.add_request` at any time (also
between the steps of a running batch), :meth:`~PagedEngine.abort`, and
:meth:`~PagedEngine.stream`, which yields each request's new tokens as they are produced.
One :meth:`PagedEngine.step` is one iteration of continuous batching:

1. **schedule**: every running request, most protected first (``Scheduler.claim_order``),
   gets a share of the step's token budget (``max_num_batched_tokens``): one token per
   decoding sample, or the next *chunk* of a prompt still being prefilled (chunked
   prefill). Before it claims its slots (``append_tokens``; a new block when the last is
   full, a copy when it is shared), the engine checks that the pool has the blocks; while
   it has not, the scheduler names a victim (``Scheduler.victim``), whose blocks are
   freed and which goes back to the queue to be recomputed later.
2. **admit**: unless something was preempted, waiting requests are admitted in the
   scheduler's order while the limits, the budget and the free blocks allow. With prefix
   caching, a prompt whose first full blocks are cached (chapter 04's hash chain) takes
   those blocks as they are and computes only the rest (at least its last token).
3. **run**: one forward pass over every scheduled chunk, decodes and prefill chunks mixed
   (``PagedBatch``): K/V are written through the block tables and read back through them.
   A sample whose tokens are now all computed draws its next token. A request with ``n``
   samples prefills its prompt once; then its samples fork the prompt's blocks.
4. **finish**: finished samples free their blocks at once; a finished request leaves.

A block is cached (hashed into chapter 04's chain) when the step that computes it claims
its last slot, so a request admitted in the same step can already share it: the pass
writes every chunk's K/V into the pool before any attention reads it. A prompt's
unscheduled chunks are not in the block table yet, so they are never found too early. A
step that raises (the kernel, the model, the sampler) is rolled back completely: the
engine is left exactly as it was before the step (cache included), so the caller can
retry it.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.attention import kernel_support_problem
from course_lib.attention.backend import require_kernels
from course_lib.engine.model import LlamaModel
from course_lib.engine.paged_forward import DECODE_ATTENTIONS, DecodeAttention, PagedBatch
from course_lib.engine.requests import (
    FinishReason,
    GenerationRequest,
    PreparedRequest,
    RequestOutput,
    Sample,
    prepare_request,
    prepare_requests,
)
from course_lib.engine.sampling import SamplingParams
from course_lib.paged import BlockPool, PagedKVManager
from course_lib.prefix_cache import (
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
    block_hashes,
)
from course_lib.scheduler import Scheduler, SchedulerConfig
from course_lib.workload import Request

Prompt = GenerationRequest | str | Sequence[int]


@dataclass(frozen=True)
class RequestUpdate:
    """What one step produced for one request: each sample's new tokens, each sample's
    finish reason (None while it runs), and the whole output once the request is done."""

    request_id: int
    new_token_ids: tuple[tuple[int, ...], ...]
    finish_reasons: tuple[FinishReason | None, ...]
    output: RequestOutput | None = None

    @property
    def finished(self) -> bool:
        """Whether the request is done (and has left the pool)."""
        return self.output is not None


@dataclass(frozen=True)
class StepReport:
    """What one engine step did (request ids are :meth:`PagedEngine.add_request`'s).

    ``scheduled`` lists each sequence's tokens computed this step; ``prefill_tokens`` are
    those of prompts (and recomputations), ``cached_tokens`` the prompt tokens found in the
    prefix cache instead, ``decoded`` the decode tokens.
    """

    step: int
    admitted: tuple[int, ...]
    scheduled: tuple[tuple[str, int], ...]
    prefill_tokens: int
    cached_tokens: int
    decoded: int
    generated: int
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    free_blocks: int
    updates: tuple[RequestUpdate, ...]

    @property
    def num_tokens(self) -> int:
        """Tokens the step's forward pass computed (what ``max_num_batched_tokens`` caps)."""
        return sum(count for _, count in self.scheduled)


@dataclass(frozen=True)
class EngineStats:
    """Totals over the engine's steps so far."""

    steps: int
    generated_tokens: int
    prefill_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    preemptions: int
    peak_batch: int

    @property
    def avg_batch(self) -> float:
        """Tokens generated per step (sequences decoded or prefilled per step)."""
        return self.generated_tokens / self.steps if self.steps else 0.0


@dataclass
class _Chunk:
    """One sequence's share of a step: ``count`` tokens from position ``start``; ``hit`` are
    the cached blocks a sequence new to the pool starts from."""

    request: PreparedRequest
    sample: Sample
    start: int
    count: int
    hit: tuple[int, ...] | None = None  # None: the sequence is already in the pool
    decode: bool = False


class PagedEngine:
    """Serves a :class:`LlamaModel` from a paged KV pool of ``num_blocks`` blocks.

    ``scheduler`` sets the policy and limits (``max_num_seqs`` counts requests,
    ``max_num_batched_tokens`` the tokens of one step); only recompute preemption is
    implemented. ``chunked_prefill`` lets a prompt longer than the step's remaining budget
    be computed over several steps (vLLM v1's default); without it a prompt waits for a
    step with room for all of it. ``prefix_caching`` reuses cached full prompt blocks.
    ``decode_attention`` is ``"triton"`` (the course's kernel: on a GPU, or under the
    Triton interpreter on a CPU) or ``"torch"`` (the gather-based reference). Give a Hugging
    Face ``tokenizer`` to pass text prompts and get text back.
    """

    def __init__(self, model: LlamaModel, *, num_blocks: int, block_size: int = 16,
                 scheduler: SchedulerConfig | None = None, tokenizer: Any | None = None,
                 decode_attention: DecodeAttention = "triton", prefix_caching: bool = False,
                 chunked_prefill: bool = True) -> None:
        scheduler = scheduler or SchedulerConfig()
        if not isinstance(model, LlamaModel):
            raise ValueError(f"model must be a LlamaModel, got {type(model).__name__}")
        if not isinstance(scheduler, SchedulerConfig):
            raise ValueError(f"scheduler must be a SchedulerConfig, got {scheduler!r}")
        if scheduler.preemption != "recompute":
            raise ValueError(f"preemption {scheduler.preemption!r} is not implemented by the "
                             "engine; use 'recompute' (swap is modelled in the simulator)")
        for name, flag in (("prefix_caching", prefix_caching),
                           ("chunked_prefill", chunked_prefill)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool, got {flag!r}")
        _check_decode_attention(model, decode_attention)
        config = model.config
        self.model, self.tokenizer = model, tokenizer
        self.scheduler_config, self.decode_attention = scheduler, decode_attention
        self.chunked_prefill = chunked_prefill
        kv = dict(num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                  num_layers=config.num_layers, dtype=model.dtype, device=model.device)
        self.manager: PagedKVManager
        if prefix_caching:
            self.pool: BlockPool = PrefixCachingBlockPool(num_blocks, block_size, **kv)
            self.manager = PrefixCachingKVManager(self.pool)
        else:
            self.pool = BlockPool(num_blocks, block_size, **kv)
            self.manager = PagedKVManager(self.pool)
        self.step_index = 0
        self._requests: list[PreparedRequest] = []
        self._unfinished: dict[int, None] = {}
        self._scheduler = Scheduler(scheduler, [])
        self._totals = dict.fromkeys(("steps", "generated_tokens", "prefill_tokens",
                                      "cached_tokens", "recomputed_tokens", "preemptions",
                                      "peak_batch"), 0)

    @property
    def prefix_caching(self) -> bool:
        """Whether cached prompt blocks are reused."""
        return isinstance(self.manager, PrefixCachingKVManager)

    # --- requests in, outputs out --------------------------------------------------------

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request now (also while others run); returns its request id.

        Raises ValueError, changing nothing, for a request that might never run: one whose
        samples, each at full length and no longer sharing (as after a preemption), need
        more blocks than the pool has, or (without chunked prefill) more tokens than
        ``max_num_batched_tokens`` allows in one step.
        """
        request = prepare_request(len(self._requests), prompt, params, self.model.config,
                                  self.tokenizer)
        self._check_fits(request)
        self._enqueue(request)
        return request.request_id

    def submit(self, requests: Sequence[Prompt], params: SamplingParams | None = None
               ) -> list[int]:
        """Queue several requests at once (all or, on a ValueError, none); their ids."""
        prepared = prepare_requests(requests, params, self.model.config, self.tokenizer,
                                    first_id=len(self._requests))
        for request in prepared:
            self._check_fits(request)
        for request in prepared:
            self._enqueue(request)
        return [r.request_id for r in prepared]

    def abort(self, request_id: int) -> RequestOutput:
        """Stop an unfinished request now: its unfinished samples end with ``"abort"``, its
        blocks are freed; returns its output (the tokens generated so far)."""
        if request_id not in self._unfinished:
            raise ValueError(f"request {request_id!r} is not running or waiting "
                             f"(unknown, finished or aborted)")
        request = self._requests[request_id]
        if request_id in self._scheduler.running:
            self._release(request)
            self._scheduler.stop(request_id)
        else:
            self._scheduler.withdraw(request_id)
        for sample in request.active:
            sample.finish_reason = "abort"
        del self._unfinished[request_id]
        return request.output(self.tokenizer)

    @property
    def has_unfinished(self) -> bool:
        """Whether some request is waiting or running."""
        return bool(self._unfinished)

    @property
    def done(self) -> bool:
        """Whether every request added so far has finished (True before the first)."""
        return not self._unfinished

    def outputs(self) -> list[RequestOutput]:
        """Every request's output, in the order they were added, once all are done."""
        if not self.done:
            raise ValueError("some requests have not finished; call step() until done")
        return [r.output(self.tokenizer) for r in self._requests]

    def stream(self) -> Iterator[RequestUpdate]:
        """Step while requests are unfinished (including ones added meanwhile), yielding
        each request's new tokens as they come and its output when it finishes."""
        while self.has_unfinished:
            yield from self.step().updates

    def generate(self, requests: Sequence[Prompt],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        """Add ``requests``, step until they finish, and return their outputs in order."""
        ids = self.submit(requests, params)
        finished = {u.request_id: u.output for u in self.stream() if u.output is not None}
        return [finished.get(i) or self._requests[i].output(self.tokenizer) for i in ids]

    def stats(self) -> EngineStats:
        """Totals since the engine was made."""
        return EngineStats(**self._totals)

    def _check_fits(self, request: PreparedRequest) -> None:
        """Raise ValueError for a request this engine could never finish."""
        n, full_length = request.params.n, len(request.prompt) + request.params.max_tokens
        blocks = n * self.manager.blocks_needed(full_length)
        usable = self.pool.num_blocks - 1
        if blocks > usable:
            raise ValueError(f"request {request.request_id} needs up to {blocks} blocks "
                             f"but the pool has {usable} for requests")
        limit = self.scheduler_config.max_num_batched_tokens
        if limit is not None and not self.chunked_prefill and full_length > limit:
            raise ValueError(f"request {request.request_id} may prefill up to {full_length} "
                             f"tokens in one step (recomputing a sample), above "
                             f"max_num_batched_tokens={limit}; enable chunked_prefill")

    def _enqueue(self, request: PreparedRequest) -> None:
        """Register a checked request and queue it."""
        index = self._scheduler.add(Request(request.request_id, len(request.prompt),
                                            request.params.max_tokens,
                                            arrival=request.request_id,
                                            priority=request.priority))
        assert index == request.request_id
        self._requests.append(request)
        self._unfinished[index] = None

    # --- one step ------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Run one iteration: schedule, admit, one forward pass, sample, finish.

        If anything in it raises, the engine is restored to its state before the call.
        """
        if not self._unfinished:
            raise ValueError("nothing to run: add requests first")
        checkpoint = self._checkpoint()
        try:
            return self._step(checkpoint)
        except BaseException:
            self._restore(checkpoint)
            raise

    def _step(self, checkpoint: dict[str, Any]) -> StepReport:
        limit = self.scheduler_config.max_num_batched_tokens
        budget = sys.maxsize if limit is None else limit
        chunks, preempted = self._schedule_running(budget)
        used = sum(c.count for c in chunks)
        admitted = [] if preempted else self._admit(chunks, budget - used)
        checkpoint["evicted"] = self._save_evicted(checkpoint["cached_free"])
        logits = self._forward(chunks) if chunks else torch.empty(0)
        new_tokens = self._sample(chunks, logits)
        updates, finished = self._finish(new_tokens)
        return self._report(chunks, admitted, preempted, finished, updates)

    def _schedule_running(self, budget: int) -> tuple[list[_Chunk], list[int]]:
        """Give running requests their chunks, most protected first, preempting victims
        while the pool lacks blocks; returns (chunks, preempted request ids)."""
        scheduler = self._scheduler
        chunks: list[_Chunk] = []
        preempted: list[int] = []
        for index in scheduler.claim_order():
            if index not in scheduler.running or budget == 0:
                continue
            plan = self._plan(self._requests[index], budget)
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

    def _admit(self, chunks: list[_Chunk], budget: int) -> list[int]:
        """Admit waiting requests while the limits, the budget and the free blocks allow."""
        scheduler = self._scheduler
        admitted = []
        while budget and (index := scheduler.next_waiting()) is not None:
            plan = self._plan(self._requests[index], budget)
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

    def _plan(self, request: PreparedRequest, budget: int) -> list[_Chunk]:
        """The chunks of ``request``'s sequences that fit in ``budget`` tokens (at most one
        sequence new to the pool, so that its cache hit cannot be evicted meanwhile)."""
        live = set(self.manager.sequences)
        plan: list[_Chunk] = []
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
            plan.append(_Chunk(request, sample, start, count, hit, held and sample.decoding))
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

    def _blocks_for(self, plan: list[_Chunk]) -> int:
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

    def _claim(self, plan: list[_Chunk]) -> None:
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
        request = self._requests[index]
        self._release(request)
        for sample in request.samples:
            sample.computed, sample.decoding = 0, False
        self._scheduler.stop(index)
        self._scheduler.requeue(index)
        request.preemptions += 1
        self._totals["preemptions"] += 1

    def _release(self, request: PreparedRequest) -> None:
        """Free the blocks of every sequence of ``request`` that holds some."""
        live = set(self.manager.sequences)
        for sample in request.samples:
            if sample.seq_id in live:
                self.manager.free_sequence(sample.seq_id)

    def _forward(self, chunks: list[_Chunk]) -> torch.Tensor:
        """One pass over every chunk; the logits of each chunk's last token."""
        manager = self.manager
        seq_ids = [c.sample.seq_id for c in chunks]
        block_table, _ = manager.batch_tables(seq_ids, device=self.model.device)
        spans = [range(c.start, c.start + c.count) for c in chunks]
        slots = [slot for c, span in zip(chunks, spans, strict=True)
                 for slot in manager.slot_mapping(c.sample.seq_id, span)]
        attention = PagedBatch(self.pool, slots, block_table, [c.start for c in chunks],
                               [c.count for c in chunks], self.decode_attention)
        ids = [c.sample.tokens[p] for c, span in zip(chunks, spans, strict=True) for p in span]
        positions = [p for span in spans for p in span]
        return self.model.next_token_logits(ids, positions, attention,
                                            last_of=[c.count for c in chunks])

    def _sample(self, chunks: list[_Chunk], logits: torch.Tensor) -> dict[str, int]:
        """Advance each chunk's sequence and draw the next token of every sample now fully
        computed (forking a fresh request's samples first)."""
        eos = self.model.config.eos_token_ids
        new_tokens: dict[str, int] = {}
        for chunk, row in zip(chunks, logits, strict=True):
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
                request.add_token(target, row, eos)
                target.decoding = True
                new_tokens[target.seq_id] = target.tokens[-1]
        return new_tokens

    def _finish(self, new_tokens: dict[str, int]) -> tuple[list[RequestUpdate], list[int]]:
        """Free finished samples' blocks, retire finished requests; one update per request
        that produced a token."""
        updates, finished = [], []
        live = set(self.manager.sequences)
        for index in list(self._scheduler.running):
            request = self._requests[index]
            if not any(s.seq_id in new_tokens for s in request.samples):
                continue
            for sample in request.samples:
                if sample.finish_reason is not None and sample.seq_id in live:
                    self.manager.free_sequence(sample.seq_id)
            output = None
            if not request.active:
                self._scheduler.stop(index)
                del self._unfinished[index]
                finished.append(index)
                output = request.output(self.tokenizer)
            updates.append(RequestUpdate(
                index,
                tuple((new_tokens[s.seq_id],) if s.seq_id in new_tokens else ()
                      for s in request.samples),
                tuple(s.finish_reason for s in request.samples),
                output))
        return updates, finished

    def _report(self, chunks: list[_Chunk], admitted: list[int], preempted: list[int],
                finished: list[int], updates: list[RequestUpdate]) -> StepReport:
        """The step's report; adds it to the totals."""
        decoded = sum(1 for c in chunks if c.decode)
        prefill = sum(c.count for c in chunks) - decoded
        cached = sum(c.start for c in chunks if c.hit is not None)
        generated = sum(len(ids) for u in updates for ids in u.new_token_ids)
        if not chunks and not preempted:
            raise RuntimeError(f"step {self.step_index} made no progress; this is a bug")
        totals = self._totals
        totals["steps"] += 1
        totals["generated_tokens"] += generated
        totals["prefill_tokens"] += prefill
        totals["cached_tokens"] += cached
        totals["recomputed_tokens"] += sum(c.count for c in chunks
                                           if c.request.preemptions and not c.decode)
        totals["peak_batch"] = max(totals["peak_batch"], generated)
        report = StepReport(self.step_index, tuple(admitted),
                            tuple((c.sample.seq_id, c.count) for c in chunks), prefill,
                            cached, decoded, generated, tuple(preempted), tuple(finished),
                            self.pool.num_free, tuple(updates))
        self.step_index += 1
        return report

    # --- all or nothing --------------------------------------------------------------------

    def _checkpoint(self) -> dict[str, Any]:
        """Everything a step can change, pickled (a deep copy, faster than ``deepcopy``),
        except the K/V tensors (see ``_save_evicted``)."""
        state = {
            "pool": {k: v for k, v in vars(self.pool).items() if k != "_kv"},
            "manager": {k: v for k, v in vars(self.manager).items() if k != "pool"},
            "scheduler": vars(self._scheduler),
            "requests": {i: self._requests[i] for i in self._unfinished},
            "engine": {"_unfinished": self._unfinished, "_totals": self._totals,
                       "step_index": self.step_index},
        }
        return {"state": pickle.dumps(state, pickle.HIGHEST_PROTOCOL),
                "cached_free": self._cached_free_blocks()}

    def _cached_free_blocks(self) -> list[int]:
        """Free blocks that still hold a cached prefix."""
        pool = self.pool
        if not isinstance(pool, PrefixCachingBlockPool):
            return []
        return [b for b in pool.free_blocks() if pool.block_hash(b) is not None]

    def _save_evicted(self, cached_free: list[int]) -> tuple[list[int], list[torch.Tensor]]:
        """Copies of the K/V of the free cached blocks this step took: evicted ones are
        overwritten, and a rolled-back step gives them back still cached (a block taken as
        a cache hit is only read, so its copy is merely unneeded)."""
        pool = self.pool
        evicted = [b for b in cached_free if pool.ref_count(b)]
        if not evicted:
            return [], []
        index = torch.tensor(evicted, device=pool.kv_cache(0).device)
        return evicted, [pool.kv_cache(layer)[index].clone()
                         for layer in range(self.model.config.num_layers)]

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        """Put back what ``_checkpoint`` saved (and the K/V of evicted cached blocks)."""
        evicted, saved = checkpoint.get("evicted", ([], []))
        if evicted:
            index = torch.tensor(evicted, device=self.pool.kv_cache(0).device)
            for layer, kv in enumerate(saved):
                self.pool.kv_cache(layer)[index] = kv
        state = pickle.loads(checkpoint["state"])
        vars(self.pool).update(state["pool"])
        vars(self.manager).update(state["manager"])
        vars(self._scheduler).update(state["scheduler"])
        for index, request in state["requests"].items():
            self._requests[index] = request
        vars(self).update(state["engine"])


def _compute_sequences(request: PreparedRequest) -> list[Sample]:
    """The sequences of a running or waiting request that have tokens to compute: the
    prompt (one sequence, shared by all samples later) of a fresh request, else every
    unfinished sample."""
    samples = [request.samples[0]] if request.fresh else request.active
    return [s for s in samples if s.computed < len(s.tokens)]


def _check_decode_attention(model: LlamaModel, decode_attention: DecodeAttention) -> None:
    """Raise, naming what would work, unless ``decode_attention`` can serve ``model`` here."""
    if decode_attention not in DECODE_ATTENTIONS:
        raise ValueError(f"unknown decode_attention {decode_attention!r}; expected one of "
                         f"{', '.join(DECODE_ATTENTIONS)}")
    if decode_attention != "triton":
        return
    require_kernels()
    config = model.config
    problem = kernel_support_problem(config.head_dim, model.dtype, model.device)
    if problem is not None:
        raise ValueError(f"decode_attention='triton' cannot serve this model: {problem}. "
                         f"decode_attention='torch' (the gather-based reference) can")
