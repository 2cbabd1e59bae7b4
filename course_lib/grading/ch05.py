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
tuples of them): a ``Request`` returned instead of its id is reported as such, not compared
as the dict of its fields.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from course_lib.grading.ch05_step import SCHEDULER_STEP
from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    Verdict,
    first_difference,
    recognising,
    strict_equal,
)
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

# --- plain data ------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """``value`` if it is plain data (lists and tuples of plain data included), else a
    string naming what it is, which no expected value equals."""
    if type(value) in PLAIN:
        return value
    if type(value) in (list, tuple):
        return type(value)(_plain(item) for item in value)
    if type(value) is dict:
        return {key: _plain(item) for key, item in value.items()}
    text = repr(value)
    return f"a {type(value).__name__}, not plain data: " + (
        text if len(text) <= 60 else text[:57] + "...")


RETURN_PLAIN = ("return plain data (an id, a number, a bool, lists of them), not a Request or "
                "an object of your own")


def _strict(got: Any, expected: Any) -> Verdict:
    """The course's comparison (``strict_equal``), naming the first part that differs, and
    a value that was not plain data (see :func:`_plain`) as such."""
    if strict_equal(got, expected):
        return Verdict(True)
    if isinstance(got, str) and ", not plain data: " in got:
        return Verdict(False, f"returned: {got}", RETURN_PLAIN)
    return Verdict(False, first_difference(got, expected, strict_equal) or "")


def _case(call: str, run: Any, expected: Any, hint: str,
          mistakes: Sequence[tuple[Any, str]] = ()) -> Case:
    """A case whose result is made plain (see :func:`_plain`) before it is compared, and
    whose wrong value is told which of ``mistakes`` it comes from."""
    return Case(call, lambda obj: _plain(run(obj)), expected, hint,
                recognising(mistakes, compare=_strict))


def _show(request: Request) -> str:
    return f"Request({request.id}, arrival={request.arrival}, priority={request.priority})"


# --- 05.admit_from_queue: admit from the waiting queue ------------------------------------------


def admitted_count(waiting: Sequence[int], free_blocks: int, block_size: int,
                   num_running: int, step_tokens: int, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None) -> int:
    """How many of the ``waiting`` requests (their lengths, in queue order) the library's
    scheduler admits into a step. Each takes blocks for its length plus the token it writes
    in this step, and charges the step's budget both, as the serving core counts an
    admission (``course_lib.serving``; the simulator turns a prompt of P tokens into a core
    prompt of P + 1)."""
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
        if not scheduler.admits(length + 1, step_tokens) or need > free_blocks:
            break
        scheduler.admit_next()
        free_blocks, step_tokens = free_blocks - need, step_tokens + length + 1
        admitted += 1
    return admitted


ADMIT_BLOCKS = ("a request starts with blocks for its length plus the token it writes in this "
                "step (length // block_size + 1 blocks), and what one admission takes is no "
                "longer free for the next")
ADMIT_ORDER = ("the queue is served strictly in order: when the head cannot start, nobody "
               "behind it may jump ahead")
ADMIT_BUDGET = ("max_num_batched_tokens counts step_tokens plus, for each admission, its length "
                "+ 1 (its prefill and the token it writes in this step), as the serving core "
                "counts an admission; the admissions made a moment ago in the same step count "
                "too")
ADMIT_SEATS = ("max_num_seqs counts the running requests, including those admitted a moment "
               "ago in the same step")
def _bad_input(*checks: tuple[bool, str]) -> str:
    """The hint of a call with one impossible argument: the first of ``checks`` (is it
    broken, which argument is) that is broken."""
    what = next(argument for broken, argument in checks if broken)
    return f"{what} is impossible: raise ValueError naming it, whichever argument it is"

AdmitArgs = tuple[list[int], int, int, int, int, int | None, int | None]
"""waiting, free blocks, block size, running, step tokens, max_num_seqs,
max_num_batched_tokens."""


def _admit_case(args: AdmitArgs, hint: str) -> Case:
    return _case(f"fn(waiting={args[0]}, free_blocks={args[1]}, block_size={args[2]}, "
                 f"num_running={args[3]}, step_tokens={args[4]}, max_num_seqs={args[5]}, "
                 f"max_num_batched_tokens={args[6]})",
                 lambda fn, a=args: fn(list(a[0]), *a[1:]), admitted_count(*args), hint)


def _bad_admit_case(waiting: list[int], free: int, size: int, what: str) -> Case:
    """A call with one impossible argument, ``what``, which must raise ValueError."""
    return _case(f"fn(waiting={waiting}, free_blocks={free}, block_size={size}, num_running=0, "
                 f"step_tokens=0)  # {what}", lambda fn: fn(list(waiting), free, size, 0, 0),
                 Raises(ValueError),
                 _bad_input((size < 1, "a block_size below 1"),
                            (free < 0, "a negative free_blocks"),
                            (True, "a waiting length below 1")))


def _admit_cases() -> list[Case]:
    settings: list[tuple[AdmitArgs, str]] = [
        (([100, 200, 50], 20, 16, 0, 0, None, None), ADMIT_BLOCKS),
        (([400, 10], 10, 16, 0, 0, None, None), ADMIT_ORDER),
        (([32, 15], 3, 16, 0, 0, None, None), ADMIT_BLOCKS),
        (([31], 2, 16, 0, 0, None, None), ADMIT_BLOCKS),
        (([47, 47], 6, 16, 2, 2, None, None), ADMIT_BLOCKS),
        (([10, 10, 10, 10], 100, 16, 6, 6, 8, None), ADMIT_SEATS),
        (([8181, 1], 1000, 16, 10, 10, None, 8192), ADMIT_BUDGET),  # 10 + 8182 = 8192 fits
        (([8182, 1], 1000, 16, 10, 10, None, 8192), ADMIT_BUDGET),  # 10 + 8183 does not
        (([3000, 3000, 3000], 1000, 16, 10, 10, None, 8192), ADMIT_BUDGET),
        (([10, 10], 100, 16, 256, 256, 256, None), ADMIT_SEATS),
        (([100, 7, 300, 5], 9, 16, 3, 3, 5, 120), ADMIT_BUDGET),
        (([], 5, 16, 0, 0, None, None), ADMIT_BLOCKS),
    ]
    return [*(_admit_case(args, hint) for args, hint in settings),
            _bad_admit_case([10], 4, 0, "block_size=0"),
            _bad_admit_case([10], -1, 16, "free_blocks=-1"),
            _bad_admit_case([10, 0], 4, 16, "a waiting length of 0")]


def _admit_fresh(seed: int) -> list[Case]:
    """Every kind of queue the fixed cases hold, drawn from ``seed``: admissions sharing the
    free blocks, lengths at a block's end, a head that does not fit, max_num_seqs binding,
    the token budget met exactly and missed by one, all limits at once, an empty queue and
    each impossible input."""
    rng = random.Random(seed)
    size, running = rng.choice([4, 8, 16]), rng.randint(0, 8)

    def need(length: int) -> int:
        return length // size + 1

    def case(waiting: list[int], free: int, seats: int | None, budget: int | None,
             hint: str) -> Case:
        return _admit_case((waiting, free, size, running, running, seats, budget), hint)

    shared = [rng.randint(1, 6 * size) for _ in range(rng.randint(2, 4))]
    free = sum(map(need, shared))  # all of them, and one more that would fit alone
    shared.append(rng.randint(1, free * size - 1))
    ends = [size * rng.randint(1, 4) - 1, size * rng.randint(1, 4)]  # fills, then opens a block
    head, small = rng.randint(4 * size, 8 * size), rng.randint(1, size - 1)
    seats = rng.randint(1, 3)
    prompt = rng.randint(1, 300)
    limits = [rng.randint(1, 200) for _ in range(rng.randint(3, 6))]
    bad_size = rng.choice([0, -rng.randint(1, 16)])
    bad_lengths = [rng.randint(1, 50) for _ in range(rng.randint(1, 3))]
    bad_lengths.insert(rng.randint(0, len(bad_lengths)), rng.choice([0, -rng.randint(1, 9)]))
    return [
        case(shared, free, None, None, ADMIT_BLOCKS),
        case(ends, need(ends[0]) + need(ends[1]) - 1, None, None, ADMIT_BLOCKS),
        case([head, small], rng.randint(need(small), need(head) - 1), None, None, ADMIT_ORDER),
        case([rng.randint(1, 50) for _ in range(seats + rng.randint(1, 3))], 1000,
             running + seats, None, ADMIT_SEATS),
        case([prompt, 1], 1000, None, running + prompt + 1, ADMIT_BUDGET),  # met exactly
        case([prompt, 1], 1000, None, running + prompt, ADMIT_BUDGET),  # missed by one
        case(limits, rng.randint(5, 40), running + rng.randint(1, 5),
             running + rng.randint(20, 600), ADMIT_BUDGET),
        case([], rng.randint(0, 20), None, None, ADMIT_BLOCKS),
        _bad_admit_case([rng.randint(1, 50)], rng.randint(1, 20), bad_size,
                        f"block_size={bad_size}"),
        _bad_admit_case([rng.randint(1, 50)], -rng.randint(1, 20), size, "a negative free_blocks"),
        _bad_admit_case(bad_lengths, rng.randint(1, 20), size, "a waiting length below 1"),
    ]


# --- 05.choose_victim: vLLM's priority victim ---------------------------------------------------


def priority_victim(running: Sequence[Request]) -> int:
    """The id vLLM's priority policy preempts among ``running`` (admission order): the
    largest ``(priority, arrival)``, and of exact equals the first in the list, as Python's
    ``max`` keeps it (vLLM's ``max(self.running, key=lambda r: (r.priority, r.arrival_time))``)."""
    if not running:
        raise ValueError("no running request to preempt")
    return max(running, key=lambda r: (r.priority, r.arrival)).id


VICTIM_IMPORTANCE = ("the least important request goes (a LARGER priority number is less "
                     "important), wherever it stands in the list")
VICTIM_ARRIVAL = "among equally important requests, the one that ARRIVED last goes"
VICTIM_TIE = ("when two are equal in both priority and arrival, the one EARLIEST in the running "
              "list goes, as Python's max keeps the first of equals")
VICTIM_EMPTY = "nobody runs, so nobody can be preempted: raise ValueError"
VICTIM_RETURNED = "return the victim's id (a plain int), not the Request"


def _victim_case(running: Sequence[Request], hint: str) -> Case:
    last_of_equals = max(reversed(running), key=lambda r: (r.priority, r.arrival)).id
    mistakes = [
        (running[-1].id, f"{VICTIM_IMPORTANCE}, not the newest admission (that is fcfs)"),
        (min(running, key=lambda r: (r.priority, -r.arrival)).id, VICTIM_IMPORTANCE),
        (max(running, key=lambda r: (r.priority, -r.arrival)).id, VICTIM_ARRIVAL),
        (max(running, key=lambda r: r.priority).id, VICTIM_ARRIVAL),
        (last_of_equals, VICTIM_TIE)]
    case = _case(f"fn(running=[{', '.join(map(_show, running))}])",
                 lambda fn, running=tuple(running): fn(list(running)),
                 priority_victim(running), hint, mistakes)
    return replace(case, hints={"returned": VICTIM_RETURNED})


def _victim_cases() -> list[Case]:
    def req(rid: int, arrival: int, priority: int = 0) -> Request:
        return Request(rid, 10, 10, arrival=arrival, priority=priority)

    settings = [
        ([req(0, 0, 1), req(1, 1, 0), req(2, 2, 2), req(3, 3, 1)], VICTIM_IMPORTANCE),
        ([req(5, 4, 1), req(6, 9, 1), req(7, 2, 0)], VICTIM_ARRIVAL),
        ([req(3, 5), req(4, 6), req(1, 0)], VICTIM_ARRIVAL),  # request 1 came back last
        ([req(8, 3, 2), req(9, 3, 2), req(10, 1, 2)], VICTIM_TIE),  # 8 and 9 tie exactly
        ([req(11, 2, 0), req(12, 7, -1), req(13, 2, 0)], VICTIM_TIE),  # 11 and 13 tie exactly
        ([req(14, 0, 3), req(15, 1, 3), req(16, 1, 3), req(17, 0, 3)], VICTIM_TIE),
        ([req(20, 5, 0)], VICTIM_IMPORTANCE),
    ]
    cases = [_victim_case(running, hint) for running, hint in settings]
    cases.append(_case("fn(running=[])", lambda fn: fn([]), Raises(ValueError), VICTIM_EMPTY))
    return cases


def _victim_fresh(seed: int) -> list[Case]:
    """Each kind of running list the fixed cases hold, drawn from ``seed``: the least
    important request not last, a latest arrival among equally important ones that is
    neither first nor last of them, an exact tie, one request, and nobody."""
    rng = random.Random(seed)
    ids = iter(rng.sample(range(100), 20))

    def req(arrival: int, priority: int) -> Request:
        return Request(next(ids), 10, 10, arrival=arrival, priority=priority)

    least = [req(rng.randint(0, 9), p) for p in rng.sample(range(-2, 6), rng.randint(3, 5))]
    worst = max(range(len(least)), key=lambda i: least[i].priority)
    if worst == len(least) - 1:  # not where fcfs would look
        least.insert(0, least.pop())
    top = rng.randint(1, 3)
    arrivals = sorted(rng.sample(range(10), rng.randint(3, 4)))
    late = [req(a, top) for a in [*arrivals[1:], arrivals[0]]]  # latest: neither end
    late.insert(rng.randint(0, len(late)), req(rng.randint(0, 9), top - 1))
    key = (rng.randint(0, 3), rng.randint(3, 9))
    tie = [req(*key[::-1]) for _ in range(rng.randint(2, 3))]
    tie += [req(rng.randint(0, key[1] - 1), key[0]), req(rng.randint(0, 9), key[0] - 1)]
    rng.shuffle(tie)
    return [_victim_case(least, VICTIM_IMPORTANCE), _victim_case(late, VICTIM_ARRIVAL),
            _victim_case(tie, VICTIM_TIE),
            _victim_case([req(rng.randint(0, 9), rng.randint(-2, 5))], VICTIM_IMPORTANCE),
            _case("fn(running=[])", lambda fn: fn([]), Raises(ValueError), VICTIM_EMPTY)]


# --- 05.recompute_tokens: how many tokens does a resumed request recompute? ---------------------


def recomputed(prompt_len: int, generated: int, cached_blocks: int, block_size: int) -> int:
    """The library's answer, with every argument checked."""
    check_int("prompt_len", prompt_len, 1)
    check_int("generated", generated, 0)
    return tokens_to_recompute(prompt_len + generated, cached_blocks, block_size)


RECOMPUTE_CACHE = ("the prefix cache gives back whole full blocks only, never the last token: "
                   "at least one token goes through the model to produce the next one")
RECOMPUTE_ALL = ("everything the request held is prefilled again (its prompt AND the tokens it "
                 "generated), except the cached blocks")


def _recompute_case(p: int, g: int, c: int, b: int, hint: str) -> Case:
    length = p + g
    mistakes = [(p - min(c, (p - 1) // b) * b, RECOMPUTE_ALL),  # the prompt only
                (max(length - c * b, 0), RECOMPUTE_CACHE),  # the cache takes the last token
                (length - min(c, length // b) * b, RECOMPUTE_CACHE)]  # and a full last block
    return _case(f"fn(prompt_len={p}, generated={g}, cached_blocks={c}, block_size={b})",
                 lambda fn: fn(p, g, c, b), recomputed(p, g, c, b), hint, mistakes)


def _bad_recompute_case(bad: tuple[int, int, int, int]) -> Case:
    """A call with one impossible argument, which must raise ValueError."""
    prompt, generated, cached, size = bad
    return _case("fn(prompt_len={}, generated={}, cached_blocks={}, block_size={})".format(*bad),
                 lambda fn: fn(*bad), Raises(ValueError),
                 _bad_input((prompt < 1, "a prompt_len below 1"),
                            (generated < 0, "a negative generated"),
                            (cached < 0, "a negative cached_blocks"),
                            (size < 1, "a block_size below 1")))


def _recompute_cases() -> list[Case]:
    settings = [
        (886, 0, 0, 16, RECOMPUTE_ALL), (886, 14, 0, 16, RECOMPUTE_ALL),
        (886, 14, 20, 16, RECOMPUTE_ALL), (880, 16, 56, 16, RECOMPUTE_CACHE),
        (880, 17, 56, 16, RECOMPUTE_CACHE), (9, 3, 3, 4, RECOMPUTE_CACHE),
        (9, 3, 2, 4, RECOMPUTE_ALL), (6, 2, 5, 4, RECOMPUTE_CACHE),
        (1000, 1, 62, 16, RECOMPUTE_CACHE), (1000, 1, 7, 128, RECOMPUTE_CACHE),
        (16, 0, 1, 16, RECOMPUTE_CACHE), (1, 0, 4, 1, RECOMPUTE_CACHE),
    ]
    return [*(_recompute_case(*setting) for setting in settings),
            *map(_bad_recompute_case, ((100, 5, 2, 0), (0, 5, 2, 16), (100, -1, 2, 16),
                                       (100, 5, -1, 16)))]


def _recompute_fresh(seed: int) -> list[Case]:
    """Each kind of request the fixed cases hold, drawn from ``seed``: nothing cached, part
    of it cached, a cache holding all of it at a block's end and one token past it, blocks
    of one token, and each impossible argument."""
    rng = random.Random(seed)
    block, g = rng.choice([4, 8, 16, 32]), rng.randint(1, 40)
    full = g // block + rng.randint(1, 40)  # blocks of a request that ends at a block's end
    p = rng.randint(2 * block, 40 * block)
    at_end, past = block * full - g, block * full + 1 - g  # prompts: at the end, one past it
    good = (rng.randint(1, 9), rng.randint(0, 9), rng.randint(0, 9), block)
    return [
        _recompute_case(p, g, 0, block, RECOMPUTE_ALL),
        _recompute_case(p, g, rng.randint(1, (p + g - 1) // block - 1), block, RECOMPUTE_ALL),
        _recompute_case(at_end, g, full + rng.randint(0, 5), block, RECOMPUTE_CACHE),
        _recompute_case(past, g, full + rng.randint(0, 5), block, RECOMPUTE_CACHE),
        _recompute_case(rng.randint(1, 50), g, 50 + g + rng.randint(0, 9), 1, RECOMPUTE_CACHE),
        _bad_recompute_case((*good[:3], rng.choice([0, -rng.randint(1, 16)]))),
        _bad_recompute_case((rng.choice([0, -rng.randint(1, 99)]), *good[1:])),
        _bad_recompute_case((good[0], -rng.randint(1, 9), *good[2:])),
        _bad_recompute_case((*good[:2], -rng.randint(1, 9), block)),
    ]


# --- 05.swap_space: swap space -----------------------------------------------------------------


def _used(space: Any) -> Any:
    """``space.used_blocks`` whether the learner wrote a property, an attribute or a method."""
    value = space.used_blocks
    return value() if callable(value) else value


def _call_text(op: str, args: Sequence[Any]) -> str:
    return "s.used_blocks" if op == "used" else f"s.{op}({', '.join(map(str, args))})"


def _replay(cls: Any, capacity: int, ops: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    """Run ``ops`` on ``cls(capacity)``: every call's result, labelled by the call and its
    place in the script (``"s.swap_out(2, 8) #2"``)."""
    space = cls(capacity)
    results: dict[str, Any] = {}
    for number, (op, *args) in enumerate(ops, 1):
        label = f"{_call_text(op, args)} #{number}"
        results[label] = _used(space) if op == "used" else getattr(space, op)(*args)
    return results


def _describe_ops(capacity: int, ops: Sequence[tuple[Any, ...]]) -> str:
    return "; ".join([f"s = cls({capacity})", *(_call_text(op, args) for op, *args in ops)])


SWAP_FITS = "a request that fits is kept, and the space in use says so"
SWAP_WHOLE = ("a request is kept whole or not at all: swap_out returns False and keeps nothing "
              "when it does not fit (the caller recomputes it instead)")
SWAP_EDGE = "a request that needs exactly the space left fits"
SWAP_RELEASE = "what comes back in (swap_in) no longer occupies the CPU side"
SWAP_NONE = "no swap space, no swapping"
SWAP_AGAIN = "a request swapped back in may be swapped out again later"
SWAP_NOT_OUT = "only a request that is out can come back in: raise ValueError"
SWAP_TWICE = "a request cannot be out twice: raise ValueError"
SWAP_IN_TWICE = "once back in, the request is no longer out: raise ValueError"

SwapScript = tuple[int, list[tuple[Any, ...]], str]
"""``(capacity, ops, hint)``: a swap space's size, the calls made on it, the mistake they
catch."""


def _swap_case(capacity: int, ops: Sequence[tuple[Any, ...]], hint: str) -> Case:
    try:
        expected: Any = _replay(SwapSpace, capacity, ops)
    except ValueError:
        expected = Raises(ValueError)
    return _case(_describe_ops(capacity, ops), lambda cls: _replay(cls, capacity, ops),
                 expected, hint)


def _swap_cases() -> list[Case]:
    scripts: list[SwapScript] = [
        (10, [("used",), ("swap_out", 1, 4), ("used",), ("holds", 1), ("holds", 2)], SWAP_FITS),
        (10, [("swap_out", 1, 4), ("swap_out", 2, 8), ("holds", 2), ("used",)], SWAP_WHOLE),
        (10, [("swap_out", 1, 4), ("swap_out", 3, 6), ("used",), ("swap_out", 4, 1),
              ("holds", 4)], f"{SWAP_EDGE}; {SWAP_WHOLE}"),
        (10, [("swap_out", 1, 7), ("swap_in", 1), ("used",), ("swap_out", 2, 10), ("used",),
              ("holds", 1)], SWAP_RELEASE),
        (0, [("swap_out", 1, 1), ("used",)], SWAP_NONE),
        (5, [("swap_out", 1, 5), ("swap_in", 1), ("swap_out", 1, 2), ("used",)], SWAP_AGAIN),
        (10, [("swap_in", 3)], SWAP_NOT_OUT),
        (10, [("swap_out", 1, 2), ("swap_out", 1, 2)], SWAP_TWICE),
        (10, [("swap_out", 1, 2), ("swap_in", 1), ("swap_in", 1)], SWAP_IN_TWICE),
    ]
    return [_swap_case(*script) for script in scripts]


def _drawn_scripts(rng: random.Random) -> list[SwapScript]:
    """One script of each kind the fixed cases hold, on sizes and requests from ``rng``."""
    capacity = rng.randint(4, 20)
    a, b, c, d = rng.sample(range(100), 4)
    x = rng.randint(1, capacity - 1)  # fits, with room to spare
    y = rng.randint(capacity - x + 1, capacity)  # fits alone, not beside x
    return [
        (capacity, [("used",), ("swap_out", a, x), ("used",), ("holds", a), ("holds", b)],
         SWAP_FITS),
        (capacity, [("swap_out", a, x), ("swap_out", b, y), ("holds", b), ("used",)],
         SWAP_WHOLE),
        (capacity, [("swap_out", a, x), ("swap_out", c, capacity - x), ("used",),
                    ("swap_out", d, rng.randint(1, 3)), ("holds", d)],
         f"{SWAP_EDGE}; {SWAP_WHOLE}"),
        (capacity, [("swap_out", a, y), ("swap_in", a), ("used",), ("swap_out", b, capacity),
                    ("used",), ("holds", a)], SWAP_RELEASE),
        (0, [("swap_out", a, y), ("used",)], SWAP_NONE),
        (y, [("swap_out", a, y), ("swap_in", a), ("swap_out", a, rng.randint(1, y)), ("used",)],
         SWAP_AGAIN),
        (capacity, [("swap_in", c)], SWAP_NOT_OUT),
        (capacity, [("swap_out", a, x), ("swap_out", a, rng.randint(1, capacity))], SWAP_TWICE),
        (capacity, [("swap_out", a, x), ("swap_in", a), ("swap_in", a)], SWAP_IN_TWICE),
    ]


def _swap_fresh(seed: int) -> list[Case]:
    """Each kind of fixed script on sizes and requests drawn from ``seed``, and a random
    script of swaps out and in that never breaks the rules (a request comes back in only
    while the library's swap space holds it)."""
    rng = random.Random(seed)
    scripts = _drawn_scripts(rng)
    capacity = rng.randint(4, 20)
    space, ops = SwapSpace(capacity), []
    for request in rng.sample(range(50), 8):
        held = [rid for rid in range(50) if space.holds(rid)]
        if held and rng.random() < 0.4:
            back = rng.choice(held)
            space.swap_in(back)
            ops += [("swap_in", back), ("used",)]
        blocks = rng.randint(1, capacity)
        space.swap_out(request, blocks)
        ops += [("swap_out", request, blocks), ("holds", request), ("used",)]
    scripts.append((capacity, ops, f"{SWAP_WHOLE}; {SWAP_EDGE}; {SWAP_RELEASE}"))
    return [_swap_case(*script) for script in scripts]


# --- 05.resume_seconds: the cost of coming back, with the prefix cache --------------------------


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


RESUME_RECOMPUTE = ("recompute pays for the tokens recompute_tokens counts: all the request's "
                    "tokens but the cached full blocks, and never fewer than one")
RESUME_SWAP = ("swap does not look at the cache: every block of the request goes out AND comes "
               "back in, and a block moves whole however full it is")


def _resume_parts(value: Any) -> Any:
    """A pair as ``{"recompute": ..., "swap": ...}`` for the report; anything else as is."""
    if type(value) in (tuple, list) and len(value) == 2:
        return {"recompute": value[0], "swap": value[1]}
    return value


def _resume_case(n: int, c: int, b: int, p: int, m: CostModel) -> Case:
    return replace(
        _case(f"fn(length={n}, cached_blocks={c}, block_size={b}, bytes_per_token={p}, "
              f"costs={_costs_text(m)})", lambda fn: _resume_parts(fn(n, c, b, p, m)),
              _resume_parts(resume_seconds(n, c, b, p, m)), RESUME_RECOMPUTE),
        hints={"recompute": RESUME_RECOMPUTE, "swap": RESUME_SWAP})


SLOW_LINK = CostModel(step_seconds=0.01, prefill_seconds_per_token=1e-4,
                      swap_seconds_per_block=1e-3, pcie_bandwidth=8e9)


def _resume_cases() -> list[Case]:
    opt = MODELS["opt-13b"].bytes_per_token()
    settings = [
        (1000, 0, 16, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (1000, 40, 16, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (1000, 0, 1, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (1024, 64, 16, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (886, 3, 256, GUIDE_TOKEN_BYTES, ROOFLINE_COSTS),
        (17, 1, 16, 1024, SLOW_LINK),
        (4096, 100, 32, opt, SLOW_LINK),
    ]
    return [_resume_case(*setting) for setting in settings]


def _drawn_costs(rng: random.Random) -> CostModel:
    """A cost model whose every term is drawn from ``rng`` (three significant digits, so the
    call shows it exactly)."""
    def draw(low: float, high: float) -> float:
        return float(f"{rng.uniform(low, high):.3g}")

    return CostModel(step_seconds=draw(0.005, 0.05), prefill_seconds_per_token=draw(1e-5, 2e-4),
                     swap_seconds_per_block=draw(1e-4, 2e-3), pcie_bandwidth=draw(5e9, 64e9),
                     kv_read_bandwidth=rng.choice([None, draw(1e12, 5e12)]))


def _resume_fresh(seed: int) -> list[Case]:
    """Each kind of request the fixed cases hold, on cost models and sizes drawn from
    ``seed``: nothing cached, part of it cached, a cache holding all of it at a block's end,
    blocks of one token, and a block longer than the request."""
    rng = random.Random(seed)
    block = rng.choice([8, 16, 32])
    length = block * rng.randint(2, 100) + rng.randint(1, block - 1)  # a last block part full
    full = rng.randint(2, 100)

    def case(n: int, c: int, b: int) -> Case:
        return _resume_case(n, c, b, rng.choice([1024, GUIDE_TOKEN_BYTES, 4096 * rng.randint(
            1, 200)]), _drawn_costs(rng))

    return [case(length, 0, block),
            case(length, rng.randint(1, length // block - 1), block),
            case(block * full, full + rng.randint(0, 9), block),
            case(full, full + rng.randint(0, 9), 1),
            case(rng.randint(2, 255), rng.randint(1, 5), 256)]


# --- 05.plan_preemptions: plan one step's preemptions (from a specification) --------------------


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


PLAN_NEED = ("a request needs a new block only when its blocks are all full (length % "
             "block_size == 0); one with room in its last block needs none")
PLAN_FCFS = "under fcfs the NEWEST admission (the last in the list) goes first"
PLAN_PRIORITY = "under priority the victim is choose_victim's, among the requests still running"
PLAN_VICTIM = ("a victim gives back EVERY block it holds (its partly filled last one too) and "
               "no longer needs a new one; stop as soon as everyone left can write")

RunningSet = tuple[list[tuple[Request, int]], int, int, str]
"""``(running, free_blocks, block_size, hint)``: running pairs of (request, its length)."""


def running_sets() -> list[RunningSet]:
    """Running sets, free blocks and block sizes the plan is checked on, each with the hint
    of the mistake it is built to catch."""
    def r(rid: int, length: int, arrival: int = 0, priority: int = 0) -> tuple[Request, int]:
        return Request(rid, 10, 10, arrival=arrival, priority=priority), length

    return [
        ([r(0, 17), r(1, 30), r(2, 5)], 0, 16, PLAN_NEED),  # nobody is full
        ([r(0, 15), r(1, 30)], 0, 16, PLAN_NEED),  # 15 tokens of 16: room for one more
        ([r(0, 32), r(1, 16), r(2, 20)], 2, 16, PLAN_NEED),  # two need a block, two are free
        ([r(0, 32), r(1, 16), r(2, 20)], 1, 16, PLAN_FCFS),  # one short
        ([r(0, 15, 0, 0), r(1, 16, 1, 0)], 0, 16, PLAN_FCFS),  # the newest is full
        ([r(0, 8), r(1, 8), r(2, 8), r(3, 1)], 0, 8, PLAN_VICTIM),  # a victim frees 1 block
        ([r(0, 16), r(1, 48), r(2, 33), r(3, 64)], 0, 16, PLAN_VICTIM),
        ([r(0, 4, 0, 2), r(1, 8, 1, 0), r(2, 3, 2, 1), r(3, 12, 3, 0)], 0, 4, PLAN_PRIORITY),
        ([r(5, 12, 1, 1), r(6, 8, 2, 1), r(7, 16, 0, 0), r(8, 4, 2, 1)], 0, 4, PLAN_PRIORITY),
        ([r(0, 1, 0, 0)], 0, 1, PLAN_VICTIM),
        ([], 0, 16, PLAN_NEED),
    ]


def _plan_slip(running: Sequence[tuple[Request, int]], free_blocks: int, block_size: int,
               policy: str, slip: str) -> list[int]:
    """What a plan with one slip returns: ``"oldest"`` (fcfs preempts the oldest),
    ``"early"`` (a block needed when the token fills one), ``"floor"`` (a victim's partly
    filled block not given back) or ``"keeps_need"`` (a victim still needs its block)."""
    def full(length: int) -> bool:
        return (length + (slip == "early")) % block_size == 0

    survivors, victims = list(running), []
    need = sum(full(length) for _, length in survivors)
    while need > free_blocks and survivors:
        if policy == "fcfs":
            victim = survivors[0] if slip == "oldest" else survivors[-1]
        else:
            victim = max(survivors, key=lambda pair: (pair[0].priority, pair[0].arrival))
        survivors.remove(victim)
        free_blocks += (victim[1] // block_size if slip == "floor"
                        else blocks_needed(victim[1], block_size))
        need -= full(victim[1]) if slip != "keeps_need" else 0
        victims.append(victim[0].id)
    return victims


PLAN_SLIPS = (("oldest", "under fcfs the NEWEST admission (the last in the list) goes first, "
               "not the oldest"),
              ("early", "a request needs a new block only when its blocks are all full (length "
               "% block_size == 0), not when the token it writes fills the last one"),
              ("floor", "a victim gives back EVERY block it holds, its partly filled last one "
               "too"),
              ("keeps_need", "a victim no longer needs a new block: stop as soon as everyone "
               "left can write"))
"""Plans with one slip the check recognises, with their hints."""


def _plan_case(running: list[tuple[Request, int]], free: int, size: int, policy: str,
               hint: str) -> Case:
    mistakes = [(_plan_slip(running, free, size, policy, slip), slip_hint)
                for slip, slip_hint in PLAN_SLIPS]
    return _case(f"fn(running={_show_running(running)}, free_blocks={free}, "
                 f"block_size={size}, policy={policy!r})",
                 lambda fn: fn(list(running), free, size, policy),
                 plan_preemptions(running, free, size, policy), hint, mistakes)


def _bad_plan_case(running: list[tuple[Request, int]], free: int, size: int, policy: str,
                   what: str) -> Case:
    """A call with one impossible argument, ``what``, which must raise ValueError."""
    return _case(f"fn(running={_show_running(running)}, free_blocks={free}, block_size={size}, "
                 f"policy={policy!r})  # {what}",
                 lambda fn: fn(list(running), free, size, policy), Raises(ValueError),
                 _bad_input((policy not in POLICIES, "an unknown policy"),
                            (free < 0, "a negative free_blocks"),
                            (size < 1, "a block_size below 1"),
                            (True, "a running length below 1")))


def _plan_cases() -> list[Case]:
    cases = [_plan_case(running, free, size, policy, hint)
             for running, free, size, hint in running_sets() for policy in POLICIES]
    one = [(Request(0, 10, 10), 16)]
    return [*cases,
            _bad_plan_case(one, 0, 16, "random", "policy='random'"),
            _bad_plan_case(one, -1, 16, "fcfs", "free_blocks=-1"),
            _bad_plan_case(one, 0, 0, "fcfs", "block_size=0"),
            _bad_plan_case([(Request(0, 10, 10), 0)], 0, 16, "fcfs", "a running length of 0")]


def _drawn_running_sets(rng: random.Random) -> list[RunningSet]:
    """One running set of each kind :func:`running_sets` holds, drawn from ``rng``: free
    blocks exactly enough (lengths at, one short of and one past a block's end), one short
    with a partly filled newest request, only full requests, and a random set."""
    size = rng.choice([2, 4, 8])
    ids = iter(rng.sample(range(100), 40))

    def r(length: int) -> tuple[Request, int]:
        return (Request(next(ids), 10, 10, arrival=rng.randint(0, 3),
                        priority=rng.randint(0, 2)), length)

    def at_block_end(low: int = 1) -> int:
        """A length that fills whole blocks."""
        return size * rng.randint(low, 6)

    full = rng.randint(0, 2)
    enough = ([r(at_block_end()) for _ in range(full)]
              + [r(at_block_end() - 1) for _ in range(full + 1)]
              + [r(at_block_end(0) + 1) for _ in range(rng.randint(0, 2))])
    rng.shuffle(enough)
    short = [r(at_block_end()) for _ in range(rng.randint(1, 3))] + [r(rng.randint(1, size - 1))]
    crowd = rng.randint(2, 4)
    all_full = [r(at_block_end()) for _ in range(crowd - 1)] + [r(size * (crowd - 1))]
    drawn = [r(at_block_end() if rng.random() < 0.6 else rng.randint(1, 6 * size))
             for _ in range(rng.randint(3, 7))]
    return [(enough, full, size, PLAN_NEED), (short, len(short) - 2, size, PLAN_FCFS),
            (all_full, 0, size, PLAN_VICTIM), (drawn, rng.randint(0, 2), size, PLAN_PRIORITY)]


def _plan_fresh(seed: int) -> list[Case]:
    """Each kind of running set the fixed cases hold, drawn from ``seed`` (the first under
    one policy, the others under both), an empty one, and each impossible argument."""
    rng = random.Random(seed)
    (enough, free, size, hint), *rest = _drawn_running_sets(rng)
    one = [(Request(rng.randrange(100), 10, 10), rng.randint(1, 40))]
    return [_plan_case(enough, free, size, rng.choice(POLICIES), hint),
            *(_plan_case(running, free, size, policy, hint)
              for running, free, size, hint in rest for policy in POLICIES),
            _plan_case([], rng.randint(0, 5), size, rng.choice(POLICIES), PLAN_NEED),
            _bad_plan_case(one, 0, size, rng.choice(["random", "lifo", "FCFS", "newest"]),
                           "an unknown policy"),
            _bad_plan_case(one, -rng.randint(1, 9), size, "fcfs", "a negative free_blocks"),
            _bad_plan_case(one, 0, rng.choice([0, -size]), "priority", "a block_size below 1"),
            _bad_plan_case([*one, (Request(100, 10, 10), rng.choice([0, -rng.randint(1, 9)]))],
                           0, size, "fcfs", "a running length below 1")]


EXERCISES = (
    Exercise("05.admit_from_queue", "Admit from the waiting queue", _admit_cases,
             reference=("course_lib.scheduler.Scheduler",), fresh=_admit_fresh),
    Exercise("05.choose_victim", "vLLM's priority victim", _victim_cases,
             reference=("course_lib.scheduler.Scheduler",), fresh=_victim_fresh),
    Exercise("05.recompute_tokens", "Tokens a resumed request recomputes", _recompute_cases,
             reference=("course_lib.scheduler.tokens_to_recompute",), fresh=_recompute_fresh),
    Exercise("05.swap_space", "Swap-space accounting", _swap_cases,
             reference=("course_lib.scheduler.SwapSpace",), fresh=_swap_fresh),
    Exercise("05.resume_seconds", "The cost of coming back, with the prefix cache",
             _resume_cases,
             reference=("course_lib.simulator.CostModel.step_time",), fresh=_resume_fresh),
    Exercise("05.plan_preemptions", "Plan one step's preemptions", _plan_cases,
             reference=("course_lib.scheduler.Scheduler",), fresh=_plan_fresh),
    SCHEDULER_STEP,
)
