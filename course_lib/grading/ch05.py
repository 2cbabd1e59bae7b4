"""Chapter 05 exercises: preemption and scheduling. Expected values come from
``course_lib.scheduler`` (admission limits, victim choice, recompute, swap space),
``course_lib.kv_math`` and the simulator's ``CostModel``.

Functions are called with plain arguments; the swap-space class is exercised through its
methods only (``used_blocks`` may be a property, an attribute or a method), so more than one
design passes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from course_lib.grading.check import Case, Exercise, Raises
from course_lib.kv_math import MODELS, blocks_needed
from course_lib.scheduler import Scheduler, SchedulerConfig, SwapSpace, tokens_to_recompute
from course_lib.simulator import ROOFLINE_COSTS, CostModel
from course_lib.workload import Request

GUIDE_TOKEN_BYTES = MODELS["guide-8kv"].bytes_per_token("fp16")

# --- exercise 1: can this request be admitted now? ---------------------------------------------


def _admits(length: int, free_blocks: int, block_size: int, num_running: int,
            step_tokens: int, max_num_seqs: int | None,
            max_num_batched_tokens: int | None) -> bool:
    """The library's answer: the scheduler's limits, then blocks for ``length + 1`` tokens."""
    trace = [Request(i, 1, 1) for i in range(num_running + 1)]
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs,
                                          max_num_batched_tokens=max_num_batched_tokens), trace)
    for index in range(num_running):
        scheduler.arrive(index)
        scheduler.admit_next()
    return (scheduler.admits(length, step_tokens)
            and blocks_needed(length + 1, block_size) <= free_blocks)


def _can_admit_cases() -> list[Case]:
    memory = ("admission is on current need: blocks for its length plus the one token this "
              "step writes, ceil((length + 1) / block_size), must be free now; the reply's "
              "future length plays no part")
    seqs = "max_num_seqs caps the running requests: with that many running, nobody joins"
    budget = ("max_num_batched_tokens caps a step's tokens: step_tokens already scheduled plus "
              "this request's prefill (its whole length) must fit")
    settings = [
        # length, free, block, running, step tokens, max_num_seqs, max_num_batched_tokens
        ((886, 56, 16, 10, 10, None, None), memory),   # 887 tokens: 56 blocks
        ((895, 56, 16, 10, 10, None, None), memory),   # 896 tokens: exactly 56 blocks
        ((896, 56, 16, 10, 10, None, None), memory),   # 897 tokens: 57 blocks
        ((15, 1, 16, 0, 0, None, None), memory),
        ((16, 1, 16, 0, 0, None, None), memory),
        ((886, 500, 16, 256, 256, 256, None), seqs),
        ((886, 500, 16, 255, 255, 256, None), seqs),
        ((7000, 500, 16, 40, 1240, None, 8192), budget),
        ((6952, 500, 16, 40, 1240, None, 8192), budget),
        ((100, 7, 16, 3, 3, 4, 104), memory),
    ]
    return [
        Case(f"fn(length={a[0]}, free_blocks={a[1]}, block_size={a[2]}, num_running={a[3]}, "
             f"step_tokens={a[4]}, max_num_seqs={a[5]}, max_num_batched_tokens={a[6]})",
             lambda fn, a=a: fn(*a), _admits(*a), hint)
        for a, hint in settings
    ]


# --- exercise 2: choose the victim -------------------------------------------------------------


def _victim(running: Sequence[Request], policy: str) -> int:
    """The library's victim among ``running`` (oldest admission first) under ``policy``."""
    scheduler = Scheduler(SchedulerConfig(policy=policy), running)
    for index in range(len(running)):
        scheduler.arrive(index)
    for _ in running:
        scheduler.admit_next()
    return running[scheduler.victim()].id


def _show(running: Sequence[Request]) -> str:
    return "[" + ", ".join(f"Request({r.id}, arrival={r.arrival}, priority={r.priority})"
                           for r in running) + "]"


