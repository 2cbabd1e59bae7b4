"""Chapter 05 exercises: preemption and scheduling.

Each exercise asks for something the lecture explains but does not show as code: a whole
waiting queue admitted in one step (the lecture shows the limits for one request), vLLM's
priority victim with its exact tie order, the tokens a resumed request recomputes, the swap
space, what coming back costs when the prefix cache holds part of the request, and, built
from a specification only, the preemptions one step needs. Expected values come from
``course_lib.scheduler`` (limits, recompute, swap space), ``course_lib.kv_math`` and the
simulator's ``CostModel``; the priority victim follows vLLM's code, which the tests compare
with ``Scheduler.victim`` where the two rules meet.

Every case's ``run`` returns plain data (ints, floats, bools, strings, None, and lists or
tuples of them) and compares it type-strictly, so ``True`` is not ``1`` and a ``Request``
returned instead of its id is reported, not accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from course_lib.grading.ch05_step import SCHEDULER_STEP
from course_lib.grading.check import Case, Exercise, Raises, strict_equal
from course_lib.kv_math import MODELS, blocks_needed
from course_lib.scheduler import (
    POLICIES,
    Scheduler,
    SchedulerConfig,
    SwapSpace,
    tokens_to_recompute,
)
from course_lib.simulator import ROOFLINE_COSTS, CostModel
from course_lib.validate import check_int
from course_lib.workload import Request

GUIDE_TOKEN_BYTES = MODELS["guide-8kv"].bytes_per_token("fp16")
PLAIN = (type(None), bool, int, float, str)

# --- plain data, compared strictly ------------------------------------------------------------


def _plain(value: Any) -> Any:
    """``value`` if it is plain data (lists and tuples of plain data included), else a
    string naming what it is, which no expected value equals."""
    if type(value) in PLAIN:
        return value
    if type(value) in (list, tuple):
        return type(value)(_plain(item) for item in value)
    text = repr(value)
    return f"a {type(value).__name__}, not plain data: " + (
        text if len(text) <= 60 else text[:57] + "...")


def _case(call: str, run: Any, expected: Any, hint: str) -> Case:
    """A case whose result is made plain and compared strictly."""
    return Case(call, lambda obj: _plain(run(obj)), expected, hint, strict_equal)


def _show(request: Request) -> str:
    return f"Request({request.id}, arrival={request.arrival}, priority={request.priority})"


# --- exercise 1: admit from the waiting queue ---------------------------------------------------


def admitted_count(waiting: Sequence[int], free_blocks: int, block_size: int,
                   num_running: int, step_tokens: int, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None) -> int:
    """How many of the ``waiting`` requests (their lengths, in queue order) the library's
    scheduler admits into a step, each taking blocks for its length plus one token."""
    check_int("free_blocks", free_blocks, 0)
    check_int("block_size", block_size, 1)
    for length in waiting:
        check_int("a waiting length", length, 1)
    trace = [Request(i, 1, 1) for i in range(num_running + len(waiting))]
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs,
                                          max_num_batched_tokens=max_num_batched_tokens), trace)
    for index in range(len(trace)):
        scheduler.arrive(index)
    for _ in range(num_running):
        scheduler.admit_next()
    admitted = 0
    for length in waiting:
        need = blocks_needed(length + 1, block_size)
        if not scheduler.admits(length, step_tokens) or need > free_blocks:
            break
        scheduler.admit_next()
        free_blocks, step_tokens, admitted = free_blocks - need, step_tokens + length, admitted + 1
    return admitted


def _admit_cases() -> list[Case]:
    blocks = ("a request starts with blocks for what it holds and for the token it writes in "
              "this step; what one admission takes is no longer free for the next")
    order = ("the queue is served in order: when the head cannot start, nobody behind it "
             "may jump ahead")
    limits = ("the limits count what this step already holds, including the requests "
              "admitted a moment ago in the same step")
    bad = "refuse impossible input with ValueError, whichever argument it is"
    settings = [
        # waiting, free, block, running, step tokens, max_num_seqs, max_num_batched_tokens
        (([100, 200, 50], 20, 16, 0, 0, None, None), blocks),
        (([400, 10], 10, 16, 0, 0, None, None), order),
        (([32, 15], 3, 16, 0, 0, None, None), blocks),
        (([31], 2, 16, 0, 0, None, None), blocks),
        (([47, 47], 6, 16, 2, 2, None, None), blocks),
        (([10, 10, 10, 10], 100, 16, 6, 6, 8, None), limits),
        (([3000, 3000, 3000], 1000, 16, 10, 10, None, 8192), limits),
        (([8182, 1], 1000, 16, 10, 10, None, 8192), limits),
        (([10, 10], 100, 16, 256, 256, 256, None), limits),
        (([100, 7, 300, 5], 9, 16, 3, 3, 5, 120), limits),
        (([], 5, 16, 0, 0, None, None), blocks),
    ]
    cases = [
        _case(f"fn(waiting={a[0]}, free_blocks={a[1]}, block_size={a[2]}, num_running={a[3]}, "
              f"step_tokens={a[4]}, max_num_seqs={a[5]}, max_num_batched_tokens={a[6]})",
              lambda fn, a=a: fn(list(a[0]), *a[1:]), admitted_count(*a), hint)
        for a, hint in settings
    ]
    for args, what in ((([10], 4, 0, 0, 0), "block_size=0"),
                       (([10], -1, 16, 0, 0), "free_blocks=-1"),
                       (([10, 0], 4, 16, 0, 0), "a waiting length of 0")):
        cases.append(_case(f"fn(waiting={args[0]}, free_blocks={args[1]}, block_size={args[2]}, "
                           f"num_running=0, step_tokens=0)  # {what}",
                           lambda fn, args=args: fn(*args), Raises(ValueError), bad))
    return cases


# --- exercise 2: vLLM's priority victim ---------------------------------------------------------


def priority_victim(running: Sequence[Request]) -> int:
    """The id vLLM's priority policy preempts among ``running`` (admission order): the
    largest ``(priority, arrival)``, and of exact equals the first in the list, as Python's
    ``max`` keeps it (vLLM's ``max(self.running, key=lambda r: (r.priority, r.arrival_time))``)."""
    if not running:
        raise ValueError("no running request to preempt")
    return max(running, key=lambda r: (r.priority, r.arrival)).id


def _victim_cases() -> list[Case]:
    hint = ("compare the requests on importance first (a larger number is less important), "
            "then on arrival; work out by hand which one goes when two are equal in both")

    def req(rid: int, arrival: int, priority: int = 0) -> Request:
        return Request(rid, 10, 10, arrival=arrival, priority=priority)

    settings = [
        [req(0, 0, 1), req(1, 1, 0), req(2, 2, 2), req(3, 3, 1)],
        [req(5, 4, 1), req(6, 9, 1), req(7, 2, 0)],
        [req(3, 5), req(4, 6), req(1, 0)],                 # request 1 came back last
        [req(8, 3, 2), req(9, 3, 2), req(10, 1, 2)],       # 8 and 9 tie exactly
        [req(11, 2, 0), req(12, 7, -1), req(13, 2, 0)],    # 11 and 13 tie exactly
        [req(14, 0, 3), req(15, 1, 3), req(16, 1, 3), req(17, 0, 3)],
        [req(20, 5, 0)],
    ]
    cases = [
        _case(f"fn(running=[{', '.join(map(_show, running))}])",
              lambda fn, running=running: fn(list(running)), priority_victim(running), hint)
        for running in settings
    ]
    cases.append(_case("fn(running=[])", lambda fn: fn([]), Raises(ValueError),
                       "nobody runs, so nobody can be preempted: raise ValueError"))
    return cases


# --- exercise 3: how many tokens does a resumed request recompute? ------------------------------


def recomputed(prompt_len: int, generated: int, cached_blocks: int, block_size: int) -> int:
    """The library's answer, with every argument checked."""
    check_int("prompt_len", prompt_len, 1)
    check_int("generated", generated, 0)
    return tokens_to_recompute(prompt_len + generated, cached_blocks, block_size)


def _recompute_cases() -> list[Case]:
    hint = ("everything the request held is prefilled again, except what the prefix cache "
            "still holds; but some token must go through the model to produce the next one")
    settings = [
        (886, 0, 0, 16), (886, 14, 0, 16), (886, 14, 20, 16), (880, 16, 56, 16),
        (880, 17, 56, 16), (9, 3, 3, 4), (9, 3, 2, 4), (6, 2, 5, 4), (1000, 1, 62, 16),
        (1000, 1, 7, 128), (16, 0, 1, 16), (1, 0, 4, 1),
    ]
    cases = [
        _case(f"fn(prompt_len={p}, generated={g}, cached_blocks={c}, block_size={b})",
              lambda fn, p=p, g=g, c=c, b=b: fn(p, g, c, b), recomputed(p, g, c, b), hint)
        for p, g, c, b in settings
    ]
    for bad in ((100, 5, 2, 0), (0, 5, 2, 16), (100, -1, 2, 16), (100, 5, -1, 16)):
        cases.append(_case("fn(prompt_len={}, generated={}, cached_blocks={}, block_size={})"
                           .format(*bad), lambda fn, bad=bad: fn(*bad), Raises(ValueError),
                           "refuse impossible input with ValueError, whichever argument it is"))
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
    return "; ".join(calls)


def _swap_cases() -> list[Case]:
    scripts: list[tuple[int, list[tuple[Any, ...]], str]] = [
        (10, [("used",), ("swap_out", 1, 4), ("used",), ("holds", 1), ("holds", 2)],
         "a request that fits is kept, and the space in use says so"),
        (10, [("swap_out", 1, 4), ("swap_out", 2, 8), ("holds", 2), ("used",),
              ("swap_out", 3, 6), ("used",), ("swap_out", 4, 1), ("holds", 4)],
         "a request is kept whole or not at all (the caller recomputes it instead); check "
         "the edge where a request needs exactly the space that is left"),
        (10, [("swap_out", 1, 7), ("swap_in", 1), ("used",), ("swap_out", 2, 10), ("used",),
              ("holds", 1)],
         "what comes back in no longer occupies the CPU side"),
        (0, [("swap_out", 1, 1), ("used",)], "no swap space, no swapping"),
        (5, [("swap_out", 1, 5), ("swap_in", 1), ("swap_out", 1, 2), ("used",)],
         "a request swapped back in may be swapped out again later"),
    ]
    cases = [
        _case(_describe_ops(capacity, ops) + "  # results, in order",
              lambda cls, capacity=capacity, ops=ops: _replay(cls, capacity, ops),
              _replay(SwapSpace, capacity, ops), hint)
        for capacity, ops, hint in scripts
    ]
    errors: list[tuple[int, list[tuple[Any, ...]], str]] = [
        (10, [("swap_in", 3)], "only a request that is out can come back in"),
        (10, [("swap_out", 1, 2), ("swap_out", 1, 2)], "a request cannot be out twice"),
        (10, [("swap_out", 1, 2), ("swap_in", 1), ("swap_in", 1)],
         "once back in, the request is no longer out"),
    ]
    cases += [
        _case(_describe_ops(capacity, ops),
              lambda cls, capacity=capacity, ops=ops: _replay(cls, capacity, ops),
              Raises(ValueError), hint + ": raise ValueError")
        for capacity, ops, hint in errors
    ]
    return cases


# --- exercise 5: the cost of coming back, with the prefix cache ---------------------------------


def resume_seconds(length: int, cached_blocks: int, block_size: int, bytes_per_token: int,
                   costs: CostModel) -> tuple[float, float]:
    """The library's answer: the cost model's prefill time for the tokens recomputed, and
    two swap transfers (out, then back in) of all of the request's blocks."""
    extra = replace(costs, step_seconds=0.0, kv_read_bandwidth=None)  # only the added time
    blocks = blocks_needed(length, block_size)
    moved = blocks * block_size * bytes_per_token
    recompute = tokens_to_recompute(length, cached_blocks, block_size)
    return extra.step_time(0, recompute, 0, 0), 2 * extra.step_time(0, 0, blocks, moved)


def _costs_text(costs: CostModel) -> str:
    return (f"CostModel(prefill_seconds_per_token={costs.prefill_seconds_per_token:g}, "
            f"swap_seconds_per_block={costs.swap_seconds_per_block:g}, "
            f"pcie_bandwidth={costs.pcie_bandwidth:g})")


def _resume_cases() -> list[Case]:
    hint = ("recompute pays only for the tokens the cache cannot give back (exercise 3); swap "
            "does not look at the cache: the whole request leaves and returns, block by block, "
            "and a block moves whole however full it is")
    slow_link = CostModel(step_seconds=0.01, prefill_seconds_per_token=1e-4,
                          swap_seconds_per_block=1e-3, pcie_bandwidth=8e9)
    opt = MODELS["opt-13b"].bytes_per_token()
    settings = [
        (1000, 0, 16, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (1000, 40, 16, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (1000, 0, 1, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (1024, 64, 16, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (886, 3, 256, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (17, 1, 16, 1024, slow_link),
        (4096, 100, 32, opt, slow_link),
    ]
    return [
        _case(f"fn(length={n}, cached_blocks={c}, block_size={b}, bytes_per_token={p}, "
              f"costs={_costs_text(m)})",
              lambda fn, n=n, c=c, b=b, p=p, m=m: tuple(fn(n, c, b, p, m)),
              resume_seconds(n, c, b, p, m), hint)
        for n, c, b, p, m in settings
    ]


# --- exercise 6: plan one step's preemptions (from a specification) -----------------------------


def plan_preemptions(running: Sequence[tuple[Request, int]], free_blocks: int, block_size: int,
                     policy: str) -> list[int]:
    """The ids preempted, in order, until every remaining request can write its next token:
    ``running`` holds ``(request, tokens in its cache)`` pairs in admission order."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    check_int("free_blocks", free_blocks, 0)
    check_int("block_size", block_size, 1)
    for _, length in running:
        check_int("a running length", length, 1)
    survivors = list(running)
    victims: list[int] = []
    while sum(length % block_size == 0 for _, length in survivors) > free_blocks:
        if policy == "fcfs":
            victim = survivors[-1]
        else:
            victim_id = priority_victim([request for request, _ in survivors])
            victim = next(pair for pair in survivors if pair[0].id == victim_id)
        survivors.remove(victim)
        free_blocks += blocks_needed(victim[1], block_size)
        victims.append(victim[0].id)
    return victims


def _show_running(running: Sequence[tuple[Request, int]]) -> str:
    return "[" + ", ".join(f"({_show(r)}, {length})" for r, length in running) + "]"


def running_sets() -> list[tuple[list[tuple[Request, int]], int, int]]:
    """Running sets, free blocks and block sizes the plan is checked on."""
    def r(rid: int, length: int, arrival: int = 0, priority: int = 0) -> tuple[Request, int]:
        return Request(rid, 10, 10, arrival=arrival, priority=priority), length

    return [
        ([r(0, 17), r(1, 30), r(2, 5)], 0, 16),  # nobody is full
        ([r(0, 32), r(1, 16), r(2, 20)], 2, 16),  # two need a block, two are free
        ([r(0, 32), r(1, 16), r(2, 20)], 1, 16),  # one short
        ([r(0, 16), r(1, 48), r(2, 33), r(3, 64)], 0, 16),
        ([r(0, 8), r(1, 8), r(2, 8), r(3, 1)], 0, 8),  # a victim that frees one block
        ([r(0, 4, 0, 2), r(1, 8, 1, 0), r(2, 3, 2, 1), r(3, 12, 3, 0)], 0, 4),
        ([r(5, 12, 1, 1), r(6, 8, 2, 1), r(7, 16, 0, 0), r(8, 4, 2, 1)], 0, 4),
        ([r(0, 15, 0, 0), r(1, 16, 1, 0)], 0, 16),  # 15 tokens need no new block
        ([r(0, 1, 0, 0)], 0, 1),
        ([], 0, 16),
    ]


def _plan_cases() -> list[Case]:
    hint = ("a request needs a new block only when its blocks are full; a victim gives back "
            "every block it holds and no longer needs one; stop as soon as everyone left fits")
    cases = [
        _case(f"fn(running={_show_running(running)}, free_blocks={free}, "
              f"block_size={size}, policy={policy!r})",
              lambda fn, running=running, free=free, size=size, policy=policy:
              fn(list(running), free, size, policy),
              plan_preemptions(running, free, size, policy),
              hint + ("; under fcfs the newest admission goes first" if policy == "fcfs"
                      else "; under priority the victim is exercise 2's, among those left"))
        for running, free, size in running_sets() for policy in POLICIES
    ]
    one = [(Request(0, 10, 10), 16)]
    for args, what in (((one, 0, 16, "random"), "policy='random'"),
                       ((one, -1, 16, "fcfs"), "free_blocks=-1"),
                       ((one, 0, 0, "fcfs"), "block_size=0"),
                       (([(Request(0, 10, 10), 0)], 0, 16, "fcfs"), "a running length of 0")):
        cases.append(_case(f"fn(running={_show_running(args[0])}, free_blocks={args[1]}, "
                           f"block_size={args[2]}, policy={args[3]!r})  # {what}",
                           lambda fn, args=args: fn(list(args[0]), *args[1:]),
                           Raises(ValueError),
                           "refuse impossible input with ValueError, whichever argument it is"))
    return cases


EXERCISES = (
    Exercise("05.admit_from_queue", "Admit from the waiting queue", _admit_cases,
             reference=("course_lib.scheduler.Scheduler",)),
    Exercise("05.choose_victim", "vLLM's priority victim", _victim_cases,
             reference=("course_lib.scheduler.Scheduler",)),
    Exercise("05.recompute_tokens", "Tokens a resumed request recomputes", _recompute_cases,
             reference=("course_lib.scheduler.tokens_to_recompute",)),
    Exercise("05.swap_space", "Swap-space accounting", _swap_cases,
             reference=("course_lib.scheduler.SwapSpace",)),
    Exercise("05.resume_seconds", "The cost of coming back, with the prefix cache",
             _resume_cases,
             reference=("course_lib.simulator.CostModel.step_time",)),
    Exercise("05.plan_preemptions", "Plan one step's preemptions", _plan_cases,
             reference=("course_lib.scheduler.Scheduler",)),
    SCHEDULER_STEP,
)
