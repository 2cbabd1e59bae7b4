"""Chapter 09's checks: every exercise draws fresh cases from its seed. Right answers of
several designs and the classic mistakes, each failing with the hint that names it, are kept
in ``tests/mutants/ch09.py`` and checked by ``tests/test_mutant_hints.py``."""

from __future__ import annotations

from course_lib.grading.ch09 import EXERCISES, FRESH


def test_every_exercise_has_fresh_cases() -> None:
    assert [e.name for e in EXERCISES] == list(FRESH)


def test_fresh_cases_are_seeded() -> None:
    for name, fresh in FRESH.items():
        assert [c.call for c in fresh(5)] == [c.call for c in fresh(5)], name
        assert [c.call for c in fresh(5)] != [c.call for c in fresh(6)], name
