"""Chapter 05's scheduler-step check: its expected values are the simulator's, step by step,
and the learner's function runs closed loop on its own results; a correct design other than
the notebook's passes; every kept mistake fails at a named step with its own hint; the two
rules the simulator's states never exercise are caught on hand-made states."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.grading import ch05_step, chapter_exercises, find_exercise
from course_lib.grading.ch05_step import (
    SCHEDULER_STEP,
    Replay,
    closed_loop,
    explain_run,
    replay_case,
    replays,
    simulator_steps,
)
from course_lib.grading.check import CheckResult, evaluate, judge, observe
from course_lib.simulator import simulate
from course_lib.workload import Request
from tests.mutants.ch05 import mistaken, suffix_design

NAME = "05.scheduler_step"


def run(obj: Any) -> CheckResult:
    return evaluate(find_exercise(NAME), obj)


# --- the other correct design (suffix_design) and the mistakes: tests/mutants/ch05.py -------


def test_registered_in_chapter_05() -> None:
    assert NAME in [e.name for e in chapter_exercises("05")]


def test_another_correct_design_passes() -> None:
    result = run(suffix_design)
    assert result.status == "passed" and result.total >= 12, result.report_text()


def test_fresh_cases_are_seeded_and_a_correct_design_passes_them() -> None:
    assert [c.call for c in SCHEDULER_STEP.fresh(5)] == [c.call for c in SCHEDULER_STEP.fresh(5)]
    assert [c.call for c in SCHEDULER_STEP.fresh(5)] != [c.call for c in SCHEDULER_STEP.fresh(6)]
    for seed in (0, 1):
        for case in SCHEDULER_STEP.fresh(seed):
            assert judge(case, observe(case, suffix_design)).passed, case.call


def test_a_stub_is_not_yet_solved() -> None:
    def stub(*args: object) -> None:
        raise NotImplementedError

    assert run(stub).status == "not-solved"


# --- the expected values are the simulator's ---------------------------------------------------


def _check_against_simulator(case: Replay) -> None:
    """Every rebuilt step agrees with the simulator's own per-step timeline, and the steps
    together with its totals: decode steps, preemptions and recomputed tokens."""
    result = simulate(case.trace, ch05_step.sim_config(case), record="steps")
    timeline = result.timeline
    assert timeline is not None
    steps = simulator_steps(case)
    scheduled = {t: out for t, _, out in steps}
    for t in range(len(timeline.batch)):
        out = scheduled.get(t, {"running": [], "waiting": [], "free_blocks": case.num_blocks,
                                "preempted": []})
        assert (timeline.batch[t], timeline.waiting[t], timeline.preemptions[t],
                timeline.free[t]) == (len(out["running"]), len(out["waiting"]),
                                      len(out["preempted"]),
                                      out["free_blocks"] * case.block_size), t
    preempted: set[int] = set()
    recomputed = 0
    for _, before, out in steps:
        lengths = {w["id"]: w["length"] for w in before["waiting"]}
        recomputed += sum(lengths[rid] for rid in out["admitted"] if rid in preempted)
        preempted.update(out["preempted"])
    assert (result.steps, result.preemptions, result.recomputed_tokens) == (
        sum(bool(out["running"]) for out in scheduled.values()),
        sum(len(out["preempted"]) for out in scheduled.values()), recomputed)


@pytest.mark.parametrize("case", replays(), ids=lambda c: c.label)
def test_rebuilt_steps_agree_with_the_simulator(case: Replay) -> None:
    _check_against_simulator(case)


def test_the_seeded_traces_preempt_and_the_edge_cases_bind() -> None:
    cases = {case.label: simulator_steps(case) for case in replays()}
    for label, steps in cases.items():
        if label.startswith("seeded"):
            assert sum(len(out["preempted"]) for _, _, out in steps) >= 3, label
    quiet = cases["nothing waits"]
    assert not any(out["waiting"] for _, _, out in quiet)
    assert [t for t, _, _ in quiet] != list(range(len(quiet)))  # an idle gap is skipped
    assert max(len(out["running"]) for _, _, out in cases["max_num_seqs binds"]) == 2

    def fits(request: dict[str, int], out: dict[str, Any]) -> bool:
        return request["length"] // 4 + 1 <= out["free_blocks"]

    for label in ("max_num_seqs binds", "max_num_batched_tokens binds"):  # not the blocks
        assert any(out["waiting"] and not out["preempted"] and fits(out["waiting"][0], out)
                   for _, _, out in cases[label]), label
    assert any(out["preempted"] and any(fits(w, out) for w in out["waiting"])
               for _, _, out in cases["preemption with a small request waiting"])


@pytest.mark.parametrize("seed", range(6))
def test_the_drawn_edge_cases_bind_as_the_fixed_ones_do(seed: int) -> None:
    """The fresh draw's edge traces make the situation their fixed twins are built for."""
    rng = random.Random(seed)
    seats, budget, filled, behind = (ch05_step._seats_replay(rng), ch05_step._budget_replay(rng),
                                     ch05_step._filled_replay(rng),
                                     ch05_step._small_behind_replay(rng))
    first = simulator_steps(seats)[0][2]
    assert len(first["running"]) == seats.max_num_seqs and first["waiting"]
    (_, before, out), (_, _, then) = simulator_steps(budget)[:2]
    charged = sum(w["length"] + 1 for w in before["waiting"] if w["id"] in out["admitted"])
    assert charged == budget.max_num_batched_tokens and not then["admitted"]
    assert len(then["running"]) + then["waiting"][0]["length"] + 1 == charged + 1
    steps = simulator_steps(filled)
    assert steps[0][2]["free_blocks"] == 0 and not steps[0][2]["waiting"]
    assert steps[1][2]["preempted"]
    assert any(out["preempted"] and out["waiting"][-1]["length"] // 4 + 1 <= out["free_blocks"]
               for _, _, out in simulator_steps(behind))
    assert {case.call for case in SCHEDULER_STEP.fresh(seed)}.isdisjoint(
        case.call for case in SCHEDULER_STEP.cases())


