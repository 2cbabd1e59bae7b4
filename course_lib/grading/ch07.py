"""Chapter 07 exercise: one engine step, built from a specification.

The learner's ``fn(model, manager, waiting, running, tokens, remaining)`` runs one step of a
small serving engine (the rules are in :func:`reference_step`): decode every running
request (preempting the newest when the pool is out of blocks), admit waiting requests
first come first served and prefill them, sample greedily, free what finished. The check
drives it step by step on requests that arrive at different steps (:func:`drive`, closed
loop: every step starts from what the learner's previous step left) and records, per step,
what it returned, the pool (who runs and waits, block tables, free blocks, reference
counts), the positions and tokens the model computed (a hook on the model sees every
forward pass) and the token each request got. The grader compares those records with
:func:`reference_step` driven the same way, and the tokens with ordinary contiguous
generation (``engine.generate``); nothing computed by the reference enters the learner's
process. The first step and field that differ are reported with the hint of the mistake
that shows there (:func:`explain_run`).

The model is :func:`exercise_model`, a toy Llama whose weights make positions and every
layer matter: sharp attention, fast rotary frequencies, weights at unit gain. Feed a token
at the wrong position, or skip a layer, and the greedy tokens change
(``tests/test_grading_ch07.py`` measures it). Positions off by a constant leave the tokens
as they are (rotary attention sees only differences), which is why the positions are
checked directly.
"""

from __future__ import annotations

import functools
import math
import random
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
from course_lib.grading.check import (
    Case,
    Exercise,
    Satisfies,
    Verdict,
    satisfies,
    to_plain,
)
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager

BLOCK_SIZE = 4
MAX_STEPS = 60
"""The driver stops a run after this many steps, finished or not."""

StepFn = Callable[..., Any]


def exercise_model() -> LlamaModel:
    """A toy Llama (3 layers, 4 query heads, 1 KV head, vocabulary 64) made to be sensitive.

    Weights are seeded normals at unit gain (std ``1/sqrt(fan_in)``; embeddings std 1), with
    twice that for the query and key projections, so attention scores span several units
    and attention is sharp; ``rope_theta=10`` turns the fastest rotary pair by a radian per
    position. A random model at the usual std 0.02 attends almost uniformly, so there a
    token fed at a wrong position still gives the same greedy tokens. Built afresh (in
    milliseconds) by every call, so a case's run carries no model and no cache with it.
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

QUEUE = {
    "a": Request(0, (7, 1, 8, 2, 8, 1, 8, 2), 6),
    "b": Request(1, (6, 9, 3, 9, 9, 3, 7, 5, 1, 0, 5, 8), 2),
    "c": Request(1, (4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5), 2),
    "d": Request(2, (5, 0), 3),
}
"""Several requests waiting at once in a pool of 6 free blocks of 4: ``b`` (12 tokens) fits
the 3 blocks left exactly at step 1; at step 2 it is preempted and waits at the front, where
it no longer fits, nor does ``c`` (13 tokens) behind it, while ``d`` (2 tokens) would."""

SAME_STEP = {
    "a": Request(0, (6, 2, 8), 6),
    "b": Request(0, (1, 9, 4, 7, 3, 6, 2), 5),
    "c": Request(1, (8, 5), 3),
}
"""``a`` (3 tokens) and ``b`` (7) both need a new block at step 2: the older, ``a``, claims
first and takes the block at the front of the free queue."""

SCENARIOS: list[tuple[str, dict[str, Request], int]] = [
    ("ragged prompts, room for all", ROOMY, 24),
    ("a pool too small: the newest is preempted", TIGHT, 8),
    ("three waiting at once, an exact fit, a preempted request at the front", QUEUE, 7),
    ("two decodes need a new block in the same step", SAME_STEP, 10),
]
"""The check's scenarios: a label, the requests and the pool's blocks (block 0 is null)."""


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
    2. Admit: waiting requests, front first, join the end of ``running`` while the pool
       has free blocks for all their tokens. (A step that preempted admits nobody, as in
       vLLM, without a rule of its own: the request it preempted last stands at the front
       of ``waiting`` and never fits back at once, since the pool was empty when it was
       preempted and it needs a block more than it gave back, or the claimant took one.
       ``tests/test_grading_ch07.py`` holds the two versions together.)
    3. One forward pass (``PagedBatch``): one token per decode, all tokens per admitted
       request, each at its position in the request.
    4. Append each request's greedy token; a request with none remaining is freed and
       leaves ``running``.
    """
    _claim_decode_slots(manager, waiting, running)
    decodes = list(running)
    admitted = _admit(manager, waiting, running, tokens)
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
    """The pool after a step, as plain data."""
    pool = manager.pool
    return {
        "running": list(running), "waiting": list(waiting),
        "tables": {r: list(manager.block_table(r)) for r in manager.sequences},
        "free": pool.num_free,
        "ref_counts": {b: pool.ref_count(b) for b in range(1, pool.num_blocks)
                       if pool.ref_count(b)},
    }