def _victim_cases() -> list[Case]:
    fcfs = ("fcfs preempts the request admitted most recently: the last one in the running "
            "list, whatever its arrival or priority")
    priority = ("priority preempts the lowest priority (the LARGEST number); among equals the "
                "latest arrival, then the one admitted most recently")

    def req(rid: int, arrival: int, priority: int = 0) -> Request:
        return Request(rid, 10, 10, arrival=arrival, priority=priority)

    readmitted = [req(3, 5), req(4, 6), req(1, 0)]  # request 1 came back after a preemption
    mixed = [req(0, 0, 1), req(1, 1, 0), req(2, 2, 2), req(3, 3, 1)]
    ties = [req(5, 4, 1), req(6, 9, 1), req(7, 2, 0)]
    same = [req(8, 3, 2), req(9, 3, 2), req(10, 1, 2)]
    settings = [
        ([req(0, 0), req(1, 0), req(2, 1), req(3, 2)], "fcfs", fcfs),
        (readmitted, "fcfs", fcfs),
        (mixed, "fcfs", fcfs),
        ([req(4, 7)], "fcfs", fcfs),
        (mixed, "priority", priority),
        (ties, "priority", priority),
        (same, "priority", priority),
        (readmitted, "priority", priority),
    ]
    cases = [
        Case(f"fn(running={_show(running)}, policy={policy!r})",
             lambda fn, running=running, policy=policy: fn(list(running), policy),
             _victim(running, policy), hint)
        for running, policy, hint in settings
    ]
    cases.append(Case("fn(running=[], policy='fcfs')", lambda fn: fn([], "fcfs"),
                      Raises(ValueError), "nobody runs, so nobody can be preempted: raise "
                      "ValueError"))
    cases.append(Case("fn(running=[Request(0, arrival=0, priority=0)], policy='random')",
                      lambda fn: fn([req(0, 0)], "random"), Raises(ValueError),
                      "only 'fcfs' and 'priority' exist: raise ValueError naming the policy"))
    return cases


# --- exercise 3: how many tokens does a resumed request recompute? ------------------------------


def _recompute_cases() -> list[Case]:
    hint = ("it prefills prompt + generated tokens again, minus the full blocks still cached "
            "at the front; but the last token is always computed, so the cache covers at most "
            "(length - 1) // block_size blocks")
    settings = [
        (886, 0, 0, 16), (886, 14, 0, 16), (886, 14, 20, 16), (880, 16, 56, 16),
        (880, 17, 56, 16), (9, 3, 3, 4), (9, 3, 2, 4), (6, 2, 5, 4), (1000, 1, 62, 16),
        (1000, 1, 7, 128),
    ]
    cases = [
        Case(f"fn(prompt_len={p}, generated={g}, cached_blocks={c}, block_size={b})",
             lambda fn, p=p, g=g, c=c, b=b: fn(p, g, c, b),
             tokens_to_recompute(p + g, c, b), hint)
        for p, g, c, b in settings
    ]
    cases.append(Case("fn(prompt_len=100, generated=5, cached_blocks=2, block_size=0)",
                      lambda fn: fn(100, 5, 2, 0), Raises(ValueError),
                      "a block of zero tokens is impossible: raise ValueError"))
    return cases


# --- exercise 4: swap space --------------------------------------------------------------------


def _used(space: Any) -> Any:
    """``space.used_blocks`` whether the learner wrote a property, an attribute or a method."""
    value = space.used_blocks
    return value() if callable(value) else value


