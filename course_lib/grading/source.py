"""What a submitted notebook holds, read without running anything.

A notebook is read as JSON within fixed bounds (cells, characters), and each code cell's
text is turned into a syntax tree by a linear pass that neutralises IPython's magics, so
no submission's shape can make this reading slow. The one question asked of the trees is
which object each exercise grades: the argument of the notebook's last
``check("NN.name", EXPR)`` call for it.

The grader reads each notebook in a process of its own (:func:`read_isolated`, which runs
this file as a script under a time and memory limit): a tree too deep for CPython 3.11
leaves its parser's shared state wrong (CPython issue 106905), and no learner's notebook
may break the reading of another's.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import re
import resource
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

MAX_CODE_CELLS = 2_000
"""Most code cells a graded notebook may have (the course's have fewer than 100)."""
MAX_PARSED_CHARS = 200_000
"""Longest cell read for ``check`` calls; a longer one still runs, but is not searched."""
MAX_PARSED_TOTAL = 2_000_000
"""Most characters of one notebook read for ``check`` calls (the course's have about 100,000);
the cells after that still run, but are not searched."""

_TIMED = re.compile(r"^(\s*)%(?:time|timeit|prun)\b(?:\s+-\S+)*\s?(.*)$")
_MAGIC = re.compile(r"^(\s*)(?:(\w[\w\s,]*=)\s*)?[%!]")
_CELL_MAGIC = re.compile(r"^\s*%%(?:time|timeit|capture)\b")


class NotANotebook(ValueError):
    """A submission that cannot be graded as a notebook; the message says why."""


@dataclass(frozen=True)
class GradedCheck:
    """The last ``check`` call of one exercise: its cell and the graded expression."""

    cell: int
    expression: str


def code_cells(data: bytes) -> list[str]:
    """The text of every code cell of a notebook file, in order; :class:`NotANotebook`."""
    try:
        notebook = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise NotANotebook(f"not a valid notebook ({type(error).__name__})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise NotANotebook("not a valid notebook (no list of cells)")
    code = [cell for cell in cells if isinstance(cell, dict) and cell.get("cell_type") == "code"]
    if len(code) > MAX_CODE_CELLS:
        raise NotANotebook(f"{len(code)} code cells, more than the {MAX_CODE_CELLS} graded")
    return [_text(cell.get("source"), index) for index, cell in enumerate(code)]


def _text(source: object, index: int) -> str:
    """A cell's source as one string: nbformat allows a string or a list of strings."""
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        return "".join(source)
    raise NotANotebook(f"not a valid notebook (code cell {index + 1}'s source is not text)")


def python_of(cell: str) -> str:
    """The cell as plain Python: ``%time``-like prefixes dropped, other magics and shell
    lines replaced by ``pass`` (or ``None`` where assigned); one pass over the lines."""
    lines = cell.splitlines()
    if lines and _CELL_MAGIC.match(lines[0]):
        lines = lines[1:]
    elif lines and lines[0].lstrip().startswith("%%"):
        return ""
    out = []
    for line in lines:
        timed = _TIMED.match(line)
        magic = None if timed else _MAGIC.match(line)
        if timed:
            line = timed.group(1) + timed.group(2)
        elif magic:
            line = f"{magic.group(1)}{magic.group(2) or ''} None" if magic.group(2) else (
                f"{magic.group(1)}pass")
        out.append(line)
    return "\n".join(out)


def parse_cells(sources: Sequence[str]) -> Iterator[ast.Module | None]:
    """Each code cell as a syntax tree, one at a time; None where it is not Python, too long
    to search, or past the notebook's :data:`MAX_PARSED_TOTAL`."""
    budget = MAX_PARSED_TOTAL
    for source in sources:
        budget -= len(source)
        try:
            yield ast.parse(python_of(source)) if (
                len(source) <= MAX_PARSED_CHARS and budget >= 0) else None
        except (SyntaxError, ValueError, RecursionError, MemoryError, SystemError):
            yield None  # SystemError: CPython 3.11's parser out of memory or depth


def graded_checks(trees: Iterable[ast.Module | None],
                  names: Iterable[str]) -> dict[str, GradedCheck]:
    """Exercise name -> its last ``check(name, EXPR)`` (or ``check(name, obj=EXPR)``) call,
    in cell order; an expression too deep to write back is not a graded one."""
    wanted, found = set(names), {}
    for index, tree in enumerate(trees):
        for node in ast.walk(tree) if tree else ():
            args = _check_args(node)
            if args and isinstance(args[0], ast.Constant) and args[0].value in wanted:
                try:
                    found[args[0].value] = GradedCheck(index, ast.unparse(args[1]))
                except RecursionError:
                    continue
    return found


def _check_args(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(name, object) of a ``check`` call, given by position or by keyword."""
    if not (isinstance(node, ast.Call) and _call_name(node) == "check") or len(node.args) > 2:
        return None
    given = dict(zip(("name", "obj"), node.args, strict=False))
    for keyword in node.keywords:
        if keyword.arg not in ("name", "obj") or keyword.arg in given:
            return None
        given[keyword.arg] = keyword.value
    return (given["name"], given["obj"]) if len(given) == 2 else None


@dataclass(frozen=True)
class Reading:
    """A notebook's code cells and, per exercise, its graded check."""

    sources: list[str]
    checks: dict[str, GradedCheck]


def read(data: bytes, names: Iterable[str]) -> Reading:
    """Read a notebook file in this process; :class:`NotANotebook`."""
    sources = code_cells(data)
    return Reading(sources, graded_checks(parse_cells(sources), names))


READ_SECONDS = 60.0
READ_MEMORY_MB = 2048


async def read_isolated(data: bytes, names: Iterable[str]) -> Reading:
    """:func:`read` in a fresh process bounded in time and memory; :class:`NotANotebook`
    where the notebook cannot be read, or the reading ran past the bounds."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", __file__, json.dumps(sorted(names)),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, preexec_fn=_limit_memory)
    try:
        out, _ = await asyncio.wait_for(process.communicate(data), READ_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):  # it may end as the clock runs out
            process.kill()
        await process.wait()
        raise NotANotebook(f"reading its code took over {READ_SECONDS:g} s") from None
    try:
        answer = json.loads(out)
    except ValueError:
        raise NotANotebook("its code could not be read within "
                           f"{READ_MEMORY_MB} MB") from None
    if "problem" in answer:
        raise NotANotebook(answer["problem"])
    return Reading(answer["sources"], {name: GradedCheck(*check)
                                       for name, check in answer["checks"].items()})


def _limit_memory() -> None:
    limit = READ_MEMORY_MB << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _main() -> None:
    """As a script: read the notebook on stdin for the exercises named in argv[1]."""
    try:
        reading = read(sys.stdin.buffer.read(), json.loads(sys.argv[1]))
        answer = {"sources": reading.sources,
                  "checks": {n: [c.cell, c.expression] for n, c in reading.checks.items()}}
    except NotANotebook as error:
        answer = {"problem": str(error)}
    sys.stdout.write(json.dumps(answer))


def _call_name(node: ast.Call) -> str:
    """``f`` for ``f(...)`` and ``m.f(...)``."""
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(
        func, ast.Attribute) else ""


if __name__ == "__main__":
    _main()
