"""``grade``: the instructor's score table for a folder of submitted exercise notebooks."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


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
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a notebook may run before its whole process tree is killed")
    parser.add_argument("--memory-mb", type=int, default=4096,
                        help="address-space limit of each notebook's kernel, in MB")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded at once (default: the CPU count)")
    parser.add_argument("--chapters", default=None,
                        help="comma-separated chapters to grade, e.g. 01,02 (default: all)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check --out, grade, write the CSV and the summary, print the summary."""
    from tqdm.auto import tqdm

    from course_lib.grading import GRADED_CHAPTERS
    from course_lib.grading.execute import Limits
    from course_lib.grading.grade import grade_folder
    from course_lib.grading.report import output_paths, summary, write_csv

    csv_path, summary_path = output_paths(args.out, args.submissions)
    chapters = tuple(args.chapters.split(",")) if args.chapters else GRADED_CHAPTERS
    limits = Limits(timeout=args.timeout, memory_mb=args.memory_mb)
    with tqdm(desc="grading", unit="notebook", file=sys.stderr) as bar:

        def tick(done: int, total: int) -> None:
            bar.total, bar.n = total, done
            bar.refresh()

        report = grade_folder(args.submissions, limits, args.jobs, chapters, tick)
    write_csv(report.rows, csv_path)
    text = summary(report.rows)
    summary_path.write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"\nwrote {csv_path} and {summary_path}")
    for problem in report.problems:
        print(f"grading problem: {problem}", file=sys.stderr)
    return 1 if report.problems else 0
