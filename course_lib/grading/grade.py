"""The instructor's grader: every learner, every exercise, scored in this process.

Layout: ``SUBMISSIONS/<learner>/<NN_name>.ipynb`` (see ``submissions``). Each notebook runs in
a sandboxed kernel that holds no answer key (see ``sandbox`` and ``execute``). The cases
(the course's fixed ones, and ones drawn from this run's seed) are built here and shipped
into the kernel after the learner's cells ran; what comes back is plain data, validated and
judged here against expected values that never leave this process. Every learner gets a
row for every exercise of every chapter graded, with a reason whenever the score is not
earned; one learner's files never stop the others' grading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from course_lib.grading import chapter_exercises
from course_lib.grading.check import Case, CaseResult, Exercise, Raises, exercise_cases, judge
from course_lib.grading.execute import (
    Execution,
    Harvest,
    Kernel,
    Limits,
    execute,
    memory_bound,
    preflight,
)
from course_lib.grading.harvest import ship, uses_withheld, withheld_name
from course_lib.grading.sandbox import (
    SandboxUnavailable,
    check_available,
    is_exercise_module,
    library_copy,
)
from course_lib.grading.source import NotANotebook, read_isolated
from course_lib.grading.submissions import Inventory, Submission, find_submissions
from course_lib.limits import GRADER_MIN_MEMORY_MB

REFERENCE = "uses the reference implementation"
UNSANDBOXED = "no sandbox"


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
    fixed_passed: int = 0
    fixed_total: int = 0
    fresh_passed: int = 0
    fresh_total: int = 0
    first_failure: CaseResult | None = None
    """The first failing fixed case as ``check`` reports it (call, got, expected, hint,
    differs); never a fresh case, whose inputs and answers the learner must not see."""
    remark: str = ""
    """For a judged row (``fixed_total`` > 0), what else a learner may read beside the
    counts: the reference flag, how the notebook ended. Never a fresh case."""

    @property
    def judged(self) -> bool:
        """Whether the exercise's cases were judged (so the counts say how it did)."""
        return self.fixed_total > 0


@dataclass
class GradeReport:
    """All rows, the seed of the fresh cases, the problems of the grading itself (which make
    the exit status 1), what bounded each notebook's memory, the chapters graded, the
    learners these rows cover and every learner of the folder."""

    rows: list[GradeRow] = field(default_factory=list)
    seed: int = 0
    problems: list[str] = field(default_factory=list)
    memory: str = ""
    chapters: tuple[str, ...] = ()
    learners: list[str] = field(default_factory=list)
    everyone: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ChapterCases:
    """One chapter's cases, built here: per exercise the cases (the fixed ones first, then
    those drawn fresh), how many are fixed, their shipped form; the sandbox's library."""

    cases: Mapping[str, list[Case]]
    fixed: Mapping[str, int]
    shipped: Mapping[str, str]
    library: Mapping[str, bytes]


def build_chapter(chapter: str, seed: int) -> ChapterCases:
    """Every exercise's cases in ``chapter`` (expected values computed here), what is shipped
    of them, and the library the chapter's sandbox sees."""
    cases, fixed = {}, {}
    for exercise in chapter_exercises(chapter):
        found = exercise_cases(exercise)  # built once: chapter 07's take seconds
        fixed[exercise.name] = len(found)
        fresh = exercise.fresh(seed) if exercise.fresh is not None else ()
        cases[exercise.name] = [*found, *fresh]
    modules = [module for name, module in sorted(sys.modules.copy().items())
               if is_exercise_module(name)]
    return ChapterCases(cases, fixed,
                        {name: ship(found, modules) for name, found in cases.items()},
                        library_copy(chapter))


def score(passed: Sequence[bool], fixed: int,
          refusals: Sequence[bool] | None = None) -> tuple[float, str]:
    """(score, what passed): the share of fresh cases passed, or of fixed ones where an
    exercise draws none; ``refusals`` marks the cases that expect an error (none if None).

    The fixed cases are those a learner's ``check`` shows, expected values included, so
    passing them proves nothing: a notebook can hard-code their answers and errors. Only the
    fresh ones, drawn for this run and covering every kind of fixed case, show that the code
    computes the answers itself, so they alone decide the score. A refusal earns its share
    only beside a value case passed: a function that raises for everything answers nothing.
    """
    old, new = passed[:fixed], passed[fixed:]
    text = f"{sum(old)}/{len(old)} fixed" + (f" and {sum(new)}/{len(new)} fresh" if new else "")
    refusals = [False] * len(passed) if refusals is None else refusals
    counted, refusing = (new, refusals[fixed:]) if new else (old, refusals[:fixed])
    values = [ok for ok, refusal in zip(counted, refusing, strict=True) if not refusal]
    if values and not any(values):
        counted = [ok and not refusal for ok, refusal in zip(counted, refusing, strict=True)]
    return (sum(counted) / len(counted) if counted else 0.0), f"{text} cases passed"


