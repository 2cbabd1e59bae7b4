"""Notebook pipeline: normalise, generate exercises from solutions, execute in place.

    python tools/notebooks.py normalize [NOTEBOOK ...]   # kernelspec, Colab header, metadata
    python tools/notebooks.py exercises [--force]        # solutions/ -> exercises/
    python tools/notebooks.py execute NOTEBOOK ...       # run and store outputs, then normalise
    python tools/notebooks.py check                      # fail if anything above is stale
    python tools/notebooks.py set-home OWNER/REPO        # move every badge and install cell

The course's home on GitHub is written once, as pyproject's ``Repository`` URL; every
Colab badge (notebooks and README) and every install cell is derived from it, and
``check`` fails when one disagrees.

``solutions/`` is the single source of the exercises: code between ``### BEGIN SOLUTION``
and ``### END SOLUTION`` becomes a stub that raises ``NotImplementedError``. An exercise
notebook records a hash of the sources it was generated with, so regeneration skips a file
the learner has changed unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("notebooks", "solutions", "exercises")
BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION(?::\s*(?P<prompt>.*\S))?\s*$")
END = re.compile(r"^[ \t]*### END SOLUTION\s*$")
STUB_TAGS = ("exercise", "raises-exception")
ANSWER_TAG = "uses-answer"
"""Tag for a solution cell that uses the learner's answer outside ``check``: in the exercise
notebook it is allowed to raise, so the unsolved notebook still runs top to bottom."""

BADGE_ID, INSTALL_ID = "colab-badge", "colab-install"
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


GITHUB = "https://github.com/"
HOME_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}")
README_BADGE = re.compile(
    r"https://colab\.research\.google\.com/github/(?P<home>[^/\s)]+/[^/\s)]+)/blob/main/"
    r"(?P<path>[^\s)]+\.ipynb)"
)


def repository(root: Path = ROOT) -> str:
    """``owner/name`` of the course on GitHub, read from pyproject's Repository URL."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    url = project["urls"]["Repository"]
    if not url.startswith(GITHUB):
        raise ValueError(f"pyproject's Repository URL {url!r} is not a {GITHUB} address")
    return url.removeprefix(GITHUB).strip("/")


def colab_url(relative_path: str, home: str) -> str:
    """The Colab address that opens ``relative_path`` from ``home``'s main branch."""
    return f"https://colab.research.google.com/github/{home}/blob/main/{relative_path}"


def badge_markdown(relative_path: str, home: str) -> str:
    """The "Open in Colab" badge for one notebook."""
    return (
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"({colab_url(relative_path, home)})"
    )


INSTALL_TEMPLATE = '''\
# In Colab, install the course library from its repository; elsewhere this does nothing.
import sys

if "google.colab" in sys.modules:
    import subprocess

    HOME = "{repository}"
    SOURCE = f"course_lib @ git+{{HOME}}"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", SOURCE],
                         capture_output=True, text=True)
    if pip.returncode:
        class CourseInstallFailed(Exception):
            def _render_traceback_(self):  # IPython shows this one line, no traceback
                return [str(self)]

        said = [line.strip() for line in pip.stderr.splitlines() if line.strip()] or ["no reason"]
        reason = next((s for s in said if s.startswith(("fatal:", "ERROR:"))), said[-1])
        raise CourseInstallFailed(
            f"Installing course_lib from {{HOME}} failed ({{reason}}). Open this notebook "
            f"from the course's published copy, or install it by hand: pip install '{{SOURCE}}'"
        )'''


def install_source(home: str) -> str:
    """The first code cell: installs course_lib in Colab, does nothing anywhere else.

    Nothing Colab ships is replaced (pyproject's lower bounds), so the runtime needs no
    restart. When pip fails (the repository cannot be reached, say) the cell ends in one
    line that says what failed and what to do, and "Run all" stops there.
    """
    return INSTALL_TEMPLATE.format(repository=GITHUB + home)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
"""A live widget's output. No widget state is stored, so a stored one can never render:
every viewer shows the output's text form instead, and the normal form keeps only that."""


