"""The notebook pipeline: normal form, generated exercises, and unsolved notebooks that run."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_lib.grading import CHECK_MIME, chapter_exercises
from tools import notebooks as pipeline

ROOT = pipeline.ROOT
ALL = sorted(p for f in pipeline.FOLDERS for p in (ROOT / f).glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def test_nothing_is_stale() -> None:
    assert pipeline.stale_files() == []


def test_exercises_mirror_solutions() -> None:
    solutions = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))
    assert [p.name for p in EXERCISES] == solutions


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_header_kernelspec_and_metadata(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert set(nb.metadata) <= {"kernelspec", "language_info", "course_lib"}
    badge, install = nb.cells[0], nb.cells[1]
    assert badge.cell_type == "markdown" and "colab.research.google.com/github/" in badge.source
    assert f"/blob/main/{path.parent.name}/{path.name}" in badge.source
    assert install.cell_type == "code" and '"google.colab" in sys.modules' in install.source
    assert not install.get("outputs")


def test_the_normal_form_keeps_a_widgets_text_not_its_live_view() -> None:
    """No widget state is stored, so a stored live view could never render: every viewer
    (GitHub, JupyterLab unrun, Colab) shows the text form, the one thing kept."""
    nb = nbformat.v4.new_notebook()
    output = nbformat.v4.new_output("display_data", data={
        pipeline.WIDGET_VIEW: {"model_id": "0" * 32, "version_major": 2, "version_minor": 0},
        "text/plain": "traces: 100% 6/6 it"})
    nb.cells = [nbformat.v4.new_code_cell("bar()", outputs=[output])]
    kept = pipeline.normalized(nb, "notebooks/x.ipynb", "owner/course")
    assert [c.outputs[0].data for c in kept.cells if c.get("outputs")] == [
        {"text/plain": "traces: 100% 6/6 it"}]


def test_stub_replaces_region_and_keeps_indentation() -> None:
    source = (
        "def f(x):\n    ### BEGIN SOLUTION: double it\n    return 2 * x\n    ### END SOLUTION\n"
    )
    stubbed, replaced = pipeline.stub_source(source, "fallback")
    assert replaced
    assert stubbed == (
        "def f(x):\n    # YOUR CODE HERE: double it\n    raise NotImplementedError(\"double it\")"
    )
    with pytest.raises(ValueError, match="without"):
        pipeline.stub_source("### BEGIN SOLUTION\nx = 1\n", "p")


def test_no_solution_code_leaks_into_exercises() -> None:
    for path in EXERCISES:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            assert "BEGIN SOLUTION" not in cell.source and "END SOLUTION" not in cell.source
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None


def test_generator_keeps_a_learners_changes_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "solutions").mkdir()
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    name = "01_kv_cache_arithmetic.ipynb"
    (tmp_path / "solutions" / name).write_text((ROOT / "solutions" / name).read_text())
    assert pipeline.generate_exercises(root=tmp_path) == [f"wrote exercises/{name}"]
    target = tmp_path / "exercises" / name
    nb = nbformat.read(target, as_version=4)
    nb.cells[-1].source += "\n# my own note"
    nbformat.write(nb, target)
    edited = target.read_text()
    assert "you changed it" in pipeline.generate_exercises(root=tmp_path)[0]
    assert target.read_text() == edited
    assert pipeline.generate_exercises(root=tmp_path, force=True) == [f"wrote exercises/{name}"]
    assert "# my own note" not in target.read_text()


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_unsolved_exercise_runs_and_reports_not_yet_solved(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    statuses = {
        out["data"][CHECK_MIME]["exercise"]: out["data"][CHECK_MIME]["status"]
        for cell in nb.cells if cell.cell_type == "code"
        for out in cell.outputs if CHECK_MIME in out.get("data", {})
    }
    expected = {e.name for e in chapter_exercises(path.name[:2])}
    assert statuses == dict.fromkeys(expected, "not-solved")


def test_readme_map_links_every_notebook_and_nothing_missing() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    links = set(re.findall(r"\]\(((?:notebooks|exercises|solutions)/[^)]+\.ipynb)\)", readme))
    assert all((ROOT / link).exists() for link in links), links
    assert {p.relative_to(ROOT).as_posix() for p in ALL} <= links
    colab = r"colab\.research\.google\.com/github/[^/]+/[^/]+/blob/main/([^)]+)"
    for link in re.findall(colab, readme):
        assert (ROOT / link).exists(), link


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("*.ipynb")),
                         ids=lambda p: p.name)
def test_solutions_store_every_check_passed(path: Path) -> None:
    """nbval reproduces stored outputs, a stored failure included: a solution notebook must
    store each of its chapter's checks, and every one passed."""
    nb = nbformat.read(path, as_version=4)
    stored = {payload["exercise"]: payload["status"]
              for cell in nb.cells if cell.cell_type == "code"
              for output in cell.get("outputs", [])
              for payload in [output.get("data", {}).get(CHECK_MIME)] if payload}
    expected = {e.name for e in chapter_exercises(path.name[:2])}
    assert stored == dict.fromkeys(expected, "passed")


