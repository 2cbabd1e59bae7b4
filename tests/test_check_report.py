"""check's reports: the first differing part by its label, hints chosen by that label, a
check's own verdict, no grader internals, an HTML table beside deterministic text, and
fresh cases added for a seed."""

from __future__ import annotations

import random
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.grading import find_exercise
from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    Satisfies,
    Verdict,
    evaluate,
    first_difference,
    first_failure,
    hint_for,
    recognising,
    satisfies,
)


def arena_case() -> Case:
    return Case("arena script", lambda fn: fn(), {"admit(0, 10)": 0, "append(0)": 0,
                                                   "arena.copied": 10},
                "the default hint", hints={"arena.copied": "count the copies",
                                           "raised": "do not raise"})


def judged(case: Case, obj: Any) -> Any:
    result = evaluate(Exercise("xx.demo", "demo", lambda: [case]), obj)
    return first_failure(result)


def test_the_first_differing_part_is_named_by_its_label_and_picks_its_hint() -> None:
    failed = judged(arena_case(), lambda: {"admit(0, 10)": 0, "append(0)": 0,
                                           "arena.copied": 11})
    assert failed.differs == "arena.copied: got 11, expected 10"
    assert failed.hint == "count the copies"
    failed = judged(arena_case(), lambda: {"admit(0, 10)": 0, "append(0)": 5,
                                           "arena.copied": 11})
    assert failed.differs.startswith("append(0): got 5") and failed.hint == "the default hint"


def test_nested_parts_lists_and_types_are_labelled() -> None:
    assert first_difference({"tables": {"a": [1, 2]}}, {"tables": {"a": [1, 3]}}) == (
        "tables[a][1]: got 2, expected 3")
    assert first_difference([1, 2], [1, 2, 3]) == "result: 2 items, expected 3"
    assert first_difference({"x": 1}, {"x": 1, "y": 2}) == "y: missing"
    assert first_difference({"x": 1, "z": 0}, {"x": 1}) == "z: not expected"
    assert first_difference([True], [1]) == "result[0]: got True (bool), expected 1 (int)"
    assert first_difference([7.0], [7]) == "result[0]: got 7.0 (float), expected 7 (int)"
    assert first_difference(["7"], [7]) == "result[0]: got '7' (str), expected 7 (int)"
    assert first_difference([1.0 + 1e-12], [1.0]) is None


@given(st.lists(st.integers(-5, 5), max_size=6), st.lists(st.integers(-5, 5), max_size=6))
def test_a_difference_is_found_exactly_when_the_values_differ(a: list[int],
                                                             b: list[int]) -> None:
    found = first_difference(a, b)
    assert (found is None) == (a == b)
    if found and len(a) == len(b):
        index = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        assert found == f"result[{index}]: got {a[index]}, expected {b[index]}"


def test_a_raise_and_a_missing_raise_are_labelled() -> None:
    def broken() -> Any:
        raise KeyError("x")

    failed = judged(arena_case(), broken)
    assert failed.differs.startswith("raised: KeyError") and failed.hint == "do not raise"
    case = Case("fn(-1)", lambda fn: fn(-1), Raises(ValueError), "refuse it")
    failed = judged(case, lambda n: n)
    assert failed.differs == "returned: -1, expected a raise" and failed.hint == "refuse it"


def test_satisfies_explain_states_the_checks_own_verdict() -> None:
    def explain(starts: Any) -> str | None:
        ordered = sorted(starts)
        for a, b in pairwise(ordered):
            if b - a < 30:
                return f"overlap: the slab at {b} overlaps the slab at {a}"
        return None

    expected = Satisfies("3 slabs of 30 apart", explain=explain)
    case = Case("starts", lambda fn: fn(), expected, "default", compare=satisfies,
                hints={"overlap": "slabs must not share a slot"})
    failed = judged(case, lambda: [0, 20, 70])
    assert failed.differs == "overlap: the slab at 20 overlaps the slab at 0"
    assert failed.hint == "slabs must not share a slot"
    assert judged(case, lambda: [0, 30, 60]) is None
    with pytest.raises(ValueError, match="exactly one"):
        Satisfies("both", holds=bool, explain=lambda v: None)