def normalized(nb: nbformat.NotebookNode, relative_path: str, home: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` with the course's header cells (for the course at ``home``),
    kernelspec, clean metadata and no stored widget views."""
    nb = copy.deepcopy(nb)
    body = [c for c in nb.cells if c.get("id") not in (BADGE_ID, INSTALL_ID)]
    badge = nbformat.v4.new_markdown_cell(badge_markdown(relative_path, home), id=BADGE_ID)
    install = nbformat.v4.new_code_cell(install_source(home), id=INSTALL_ID)
    old_install = next((c for c in nb.cells if c.get("id") == INSTALL_ID), None)
    if old_install is not None and old_install.get("execution_count") is not None:
        install.execution_count = old_install.execution_count
    nb.cells = [badge, install, *body]
    kept = {k: v for k, v in nb.metadata.items() if k == "course_lib"}
    nb.metadata = nbformat.NotebookNode(
        kernelspec=KERNELSPEC, language_info={"name": "python"}, **kept
    )
    for index, cell in enumerate(nb.cells):
        if cell.get("id") not in (BADGE_ID, INSTALL_ID):
            cell["id"] = f"cell-{index:03d}"
        tags = cell.get("metadata", {}).get("tags")
        cell["metadata"] = nbformat.NotebookNode({"tags": tags} if tags else {})
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET_VIEW, None)
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def stub_source(source: str, exercise_hint: str) -> tuple[str, bool]:
    """Replace each marked solution region with a stub; return (source, any replaced)."""
    out: list[str] = []
    lines = source.splitlines()
    replaced, inside = False, False
    for line in lines:
        begin = BEGIN.match(line)
        if begin and not inside:
            inside, replaced = True, True
            indent, prompt = begin.group("indent"), begin.group("prompt") or exercise_hint
            out.append(f"{indent}# YOUR CODE HERE: {prompt}")
            out.append(f'{indent}raise NotImplementedError("{prompt}")')
        elif END.match(line) and inside:
            inside = False
        elif begin or END.match(line):
            raise ValueError(f"unbalanced solution markers at line {line!r}")
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without ### END SOLUTION")
    return "\n".join(out), replaced


def sources_hash(nb: nbformat.NotebookNode) -> str:
    """sha256 of the cell types and sources: what a learner edits."""
    payload = json.dumps([[c.cell_type, c.source] for c in nb.cells])
    return hashlib.sha256(payload.encode()).hexdigest()


def exercise_from_solution(
    solution: nbformat.NotebookNode, name: str, home: str
) -> nbformat.NotebookNode:
    """The exercise notebook for ``solutions/<name>``: stubs, tags, no outputs."""
    nb = copy.deepcopy(solution)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source, replaced = stub_source(cell.source, "replace this line with your solution")
        cell.outputs, cell.execution_count = [], None
        tags = list(cell.get("metadata", {}).get("tags", []))
        if replaced or ANSWER_TAG in tags:
            tags = [t for t in tags if t != ANSWER_TAG]
            tags += [t for t in STUB_TAGS if t not in tags]
        cell.metadata = nbformat.NotebookNode({"tags": tags} if tags else {})
    nb = normalized(nb, f"exercises/{name}", home)
    nb.metadata["course_lib"] = {
        "generated_from": f"solutions/{name}", "sources_sha256": sources_hash(nb),
    }
    return nb


def dumps(nb: nbformat.NotebookNode) -> str:
    """The canonical text of a notebook file (sorted keys, one-space indent)."""
    return nbformat.writes(nb) + "\n"


def learner_changed(path: Path) -> bool:
    """True if an existing exercise notebook's sources differ from what was generated."""
    nb = nbformat.read(path, as_version=4)
    recorded = nb.metadata.get("course_lib", {}).get("sources_sha256")
    return recorded is not None and recorded != sources_hash(nb)


def generate_exercises(force: bool = False, root: Path = ROOT) -> list[str]:
    """Write ``exercises/`` from ``solutions/``; return messages about what was done."""
    messages, home = [], repository(root)
    (root / "exercises").mkdir(exist_ok=True)
    for solution_path in sorted((root / "solutions").glob("*.ipynb")):
        relative = f"exercises/{solution_path.name}"
        target = root / relative
        exercise = exercise_from_solution(
            nbformat.read(solution_path, as_version=4), solution_path.name, home
        )
        text = dumps(exercise)
        if target.exists() and target.read_text() == text:
            continue
        if target.exists() and learner_changed(target) and not force:
            messages.append(f"skipped {relative}: you changed it (use --force to overwrite)")
            continue
        target.write_text(text)
        messages.append(f"wrote {relative}")
    return messages


def stale_files(root: Path = ROOT) -> list[str]:
    """Notebooks (and README badges) that differ from what normalise / the generator /
    ``set-home`` would write."""
    stale, home = readme_problems(root), repository(root)
    for folder in ("notebooks", "solutions"):
        for path in sorted((root / folder).glob("*.ipynb")):
            relative = f"{folder}/{path.name}"
            nb = nbformat.read(path, as_version=4)
            if path.read_text() != dumps(normalized(nb, relative, home)):
                stale.append(f"{relative} is not normalised")
    solutions = {p.name for p in (root / "solutions").glob("*.ipynb")}
    for path in sorted((root / "solutions").glob("*.ipynb")):
        relative = f"exercises/{path.name}"
        target = root / relative
        solution = nbformat.read(path, as_version=4)
        expected = dumps(exercise_from_solution(solution, path.name, home))
        if not target.exists() or target.read_text() != expected:
            stale.append(f"{relative} is stale: regenerate it from solutions/")
    stale += [
        f"exercises/{p.name} has no solution" for p in sorted((root / "exercises").glob("*.ipynb"))
        if p.name not in solutions
    ]
    return stale


def normalize_files(paths: list[Path], root: Path = ROOT) -> None:
    """Rewrite each notebook in its normal form."""
    home = repository(root)
    for path in paths:
        relative = path.resolve().relative_to(root.resolve()).as_posix()
        path.write_text(dumps(normalized(nbformat.read(path, as_version=4), relative, home)))


def readme_with_home(text: str, home: str) -> str:
    """The README's text with every Colab badge pointing at ``home``."""
    return README_BADGE.sub(lambda m: colab_url(m["path"], home), text)


def readme_problems(root: Path = ROOT) -> list[str]:
    """README badges that name another home than pyproject's, or a notebook that is not
    there."""
    text, home = (root / "README.md").read_text(), repository(root)
    problems = [
        f"README.md: the badge for {m['path']} names {m['home']}, pyproject says {home} "
        f"(run: python tools/notebooks.py set-home {home})"
        for m in README_BADGE.finditer(text) if m["home"] != home
    ]
    problems += [
        f"README.md: the badge for {m['path']} opens a notebook that does not exist"
        for m in README_BADGE.finditer(text) if not (root / m["path"]).is_file()
    ]
    return problems


def home_name(text: str) -> str:
    """A ``type=`` for ``set-home``: ``OWNER/REPO`` as GitHub spells a repository."""
    if not HOME_NAME.fullmatch(text) or text.endswith(".git") or ".." in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a GitHub repository as OWNER/REPO (e.g. my-org/paged-attention)"
        )
    return text


def set_home(home: str, root: Path = ROOT) -> list[str]:
    """Make ``home`` the course's repository: pyproject's URL, then every badge and install
    cell (notebooks, solutions, exercises, README) rewritten from it."""
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    line = re.compile(r'^Repository = "[^"]*"$', re.MULTILINE)
    if len(line.findall(text)) != 1:
        raise ValueError(f"{pyproject} has no single 'Repository = \"...\"' line to rewrite")
    pyproject.write_text(line.sub(f'Repository = "{GITHUB}{home}"', text))
    normalize_files(_all_sources(root), root)
    messages = generate_exercises(root=root)
    readme = root / "README.md"
    readme.write_text(readme_with_home(readme.read_text(), home))
    return [f"home is now {GITHUB}{home}", *messages]


def execute_files(paths: list[Path], timeout: int = 600) -> None:
    """Execute notebooks in place (outputs stored), in their own folder, then normalise."""
    from nbclient import NotebookClient

    for path in paths:
        print(f"executing {path} ...", flush=True)
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        path.write_text(dumps(nb))
    normalize_files(paths)


def _all_sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for folder in FOLDERS[:2] for p in (root / folder).glob("*.ipynb"))


def notebook_file(text: str) -> Path:
    """A ``type=`` for a notebook argument: an existing ``.ipynb`` file in this repository."""
    path = Path(text)
    if not path.is_file() or path.suffix != ".ipynb":
        raise argparse.ArgumentTypeError(f"{text!r} is not an existing .ipynb file")
    if not path.resolve().is_relative_to(ROOT):
        raise argparse.ArgumentTypeError(f"{text!r} is outside this repository ({ROOT})")
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; a notebook that cannot be read ends in one line, status 2."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("normalize").add_argument("paths", nargs="*", type=notebook_file)
    sub.add_parser("exercises").add_argument("--force", action="store_true")
    sub.add_parser("execute").add_argument("paths", nargs="*", type=notebook_file)
    sub.add_parser("check")
    sub.add_parser("set-home").add_argument("home", type=home_name, metavar="OWNER/REPO")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (OSError, ValueError) as error:  # unreadable file, not JSON, not a notebook
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    """Carry out the parsed action; the exit status."""
    if args.action == "normalize":
        normalize_files(args.paths or _all_sources())
    elif args.action == "exercises":
        print("\n".join(generate_exercises(force=args.force)) or "exercises/ is up to date")
    elif args.action == "execute":
        execute_files(args.paths or _all_sources())
    elif args.action == "set-home":
        print("\n".join(set_home(args.home)))
    else:
        stale = stale_files()
        print("\n".join(stale) or "all notebooks are normalised and exercises/ is up to date")
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