def _as_returned(value: Any) -> Any:
    """What a step returned, as plain data: a list of ids stays, anything else is named."""
    if type(value) in (list, tuple) and all(type(item) is str for item in value):
        return list(value)
    return None if value is None else f"a {type(value).__name__}: {value!r:.40}"


def drive(fn: StepFn, requests: dict[str, Request],
          num_blocks: int) -> tuple[dict[str, list[int]], list[dict[str, Any]]]:
    """Run ``fn`` step by step until every request finished (at most ``MAX_STEPS`` steps);
    return every request's tokens and, after each step, the record :func:`explain_run`
    compares: what ``fn`` returned, the pool (:func:`pool_state`), ``computed`` (the
    ``[position, token]`` pairs the model computed, sorted) and ``sampled`` (the tokens
    each request gained)."""
    model, manager = exercise_model(), new_manager(num_blocks)
    computed: list[list[int]] = []

    def record(module: Any, args: tuple[Any, ...]) -> None:
        computed.extend([int(p), int(t)] for p, t in zip(args[1].tolist(), args[0].tolist(),
                                                           strict=True))

    waiting: list[str] = []
    running: list[str] = []
    tokens = {r: list(q.prompt) for r, q in requests.items()}
    remaining = {r: q.max_tokens for r, q in requests.items()}
    states = []
    hook = model.register_forward_pre_hook(record)
    try:
        for step in range(MAX_STEPS):
            waiting.extend(r for r, q in requests.items() if q.arrival == step)
            before = {r: len(t) for r, t in tokens.items()}
            computed.clear()
            returned = fn(model, manager, waiting, running, tokens, remaining)
            states.append({"returned": _as_returned(returned),
                           **pool_state(manager, waiting, running),
                           "computed": sorted(computed),
                           "sampled": {r: tokens[r][n:] for r, n in before.items()
                                       if len(tokens[r]) != n}})
            if step >= max(q.arrival for q in requests.values()) and not waiting \
                    and not running:
                break
    finally:
        hook.remove()
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


@dataclass(frozen=True)
class Run:
    """What a case's run saw: the record of every step and the tokens each request
    generated; shown in the report by its length (``to_plain`` makes it a dict)."""

    steps: list[dict[str, Any]]
    tokens: dict[str, list[int]]

    def __repr__(self) -> str:
        return f"a run of {len(self.steps)} steps generating {self.tokens}"


def observe_run(fn: StepFn, requests: dict[str, Request], num_blocks: int) -> Run:
    """A case's run: :func:`drive` ``fn`` and keep its records and generated tokens."""
    tokens, states = drive(fn, requests, num_blocks)
    return Run(states, _generated(tokens, requests))


# --- the report: the first step and field that differ, and the mistake it shows ---------------

FIELDS = ("running", "waiting", "tables", "free", "ref_counts", "computed", "sampled",
          "returned")
"""A step's fields in the order a difference is looked for: decisions before their effects."""

PREEMPT = ("on OutOfBlocks preempt the NEWEST running request (possibly the one asking): "
           "free it, take it out of running, then retry the claim; claims go oldest first")
