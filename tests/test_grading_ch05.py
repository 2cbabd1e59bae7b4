"""Chapter 05's checks: the reference answers pass, other correct designs pass, at least three
typical mistakes per exercise fail with a report naming the call, the result, the expectation
and a hint, and stubs read as not solved. The priority victim, which follows vLLM's code, is
compared with the library's ``Scheduler.victim`` wherever the two rules agree."""

from __future__ import annotations

import math
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
    recomputed,
    resume_seconds,
)
from course_lib.grading.ch05_step import SCHEDULER_STEP
from course_lib.grading.check import CheckResult, evaluate, strict_equal
from course_lib.scheduler import Scheduler, SchedulerConfig, SwapSpace
from course_lib.workload import Request

CORRECT = {
    "05.admit_from_queue": admitted_count,
    "05.choose_victim": priority_victim,
    "05.recompute_tokens": recomputed,
    "05.swap_space": SwapSpace,
    "05.resume_seconds": resume_seconds,
    "05.plan_preemptions": plan_preemptions,
}


def run(name: str, obj: Any) -> CheckResult:
    return evaluate(find_exercise(name), obj)


OWN_FILE = {SCHEDULER_STEP.name}
"""Exercises whose answers and mutants live in their own test file (test_grading_ch05_step)."""


def test_every_exercise_has_a_correct_answer() -> None:
    assert {e.name for e in chapter_exercises("05")} - OWN_FILE == set(CORRECT)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_answer_passes_every_case(name: str) -> None:
    result = run(name, CORRECT[name])
    assert (result.status, result.passed) == ("passed", result.total), result.report_text()


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_stub_is_not_yet_solved(name: str) -> None:
    def stub(*args: object) -> None:
        raise NotImplementedError

    assert run(name, stub).status == "not-solved"


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


# --- other correct designs ---------------------------------------------------------------------


def admit_by_budget(waiting: list[int], free_blocks: int, block_size: int, num_running: int,
                    step_tokens: int, max_num_seqs: int | None = None,
                    max_num_batched_tokens: int | None = None) -> int:
    """Another design: shrink three budgets as requests are admitted."""
    if block_size < 1 or free_blocks < 0 or any(n < 1 for n in waiting):
        raise ValueError("bad input")
    seats = math.inf if max_num_seqs is None else max_num_seqs - num_running
    tokens = math.inf if max_num_batched_tokens is None else max_num_batched_tokens - step_tokens
    count = 0
    for length in waiting:
        blocks = length // block_size + 1
        if seats < 1 or length > tokens or blocks > free_blocks:
            break
        seats, tokens, free_blocks = seats - 1, tokens - length, free_blocks - blocks
        count += 1
    return count


def victim_by_stable_sort(running: list[Request]) -> int:
    """Another design: a stable sort by descending key keeps the first of exact equals."""
    if not running:
        raise ValueError("empty")
    return sorted(running, key=lambda r: (-r.priority, -r.arrival))[0].id


def recompute_by_blocks(prompt_len: int, generated: int, cached: int, block: int) -> int:
    """Another design: count the uncached blocks, then the tokens in them."""
    if prompt_len < 1 or generated < 0 or cached < 0 or block < 1:
        raise ValueError("bad input")
    length = prompt_len + generated
    full_before_last = (length - 1) // block
    return length - block * (cached if cached < full_before_last else full_before_last)


class DictSwapSpace:
    """Another design: a plain dict, a method for the blocks in use, other error messages."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.held = capacity, {}

    def used_blocks(self) -> int:
        return sum(self.held.values())

    def holds(self, rid: int) -> bool:
        return rid in self.held

    def swap_out(self, rid: int, blocks: int) -> bool:
        if rid in self.held:
            raise ValueError(f"{rid} twice")
        if self.used_blocks() + blocks > self.capacity:
            return False
        self.held[rid] = blocks
        return True

    def swap_in(self, rid: int) -> int:
        if rid not in self.held:
            raise ValueError(f"{rid} is not out")
        return self.held.pop(rid)


class CountingSwapSpace(DictSwapSpace):
    """A third design: ``used_blocks`` is a plain attribute kept up to date."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.used = 0

    def swap_out(self, rid: int, blocks: int) -> bool:
        if rid in self.held:
            raise ValueError(f"{rid} twice")
        if self.used + blocks > self.capacity:
            return False
        self.held[rid] = blocks
        self.used += blocks
        return True

    def swap_in(self, rid: int) -> int:
        if rid not in self.held:
            raise ValueError(f"{rid} is not out")
        self.used -= self.held[rid]
        return self.held.pop(rid)

    def __getattribute__(self, name: str) -> Any:
        if name == "used_blocks":
            return object.__getattribute__(self, "used")
        return object.__getattribute__(self, name)


