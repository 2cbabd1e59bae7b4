"""``grade``: the instructor's score table for a folder of submitted exercise notebooks;
``grade-merge``: the shards of one ``grade --shard`` run, merged into the table of the class."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from course_lib.commands import UsageError, integer, number, refuse_together
from course_lib.limits import GRADER_MEMORY_MB, GRADER_MIN_MEMORY_MB

if TYPE_CHECKING:
    from course_lib.grading.grade import GradeRow
    from course_lib.grading.report import Manifest

TIMEOUT_S = 300.0
"""Default ``--timeout``: seconds per notebook."""
MAX_TIMEOUT_S = 86_400.0
"""Longest per-notebook time limit ``--timeout`` accepts: a day (inf would mean no limit)."""
MAX_MEMORY_MB = 1 << 20
"""Largest ``--memory-mb``: 1 TiB, more than any grading machine has."""
MAX_JOBS = 256
"""Most notebooks ``--jobs`` runs at once."""
MAX_SEED = 2**63 - 1
"""Largest ``--seed``."""


def chapter_list(text: str) -> tuple[str, ...]:
    """A ``type=`` for ``--chapters``: comma-separated graded chapters such as ``01,02``."""
    from course_lib.grading import GRADED_CHAPTERS

    chapters = tuple(part.strip() for part in text.split(","))
    unknown = [c for c in chapters if c not in GRADED_CHAPTERS]
    if unknown or not chapters:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated chapters among {','.join(GRADED_CHAPTERS)}, got {text!r}")
    return chapters


def learner_list(text: str) -> tuple[str, ...]:
    """A ``type=`` for ``--learners``: comma-separated learner names as the CSV shows them."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",")))
    if not all(names):
        raise argparse.ArgumentTypeError(f"must be comma-separated learner names, got {text!r}")
    return names