CLAIM_ORDER = ("claim decode slots OLDEST first, in running order: when two decodes need a new "
               "block in the same step, the older one's append_tokens runs first and takes the "
               "block at the front of the free queue")
REQUEUE = "a preempted request goes to the FRONT of waiting (waiting.insert(0, r))"
IN_ORDER = ("admission is first come, first served: stop at the first waiting request that "
            "does not fit; nobody behind it may jump ahead")
ROOM = ("a waiting request fits when the free blocks hold ALL its tokens, "
        "manager.blocks_needed(len(tokens[r])), no more: the token it samples in this step "
        "gets its slot in the next")
ADMIT = f"{IN_ORDER}; {ROOM}"
TABLES = ("every decode needs a slot for its last token: manager.append_tokens(r), which "
          "extends the table when the last block is full, before slot_mapping")
FREE = ("a request with nothing remaining is finished: free its blocks "
        "(manager.free_sequence) and take it out of running, in the same step")
POSITIONS = ("positions count from 0 within each request: a decode feeds its last token at "
             "position len(tokens[r]) - 1, a prefill its tokens at 0 .. len - 1 (rotary "
             "attention hides a constant shift from the tokens, not from this check)")
RECOMPUTE = ("a running request's earlier tokens are in the pool already: feed only its last "
             "token; only an admitted request feeds all its tokens")
SAMPLED = ("each request that went through the model gains one token: the argmax of the "
           "logits after its LAST token (last_of gives one row per chunk)")
RETURNED = ("return the ids that finished in this step, in running order (a list, [] when "
            "none finished)")
STEPS = ("keep stepping requests until they finish: each has remaining[r] tokens to "
         "generate, one per step")
TOKENS = ("the tokens must equal contiguous generation: same positions, same context, the "
          "argmax after each request's last token")
RAISED = ("a step must not raise: catch OutOfBlocks to preempt, and look a slot up only after "
          "append_tokens or add_sequence made room for it")
HINTS = {"running": f"{PREEMPT}; {ADMIT}", "waiting": REQUEUE, "tables": TABLES, "free": FREE,
         "ref_counts": FREE, "computed": POSITIONS, "sampled": SAMPLED, "returned": RETURNED,
         "steps": STEPS, "tokens": TOKENS, "raised": RAISED}
"""The hint for the first field that differs (a recognised mistake's hint wins)."""


def _recognised(key: str, got: dict[str, Any], want: dict[str, Any]) -> str:
    """The hint of a mistake recognised from how a step's field differs, or ""."""
    if key == "running":
        extra = [r for r in got["running"] if r not in want["running"]]
        missing = [r for r in want["running"] if r not in got["running"]]
        front = want["waiting"][:1]
        if extra and front and isinstance(got["waiting"], list) and (
                got["waiting"][:1] != front and front[0] in got["waiting"]):
            return REQUEUE  # the victim went behind the queue, which let another in
        if extra and all(r in want["waiting"] for r in extra):
            return IN_ORDER if not missing else PREEMPT
        if missing and not extra and all(r in got["waiting"] for r in missing):
            return ROOM if set(missing) <= set(want["tables"]) else PREEMPT
    if key == "waiting" and sorted(got["waiting"]) == sorted(want["waiting"]):
        return REQUEUE
    if key in ("tables", "free", "ref_counts") and set(got["tables"]) - set(got["running"]):
        return FREE
    if key == "tables" and _last_blocks_swapped(got["tables"], want["tables"]):
        return CLAIM_ORDER
    if key == "computed":
        if len(got["computed"]) > len(want["computed"]):
            return RECOMPUTE
        return POSITIONS
    return ""


def _last_blocks_swapped(got: Any, want: dict[str, list[int]]) -> bool:
    """Whether the block tables differ only in which request got which of the blocks
    claimed last: the same requests, lengths and blocks, every difference in a last entry."""
    if not isinstance(got, dict) or got.keys() != want.keys():
        return False
    differ = [r for r in want if got[r] != want[r]]
    return len(differ) > 1 and all(
        isinstance(got[r], list) and len(got[r]) == len(want[r])
        and got[r][:-1] == want[r][:-1] for r in differ) and (
        sorted(got[r][-1] for r in differ) == sorted(want[r][-1] for r in differ))


