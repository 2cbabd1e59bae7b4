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
A case runs the learner's function closed loop on one trace (:func:`closed_loop`, which
uses only the trace): each step's state is made from the learner's own previous result
(every running request writes its token, those at their final length finish) plus the
step's arrivals, so no expected state enters the learner's process. The grader compares
the results with the simulator's (:func:`explain_run`) and reports the first step and field
that differ, with the state that step started from. Two more cases call the function on
hand-made states where a request holds a spare block (:data:`SCENES`), the only states in
which two of the rules show.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from course_lib.grading.check import Case, Exercise, Satisfies, Verdict, satisfies
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

    def call(self, fn: Callable[..., Any], state: State) -> Any:
        """The learner's ``fn`` on a copy of ``state`` (it may change what it is given)."""
        return fn(copy.deepcopy(state), self.block_size, self.max_num_seqs,
                  self.max_num_batched_tokens)


def sim_config(replay: Replay) -> SimConfig:
    """The simulator's configuration for ``replay``: one byte per token, so the budget counts
    slots (one block more than ``num_blocks``: the pool's reserved null block). Not a method:
    a :class:`Replay` travels into the learner's process, where the simulator is not."""
    return SimConfig(
        budget_bytes=(replay.num_blocks + 1) * replay.block_size, bytes_per_token=1,
        block_size=replay.block_size, max_len=max(r.total_len for r in replay.trace),
        scheduler=SchedulerConfig(max_num_seqs=replay.max_num_seqs,
                                  max_num_batched_tokens=replay.max_num_batched_tokens))


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
    result = simulate(replay.trace, sim_config(replay), record="full")
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


# --- the closed-loop run and its report --------------------------------------------------------


def _plain_result(out: Any) -> State:
    """The learner's result reduced to the keys the simulator's has (KeyError or TypeError
    when it lacks one)."""
    return {"running": [{"id": r["id"], "length": r["length"], "blocks": r["blocks"]}
                        for r in out["running"]],
            "waiting": [{"id": w["id"], "length": w["length"]} for w in out["waiting"]],
            "free_blocks": out["free_blocks"], "preempted": list(out["preempted"]),
            "admitted": list(out["admitted"])}


def _next_state(result: State, finals: dict[int, int]) -> State:
    """The state after ``result``'s step: every running request writes its token, and those
    that reach their final length (``finals``, by id) finish and free their blocks."""
    running, free = [], result["free_blocks"]
    for entry in result["running"]:
        entry = dict(entry, length=entry["length"] + 1)
        if entry["length"] >= finals[entry["id"]]:
            free += entry["blocks"]
        else:
            running.append(entry)
    return {"running": running, "waiting": [dict(w) for w in result["waiting"]],
            "free_blocks": free}


def step_limit(case: Replay) -> int:
    """Steps after which a closed-loop run is cut off: a run that does not end by then keeps
    requests forever (a correct one ends well before, the trace being admissible)."""
    return 2 * (max(r.arrival for r in case.trace) + sum(r.total_len for r in case.trace)) + 8


@dataclass(frozen=True)
class Records:
    """A closed-loop run's records, shown in the report by their number and last step
    (``to_plain`` makes it ``{"records": [...]}``)."""

    records: list[dict[str, Any]]

    def __repr__(self) -> str:
        last = self.records[-1] if self.records else {}
        ending = f"; step {last['step']} {last['error']}" if "error" in last else ""
        return f"your results at {len(self.records)} steps{ending}"


