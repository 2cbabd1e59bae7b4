"""The course reads well without a kernel: every notebook converts to HTML, and the
lectures' stored outputs carry their pictures (figures and SVG views, each SVG with a PNG
copy for frontends that do not trust it), which is what GitHub, nbconvert and an unrun
JupyterLab show. The lectures' stored widgets and pseudo-code agree with the library."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter

from course_lib.paged import BlockPool

ROOT = Path(__file__).resolve().parent.parent
ALL = sorted(p for f in ("notebooks", "solutions", "exercises") for p in (ROOT / f).glob("*.ipynb"))
LECTURES = sorted((ROOT / "notebooks").glob("*.ipynb"))
STATIC = ("image/png", "image/svg+xml")
NO_PICTURES = {"00_start_here.ipynb"}  # the environment report and the course map only


def static_outputs(path: Path) -> list[str]:
    """Every stored picture in a notebook: PNG or SVG data, or SVG inside HTML output."""
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = output.get("data", {})
            found += [str(data[key]) for key in STATIC if key in data]
            if "<svg" in str(data.get("text/html", "")):
                found.append(str(data["text/html"]))
    return found


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_converts_to_html(path: Path) -> None:
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(path, as_version=4))
    assert "<html" in body and path.stem.split("_", 1)[1].split("_")[0] in body.lower()


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.name)
def test_lecture_stores_its_pictures(path: Path) -> None:
    pictures = static_outputs(path)
    if path.name in NO_PICTURES:
        assert pictures == []
    else:
        assert pictures, f"{path.name} has no stored figure or SVG view"


def test_the_widgets_have_static_views_in_the_stored_outputs() -> None:
    capacity = static_outputs(ROOT / "notebooks" / "01_kv_cache_arithmetic.ipynb")
    assert any("30,720" in picture for picture in capacity)  # the calculator's static view
    pool = static_outputs(ROOT / "notebooks" / "03_block_tables.ipynb")
    assert any('class="block' in picture for picture in pool)  # the block-pool drawing


def stored_outputs(path: Path) -> list[tuple[nbformat.NotebookNode, dict]]:
    """(cell, output data) for every output of a notebook that has data."""
    return [(cell, output["data"]) for cell in nbformat.read(path, as_version=4).cells
            if cell.cell_type == "code" for output in cell.outputs if output.get("data")]


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.name)
def test_every_stored_svg_has_a_png_beside_it(path: Path) -> None:
    """JupyterLab shows no SVG in a notebook it does not trust (one opened, not run)."""
    for cell, data in stored_outputs(path):
        if "image/svg+xml" in data:
            assert "image/png" in data, f"{path.name} {cell.id}: SVG without a PNG copy"


TIMELINE = re.compile(r"^(?P<name>[a-z][a-z0-9-]*) step (?P<number>\d+)"
                      r"(?: of \d+| \(frame (?P<frame>\d+) of \d+\)): (?P<label>.*)")


def stored_timeline_widgets() -> list[tuple[str, str, re.Match]]:
    """(lecture, its code up to the widget's cell, summary match) for each stored timeline
    widget in the lectures."""
    found = []
    for path in LECTURES:
        code = ""
        for cell in nbformat.read(path, as_version=4).cells:
            code += cell.source + "\n" if cell.cell_type == "code" else ""
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                match = TIMELINE.match(data.get("text/plain", ""))
                if match and set(data) == {"text/plain"}:  # a widget's stored text form
                    found.append((path.name, code, match))
    return found


def test_stored_timeline_widgets_are_found() -> None:
    names = {match["name"] for _, _, match in stored_timeline_widgets()}
    assert {"arena", "pool", "pool-cow", "pool-preempt", "pool-engine"} <= names


def test_widget_sliders_read_the_step_their_frame_names() -> None:
    """Lecture 03's slider read 13 while its frame said "step 15"."""
    for lecture, _, match in stored_timeline_widgets():
        named = re.match(r"(?:decode )?step (\d+)\b", match["label"])
        if named:
            assert named.group(1) == match["number"], (lecture, match.group(0))


def test_widgets_open_on_their_first_frame_unless_a_cell_chose_one() -> None:
    """Lecture 05's widget opened on its last frame, so a drag to the right did nothing."""
    for lecture, code, match in stored_timeline_widgets():
        frame = int(match["frame"]) - 1 if match["frame"] else int(match["number"])
        chosen = re.search(r"_timeline\([^\n]*\bstep=", code)  # a step picked by hand
        assert frame == 0 or chosen, (lecture, match.group(0))


def test_lecture_03_pseudo_code_frees_where_the_pool_does() -> None:
    """The pseudo-code said "the back of the queue" while the pool uses the front."""
    cells = nbformat.read(ROOT / "notebooks" / "03_block_tables.ipynb", as_version=4).cells
    code = next(c.source for c in cells if c.cell_type == "markdown" and "free(b):" in c.source)
    said = re.search(r"put b at the (front|back) of the queue", code)
    assert said, "lecture 03's pseudo-code no longer says where a freed block goes"
    pool = BlockPool(8, 16)
    taken = [pool.allocate() for _ in range(3)]
    pool.free(taken[1])
    queue = pool.free_blocks()
    assert taken[1] in (queue[0], queue[-1])
    assert said.group(1) == ("front" if queue[0] == taken[1] else "back")


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs git and the course's repository")
@pytest.mark.parametrize("path", ["SUBMISSIONS/ada/02_contiguous_slabs.ipynb", "grades.csv",
                                  "grades.txt", "results/grades-week1.csv"])
def test_gitignore_keeps_the_class_work_and_grades_out(path: str) -> None:
    """An instructor grading in a clone must not commit learners' notebooks or marks."""
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT)
    assert ignored.returncode == 0, f"{path} is not ignored"
