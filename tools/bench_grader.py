"""Grader speed against plain nbclient: the same solution notebooks, side by side, one run.

    python tools/bench_grader.py [--learners 20] [--chapters 01,02] [--jobs N]

Builds a class of ``--learners`` learners who each hand in the solution notebook of every
chapter in ``--chapters`` (default: every graded chapter), then times (1) executing those
notebooks once with plain nbclient (no sandbox, no harvest), ``--jobs`` at a time, and (2)
``grade`` over the class with the same ``--jobs`` (sandboxed, judged), and prints both wall
times, the ratio (the grader's budget is 1.5x) and notebooks per minute of each.
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

from course_lib.commands.grade import chapter_list
from course_lib.grading import GRADED_CHAPTERS
from course_lib.grading.execute import Limits
from course_lib.grading.grade import grade_folder

ROOT = Path(__file__).resolve().parent.parent


def build_class(folder: Path, learners: int, chapters: tuple[str, ...]) -> list[Path]:
    """``learners`` folders, each with a copy of the solution notebook of each chapter."""
    copies = []
    for index in range(learners):
        learner = folder / f"learner{index:02d}"
        learner.mkdir(parents=True)
        for path in sorted((ROOT / "solutions").glob("*.ipynb")):
            if path.name[:2] in chapters:
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


def positive(text: str) -> int:
    """A ``type=`` for a count of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def main() -> None:
    """Build the class, time both, print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", type=positive, default=20)
    parser.add_argument("--chapters", type=chapter_list, default=GRADED_CHAPTERS)
    parser.add_argument("--jobs", type=positive, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench-grader-") as tmp:
        paths = build_class(Path(tmp) / "subs", args.learners, args.chapters)
        start = time.perf_counter()
        asyncio.run(_execute_all(paths, args.jobs))
        plain = time.perf_counter() - start
        start = time.perf_counter()
        report = grade_folder(Path(tmp) / "subs", Limits(timeout=600), args.jobs,
                              args.chapters, seed=0)
        graded = time.perf_counter() - start
    passed = sum(row.status == "passed" for row in report.rows)
    count = len(paths)
    print(f"{args.learners} learners x chapters {','.join(args.chapters)} = {count} notebooks, "
          f"--jobs {args.jobs}")
    print(f"{'':<10} {'wall s':>8} {'notebooks/min':>14}")
    for name, seconds in (("nbclient", plain), ("grader", graded)):
        print(f"{name:<10} {seconds:>8.1f} {60 * count / seconds:>14.1f}")
    print(f"ratio grader/nbclient {graded / plain:.2f} (budget 1.50); "
          f"{passed}/{len(report.rows)} exercise rows passed")


if __name__ == "__main__":
    main()
