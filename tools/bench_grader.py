"""Grader speed against plain nbclient: the same solution notebooks, side by side, one run.

    python tools/bench_grader.py [--learners 20] [--jobs N]

Builds a class of ``--learners`` learners who each hand in every solution notebook, then
times (1) executing those notebooks once with nbclient, ``--jobs`` at a time, and (2)
``grade`` over the class with the same ``--jobs``, and prints both and their ratio (the
grader's budget is 1.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from course_lib.grading.execute import Limits
from course_lib.grading.grade import grade_folder

ROOT = Path(__file__).resolve().parent.parent


def build_class(folder: Path, learners: int) -> list[Path]:
    """``learners`` folders, each with a copy of every solution notebook."""
    copies = []
    for index in range(learners):
        learner = folder / f"learner{index:02d}"
        learner.mkdir(parents=True)
        for path in sorted((ROOT / "solutions").glob("*.ipynb")):
            copies.append(Path(shutil.copy(path, learner / path.name)))
    return copies


async def _execute_all(paths: list[Path], jobs: int) -> None:
    """Execute every notebook once with nbclient, at most ``jobs`` at a time."""
    gate = asyncio.Semaphore(jobs)

    async def one(path: Path) -> None:
        async with gate:
            notebook = nbformat.read(path, as_version=4)
            client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                                    allow_errors=True,
                                    resources={"metadata": {"path": str(path.parent)}})
            await client.async_execute()

    await asyncio.gather(*map(one, paths))


def main() -> None:
    """Build the class, time both, print the table."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench-grader-") as tmp:
        paths = build_class(Path(tmp) / "subs", args.learners)
        start = time.perf_counter()
        asyncio.run(_execute_all(paths, args.jobs))
        plain = time.perf_counter() - start
        start = time.perf_counter()
        report = grade_folder(Path(tmp) / "subs", Limits(timeout=600), args.jobs)
        graded = time.perf_counter() - start
    passed = sum(row.status == "passed" for row in report.rows)
    print(f"{'learners':>8} {'notebooks':>9} {'jobs':>4} {'nbclient s':>10} {'grader s':>9} "
          f"{'ratio':>6} {'passed':>7}")
    print(f"{args.learners:>8} {len(paths):>9} {args.jobs:>4} {plain:>10.1f} {graded:>9.1f} "
          f"{graded / plain:>6.2f} {passed:>3}/{len(report.rows)}")


if __name__ == "__main__":
    main()
