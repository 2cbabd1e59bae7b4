"""Chapter 08's checks: fresh cases are drawn from their seed, and the notebook's window rule
keeps a table's length. The mistakes learners make (a window off by one, ceil for floor at a
block boundary, freeing a block a shared prefix still holds, a hit that satisfies only the
full group, a kernel that ignores the window or masks it on the scores only) and right
answers (the notebook's design and others) are kept in ``tests/mutants/ch08.py``, where
``tests/test_mutant_hints.py`` checks that each fails with the hint of its mistake."""

from __future__ import annotations

import pytest

from course_lib.grading.ch08 import FRESH
from course_lib.kv_math import blocks_needed
from tests.mutants.ch08 import window_free


@pytest.mark.parametrize("name", sorted(FRESH))
def test_fresh_cases_are_deterministic_per_seed_and_differ_between_seeds(name: str) -> None:
    calls = [[c.call for c in FRESH[name](seed)] for seed in (5, 5, 6)]
    assert calls[0] == calls[1] != calls[2]


def test_window_free_keeps_table_length() -> None:
    # the library rule never drops more than the table holds
    after, returned = window_free()([5, 9], {5: 1, 9: 1}, 100, 3, 4)
    assert after == [0, 0] and returned == [5, 9]
    assert blocks_needed(8, 4) == len(after)