def _show_computed(pairs: Any) -> str:
    """``[position, token]`` pairs as their positions and their tokens."""
    if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2
                                            for p in pairs)):
        return repr(pairs)
    return f"positions {[p for p, _ in pairs]}, tokens {[t for _, t in pairs]}"


def _field_difference(key: str, got: Any, want: Any) -> str:
    """``got ..., expected ...`` for one field of a step."""
    if key == "computed":
        return f"got {_show_computed(got)}, expected {_show_computed(want)}"
    return f"got {got!r}, expected {want!r}"


def explain_run(got: Any, steps: list[dict[str, Any]],
                tokens: dict[str, list[int]]) -> Verdict | None:
    """None when the learner's run (``observe_run``'s record) has the reference's ``steps``
    and the contiguous ``tokens``; else the first step and field that differ."""
    mine = got["steps"]
    for step, want in enumerate(steps):
        if step >= len(mine):
            return Verdict(False, f"steps: your run ended after {len(mine)} steps, the "
                                  f"course's after {len(steps)}", STEPS)
        key = next((k for k in FIELDS if mine[step][k] != want[k]), None)
        if key is not None:
            return Verdict(False, f"{key}[after step {step}]: "
                                  f"{_field_difference(key, mine[step][key], want[key])}",
                           _recognised(key, mine[step], want) or HINTS[key])
    if len(mine) > len(steps):
        return Verdict(False, f"steps: your run went on after the course's ended ({len(mine)} "
                              f"steps, not {len(steps)})", STEPS)
    for request, want_tokens in tokens.items():
        if got["tokens"].get(request) != want_tokens:
            return Verdict(False, f"tokens[{request}]: got {got['tokens'].get(request)}, "
                                  f"contiguous generation gives {want_tokens}", TOKENS)
    return None


@functools.cache
def _expected_run(requests: tuple[tuple[str, Request], ...],
                  num_blocks: int) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The reference's records (as plain data, as the learner's arrive) and the tokens of
    contiguous generation; cached, as every check of the exercise builds the same cases."""
    scenario = dict(requests)
    steps = to_plain(drive(reference_step, scenario, num_blocks)[1])
    return steps, _generated(contiguous_tokens(scenario), scenario)


def step_case(requests: dict[str, Request], num_blocks: int, label: str) -> Case:
    """Drive the learner's step on ``requests`` in a pool of ``num_blocks`` blocks; judged
    against the reference's run and contiguous generation, both computed here only."""
    names = ", ".join(f"{r} (prompt {len(q.prompt)}, {q.max_tokens} new, arrives at step "
                      f"{q.arrival})" for r, q in requests.items())
    steps, tokens = _expected_run(tuple(requests.items()), num_blocks)
    expected = Satisfies(
        f"the course's run step by step (what it returns, the pool, the positions and tokens "
        f"computed, the tokens sampled) and the tokens of contiguous generation {tokens}",
        explain=lambda got: explain_run(got, steps, tokens))
    return Case(f"{label}: fn(model, manager, waiting, running, tokens, remaining), step by "
                f"step: {names}; pool of {num_blocks} blocks of {BLOCK_SIZE}",
                lambda fn: observe_run(fn, requests, num_blocks), expected,
                f"{PREEMPT}; {ADMIT}; {POSITIONS}", compare=satisfies, hints=HINTS)


def _step_cases() -> list[Case]:
    return [step_case(requests, num_blocks, label)
            for label, requests, num_blocks in SCENARIOS]


def _prompt(rng: random.Random, length: int) -> tuple[int, ...]:
    return tuple(rng.randrange(64) for _ in range(length))


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


