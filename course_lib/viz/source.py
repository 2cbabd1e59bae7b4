"""``show_source(obj)``: the real source of a library object, rendered in the notebook.

Lectures never copy library code into cells; they show it from the library, so what the
learner reads is what the tests test. The result shows as syntax-highlighted HTML
(Pygments, inline styles, so it needs no stylesheet and survives GitHub and nbconvert) and
as the plain source where a frontend shows text only. The caption names the file relative
to the repository (``course_lib/kv_math.py``), never an absolute path, so stored outputs do
not depend on where the course is installed; line numbers are left out for the same
reason (an edit elsewhere in a file would change every stored output showing it).
"""

from __future__ import annotations

import html
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

import course_lib

_PACKAGE_ROOT = Path(course_lib.__file__).resolve().parent.parent


@dataclass(frozen=True)
class SourceView:
    """Source text with a caption; HTML in rich frontends, plain text elsewhere."""

    code: str
    caption: str

    def _repr_html_(self) -> str:
        body = highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True))
        # Pygments 2.20 began escaping quotes in text; text needs only & < > escaped, so
        # quotes are written plainly and the output is the same on every Pygments.
        body = body.replace("&quot;", '"').replace("&#x27;", "'").replace("&#39;", "'")
        caption = (
            '<div class="source-caption" style="font-size:12px;color:#57606a;'
            f'margin:2px 0 4px">{html.escape(self.caption)}</div>'
        )
        return f'<div class="course-source">{caption}{body}</div>'

    def __repr__(self) -> str:
        return f"# {self.caption}\n{self.code}"


def _caption(obj: object) -> str:
    """``path/of/file.py · qualified.name`` with the path relative to the repository."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", type(obj).__name__)
    try:
        path = Path(inspect.getsourcefile(obj) or "").resolve()
    except TypeError:
        return str(name)
    if path.is_relative_to(_PACKAGE_ROOT / "course_lib"):
        return f"{path.relative_to(_PACKAGE_ROOT).as_posix()} · {name}"
    module = getattr(obj, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def show_source(obj: object) -> SourceView:
    """The source of a module, class, function or method, ready to display.

    Raises ``ValueError`` naming the object when Python has no source for it (a builtin,
    or something defined in C).
    """
    try:
        code = inspect.getsource(obj)
    except (TypeError, OSError):
        raise ValueError(f"no Python source is available for {obj!r}") from None
    return SourceView(textwrap.dedent(code).rstrip() + "\n", _caption(obj))
