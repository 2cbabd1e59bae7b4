"""Chapter 05's checks: the kept mistakes (tests/mutants/ch05.py, beside the right answers)
fail with a report naming the call, the part that differs, the result, the expectation and
a hint. The priority victim, which follows vLLM's code, is compared with the library's
``Scheduler.victim`` wherever the two rules agree."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch05 import (
    _plain,
    admitted_count,
    plan_preemptions,
    priority_victim,
)
from course_lib.grading.ch05_step import SCHEDULER_STEP
from course_lib.grading.check import (
    Case,
    CheckResult,
    Raises,
    evaluate,
    first_failure,
    strict_equal,
)
from course_lib.scheduler import Scheduler, SchedulerConfig
from course_lib.workload import Request
from tests.mutants.ch05 import MUTANTS, admitting, victim


def run(name: str, obj: Any) -> CheckResult:
    return evaluate(find_exercise(name), obj)


# --- the reference answers against the library ------------------------------------------------

requests = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=8)


@given(requests)
def test_the_priority_victim_is_the_schedulers_where_no_two_tie_exactly(
        keys: list[tuple[int, int]]) -> None:
    running = [Request(i, 1, 1, arrival=a, priority=p) for i, (p, a) in enumerate(keys)]
    scheduler = Scheduler(SchedulerConfig(policy="priority"), running)
    for index in range(len(running)):
        scheduler.arrive(index)
    for _ in running:
        scheduler.admit_next()
    admitted = [running[i] for i in scheduler.running]
    chosen = priority_victim(admitted)
    worst = max((r.priority, r.arrival) for r in running)
    exact_ties = sum((r.priority, r.arrival) == worst for r in running)
    assert chosen == running[scheduler.victim()].id or exact_ties > 1
    assert (running[chosen].priority, running[chosen].arrival) == worst


@given(st.lists(st.integers(1, 70), max_size=8), st.integers(0, 6), st.sampled_from([1, 4, 16]),
       st.sampled_from(["fcfs", "priority"]))
def test_a_plan_leaves_every_survivor_room_and_preempts_no_more_than_needed(
        lengths: list[int], free: int, block_size: int, policy: str) -> None:
    running = [(Request(i, 1, 1, arrival=i % 3, priority=i % 2), n)
               for i, n in enumerate(lengths)]
    victims = plan_preemptions(running, free, block_size, policy)
    survivors = [(r, n) for r, n in running if r.id not in victims]
    freed = sum(-(-n // block_size) for r, n in running if r.id in victims)
    assert sum(n % block_size == 0 for _, n in survivors) <= free + freed
    if victims:  # one victim fewer would not have been enough
        last = dict((r.id, n) for r, n in running)[victims[-1]]
        need = sum(n % block_size == 0 for _, n in survivors) + (last % block_size == 0)
        assert need > free + freed - -(-last // block_size)


def test_plain_data_is_compared_strictly() -> None:
    assert strict_equal(_plain([True, 4]), [True, 4])
    assert not strict_equal(_plain([1, 4]), [True, 4])
    assert not strict_equal(_plain(2.0), 2)
    assert strict_equal(_plain((0.1 + 0.2, 1.0)), (0.3, 1.0))
    assert not strict_equal(_plain(Request(2, 1, 1)), 2)
    assert "Request" in _plain(Request(2, 1, 1))


# --- other designs and mistakes: tests/mutants/ch05.py (their hints: tests/test_mutant_hints.py)


def test_mistakes_fail_with_the_call_a_labelled_difference_and_a_hint() -> None:
    for mutant in (m for m in MUTANTS if m.exercise != SCHEDULER_STEP.name):
        result = run(mutant.exercise, mutant.obj)
        report = result.report_text()
        for case in (case for case in result.cases if not case.passed):
            assert f"FAIL {case.call}" in report and f"differs  {case.differs}" in report
            assert case.hint and f"hint     {case.hint}" in report
            assert f"got      {case.got}" in report and f"expected {case.expected}" in report


def test_the_budget_rule_is_the_serving_cores_and_its_hint_names_it() -> None:
    """Admission charges length + 1, as ``admit`` of ``05.scheduler_step`` and the serving
    core do: a learner counting the length only fails where the step's budget is met
    exactly."""
    assert admitted_count([8181, 1], 1000, 16, 10, 10, None, 8192) == 1
    assert admitted_count([8182, 1], 1000, 16, 10, 10, None, 8192) == 0
    result = run("05.admit_from_queue", admitting(length_only=True))
    first = first_failure(result)
    assert first is not None and "max_num_batched_tokens=8192" in first.call
    assert "length + 1" in first.hint and "serving core" in first.hint


def test_a_priority_victim_with_a_reversed_tie_passes_no_exact_tie_case_by_luck() -> None:
    """The exact-tie cases are what catches the reversed tie: without them it would pass."""
    result = run("05.choose_victim", victim(lambda r: (r.priority, r.arrival), True))
    failing = [case.call for case in result.cases if not case.passed]
    assert len(failing) == 3 and all("arrival=3, priority=2), Request(9" in call
                                     or "Request(11" in call or "Request(14" in call
                                     for call in failing)



def kinds(cases: Sequence[Case]) -> set[tuple[str, bool]]:
    """The kinds of cases: each one's hint with its numbers blanked, and whether it must
    raise."""
    return {(re.sub(r"\d+", "N", case.hint), isinstance(case.expected, Raises))
            for case in cases}


@pytest.mark.parametrize("name", [e.name for e in chapter_exercises("05")])
def test_fresh_cases_hold_every_kind_of_fixed_case(name: str) -> None:
    """The grader scores fresh cases only: each seed's draw holds a case of every kind the
    fixed cases hold (each mistake's hint, each impossible input), on values of its own (an
    empty list, which has none, aside)."""
    exercise = find_exercise(name)
    assert exercise.fresh is not None
    for seed in (0, 1, 2):
        fresh = exercise.fresh(seed)
        assert kinds(exercise.cases()) <= kinds(fresh), seed
        shared = {case.call for case in fresh} & {case.call for case in exercise.cases()}
        assert all("=[]" in call for call in shared), shared


@pytest.mark.parametrize(("exercise", "mistake", "phrase"), [
    ("05.recompute_tokens", "only the prompt is recomputed", "AND the tokens it generated"),
    ("05.plan_preemptions", "a block needed one token early", "not when the token it writes"),
    ("05.plan_preemptions", "fcfs preempts the oldest", "not the oldest"),
    ("05.choose_victim", "the newest admission, as fcfs", "not the newest admission"),
])
def test_a_recognised_slip_is_named_wherever_it_shows(exercise: str, mistake: str,
                                                       phrase: str) -> None:
    """Every case a recognised slip fails with a wrong value (not a raise) names that slip,
    fresh cases included."""
    mutant = next(m for m in MUTANTS if m.exercise == exercise and m.name == mistake)
    result = evaluate(find_exercise(exercise), mutant.obj, seed=0)
    failed = [case for case in result.cases if not case.passed
              and not case.differs.startswith(("raised", "returned"))]
    assert failed and all(phrase in case.hint for case in failed), result.report_text()
