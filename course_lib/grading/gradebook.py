"""The gradebook an LMS imports: one row per learner, one column per chapter, the total.

A view of the grader's rows: a chapter's cell is the sum of its exercises' scores, each
taken as the exact decimal the long CSV writes (three places), so the cells add up exactly
and equal what the long CSV holds; a cell is a plain number, never a formula. The shape is
the plain CSV that Canvas's and Moodle's gradebook imports read: a header row, the
learner's identifier in the first column (made formula-safe like every name the grader
writes), then one numeric column per chapter (``chapter NN``, out of that chapter's number
of exercises) and ``total``. The README's grading section says how to map the columns.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from course_lib.grading import chapter_exercises
from course_lib.grading.grade import GradeRow
from course_lib.grading.report import exact, safe_cell

IDENTIFIER = "learner"
"""Header of the first column: the learner's folder name, as the long CSV writes it."""


def chapter_column(chapter: str) -> str:
    """The header of ``chapter``'s column (``chapter 01``)."""
    return f"chapter {chapter}"


def gradebook_table(rows: Sequence[GradeRow], chapters: Sequence[str],
                    learners: Sequence[str]) -> list[list[str]]:
    """Header and one line per learner (in ``learners``' order): each chapter's points and
    the total, exact decimals with three places."""
    table = [[IDENTIFIER, *map(chapter_column, chapters), "total"]]
    for learner in learners:
        points = {chapter: Decimal(0) for chapter in chapters}
        for row in rows:
            if row.learner == learner and row.exercise and row.chapter in points:
                points[row.chapter] += exact(row.score)
        total = sum(points.values(), Decimal(0))
        table.append([safe_cell(learner), *(f"{points[c]:.3f}" for c in chapters),
                      f"{total:.3f}"])
    return table


def write_gradebook(rows: Sequence[GradeRow], chapters: Sequence[str],
                    learners: Sequence[str], path: Path) -> None:
    """Write the gradebook of ``learners`` (sorted) over ``chapters`` to ``path``."""
    for chapter in chapters:
        chapter_exercises(chapter)  # an unknown chapter is refused, naming it
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(gradebook_table(rows, chapters, sorted(learners)))
