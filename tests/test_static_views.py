"""The course reads well without a kernel: every notebook converts to HTML, and the
lectures' stored outputs carry their pictures (figures and SVG views), which is what GitHub
and nbconvert show."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter

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