def closed_loop(fn: Callable[..., Any], case: Replay) -> list[dict[str, Any]]:
    """Drive ``fn`` through ``case``'s trace on its own results: each step's state is the
    learner's previous result after its decode and finishes, plus the step's arrivals.

    Returns one record per step in which something runs or waits: ``{"step": t, "result":
    ...}``, or, at the first step that raises or returns something unreadable, ``{"step": t,
    "error": why}`` and nothing after it. No expected value is used, so the records go to
    the grader, which compares them with the simulator's (:func:`simulator_steps`).
    """
    finals = {r.id: r.total_len for r in case.trace}
    state: State = {"running": [], "waiting": [], "free_blocks": case.num_blocks}
    records: list[dict[str, Any]] = []
    last_arrival = max(r.arrival for r in case.trace)
    for t in range(step_limit(case)):
        state["waiting"] += [{"id": r.id, "length": r.prompt_len}  # arrivals, in trace order
                             for r in case.trace if r.arrival == t]
        if not state["running"] and not state["waiting"]:
            if t >= last_arrival:
                break
            continue
        try:
            out = case.call(fn, state)
        except NotImplementedError:
            raise
        except Exception as error:  # the learner's code may raise anything
            return [*records, {"step": t, "error": f"raised {type(error).__name__}: {error}"}]
        try:
            result = _plain_result(out)
            state = _next_state(result, finals)
        except (KeyError, TypeError, ValueError) as error:
            return [*records, {"step": t, "error": (
                f"cannot read {out!r:.60} ({type(error).__name__}: {error}); a result is a "
                f"dict of {', '.join(FIELDS)}, requests as dicts of ids and lengths known "
                "to the step")}]
        records.append({"step": t, "result": result})
    return records


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


def _recognised(key: str, got: State, want: State, before: State, case: Replay) -> str:
    """The hint of a mistake recognised from how the first differing field differs, or "":
    an admission the rules forbid, named by the rule it breaks."""
    if key != "admitted" or len(got["admitted"]) <= len(want["admitted"]):
        return ""
    if want["preempted"]:
        return PREEMPTED_ADMITS
    queue = [w["id"] for w in before["waiting"]]
    if got["admitted"] != queue[:len(got["admitted"])]:
        return IN_ORDER
    extra = before["waiting"][len(want["admitted"])]
    tokens = len(want["running"]) - len(want["admitted"]) + sum(
        w["length"] + 1 for w in before["waiting"] if w["id"] in want["admitted"])
    limit = case.max_num_batched_tokens
    if limit is not None and tokens + extra["length"] + 1 > limit:
        return BUDGET
    return ""


def explain_run(records: Any, steps: Sequence[tuple[int, State, State]],
                case: Replay) -> Verdict | None:
    """None when the learner's closed-loop ``records`` are the simulator's ``steps``; else
    the first step and field that differ, led by the field's name, and the state the step
    started from (the simulator's, which the learner's run shared up to there)."""
    if isinstance(records, dict):  # the plain form of Records
        records = records.get("records", [])
    for index, (t, before, want) in enumerate(steps):
        record = records[index] if index < len(records) else None
        where = f"at step {t}, from {_show_state(before)}"
        if record is None:
            return Verdict(False, f"steps: your run ended after {len(records)} steps; the "
                                  f"simulator's has {len(steps)} ({where})", ENDS)
        if record.get("step") != t:
            return Verdict(False, f"steps: your run scheduled step {record.get('step')} where "
                                  f"the simulator's scheduled step {t}", ENDS)
        if "error" in record:
            return Verdict(False, f"result: {record['error']} ({where})")
        got = record["result"]
        key = next((k for k in FIELDS if got[k] != want[k]), None)
        if key is not None:
            return Verdict(False, f"{key}: got {_show(key, got[key])}, the simulator has "
                                  f"{_show(key, want[key])} ({where})",
                           _recognised(key, got, want, before, case))
    if len(records) > len(steps):
        return Verdict(False, f"steps: your run went on after the simulator's ended (step "
                              f"{records[len(steps)].get('step')})", ENDS)
    return None


def replay_case(case: Replay, hint: str) -> Case:
    """The check of ``fn`` against the simulator on one trace, closed loop: the learner's
    run goes into the kernel with the trace only; its records are judged here."""
    steps = simulator_steps(case)
    call = (f"{case.label}, {len(case.trace)} requests on {case.num_blocks} blocks of "
            f"{case.block_size}: fn(state, {case.block_size}, {case.max_num_seqs}, "
            f"{case.max_num_batched_tokens}) at each step, each state made from your "
            "previous result")
    expected = Satisfies(f"the simulator's result at each of its {len(steps)} steps",
                         explain=lambda got, steps=steps: explain_run(got, steps, case))
    return Case(call, lambda fn: Records(closed_loop(fn, case)), expected, hint,
                compare=satisfies, hints=HINTS)


# --- the traces --------------------------------------------------------------------------------

GROW = ("a running request whose blocks are full (blocks x block_size == length) claims one "
        "more block, oldest admission first; an admission takes blocks for length + 1 tokens "
        "(its prefill and the token this step writes)")
