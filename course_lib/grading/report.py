"""The grader's output: where it goes (checked before any work), the CSV, the summary and
the manifest.

The CSV is safe to open in a spreadsheet: a cell that would start a formula (``=``, ``+``,
``-``, ``@``, tab, carriage return) is prefixed with ``'``, and so is one that starts with
``'`` itself, so every cell reads back exactly (:func:`read_csv`). The summary beside it
lists each learner's total and each exercise's pass rate across the class, computed from
what the CSV holds, so merged shards and regraded learners rewrite it exactly. Learner and
file names and reasons are escaped (``submissions.printable``), so no learner can break a
line of either or send a terminal escape. The manifest (``NAME.manifest.json``) records what
the CSV covers: the seed, the limits, the chapters, the shard, the learners, the folder
they came from. A CSV read back to be merged or regraded is checked against its manifest
(:func:`check_rows`), so a tampered or mismatched one is refused, never joined.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

from course_lib.grading import chapter_exercises
from course_lib.grading.grade import GradeRow
from course_lib.grading.submissions import printable

COLUMNS = ("learner", "chapter", "notebook", "exercise", "score", "status", "reason", "flag")
MANIFEST_FORMAT = 2
"""Version of the manifest's layout; a manifest of another is refused."""
SUMMARY_WIDTH = 40
"""Widest name column of the summary: a longer name runs past it on its own line only."""
_SCORE = re.compile(r"0\.[0-9]{3}|1\.000")


def output_paths(out: Path, submissions: Path | None,
                 flag: str = "--out") -> tuple[Path, Path]:
    """(CSV, summary) for ``--out``, refused with a clear message before any grading."""
    csv_path = Path(out).resolve()
    summary = csv_path.with_suffix(".txt")
    if csv_path.suffix.lower() != ".csv":
        raise ValueError(f"{flag} must name a .csv file (the summary goes beside it as .txt), "
                         f"got {str(out)!r}")
    if csv_path.is_dir() or summary.is_dir():
        raise ValueError(f"{flag} {str(out)!r} (or its .txt summary) is a directory")
    _writable_beside(csv_path, out, flag, submissions)
    return csv_path, summary


