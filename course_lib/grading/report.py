"""The grader's output: where it goes (checked before any work), the CSV and the summary.

The CSV is safe to open in a spreadsheet: a cell that would start a formula (``=``, ``+``,
``-``, ``@``, tab, carriage return) is prefixed with ``'``. The summary beside it lists
each learner's total and each exercise's pass rate across the class. Learner and file
names and reasons are escaped (``submissions.printable``), so no learner can break a line
of either or send a terminal escape.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

from course_lib.grading.grade import GradeRow
from course_lib.grading.submissions import printable

COLUMNS = ("learner", "chapter", "notebook", "exercise", "score", "status", "reason", "flag")


def output_paths(out: Path, submissions: Path) -> tuple[Path, Path]:
    """(CSV, summary) for ``--out``, refused with a clear message before any grading."""
    csv_path = Path(out).resolve()
    summary = csv_path.with_suffix(".txt")
    if csv_path.suffix.lower() != ".csv":
        raise ValueError(f"--out must name a .csv file (the summary goes beside it as .txt), "
                         f"got {str(out)!r}")
    if csv_path.is_dir() or summary.is_dir():
        raise ValueError(f"--out {str(out)!r} (or its .txt summary) is a directory")
    if not csv_path.parent.is_dir():
        raise ValueError(f"--out folder {str(csv_path.parent)!r} does not exist")
    if not os.access(csv_path.parent, os.W_OK):
        raise ValueError(f"--out folder {str(csv_path.parent)!r} is not writable")
    inside = Path(submissions).resolve()
    if inside in csv_path.parents:
        raise ValueError(f"--out {str(out)!r} is inside the submissions folder")
    return csv_path, summary


def safe_cell(text: str) -> str:
    """``text`` as one printable line a spreadsheet shows as it is, never as a formula."""
    text = printable(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_csv(rows: Sequence[GradeRow], out: Path) -> None:
    """The long score table: one row per learner and exercise, then ungraded files."""
    with Path(out).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([safe_cell(row.learner), row.chapter, safe_cell(row.notebook),
                             row.exercise, f"{row.score:.3f}", row.status,
                             safe_cell(row.reason), row.flag])


def summary(rows: Sequence[GradeRow], seed: int, memory: str = "") -> str:
    """The seed of the fresh cases, what bounded memory, each learner's total over every
    exercise, each exercise's pass rate, ungraded files."""
    scored = [row for row in rows if row.exercise]
    exercises = sorted({row.exercise for row in scored})
    learners = sorted({row.learner for row in rows})
    width = max([len(name) for name in learners + exercises] + [8])
    lines = [f"Fresh cases drawn with seed {seed} (regrade the same with --seed {seed}).",
             *([f"Memory bound: {memory}."] if memory else []),
             f"Total per learner (out of {len(exercises)} exercises):"]
    for learner in learners:
        total = sum(row.score for row in scored if row.learner == learner)
        lines.append(f"  {learner:<{width}}  {total:6.2f} / {len(exercises)}")
    lines.append("Pass rate per exercise:")
    for exercise in exercises:
        mine = [row for row in scored if row.exercise == exercise]
        passed = sum(row.status == "passed" for row in mine)
        lines.append(f"  {exercise:<{width}}  {passed}/{len(mine)} learners "
                     f"({100 * passed / len(mine):.0f}%)")
    notes = [row for row in rows if not row.exercise]
    if notes:
        lines.append("Files not graded:")
        lines += [f"  {row.learner}: {row.status}: {printable(row.reason)}" for row in notes]
    flagged = sorted({(row.learner, row.exercise) for row in scored if row.flag})
    if flagged:
        lines.append("Flagged (uses the reference implementation):")
        lines += [f"  {learner}: {exercise}" for learner, exercise in flagged]
    return "\n".join(lines)
