"""Child process of the grader: execute one notebook copy and save it with its outputs.

Run as ``python -m course_lib.grading.execute IN OUT --cell-timeout S``. Errors in cells are
recorded, not fatal (a learner's unsolved stub raises). The notebook is saved after every
cell, so when the grader stops a notebook that hangs, the checks that already ran count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError


def execute(source: Path, target: Path, cell_timeout: float) -> None:
    """Execute ``source`` in a fresh python3 kernel, writing the result to ``target``."""
    notebook = nbformat.read(source, as_version=4)
    for cell in notebook.cells:  # only what runs now may count, never stored outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(
        notebook, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(target.parent)}},
        on_cell_executed=lambda **_: nbformat.write(notebook, target),
    )
    try:
        client.execute()
    finally:
        nbformat.write(notebook, target)


def main() -> int:
    """Command-line entry for the grader's child process."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--cell-timeout", type=float, default=300.0)
    args = parser.parse_args()
    try:
        execute(args.source, args.target, args.cell_timeout)
    except DeadKernelError as error:
        print(f"kernel died: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