@dataclass(frozen=True)
class Judgement:
    """What one harvest earned: the CSV's (score, status, reason, flag), and for the
    learner's feedback the counts of fixed and fresh cases passed, the first failing fixed
    case and a remark that names no fresh case."""

    score: float
    status: str
    reason: str
    flag: str = ""
    fixed_passed: int = 0
    fixed_total: int = 0
    fresh_passed: int = 0
    fresh_total: int = 0
    first_failure: CaseResult | None = None
    remark: str = ""


def judge_cases(text: str, cases: Sequence[Case], fixed: int | None = None) -> Judgement:
    """The :class:`Judgement` of one harvest's JSON, validated strictly first; ``fixed``
    counts the leading fixed cases (all of them when None)."""
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return Judgement(0.0, "invalid result", "the harvest was not valid JSON")
    if not isinstance(payload, dict) or payload.get("calls") != [case.call for case in cases]:
        return Judgement(0.0, "invalid result", "the harvest ran other cases than the grader's")
    extra = set(payload) - {"calls"}
    if extra == {"not_solved"} and payload["not_solved"] is True:
        return Judgement(0.0, "not solved", "not yet solved (NotImplementedError)")
    if extra == {"missing"} and isinstance(payload["missing"], str):
        return Judgement(0.0, "check did not run",
                         f"the graded object failed: {payload['missing'][:200]}")
    observations = payload.get("observations")
    if extra != {"observations"} or not _valid_observations(observations, len(cases)):
        return Judgement(0.0, "invalid result", "the harvest's observations are malformed")
    results = [judge(case, obs) for case, obs in zip(cases, observations, strict=True)]
    fixed = len(cases) if fixed is None else fixed
    old, new = [r.passed for r in results[:fixed]], [r.passed for r in results[fixed:]]
    counts = {"fixed_passed": sum(old), "fixed_total": len(old), "fresh_passed": sum(new),
              "fresh_total": len(new),
              "first_failure": next((r for r in results[:fixed] if not r.passed), None)}
    withheld = [withheld_name(obs) for obs in observations if uses_withheld(obs)]
    flag, reason = ("reference", f"{REFERENCE} ({withheld[0]} is not available while grading)"
                    ) if withheld else ("", "")
    if all(r.passed for r in results):
        return Judgement(1.0, "passed", reason, flag, remark=reason, **counts)
    share, passed = score([r.passed for r in results], fixed,
                          [isinstance(case.expected, Raises) for case in cases])
    failed = next(r for r in results if not r.passed)
    return Judgement(share, "flagged" if flag else "failed",
                     reason or f"{passed}; first failure: {failed.call[:120]}", flag,
                     remark=reason, **counts)


MAX_OBSERVED_TEXT = 2000
"""Longest text an observation may carry (what it showed, what was not plain data, each
error name raised): a harvest with longer text is malformed."""


def _valid_observations(observations: Any, count: int) -> bool:
    """A list of ``count`` observations, each exactly one kind, its texts short."""
    if not isinstance(observations, list) or len(observations) != count:
        return False
    for obs in observations:
        if not isinstance(obs, dict) or not isinstance(obs.get("shown"), str):
            return False
        kinds = set(obs) - {"shown"}
        if len(obs["shown"]) > MAX_OBSERVED_TEXT or len(kinds) != 1:
            return False
        (kind,) = kinds
        value = obs[kind]
        if kind == "raised":
            if not (isinstance(value, list) and 0 < len(value) <= 100
                    and all(isinstance(v, str) and len(v) <= MAX_OBSERVED_TEXT
                            for v in value)):
                return False
        elif kind == "not_plain":
            if not isinstance(value, str) or len(value) > MAX_OBSERVED_TEXT:
                return False
        elif kind != "value":
            return False
    return True


