"""Feedback each learner can read: one HTML page and the same as Markdown, per learner.

A view of the grader's rows, not a second grading: for every exercise graded, its status
and score, how many fixed and fresh cases passed, and the first failing fixed case as
``check`` reports it (call, what differs, got, expected, hint). Of the fresh cases a page
shows only the share passed and the run's seed, never their inputs or answers; what a
notebook "got" is its own output, which a hostile one can forge to spell out the fresh
inputs it was given (README: regrade with a new seed once pages are out).

Everything a learner controls (names, outputs, error messages) is made one printable line,
cut to :data:`MAX_TEXT` characters, and escaped: ``html.escape`` in the page, code spans or
backslash escapes in Markdown; the grader's own text of a case (call, expected, hint) is cut
to :data:`MAX_CASE_TEXT`, and at most :data:`MAX_NOTES` files not graded are listed, so a
page's size is bounded whatever a harvest or a folder holds. A page holds only its
learner's rows, and its file name is derived from the name so that no
name reaches outside the folder and no two names share a file (:func:`page_stem`). The
page is self-contained: inline CSS, no script, no external resource (its Content Security
Policy forbids both).
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from course_lib.grading.grade import GradeRow
from course_lib.grading.report import exact, score_text
from course_lib.grading.submissions import printable

MAX_TEXT = 300
"""Most characters of one learner-controlled text shown on a page (got, what differs, a
note, a file name, a reason); longer ones end in an ellipsis."""
MAX_CASE_TEXT = 1000
"""Most characters of the grader's text of a fixed case (call, expected, hint) and of the
learner's name on a page."""
MAX_NOTES = 20
"""Most files not graded listed on one learner's page; the rest are counted."""
_PLAIN_STEM = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_WINDOWS_DEVICE = re.compile(r"(con|prn|aux|nul|com[1-9]|lpt[1-9])(\..*)?")
_STATUS_CLASS = {"passed": "passed", "failed": "failed", "flagged": "flagged",
                 "not solved": "unsolved", "not submitted": "missing"}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem;
       color: #1f2328; line-height: 1.4; padding: 0 1rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: 4px 8px;
         border-top: 1px solid #d0d7de; }
