"""Chapter 05's scheduler-step exercise: one step of continuous batching, replayed against
the course's simulator step by step.

The learner writes ``schedule_step(state, block_size, max_num_seqs, max_num_batched_tokens)``
on plain data. ``state`` is ``{"running": [{"id", "length", "blocks"}, ...], "waiting":
[{"id", "length"}, ...], "free_blocks": n}``: running requests oldest admission first,
waiting ones front of the queue first, ``length`` the tokens a request holds (running) or
would prefill (waiting) before the step. It returns the same three keys as they stand after
the step's block claims, preemptions and admissions (before its decode), plus
``"preempted"`` and ``"admitted"``: request ids in the order it did them.

Expected values are the simulator's own decisions, not a second implementation of the rules:
:func:`simulator_steps` runs ``simulate(..., record="full")`` and rebuilds, from its log of
admissions, block claims, preemptions and finishes, the state before and after every step.
A case replays one trace: the learner's function gets each step's state and must return
what the simulator did; the first step that differs is reported with the state it started
from, what came back and what the simulator did.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from course_lib.grading.check import Case, Exercise, Satisfies, satisfies
from course_lib.scheduler import SchedulerConfig
from course_lib.simulator import Event, SimConfig, simulate
from course_lib.workload import Request, generate_trace

State = dict[str, Any]
"""``{"running": [...], "waiting": [...], "free_blocks": n}``, plus ``"preempted"`` and
``"admitted"`` in a step's result."""

FIELDS = ("preempted", "admitted", "running", "waiting", "free_blocks")
"""A result's keys, in the order a difference is reported (causes before their effects)."""


@dataclass(frozen=True)
class Replay:
    """A trace on a small paged server: ``num_blocks`` usable blocks of ``block_size`` tokens,
    first come first served, preemption by recompute, and the two admission limits."""

    label: str
    trace: tuple[Request, ...]
    block_size: int
    num_blocks: int
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def config(self) -> SimConfig:
        """The simulator's configuration: one byte per token, so the budget counts slots
        (one block more than ``num_blocks``: the pool's reserved null block)."""
        return SimConfig(
            budget_bytes=(self.num_blocks + 1) * self.block_size, bytes_per_token=1,
            block_size=self.block_size, max_len=max(r.total_len for r in self.trace),
            scheduler=SchedulerConfig(max_num_seqs=self.max_num_seqs,
                                      max_num_batched_tokens=self.max_num_batched_tokens))

    def call(self, fn: Callable[..., Any], state: State) -> Any:
        """The learner's ``fn`` on a copy of ``state`` (it may change what it is given)."""
        return fn(copy.deepcopy(state), self.block_size, self.max_num_seqs,
                  self.max_num_batched_tokens)


@dataclass
class _Server:
    """The plain state the simulator's log is replayed into."""

    free_blocks: int
    running: dict[int, dict[str, int]] = field(default_factory=dict)  # admission order
    waiting: list[dict[str, int]] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)

    def state(self) -> State:
        """The state as the learner sees it (a copy)."""
        return {"running": [{"id": rid, **entry} for rid, entry in self.running.items()],
                "waiting": [dict(entry) for entry in self.waiting],
                "free_blocks": self.free_blocks}

    def apply(self, event: Event) -> None:
        """One logged admission, block claim, preemption or finish."""
        rid = event.request
        if event.kind == "grow":
            self.running[rid]["blocks"] += 1
            self.free_blocks -= 1
        elif event.kind in ("preempt", "finish"):
            self.free_blocks += self.running.pop(rid)["blocks"]
            if event.kind == "preempt":
                self.waiting.insert(0, {"id": rid, "length": event.length})
                self.preempted.append(rid)
        else:
            head = self.waiting.pop(0)
            if head != {"id": rid, "length": event.length}:
                raise RuntimeError(f"the simulator admitted request {rid} at {event.length} "
                                   f"tokens, but the queue's head is {head}")
            self.running[rid] = {"length": event.length, "blocks": len(event.where)}
            self.free_blocks -= len(event.where)
            self.admitted.append(rid)


