"""Every command line a lecture quotes reproduces the figures the lecture shows.

The convention (``course_lib.commands.quoted_json``): a lecture's markdown quotes a line as
inline code or in a code block, ``python -m course_lib <command> <flags>``, and a code cell
of the same notebook prints, in its stored output, that line after ``$`` with ``--json``
added, and on the next line a JSON object of figures under the command's own names, taken
from the library run the lecture shows. This test runs each quoted line with ``--json`` and
requires every one of those figures, exactly. A quoted line with no such output fails, and
so does one whose command no longer prints the stored figures.

Exempt: lines elided with ``...`` (they show a flag's shape, not a result) and
:data:`EXEMPT` (lines that need the reader's own files).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import shlex
from pathlib import Path

import pytest

from course_lib.__main__ import main

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
PREFIX = "python -m course_lib "
QUOTE = re.compile(r"`(python -m course_lib [^`]+)`|^\s*(python -m course_lib .+)$", re.M)
EXEMPT = {
    "python -m course_lib grade SUBMISSIONS/ --out grades.csv":
        "grades a folder of the reader's submissions",
}


def _text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def quoted_lines(notebook: dict) -> list[str]:
    """The command lines a notebook's markdown quotes, in order, once each (a command is a
    word after ``python -m course_lib``, so ``python -m course_lib.engine.bench`` is not)."""
    lines: list[str] = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for match in QUOTE.finditer(_text(cell)):
            line = " ".join((match.group(1) or match.group(2)).split())
            if line not in lines:
                lines.append(line)
    return lines


def stored_figures(notebook: dict) -> dict[str, dict]:
    """For each ``$ <line>`` in the stored outputs, the JSON object printed after it."""
    figures: dict[str, dict] = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            text = output.get("text", "")
            rows = (text if isinstance(text, str) else "".join(text)).splitlines()
            for row, following in itertools.pairwise(rows):
                if row.startswith(f"$ {PREFIX}") and row.endswith(" --json"):
                    figures[row[2:-len(" --json")]] = json.loads(following)
    return figures


def run_json(line: str) -> dict:
    """The command's ``--json`` answer, run in this process."""
    argv = shlex.split(line.removeprefix(PREFIX))
    if "--json" not in argv:
        argv.append("--json")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    assert status == 0, f"{line!r} exited {status}"
    return json.loads(out.getvalue())


def cases() -> list:
    found = []
    for path in NOTEBOOKS:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        figures = stored_figures(notebook)
        for line in quoted_lines(notebook):
            if line.endswith("...") or line in EXEMPT:
                continue
            found.append(pytest.param(path.name, line, figures.get(line),
                                      id=f"{path.stem}: {line.removeprefix(PREFIX)}"))
    return found


def test_the_lectures_quote_command_lines() -> None:
    assert cases(), "no lecture quotes a command line; the convention below tests nothing"


@pytest.mark.parametrize(("notebook", "line", "stored"), cases())
def test_a_quoted_line_reproduces_the_lecture(notebook: str, line: str,
                                              stored: dict | None) -> None:
    assert stored, (f"{notebook} quotes `{line}` but no stored output shows its figures: print "
                    f"quoted_json({line!r}, <the run's figures>, <keys>) in the cell that "
                    f"computes them")
    printed = run_json(line)
    assert {key: printed.get(key, "(missing)") for key in stored} == stored, (
        f"{notebook}: `{line}` no longer prints the figures the lecture shows")


def test_quoted_lines_and_their_figures_are_found() -> None:
    markdown = {"cell_type": "markdown", "source": [
        "Run `python -m course_lib route --replicas 2` or\n",
        "    python -m course_lib kv-size --layers 32\n",
        "and `python -m course_lib.engine.bench` (a module, not a command)."]}
    output = {"cell_type": "code", "source": "", "outputs": [{"output_type": "stream", "text": [
        "table\n", "$ python -m course_lib route --replicas 2 --json\n", '{"steps": 3}\n']}]}
    notebook = {"cells": [markdown, output]}
    assert quoted_lines(notebook) == ["python -m course_lib route --replicas 2",
                                      "python -m course_lib kv-size --layers 32"]
    assert stored_figures(notebook) == {"python -m course_lib route --replicas 2": {"steps": 3}}


def test_quoted_json_prints_what_the_test_reads() -> None:
    from course_lib.commands import quoted_json

    text = quoted_json("python -m course_lib kv-size --layers 32", {"a": 0.1, "b": 2}, ["a"])
    cell = {"cell_type": "code", "source": "", "outputs": [{"text": text + "\n"}]}
    assert stored_figures({"cells": [cell]}) == {"python -m course_lib kv-size --layers 32":
                                                 {"a": 0.1}}
    with pytest.raises(ValueError, match="starts with"):
        quoted_json("course_lib kv-size", {"a": 1}, ["a"])
    with pytest.raises(ValueError, match="missing"):
        quoted_json("python -m course_lib kv-size", {"a": 1}, ["b"])
    with pytest.raises(ValueError, match="missing"):
        quoted_json("python -m course_lib kv-size", {"a": 1}, [])
