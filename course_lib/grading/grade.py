"""The instructor's grader: every learner, every exercise, scored in this process.

Layout: ``SUBMISSIONS/<learner>/<NN_name>.ipynb`` (see ``submissions``). Each notebook runs in
a sandboxed kernel (see ``execute``); what comes back is plain data that is validated here
and judged against expected values computed here, in a process that never runs learner
code. Every learner gets a row for every exercise of every graded chapter, with a reason
whenever the score is not earned; one learner's files never stop the others' grading.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import hashlib
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from course_lib.grading import GRADED_CHAPTERS, chapter_exercises
from course_lib.grading.check import Case, Exercise, judge
from course_lib.grading.execute import Execution, Limits, Sandbox, execute
from course_lib.grading.source import (
    GradedCheck,
    graded_checks,
    parse_cells,
    reads_solutions,
    uses_reference,
)
from course_lib.grading.submissions import Inventory, Submission, find_submissions

REFERENCE = "uses the reference implementation"
SANDBOX_UID = 61000
"""First of the unprivileged user ids kernels run as when the grader runs as root."""


@dataclass(frozen=True)
class GradeRow:
    """One learner's score on one exercise (or one ungraded file), with the reason."""

    learner: str
    chapter: str
    notebook: str
    exercise: str
    score: float
    status: str
    reason: str = ""
    flag: str = ""