def _replay(cls: Any, capacity: int, ops: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Run ``ops`` on ``cls(capacity)``: every call's result, then the blocks in use."""
    space = cls(capacity)
    results: list[Any] = []
    for op, *args in ops:
        if op == "used":
            results.append(_used(space))
        else:
            results.append(getattr(space, op)(*args))
    return results


def _describe_ops(capacity: int, ops: Sequence[tuple[Any, ...]]) -> str:
    calls = [f"s = cls({capacity})"]
    for op, *args in ops:
        calls.append("s.used_blocks" if op == "used"
                     else f"s.{op}({', '.join(map(str, args))})")
    return "; ".join(calls) + "  # results, in order"


def _swap_cases() -> list[Case]:
    scripts: list[tuple[int, list[tuple[Any, ...]], str]] = [
        (10, [("used",), ("swap_out", 1, 4), ("used",), ("holds", 1), ("holds", 2)],
         "swap_out keeps the blocks and returns True when they fit; used_blocks counts them"),
        (10, [("swap_out", 1, 4), ("swap_out", 2, 8), ("holds", 2), ("used",),
              ("swap_out", 3, 6), ("used",), ("swap_out", 4, 1), ("holds", 4)],
         "a request that does not fit is refused whole: return False and keep nothing (the "
         "caller recomputes it instead); one that fits exactly is taken"),
        (10, [("swap_out", 1, 7), ("swap_in", 1), ("used",), ("swap_out", 2, 10), ("used",),
              ("holds", 1)],
         "swap_in returns how many blocks come back and frees their space for others"),
        (0, [("swap_out", 1, 1), ("used",)],
         "with no swap space every swap_out fails"),
        (5, [("swap_out", 1, 5), ("swap_in", 1), ("swap_out", 1, 2), ("used",)],
         "a request swapped back in may be swapped out again later"),
    ]
    cases = [
        Case(_describe_ops(capacity, ops),
             lambda cls, capacity=capacity, ops=ops: _replay(cls, capacity, ops),
             _replay(SwapSpace, capacity, ops), hint)
        for capacity, ops, hint in scripts
    ]
    errors: list[tuple[int, list[tuple[Any, ...]], str]] = [
        (10, [("swap_in", 3)], "swapping in a request that is not swapped out is a bug: raise "
         "ValueError naming it"),
        (10, [("swap_out", 1, 2), ("swap_out", 1, 2)], "a request already swapped out cannot "
         "be swapped out again: raise ValueError"),
        (10, [("swap_out", 1, 2), ("swap_in", 1), ("swap_in", 1)], "after swap_in the "
         "request is no longer swapped out: a second swap_in raises ValueError"),
    ]
    cases += [
        Case(_describe_ops(capacity, ops).replace("  # results, in order", ""),
             lambda cls, capacity=capacity, ops=ops: _replay(cls, capacity, ops),
             Raises(ValueError), hint)
        for capacity, ops, hint in errors
    ]
    return cases


# --- exercise 5: recompute or swap? ------------------------------------------------------------


def _resume_seconds(tokens: int, block_size: int, bytes_per_token: int,
                    costs: CostModel) -> tuple[float, float]:
    """The library's answer: the cost model's prefill time for ``tokens``, and two swap
    transfers (out, then back in) of their whole blocks."""
    extra = replace(costs, step_seconds=0.0, kv_read_bandwidth=None)  # only the added time
    blocks = math.ceil(tokens / block_size)
    moved = blocks * block_size * bytes_per_token
    return extra.step_time(0, tokens, 0, 0), 2 * extra.step_time(0, 0, blocks, moved)


def _costs_text(costs: CostModel) -> str:
    return (f"CostModel(prefill_seconds_per_token={costs.prefill_seconds_per_token:g}, "
            f"swap_seconds_per_block={costs.swap_seconds_per_block:g}, "
            f"pcie_bandwidth={costs.pcie_bandwidth:g})")


def _resume_cases() -> list[Case]:
    hint = ("recompute: tokens x prefill_seconds_per_token. Swap: the request's "
            "ceil(tokens / block_size) whole blocks go out and come back, two transfers, each "
            "blocks x swap_seconds_per_block + blocks x block_size x bytes_per_token / "
            "pcie_bandwidth")
    slow_link = CostModel(step_seconds=0.01, prefill_seconds_per_token=1e-4,
                          swap_seconds_per_block=1e-3, pcie_bandwidth=8e9)
    guide = [(tokens, block, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS)
             for tokens, block in ((1000, 16), (1000, 1), (1000, 256), (886, 64))]
    settings = [*guide, (17, 16, 1024, slow_link),
                (4096, 32, MODELS["opt-13b"].bytes_per_token(), slow_link)]
    return [
        Case(f"fn(tokens={t}, block_size={b}, bytes_per_token={p}, costs={_costs_text(c)})",
             lambda fn, t=t, b=b, p=p, c=c: tuple(fn(t, b, p, c)),
             _resume_seconds(t, b, p, c), hint)
        for t, b, p, c in settings
    ]


EXERCISES = (
    Exercise("05.can_admit", "Can this request be admitted now?", _can_admit_cases,
             reference=("course_lib.scheduler.Scheduler",)),
    Exercise("05.choose_victim", "Choose the victim", _victim_cases,
             reference=("course_lib.scheduler.Scheduler",)),
    Exercise("05.recompute_tokens", "Tokens a resumed request recomputes", _recompute_cases,
             reference=("course_lib.scheduler.tokens_to_recompute",)),
    Exercise("05.swap_space", "Swap-space accounting", _swap_cases,
             reference=("course_lib.scheduler.SwapSpace",)),
    Exercise("05.resume_seconds", "Recompute or swap: the cost of coming back",
             _resume_cases,
             reference=("course_lib.simulator.CostModel.step_time",)),
)