def resume_with_step_time(length: int, cached: int, block: int, per_token: int,
                          costs: Any) -> list[float]:
    """Another design: the cost model's own ``step_time``, minus an empty step; a list."""
    blocks = -(-length // block)
    empty = costs.step_time(0, 0, 0, 0)
    recompute = costs.step_time(0, recompute_by_blocks(length, 0, cached, block), 0, 0) - empty
    one_way = costs.step_time(0, 0, blocks, blocks * block * per_token) - empty
    return [recompute, 2 * one_way]


def plan_by_deficit(running: list[tuple[Request, int]], free_blocks: int, block_size: int,
                    policy: str) -> list[int]:
    """Another design: a running deficit and a victim order computed once, up front."""
    if policy not in ("fcfs", "priority") or free_blocks < 0 or block_size < 1:
        raise ValueError("bad input")
    if any(length < 1 for _, length in running):
        raise ValueError("bad length")
    deficit = sum(length % block_size == 0 for _, length in running) - free_blocks
    if policy == "fcfs":
        order = list(reversed(running))
    else:  # stable: among exact equals the earlier admission comes first
        order = sorted(running, key=lambda pair: (-pair[0].priority, -pair[0].arrival))
    victims = []
    for request, length in order:
        if deficit <= 0:
            break
        deficit -= -(-length // block_size) + (length % block_size == 0)
        victims.append(request.id)
    return victims


OTHER_DESIGNS = [
    ("05.admit_from_queue", admit_by_budget),
    ("05.choose_victim", victim_by_stable_sort),
    ("05.recompute_tokens", recompute_by_blocks),
    ("05.swap_space", DictSwapSpace),
    ("05.swap_space", CountingSwapSpace),
    ("05.resume_seconds", resume_with_step_time),
    ("05.plan_preemptions", plan_by_deficit),
]


@pytest.mark.parametrize(("name", "answer"), OTHER_DESIGNS)
def test_other_correct_designs_pass(name: str, answer: Any) -> None:
    result = run(name, answer)
    assert result.status == "passed", result.report_text()


# --- typical mistakes --------------------------------------------------------------------------


def admitting(**mistakes: bool) -> Any:
    """``admit_by_budget`` with learner mistakes switched on."""
    def admit(waiting: list[int], free_blocks: int, block_size: int, num_running: int,
              step_tokens: int, max_num_seqs: int | None = None,
              max_num_batched_tokens: int | None = None) -> int:
        if block_size < 1 or (not mistakes.get("checks_one") and (
                free_blocks < 0 or any(n < 1 for n in waiting))):
            raise ValueError("bad input")
        seats = math.inf if max_num_seqs is None else max_num_seqs - num_running
        tokens = (math.inf if max_num_batched_tokens is None
                  else max_num_batched_tokens - step_tokens)
        count = 0
        for length in waiting:
            blocks = (-(-length // block_size) if mistakes.get("no_plus_one")
                      else length // block_size + 1)
            if seats < 1 or length > tokens or blocks > free_blocks:
                if mistakes.get("skips"):
                    continue
                break
            count += 1
            free_blocks -= 0 if mistakes.get("keeps_free") else blocks
            tokens -= 0 if mistakes.get("keeps_tokens") else length
            seats -= 0 if mistakes.get("keeps_seats") else 1
        return count
    return admit


def victim(key: Any, last_of_equals: bool = False) -> Any:
    """A victim chooser by ``key`` (largest first); ``last_of_equals`` breaks exact ties the
    other way, as ``max(reversed(running))`` or a ``>=`` loop does."""
    def choose(running: list[Request]) -> int:
        if not running:
            raise ValueError("empty")
        ordered = list(reversed(running)) if last_of_equals else running
        return max(ordered, key=key).id
    return choose


def recomputing(mistake: str) -> Any:
    def recompute(prompt_len: int, generated: int, cached: int, block: int) -> int:
        if block < 1:
            raise ValueError(block)
        if mistake != "checks_one" and (prompt_len < 1 or generated < 0 or cached < 0):
            raise ValueError("bad input")
        length = prompt_len + generated
        if mistake == "whole_cache":
            return max(length - cached * block, 0)
        if mistake == "prompt_only":
            return prompt_len - min(cached, (prompt_len - 1) // block) * block
        if mistake == "floor_length":
            return length - min(cached, length // block) * block
        return length - min(cached, (length - 1) // block) * block
    return recompute


class PartialSwapSpace(DictSwapSpace):
    """Keeps what fits instead of refusing a request that does not fit whole."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        room = self.capacity - self.used_blocks()
        if room <= 0:
            return False
        self.held[rid] = min(room, blocks)
        return True


class NeverReleasedSwapSpace(CountingSwapSpace):
    """Forgets to give the space back on swap-in."""

    def swap_in(self, rid: int) -> int:
        if rid not in self.held:
            raise ValueError(f"{rid} is not out")
        return self.held.pop(rid)


class StrictlyLessSwapSpace(DictSwapSpace):
    """Refuses a request that would fill the space exactly."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        if rid in self.held:
            raise ValueError(f"{rid} twice")
        if self.used_blocks() + blocks >= self.capacity:
            return False
        self.held[rid] = blocks
        return True


class OverwritingSwapSpace(DictSwapSpace):
    """Lets a request be swapped out twice, overwriting its count."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        if self.used_blocks() + blocks > self.capacity:
            return False
        self.held[rid] = blocks
        return True


def resuming(mistake: str) -> Any:
    def resume(length: int, cached: int, block: int, per_token: int,
               costs: Any) -> tuple[float, float]:
        blocks = -(-length // block)
        computed = length - min(cached, (length - 1) // block) * block
        if mistake == "no_cache":
            computed = length
        if mistake == "cache_takes_last":
            computed = max(length - cached * block, 0)
        moved = (length if mistake == "token_bytes" else blocks * block) * per_token
        one_way = blocks * costs.swap_seconds_per_block + moved / costs.pcie_bandwidth
        swap = one_way if mistake == "one_way" else 2 * one_way
        return computed * costs.prefill_seconds_per_token, swap
    return resume


def planning(mistake: str) -> Any:
    def plan(running: list[tuple[Request, int]], free_blocks: int, block_size: int,
             policy: str) -> list[int]:
        if block_size < 1:
            raise ValueError(block_size)
        if mistake != "checks_one" and (policy not in ("fcfs", "priority") or free_blocks < 0
                                        or any(n < 1 for _, n in running)):
            raise ValueError("bad input")
        full = ((lambda n: (n + 1) % block_size == 0) if mistake == "plus_one"
                else (lambda n: n % block_size == 0))
        held = ((lambda n: n // block_size) if mistake == "floor"
                else (lambda n: -(-n // block_size)))
        survivors, victims = list(running), []
        need = sum(full(n) for _, n in survivors)
        while need > free_blocks:
            if policy == "fcfs":
                pick = survivors[0] if mistake == "oldest" else survivors[-1]
            else:
                pick = max(survivors, key=lambda pair: (pair[0].priority, pair[0].arrival))
            survivors.remove(pick)
            free_blocks += held(pick[1])
            if mistake != "keeps_need":
                need -= full(pick[1])
            victims.append(pick[0].id)
        return victims
    return plan


MISTAKES = [  # (exercise, answer, evidence in the report)
    ("05.admit_from_queue", admitting(skips=True), "fn(waiting=[400, 10]"),
    ("05.admit_from_queue", admitting(no_plus_one=True), "fn(waiting=[32, 15]"),
    ("05.admit_from_queue", admitting(keeps_free=True), "fn(waiting=[100, 200, 50]"),
    ("05.admit_from_queue", admitting(keeps_tokens=True), "max_num_batched_tokens=8192"),
    ("05.admit_from_queue", admitting(keeps_seats=True), "max_num_seqs=8"),
    ("05.admit_from_queue", admitting(checks_one=True), "free_blocks=-1"),
    ("05.choose_victim", victim(lambda r: (r.priority, r.arrival), last_of_equals=True),
     "Request(8, arrival=3, priority=2), Request(9"),
    ("05.choose_victim", victim(lambda r: (-r.priority, r.arrival)), "priority=1"),
    ("05.choose_victim", victim(lambda r: (r.priority, -r.arrival)), "Request(6, arrival=9"),
    ("05.choose_victim", victim(lambda r: r.priority), "Request(6, arrival=9"),
    ("05.choose_victim", lambda running: running[-1].id, "Request(1, arrival=0"),
    ("05.choose_victim", lambda running: max(running, key=lambda r: (r.priority, r.arrival)),
     "a Request, not plain data"),
    ("05.recompute_tokens", recomputing("whole_cache"), "cached_blocks=56"),
    ("05.recompute_tokens", recomputing("prompt_only"), "generated=14"),
    ("05.recompute_tokens", recomputing("floor_length"), "fn(prompt_len=880, generated=16"),
    ("05.recompute_tokens", recomputing("checks_one"), "generated=-1"),
    ("05.swap_space", PartialSwapSpace, "s.swap_out(2, 8)"),
    ("05.swap_space", NeverReleasedSwapSpace, "s.swap_in(1); s.used_blocks"),
    ("05.swap_space", StrictlyLessSwapSpace, "s.swap_out(3, 6)"),
    ("05.swap_space", OverwritingSwapSpace, "s.swap_out(1, 2); s.swap_out(1, 2)"),
    ("05.resume_seconds", resuming("no_cache"), "cached_blocks=40"),
    ("05.resume_seconds", resuming("cache_takes_last"), "length=1024, cached_blocks=64"),
    ("05.resume_seconds", resuming("one_way"), "length=1000, cached_blocks=0, block_size=16"),
    ("05.resume_seconds", resuming("token_bytes"), "length=886"),
    ("05.plan_preemptions", planning("oldest"), "free_blocks=1, block_size=16, policy='fcfs'"),
    ("05.plan_preemptions", planning("plus_one"), "free_blocks=1, block_size=16"),
    ("05.plan_preemptions", planning("floor"), "(Request(3, arrival=0, priority=0), 1)"),
    ("05.plan_preemptions", planning("keeps_need"), "(Request(3, arrival=0, priority=0), 1)"),
    ("05.plan_preemptions", planning("checks_one"), "policy='random'"),
]


@pytest.mark.parametrize(("name", "wrong", "needle"), MISTAKES)
def test_mistakes_fail_with_call_got_expected_and_hint(name: str, wrong: Any,
                                                       needle: str) -> None:
    result = run(name, wrong)
    assert result.status == "failed", result.report_text()
    report = result.report_text()
    failing = [case for case in result.cases if not case.passed]
    assert any(needle in case.call or needle in case.got for case in failing), report
    for case in failing:
        assert f"FAIL {case.call}" in report
        assert case.hint and f"hint     {case.hint}" in report
        assert f"got      {case.got}" in report and f"expected {case.expected}" in report


def test_every_exercise_has_three_mistakes_and_another_design() -> None:
    for exercise in (e for e in chapter_exercises("05") if e.name not in OWN_FILE):
        assert sum(name == exercise.name for name, *_ in MISTAKES) >= 3, exercise.name
        assert any(name == exercise.name for name, _ in OTHER_DESIGNS), exercise.name


def test_a_priority_victim_with_a_reversed_tie_passes_no_exact_tie_case_by_luck() -> None:
    """The exact-tie cases are what catches the reversed tie: without them it would pass."""
    result = run("05.choose_victim", victim(lambda r: (r.priority, r.arrival), True))
    failing = [case.call for case in result.cases if not case.passed]
    assert len(failing) == 3 and all("arrival=3, priority=2), Request(9" in call
                                     or "Request(11" in call or "Request(14" in call
                                     for call in failing)

