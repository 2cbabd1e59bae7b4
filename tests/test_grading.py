"""check(): behavioural reports; grade: the instructor's table over submitted notebooks."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from course_lib.__main__ import main
from course_lib.grading import CHECK_MIME, chapter_exercises, check, find_exercise
from course_lib.grading.check import Case, Exercise, Raises, evaluate
from course_lib.grading.grade import check_outputs, grade_folder

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
    result = evaluate(find_exercise("00.to_kib"), lambda n: n // 1024)
    assert result.status == "failed" and result.passed == 3
    text = result.report_text()
    assert "FAIL fn(1536)" in text and "got      1" in text and "expected 1.5" in text
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


def _hanging_copy(source: Path, target: Path) -> None:
    """A solution notebook whose last exercise hangs before its check."""
    nb = nbformat.read(source, as_version=4)
    last_check = max(i for i, c in enumerate(nb.cells) if 'check("' in c.source)
    hang = nbformat.v4.new_code_cell("import time\nwhile True:\n    time.sleep(1)")
    nb.cells.insert(last_check, hang)
    nbformat.write(nb, target)


def test_grade_folder_full_zero_hang_and_malformed(tmp_path: Path) -> None:
    name = "01_kv_cache_arithmetic.ipynb"
    submissions = tmp_path / "submissions"
    for learner in ("alice", "bob", "carol", "dave"):
        (submissions / learner).mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / name, submissions / "alice" / name)
    shutil.copy(ROOT / "exercises" / name, submissions / "bob" / name)
    _hanging_copy(ROOT / "solutions" / name, submissions / "carol" / name)
    (submissions / "dave" / name).write_text("{ this is not json")
    before = {p: p.read_bytes() for p in submissions.rglob("*.ipynb")}

    out = tmp_path / "grades.csv"
    assert main(["grade", str(submissions), "--out", str(out), "--timeout", "25"]) == 0

    rows = list(csv.DictReader(out.open()))
    by_learner: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_learner.setdefault(row["learner"], []).append(row)
    exercises = len(chapter_exercises("01"))
    assert all(len(v) == exercises for v in by_learner.values())
    assert all(float(r["score"]) == 1.0 for r in by_learner["alice"])
    assert all(float(r["score"]) == 0.0 and r["status"] == "not-solved" for r in by_learner["bob"])
    carol = by_learner["carol"]
    assert [float(r["score"]) for r in carol] == [1.0] * (exercises - 1) + [0.0]
    assert "timed out after 25 s" in carol[-1]["reason"]
    assert all(float(r["score"]) == 0.0 and "not a valid notebook" in r["reason"]
               for r in by_learner["dave"])
    assert out.with_suffix(".txt").read_text().startswith(f"alice: {exercises}.00 / {exercises}")
    assert before == {p: p.read_bytes() for p in submissions.rglob("*.ipynb")}  # unmodified


def test_grade_rejects_missing_folder_and_bad_timeout(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        grade_folder(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="timeout"):
        grade_folder(tmp_path, timeout=0)


def test_check_outputs_reads_the_last_result_per_exercise() -> None:
    first = evaluate(find_exercise("00.to_kib"), lambda n: n // 1024).mimebundle()
    second = evaluate(find_exercise("00.to_kib"), to_kib).mimebundle()
    nb = {"cells": [{"cell_type": "code", "outputs": [{"data": first}, {"data": second}]}]}
    assert check_outputs(nb)["00.to_kib"]["status"] == "passed"