def shard_spec(text: str) -> tuple[int, int]:
    """A ``type=`` for ``--shard``: ``K/N`` with 1 <= K <= N, e.g. ``2/3``."""
    k, slash, n = text.partition("/")
    if slash and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n) <= 100_000:
        return int(k), int(n)
    raise argparse.ArgumentTypeError(f"must be K/N with 1 <= K <= N (shard K of N, e.g. 2/3), "
                                     f"got {text!r}")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``grade`` and ``grade-merge`` parsers."""

    parser = subparsers.add_parser(
        "grade", help="grade submitted exercise notebooks",
        description="Run SUBMISSIONS/<learner>/NN_*.ipynb, each in a sandboxed kernel with "
        "time, memory and output limits, score every exercise in this process, and write one "
        "CSV row per learner and exercise plus a summary beside it. Exit status 0: graded; "
        "1: grading itself had a problem (see stderr); 2: bad arguments.",
    )
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder per learner")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"),
                        help="CSV to write; the summary goes beside it as .txt")
    parser.add_argument("--timeout", type=number(0, MAX_TIMEOUT_S, above=True), default=None,
                        help="seconds a notebook may run before its whole process tree is killed "
                        f"(default {TIMEOUT_S:g}; with --learners, the earlier run's)")
    parser.add_argument("--memory-mb", type=integer(GRADER_MIN_MEMORY_MB, MAX_MEMORY_MB),
                        default=None,
                        help="memory of each notebook: the address space of each process and, "
                        "where a cgroup can be made, of the whole sandbox, in MB (at least "
                        f"{GRADER_MIN_MEMORY_MB}, what a kernel needs to start; default "
                        f"{GRADER_MEMORY_MB}; with --learners, the earlier run's)")
    parser.add_argument("--jobs", type=integer(1, MAX_JOBS), default=os.cpu_count() or 1,
                        help="notebooks graded at once (default: the CPU count)")
    parser.add_argument("--chapters", type=chapter_list, default=None,
                        help="comma-separated chapters to grade, e.g. 01,02 (default: every "
                        "chapter anyone handed in)")
    parser.add_argument("--seed", type=integer(0, MAX_SEED), default=None,
                        help="seed of the cases drawn fresh for this run (default: a new one, "
                        "printed in the summary); give an earlier run's seed to regrade it")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run kernels without bubblewrap, for submissions you trust (where "
                        "namespaces are unavailable); every row then says so")
    parser.add_argument("--feedback", type=Path, default=None, metavar="DIR",
                        help="write each learner's feedback page to DIR/<learner>.html and .md")
    parser.add_argument("--gradebook", type=Path, default=None, metavar="PATH",
                        help="write a gradebook CSV for an LMS: one row per learner, one column "
                        "per chapter and the total")
    parser.add_argument("--shard", type=shard_spec, default=None, metavar="K/N",
                        help="grade shard K of N of the learners (sorted by name, the i-th in "
                        "shard i mod N + 1); needs --seed; merge with grade-merge")
    parser.add_argument("--learners", type=learner_list, default=None, metavar="NAMES",
                        help="regrade only these comma-separated learners, updating their rows "
                        "in the existing --out (and its gradebook and feedback); needs the "
                        "earlier run's --seed")
    parser.set_defaults(run=run)
    merge = subparsers.add_parser(
        "grade-merge", help="merge the CSVs of grade --shard runs",
        description="Merge the CSVs (and summaries, gradebook, feedback pages) of the N shards "
        "of one grade --shard K/N run into the output one run over the whole class gives. "
        "Missing, duplicated or mismatched shards are refused. Exit status 0: merged; 2: "
        "refused.")
    merge.add_argument("out", type=Path, help="the merged CSV; its summary goes beside it")
    merge.add_argument("shards", type=Path, nargs="+", help="the shards' CSVs")
    merge.add_argument("--gradebook", type=Path, default=None, metavar="PATH",
                       help="write the class's gradebook CSV from the merged rows")
    merge.add_argument("--feedback", type=Path, default=None, metavar="DIR",
                       help="gather the shards' feedback pages (each shard graded with "
                       "--feedback) into DIR")
    merge.set_defaults(run=run_merge)


def _earlier(args: argparse.Namespace, csv_path: Path) -> tuple[Manifest, list[GradeRow]]:
    """For ``--learners``: the earlier run's manifest and rows (checked against it), once
    its seed, shard, chapters and limits agree with this one's; limits not given are the
    earlier run's."""
    from course_lib.grading.report import check_rows, manifest_path, read_csv, read_manifest

    manifest = read_manifest(manifest_path(csv_path))
    if args.seed != manifest.seed:
        raise UsageError(f"--seed {args.seed} differs from the seed {manifest.seed} of the run "
                         f"that wrote --out {str(args.out)!r}: regrade with --seed "
                         f"{manifest.seed}")
    if manifest.shard is not None:
        raise UsageError(f"--out {str(args.out)!r} is shard {manifest.shard}: merge the shards "
                         "with grade-merge, then regrade learners in the merged CSV")
    if args.chapters is not None and list(args.chapters) != manifest.chapters:
        raise UsageError(f"--chapters {','.join(args.chapters)} differs from the chapters "
                         f"{','.join(manifest.chapters)} of the run that wrote --out")
    for flag, name in (("--timeout", "timeout"), ("--memory-mb", "memory_mb")):
        given, then = getattr(args, name), getattr(manifest, name)
        if given is not None and given != then:
            raise UsageError(f"{flag} {given:g} differs from the {then:g} of the run that wrote "
                             f"--out {str(args.out)!r}: regrade with its limits")
        setattr(args, name, then)
    rows = read_csv(csv_path)
    check_rows(csv_path, rows, manifest)
    return manifest, rows