PREEMPT = ("when a claim finds the pool empty, the NEWEST running request goes (maybe the "
           "claimant itself), giving back every block it holds")
REQUEUE = ("a preempted request goes back to the FRONT of the waiting queue, at its length; "
           "admitted requests leave from the front")
ADMIT = ("admit from the front, strictly in order, while max_num_seqs (counting this step's "
         "admissions), max_num_batched_tokens and the free blocks allow")
BUDGET = ("max_num_batched_tokens counts one token per running request (its decode) and, for "
          "each admission, its length PLUS the token this step writes for it (length + 1), as "
          "the serving core counts an admission")
IN_ORDER = ("the queue is strictly first come, first served: when the front request cannot "
            "start, nobody behind it may")
PREEMPTED_ADMITS = "a step that preempted admits nobody (vLLM's rule)"
FREE = ("free_blocks: what was free, less one per claim and length // block_size + 1 per "
        "admission, plus every block a victim held")
ENDS = ("requests finish when they reach their final length: keep every request in running or "
        "waiting until then, and admit whatever the rules allow")
HINTS = {"running": GROW, "preempted": PREEMPT, "waiting": REQUEUE, "admitted": ADMIT,
         "free_blocks": FREE, "steps": ENDS,
         "result": "return a dict with the keys running, waiting, free_blocks, preempted and "
                   "admitted, requests as dicts (running: id, length, blocks; waiting: id, "
                   "length)"}
"""The hint for the first field that differs (a recognised mistake's hint wins)."""
RULES = f"{GROW}; {PREEMPT}; {REQUEUE}; {ADMIT}"
"""A case's default hint: every rule."""


def _req(rid: int, prompt: int, output: int, arrival: int = 0) -> Request:
    return Request(rid, prompt, output, arrival=arrival)


def _seeded(seed: int, num_blocks: int, **limits: int) -> Replay:
    """Ten chats of about 16 tokens, two thirds of them reply, arriving about every other
    step on a pool too small for them all: the replies' growth forces preemptions."""
    trace = generate_trace(10, seed=seed, median_total=16, sigma=0.5, max_total=32,
                           reply_share=(4.0, 2.0), arrival_rate=0.5)
    return Replay(f"seeded trace {seed}", tuple(trace), 4, num_blocks, **limits)


def replays() -> list[Replay]:
    """The traces the check runs: four seeded ones that preempt, then one edge case each
    (nothing waits, blocks filled exactly, each limit binding, a budget met exactly, a small
    request waiting behind a preempted one)."""
    return [
        _seeded(2, 8),
        _seeded(4, 8),
        _seeded(7, 8, max_num_seqs=3),
        _seeded(9, 10, max_num_batched_tokens=28),
        Replay("nothing waits", (_req(0, 3, 6), _req(1, 5, 2), _req(2, 2, 3, arrival=12)),
               4, 20),
        Replay("blocks filled exactly", (_req(0, 3, 3), _req(1, 4, 2), _req(2, 7, 2),
                                          _req(3, 8, 2)), 4, 7),
        Replay("max_num_seqs binds", tuple(_req(i, 3 + i, 4) for i in range(5)), 4, 30,
               max_num_seqs=2),
        Replay("max_num_batched_tokens binds", (_req(0, 6, 4), _req(1, 5, 3), _req(2, 11, 1),
                                                 _req(3, 2, 2, arrival=4)), 4, 30,
               max_num_batched_tokens=12),
        Replay("a budget met exactly", (_req(0, 5, 3), _req(1, 4, 3), _req(2, 1, 2)), 4, 30,
               max_num_batched_tokens=11),
        Replay("preemption with a small request waiting",
               (_req(0, 8, 8), _req(1, 7, 6), _req(2, 1, 2, arrival=1)), 4, 5),
    ]


