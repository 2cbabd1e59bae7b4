"""Chapter 05's scheduler-step check: its expected values are the simulator's, step by step;
a correct design other than the notebook's passes; typical mistakes fail at a named step."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch05_step import Replay, replay, replay_case, replays, simulator_steps
from course_lib.grading.check import CheckResult, evaluate
from course_lib.simulator import simulate
from course_lib.workload import Request

NAME = "05.scheduler_step"


def run(obj: Any) -> CheckResult:
    return evaluate(find_exercise(NAME), obj)


# --- a correct design unlike the notebook's ----------------------------------------------------


def suffix_design(state: dict[str, Any], block_size: int, max_num_seqs: int | None,
                  max_num_batched_tokens: int | None) -> dict[str, Any]:
    """Decides the preempted requests first, as the shortest newest-end suffix of the running
    list whose blocks, with the free ones, cover the claims of the rest; never loops claim by
    claim, and returns tuples."""
    running, free = state["running"], state["free_blocks"]
    full = [r["blocks"] * block_size == r["length"] for r in running]
    keep = len(running)
    while sum(full[:keep]) > free + sum(r["blocks"] for r in running[keep:]):
        keep -= 1
    gone = running[keep:]
    free += sum(r["blocks"] for r in gone) - sum(full[:keep])
    kept = [dict(r, blocks=r["blocks"] + f) for r, f in zip(running[:keep], full, strict=False)]
    waiting = [{"id": r["id"], "length": r["length"]} for r in gone] + list(state["waiting"])
    admitted: list[int] = []
    budget = (max_num_batched_tokens or float("inf")) - len(kept)
    seats = (max_num_seqs or float("inf")) - len(kept)
    while not gone and waiting and seats > 0:
        length = waiting[0]["length"]
        need = length // block_size + 1
        if length + 1 > budget or need > free:
            break
        head = waiting.pop(0)
        kept.append({**head, "blocks": need})
        admitted.append(head["id"])
        budget, seats, free = budget - length - 1, seats - 1, free - need
    return {"running": tuple(kept), "waiting": tuple(waiting), "free_blocks": free,
            "preempted": tuple(r["id"] for r in reversed(gone)), "admitted": tuple(admitted)}


def test_registered_in_chapter_05() -> None:
    assert NAME in [e.name for e in chapter_exercises("05")]


def test_another_correct_design_passes() -> None:
    result = run(suffix_design)
    assert result.status == "passed" and result.total >= 9, result.report_text()


def test_a_stub_is_not_yet_solved() -> None:
    def stub(*args: object) -> None:
        raise NotImplementedError

    assert run(stub).status == "not-solved"


# --- the expected values are the simulator's ---------------------------------------------------


def _check_against_simulator(case: Replay) -> None:
    """Every rebuilt step agrees with the simulator's own per-step timeline, and the steps
    together with its totals: decode steps, preemptions and recomputed tokens."""
    result = simulate(case.trace, case.config(), record="steps")
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


@pytest.mark.parametrize("case", [case for case, _ in replays()], ids=lambda c: c.label)
def test_rebuilt_steps_agree_with_the_simulator(case: Replay) -> None:
    _check_against_simulator(case)


def test_the_seeded_traces_preempt_and_the_edge_cases_bind() -> None:
    cases = {case.label: simulator_steps(case) for case, _ in replays()}
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
    assert replay(suffix_design, case, steps) == [out for _, _, out in steps]


# --- typical mistakes fail at a named step -----------------------------------------------------


def mistaken(*, oldest_victim: bool = False, requeue_at_back: bool = False,
             skip_blocked_head: bool = False, blocks_for_length: bool = False,
             needs_spare_block: bool = False, decode_tokens_free: bool = False,
             no_token_budget: bool = False, no_seq_limit: bool = False,
             step_token_free: bool = False) -> Any:
    """The notebook's design with one mistake switched on."""

    def cost(head: dict[str, int]) -> int:
        """An admission's tokens: its prefill and (unless mistaken) the token it writes."""
        return head["length"] + (0 if step_token_free else 1)

    def schedule_step(state: dict[str, Any], block_size: int, max_num_seqs: int | None,
                      max_num_batched_tokens: int | None) -> dict[str, Any]:
        running, waiting = list(state["running"]), list(state["waiting"])
        free, preempted, admitted = state["free_blocks"], [], []
        for request in list(running):
            if request not in running or request["blocks"] * block_size > request["length"]:
                continue
            while free == 0:
                victim = running.pop(0 if oldest_victim else -1)
                free += victim["blocks"]
                preempted.append(victim["id"])
                entry = {"id": victim["id"], "length": victim["length"]}
                waiting.insert(len(waiting) if requeue_at_back else 0, entry)
                if victim is request:
                    break
            if request in running:
                request["blocks"] += 1
                free -= 1
        tokens, k = (0 if decode_tokens_free else len(running)), 0
        while not preempted and k < len(waiting):
            head = waiting[k]
            need = (-(-head["length"] // block_size) if blocks_for_length
                    else head["length"] // block_size + 1)
            fits = (need < free) if needs_spare_block else (need <= free)
            if max_num_seqs is not None and not no_seq_limit:
                fits = fits and len(running) < max_num_seqs
            if max_num_batched_tokens is not None and not no_token_budget:
                fits = fits and tokens + cost(head) <= max_num_batched_tokens
            if not fits:
                if not skip_blocked_head:
                    break
                k += 1
                continue
            waiting.pop(k)
            running.append({**head, "blocks": need})
            admitted.append(head["id"])
            free, tokens = free - need, tokens + cost(head)
        return {"running": running, "waiting": waiting, "free_blocks": free,
                "preempted": preempted, "admitted": admitted}

    return schedule_step


def test_the_mistake_free_variant_passes() -> None:
    assert run(mistaken()).status == "passed"


@pytest.mark.parametrize(
    ("mistake", "needle"),
    [("oldest_victim", "preempted [0] but the simulator has [2]"),
     ("requeue_at_back", "waiting [3:2 2:7] but the simulator has [2:7 3:2]"),
     ("skip_blocked_head", "admitted [3] but the simulator has []"),
     ("blocks_for_length", "running [0:4/1] but the simulator has [0:4/2]"),
     ("needs_spare_block", "admitted [] but the simulator has [2]"),
     ("decode_tokens_free", "admitted [2] but the simulator has []"),
     ("no_token_budget", "admitted [0, 1, 2] but the simulator has [0]"),
     ("step_token_free", "admitted [0, 1] but the simulator has [0]"),
     ("no_seq_limit", "admitted [0, 1, 2, 3, 4] but the simulator has [0, 1]")],
)
def test_mistakes_fail_at_the_first_differing_step(mistake: str, needle: str) -> None:
    result = run(mistaken(**{mistake: True}))
    assert result.status == "failed"
    failing = [case for case in result.cases if not case.passed]
    assert any(needle in case.got for case in failing), result.report_text()
    report = result.report_text()
    for case in failing:
        assert case.got[1:].startswith("step ") and "; from running [" in case.got
        assert f"got      {case.got}" in report and f"hint     {case.hint}" in report
        assert "the simulator's result at each of the" in case.expected


def test_a_crash_or_a_malformed_result_names_the_step() -> None:
    case = Replay("two", (Request(0, 3, 2), Request(1, 2, 2, arrival=1)), 4, 4)
    steps = simulator_steps(case)

    def crashes_later(state: dict[str, Any], *limits: Any) -> dict[str, Any]:
        if state["running"]:
            state["running"].clear()  # the report still shows the state as it was given
            raise KeyError("length")
        return suffix_design(state, *limits)

    assert replay(crashes_later, case, steps).startswith("step 1: raised KeyError: 'length'; "
                                                         "from running [0:4/1]")
    assert replay(lambda *args: {"running": []}, case, steps).startswith(
        "step 0: cannot read {'running': []} (KeyError: 'waiting'); a result is a dict of")
    bad = replay_case(case, "hint")
    assert not bad.compare(bad.run(lambda *args: None), bad.expected)
