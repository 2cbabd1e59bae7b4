"""The course's two set-up commands, for a fresh machine that has only Python 3.11+.

    python3 tools/course.py lab      # install into .venv, open JupyterLab on chapter 00
    python3 tools/course.py test     # install into .venv, run the whole test suite
    python3 tools/course.py install  # only the install both of them begin with
    python3 tools/course.py grade SUBMISSIONS/ --out grades.csv   # instructors

Both create ``.venv`` beside this repository and install ``course_lib`` with its dev extra
under ``requirements/constraints.txt``: the tested set of versions. It pins torch==2.13.0,
which resolves to the CPU wheel on the course's CI machines (their pip finds it on disk)
and to PyPI's default build everywhere else (CUDA on Linux, so a learner's GPU works).
An install is skipped when nothing it depends on has changed since the last one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")


def _run(*command: str | Path, cwd: Path = ROOT) -> None:
    """Run a command (from the repository root unless told); stop with its exit status if
    it fails."""
    print("+", " ".join(str(c) for c in command), flush=True)
    status = subprocess.call([str(c) for c in command], cwd=cwd)
    if status:
        sys.exit(status)


def install() -> None:
    """Create .venv and install the course into it unless it is already up to date."""
    if sys.version_info < (3, 11):  # noqa: UP036 - this script may be run by an older Python
        sys.exit(f"Python 3.11 or newer is needed, this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    inputs = b"".join(p.read_bytes() for p in (ROOT / "pyproject.toml", CONSTRAINTS))
    stamp, digest = VENV / ".course-installed", hashlib.sha256(inputs).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    _run(PYTHON, "-m", "pip", "install", "--upgrade", "pip")
    _run(PYTHON, "-m", "pip", "install", "-c", CONSTRAINTS, "-e", ".[dev]")
    stamp.write_text(digest)


def lab() -> None:
    """Open JupyterLab on the first chapter."""
    install()
    as_root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    # Serve the whole course (lectures, exercises, solutions), opening chapter 00.
    _run(BIN / "jupyter", "lab", f"--ServerApp.root_dir={ROOT}",
         "--ServerApp.default_url=/lab/tree/notebooks/00_start_here.ipynb", *as_root)


def test() -> None:
    """Lint, check the notebook pipeline, then run every test including nbval."""
    install()
    _run(BIN / "ruff", "check", ".")
    _run(PYTHON, "tools/notebooks.py", "check")
    # One worker per core; --dist loadfile keeps a notebook's cells (and a test file's
    # module fixtures) in one worker. Files go out in the order given: xdist's default puts
    # the files with the fewest tests (the browser's and the GPU check's, the longest) last,
    # leaving one worker alone for the run's last half minute.
    _run(PYTHON, "-m", "pytest", "tests", "notebooks", "solutions", "-n", "auto",
         "--dist", "loadfile", "--no-loadscope-reorder", "--durations", "15",
         "--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/sanitize.cfg")


def grade(*arguments: str) -> None:
    """Grade a class: ``python -m course_lib grade ARGUMENTS`` in .venv, from this folder."""
    install()
    _run(PYTHON, "-m", "course_lib", "grade", *arguments, cwd=Path.cwd())


def main() -> None:
    """Dispatch ``lab``, ``test``, ``install`` or ``grade ARGUMENTS``."""
    usage = f"usage: python3 {Path(__file__).relative_to(ROOT)} {{lab,test,install,grade ...}}"
    if len(sys.argv) >= 2 and sys.argv[1] == "grade":
        grade(*sys.argv[2:])
    elif len(sys.argv) == 2 and sys.argv[1] in ("lab", "test", "install"):
        {"lab": lab, "test": test, "install": install}[sys.argv[1]]()
    else:
        sys.exit(usage)


if __name__ == "__main__":
    main()