def simulator_steps(replay: Replay) -> list[tuple[int, State, State]]:
    """``(step, state before, result)`` for every step in which the simulator scheduled
    (idle steps, with nothing running or waiting, are skipped), rebuilt from its event log."""
    result = simulate(replay.trace, replay.config(), record="full")
    if result.rejections:
        raise ValueError(f"{replay.label}: the simulator rejects {result.rejections}")
    timeline = result.timeline
    if timeline is None or timeline.cuts is None:
        raise RuntimeError("simulate(record='full') kept no event log")
    events: dict[int, list[Event]] = {}
    for event in timeline.events:
        events.setdefault(event.step, []).append(event)
    server = _Server(replay.num_blocks)
    steps = []
    for t in range(len(timeline.batch)):
        server.waiting += [{"id": r.id, "length": r.prompt_len}  # arrivals, in trace order
                           for r in replay.trace if r.arrival == t]
        if not server.running and not server.waiting:
            continue
        before = server.state()
        server.preempted, server.admitted = [], []
        happened = events.get(t, [])
        for event in happened:
            if event.kind != "finish":
                server.apply(event)
        steps.append((t, before, server.state() | {"preempted": server.preempted,
                                                    "admitted": server.admitted}))
        for entry in server.running.values():  # the step's decode
            entry["length"] += 1
        for event in happened:
            if event.kind == "finish":
                server.apply(event)
    return steps


# --- the replay and its report -----------------------------------------------------------------


def _plain_result(out: Any) -> State:
    """The learner's result reduced to the keys the simulator's has (KeyError or TypeError
    when it lacks one)."""
    return {"running": [{"id": r["id"], "length": r["length"], "blocks": r["blocks"]}
                        for r in out["running"]],
            "waiting": [{"id": w["id"], "length": w["length"]} for w in out["waiting"]],
            "free_blocks": out["free_blocks"], "preempted": list(out["preempted"]),
            "admitted": list(out["admitted"])}


def _show(key: str, value: Any) -> str:
    """One field, compactly: running requests as id:length/blocks, waiting ones as id:length."""
    if key == "running":
        return "[" + " ".join(f"{r['id']}:{r['length']}/{r['blocks']}" for r in value) + "]"
    if key == "waiting":
        return "[" + " ".join(f"{w['id']}:{w['length']}" for w in value) + "]"
    return str(value)


def _show_state(state: State) -> str:
    return ", ".join(f"{key} {_show(key, state[key])}"
                     for key in ("running", "waiting", "free_blocks"))


def replay(fn: Callable[..., Any], case: Replay,
           steps: Sequence[tuple[int, State, State]]) -> list[State] | str:
    """Call ``fn`` on each step's state: its results while they match the simulator's, or,
    at the first step that differs (or raises), a line saying where, what and from where."""
    results = []
    for t, before, want in steps:
        try:
            out = case.call(fn, before)
        except NotImplementedError:
            raise
        except Exception as error:  # the learner's code may raise anything
            return (f"step {t}: raised {type(error).__name__}: {error}; "
                    f"from {_show_state(before)}")
        try:
            got = _plain_result(out)
        except (KeyError, TypeError) as error:
            return (f"step {t}: cannot read {out!r:.60} ({type(error).__name__}: {error}); a "
                    f"result is a dict of {', '.join(FIELDS)}, requests as dicts")
        if got != want:
            key = next(k for k in FIELDS if got[k] != want[k])
            return (f"step {t}: {key} {_show(key, got[key])} but the simulator has "
                    f"{_show(key, want[key])}; from {_show_state(before)}")
        results.append(got)
    return results


def replay_case(case: Replay, hint: str) -> Case:
    """The check of ``fn`` against the simulator on one trace, every step."""
    steps = simulator_steps(case)
    want = [result for _, _, result in steps]
    call = (f"{case.label}, {len(case.trace)} requests on {case.num_blocks} blocks of "
            f"{case.block_size}: fn(state, {case.block_size}, {case.max_num_seqs}, "
            f"{case.max_num_batched_tokens}) at each of {len(steps)} steps")
    expected = Satisfies(f"the simulator's result at each of the {len(steps)} steps",
                         lambda got, want=want: got == want)
    return Case(call, lambda fn: replay(fn, case, steps), expected, hint, compare=satisfies)