def _exercise_row(base: GradeRow, harvested: bool, execution: Execution,
                  judged: Callable[[], Judgement]) -> GradeRow:
    """The row of one exercise whose check the notebook calls: a scored row says why it lost
    points by its cases alone (an error elsewhere in the notebook, such as a demo cell that
    met the withheld answer key, is no concern of it)."""
    if harvested:
        found = judged()
        reason, remark = found.reason, found.remark
        if execution.status:  # scored before the notebook stopped: say so
            note = f"then the notebook {execution.problem}"
            reason, remark = (f"{text}; {note}" if text else note for text in (reason, remark))
        return dataclasses.replace(
            base, score=found.score, status=found.status, reason=reason, flag=found.flag,
            fixed_passed=found.fixed_passed, fixed_total=found.fixed_total,
            fresh_passed=found.fresh_passed, fresh_total=found.fresh_total,
            first_failure=found.first_failure, remark=remark)
    if execution.status:
        return dataclasses.replace(base, status=execution.status, reason=execution.problem)
    why = execution.first_error or "the harvest after its check printed no result"
    return dataclasses.replace(base, status="check did not run", reason=why)


def _rows(sub: Submission, exercises: Sequence[Exercise], cases: ChapterCases,
          checks: Mapping[str, Any], execution: Execution) -> list[GradeRow]:
    """One row per exercise of the submitted chapter."""
    rows = []
    for exercise in exercises:
        base = GradeRow(sub.learner, sub.chapter, sub.name, exercise.name, 0.0, "")
        if exercise.name not in checks:
            rows.append(dataclasses.replace(base, status="check did not run", reason=(
                f'the notebook has no check("{exercise.name}", ...) call')))
            continue
        text = execution.harvests.get(exercise.name)
        rows.append(_exercise_row(base, text is not None, execution,
                                  lambda t=text, e=exercise: judge_cases(
                                      t, cases.cases[e.name], cases.fixed[e.name])))
    return rows


async def grade_submission(sub: Submission, cases: ChapterCases, limits: Limits,
                           kernel: Kernel) -> list[GradeRow]:
    """Execute one submission and score each exercise of its chapter."""
    exercises = chapter_exercises(sub.chapter)
    try:
        if sub.problem:
            raise NotANotebook(sub.problem)
        reading = await read_isolated(sub.data, [e.name for e in exercises])
    except NotANotebook as error:
        return [GradeRow(sub.learner, sub.chapter, sub.name, e.name, 0.0, "not a notebook",
                         str(error)) for e in exercises]
    harvests = {name: Harvest(check.cell, check.expression, cases.shipped[name])
                for name, check in reading.checks.items()}
    execution = await execute(reading.sources, harvests, limits, kernel)
    if execution.grader_problem:
        raise RuntimeError(execution.grader_problem)
    return _rows(sub, exercises, cases, reading.checks, execution)


def _not_submitted(inventory: Inventory, chapters: Sequence[str]) -> list[GradeRow]:
    return [GradeRow(learner, chapter, "", e.name, 0.0, "not submitted",
                     f"no {chapter}_*.ipynb handed in")
            for learner in inventory.learners for chapter in chapters
            if (learner, chapter) not in inventory.graded
            for e in chapter_exercises(chapter)]


def order_rows(rows: Sequence[GradeRow]) -> list[GradeRow]:
    """Rows in the order a run writes them: the exercises' rows by learner, chapter and
    exercise, then the files not graded by learner (each learner's in the order found).

    A pure function of the rows, so merged shards and regraded learners come out in the
    order one run over the whole class gives."""
    scored = sorted((row for row in rows if row.exercise),
                    key=lambda r: (r.learner, r.chapter, r.exercise))
    return scored + sorted((row for row in rows if not row.exercise), key=lambda r: r.learner)


def shard_learners(everyone: Sequence[str], shard: tuple[int, int]) -> list[str]:
    """The learners of shard ``(k, n)``: of every learner sorted by name, the i-th goes to
    shard ``i mod n + 1``, so a folder splits the same way on every machine."""
    k, n = shard
    if not 1 <= k <= n:
        raise ValueError(f"a shard is K/N with 1 <= K <= N, got {k}/{n}")
    return [name for i, name in enumerate(sorted(everyone)) if i % n == k - 1]


def _select(inventory: Inventory, learners: Collection[str] | None,
            shard: tuple[int, int] | None) -> tuple[Inventory, list[str]]:
    """The part of ``inventory`` graded this run, and every learner of the folder: the
    learners asked for (unknown names refused), or a shard's, or all. The notes of files
    outside any learner's folder go with the whole class and shard 1, never a regrade."""
    everyone = sorted(inventory.learners)
    if learners is not None and shard is not None:
        raise ValueError("grade either some learners or a shard, not both")
    if learners is not None:
        unknown = sorted(set(learners) - set(everyone))
        if unknown:
            raise ValueError(f"--learners names learners not in the submissions folder: "
                             f"{', '.join(map(repr, unknown))}")
        chosen, folder_notes = set(learners), False
    elif shard is not None:
        chosen, folder_notes = set(shard_learners(everyone, shard)), shard[0] == 1
    else:
        return inventory, everyone
    return Inventory(
        [name for name in inventory.learners if name in chosen],
        {key: sub for key, sub in inventory.graded.items() if key[0] in chosen},
        [note for note in inventory.notes if note.learner in chosen
         or (folder_notes and note.learner not in everyone)]), everyone


