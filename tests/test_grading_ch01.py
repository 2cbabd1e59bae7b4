"""Chapter 01's checks: no hint states a formula, and the answer key of the
``01.longest_max_len`` exercise is the edge of what fits. Right answers (the notebook's
design and others) and wrong ones, with the hint each must get, are in
``tests/mutants/ch01.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.grading import chapter_exercises
from course_lib.grading.ch01 import longest_max_len
from course_lib.kv_math import GIB, blocks_needed, capacity


def test_no_prompt_or_hint_states_a_formula() -> None:
    for exercise in chapter_exercises("01"):
        for case in exercise.cases():
            assert " x " not in case.hint and "//" not in case.hint, case.hint


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
