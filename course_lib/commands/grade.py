"""``grade``: the instructor's score table for a folder of submitted exercise notebooks."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``grade`` parser."""
    parser = subparsers.add_parser(
        "grade", help="grade submitted exercise notebooks",
        description="Execute SUBMISSIONS/<learner>/NN_*.ipynb copies, each in its own process "
        "with a time limit, and write one CSV row per learner and exercise.",
    )
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder per learner")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="CSV to write")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a notebook may run before it is stopped")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Grade, write the CSV and a readable summary beside it, and print the summary."""
    from course_lib.grading.grade import grade_folder, summary, write_csv

    rows = grade_folder(args.submissions, args.timeout)
    write_csv(rows, args.out)
    text = summary(rows)
    args.out.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"\nwrote {args.out} and {args.out.with_suffix('.txt')}")
    return 0