def _roomy(rng: random.Random) -> tuple[dict[str, Request], int]:
    """Three or four ragged requests arriving at steps 0 to 5 in a pool that holds them all;
    the first runs long enough to cross a block boundary while decoding."""
    names = "pqrs"[:rng.randint(3, 4)]
    requests = {name: Request(0 if name == "p" else rng.randint(0, 5),
                              _prompt(rng, rng.randint(1, 9)),
                              rng.randint(5, 7) if name == "p" else rng.randint(1, 7))
                for name in names}
    room = sum(_blocks(len(q.prompt) + q.max_tokens) for q in requests.values())
    return requests, room + 1 + rng.randint(0, 3)


def _tight(rng: random.Random) -> tuple[dict[str, Request], int]:
    """Two requests, then a third a step later, in a pool they fill exactly once all three
    run: the next block any of them needs preempts the newest."""
    lengths = [rng.randint(3, 9) for _ in range(3)]
    requests = {name: Request(1 if name == "r" else 0, _prompt(rng, length), rng.randint(6, 8))
                for name, length in zip("pqr", lengths, strict=True)}
    grown = sum(length % BLOCK_SIZE == 0 for length in lengths[:2])  # claims of step 1
    return requests, sum(map(_blocks, lengths)) + grown + 1


def _queue(rng: random.Random) -> tuple[dict[str, Request], int]:
    """``p`` runs; at step 1 ``q`` (a whole number of blocks) fits the blocks left exactly and
    ``r`` (a block more) waits; at step 2 ``q``'s decode needs a block, ``q`` is preempted to
    the front of waiting and no longer fits, nor does ``r``, while ``s`` (one block) would."""
    first, whole = rng.randint(5, 10), rng.randint(2, 3)
    requests = {
        "p": Request(0, _prompt(rng, first), rng.randint(3, 7)),
        "q": Request(1, _prompt(rng, whole * BLOCK_SIZE), rng.randint(2, 3)),
        "r": Request(1, _prompt(rng, whole * BLOCK_SIZE + rng.randint(1, BLOCK_SIZE)),
                     rng.randint(1, 3)),
        "s": Request(2, _prompt(rng, rng.randint(1, 3)), rng.randint(1, 3)),
    }
    return requests, _blocks(first) + (first % BLOCK_SIZE == 0) + whole + 1


def _same_step(rng: random.Random) -> tuple[dict[str, Request], int]:
    """``p`` and ``q`` arrive together with prompt lengths equal modulo the block size, so
    their decodes need a new block in the same step (within their first four, and both run
    on after it), and ``r`` joins later; the pool holds them all."""
    offset = rng.randrange(BLOCK_SIZE)
    lengths = [offset + BLOCK_SIZE * rng.randint(0 if offset else 1, 2) for _ in range(2)]
    requests = {name: Request(0, _prompt(rng, length), rng.randint(6, 8))
                for name, length in zip("pq", lengths, strict=True)}
    requests["r"] = Request(rng.randint(1, 3), _prompt(rng, rng.randint(1, 6)),
                            rng.randint(1, 4))
    room = sum(_blocks(len(q.prompt) + q.max_tokens) for q in requests.values())
    return requests, room + 1 + rng.randint(0, 2)


def _step_fresh(seed: int) -> list[Case]:
    """One drawn scenario of each kind the fixed ones are: room for all, a pool too small,
    a queue with an exact fit and a preempted request at the front, two decodes that need
    a new block in the same step."""
    rng = random.Random(seed)
    return [step_case(*draw(rng), f"drawn from seed {seed}: {label}") for draw, label in (
        (_roomy, "ragged prompts, room for all"),
        (_tight, "a pool too small: the newest is preempted"),
        (_queue, "several waiting at once, an exact fit, a preempted request at the front"),
        (_same_step, "two decodes need a new block in the same step"))]


EXERCISES = (
    Exercise("07.engine_step", "One engine step from a specification: decode, preempt, "
             "admit, sample, free", _step_cases,
             reference=("course_lib.engine.PagedEngine", "course_lib.engine.generate",
                        "course_lib.serving.ServingCore",
                        "course_lib.grading.ch07.reference_step",
                        "course_lib.grading.ch07._claim_decode_slots",
                        "course_lib.grading.ch07._admit",
                        "course_lib.grading.ch07._forward_and_sample"),
             fresh=_step_fresh),
)
