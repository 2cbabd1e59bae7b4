"""What a submitted notebook's code says, read statically in the grader (nothing is run).

Two questions: which object each exercise grades (the argument of the notebook's last
``check("NN.name", EXPR)`` call for it), and whether the code behind that object uses the
exercise's answer key (the library objects named in ``Exercise.reference``) or reads the
course's ``solutions/``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from IPython.core.inputtransformer2 import TransformerManager

_SOLUTIONS = re.compile(r"solutions([/\\.]|$)")
_GRADING, _CHECK = "course_lib.grading", "course_lib.grading.check"


@dataclass(frozen=True)
class GradedCheck:
    """The last ``check`` call of one exercise: its cell and the graded expression."""

    cell: int
    expression: str


def parse_cells(sources: Sequence[str]) -> list[ast.Module | None]:
    """Each code cell as a syntax tree (IPython magics turned into calls); None if invalid."""
    transformer = TransformerManager()
    trees: list[ast.Module | None] = []
    for source in sources:
        try:
            trees.append(ast.parse(transformer.transform_cell(source)))
        except (SyntaxError, ValueError, IndexError, TypeError):
            trees.append(None)
    return trees


def graded_checks(trees: Sequence[ast.Module | None],
                  names: Iterable[str]) -> dict[str, GradedCheck]:
    """Exercise name -> its last ``check(name, EXPR)`` call, in cell order."""
    wanted, found = set(names), {}
    for index, tree in enumerate(trees):
        for node in ast.walk(tree) if tree else ():
            if (isinstance(node, ast.Call) and _call_name(node) == "check" and len(node.args) == 2
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in wanted):
                found[node.args[0].value] = GradedCheck(index, ast.unparse(node.args[1]))
    return found


def _call_name(node: ast.Call) -> str:
    """``f`` for ``f(...)`` and ``m.f(...)``."""
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(
        func, ast.Attribute) else ""


def _imports(trees: Iterable[ast.Module | None]) -> dict[str, str]:
    """Local name -> the dotted module or object it was imported as."""
    names: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    names[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, imports: dict[str, str]) -> str | None:
    """The dotted name an attribute chain resolves to through the imports, if any."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in imports:
        return ".".join([imports[node.id], *reversed(parts)])
    return None


def _definitions(trees: Sequence[ast.Module | None], upto: int) -> dict[str, ast.AST]:
    """Top-level name -> the last statement binding it in cells ``0..upto``."""
    defined: dict[str, ast.AST] = {}
    for tree in trees[: upto + 1]:
        for statement in tree.body if tree else ():
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined[statement.name] = statement
            elif isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = statement.targets if isinstance(statement, ast.Assign) else [
                    statement.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            defined[name.id] = statement
    return defined


def _graded_code(trees: Sequence[ast.Module | None], check: GradedCheck) -> list[ast.AST]:
    """The statements behind the graded expression, following the names they use."""
    defined = _definitions(trees, check.cell)
    todo = [n.id for n in ast.walk(ast.parse(check.expression)) if isinstance(n, ast.Name)]
    seen: set[str] = set()
    code: list[ast.AST] = [ast.parse(check.expression)]
    while todo:
        name = todo.pop()
        if name in seen or name not in defined:
            continue
        seen.add(name)
        code.append(defined[name])
        todo.extend(n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name))
    return code


def _strings(nodes: Iterable[ast.AST]) -> Iterable[str]:
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield node.value


def reads_solutions(trees: Sequence[ast.Module | None]) -> bool:
    """Whether any call in the notebook names the course's ``solutions/`` (exec, open, %run)."""
    calls = [node for tree in trees for node in (ast.walk(tree) if tree else ())
             if isinstance(node, ast.Call)]
    return any(_SOLUTIONS.search(text) for text in _strings(calls))


def uses_reference(trees: Sequence[ast.Module | None], check: GradedCheck,
                   reference: Sequence[str]) -> bool:
    """Whether the graded code imports, calls or looks up one of ``reference``'s objects."""
    imports = _imports(trees[: check.cell + 1])
    code = _graded_code(trees, check)
    attributes = {n.attr for root in code for n in ast.walk(root) if isinstance(n, ast.Attribute)}
    strings = set(_strings(code))
    for root in code:
        for node in ast.walk(root):
            dotted = None
            if isinstance(node, ast.Attribute | ast.Name):
                dotted = _dotted(node, imports)
            elif isinstance(node, ast.ImportFrom | ast.Import):
                module = getattr(node, "module", None) or ""
                dotted_names = [f"{module}.{a.name}" if module else a.name for a in node.names]
                if any(_hit(d, reference, attributes) for d in dotted_names):
                    return True
            if dotted and _hit(dotted, reference, attributes):
                return True
    return any(text == ref or (text.startswith("course_lib") and ref.startswith(text + "."))
               for text in strings for ref in reference)  # imported by its name as a string


def _hit(dotted: str, reference: Sequence[str], attributes: set[str]) -> bool:
    """Whether ``dotted`` is part of the answer key. The grader's own cases are an answer
    key of every exercise: anything of ``course_lib.grading`` but ``check`` counts too."""
    if dotted == _GRADING or (dotted.startswith(_GRADING + ".") and dotted != _CHECK):
        return True
    return any(_matches(dotted, ref, attributes) for ref in reference)


def _matches(dotted: str, ref: str, attributes: set[str]) -> bool:
    """``dotted`` is the reference, inside it, or its owner with the member used by name."""
    if dotted == ref or dotted.startswith(ref + "."):
        return True
    owner, _, member = ref.rpartition(".")
    return dotted == owner and member in attributes and owner.count(".") >= 2
