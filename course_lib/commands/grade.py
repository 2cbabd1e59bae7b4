"""``grade``: the instructor's score table for a folder of submitted exercise notebooks."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from course_lib.commands import integer, number
from course_lib.limits import GRADER_MEMORY_MB, GRADER_MIN_MEMORY_MB

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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``grade`` parser."""
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
    parser.add_argument("--timeout", type=number(0, MAX_TIMEOUT_S, above=True), default=300.0,
                        help="seconds a notebook may run before its whole process tree is killed")
    parser.add_argument("--memory-mb", type=integer(GRADER_MIN_MEMORY_MB, MAX_MEMORY_MB),
                        default=GRADER_MEMORY_MB,
                        help="memory of each notebook: the address space of each process and, "
                        "where a cgroup can be made, of the whole sandbox, in MB (at least "
                        f"{GRADER_MIN_MEMORY_MB}, what a kernel needs to start)")
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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check --out, grade, write the CSV and the summary, print the summary."""
    from tqdm.auto import tqdm

    from course_lib.grading.execute import Limits
    from course_lib.grading.grade import grade_folder
    from course_lib.grading.report import output_paths, summary, write_csv
    from course_lib.grading.sandbox import SandboxUnavailable, check_available
    from course_lib.grading.submissions import printable

    if not args.submissions.is_dir():
        raise ValueError(f"submissions folder {str(args.submissions)!r} does not exist")
    csv_path, summary_path = output_paths(args.out, args.submissions)
    limits = Limits(timeout=args.timeout, memory_mb=args.memory_mb)
    try:
        if not args.no_sandbox:
            check_available()
        with tqdm(desc="grading", unit="notebook", file=sys.stderr) as bar:

            def tick(done: int, total: int) -> None:
                bar.total, bar.n = total, done
                bar.refresh()

            report = grade_folder(args.submissions, limits, args.jobs, args.chapters,
                                  seed=args.seed, sandbox=not args.no_sandbox, progress=tick)
    except SandboxUnavailable as error:
        print(f"error: cannot grade: {error}", file=sys.stderr)
        return 1
    write_csv(report.rows, csv_path)
    text = summary(report.rows, report.seed, report.memory)
    summary_path.write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"\nwrote {csv_path} and {summary_path}")
    for problem in report.problems:
        print(f"grading problem: {printable(problem)}", file=sys.stderr)
    return 1 if report.problems else 0
