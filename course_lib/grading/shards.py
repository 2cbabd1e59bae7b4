"""Grading a class in shards (a Slurm job array, a Kubernetes Indexed Job) and merging them.

``grade --shard K/N --seed S`` grades shard K of N: of the folder's learners sorted by
name, the i-th belongs to shard ``i mod N + 1`` (``grade.shard_learners``), whichever
machine runs it, and the chapters are those anyone in the whole folder handed in, so each
shard's rows are exactly the rows a run over the whole class gives its learners. Each run
writes a manifest beside its CSV (``report.Manifest``). :func:`merge` checks that the parts
are the N shards of one folder, graded with one seed and the same limits, each exactly
once, and that each CSV holds exactly the rows its manifest covers (``report.check_rows``:
scores the grader writes, every learner's every exercise once, no one else's), then writes
the rows in the order one run writes them, the summary from those rows, and, when asked, the
gradebook and the feedback pages the shards wrote.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from course_lib.grading.feedback import page_stem
from course_lib.grading.grade import GradeRow, order_rows
from course_lib.grading.gradebook import write_gradebook
from course_lib.grading.report import (
    Manifest,
    check_rows,
    folder_digest,
    manifest_path,
    read_csv,
    read_manifest,
    recorded,
    relative_to_csv,
    summary,
    write_csv,
)


@dataclass(frozen=True)
class Merged:
    """What a merge wrote: the rows, the summary's text and the manifest."""

    rows: list[GradeRow]
    text: str
    manifest: Manifest


def _parts(parts: Sequence[Path]) -> list[tuple[Path, Manifest, tuple[int, int]]]:
    """Each part's CSV, manifest and shard, once the parts are known to be all N shards of
    one folder graded with one seed, each once; otherwise a ValueError naming them."""
    found = []
    for part in parts:
        manifest = read_manifest(manifest_path(Path(part)))
        if manifest.shard is None:
            raise ValueError(f"{str(part)!r} is not a shard (it was graded without --shard)")
        k, n = (int(x) for x in manifest.shard.split("/"))
        if not 1 <= k <= n:
            raise ValueError(f"{str(part)!r} claims shard {manifest.shard}, not one of N")
        found.append((Path(part), manifest, (k, n)))
    if not found:
        raise ValueError("grade-merge needs the shards' CSVs")
    first = found[0][1]
    for what, key in (("shard counts N", lambda m: m.shard.split("/")[1]),
                      ("seeds", lambda m: m.seed),
                      ("submissions folders", lambda m: m.folder_digest),
                      ("chapters", lambda m: m.chapters), ("sandboxes", lambda m: m.sandbox),
                      ("memory bounds", lambda m: m.memory), ("timeouts", lambda m: m.timeout),
                      ("--memory-mb", lambda m: m.memory_mb)):
        if any(key(m) != key(first) for _, m, _ in found):
            shown = ", ".join(f"{str(p)!r}: {key(m)}" for p, m, _ in found)
            raise ValueError(f"the shards differ in their {what} ({shown}): merge only the "
                             "shards of one run")
    n = found[0][2][1]
    seen: dict[int, Path] = {}
    for path, _, (k, _) in found:
        if k in seen:
            raise ValueError(f"duplicated shard {k}/{n}: {str(seen[k])!r} and {str(path)!r}")
        seen[k] = path
    missing = [f"{k}/{n}" for k in range(1, n + 1) if k not in seen]
    if missing:
        raise ValueError(f"missing shard{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)}: merge all {n} shards")
    return sorted(found, key=lambda item: item[2])


def merge(out: Path, parts: Sequence[Path], gradebook: Path | None = None,
          feedback: Path | None = None) -> Merged:
    """Merge the shards' CSVs into ``out`` (resolved, checked by the caller), with its
    summary and manifest; ``gradebook`` writes the class's gradebook from the merged rows,
    ``feedback`` gathers the shards' feedback pages into one folder."""
    found = _parts(parts)
    if any(Path(path).resolve() == out for path, _, _ in found):
        raise ValueError(f"the merged CSV {str(out)!r} is one of the shards")
    first = found[0][1]
    learners = sorted(name for _, manifest, _ in found for name in manifest.learners)
    if (len(learners) != first.folder_learners or len(set(learners)) != len(learners)
            or folder_digest(learners) != first.folder_digest):
        shown = ", ".join(f"{str(p)!r}: {len(m.learners)}" for p, m, _ in found)
        raise ValueError(f"the shards' learners ({shown}) are not the {first.folder_learners} "
                         "learners of the folder they were graded from, each once")
    rows = []
    for path, manifest, _ in found:
        part = read_csv(path)
        check_rows(path, part, manifest, set(learners) - set(manifest.learners))
        rows += part
    if feedback is not None:
        _gather_feedback(found, feedback)
    rows = order_rows(rows)
    text = summary(rows, first.seed, first.memory)
    if gradebook is not None:
        write_gradebook(rows, first.chapters, learners, gradebook)
    manifest = Manifest(first.seed, first.memory, first.chapters, None, first.sandbox,
                        learners, first.folder_learners, first.folder_digest, first.timeout,
                        first.memory_mb, relative_to_csv(gradebook, out),
                        relative_to_csv(feedback, out))
    write_csv(rows, out)
    out.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    manifest.write(manifest_path(out))
    return Merged(rows, text, manifest)


def _gather_feedback(found: Sequence[tuple[Path, Manifest, tuple[int, int]]],
                     folder: Path) -> None:
    """Copy every shard's learners' pages into ``folder`` (where a shard wrote them
    elsewhere); a shard that wrote none is refused, naming it, before anything is copied."""
    sources = []
    for path, manifest, (k, n) in found:
        source = recorded(manifest.feedback, manifest_path(path))
        if source is None or not source.is_dir():
            raise ValueError(f"shard {k}/{n} ({str(path)!r}) wrote no feedback pages: grade "
                             "every shard with --feedback")
        sources.append((source, manifest.learners))
    pages = [(source / (page_stem(learner) + suffix), folder / (page_stem(learner) + suffix))
             for source, learners in sources for learner in learners
             for suffix in (".html", ".md")]
    absent = [str(page) for page, _ in pages if not page.is_file()]
    if absent:
        raise ValueError(f"feedback pages are missing: {', '.join(absent[:5])}")
    folder.mkdir(exist_ok=True)
    for page, target in pages:
        if not (target.exists() and target.samefile(page)):
            shutil.copyfile(page, target)