def grade_folder(folder: Any, limits: Limits | None = None, jobs: int = 1,
                 chapters: Sequence[str] | None = None, *, seed: int | None = None,
                 sandbox: bool = True,
                 progress: Callable[[int, int], Any] | None = None,
                 learners: Collection[str] | None = None,
                 shard: tuple[int, int] | None = None) -> GradeReport:
    """Grade every learner under ``folder``, ``jobs`` notebooks at a time.

    ``chapters`` defaults to those anyone in the folder handed in; ``seed`` (drawn when
    None) chooses the fresh cases; ``sandbox=False`` runs kernels unconfined (trusted
    submissions only, and every row says so); ``progress(done, total)`` hears of each
    notebook finished. ``learners`` grades only those, ``shard=(k, n)`` only shard k of n
    (see :func:`shard_learners`); either way the chapters are the whole folder's, so their
    rows are those of a run over the whole class. Where no kernel can start in the sandbox,
    :class:`SandboxUnavailable` says why before anyone is graded.
    """
    limits = limits or Limits()
    if not limits.timeout > 0 or limits.memory_mb < GRADER_MIN_MEMORY_MB or jobs < 1:
        raise ValueError(f"timeout must be positive, memory at least {GRADER_MIN_MEMORY_MB} "
                         f"MB (what a kernel needs to start) and jobs at least 1, got "
                         f"{limits.timeout!r}, {limits.memory_mb!r}, {jobs!r}")
    for chapter in chapters or ():
        chapter_exercises(chapter)  # unknown chapters raise before any work
    whole = find_submissions(folder, chapters)
    chapters = tuple(chapters or sorted({chapter for _, chapter in whole.graded}))
    inventory, everyone = _select(whole, learners, shard)
    bwrap = check_available() if sandbox else None
    trial = Kernel(library_copy(chapters[0]) if chapters else {}, bwrap)
    problem = preflight(trial, limits) if inventory.graded else ""
    if problem:
        raise SandboxUnavailable(f"no kernel starts in the sandbox here ({problem}); nobody "
                                 "was graded")
    report = GradeReport(seed=secrets.randbelow(2**31) if seed is None else seed,
                         memory=memory_bound(limits, trial), chapters=chapters,
                         learners=sorted(inventory.learners), everyone=everyone)
    graded = asyncio.run(_grade_all(list(inventory.graded.values()), limits, bwrap, jobs,
                                    report, progress))
    rows = [*graded, *_not_submitted(inventory, chapters)]
    if bwrap is None:
        rows = [dataclasses.replace(r, flag="; ".join(filter(None, [r.flag, UNSANDBOXED])))
                for r in rows]
    report.rows = order_rows([*rows, *(GradeRow(n.learner, "", n.name, "", 0.0, n.status,
                                                n.reason) for n in inventory.notes)])
    return report


async def _grade_all(subs: list[Submission], limits: Limits, bwrap: str | None, jobs: int,
                     report: GradeReport,
                     progress: Callable[[int, int], Any] | None) -> list[GradeRow]:
    """Grade ``subs`` with at most ``jobs`` kernels at once."""
    loop = asyncio.get_running_loop()
    chapters = sorted({sub.chapter for sub in subs})
    built = await asyncio.gather(*(loop.run_in_executor(None, build_chapter, c, report.seed)
                                   for c in chapters), return_exceptions=True)
    cases = dict(zip(chapters, built, strict=True))
    gate, done = asyncio.Semaphore(jobs), [0]

    async def one(sub: Submission) -> list[GradeRow]:
        async with gate:
            try:
                if isinstance(cases[sub.chapter], BaseException):
                    raise cases[sub.chapter]
                kernel = Kernel(cases[sub.chapter].library, bwrap)
                return await grade_submission(sub, cases[sub.chapter], limits, kernel)
            except Exception as error:  # a grader bug: report it, grade the others
                report.problems.append(f"{sub.learner}/{sub.name}: {type(error).__name__}: "
                                       f"{error}")
                return [GradeRow(sub.learner, sub.chapter, sub.name, e.name, 0.0,
                                 "grader error", f"{type(error).__name__}: {error}"[:200])
                        for e in chapter_exercises(sub.chapter)]
            finally:
                done[0] += 1
                if progress is not None:
                    progress(done[0], len(subs))

    return [row for rows in await asyncio.gather(*map(one, subs)) for row in rows]