def test_a_comparison_may_name_the_mistake_itself() -> None:
    def compare(got: Any, want: Any) -> Verdict:
        if got == want + 1:
            return Verdict(False, f"count: got {got}, expected {want}", "one too many")
        return Verdict(got == want)

    case = Case("count", lambda fn: fn(), 10, "default", compare=compare)
    assert judged(case, lambda: 11).hint == "one too many"
    assert judged(case, lambda: 12).hint == "default"


def test_reports_quote_the_learners_line_never_the_checks() -> None:
    case = find_exercise("03.pack_tables").cases()[0]  # its run reads the rows returned
    failed = judged(case, lambda *args: None)
    assert failed.differs.startswith("raised: TypeError") and "line" not in failed.got

    def learner(*args: Any) -> Any:
        return {}["nope"]

    failed = judged(case, learner)
    assert 'return {}["nope"]' in failed.got


def test_the_report_is_an_html_table_and_deterministic_text() -> None:
    exercise = Exercise("xx.demo", "demo <b>", lambda: [arena_case(), arena_case()])
    wrong = lambda: {"admit(0, 10)": 0, "append(0)": 0, "arena.copied": 11}  # noqa: E731
    first, second = evaluate(exercise, wrong), evaluate(exercise, wrong)
    bundle = first.mimebundle()
    assert bundle["text/plain"] == second.mimebundle()["text/plain"]
    assert "differs  arena.copied: got 11, expected 10" in bundle["text/plain"]
    page = bundle["text/html"]
    assert page.count("<tr>") == 3 and "<table" in page and "demo &lt;b&gt;" in page
    assert "<b>arena.copied: got 11, expected 10</b>" in page


def test_fresh_cases_join_for_a_seed_only() -> None:
    def fresh(seed: int) -> list[Case]:
        n = random.Random(seed).randrange(100)
        return [Case(f"fn({n})", lambda fn, n=n: fn(n), n + 1, "add one")]

    exercise = Exercise("xx.demo", "demo", lambda: [Case("fn(1)", lambda fn: fn(1), 2, "h")],
                        fresh=fresh)
    assert evaluate(exercise, lambda n: n + 1).total == 1
    result = evaluate(exercise, lambda n: n + 1, seed=3)
    assert (result.total, result.status) == (2, "passed")
    assert evaluate(exercise, lambda n: n + 1, seed=3).cases == result.cases


def test_recognising_names_the_mistake_a_wrong_value_comes_from() -> None:
    compare = recognising([(9, "a partly filled block is a block"), (11, "one too many")])
    case = Case("fn(900, 100)", lambda fn: fn(), 10, "default", compare=compare)
    assert judged(case, lambda: 9).hint == "a partly filled block is a block"
    assert judged(case, lambda: 11).differs == "result: got 11, expected 10"
    assert judged(case, lambda: 11).hint == "one too many"
    assert judged(case, lambda: 12).hint == "default"
    assert judged(case, lambda: 10) is None
    same = Case("fn()", lambda fn: fn(), 10, "default", compare=recognising([(10, "never")]))
    assert judged(same, lambda: 10) is None


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("ABCD")), max_size=6),
       st.integers(0, 3), st.randoms())
def test_the_hint_is_chosen_by_the_mistake_not_by_the_order_of_the_slips(
        slips: list[tuple[int, str]], got: int, rng: random.Random) -> None:
    shuffled = rng.sample(slips, len(slips))
    assert recognising(slips)(got, 9).hint == recognising(shuffled)(got, 9).hint


def test_hints_match_labels_with_an_index_a_field_or_a_count() -> None:
    case = Case("c", lambda fn: fn(), 0, "default", hints={"num_free": "count", "a": "A"})
    for differs in ("num_free: x", "num_free #2: x", "num_free[1]: x", "a.b: x"):
        assert hint_for(case, differs) in ("count", "A")
    assert hint_for(case, "num_freed: x") == "default"
