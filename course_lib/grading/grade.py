"""The instructor's grader: execute submitted exercise notebooks and tabulate their checks.

Layout: ``SUBMISSIONS/<learner>/<NN_name>.ipynb``; the two leading digits name the chapter,
whose exercises are the ones expected. Each notebook runs in its own process on a copy
(submissions are never modified) under a time limit. A notebook that hangs, crashes or is
not valid JSON scores zero for what did not run, with the reason; the rest are still graded.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.grading import CHECK_MIME, chapter_exercises

_CHAPTER = re.compile(r"^(\d\d)_")


@dataclass(frozen=True)
class GradeRow:
    """One learner's score on one exercise, with the reason when it is not full marks."""

    learner: str
    notebook: str
    exercise: str
    score: float
    status: str
    reason: str


def find_submissions(folder: Path) -> list[tuple[str, Path]]:
    """(learner, notebook) pairs under ``folder/<learner>/``, sorted for a stable table."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submissions folder {str(folder)!r} does not exist")
    found = [
        (path.parent.name, path)
        for path in sorted(folder.glob("*/*.ipynb"))
        if _CHAPTER.match(path.name) and ".ipynb_checkpoints" not in path.parts
    ]
    if not found:
        raise ValueError(f"no '<learner>/NN_name.ipynb' notebooks under {str(folder)!r}")
    return found


def check_outputs(notebook: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The last check result per exercise found in an executed notebook's outputs."""
    results: dict[str, dict[str, Any]] = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            payload = output.get("data", {}).get(CHECK_MIME)
            if isinstance(payload, dict) and isinstance(payload.get("exercise"), str):
                results[payload["exercise"]] = payload
    return results


def _first_error(notebook: dict[str, Any]) -> str | None:
    """The first error a cell raised (other than an unsolved stub), for the reason column."""
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            unsolved = output.get("ename") == "NotImplementedError"
            if output.get("output_type") == "error" and not unsolved:
                return f"{output.get('ename')}: {output.get('evalue')}"
    return None


def execute_copy(path: Path, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Execute a copy of ``path`` in a child process; return (notebook or None, problem)."""
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"not a valid notebook file ({type(error).__name__})"
    with tempfile.TemporaryDirectory(prefix="course-grade-") as tmp:
        executed = Path(tmp) / "executed.ipynb"
        command = [sys.executable, "-m", "course_lib.grading.execute", str(path), str(executed),
                   "--cell-timeout", str(timeout)]
        child = subprocess.Popen(command, cwd=tmp, start_new_session=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        problem = ""
        try:
            log, _ = child.communicate(timeout=timeout)
            if child.returncode:
                last = (log or "").strip().splitlines()[-1:] or ["no output"]
                problem = f"execution failed: {last[0][:200]}"
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the kernel is in the same session
            child.communicate()
            problem = f"timed out after {timeout:g} s"
        if not executed.exists():
            return None, problem or "execution produced no notebook"
        return json.loads(executed.read_text(encoding="utf-8")), problem


def grade_notebook(learner: str, path: Path, timeout: float) -> Iterator[GradeRow]:
    """Rows for every exercise the notebook's chapter expects."""
    match = _CHAPTER.match(path.name)
    assert match, path  # find_submissions only yields chapter notebooks
    expected = chapter_exercises(match.group(1))
    notebook, problem = execute_copy(path, timeout)
    results = check_outputs(notebook) if notebook else {}
    error = _first_error(notebook) if notebook else None
    for exercise in expected:
        result = results.get(exercise.name)
        if result is None:
            reason = problem or (f"check did not run ({error})" if error else "check did not run")
            yield GradeRow(learner, path.name, exercise.name, 0.0, "missing", reason)
        else:
            reason = "" if result["status"] == "passed" else (
                "not yet solved" if result["status"] == "not-solved"
                else f"{result['passed']}/{result['total']} cases passed"
            )
            yield GradeRow(learner, path.name, exercise.name, float(result["score"]),
                           result["status"], reason)


def grade_folder(folder: Path, timeout: float = 300.0) -> list[GradeRow]:
    """Grade every submission under ``folder``; one bad notebook never stops the rest."""
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    rows: list[GradeRow] = []
    for learner, path in find_submissions(folder):
        rows.extend(grade_notebook(learner, path, timeout))
    return rows


def write_csv(rows: Iterable[GradeRow], out: Path) -> None:
    """The long score table: one row per learner, notebook and exercise."""
    with Path(out).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["learner", "notebook", "exercise", "score", "status", "reason"])
        for row in rows:
            writer.writerow([row.learner, row.notebook, row.exercise, f"{row.score:.3f}",
                             row.status, row.reason])


def summary(rows: list[GradeRow]) -> str:
    """A readable table: each learner's total and each exercise's score."""
    learners = sorted({row.learner for row in rows})
    lines = []
    for learner in learners:
        mine = [row for row in rows if row.learner == learner]
        total = sum(row.score for row in mine)
        lines.append(f"{learner}: {total:.2f} / {len(mine)}")
        lines.extend(
            f"  {row.exercise:<36} {row.score:4.2f}  {row.status}"
            + (f"  ({row.reason})" if row.reason else "")
            for row in mine
        )
    return "\n".join(lines)