def course_copy(destination: Path) -> Path:
    """The files the course's home is written into, copied to ``destination``."""
    for name in ("pyproject.toml", "README.md"):
        (destination / name).write_bytes((ROOT / name).read_bytes())
    for folder in pipeline.FOLDERS:
        (destination / folder).mkdir()
        for path in (ROOT / folder).glob("*.ipynb"):
            (destination / folder / path.name).write_bytes(path.read_bytes())
    return destination


def test_set_home_moves_every_badge_and_install_cell(tmp_path: Path) -> None:
    root, old = course_copy(tmp_path), pipeline.repository()
    messages = pipeline.set_home("my-org/kv-course", root=root)
    assert messages[0] == "home is now https://github.com/my-org/kv-course"
    assert pipeline.repository(root) == "my-org/kv-course"
    assert pipeline.stale_files(root) == []
    texts = [p.read_text() for p in root.rglob("*") if p.is_file()]
    assert not any(old in text for text in texts)
    for path in root.rglob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        assert "colab.research.google.com/github/my-org/kv-course/blob/main/" in nb.cells[0].source
        assert 'HOME = "https://github.com/my-org/kv-course"' in nb.cells[1].source
    readme = (root / "README.md").read_text()
    badged = [p for folder in ("notebooks", "exercises", "solutions")
              for p in (root / folder).glob("*.ipynb")]
    assert readme.count("colab.research.google.com/github/my-org/kv-course/") == len(badged)


def test_check_fails_when_a_badge_or_install_cell_names_another_home(tmp_path: Path) -> None:
    root, home = course_copy(tmp_path), pipeline.repository()
    readme = root / "README.md"
    badge = "/blob/main/notebooks/03"
    readme.write_text(readme.read_text().replace(f"{home}{badge}", f"x/y{badge}", 1))
    lecture = root / "notebooks" / "05_preemption_and_scheduling.ipynb"
    install = f"https://github.com/{home}"
    lecture.write_text(lecture.read_text().replace(install, "https://github.com/x/y", 1))
    problems = pipeline.stale_files(root)
    assert problems[0].startswith("README.md: the badge for notebooks/03_block_tables.ipynb")
    assert "names x/y, pyproject says" in problems[0]
    assert "notebooks/05_preemption_and_scheduling.ipynb is not normalised" in problems
    assert len(problems) == 2


@pytest.mark.parametrize("home", ["no-slash", "a/b/c", "a/b?c", "a/b.git", "a/", "a/..", "a b/c"])
def test_set_home_refuses_what_is_not_a_repository(
    home: str, capsys: pytest.CaptureFixture
) -> None:
    before = (ROOT / "pyproject.toml").read_text()
    with pytest.raises(SystemExit) as stopped:
        pipeline.main(["set-home", home])
    assert stopped.value.code == 2
    assert f"{home!r} is not a GitHub repository" in capsys.readouterr().err
    assert (ROOT / "pyproject.toml").read_text() == before
