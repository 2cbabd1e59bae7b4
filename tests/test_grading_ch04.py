"""Chapter 04's checks: cases are plain and deterministic, comparisons are type-strict and a
failing report shows both pool states. Right answers (the library's steps and other designs)
and wrong ones, with their hints, are in ``tests/mutants/ch04.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from course_lib.grading import ch04, chapter_exercises, find_exercise
from course_lib.grading.check import CheckResult, evaluate, recognising
from course_lib.paged import BlockPool
from tests.mutants.ch04 import (
    MostRecentlyFreedEvictedFirst,
    append_without_copy_on_write,
    library_append,
    library_fork,
    library_system_prompt,
)

NAMES = [exercise.name for exercise in chapter_exercises("04")]


def run(name: str, fn: Callable[..., Any], seed: int | None = 4) -> CheckResult:
    return evaluate(find_exercise(name), fn, seed=seed)


@pytest.mark.parametrize("name", NAMES)
def test_cases_are_deterministic_and_printable(name: str) -> None:
    exercise = find_exercise(name)
    first, second = exercise.cases(), exercise.cases()
    assert len(first) >= 5
    assert [(c.call, c.expected) for c in first] == [(c.call, c.expected) for c in second]
    for case in first:
        assert "0x" not in repr(case.expected) and "object at" not in repr(case.expected)
        assert case.hint and len(case.call) < 400


def _is_plain(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(map(_is_plain, value))
    if isinstance(value, dict):
        return all(_is_plain(k) and _is_plain(v) for k, v in value.items())
    return value is None or type(value) in (int, str)


@pytest.mark.parametrize("name", NAMES)
def test_every_case_expects_plain_data(name: str) -> None:
    for case in find_exercise(name).cases():
        assert _is_plain(case.expected), (case.call, case.expected)


def test_comparisons_are_type_strict() -> None:
    def as_floats(prompt_tokens: int, chats: int, block_size: int) -> tuple[float, ...]:
        return tuple(float(n) for n in library_system_prompt(prompt_tokens, chats, block_size))

    def float_lengths(pool: BlockPool, table: list[int], length: int) -> float:
        return float(library_append(pool, table, length))

    assert run("04.system_prompt_blocks", as_floats).status == "failed"
    assert run("04.append_token", float_lengths).status == "failed"


def test_a_failing_script_shows_both_pool_states() -> None:
    result = run("04.append_token", append_without_copy_on_write)
    script = "a = 6 tokens; fork a -> b; b appends 1"
    case = next(c for c in result.cases if c.call.endswith(script))
    assert case.got == ("{'tables': {'a': [1, 2], 'b': [1, 2]}, 'lengths': {'a': 6, 'b': 7}, "
                        "'refs': {1: 2, 2: 2}, 'free': 5}")
    assert case.expected == ("{'tables': {'a': [1, 2], 'b': [1, 3]}, 'lengths': {'a': 6, 'b': 7}, "
                             "'refs': {1: 2, 2: 1, 3: 1}, 'free': 4}")


def test_the_demo_case_reports_the_source_figures() -> None:
    result = run("04.append_token", append_without_copy_on_write, seed=None)
    demo = result.cases[-1]
    assert "1,000-token prompt" in demo.call and not demo.passed
    assert demo.expected == "(114, (64, 65, 66, 63), 4)"
    assert demo.got == "(111, (63, 63, 63, 63), 4)"


def test_the_fork_demo_shares_the_prompt_blocks() -> None:
    demo = run("04.fork", library_fork, seed=None).cases[-1]
    assert "1,000-token prompt" in demo.call and demo.passed
    assert demo.expected == "237"  # 300 blocks, 63 of them shared by the 4 samples


@pytest.mark.parametrize("script", [script for _, _, script, _ in ch04.APPEND_SCRIPTS]
                         + [ch04._forked_samples(1000, 4),
                            [("add", "x", 9), ("add", "y", 2), ("free", "x"), ("add", "a", 5),
                             ("fork", "a", "b"), ("free", "y")]])
def test_an_append_case_starts_from_the_library_state_rebuilt_from_plain_data(
        script: list) -> None:
    """The kernel rebuilds, from primitive pool operations, exactly the pool the library
    leaves after the adds, forks and frees: the same counts and the same free queue."""
    setup, _ = ch04._split(script)
    library = ch04._library_run(301, 4, setup).pool
    rebuilt = ch04._rebuilt(301, 4, ch04._start(301, 4, setup))
    assert rebuilt.free_blocks() == library.free_blocks()
    assert [rebuilt.ref_count(b) for b in range(301)] == [library.ref_count(b)
                                                          for b in range(301)]


def test_a_crash_in_learner_code_is_reported_with_its_line() -> None:
    def broken(pool: BlockPool, table: list[int]) -> list[int]:
        return [pool.share(block) for block in tabel]  # type: ignore[name-defined]  # noqa: F821

    result = run("04.fork", broken)
    assert result.status == "failed" and result.passed == 0
    assert "raised NameError" in result.cases[0].got and "tabel" in result.cases[0].got


def test_slips_that_give_the_same_value_share_a_hint_that_names_each() -> None:
    found = ch04._slips(lambda slip: 1 if slip in "ab" else 2, [("a", "A"), ("b", "B"),
                                                              ("c", "C")])
    compare = recognising(found)
    assert compare(1, 0).hint == "A; or else: B" and compare(2, 0).hint == "C"
    assert compare(0, 0).passed and compare(3, 0).hint == ""


@pytest.mark.parametrize("seed", [0, 7])
def test_evicting_the_newest_cached_block_is_never_told_another_mistake(seed: int) -> None:
    """Every case that a queue evicting the most recently freed cached block fails names that
    mistake (where another slip gives the same value, both are named)."""
    result = run("04.free_queue", MostRecentlyFreedEvictedFirst, seed=seed)
    failed = [case for case in result.cases if not case.passed]
    assert failed and all("freed longer ago" in case.hint for case in failed), (
        result.report_text())
