"""The mini serving engine: the serving core, a real model, and sampling.

The engine is online, as vLLM v1's is: :meth:`~PagedEngine.add_request` at any time (also
between the steps of a running batch), :meth:`~PagedEngine.abort`, and
:meth:`~PagedEngine.stream`, which yields each request's new tokens as they are produced.
One :meth:`PagedEngine.step` is one iteration of continuous batching:

1. **schedule**: :class:`~course_lib.serving.ServingCore` (the half that never runs a
   model) hands out the step's token budget as chunks, one token per decoding sample or
   the next chunk of a prompt (chunked prefill), claims their slots in the block tables,
   preempts while the pool lacks blocks, and admits waiting requests, taking a prompt's
   cached full blocks as they are when prefix caching is on.
2. **run**: one forward pass over every scheduled chunk, decodes and prefill chunks mixed
   (``PagedBatch``): K/V are written through the block tables and read back through them.
3. **sample**: each sample whose tokens are now all computed draws its next token (a
   request with ``n`` samples prefills its prompt once; then its samples fork its blocks).
4. **retire**: finished samples free their blocks at once; a finished request leaves.

A block is cached (hashed into chapter 04's chain) when the step that computes it claims
its last slot, so a request admitted in the same step can already share it: the pass
writes every chunk's K/V into the pool before any attention reads it. A prompt's
unscheduled chunks are not in the block table yet, so they are never found too early. A
step that raises (the kernel, the model, the sampler) is rolled back completely: the
engine is left exactly as it was before the step (cache included), so the caller can
retry it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from course_lib.attention import kernel_support_problem
from course_lib.attention.backend import require_kernels
from course_lib.cache_config import CacheConfig, kv_format
from course_lib.engine.kv_quant import kv_quantization
from course_lib.engine.model import Attention, LlamaModel
from course_lib.engine.paged_forward import DecodeAttention, PagedBatch, check_decode_attention
from course_lib.engine.requests import (
    FinishReason,
    GenerationRequest,
    PreparedRequest,
    RequestOutput,
    prepare_requests,
)
from course_lib.engine.sampling import SamplingParams
from course_lib.paged import FreeOrder
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.scheduler import SchedulerConfig
from course_lib.serving import Chunk, Schedule, ServingCore
from course_lib.validate import check_int

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


class PagedEngine:
    """Serves a :class:`LlamaModel` from a paged KV pool of ``num_blocks`` blocks.

    ``scheduler`` sets the policy and limits (``max_num_seqs`` counts requests,
    ``max_num_batched_tokens`` the tokens of one step); only recompute preemption is
    implemented. ``chunked_prefill`` lets a prompt longer than the step's remaining budget
    be computed over several steps (vLLM v1's default); without it a prompt waits for a
    step with room for all of it. ``prefix_caching`` reuses cached full prompt blocks;
    ``cpu_tier_bytes`` keeps evicted ones in a CPU tier of that size and copies them back.
    ``decode_attention`` is ``"triton"`` (the course's kernel: on a GPU, or under the
    Triton interpreter on a CPU) or ``"torch"`` (the gather-based reference). Give a Hugging
    Face ``tokenizer`` to pass text prompts and get text back.

    ``kv_cache_dtype="fp8"`` (or ``"fp8_e4m3"``, ``"fp8_e5m2"``; chapter 10) keeps K/V in
    FP8 with one K and one V scale per layer: ``kv_scales`` ``[num_layers, 2]``
    (``course_lib.engine.kv_quant.calibrate_kv_scales`` measures them), 1.0 each if not
    given, as vLLM's default. A block then weighs half a 16-bit one.
    """

    def __init__(self, model: LlamaModel, *, num_blocks: int, block_size: int = 16,
                 scheduler: SchedulerConfig | None = None, tokenizer: Any | None = None,
                 decode_attention: DecodeAttention = "triton", prefix_caching: bool = False,
                 chunked_prefill: bool = True, free_order: FreeOrder = "vllm",
                 cpu_tier_bytes: int = 0, kv_cache_dtype: str = "auto",
                 kv_scales: torch.Tensor | Sequence[Sequence[float]] | None = None) -> None:
        scheduler = scheduler or SchedulerConfig()
        if not isinstance(model, LlamaModel):
            raise ValueError(f"model must be a LlamaModel, got {type(model).__name__}")
        if not isinstance(scheduler, SchedulerConfig):
            raise ValueError(f"scheduler must be a SchedulerConfig, got {scheduler!r}")
        if scheduler.preemption != "recompute":
            raise ValueError(f"preemption {scheduler.preemption!r} is not implemented by the "
                             "engine; use 'recompute' (swap is modelled in the simulator)")
        cache = CacheConfig(num_blocks, block_size, prefix_caching, free_order,
                            cpu_tier_bytes or None,  # a tier keeps evicted K/V on the CPU
                            kv_cache_dtype)
        _check_decode_attention(model, decode_attention)
        config = model.config
        fmt = kv_format(kv_cache_dtype)
        if fmt is None and kv_scales is not None:
            raise ValueError(f"kv_scales are for an FP8 cache; kv_cache_dtype is "
                             f"{kv_cache_dtype!r}")
        self.kv_quant = None if fmt is None else kv_quantization(fmt, config.num_layers,
                                                                kv_scales)
        self.model, self.tokenizer = model, tokenizer
        self.scheduler_config, self.decode_attention = scheduler, decode_attention
        pool = cache.make_pool(rollback=True, num_kv_heads=config.num_kv_heads,
                               head_dim=config.head_dim, num_layers=config.num_layers,
                               dtype=model.dtype, device=model.device)
        self.core = ServingCore(scheduler, pool, chunked_prefill=chunked_prefill)
        self.pool, self.manager = self.core.pool, self.core.manager
        self.step_index = 0
        self._totals = dict.fromkeys((f.name for f in fields(EngineStats)), 0)

    @staticmethod
    def blocks_in_budget(model: LlamaModel, budget_bytes: int, *, block_size: int = 16,
                         kv_cache_dtype: str = "auto") -> int:
        """How many blocks (the null block included) ``budget_bytes`` of K/V hold for
        ``model``: an FP8 cache's are half as heavy as a 16-bit one's, so twice as many
        (its per-layer scales cost nothing per token)."""
        check_int("budget_bytes", budget_bytes, 1)
        check_int("block_size", block_size, 1)
        fmt = kv_format(kv_cache_dtype)
        per_token = model.config.kv_bytes_per_token(model.dtype if fmt is None else fmt.dtype)
        return budget_bytes // (per_token * block_size)

    @property
    def prefix_caching(self) -> bool:
        """Whether cached prompt blocks are reused."""
        return isinstance(self.pool, PrefixCachingBlockPool)

    @property
    def chunked_prefill(self) -> bool:
        """Whether a prompt may be computed over several steps."""
        return self.core.chunked_prefill

    @property
    def unfinished(self) -> tuple[int, ...]:
        """Ids of the requests waiting or running, oldest first."""
        return tuple(self.core.unfinished)

    # --- requests in, outputs out --------------------------------------------------------

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request now (also while others run); returns its request id.

        Raises ValueError, changing nothing, for a request that might never run: one whose
        samples, each at full length and no longer sharing (as after a preemption), need
        more blocks than the pool has, or (without chunked prefill) more tokens than
        ``max_num_batched_tokens`` allows in one step.
        """
        return self.submit([prompt], params)[0]

    def submit(self, requests: Sequence[Prompt], params: SamplingParams | None = None
               ) -> list[int]:
        """Queue several requests at once (all or, on a ValueError, none); their ids."""
        prepared = prepare_requests(requests, params, self.model.config, self.tokenizer,
                                    first_id=len(self.core.requests))
        for request in prepared:
            self.core.check_fits(request)
        for request in prepared:
            self.core.add(request)
        return [r.request_id for r in prepared]

    def abort(self, request_id: int) -> RequestOutput:
        """Stop an unfinished request now: its unfinished samples end with ``"abort"``, its
        blocks are freed; returns its output (the tokens generated so far)."""
        return self.core.abort(request_id).output(self.tokenizer)

    @property
    def has_unfinished(self) -> bool:
        """Whether some request is waiting or running."""
        return bool(self.core.unfinished)

    @property
    def done(self) -> bool:
        """Whether every request added so far has finished (True before the first)."""
        return not self.core.unfinished

    def outputs(self) -> list[RequestOutput]:
        """Every request's output, in the order they were added, once all are done."""
        if not self.done:
            raise ValueError("some requests have not finished; call step() until done")
        return [r.output(self.tokenizer) for r in self.core.requests]

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
        return [finished.get(i) or self.core.requests[i].output(self.tokenizer) for i in ids]

    def stats(self) -> EngineStats:
        """Totals since the engine was made."""
        return EngineStats(**self._totals)

    # --- one step ------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Run one iteration: schedule (and admit), one forward pass, sample, retire.

        If anything in it raises (the kernel, the model, the sampler), the engine is
        restored to its state before the call, K/V of cached blocks included.
        """
        if not self.core.unfinished:
            raise ValueError("nothing to run: add requests first")
        log = self.core.checkpoint()
        totals, step_index = dict(self._totals), self.step_index
        try:
            schedule = self.core.schedule()
            logits = self._forward(list(schedule.chunks)) if schedule.chunks else None
            eos = self.model.config.eos_token_ids
            new_tokens = self.core.advance(
                schedule, lambda i, request, sample: request.add_token(sample, logits[i], eos))
            report = self._report(schedule, self.core.retire(new_tokens), new_tokens)
        except BaseException:
            self.core.restore(log)
            self._totals, self.step_index = totals, step_index
            raise
        self.core.commit(log)
        return report

    def _forward(self, chunks: list[Chunk]) -> torch.Tensor:
        """One pass over every chunk; the logits of each chunk's last token."""
        spans = [range(c.start, c.start + c.count) for c in chunks]
        attention = self._attention(chunks, spans)
        ids = [c.sample.tokens[p] for c, span in zip(chunks, spans, strict=True) for p in span]
        positions = [p for span in spans for p in span]
        return self.model.next_token_logits(ids, positions, attention,
                                            last_of=[c.count for c in chunks])

    def _attention(self, chunks: list[Chunk], spans: list[range]) -> Attention:
        """The step's attention: one ``PagedBatch`` through the block tables, its K/V
        written at the slots of each chunk's ``span`` of positions."""
        manager = self.manager
        block_table = manager.table_tensor([c.sample.seq_id for c in chunks],
                                           device=self.model.device)
        slots = [slot for c, span in zip(chunks, spans, strict=True)
                 for slot in manager.slot_mapping(c.sample.seq_id, span)]
        return PagedBatch(self.pool, slots, block_table, [c.start for c in chunks],
                          [c.count for c in chunks], self.decode_attention,
                          kv_quant=self.kv_quant)

    def _report(self, schedule: Schedule, touched: list[tuple[PreparedRequest, bool]],
                new_tokens: dict[str, int]) -> StepReport:
        """The step's report, with one update per request that produced tokens; adds it to
        the totals."""
        chunks = schedule.chunks
        updates = tuple(RequestUpdate(
            request.request_id,
            tuple((new_tokens[s.seq_id],) if s.seq_id in new_tokens else ()
                  for s in request.samples),
            tuple(s.finish_reason for s in request.samples),
            request.output(self.tokenizer) if done else None) for request, done in touched)
        decoded = sum(1 for c in chunks if c.decode)
        prefill = sum(c.count for c in chunks) - decoded
        cached = sum(c.start for c in chunks if c.hit is not None)
        totals = self._totals
        totals["steps"] += 1
        totals["generated_tokens"] += len(new_tokens)
        totals["prefill_tokens"] += prefill
        totals["cached_tokens"] += cached
        totals["recomputed_tokens"] += sum(c.count for c in chunks
                                           if c.request.preemptions and not c.decode)
        totals["preemptions"] += len(schedule.preempted)
        totals["peak_batch"] = max(totals["peak_batch"], len(new_tokens))
        report = StepReport(self.step_index, schedule.admitted,
                            tuple((c.sample.seq_id, c.count) for c in chunks), prefill,
                            cached, decoded, len(new_tokens), schedule.preempted,
                            tuple(r.request_id for r, done in touched if done),
                            self.pool.num_free, updates)
        self.step_index += 1
        return report


def _check_decode_attention(model: LlamaModel, decode_attention: DecodeAttention) -> None:
    """Raise, naming what would work, unless ``decode_attention`` can serve ``model`` here."""
    check_decode_attention(decode_attention)
    if decode_attention != "triton":
        return
    require_kernels()
    problem = kernel_support_problem(model.config.head_dim, model.dtype, model.device)
    if problem is not None:
        raise ValueError(f"decode_attention='triton' cannot serve this model: {problem}. "
                         f"decode_attention='torch' (the gather-based reference) can")
