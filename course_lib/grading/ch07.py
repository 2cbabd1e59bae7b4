"""Chapter 07 exercise: one engine step, built from a specification.

The learner's ``fn(model, manager, waiting, running, tokens, remaining)`` runs one step of a
small serving engine (the rules are in :func:`reference_step`): decode every running
request (preempting the newest when the pool is out of blocks), admit waiting requests
first come first served and prefill them, sample greedily, free what finished. The check
drives it step by step on requests that arrive at different steps, and compares

* every request's tokens with ordinary contiguous generation (``engine.generate``), and
* the pool after each step (who runs and waits, block tables, free blocks, reference
  counts) with :func:`reference_step` driven the same way.

The model is :func:`exercise_model`, a toy Llama whose weights make positions and every
layer matter: sharp attention, fast rotary frequencies, weights at unit gain. Feed a token
at the wrong position, or skip a layer, and the greedy tokens change
(``tests/test_grading_ch07.py`` measures it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.engine import (
    GenerationRequest,
    LlamaModel,
    PagedBatch,
    SamplingParams,
    generate,
    tiny_config,
)
from course_lib.grading.check import Case, Exercise
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager

BLOCK_SIZE = 4
MAX_STEPS = 60
"""The driver stops a run after this many steps, finished or not."""

StepFn = Callable[..., Any]


@functools.cache
def exercise_model() -> LlamaModel:
    """A toy Llama (3 layers, 4 query heads, 1 KV head, vocabulary 64) made to be sensitive.

    Weights are seeded normals at unit gain (std ``1/sqrt(fan_in)``; embeddings std 1), with
    twice that for the query and key projections, so attention scores span several units
    and attention is sharp; ``rope_theta=10`` turns the fastest rotary pair by a radian per
    position. A random model at the usual std 0.02 attends almost uniformly, so there a
    token fed at a wrong position still gives the same greedy tokens.
    """
    config = tiny_config(num_layers=3, num_kv_heads=1, vocab_size=64, rope_theta=10.0)
    model = LlamaModel(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:  # norm gains stay at 1
                continue
            if name == "embed_tokens.weight":
                std = 1.0
            else:
                gain = 2.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
                std = gain / math.sqrt(param.shape[1])
            param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model.eval()


@dataclass(frozen=True)
class Request:
    """A request of a scenario: it joins ``waiting`` before step ``arrival`` runs."""

    arrival: int
    prompt: tuple[int, ...]
    max_tokens: int


ROOMY = {
    "a": Request(0, (3, 1, 4, 1, 5), 7),
    "b": Request(0, (9, 2, 6), 9),
    "c": Request(2, (5, 3, 5, 8, 9, 7, 2, 6), 4),
    "d": Request(5, (2, 7, 1, 8, 2, 8), 6),
}
"""Ragged prompts arriving at steps 0, 2 and 5; ``c`` finishes and frees blocks for ``d``."""

TIGHT = {
    "a": Request(0, (3, 1, 4, 1, 5), 8),
    "b": Request(0, (9, 2, 6), 8),
    "c": Request(1, (5, 3, 5, 8, 9, 7), 6),
}
"""Needs 10 blocks at its peak: in a pool of 7 free blocks the newest is preempted."""


def reference_step(model: LlamaModel, manager: PagedKVManager, waiting: list[str],
                   running: list[str], tokens: dict[str, list[int]],
                   remaining: dict[str, int]) -> list[str]:
    """One engine step; returns the ids that finished in it (in ``running`` order).

    ``running`` (oldest first) holds requests whose K/V are in the pool for every token but
    the last; ``waiting`` holds requests with nothing in the pool, front first;
    ``tokens[r]`` is all of ``r``'s tokens (prompt and generated); ``remaining[r]`` how
    many it still has to generate.

    1. Decode: each running request, oldest first, gets a slot for its last token
       (``append_tokens``). When the pool is out of blocks, the newest running request
       (possibly the one claiming) is preempted: freed, and put at the front of
       ``waiting`` with its tokens, to be recomputed.
    2. Admit: if nothing was preempted, waiting requests, front first, join the end of
       ``running`` while the pool has free blocks for all their tokens.
    3. One forward pass (``PagedBatch``): one token per decode, all tokens per admitted
       request, each at its position in the request.
    4. Append each request's greedy token; a request with none remaining is freed and
       leaves ``running``.
    """
    preempted = _claim_decode_slots(manager, waiting, running)
    decodes = list(running)
    admitted = [] if preempted else _admit(manager, waiting, running, tokens)
    chunks = [(r, len(tokens[r]) - 1) for r in decodes] + [(r, 0) for r in admitted]
    if chunks:
        _forward_and_sample(model, manager, chunks, tokens, remaining)
    finished = [r for r in running if remaining[r] == 0]
    for request in finished:
        manager.free_sequence(request)
        running.remove(request)
    return finished


def _claim_decode_slots(manager: PagedKVManager, waiting: list[str],
                        running: list[str]) -> list[str]:
    """Step 1 of :func:`reference_step`; returns the preempted ids."""
    preempted: list[str] = []
    for request in list(running):
        while request in running:
            try:
                manager.append_tokens(request)
                break
            except OutOfBlocks:
                victim = running.pop()
                manager.free_sequence(victim)
                waiting.insert(0, victim)
                preempted.append(victim)
    return preempted


def _admit(manager: PagedKVManager, waiting: list[str], running: list[str],
           tokens: dict[str, list[int]]) -> list[str]:
    """Step 2 of :func:`reference_step`; returns the admitted ids."""
    admitted = []
    while waiting and manager.blocks_needed(len(tokens[waiting[0]])) <= manager.pool.num_free:
        request = waiting.pop(0)
        manager.add_sequence(request, len(tokens[request]))
        running.append(request)
        admitted.append(request)
    return admitted


def _forward_and_sample(model: LlamaModel, manager: PagedKVManager,
                        chunks: list[tuple[str, int]], tokens: dict[str, list[int]],
                        remaining: dict[str, int]) -> None:
    """Steps 3 and 4 of :func:`reference_step` for ``(request, first new position)`` chunks."""
    ids = [r for r, _ in chunks]
    positions = [list(range(start, len(tokens[r]))) for r, start in chunks]
    block_table, _ = manager.batch_tables(ids)
    attention = PagedBatch(
        manager.pool, [s for r, p in zip(ids, positions, strict=True)
                       for s in manager.slot_mapping(r, p)],
        block_table, [start for _, start in chunks], [len(p) for p in positions],
        decode_attention="torch")
    counts = [len(p) for p in positions]
    logits = model.next_token_logits([tokens[r][i] for r, p in zip(ids, positions, strict=True)
                                      for i in p], [i for p in positions for i in p],
                                     attention, last_of=counts)
    for request, row in zip(ids, logits, strict=True):
        tokens[request].append(int(row.argmax()))
        remaining[request] -= 1


def new_manager(num_blocks: int) -> PagedKVManager:
    """An empty pool of ``num_blocks`` blocks of ``BLOCK_SIZE`` for :func:`exercise_model`."""
    model = exercise_model()
    config = model.config
    return PagedKVManager(BlockPool(num_blocks, BLOCK_SIZE, num_kv_heads=config.num_kv_heads,
                                    head_dim=config.head_dim, num_layers=config.num_layers,
                                    dtype=model.dtype))


def pool_state(manager: PagedKVManager, waiting: list[str],
               running: list[str]) -> dict[str, Any]:
    """What the check compares after each step, as plain data."""
    pool = manager.pool
    return {
        "running": list(running), "waiting": list(waiting),
        "tables": {r: list(manager.block_table(r)) for r in manager.sequences},
        "free": pool.num_free,
        "ref_counts": {b: pool.ref_count(b) for b in range(1, pool.num_blocks)
                       if pool.ref_count(b)},
    }


def drive(fn: StepFn, requests: dict[str, Request],
          num_blocks: int) -> tuple[dict[str, list[int]], list[dict[str, Any]]]:
    """Run ``fn`` step by step until every request finished (at most ``MAX_STEPS`` steps);
    return every request's tokens and the pool state after each step."""
    model, manager = exercise_model(), new_manager(num_blocks)
    waiting: list[str] = []
    running: list[str] = []
    tokens = {r: list(q.prompt) for r, q in requests.items()}
    remaining = {r: q.max_tokens for r, q in requests.items()}
    states = []
    for step in range(MAX_STEPS):
        waiting.extend(r for r, q in requests.items() if q.arrival == step)
        fn(model, manager, waiting, running, tokens, remaining)
        states.append(pool_state(manager, waiting, running))
        if step >= max(q.arrival for q in requests.values()) and not waiting and not running:
            break
    return tokens, states


