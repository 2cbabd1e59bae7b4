"""Chapter 05's checks: the library's own answers pass, other correct designs pass, and
typical mistakes fail with a report naming the call, the result, the expectation and a hint."""

from __future__ import annotations

import math
from typing import Any

import pytest

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch05 import _victim as choose_victim
from course_lib.grading.check import CheckResult, evaluate
from course_lib.kv_math import blocks_needed
from course_lib.scheduler import Scheduler, SchedulerConfig, SwapSpace, tokens_to_recompute
from course_lib.workload import Request

# --- the library's answers ---------------------------------------------------------------------


def can_admit(length: int, free_blocks: int, block_size: int, num_running: int,
              step_tokens: int, max_num_seqs: int | None = None,
              max_num_batched_tokens: int | None = None) -> bool:
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs,
                                          max_num_batched_tokens=max_num_batched_tokens),
                          [Request(i, 1, 1) for i in range(num_running + 1)])
    for index in range(num_running):
        scheduler.arrive(index)
        scheduler.admit_next()
    return (scheduler.admits(length, step_tokens)
            and blocks_needed(length + 1, block_size) <= free_blocks)


def recompute_tokens(prompt_len: int, generated: int, cached_blocks: int,
                     block_size: int) -> int:
    return tokens_to_recompute(prompt_len + generated, cached_blocks, block_size)


def resume_seconds(tokens: int, block_size: int, bytes_per_token: int,
                   costs: Any) -> tuple[float, float]:
    blocks = math.ceil(tokens / block_size)
    one_way = (blocks * costs.swap_seconds_per_block
               + blocks * block_size * bytes_per_token / costs.pcie_bandwidth)
    return tokens * costs.prefill_seconds_per_token, 2 * one_way


LIBRARY = {
    "05.can_admit": can_admit,
    "05.choose_victim": choose_victim,
    "05.recompute_tokens": recompute_tokens,
    "05.swap_space": SwapSpace,
    "05.resume_seconds": resume_seconds,
}


def run(name: str, obj: Any) -> CheckResult:
    return evaluate(find_exercise(name), obj)


def test_at_least_four_exercises_all_registered() -> None:
    names = [e.name for e in chapter_exercises("05")]
    assert len(names) >= 4 and set(names) == set(LIBRARY)


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_library_answers_pass(name: str) -> None:
    result = run(name, LIBRARY[name])
    assert (result.status, result.passed) == ("passed", result.total), result.report_text()


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_a_stub_is_not_yet_solved(name: str) -> None:
    def stub(*args: object) -> None:
        raise NotImplementedError

    assert run(name, stub).status == "not-solved"


# --- other correct designs ---------------------------------------------------------------------


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


def plain_victim(running: list[Any], policy: str) -> int:
    """Written from the rule, without the scheduler."""
    if policy not in ("fcfs", "priority"):
        raise ValueError(f"unknown policy {policy!r}")
    if not running:
        raise ValueError("nobody to preempt")
    if policy == "fcfs":
        return running[-1].id
    order = max(range(len(running)), key=lambda i: (running[i].priority, running[i].arrival, i))
    return running[order].id


@pytest.mark.parametrize(("name", "obj"), [("05.swap_space", DictSwapSpace),
                                           ("05.swap_space", CountingSwapSpace),
                                           ("05.choose_victim", plain_victim)])
def test_other_designs_pass(name: str, obj: Any) -> None:
    result = run(name, obj)
    assert result.status == "passed", result.report_text()


# --- typical mistakes --------------------------------------------------------------------------


def admit_on_length_only(length: int, free_blocks: int, block_size: int, *limits: Any) -> bool:
    """Forgets the token this step writes (and ignores the limits)."""
    return -(-length // block_size) <= free_blocks


def admit_ignoring_seqs(length: int, free_blocks: int, block_size: int, num_running: int,
                        step_tokens: int, max_num_seqs: Any, budget: Any) -> bool:
    fits = budget is None or step_tokens + length <= budget
    return fits and length // block_size + 1 <= free_blocks


def victim_latest_arrival(running: list[Any], policy: str) -> int:
    """Confuses "newest" with "arrived last"."""
    return max(running, key=lambda r: (r.arrival if policy == "fcfs" else r.priority)).id


def victim_smallest_number(running: list[Any], policy: str) -> int:
    """Reads priority upside down: preempts priority 0, the most important."""
    if policy == "fcfs":
        return running[-1].id
    return min(running, key=lambda r: (r.priority, -r.arrival)).id


def recompute_whole_cache(prompt_len: int, generated: int, cached: int, block: int) -> int:
    """Forgets that the last token is always computed."""
    return max(prompt_len + generated - cached * block, 0)


def recompute_no_cache(prompt_len: int, generated: int, cached: int, block: int) -> int:
    if block < 1:
        raise ValueError(block)
    return prompt_len


class PartialSwapSpace(DictSwapSpace):
    """Keeps what fits instead of refusing a request that does not fit whole."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        room = self.capacity - self.used_blocks()
        if room <= 0:
            return False
        self.held[rid] = min(room, blocks)
        return True


def swap_one_way(tokens: int, block_size: int, bytes_per_token: int,
                 costs: Any) -> tuple[float, float]:
    blocks = math.ceil(tokens / block_size)
    swap = (blocks * costs.swap_seconds_per_block
            + blocks * block_size * bytes_per_token / costs.pcie_bandwidth)
    return tokens * costs.prefill_seconds_per_token, swap


@pytest.mark.parametrize(
    ("name", "wrong", "needle"),
    [("05.can_admit", admit_on_length_only, "fn(length=896, free_blocks=56"),
     ("05.can_admit", admit_ignoring_seqs, "max_num_seqs=256"),
     ("05.choose_victim", victim_latest_arrival, "Request(3, arrival=5, priority=0), "
                                                 "Request(4, arrival=6"),
     ("05.choose_victim", victim_smallest_number, "policy='priority'"),
     ("05.recompute_tokens", recompute_whole_cache, "cached_blocks=56"),
     ("05.recompute_tokens", recompute_no_cache, "generated=14"),
     ("05.swap_space", PartialSwapSpace, "s.swap_out(2, 8)"),
     ("05.resume_seconds", swap_one_way, "fn(tokens=1000, block_size=16")],
)
def test_mistakes_fail_with_call_got_expected_and_hint(name: str, wrong: Any,
                                                       needle: str) -> None:
    result = run(name, wrong)
    assert result.status == "failed"
    report = result.report_text()
    failing = [case for case in result.cases if not case.passed]
    assert any(needle in case.call for case in failing), report
    for case in failing:
        assert f"FAIL {case.call}" in report
        assert case.hint and f"hint     {case.hint}" in report
        assert f"got      {case.got}" in report and f"expected {case.expected}" in report