@st.composite
def small_servers(draw: st.DrawFn) -> Replay:
    """A few requests on a pool that holds the longest one, sometimes under limits."""
    block_size = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 10),
                                      st.integers(0, 8)), min_size=1, max_size=7))
    trace = tuple(Request(i, p, o, arrival=a) for i, (p, o, a) in enumerate(lengths))
    longest = max(r.total_len for r in trace)
    num_blocks = draw(st.integers(-(-longest // block_size), -(-longest // block_size) + 8))
    seqs = draw(st.none() | st.integers(1, 4))
    tokens = draw(st.none() | st.integers(longest, longest + 12))
    return Replay("random", trace, block_size, num_blocks, seqs, tokens)


@settings(max_examples=60, deadline=None)
@given(small_servers())
def test_random_servers_rebuilt_steps_match_the_simulator_and_the_rules(case: Replay) -> None:
    _check_against_simulator(case)
    steps = simulator_steps(case)
    records = closed_loop(suffix_design, case)
    assert [r["result"] for r in records] == [out for _, _, out in steps]
    assert explain_run(records, steps, case) is None


# --- typical mistakes fail at a named step, each with its own hint ------------------------------


def test_the_mistake_free_variant_passes() -> None:
    assert run(mistaken()).status == "passed"


MUTANTS = {  # mistake: (its first difference, the hint its report must show)
    "oldest_victim": ("preempted: got [0], the simulator has [2]", ch05_step.PREEMPT),
    "requeue_at_back": ("waiting: got [3:2 2:7], the simulator has [2:7 3:2]",
                        ch05_step.REQUEUE),
    "skip_blocked_head": ("admitted: got [3], the simulator has []", ch05_step.IN_ORDER),
    "blocks_for_length": ("running: got [0:4/1], the simulator has [0:4/2]", ch05_step.GROW),
    "needs_spare_block": ("admitted: got [], the simulator has [2]", ch05_step.ADMIT),
    "decode_tokens_free": ("admitted: got [2], the simulator has []", ch05_step.BUDGET),
    "no_token_budget": ("admitted: got [0, 1, 2], the simulator has [0]", ch05_step.BUDGET),
    "step_token_free": ("admitted: got [0, 1], the simulator has [0]", ch05_step.BUDGET),
    "no_seq_limit": ("admitted: got [0, 1, 2, 3, 4], the simulator has [0, 1]",
                     ch05_step.ADMIT),
    "claims_on_length": ("preempted: got [1], the rule gives []",
                         ch05_step.SCENES[0].hint),
    "admits_after_preempting": ("admitted: got [1, 2], the rule gives []",
                                ch05_step.SCENES[1].hint),
}


@pytest.mark.parametrize("mistake", sorted(MUTANTS))
def test_each_mistake_fails_at_its_step_with_its_own_hint(mistake: str) -> None:
    result = run(mistaken(**{mistake: True}))
    assert result.status == "failed"
    differs, hint = MUTANTS[mistake]
    failing = [case for case in result.cases if not case.passed]
    assert any(case.differs.startswith(differs) and case.hint == hint for case in failing), (
        result.report_text())
    report = result.report_text()
    for case in failing:
        assert "line " not in case.got and "Mismatch" not in report
        assert f"differs  {case.differs}" in report and f"hint     {case.hint}" in report


def test_the_budget_hint_names_the_rule_a_learner_may_have_used() -> None:
    assert "length + 1" in ch05_step.BUDGET and "serving core" in ch05_step.BUDGET


@settings(max_examples=30, deadline=None)
@given(small_servers())
def test_the_two_hand_made_rules_never_show_in_the_simulators_states(case: Replay) -> None:
    """Why they need hand-made states: on every state the simulator makes, a variant that
    claims when length % block_size == 0 and admits after preempting does what it does."""
    variant = mistaken(claims_on_length=True, admits_after_preempting=True)
    steps = simulator_steps(case)
    assert explain_run(closed_loop(variant, case), steps, case) is None


def test_a_crash_or_a_malformed_result_names_the_step() -> None:
    case = Replay("two", (Request(0, 3, 2), Request(1, 2, 2, arrival=1)), 4, 4)
    steps = simulator_steps(case)

    def crashes_later(state: dict[str, Any], *limits: Any) -> dict[str, Any]:
        if state["running"]:
            state["running"].clear()  # the report still shows the state as it was given
            raise KeyError("length")
        return suffix_design(state, *limits)

    found = explain_run(closed_loop(crashes_later, case), steps, case)
    assert found is not None and found.differs.startswith(
        "result: raised KeyError: 'length' (at step 1, from running [0:4/1]")
    found = explain_run(closed_loop(lambda *args: {"running": []}, case), steps, case)
    assert found is not None and found.differs.startswith(
        "result: cannot read {'running': []} (KeyError: 'waiting'); a result is a dict of")
    bad = replay_case(case, "hint")
    assert not judge(bad, observe(bad, lambda *args: None)).passed


def test_a_run_that_never_ends_is_cut_off_and_reported() -> None:
    case = Replay("one", (Request(0, 3, 2),), 4, 4)

    def never_admits(state: dict[str, Any], *limits: Any) -> dict[str, Any]:
        return {**state, "preempted": [], "admitted": []}

    records = closed_loop(never_admits, case)
    assert len(records) == ch05_step.step_limit(case)
    found = explain_run(records, simulator_steps(case), case)
    assert found is not None and found.differs.startswith("admitted: got []")


def test_no_expected_state_travels_with_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run holds only the trace, and works with the simulator gone (as in the sandbox,
    where the exercise's reference modules raise when used)."""
    case = replay_case(replays()[0], "hint")
    assert [type(cell.cell_contents) for cell in case.run.__closure__ or ()] == [Replay]

    def gone(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the reference is not available here")

    monkeypatch.setattr(ch05_step, "simulate", gone)
    monkeypatch.setattr(ch05_step, "simulator_steps", gone)
    records = case.run(suffix_design)
    monkeypatch.undo()
    assert judge(case, observe(replace(case, run=lambda fn: records), None)).passed


_SANDBOX = """
import importlib.abc, sys
KEY = {"course_lib.simulator", "course_lib.grading.ch05", "course_lib.grading.ch05_step"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in KEY:
            raise ImportError("the answer key is not here: " + name)
sys.meta_path.insert(0, Block())
import cloudpickle
from tests.mutants.ch05 import suffix_design
run = cloudpickle.loads(sys.stdin.buffer.read())
sys.stdout.buffer.write(cloudpickle.dumps(run(suffix_design)))
"""


def test_the_run_travels_by_value_into_a_process_without_the_answer_key() -> None:
    """As the grader ships it: cloudpickled by value, run where neither the simulator nor
    this chapter's grading modules can be imported; its records then pass the judge here."""
    import subprocess
    import sys

    import cloudpickle

    case = replay_case(replays()[-1], "hint")
    cloudpickle.register_pickle_by_value(ch05_step)
    try:
        shipped = cloudpickle.dumps(case.run)
    finally:
        cloudpickle.unregister_pickle_by_value(ch05_step)
    done = subprocess.run([sys.executable, "-c", _SANDBOX], input=shipped, capture_output=True,
                          check=True, timeout=120)
    records = cloudpickle.loads(done.stdout)
    assert judge(case, observe(replace(case, run=lambda fn: records), None)).passed


def test_a_scene_names_the_rule_of_the_field_that_differs() -> None:
    """The preempted-request scene tests that a step which preempted admits nobody; a
    victim put at the back of the queue there is told so, not about admission."""
    scene = ch05_step.SCENES[1]
    case = ch05_step._scene_case(scene)
    result = judge(case, observe(case, mistaken(requeue_at_back=True)))
    assert result.differs.startswith("waiting:") and result.hint == ch05_step.REQUEUE
    result = judge(case, observe(case, mistaken(admits_after_preempting=True)))
    assert result.differs.startswith("admitted:") and result.hint == scene.hint