def contiguous_tokens(requests: dict[str, Request]) -> dict[str, list[int]]:
    """Prompt plus greedy tokens of every request, from ordinary contiguous generation."""
    outputs = generate(exercise_model(), [
        GenerationRequest(q.prompt, SamplingParams(max_tokens=q.max_tokens))
        for q in requests.values()])
    return {r: [*q.prompt, *o.token_ids[0]]
            for (r, q), o in zip(requests.items(), outputs, strict=True)}


def _generated(tokens: dict[str, list[int]], requests: dict[str, Request]) -> dict[str, Any]:
    """Each request's tokens after its prompt (what the report shows)."""
    return {r: tokens[r][len(q.prompt):] for r, q in requests.items()}


def first_difference(got: list[dict[str, Any]],
                     expected: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first step after which two runs' pool states differ, with the entries that do;
    None when the runs are equal step by step."""
    ended = "no such step: the run had ended"
    for step in range(max(len(got), len(expected))):
        mine = got[step] if step < len(got) else ended
        theirs = expected[step] if step < len(expected) else ended
        if mine == theirs:
            continue
        if isinstance(mine, str) or isinstance(theirs, str):
            return {"after step": step, "got": mine, "expected": theirs}
        return {"after step": step} | {key: _difference(mine[key], theirs[key])
                                       for key in theirs if mine[key] != theirs[key]}
    return None


def _difference(got: Any, expected: Any) -> dict[Any, Any]:
    """Got and expected, or for two dicts only the keys where they differ (None: absent)."""
    if not (isinstance(got, dict) and isinstance(expected, dict)):
        return {"got": got, "expected": expected}
    return {key: {"got": got.get(key), "expected": expected.get(key)}
            for key in sorted(got.keys() | expected.keys(), key=str)
            if got.get(key) != expected.get(key)}


def _step_cases() -> list[Case]:
    call = "fn(model, manager, waiting, running, tokens, remaining), step by step"
    cases = []
    for requests, num_blocks, hint in (
        (ROOMY, 24, "decode at position len(tokens[r]) - 1, prefill at 0..len-1; "
         "sample each request's row of its last token; free finished requests"),
        (TIGHT, 8, "on OutOfBlocks preempt the newest running request (free it, "
         "waiting.insert(0, it)) and retry; admit nothing in a step that preempted"),
    ):
        names = ", ".join(f"{r} (prompt {len(q.prompt)}, {q.max_tokens} new, arrives at "
                          f"step {q.arrival})" for r, q in requests.items())
        where = f"{call}: {names}; pool of {num_blocks} blocks of {BLOCK_SIZE}"
        cases.append(Case(
            f"{where}: the tokens each request generates (= contiguous generation)",
            lambda fn, q=requests, n=num_blocks: _generated(drive(fn, q, n)[0], q),
            _generated(contiguous_tokens(requests), requests), hint))
        reference = drive(reference_step, requests, num_blocks)[1]
        cases.append(Case(
            "the same run: the pool after each step (running, waiting, tables, free, ref "
            "counts) against the course's run; the first step that differs (None: none)",
            lambda fn, q=requests, n=num_blocks, ref=reference:
                first_difference(drive(fn, q, n)[1], ref),
            None,
            "claim decode slots oldest first, then admit front first; free finished "
            "requests at the end of the step, in running order"))
    return cases


EXERCISES = (
    Exercise("07.engine_step", "One engine step from a specification: decode, preempt, "
             "admit, sample, free", _step_cases,
             reference=("course_lib.engine.PagedEngine", "course_lib.engine.generate",
                        "course_lib.serving.ServingCore")),
)
