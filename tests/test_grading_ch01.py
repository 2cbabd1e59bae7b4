"""Chapter 01's checks: a correct answer passes every case (fresh ones too), stubs are not
yet solved, and the answer key of exercise 5 is the edge of what fits. Wrong answers and
other right designs, with the hint each must get, are in ``tests/mutants/ch01.py``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch01 import longest_max_len
from course_lib.grading.check import CheckResult, evaluate
from course_lib.kv_math import GIB, blocks_needed, capacity
from tests.mutants.ch01 import blocks, config_bytes, longest, max_requests, predict

CORRECT: dict[str, Any] = {
    "01.bytes_per_token": config_bytes(),
    "01.blocks_needed": blocks(),
    "01.max_requests": max_requests(),
    "01.predict_vllm_log": predict(),
    "01.longest_max_len": longest(),
}


def run(name: str, obj: Any, seed: int | None = 5) -> CheckResult:
    return evaluate(find_exercise(name), obj, seed=seed)


def test_every_exercise_has_a_correct_answer() -> None:
    assert {e.name for e in chapter_exercises("01")} == set(CORRECT)


@pytest.mark.parametrize("name", sorted(CORRECT))
@pytest.mark.parametrize("seed", [None, 5, 11])
def test_a_correct_answer_passes_every_case(name: str, seed: int | None) -> None:
    result = run(name, CORRECT[name], seed)
    assert result.status == "passed", result.report_text()


def test_no_prompt_or_hint_states_a_formula() -> None:
    for exercise in chapter_exercises("01"):
        for case in exercise.cases():
            assert " x " not in case.hint and "//" not in case.hint, case.hint


def test_stubs_are_not_yet_solved() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError

    for name in CORRECT:
        assert run(name, stub).status == "not-solved"


@given(budget=st.integers(1, 200 * GIB), per_token=st.integers(1, 2**20),
       block_size=st.sampled_from([1, 8, 16, 32, 128]), requests=st.integers(1, 500))
def test_longest_max_len_is_the_edge_of_what_fits(budget: int, per_token: int,
                                                  block_size: int, requests: int) -> None:
    blocks_total = budget // (per_token * block_size)
    if blocks_total < requests:
        with pytest.raises(ValueError, match=str(requests)):
            longest_max_len(budget, per_token, block_size, requests)
        return
    length = longest_max_len(budget, per_token, block_size, requests)
    assert length % block_size == 0
    assert capacity(per_token, budget, block_size, length).max_requests >= requests
    assert capacity(per_token, budget, block_size, length + 1).max_requests < requests
    assert blocks_needed(length, block_size) * requests <= blocks_total