def _writable_beside(path: Path, given: Path, flag: str, submissions: Path | None) -> None:
    """Refuse ``path`` unless its folder exists, is writable and is outside the submissions."""
    if not path.parent.is_dir():
        raise ValueError(f"{flag} folder {str(path.parent)!r} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"{flag} folder {str(path.parent)!r} is not writable")
    if submissions is not None and Path(submissions).resolve() in (path, *path.parents):
        raise ValueError(f"{flag} {str(given)!r} is inside the submissions folder")


def extra_paths(gradebook: Path | None, feedback: Path | None, csv_path: Path,
                submissions: Path | None) -> tuple[Path | None, Path | None]:
    """``--gradebook`` (a .csv beside nothing else the run writes) and ``--feedback`` (a
    folder, made if missing), resolved and refused like ``--out``."""
    book = Path(gradebook).resolve() if gradebook is not None else None
    if book is not None:
        if book.suffix.lower() != ".csv" or book.is_dir():
            raise ValueError(f"--gradebook must name a .csv file, got {str(gradebook)!r}")
        if book in (csv_path, manifest_path(csv_path)):
            raise ValueError(f"--gradebook {str(gradebook)!r} is the --out CSV")
        _writable_beside(book, gradebook, "--gradebook", submissions)
    pages = Path(feedback).resolve() if feedback is not None else None
    if pages is not None:
        if pages.exists() and not pages.is_dir():
            raise ValueError(f"--feedback {str(feedback)!r} is not a folder")
        _writable_beside(pages, feedback, "--feedback", submissions)
    return book, pages


def safe_cell(text: str) -> str:
    """``text`` as one printable line a spreadsheet shows as it is, never as a formula.

    A leading ``'`` is doubled too, so :func:`unsafe_cell` reads every cell back exactly."""
    text = printable(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r", "'") else text


def unsafe_cell(cell: str) -> str:
    """The printable text :func:`safe_cell` made ``cell`` from."""
    return cell[1:] if cell.startswith("'") else cell


def score_text(score: float) -> str:
    """A score as the CSV writes it: three decimals."""
    return f"{score:.3f}"


def exact(score: float) -> Decimal:
    """A score as the exact decimal the CSV holds, for totals that add up in any order."""
    return Decimal(score_text(score))


def write_csv(rows: Sequence[GradeRow], out: Path) -> None:
    """The long score table: one row per learner and exercise, then ungraded files."""
    with Path(out).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([safe_cell(row.learner), row.chapter, safe_cell(row.notebook),
                             row.exercise, score_text(row.score), row.status,
                             safe_cell(row.reason), row.flag])


def read_csv(path: Path) -> list[GradeRow]:
    """The rows of a CSV :func:`write_csv` wrote, as they were (names and reasons in their
    printable form, scores to three decimals), so they can be merged and written again
    byte for byte; anything else is refused, naming the file."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as handle:
            table = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"cannot read grades CSV {str(path)!r}: {error}") from None
    if not table or tuple(table[0]) != COLUMNS or any(len(r) != len(COLUMNS) for r in table):
        raise ValueError(f"{str(path)!r} is not a CSV the grader wrote (columns "
                         f"{','.join(COLUMNS)})")
    rows = []
    for line, (learner, chapter, notebook, exercise, score, status, reason, flag) in enumerate(
            table[1:], 2):
        if not _SCORE.fullmatch(score):
            raise ValueError(f"{str(path)!r} line {line}: score {score[:40]!r} is not one the "
                             "grader writes (from 0.000 to 1.000, three decimals)")
        rows.append(GradeRow(unsafe_cell(learner), chapter, unsafe_cell(notebook), exercise,
                             float(score), status, unsafe_cell(reason), flag))
    return rows


def check_rows(path: Path, rows: Sequence[GradeRow], manifest: Manifest,
               others: Collection[str] = ()) -> None:
    """Refuse, naming ``path``, rows that are not exactly those a run with ``manifest``
    writes: one row per learner of the manifest, chapter of the manifest and exercise of
    that chapter, each once, and files not graded only of its learners, or, in a whole run
    or shard 1, of entries of the folder that are no learner (not among ``others``, the
    learners of the other shards)."""
    learners = set(manifest.learners)
    names = {c: {e.name for e in chapter_exercises(c)} for c in manifest.chapters}
    folder_notes = manifest.shard is None or manifest.shard.startswith("1/")
    seen: Counter[tuple[str, str, str]] = Counter()
    for row in rows:
        where = f"{str(path)!r} holds a row of {printable(row.learner)[:80]!r}"
        if not row.exercise:
            if row.chapter or row.score != 0.0:
                raise ValueError(f"{where} with a chapter or score but no exercise")
            if row.learner not in learners and (not folder_notes or row.learner in others):
                raise ValueError(f"{where}, who is not a learner of its manifest")
        elif row.learner not in learners:
            raise ValueError(f"{where}, who is not a learner of its manifest")
        elif row.exercise not in names.get(row.chapter, ()):
            raise ValueError(f"{where} for exercise {printable(row.exercise)[:80]!r} of "
                             f"chapter {printable(row.chapter)[:10]!r}, not one its manifest's "
                             f"chapters {','.join(manifest.chapters)} grade")
        else:
            seen[row.learner, row.chapter, row.exercise] += 1
    twice = [key for key, times in seen.items() if times > 1]
    if twice:
        raise ValueError(f"{str(path)!r} holds {len(twice)} rows more than once, the first "
                         f"{twice[0]!r}")
    missing = [(learner, chapter, name) for learner in manifest.learners
               for chapter in manifest.chapters for name in sorted(names[chapter])
               if (learner, chapter, name) not in seen]
    if missing:
        raise ValueError(f"{str(path)!r} lacks {len(missing)} rows its manifest covers, the "
                         f"first {missing[0]!r}")


def summary(rows: Sequence[GradeRow], seed: int, memory: str = "") -> str:
    """The seed of the fresh cases, what bounded memory, each learner's total over every
    exercise, each exercise's pass rate, ungraded files."""
    scored = [row for row in rows if row.exercise]
    exercises = sorted({row.exercise for row in scored})
    learners = sorted({row.learner for row in rows})
    width = min(max([len(name) for name in learners + exercises] + [8]), SUMMARY_WIDTH)
    lines = [f"Fresh cases drawn with seed {seed} (regrade the same with --seed {seed}).",
             *([f"Memory bound: {memory}."] if memory else []),
             f"Total per learner (out of {len(exercises)} exercises):"]
    for learner in learners:
        total = sum((exact(row.score) for row in scored if row.learner == learner), Decimal(0))
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


def manifest_path(csv_path: Path) -> Path:
    """Where the manifest of ``csv_path`` goes: ``NAME.manifest.json`` beside it."""
    return csv_path.with_name(csv_path.stem + ".manifest.json")


def folder_digest(everyone: Sequence[str]) -> str:
    """A digest of a submissions folder's learners (sorted): shards of one folder agree."""
    return hashlib.sha256(json.dumps(sorted(everyone)).encode()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What one CSV covers: the run's seed, memory bound and chapters, the shard (``"K/N"``,
    or None for a whole class), whether kernels ran sandboxed, the learners whose rows it
    holds, the folder's learner count and digest, each notebook's ``--timeout`` and
    ``--memory-mb``, and the gradebook and feedback folder the run wrote (relative to the
    CSV's folder), if any."""

    seed: int
    memory: str
    chapters: list[str]
    shard: str | None
    sandbox: bool
    learners: list[str]
    folder_learners: int
    folder_digest: str
    timeout: float
    memory_mb: int
    gradebook: str | None = None
    feedback: str | None = None
    format: int = MANIFEST_FORMAT

    def write(self, path: Path) -> None:
        """Write it as JSON, keys sorted, so equal manifests are equal files."""
        Path(path).write_text(json.dumps(asdict(self), indent=1, sort_keys=True) + "\n",
                              encoding="utf-8")


def read_manifest(path: Path) -> Manifest:
    """The manifest at ``path``; a missing or malformed one is refused, naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no manifest {str(path)!r} beside the CSV: was it written by "
                         "grade?") from None
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read manifest {str(path)!r}: {error}") from None
    names = set(Manifest.__dataclass_fields__)
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or set(data) != names:
        raise ValueError(f"{str(path)!r} is not a manifest of format {MANIFEST_FORMAT}")
    manifest = Manifest(**data)
    texts = (manifest.learners, manifest.chapters)
    if not (all(isinstance(x, list) and all(isinstance(t, str) for t in x) for x in texts)
            and len(set(manifest.learners)) == len(manifest.learners)
            and isinstance(manifest.seed, int) and isinstance(manifest.memory, str)
            and type(manifest.memory_mb) is int and type(manifest.timeout) in (int, float)
            and math.isfinite(manifest.timeout)
            and (manifest.shard is None or re.fullmatch(r"[0-9]+/[0-9]+", str(manifest.shard)))):
        raise ValueError(f"{str(path)!r} is not a manifest the grader wrote (its learners, "
                         "chapters, seed, limits or shard are malformed)")
    for chapter in manifest.chapters:
        try:
            chapter_exercises(chapter)
        except ValueError as error:
            raise ValueError(f"{str(path)!r}: {error}") from None
    return manifest


def relative_to_csv(path: Path | None, csv_path: Path) -> str | None:
    """``path`` as the manifest records it: relative to the CSV's folder."""
    return None if path is None else os.path.relpath(path, csv_path.parent)


def recorded(text: str | None, manifest: Path) -> Path | None:
    """A path the manifest at ``manifest`` records, resolved from its folder."""
    return None if text is None else (Path(manifest).parent / text).resolve()