th { background: #f6f8fa; }
code { font-family: ui-monospace, monospace; font-size: 0.9em; word-break: break-word; }
.status { font-weight: 600; white-space: nowrap; }
.passed .status { color: #1a7f37; } .failed .status { color: #cf222e; }
.flagged .status { color: #8250df; } .unsolved .status { color: #9a6700; }
.missing .status, .other .status { color: #57606a; }
dl { margin: 0; } dt { font-weight: 600; float: left; clear: left; width: 6rem; }
dd { margin-left: 6.5rem; }
.note { color: #57606a; }
"""


def page_stem(learner: str) -> str:
    """The file name (without suffix) of ``learner``'s page: the name itself where it is a
    short lower-case name of letters, digits, ``.``, ``_`` and ``-`` and no Windows device
    name (``con``, ``nul.txt``, ``com1``); otherwise a cleaned form of it plus ``~`` and a
    digest of the whole name. ``~`` never appears in a plain name, so two learners never
    share a page, whatever their names, on any file system (case-insensitive ones
    included), and no name leaves the folder."""
    if _PLAIN_STEM.fullmatch(learner) and not _WINDOWS_DEVICE.fullmatch(learner):
        return learner
    cleaned = re.sub(r"[^a-z0-9._-]+", "_", learner.lower()).strip("._-")[:40] or "learner"
    return f"{cleaned}~{hashlib.sha256(learner.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` as one printable line of at most ``limit`` characters and an ellipsis."""
    text = printable(text)
    return text if len(text) <= limit else text[:limit] + "\u2026"


def _fresh(row: GradeRow) -> str:
    return f"{row.fresh_passed}/{row.fresh_total}" if row.fresh_total else "none drawn"


def _said(row: GradeRow) -> str:
    """What the row says beside its counts: the remark of a judged row (never a fresh
    case), else the reason."""
    return cut(row.remark if row.judged else row.reason)


def _chapters(rows: Sequence[GradeRow]) -> list[tuple[str, list[GradeRow]]]:
    chapters = sorted({row.chapter for row in rows if row.exercise})
    return [(c, [row for row in rows if row.exercise and row.chapter == c]) for c in chapters]


def _case_html(row: GradeRow) -> str:
    case = row.first_failure
    if case is None:
        said = _said(row)
        return f'<span class="note">{html.escape(said)}</span>' if said else ""
    parts = [("call", f"<code>{html.escape(cut(case.call, MAX_CASE_TEXT))}</code>")]
    if case.differs:
        parts.append(("differs", html.escape(cut(case.differs))))
    parts += [("got", f"<code>{html.escape(cut(case.got))}</code>"),
              ("expected", f"<code>{html.escape(cut(case.expected, MAX_CASE_TEXT))}</code>"),
              ("hint", f'<span class="hint">{html.escape(cut(case.hint, MAX_CASE_TEXT))}'
                       "</span>")]
    if _said(row):
        parts.append(("note", html.escape(_said(row))))
    return "<dl>" + "".join(f"<dt>{name}</dt><dd>{text}</dd>" for name, text in parts) + "</dl>"


def page_html(learner: str, rows: Sequence[GradeRow], seed: int) -> str:
    """``learner``'s page: a table per chapter, one row per exercise; ``rows`` must all be
    theirs."""
    _only(learner, rows)
    name = html.escape(cut(learner, MAX_CASE_TEXT))
    total = sum((exact(row.score) for row in rows if row.exercise), Decimal(0))
    count = sum(1 for row in rows if row.exercise)
    body = [f"<h1>Feedback for <span class=\"learner\">{name}</span></h1>",
            f"<p>Total: <b>{total:.2f}</b> of {count} exercises. Each exercise's score is the "
            "share of <em>fresh</em> cases it passed: cases drawn for this grading run (seed "
            f"<code>{seed}</code>), like the fixed cases your <code>check</code> shows but "
            "with inputs you have not seen. The fixed cases below are the ones "
            "<code>check</code> runs in your notebook.</p>"]
    for chapter, mine in _chapters(rows):
        body.append(f'<h2>Chapter {html.escape(chapter)}</h2><table class="chapter" '
                    f'data-chapter="{html.escape(chapter)}"><thead><tr><th>exercise</th>'
                    "<th>status</th><th>score</th><th>fixed cases</th><th>fresh cases</th>"
                    "<th>first failing fixed case</th></tr></thead><tbody>")
        for row in mine:
            fixed = f"{row.fixed_passed}/{row.fixed_total}" if row.judged else ""
            fresh = _fresh(row) if row.judged else ""
            body.append(
                f'<tr class="exercise {_STATUS_CLASS.get(row.status, "other")}" '
                f'data-exercise="{html.escape(row.exercise)}">'
                f"<td><code>{html.escape(row.exercise)}</code></td>"
                f'<td class="status">{html.escape(row.status)}</td>'
                f"<td>{score_text(row.score)}</td><td>{fixed}</td><td>{fresh}</td>"
                f"<td>{_case_html(row)}</td></tr>")
        body.append("</tbody></table>")
    notes = [row for row in rows if not row.exercise]
    if notes:
        body.append("<h2>Files not graded</h2><ul>" + "".join(
            f"<li><code>{html.escape(cut(row.notebook))}</code>: "
            f"{html.escape(cut(row.status))}: {html.escape(cut(row.reason))}</li>"
            for row in notes[:MAX_NOTES]) + "".join(f"<li>{more}</li>" for more in _more(notes))
            + "</ul>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'\">"
            f"<title>Feedback: {name}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _more(notes: Sequence[GradeRow]) -> list[str]:
    """The line that counts the files not graded past :data:`MAX_NOTES`, if any."""
    extra = len(notes) - MAX_NOTES
    return [f"and {extra} more files not graded"] if extra > 0 else []


def md_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` as literal Markdown text: one line of at most ``limit`` characters (before
    escaping), every ASCII punctuation mark escaped (CommonMark allows a backslash before
    each), so nothing becomes markup or HTML."""
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", cut(text, limit))


def md_code(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` as one Markdown code span of at most ``limit`` characters, whatever
    backticks it holds."""
    text = cut(text, limit)
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def page_markdown(learner: str, rows: Sequence[GradeRow], seed: int) -> str:
    """The same page as Markdown: a section per chapter, a list entry per exercise."""
    _only(learner, rows)
    total = sum((exact(row.score) for row in rows if row.exercise), Decimal(0))
    count = sum(1 for row in rows if row.exercise)
    lines = [f"# Feedback for {md_code(learner, MAX_CASE_TEXT)}", "",
             f"Total: **{total:.2f}** of {count} exercises. Each exercise's score is the share "
             f"of fresh cases it passed: cases drawn for this grading run (seed `{seed}`), "
             "like the fixed cases your `check` shows but with inputs you have not seen.", ""]
    for chapter, mine in _chapters(rows):
        lines += [f"## Chapter {md_text(chapter)}", ""]
        for row in mine:
            head = (f"- {md_code(row.exercise)}: **{md_text(row.status)}**, score "
                    f"{score_text(row.score)}")
            if row.judged:
                head += (f"; fixed cases passed {row.fixed_passed}/{row.fixed_total}, "
                         f"fresh {md_text(_fresh(row))}")
            lines.append(head)
            case = row.first_failure
            if case is not None:
                lines.append("  - first failing fixed case: "
                             f"{md_code(case.call, MAX_CASE_TEXT)}")
                if case.differs:
                    lines.append(f"  - differs: {md_text(case.differs)}")
                lines += [f"  - got: {md_code(case.got)}",
                          f"  - expected: {md_code(case.expected, MAX_CASE_TEXT)}",
                          f"  - hint: {md_text(case.hint, MAX_CASE_TEXT)}"]
            if _said(row):
                lines.append(f"  - note: {md_text(_said(row))}")
        lines.append("")
    notes = [row for row in rows if not row.exercise]
    if notes:
        lines += ["## Files not graded", ""]
        lines += [f"- {md_code(row.notebook)}: {md_text(row.status)}: {md_text(row.reason)}"
                  for row in notes[:MAX_NOTES]]
        lines += [f"- {more}" for more in _more(notes)]
        lines.append("")
    return "\n".join(lines)


def _only(learner: str, rows: Sequence[GradeRow]) -> None:
    others = sorted({row.learner for row in rows} - {learner})
    if others:
        raise ValueError(f"a page of {learner!r} was given rows of {others!r}")


def write_feedback(rows: Sequence[GradeRow], seed: int, folder: Path,
                   learners: Sequence[str]) -> list[Path]:
    """Write ``folder/<stem>.html`` and ``.md`` for each of ``learners`` from their rows
    (made if missing); return the pages written."""
    folder = Path(folder)
    folder.mkdir(exist_ok=True)
    written = []
    for learner in learners:
        mine = [row for row in rows if row.learner == learner]
        stem = page_stem(learner)
        for suffix, text in ((".html", page_html(learner, mine, seed)),
                             (".md", page_markdown(learner, mine, seed))):
            path = folder / (stem + suffix)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
