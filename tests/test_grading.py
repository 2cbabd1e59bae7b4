"""check(): behavioural reports; grade: the instructor's table over submitted notebooks."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import (
    CHECK_MIME,
    GRADED_CHAPTERS,
    chapter_exercises,
    check,
    find_exercise,
)
from course_lib.grading.check import Case, Exercise, Raises, evaluate
from course_lib.grading.execute import Limits
from course_lib.grading.grade import grade_folder

ROOT = Path(__file__).resolve().parent.parent


def to_kib(n: int) -> float:
    if n < 0:
        raise ValueError(n)
    return n / 1024


def test_passing_function_passes(capsys: pytest.CaptureFixture[str]) -> None:
    result = check("00.to_kib", to_kib)
    assert (result.status, result.passed, result.total, result.score) == ("passed", 5, 5, 1.0)
    assert "PASSED 00.to_kib" in capsys.readouterr().out


def test_failure_report_names_call_got_expected_and_hint() -> None:
    result = evaluate(find_exercise("00.to_kib"), lambda n: float(n // 1024))
    assert result.status == "failed" and result.passed == 3
    text = result.report_text()
    assert "FAIL fn(1536)" in text and "got      1.0" in text and "expected 1.5" in text
    ints = evaluate(find_exercise("00.to_kib"), lambda n: n // 1024)
    assert ints.passed == 0 and "got 0 (int), expected 0.0 (float)" in ints.report_text()
    assert "hint" in text and "expected raises ValueError" in text


def test_learner_exception_is_evidence_not_a_crash() -> None:
    def broken(n: int) -> float:
        return n / undefined_name  # noqa: F821

    result = evaluate(find_exercise("00.to_kib"), broken)
    assert result.status == "failed"
    assert "raised NameError" in result.cases[0].got
    assert "undefined_name" in result.cases[0].got  # the offending line is quoted


def test_stub_reports_not_yet_solved() -> None:
    def stub(n: int) -> float:
        raise NotImplementedError

    result = evaluate(find_exercise("00.to_kib"), stub)
    assert (result.status, result.passed, result.score) == ("not-solved", 0, 0.0)


def test_wrong_exception_type_fails_and_non_callable_is_reported() -> None:
    exercise = Exercise("xx.demo", "demo", lambda: [
        Case("fn(-1)", lambda fn: fn(-1), Raises(ValueError), "raise ValueError"),
    ])
    assert evaluate(exercise, lambda n: 1 / 0).status == "failed"
    assert "raised TypeError" in evaluate(exercise, 42).cases[0].got


def test_mime_bundle_is_machine_readable() -> None:
    bundle = evaluate(find_exercise("00.to_kib"), to_kib).mimebundle()
    payload = bundle[CHECK_MIME]
    assert payload["exercise"] == "00.to_kib" and payload["score"] == 1.0
    json.dumps(payload)  # serialisable as stored in a notebook
    assert 'data-status="passed"' in bundle["text/html"]


def test_unknown_exercise_and_chapter_raise_clearly() -> None:
    with pytest.raises(ValueError, match=r"01\.nope"):
        find_exercise("01.nope")
    with pytest.raises(ValueError, match="'99'"):
        chapter_exercises("99")
    with pytest.raises(ValueError, match="two digits"):
        chapter_exercises("1")


@pytest.mark.parametrize("folder", ["solutions", "exercises"])
def test_every_chapter_notebook_has_registered_exercises(folder: str) -> None:
    for path in sorted((ROOT / folder).glob("*.ipynb")):
        names = {e.name for e in chapter_exercises(path.name[:2])}
        sources = "".join(c.source for c in nbformat.read(path, as_version=4).cells)
        assert all(f'check("{name}"' in sources for name in names), path.name


def test_a_chapter_registers_its_exercises_in_the_order_its_solution_checks_them() -> None:
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        sources = "".join(c.source for c in nbformat.read(path, as_version=4).cells)
        checked = list(dict.fromkeys(re.findall(r'check\("(\d\d\.\w+)"', sources)))
        assert checked == [e.name for e in chapter_exercises(path.name[:2])], path.name


def test_the_documented_command_grades_from_another_folder(tmp_path: Path) -> None:
    """The README's command, run as a new instructor would: through tools/course.py, with
    relative paths, from another folder."""
    subs = tmp_path / "class" / "SUBMISSIONS"
    for learner in ("solved", "unsolved"):
        (subs / learner).mkdir(parents=True)
    for path in sorted((ROOT / "solutions").glob("[01][0-9]_*.ipynb")):
        shutil.copy(path, subs / "solved" / path.name)
    shutil.copy(ROOT / "exercises" / "01_kv_cache_arithmetic.ipynb", subs / "unsolved")
    before = {p: p.read_bytes() for p in subs.rglob("*.ipynb")}
    if not (ROOT / ".venv" / ".course-installed").exists():
        pytest.skip("the README's command runs the course's .venv, which the test command makes")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "course.py"), "grade", "SUBMISSIONS/", "--out",
         "grades.csv", "--jobs", "2", "--timeout", "240"],
        cwd=tmp_path / "class", capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "class" / "grades.csv").open()))
    solved = [r for r in rows if r["learner"] == "solved"]
    assert {r["chapter"] for r in solved} == set(GRADED_CHAPTERS)
    assert [(r["exercise"], r["reason"]) for r in solved if r["status"] != "passed"] == []
    unsolved = [r for r in rows if r["learner"] == "unsolved"]
    assert len(unsolved) == sum(len(chapter_exercises(c)) for c in GRADED_CHAPTERS)
    assert {r["status"] for r in unsolved if r["chapter"] == "01"} == {"not solved"}
    assert {r["status"] for r in unsolved if r["chapter"] != "01"} == {"not submitted"}
    summary = (tmp_path / "class" / "grades.txt").read_text()
    assert "unsolved" in summary and f"0.00 / {len(unsolved)}" in summary
    assert before == {p: p.read_bytes() for p in subs.rglob("*.ipynb")}  # unmodified


def test_grade_rejects_missing_folder_and_bad_limits(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        grade_folder(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="timeout"):
        grade_folder(tmp_path, Limits(timeout=0))
    with pytest.raises(ValueError, match="'99'"):
        grade_folder(tmp_path, chapters=("99",))
