"""The course in an environment pinned like Google Colab's.

Colab ships IPython 7.34, traitlets 5.7, ipykernel 6.17, jupyter_client 7, ipywidgets 7.7.1,
numpy 2.0, matplotlib 3.10 (``requirements/colab.txt``). The README promises that the
notebooks' first cell replaces none of it, and every notebook runs there; the first cell,
when the repository cannot be reached, ends in one line that says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.test_install import tracked_copy
from tools import notebooks as pipeline

ROOT = pipeline.ROOT
COLAB = ROOT / "requirements" / "colab.txt"
SANITIZE_SVG = """
[svg-coordinates]
regex: ="[^"]*\\d\\.\\d+[^"]*"
replace: ="<coordinates>"
"""
"""Matplotlib 3.10 places SVG text a thousandth of a pixel off 3.11's stored figures; in
this run only, coordinates inside SVG attributes are not compared."""
IN_COLAB_OFFLINE = {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
                    "GIT_TERMINAL_PROMPT": "0", "PIP_NO_INDEX": "1"}
"""A Colab whose network refuses every connection (a closed port), so the install fails."""


def freeze(python: Path) -> dict[str, str]:
    """``{name: version}`` of what is installed for ``python``."""
    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, check=True).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(listed)}


@pytest.fixture(scope="module")
def colab(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, dict[str, str], dict[str, str]]]:
    """A Colab-like environment with the course installed as the first cell installs it:
    its python, and what it held before and after."""
    home = tmp_path_factory.mktemp("colab")
    venv.EnvBuilder(with_pip=True).create(home / "venv")
    python = home / "venv" / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-compile", "-r", COLAB],
                   check=True, capture_output=True, timeout=900)
    before = freeze(python)
    clone = tracked_copy(home / "clone")
    # The first cell's command, with this checkout in place of the repository on GitHub.
    subprocess.run([python, "-m", "pip", "install", "-q", f"course_lib @ {clone.as_uri()}"],
                   check=True, capture_output=True, timeout=600)
    yield python, before, freeze(python)
    shutil.rmtree(home, ignore_errors=True)  # over a gigabyte: not kept for three runs


def kernelspec(folder: Path, name: str, python: Path, env: dict[str, str]) -> Path:
    """A Jupyter data folder with one kernel: ``python``'s ipykernel, where any warning
    raised from the course's code or a notebook cell is an error, whatever its category
    (dependencies' warnings keep Colab's default filters)."""
    strict = "import warnings; warnings.filterwarnings('error', module='course_lib|__main__')"
    spec = {"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     f"--IPKernelApp.exec_lines={strict}"],
            "display_name": name, "language": "python", "env": env}
    (folder / "kernels" / name).mkdir(parents=True)
    (folder / "kernels" / name / "kernel.json").write_text(json.dumps(spec))
    return folder


@pytest.mark.timeout(1800)
def test_installing_the_course_replaces_nothing_colab_ships(colab) -> None:
    _, before, after = colab
    changed = {n: (v, after.get(n)) for n, v in before.items() if after.get(n) != v}
    assert changed == {}
    assert set(after) - set(before) == {"course_lib"}
    assert after["ipython"] == "7.34.0" and after["ipywidgets"] == "7.7.1"


@pytest.mark.timeout(1800)
def test_every_notebook_passes_in_colab(colab, tmp_path: Path) -> None:
    python = colab[0]
    for folder in ("notebooks", "solutions"):
        (tmp_path / folder).mkdir()
        for path in (ROOT / folder).glob("*.ipynb"):
            (tmp_path / folder / path.name).write_bytes(path.read_bytes())
    sanitize = tmp_path / "sanitize.cfg"
    sanitize.write_text((ROOT / "tests" / "sanitize.cfg").read_text() + SANITIZE_SVG)
    data = kernelspec(tmp_path / "jupyter", "colab", python, {})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval",
         "--nbval-kernel-name", "colab", "--nbval-sanitize-with", sanitize,
         "-n", "2", "--dist", "loadfile", "notebooks", "solutions"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1500,
        env={**os.environ, "JUPYTER_PATH": str(data)},
    )
    assert result.returncode == 0, result.stdout[-4000:]


def test_the_first_cell_fails_in_one_line_and_stops_run_all(
    colab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = colab[0]
    fake = tmp_path / "fake" / "google"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "colab.py").write_text('"""Stands in for Colab\'s module: the cell looks for it."""\n')
    env = {**IN_COLAB_OFFLINE, "PYTHONPATH": str(fake.parent)}
    data = kernelspec(tmp_path / "jupyter", "colab-offline", python, env)
    nb = nbformat.read(ROOT / "notebooks" / "01_kv_cache_arithmetic.ipynb", as_version=4)
    nb.cells[1].source = "import google.colab\n" + nb.cells[1].source
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    client = NotebookClient(nb, kernel_name="colab-offline", timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError):
        client.execute()
    errors = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    assert len(errors) == 1 and len(errors[0].traceback) == 1
    line = errors[0].traceback[0]
    home = pipeline.repository()
    assert line.startswith(f"Installing course_lib from https://github.com/{home} failed (")
    assert "Failed to connect" in line or "unable to access" in line, line
    assert line.endswith(f"pip install 'course_lib @ git+https://github.com/{home}'")
    assert all(cell.execution_count is None for cell in nb.cells[2:] if cell.cell_type == "code")


@pytest.mark.parametrize("module", ["__main__", "course_lib.viz.fake"])
def test_a_warning_from_the_course_or_a_cell_fails_the_colab_run(
    colab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """The net the notebooks run under catches a warning raised from the course's code or
    a cell, even one that Colab's default filters would hide."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernelspec(tmp_path, "colab", colab[0], {})))
    warn = "import warnings\nwarnings.warn('deprecated', DeprecationWarning)"
    source = f"exec(compile({warn!r}, 'code.py', 'exec'), {{'__name__': {module!r}}})"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    with pytest.raises(CellExecutionError, match="DeprecationWarning"):
        NotebookClient(nb, kernel_name="colab", timeout=120).execute()