def run(args: argparse.Namespace) -> int:
    """Check the outputs, grade, write the CSV, summary, manifest and the views asked for,
    print the summary."""
    from tqdm.auto import tqdm

    from course_lib.grading.execute import Limits
    from course_lib.grading.feedback import write_feedback
    from course_lib.grading.grade import grade_folder, order_rows
    from course_lib.grading.gradebook import write_gradebook
    from course_lib.grading.report import (
        Manifest,
        extra_paths,
        folder_digest,
        manifest_path,
        output_paths,
        recorded,
        relative_to_csv,
        summary,
        write_csv,
    )
    from course_lib.grading.sandbox import SandboxUnavailable, check_available
    from course_lib.grading.submissions import printable

    if not args.submissions.is_dir():
        raise ValueError(f"submissions folder {str(args.submissions)!r} does not exist")
    csv_path, summary_path = output_paths(args.out, args.submissions)
    book, pages = extra_paths(args.gradebook, args.feedback, csv_path, args.submissions)
    for flag in ("--shard", "--learners"):
        if getattr(args, flag[2:]) is not None and args.seed is None:
            raise UsageError(f"{flag} needs --seed: every part of a class is graded with the "
                             "same fresh cases")
    if args.shard is not None and args.learners is not None:
        refuse_together("--shard", "--learners", "regrade learners in the merged CSV")
    earlier, kept = None, []
    if args.learners is not None:
        earlier, kept = _earlier(args, csv_path)
        book = book or recorded(earlier.gradebook, manifest_path(csv_path))
        pages = pages or recorded(earlier.feedback, manifest_path(csv_path))
    timeout = TIMEOUT_S if args.timeout is None else args.timeout
    memory_mb = GRADER_MEMORY_MB if args.memory_mb is None else args.memory_mb
    limits = Limits(timeout=timeout, memory_mb=memory_mb)
    chapters = earlier.chapters if earlier is not None else args.chapters
    try:
        if not args.no_sandbox:
            check_available()
        with tqdm(desc="grading", unit="notebook", file=sys.stderr) as bar:

            def tick(done: int, total: int) -> None:
                bar.total, bar.n = total, done
                bar.refresh()

            report = grade_folder(args.submissions, limits, args.jobs, chapters,
                                  seed=args.seed, sandbox=not args.no_sandbox, progress=tick,
                                  learners=args.learners, shard=args.shard)
    except SandboxUnavailable as error:
        print(f"error: cannot grade: {error}", file=sys.stderr)
        return 1
    rows, covered = report.rows, report.learners
    if earlier is not None:
        mine = set(report.learners)
        rows = order_rows([*(row for row in kept if row.learner not in mine), *report.rows])
        covered = sorted([*earlier.learners,
                          *(name for name in report.learners if name not in earlier.learners)])
    write_csv(rows, csv_path)
    text = summary(rows, report.seed, report.memory)
    summary_path.write_text(text + "\n", encoding="utf-8")
    if book is not None:
        write_gradebook(rows, report.chapters, covered, book)
    if pages is not None:
        write_feedback(report.rows, report.seed, pages, report.learners)
    Manifest(report.seed, report.memory, list(report.chapters),
             None if args.shard is None else "{}/{}".format(*args.shard), not args.no_sandbox,
             covered, len(report.everyone), folder_digest(report.everyone), timeout,
             memory_mb, relative_to_csv(book, csv_path), relative_to_csv(pages, csv_path),
             ).write(manifest_path(csv_path))
    print(text)
    print(f"\nwrote {csv_path} and {summary_path}"
          + (f", gradebook {book}" if book else "") + (f", feedback in {pages}" if pages else ""))
    for problem in report.problems:
        print(f"grading problem: {printable(problem)}", file=sys.stderr)
    return 1 if report.problems else 0


def run_merge(args: argparse.Namespace) -> int:
    """Merge the shards, print the merged summary."""
    from course_lib.grading.report import extra_paths, output_paths
    from course_lib.grading.shards import merge

    csv_path, summary_path = output_paths(args.out, None, "grade-merge's OUT")
    book, pages = extra_paths(args.gradebook, args.feedback, csv_path, None)
    merged = merge(csv_path, args.shards, book, pages)
    print(merged.text)
    print(f"\nmerged {len(args.shards)} shards into {csv_path} and {summary_path}"
          + (f", gradebook {book}" if book else "") + (f", feedback in {pages}" if pages else ""))
    return 0
