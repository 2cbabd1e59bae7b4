"""Feedback pages and the gradebook: views of the grader's rows, escaped, exact, one file
per learner, and a page that reads in a real browser (Debian's Chromium via Playwright)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.grading import find_exercise
from course_lib.grading.check import observe
from course_lib.grading.feedback import md_code, md_text, page_html, page_stem, write_feedback
from course_lib.grading.grade import GradeRow, judge_cases
from course_lib.grading.gradebook import write_gradebook
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, ensure_chromium

EVIL = "=eve <script>alert(1)</script> & `x` | ../../etc"


def _kib_wrong(n: int) -> float:
    return n / 1000


def _row(learner: str, fn: object, exercise: str = "00.to_kib") -> GradeRow:
    """A row judged from a harvest run in this process, the last two fixed cases counted
    as fresh (as if drawn for the run)."""
    cases = list(find_exercise(exercise).cases())
    text = json.dumps({"calls": [c.call for c in cases],
                       "observations": [observe(c, fn) for c in cases]})
    found = judge_cases(text, cases, len(cases) - 2)
    return GradeRow(learner, exercise[:2], f"{exercise[:2]}_x.ipynb", exercise, found.score,
                    found.status, found.reason, found.flag, found.fixed_passed,
                    found.fixed_total, found.fresh_passed, found.fresh_total,
                    found.first_failure, found.remark)


def test_a_judged_row_carries_the_first_failing_fixed_case_and_fresh_counts() -> None:
    row = _row("a", _kib_wrong)
    assert row.judged and (row.fixed_total, row.fresh_total) == (3, 2)
    assert row.first_failure is not None and row.first_failure.hint
    assert row.first_failure.call in [c.call for c in find_exercise("00.to_kib").cases()][:3]
    assert "fixed" not in row.remark and "first failure" in row.reason


def test_pages_escape_everything_a_learner_controls(tmp_path: Path) -> None:
    rows = [_row(EVIL, lambda n: EVIL), GradeRow(EVIL, "", "<img src=x>.ipynb", "", 0.0,
                                                 "misnamed", "<b>bold</b>")]
    written = write_feedback(rows, 7, tmp_path / "pages", [EVIL])
    assert {p.parent for p in written} == {tmp_path / "pages"}
    page = (tmp_path / "pages" / (page_stem(EVIL) + ".html")).read_text()
    assert "<script>" not in page and "<img" not in page and "<b>bold" not in page
    assert "&lt;script&gt;" in page and "&lt;img src=x&gt;" in page
    markdown = (tmp_path / "pages" / (page_stem(EVIL) + ".md")).read_text()
    assert f"# Feedback for {md_code(EVIL)}\n" in markdown
    assert "\\<b\\>bold" in markdown
    with pytest.raises(ValueError, match="rows of"):
        page_html("bob", rows, 7)


@given(st.text(), st.text())
def test_page_names_stay_in_the_folder_and_never_collide(name: str, other: str) -> None:
    stem = page_stem(name)
    assert "/" not in stem and "\\" not in stem and not stem.startswith(".") and stem
    assert stem == name or "~" in stem
    assert stem == stem.lower()  # distinct on case-insensitive file systems too
    assert (stem == page_stem(other)) == (name == other)


def test_names_equal_after_cleaning_get_different_pages() -> None:
    names = ["Alice", "alice", "a lice", "a_lice", "a/lice"]
    assert len({page_stem(n) for n in names}) == len(names)


@given(st.text())
def test_markdown_code_spans_and_text_hold_any_text(text: str) -> None:
    span = md_code(text)
    fence = span[: len(span) - len(span.lstrip("`"))]
    assert fence not in span[len(fence):-len(fence)]
    assert "\n" not in md_text(text) and "<" not in md_text(text).replace("\\<", "")


def test_gradebook_sums_exact_decimals_and_never_writes_a_formula(tmp_path: Path) -> None:
    rows = [GradeRow("=cmd", "01", "n", f"01.e{i}", 1 / 3, "failed") for i in range(3)]
    rows += [GradeRow("bob", "02", "n", "02.e", 0.1, "failed")]
    write_gradebook(rows, ["01", "02"], ["bob", "=cmd"], tmp_path / "book.csv")
    table = list(csv.reader((tmp_path / "book.csv").open()))
    assert table == [["learner", "chapter 01", "chapter 02", "total"],
                     ["'=cmd", "0.999", "0.000", "0.999"],
                     ["bob", "0.000", "0.100", "0.100"]]


def test_a_feedback_page_reads_in_a_real_browser(tmp_path: Path) -> None:
    """Chromium opens one learner's page: each exercise's row is there with its hint."""
    reason = ensure_chromium()
    if reason:
        pytest.skip(reason)
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    rows = [_row("carol", _kib_wrong),
            GradeRow("carol", "00", "00_x.ipynb", "00.other", 1.0, "passed", "", "", 5, 5, 2, 2),
            GradeRow("carol", "01", "", "01.blocks_needed", 0.0, "not submitted",
                     "no 01_*.ipynb handed in")]
    write_feedback(rows, 42, tmp_path, ["carol"])
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto((tmp_path / "carol.html").as_uri())
            assert page.title() == "Feedback: carol"
            for row in rows:
                found = page.locator(f'tr[data-exercise="{row.exercise}"]')
                assert found.count() == 1 and row.status in found.inner_text()
            failing = page.locator('tr[data-exercise="00.to_kib"] .hint')
            assert failing.inner_text() == rows[0].first_failure.hint
            colour = failing.evaluate(
                "e => getComputedStyle(e.closest('tr').querySelector('.status')).color")
            assert colour == "rgb(207, 34, 46)"  # failed reads red
            page.screenshot(path=str(tmp_path / "feedback.png"), full_page=True)
        finally:
            browser.close()
