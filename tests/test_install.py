"""The README's install holds on every Python it names.

The constraints resolve for each supported Python without installing anything (pip's
``--python-version`` with ``--dry-run``: only the index and the packages' metadata are
read), and where this machine has a second interpreter, the README's install runs with it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
SUPPORTED = ("3.11.0", "3.12", "3.13", "3.14")
"""The Pythons the README names: the lowest 3.11 to the newest with a torch 2.13.0 wheel."""
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + [
    "manylinux2014_x86_64", "linux_x86_64",
]
LEFT_TO_TORCH = re.compile(r"(triton|setuptools|nvidia-.*|cuda-.*)")
"""What the constraints leave to torch: triton, and the CUDA build's own packages."""


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def pins() -> dict[str, str]:
    """The constraints file as ``{normalised name: version}``."""
    lines = (line.split("#")[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return {_name(n): v for n, v in (line.split("==") for line in lines if line)}


def requirements() -> list[str]:
    """The course's own requirements, with its dev extra: what ``.[dev]`` asks for."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"]]


def resolve(python: str, tmp_path: Path) -> dict[str, str]:
    """What pip would install for ``.[dev]`` under the constraints on CPython ``python``
    (Linux x86-64); raises AssertionError with pip's reason when it cannot."""
    report, wanted = tmp_path / f"report-{python}.json", tmp_path / f"wanted-{python}.txt"
    wanted.write_text("\n".join(requirements()) + "\n")
    platforms = [f"--platform={p}" for p in PLATFORMS]
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--only-binary=:all:", f"--python-version={python}", "--implementation=cp",
         *platforms, "-c", CONSTRAINTS, "-r", wanted, "--report", report],
        capture_output=True, text=True, timeout=500,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert result.returncode == 0, f"Python {python}: " + "\n".join(errors[-6:])
    installed = json.loads(report.read_text())["install"]
    return {_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installed}


def test_constraints_resolve_on_every_supported_python(tmp_path: Path) -> None:
    pinned = pins()
    with ThreadPoolExecutor(len(SUPPORTED)) as pool:
        resolved_sets = pool.map(lambda python: resolve(python, tmp_path), SUPPORTED)
        chosen = dict(zip(SUPPORTED, resolved_sets, strict=True))
    for python, resolved in chosen.items():
        unpinned = sorted(
            n for n in resolved if n not in pinned and not LEFT_TO_TORCH.fullmatch(n)
        )
        assert unpinned == [], f"Python {python} installs packages the constraints do not pin"
        for name, version in resolved.items():
            assert pinned.get(name, version).split("+")[0] == version.split("+")[0], name


def test_a_pin_that_needs_a_newer_python_is_caught(tmp_path: Path) -> None:
    """The check above can fail: soupsieve 4.1.3 (the pin before) needs Python 3.11.5."""
    held_back = tmp_path / "constraints.txt"
    held_back.write_text(CONSTRAINTS.read_text().replace("soupsieve==2.10", "soupsieve==4.1.3"))

    def resolves_on(python: str) -> bool:
        return subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
             "--quiet", "--only-binary=:all:", f"--python-version={python}", "--no-deps",
             "-c", held_back, "soupsieve"],
            capture_output=True, timeout=300,
        ).returncode == 0

    assert not resolves_on("3.11.0") and resolves_on("3.11.5")


def second_interpreter() -> tuple[Path, str] | None:
    """Another Python 3.11+ on this machine than the one running the tests (Debian's own,
    3.11.2 on the course's machines), and its version; or None."""
    for candidate in (Path("/usr/bin/python3.11"), Path("/usr/bin/python3")):
        if not candidate.is_file():
            continue
        version = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:3] >= (3, 11), sys.version)"],
            capture_output=True, text=True,
        ).stdout.split()
        if version and version[0] == "True" and version[1] != sys.version.split()[0]:
            return candidate, version[1]
    return None


OTHER_PYTHON = second_interpreter()


def tracked_copy(destination: Path) -> Path:
    """The checkout's files (tracked, and untracked ones git does not ignore) copied to
    ``destination``: a fresh clone of the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")
    for relative in filter(None, listed):
        source = ROOT / relative
        if source.is_file():
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / relative)
    return destination


@pytest.mark.skipif(OTHER_PYTHON is None, reason="no second Python 3.11+ here")
def test_readme_install_with_the_machines_other_python(tmp_path: Path) -> None:
    python, version = OTHER_PYTHON
    clone = tracked_copy(tmp_path / "clone")
    try:
        installed_and_working(python, version, clone, tmp_path)
    finally:
        shutil.rmtree(clone, ignore_errors=True)  # over a gigabyte: not kept for three runs


def installed_and_working(python: Path, version: str, clone: Path, tmp_path: Path) -> None:
    """Run the README's install in ``clone`` with ``python``; check the result works."""
    result = subprocess.run([python, "tools/course.py", "install"], cwd=clone,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    venv_python = clone / ".venv" / "bin" / "python"
    check = subprocess.run([venv_python, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    smoke = subprocess.run(
        [venv_python, "-m", "course_lib", "kv-size", "--layers", "32", "--kv-heads", "8",
         "--head-dim", "128", "--dtype", "fp16", "--json"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert smoke.returncode == 0 and json.loads(smoke.stdout)["bytes_per_token"] == 131072
    installed = subprocess.run(
        [venv_python, "-c", "import sys, course_lib, nbval, jupyterlab, torch; "
         "print(sys.version.split()[0], course_lib.__file__)"],
        capture_output=True, text=True, cwd=tmp_path,
    ).stdout.split()
    assert installed[0] == version
    assert Path(installed[1]).is_relative_to(clone)