def _budget_replay(rng: random.Random) -> Replay:
    """Requests that meet max_num_batched_tokens exactly at step 0, then one that fits the
    budget while they run only if their decode tokens (or its own written token) were free;
    then a small late arrival. The pool holds them all; no request is longer than the budget
    (the simulator's max_len)."""
    running = rng.randint(2, 3)
    budget = rng.randint(3 * running + 2, 18)
    cuts = sorted(rng.sample(range(1, budget - running), running - 1))
    prompts = [b - a for a, b in zip([0, *cuts], [*cuts, budget - running], strict=True)]
    trace = [_req(i, p, rng.randint(2, min(5, budget - p))) for i, p in enumerate(prompts)]
    trace += [_req(running, budget - running, rng.randint(1, running)),
              _req(running + 1, rng.randint(1, 3), rng.randint(1, 3), arrival=rng.randint(3, 8))]
    return Replay("a budget met exactly, drawn", tuple(trace), 4,
                  sum(r.total_len // 4 + 1 for r in trace), max_num_batched_tokens=budget)


def _seats_replay(rng: random.Random) -> Replay:
    """More requests at step 0 than max_num_seqs, on a pool that holds them all."""
    seats = rng.randint(1, 3)
    trace = tuple(_req(i, rng.randint(1, 8), rng.randint(1, 5))
                  for i in range(seats + rng.randint(1, 3)))
    return Replay("max_num_seqs binds, drawn", trace, 4,
                  sum(r.total_len // 4 + 1 for r in trace), max_num_seqs=seats)


def _filled_replay(rng: random.Random) -> Replay:
    """Prompts whose blocks the token they write fills exactly, on a pool they fill exactly:
    the last admission takes the last free block, and every one claims at the next step."""
    blocks = [rng.randint(1, 3) for _ in range(rng.randint(2, 3))]
    return Replay("blocks filled exactly, drawn",
                  tuple(_req(i, 4 * n - 1, rng.randint(2, 5)) for i, n in enumerate(blocks)), 4,
                  sum(blocks))


def _small_behind_replay(rng: random.Random) -> Replay:
    """A request with room in its last block and a full one fill the pool; the full one is
    preempted at step 1 and no longer fits, while a small request arriving behind it would."""
    room, full = rng.randint(1, 3), rng.randint(1, 3)
    trace = (_req(0, 4 * room, rng.randint(4, 8)), _req(1, 4 * full - 1, rng.randint(3, 6)),
             _req(2, rng.randint(1, 2), rng.randint(1, 3), arrival=1))
    return Replay("preemption with a small request waiting, drawn", trace, 4, room + 1 + full)


# --- hand-made states: rules that the simulator's states never exercise ------------------------


@dataclass(frozen=True)
class Scene:
    """One step on a hand-made state in which a request holds a spare block (as one that
    reserved ahead would): the simulator never makes one, since its requests hold exactly
    the blocks their length needs, so there "blocks full" and "length % block_size == 0" are
    the same test, and a preempted request at the front of the queue never fits back at once
    (so admission would stop there anyway). ``must`` maps a result field to what the rule
    under test requires of it; ``hint`` is the hint of that rule, for a difference in one of
    ``rule_fields``, while any other field that differs gets its own hint (``HINTS``)."""

    label: str
    state: State
    must: tuple[tuple[str, Any], ...]
    hint: str
    rule_fields: tuple[str, ...]
    block_size: int = 4

    def explain(self, got: Any) -> Verdict | None:
        """None when every field in ``must`` is as required, else the first that is not."""
        if not isinstance(got, dict) or "error" in got:
            return Verdict(False, f"result: {got.get('error') if isinstance(got, dict) else got}",
                           HINTS["result"])
        for key, want in self.must:
            if got[key] != want:
                return Verdict(False, f"{key}: got {_show(key, got[key])}, the rule gives "
                                      f"{_show(key, want)}",
                               self.hint if key in self.rule_fields else HINTS[key])
        return None


def _one_step(fn: Callable[..., Any], state: State, block_size: int) -> dict[str, Any]:
    """``fn`` on a copy of ``state`` with no limits, as plain data."""
    try:
        out = fn(copy.deepcopy(state), block_size, None, None)
    except NotImplementedError:
        raise
    except Exception as error:  # the learner's code may raise anything
        return {"error": f"raised {type(error).__name__}: {error}"}
    try:
        return _plain_result(out)
    except (KeyError, TypeError) as error:
        return {"error": f"cannot read {out!r:.60} ({type(error).__name__}: {error})"}


def _spare_scene(size: int, old: int, new: int, blocks: int, claims: int, free: int) -> Scene:
    """Request ``old`` holds ``blocks`` full blocks and a spare one; the newest, ``new``,
    fills ``claims`` blocks exactly: only ``new`` claims, from ``free`` >= 1 blocks."""
    running = [{"id": old, "length": size * blocks, "blocks": blocks + 1},
               {"id": new, "length": size * claims, "blocks": claims}]
    return Scene(f"request {old} holds a spare block: {size * blocks} tokens in {blocks + 1} "
                 f"blocks of {size}", {"running": running, "waiting": [], "free_blocks": free},
                 (("preempted", []), ("running", [running[0], dict(running[1],
                                                                   blocks=claims + 1)]),
                  ("free_blocks", free - 1)),
                 "a request claims only when its blocks are full (blocks x block_size == "
                 f"length), not whenever length % block_size == 0: request {old} has room for "
                 "its token", ("preempted", "running", "free_blocks"), size)


def _preempted_scene(size: int, old: int, new: int, waiting: int, blocks: int, length: int,
                     held: int, small: int) -> Scene:
    """Request ``old`` fills ``blocks`` blocks and claims from an empty pool; the newest,
    ``new``, at ``length`` tokens in ``held`` blocks (at least one more than it needs), is
    preempted and would fit back at once, in front of ``waiting`` at ``small`` tokens."""
    return Scene(f"request {new}, the newest, holds a spare block and is preempted",
                 {"running": [{"id": old, "length": size * blocks, "blocks": blocks},
                              {"id": new, "length": length, "blocks": held}],
                  "waiting": [{"id": waiting, "length": small}], "free_blocks": 0},
                 (("preempted", [new]), ("admitted", []),
                  ("waiting", [{"id": new, "length": length}, {"id": waiting, "length": small}]),
                  ("free_blocks", held - 1)),
                 f"{PREEMPTED_ADMITS}, even when the free blocks would hold the front request",
                 ("admitted",), size)


SCENES = (_spare_scene(4, 0, 1, 2, 1, 1), _preempted_scene(4, 0, 1, 2, 2, 3, 3, 2))


def _drawn_scenes(rng: random.Random) -> list[Scene]:
    """The two kinds of :data:`SCENES` on ids, lengths and block sizes drawn from ``rng``."""
    size = rng.choice([2, 4, 8])
    old, new, waiting = rng.sample(range(100), 3)
    length = rng.randint(1, 2 * size)
    return [_spare_scene(size, old, new, rng.randint(1, 4), rng.randint(1, 4),
                         rng.randint(1, 3)),
            _preempted_scene(size, old, new, waiting, rng.randint(1, 4), length,
                             length // size + 1 + rng.randint(1, 3), rng.randint(1, size))]


def _scene_case(scene: Scene) -> Case:
    state, size = scene.state, scene.block_size
    return Case(f"fn({{'running': {state['running']}, 'waiting': {state['waiting']}, "
                f"'free_blocks': {state['free_blocks']}}}, {size}, None, None)  # {scene.label}",
                lambda fn, state=state: _one_step(fn, state, size),
                Satisfies(", ".join(f"{key} {_show(key, want)}" for key, want in scene.must),
                          explain=scene.explain),
                scene.hint, compare=satisfies)


def _cases() -> list[Case]:
    return [replay_case(case, RULES) for case in replays()] + [_scene_case(s) for s in SCENES]


def _fresh(seed: int) -> list[Case]:
    """Each kind of fixed case, drawn from ``seed``: two seeded traces that preempt (one
    with each limit), max_num_seqs binding, the budget met exactly, blocks filled exactly, a
    small request behind a preempted one, and both hand-made scenes."""
    rng = random.Random(seed)
    traces = [_seeded(rng.randrange(10_000), rng.randint(8, 10),
                      max_num_seqs=rng.randint(2, 4)),
              _seeded(rng.randrange(10_000), rng.randint(8, 10),
                      max_num_batched_tokens=rng.randint(32, 44)),
              _seats_replay(rng), _budget_replay(rng), _filled_replay(rng),
              _small_behind_replay(rng)]
    return ([replay_case(case, RULES) for case in traces]
            + [_scene_case(scene) for scene in _drawn_scenes(rng)])


SCHEDULER_STEP = Exercise("05.scheduler_step", "One scheduler step of continuous batching",
                          _cases, reference=("course_lib.simulator.simulate",
                                             "course_lib.scheduler",
                                             "course_lib.serving.ServingCore"),
                          fresh=_fresh)
