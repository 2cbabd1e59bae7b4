"""Chapter 07 exercise: one engine step. Expected values come from ``course_lib.engine``.

The learner's ``fn(model, manager, running, tokens)`` runs one greedy decode step over the
sequences in ``running`` (oldest first), whose K/V are cached for all tokens but the last:
it claims a slot for each (preempting the newest running sequence when the pool is out of
blocks), builds the block tables, runs the model through the paged kernel, appends each
sequence's next token to ``tokens`` and returns the ids it preempted. Tokens are compared
with ordinary contiguous generation (``engine.generate``) and preemptions with the
library's engine (``PagedEngine``) on the same prompts and pool.
"""

from __future__ import annotations

import functools
from typing import Any

from course_lib.engine import (
    LlamaModel,
    PagedEngine,
    PagedPrefill,
    SamplingParams,
    generate,
    random_model,
    tiny_config,
)
from course_lib.grading.check import Case, Exercise, Raises
from course_lib.paged import BlockPool, PagedKVManager

PROMPTS = {"a": [3, 1, 4, 1, 5], "b": [9, 2, 6], "c": [5, 3, 5, 8, 9, 7]}
"""Three ragged prompts: in blocks of 4 they hold 2, 1 and 2 blocks after prefill."""

BLOCK_SIZE = 4


@functools.cache
def exercise_model() -> LlamaModel:
    """The toy Llama of the exercise: one KV head, so the interpreted kernel is quick."""
    return random_model(tiny_config(num_kv_heads=1), seed=0)


def prefilled(num_blocks: int, prompts: dict[str, list[int]],
              fork: dict[str, str] | None = None) -> tuple[PagedKVManager, dict[str, list[int]]]:
    """A pool with ``prompts`` prefilled and each one's first token sampled (greedy), as the
    engine leaves them; ``fork`` maps new sequence ids to the prompt they fork after that."""
    model = exercise_model()
    config = model.config
    manager = PagedKVManager(BlockPool(num_blocks, BLOCK_SIZE, num_kv_heads=config.num_kv_heads,
                                       head_dim=config.head_dim, num_layers=config.num_layers,
                                       dtype=model.dtype))
    lengths = [len(p) for p in prompts.values()]
    for seq_id, prompt in prompts.items():
        manager.add_sequence(seq_id, len(prompt))
    slots = [slot for seq_id, prompt in prompts.items()
             for slot in manager.slot_mapping(seq_id, range(len(prompt)))]
    logits = model.next_token_logits([t for p in prompts.values() for t in p],
                                     [i for n in lengths for i in range(n)],
                                     PagedPrefill(manager.pool, slots, lengths), last_of=lengths)
    tokens = {seq_id: [*prompt, int(row.argmax())]
              for (seq_id, prompt), row in zip(prompts.items(), logits, strict=True)}
    for child, parent in (fork or {}).items():
        manager.fork(parent, child)
        tokens[child] = list(tokens[parent])
    return manager, tokens


def _contiguous(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Prompt plus ``new_tokens`` greedy tokens each, from ordinary generation."""
    outputs = generate(exercise_model(), prompts, SamplingParams(max_tokens=new_tokens))
    return [[*p, *o.token_ids[0]] for p, o in zip(prompts, outputs, strict=True)]


def _engine_preemptions(num_blocks: int, steps: int) -> list[list[str]]:
    """Which prompts the library's engine preempts in each of its first decode steps."""
    names = list(PROMPTS)
    engine = PagedEngine(exercise_model(), num_blocks=num_blocks, block_size=BLOCK_SIZE,
                         decode_attention="torch")  # preemptions do not depend on it
    engine.submit(list(PROMPTS.values()), SamplingParams(max_tokens=steps + 1))
    reports = [engine.step() for _ in range(steps + 1)]  # step 0 is the prefill
    return [[names[i] for i in r.preempted] for r in reports[1:]]


def _run_steps(fn: Any, num_blocks: int, steps: int,
               fork: dict[str, str] | None = None,
               prompts: dict[str, list[int]] = PROMPTS) -> tuple[Any, ...]:
    """Call ``fn`` ``steps`` times; return (preempted per call, running, tokens, live ids)."""
    manager, tokens = prefilled(num_blocks, prompts, fork)
    running = list(tokens)
    model = exercise_model()
    preempted = [list(fn(model, manager, running, tokens)) for _ in range(steps)]
    return preempted, list(running), {s: tokens[s] for s in running}, sorted(manager.sequences)


def _step_cases() -> list[Case]:
    model_call = "fn(model, manager, running, tokens)"
    names = list(PROMPTS)
    roomy = _contiguous(list(PROMPTS.values()), 5)
    cases = [Case(
        f"{model_call} 4 times: prompts a, b, c prefilled in a pool of 16 blocks of 4",
        lambda fn: _run_steps(fn, num_blocks=16, steps=4),
        ([[]] * 4, names, dict(zip(names, roomy, strict=True)), sorted(names)),
        "claim a slot per sequence (manager.append_tokens), then manager.batch_tables, "
        "PagedDecode and model.next_token_logits on each sequence's last token at position "
        "len - 1; append the argmax of each row to tokens[seq]",
    )]
    survivors = _contiguous([PROMPTS["a"], PROMPTS["b"]], 4)
    cases.append(Case(
        f"{model_call} 3 times in a pool of 6 blocks (all 5 free ones used by the prompts)",
        lambda fn: _run_steps(fn, num_blocks=6, steps=3),
        (_engine_preemptions(num_blocks=6, steps=3), ["a", "b"],
         {"a": survivors[0], "b": survivors[1]}, ["a", "b"]),
        "claim slots oldest first; on OutOfBlocks preempt the newest running sequence "
        "(manager.free_sequence, remove it from running) and retry the claim; a preempted "
        "sequence does not run in this step",
    ))
    (forked,) = _contiguous([PROMPTS["b"]], 4)
    cases.append(Case(
        f"{model_call} 3 times: b forked into b and b2, sharing its partly filled block",
        lambda fn: _run_steps(fn, num_blocks=8, steps=3, fork={"b2": "b"},
                              prompts={"b": PROMPTS["b"]}),
        ([[]] * 3, ["b", "b2"], {"b": forked, "b2": forked}, ["b", "b2"]),
        "append_tokens before writing: it copies a shared, partly filled block "
        "(copy-on-write), so the two samples never write into the same block",
    ))
    cases.append(Case(
        f"{model_call} with running = ['nope'], a sequence the manager does not know",
        lambda fn: fn(exercise_model(), prefilled(8, {"a": PROMPTS["a"]})[0], ["nope"],
                      {"nope": [1, 2]}),
        Raises(ValueError),
        "let the manager's ValueError for an unknown sequence through",
    ))
    return cases


EXERCISES = (
    Exercise("07.engine_step", "One engine step: schedule, block tables, model, tokens",
             _step_cases,
             reference=("course_lib.engine.PagedEngine", "course_lib.engine.generate")),
)