@dataclass
class GradeReport:
    """All rows, and the problems of the grading itself (which make the exit status 1)."""

    rows: list[GradeRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def judge_harvest(text: str, exercise: Exercise, cases: Sequence[Case]) -> tuple[float, str, str]:
    """(score, status, reason) from one harvest's JSON, validated strictly first."""
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return 0.0, "invalid result", "the harvest was not valid JSON"
    calls = [case.call for case in cases]
    if not isinstance(payload, dict) or payload.get("exercise") != exercise.name:
        return 0.0, "invalid result", "the harvest named another exercise"
    if payload.get("calls") != calls:
        return 0.0, "invalid result", "the harvest ran other cases than the grader's"
    extra = set(payload) - {"exercise", "calls"}
    if extra == {"not_solved"} and payload["not_solved"] is True:
        return 0.0, "not solved", "not yet solved (NotImplementedError)"
    if extra == {"missing"} and isinstance(payload["missing"], str):
        return 0.0, "check did not run", f"the graded object failed: {payload['missing'][:200]}"
    observations = payload.get("observations")
    if extra != {"observations"} or not _valid_observations(observations, len(cases)):
        return 0.0, "invalid result", "the harvest's observations are malformed"
    results = [judge(case, obs) for case, obs in zip(cases, observations, strict=True)]
    passed = sum(r.passed for r in results)
    if passed == len(cases):
        return 1.0, "passed", ""
    failed = next(r for r in results if not r.passed)
    return (passed / len(cases), "failed",
            f"{passed}/{len(cases)} cases passed; first failure: {failed.call[:120]}")


def _valid_observations(observations: Any, count: int) -> bool:
    """A list of ``count`` observations, each exactly one kind with a short ``shown``."""
    if not isinstance(observations, list) or len(observations) != count:
        return False
    for obs in observations:
        if not isinstance(obs, dict) or not isinstance(obs.get("shown"), str):
            return False
        kinds = set(obs) - {"shown"}
        if len(obs["shown"]) > 2000 or len(kinds) != 1:
            return False
        (kind,) = kinds
        value = obs[kind]
        if kind == "raised":
            if not (isinstance(value, list) and 0 < len(value) <= 100
                    and all(isinstance(v, str) for v in value)):
                return False
        elif kind == "not_plain":
            if not isinstance(value, str):
                return False
        elif kind != "value":
            return False
    return True


def _exercise_rows(sub: Submission, exercises: Sequence[Exercise],
                   cases: dict[str, list[Case]], trees: Sequence[ast.Module | None],
                   checks: dict[str, GradedCheck], execution: Execution) -> list[GradeRow]:
    """One row per exercise of the submitted chapter."""
    reads = reads_solutions(trees)
    rows = []
    for exercise in exercises:
        base = GradeRow(sub.learner, sub.chapter, sub.name, exercise.name, 0.0, "")
        check = checks.get(exercise.name)
        if check is None:
            rows.append(dataclasses.replace(base, status="check did not run", reason=(
                f'the notebook has no check("{exercise.name}", ...) call')))
        elif reads or uses_reference(trees, check, exercise.reference):
            rows.append(dataclasses.replace(base, status="flagged", reason=REFERENCE,
                                            flag="reference"))
        elif exercise.name in execution.harvests:
            score, status, reason = judge_harvest(execution.harvests[exercise.name], exercise,
                                                  cases[exercise.name])
            if score < 1 and execution.first_error:
                reason += f" (the notebook raised {execution.first_error})"
            if execution.status:  # scored before the notebook stopped: say so
                note = f"then the notebook {execution.problem}"
                reason = f"{reason}; {note}" if reason else note
            rows.append(dataclasses.replace(base, score=score, status=status, reason=reason))
        elif execution.status:
            rows.append(dataclasses.replace(base, status=execution.status,
                                            reason=execution.problem))
        else:
            why = execution.first_error or "the harvest after its check printed no result"
            rows.append(dataclasses.replace(base, status="check did not run", reason=why))
    return rows


def parse_notebook(sub: Submission) -> tuple[Any, str]:
    """The submission as a notebook, or None and why it is not one."""
    if sub.problem:
        return None, sub.problem
    try:
        notebook = nbformat.reads(sub.data.decode("utf-8"), as_version=4)
        if not isinstance(notebook.get("cells"), list):
            return None, "no cells"
        return notebook, ""
    except Exception as error:  # any malformed file: JSON, encoding or schema
        return None, f"not a valid notebook ({type(error).__name__})"


def expected_cases(chapter: str) -> dict[str, list[Case]]:
    """Every exercise's cases in ``chapter``, expected values computed here."""
    return {e.name: list(e.cases()) for e in chapter_exercises(chapter)}


async def grade_submission(sub: Submission, cases: Awaitable[dict[str, list[Case]]],
                           limits: Limits, sandbox: Sandbox) -> list[GradeRow]:
    """Execute one submission and score each exercise of its chapter; ``cases`` may still
    be being computed meanwhile."""
    exercises = chapter_exercises(sub.chapter)
    notebook, problem = parse_notebook(sub)
    if notebook is None:
        return [GradeRow(sub.learner, sub.chapter, sub.name, e.name, 0.0, "not a notebook",
                         problem) for e in exercises]
    trees = parse_cells([c.get("source", "") if c.get("cell_type") == "code" else ""
                         for c in notebook.cells])
    checks = graded_checks(trees, [e.name for e in exercises])
    execution = await execute(Path(sub.name).name, notebook, checks, limits, sandbox)
    if execution.grader_problem:
        raise RuntimeError(execution.grader_problem)
    return _exercise_rows(sub, exercises, await cases, trees, checks, execution)


def tree_digest(folder: Path) -> str:
    """A hash of every file name and content under ``folder``, to see a change afterwards."""
    sha = hashlib.sha256()
    for path in sorted(folder.rglob("*"), key=lambda p: os.fsencode(p)):
        sha.update(os.fsencode(path) + b"\0")
        if path.is_file() and not path.is_symlink():
            sha.update(hashlib.sha256(path.read_bytes()).digest())
    return sha.hexdigest()


def _not_submitted(inventory: Inventory, chapters: Sequence[str]) -> list[GradeRow]:
    return [GradeRow(learner, chapter, "", e.name, 0.0, "not submitted",
                     f"no {chapter}_*.ipynb handed in")
            for learner in inventory.learners for chapter in chapters
            if (learner, chapter) not in inventory.graded
            for e in chapter_exercises(chapter)]


def grade_folder(folder: Path, limits: Limits | None = None, jobs: int = 1,
                 chapters: Sequence[str] = GRADED_CHAPTERS,
                 progress: Callable[[int, int], Any] | None = None) -> GradeReport:
    """Grade every learner under ``folder``, ``jobs`` notebooks at a time; ``progress(done,
    total)`` hears of each notebook finished."""
    limits = limits or Limits()
    if not limits.timeout > 0 or limits.memory_mb < 256 or jobs < 1:
        raise ValueError(f"timeout must be positive, memory at least 256 MB and jobs at "
                         f"least 1, got {limits.timeout!r}, {limits.memory_mb!r}, {jobs!r}")
    chapters = tuple(chapters)
    for chapter in chapters:
        chapter_exercises(chapter)  # unknown chapters raise before any work
    inventory = find_submissions(Path(folder).resolve(), chapters)
    report = GradeReport()
    sandbox, handed_in = Sandbox.snapshot(), tree_digest(Path(folder))
    graded = asyncio.run(_grade_all(list(inventory.graded.values()), limits, sandbox, jobs,
                                    progress, report))
    report.rows = sorted([*graded, *_not_submitted(inventory, chapters)],
                         key=lambda r: (r.learner, r.chapter, r.exercise))
    report.rows += [GradeRow(n.learner, "", n.name, "", 0.0, n.status, n.reason)
                    for n in inventory.notes]
    if Sandbox.snapshot().digest() != sandbox.digest():
        report.problems.append("course_lib changed on disk while grading")
    if tree_digest(Path(folder)) != handed_in:
        report.problems.append(f"files under {str(folder)!r} changed while grading")
    return report


async def _grade_all(subs: list[Submission], limits: Limits, sandbox: Sandbox, jobs: int,
                     progress: Callable[[int, int], Any] | None,
                     report: GradeReport) -> list[GradeRow]:
    """Grade ``subs`` with at most ``jobs`` kernels at once, each under its own user id,
    while a thread computes the expected values of the chapters handed in."""
    loop = asyncio.get_running_loop()
    cases = {chapter: loop.run_in_executor(None, expected_cases, chapter)
             for chapter in sorted({sub.chapter for sub in subs})}
    slots: asyncio.Queue[int | None] = asyncio.Queue()
    done = [0]
    for slot in range(jobs):
        slots.put_nowait(SANDBOX_UID + slot if os.geteuid() == 0 else None)

    async def one(sub: Submission) -> list[GradeRow]:
        uid = await slots.get()
        try:
            return await grade_submission(sub, cases[sub.chapter], limits,
                                          dataclasses.replace(sandbox, uid=uid))
        except Exception as error:  # a grader bug: report it, grade the others
            report.problems.append(f"{sub.learner}/{sub.name}: {type(error).__name__}: {error}")
            return [GradeRow(sub.learner, sub.chapter, sub.name, e.name, 0.0, "grader error",
                             f"{type(error).__name__}: {error}"[:200])
                    for e in chapter_exercises(sub.chapter)]
        finally:
            slots.put_nowait(uid)
            done[0] += 1
            if progress is not None:
                progress(done[0], len(subs))

    return [row for rows in await asyncio.gather(*map(one, subs)) for row in rows]