# --- the traces --------------------------------------------------------------------------------

GROW = ("running: a request whose blocks are full (blocks x block_size == length) claims one "
        "more block, oldest admission first")
PREEMPT = ("preempted: when a claim finds the pool empty, the NEWEST running request goes "
           "(maybe the claimant itself); waiting: it goes back to the FRONT, at its length")
ADMIT = ("admitted: nobody in a step that preempted; else from the front, strictly in order, "
         "while max_num_seqs, max_num_batched_tokens (a token per decode plus each "
         "admission's whole length and the token it writes) and the free blocks (for "
         "length + 1 tokens) allow")
RULES = f"{GROW}; {PREEMPT}; {ADMIT}"
"""The hint of a seeded trace: the idea behind each field the report may name."""


def _req(rid: int, prompt: int, output: int, arrival: int = 0) -> Request:
    return Request(rid, prompt, output, arrival=arrival)


def _seeded(seed: int, num_blocks: int, **limits: int) -> Replay:
    """Ten chats of about 16 tokens, two thirds of them reply, arriving about every other
    step on a pool too small for them all: the replies' growth forces preemptions."""
    trace = generate_trace(10, seed=seed, median_total=16, sigma=0.5, max_total=32,
                           reply_share=(4.0, 2.0), arrival_rate=0.5)
    return Replay(f"seeded trace {seed}", tuple(trace), 4, num_blocks, **limits)


def replays() -> list[tuple[Replay, str]]:
    """The traces the check replays, each with its hint: four seeded ones that preempt, then
    one edge case each (nothing waits, blocks filled exactly, each limit binding, a small
    request waiting behind a preempted one)."""
    return [
        (_seeded(2, 8), RULES),
        (_seeded(4, 8), RULES),
        (_seeded(7, 8, max_num_seqs=3), RULES),
        (_seeded(9, 10, max_num_batched_tokens=28), RULES),
        (Replay("nothing waits", (_req(0, 3, 6), _req(1, 5, 2), _req(2, 2, 3, arrival=12)),
                4, 20),
         f"with nobody waiting a step only claims blocks; {GROW}"),
        (Replay("blocks filled exactly", (_req(0, 3, 3), _req(1, 4, 2), _req(2, 7, 2),
                                           _req(3, 8, 2)), 4, 7),
         "running: a request admitted at length L takes room for L + 1 tokens, the token this step "
         "writes included (3 tokens take 1 block of 4, 4 tokens take 2); a running one "
         "claims when blocks x block_size == length"),
        (Replay("max_num_seqs binds", tuple(_req(i, 3 + i, 4) for i in range(5)), 4, 30,
                max_num_seqs=2),
         "admitted: max_num_seqs caps the running requests, counting those admitted in this "
         "step"),
        (Replay("max_num_batched_tokens binds", (_req(0, 6, 4), _req(1, 5, 3), _req(2, 11, 1),
                                                  _req(3, 2, 2, arrival=4)), 4, 30,
                max_num_batched_tokens=12),
         "admitted: a step's tokens are one per running request (its decode) plus, for each "
         "admitted request, its whole length (its prefill) and the token it writes; the "
         "first that would pass max_num_batched_tokens stops admission"),
        (Replay("preemption with a small request waiting",
                (_req(0, 8, 8), _req(1, 7, 6), _req(2, 1, 2, arrival=1)), 4, 5),
         f"{PREEMPT}; admitted: nobody in a step that preempted, and a request that does "
         "not fit blocks those behind it"),
    ]


def _cases() -> list[Case]:
    return [replay_case(case, hint) for case, hint in replays()]


SCHEDULER_STEP = Exercise("05.scheduler_step", "One scheduler step of continuous batching",
                          _cases, reference=("course_lib.simulator.simulate",
                                             "course_lib.scheduler",
                                             "course_lib.serving.ServingCore"))
