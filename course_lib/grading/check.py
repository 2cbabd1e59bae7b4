"""Run one exercise's behavioural cases against a learner's function or class.

``check(name, obj)`` never raises because of the learner's code: every case runs inside a
guard, and the report says what was called, what came back, what was expected and a hint.
The result also goes into the cell output under ``CHECK_MIME`` as JSON, for tools and
tests; the instructor's grader never reads it. Both ``check`` and the grader compare only
plain data (``to_plain``): ``observe`` runs a case where the learner's code is, ``judge``
compares where the expected value is, so the grader can judge outside the learner's process.

A failing case names the first part of the result that differs, by its label: a case whose
``run`` returns a dict labels its parts by the keys (``arena.copied: got 11, expected 10``),
and a comparison may say its own verdict (a :class:`Verdict`, or ``Satisfies.explain``). The
hint is chosen by that label (``Case.hints``), so it speaks of the mistake, not of the case.
"""

from __future__ import annotations

import html
import math
import sys
import sysconfig
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal

CHECK_MIME = "application/vnd.course-lib.check+json"
"""MIME type of the machine-readable check result stored in a notebook's outputs."""

Status = Literal["passed", "failed", "not-solved"]


@dataclass(frozen=True)
class Raises:
    """Expected outcome of a case that must raise ``error`` (e.g. ``Raises(ValueError)``)."""

    error: type[BaseException]

    def __repr__(self) -> str:
        return f"raises {self.error.__name__}"


@dataclass(frozen=True)
class Verdict:
    """What a comparison found: passed or not, and, when not, what differs and why.

    ``differs`` starts with the label of the first part that differs (``"arena.copied: got
    11, expected 10"``, ``"out[b=2, h=5]: largest error 3.1"``); ``Case.hints`` is looked up
    by that label. ``hint``, when a comparison recognises the mistake itself, wins over both.
    """

    passed: bool
    differs: str = ""
    hint: str = ""


@dataclass(frozen=True)
class Satisfies:
    """Expected outcome of a case with more than one right answer: any value ``holds`` accepts.

    ``description`` is what the report shows as expected (e.g. "3 slabs of 30 slots inside
    0..100, none overlapping"). Use it with ``compare=satisfies``. Give ``explain`` instead of
    ``holds`` to let the check say its own verdict: it returns None for a right value, else
    what is wrong, led by a label (``"slab 2: overlaps slab 1"``), or a whole :class:`Verdict`.
    """

    description: str
    holds: Callable[[Any], bool] | None = None
    explain: Callable[[Any], str | Verdict | None] | None = None

    def __post_init__(self) -> None:
        if (self.holds is None) == (self.explain is None):
            raise ValueError(f"Satisfies({self.description!r}) needs exactly one of holds "
                             "and explain")

    def __repr__(self) -> str:
        return self.description


def satisfies(got: Any, expected: Satisfies) -> bool | Verdict:
    """``compare`` for a :class:`Satisfies` expectation."""
    if expected.holds is not None:
        return bool(expected.holds(got))
    found = expected.explain(got)  # type: ignore[misc]
    if found is None or isinstance(found, Verdict):
        return Verdict(True) if found is None else found
    return Verdict(False, str(found))


def strict_equal(got: Any, expected: Any) -> bool:
    """The course's one rule for comparing plain data: the same types all the way down
    (``True`` is not ``1``, ``7.0`` is not ``7``, an ``int`` where the spec says ``int``);
    floats may differ by rounding (relative 1e-9, absolute 1e-12)."""
    if type(got) is not type(expected):
        return False
    if isinstance(expected, float):
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(expected, list | tuple):
        return len(got) == len(expected) and all(map(strict_equal, got, expected))
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(
            strict_equal(got[key], value) for key, value in expected.items())
    return bool(got == expected)


@dataclass(frozen=True)
class Case:
    """One behavioural test: ``run(obj)`` calls the learner's code as ``call`` describes.

    ``run`` travels into the learner's kernel: it may use the case's inputs, never an
    expected value or the exercise's reference. ``compare(got, expected)`` returns a bool or
    a :class:`Verdict`. ``hint`` is the default; ``hints`` maps the label of the part that
    differs (a key of the returned dict, ``"raised"``, ``"returned"``) to the hint for that
    mistake.
    """

    call: str
    run: Callable[[Any], Any]
    expected: Any
    hint: str
    compare: Callable[[Any, Any], bool | Verdict] = strict_equal
    hints: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: a stable name, a title, and a factory for its cases.

    ``reference`` names the library objects that are its answer key (dotted, e.g.
    ``"course_lib.paged.PagedKVManager.fork"``, or a whole module); graded code that uses
    them scores zero in the instructor's grader. Case lists must be deterministic: the
    grader and the learner's kernel build them separately and must agree.
    """

    name: str
    title: str
    cases: Callable[[], Sequence[Case]]
    reference: tuple[str, ...] = ()
    fresh: Callable[[int], Sequence[Case]] | None = None
    """Cases whose inputs are drawn from ``random.Random(seed)``, expected values from the
    library; the grader adds them with a seed of its own, so copied answers earn nothing."""


def unique_labels(calls: Sequence[str]) -> list[str]:
    """``calls`` as distinct dict keys: a repeated call gets `` #2``, `` #3``, ..."""
    seen: dict[str, int] = {}
    labels = []
    for call in calls:
        seen[call] = seen.get(call, 0) + 1
        labels.append(call if seen[call] == 1 else f"{call} #{seen[call]}")
    return labels


def labelled(labels: Sequence[str], values: Any) -> Any:
    """A learner's tuple or list as a dict by ``labels`` (for a ``run`` to return, so the
    report names the part that differs); any other value as it is."""
    if isinstance(values, list | tuple) and len(values) == len(labels):
        return dict(zip(labels, values, strict=True))
    return values


def exercise_cases(exercise: Exercise, seed: int | None = None) -> list[Case]:
    """``exercise.cases()``, plus ``exercise.fresh(seed)`` when a seed is given."""
    cases = list(exercise.cases())
    if seed is not None and exercise.fresh is not None:
        cases += exercise.fresh(seed)
    return cases


@dataclass(frozen=True)
class CaseResult:
    """What one case did: passed or not, and the evidence for the report.

    ``differs`` names the first part that differs (empty when passed or unknown)."""

    call: str
    passed: bool
    got: str
    expected: str
    hint: str
    differs: str = ""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of ``check``: counts, a status and every case's evidence."""

    exercise: str
    title: str
    status: Status
    passed: int
    total: int
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)

    @property
    def score(self) -> float:
        """Share of cases passed, 0.0 to 1.0 (0.0 while not yet solved)."""
        return self.passed / self.total if self.total else 0.0

    def to_json(self) -> dict[str, Any]:
        """The machine-readable form stored under ``CHECK_MIME``."""
        return asdict(self) | {"score": self.score}

    def report_text(self) -> str:
        """The compact plain-text report."""
        head = {
            "passed": f"PASSED {self.exercise}: {self.title} ({self.passed}/{self.total} cases)",
            "failed": f"FAILED {self.exercise}: {self.title} ({self.passed}/{self.total} cases)",
            "not-solved": f"NOT YET SOLVED {self.exercise}: {self.title} "
            f"(fill in the cell marked YOUR CODE HERE, then run it and this check again)",
        }[self.status]
        lines = [head]
        if self.status == "failed":
            for case in self.cases:
                mark = "ok  " if case.passed else "FAIL"
                lines.append(f"  {mark} {case.call}")
                if not case.passed:
                    if case.differs:
                        lines.append(f"         differs  {case.differs}")
                    lines.append(f"         got      {case.got}")
                    lines.append(f"         expected {case.expected}")
                    lines.append(f"         hint     {case.hint}")
        return "\n".join(lines)

    def _head_html(self) -> str:
        word = {"passed": "PASSED", "failed": "FAILED", "not-solved": "NOT YET SOLVED"}
        count = (f"({self.passed}/{self.total} cases)" if self.status != "not-solved" else
                 "(fill in the cell marked YOUR CODE HERE, then run it and this check again)")
        return (f"<b>{word[self.status]}</b> <code>{html.escape(self.exercise)}</code>: "
                f"{html.escape(self.title)} {count}")

    def report_html(self) -> str:
        """The same report as a table for Jupyter: one row per case, a failing case's part
        that differs, what came back, what was expected and the hint in its own columns."""
        colour = {"passed": "#1a7f37", "failed": "#cf222e", "not-solved": "#9a6700"}[self.status]
        rows = []
        if self.status == "failed":
            cell = ('<td style="text-align:left;vertical-align:top;padding:2px 8px;'
                    'border-top:1px solid #d0d7de;word-break:normal">{}</td>')
            for case in self.cases:
                shown = [f"<code>{html.escape(case.call)}</code>"]
                if not case.passed:
                    shown += [f"<b>{html.escape(case.differs)}</b>" if case.differs else "",
                              f"<code>{html.escape(case.got)}</code>",
                              f"<code>{html.escape(case.expected)}</code>",
                              html.escape(case.hint)]
                mark = ("&#10003;" if case.passed else "&#10007;")
                rows.append("<tr>" + cell.format(mark)
                            + "".join(cell.format(text) for text in shown) + "</tr>")
        table = ("" if not rows else
                 '<table style="border-collapse:collapse;margin-top:4px"><thead><tr>'
                 + "".join(f'<th style="text-align:left;padding:2px 8px">{name}</th>' for name in
                           ("", "case", "what differs", "got", "expected", "hint"))
                 + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
        return (f'<div class="course-check" data-status="{self.status}" '
                f'style="border-left:4px solid {colour};padding:6px 10px;background:#f6f8fa">'
                f"{self._head_html()}{table}</div>")

    def _ipython_display_(self) -> None:
        """Show nothing when returned from a cell: ``check`` has already shown the report."""

    def mimebundle(self) -> dict[str, Any]:
        """Text, HTML and the machine-readable JSON, for ``IPython.display``."""
        return {
            "text/plain": self.report_text(),
            "text/html": self.report_html(),
            CHECK_MIME: self.to_json(),
        }


Observation = dict[str, Any]
"""Plain data of one case run: ``{"value": ..., "shown": ...}``, ``{"raised": [names],
"shown": ...}`` or ``{"not_plain": why, "shown": ...}``; JSON as it crosses to the grader."""


class NotPlainData(TypeError):
    """A learner's value that is not plain data, so it cannot be compared safely."""


MAX_PLAIN_NUMBERS = 1 << 22
"""The most numbers one array may bring to the judge: an answer holds thousands, while a
view of a whole 4 GiB cache, made into lists, would take the kernel minutes."""


def _plain_array(value: Any) -> Any | None:
    """numpy arrays and scalars, torch tensors: nested lists of Python numbers, else None."""
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        _check_numbers(torch.Tensor.numel(value))
        return torch.Tensor.tolist(torch.Tensor.detach(value).cpu())
    if numpy is not None and isinstance(value, numpy.ndarray | numpy.generic):
        array = numpy.asarray(value)
        if array.dtype.kind not in "biuf":
            raise NotPlainData(f"an array of dtype {array.dtype} is not plain data")
        _check_numbers(array.size)
        return numpy.ndarray.tolist(array)
    return None


def _check_numbers(count: int) -> None:
    """Refuse an array of more than :data:`MAX_PLAIN_NUMBERS` numbers."""
    if count > MAX_PLAIN_NUMBERS:
        raise NotPlainData(f"an array of {count:,} numbers is larger than any answer "
                           f"({MAX_PLAIN_NUMBERS:,} at most)")


def _plain_key(key: Any) -> str:
    """A dict key as JSON writes it: strings stay, integers become their decimal text."""
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, int) and type(key) is not bool:
        return str(int.__int__(key))
    raise NotPlainData(f"a dict with a {type(key).__name__} key is not plain data")


def to_plain(value: Any, _depth: int = 0) -> Any:
    """``value`` as plain data (None, bool, int, float, str, lists, dicts with str keys).

    Tuples become lists, integer dict keys their decimal text (as JSON writes them); numpy
    and torch values become nested lists of numbers (NaN kept);
    dataclasses of ``course_lib`` become dicts by field; subclasses of int, float and str
    become the builtin value, so a rigged ``__eq__`` is gone. Anything else (a learner's
    own class) raises :class:`NotPlainData`: only plain values are ever compared.
    """
    if _depth > 64:
        raise NotPlainData("a value nested more than 64 levels deep is not plain data")
    if value is None or type(value) is bool:
        return value
    for base in (int, float, str):
        if isinstance(value, base):
            return getattr(base, f"__{base.__name__}__")(value)  # the builtin's own copy
    if type(value) in (list, tuple):
        return [to_plain(item, _depth + 1) for item in value]
    if type(value) is dict:
        plain = {_plain_key(key): to_plain(item, _depth + 1) for key, item in value.items()}
        if len(plain) != len(value):
            raise NotPlainData("a dict with both 1 and '1' as keys is not plain data")
        return plain
    array = _plain_array(value)
    if array is not None:
        return to_plain(array, _depth + 1)
    if is_dataclass(value) and type(value).__module__.startswith("course_lib."):
        return {f.name: to_plain(getattr(value, f.name), _depth + 1) for f in fields(value)}
    raise NotPlainData(f"a {type(value).__name__} is not plain data: return numbers, "
                       "strings, lists, tuples, dicts or arrays")


def _describe(value: Any) -> str:
    """A short, deterministic description of a value for the report."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


_NOT_LEARNER = (str(Path(__file__).resolve().parent.parent),
                *{sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib",
                                                         "platlib")})
"""Folders whose frames are never the learner's: the course's own package and Python's."""


def _learner_frame(error: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the traceback in the learner's own code, if any."""
    frames = traceback.extract_tb(error.__traceback__)
    mine = [frame for frame in frames
            if frame.line and not str(Path(frame.filename).resolve()).startswith(_NOT_LEARNER)]
    return mine[-1] if mine else None


def describe_error(error: BaseException) -> str:
    """``raised TypeError: message`` plus the line of learner code that raised it.

    Only the learner's own line is quoted, never one of the check's or the library's: an
    error the check hit while reading a result is described by its message alone.
    """
    frame = _learner_frame(error)
    where = f" (line {frame.lineno}: {frame.line})" if frame is not None else ""
    return f"raised {type(error).__name__}: {error}{where}"


def error_names(error: type[BaseException]) -> list[str]:
    """``module.QualName`` of an error class and every base, the plain form of a raise."""
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in error.__mro__]


def observe(case: Case, obj: Any) -> Observation:
    """Run one case against the learner's ``obj`` and keep only plain data of what happened.

    A learner's ``NotImplementedError`` (the unsolved stub) propagates; any other exception
    is evidence.
    """
    try:
        got = case.run(obj)
    except NotImplementedError:
        raise
    except Exception as error:  # the learner's code may raise anything
        return {"raised": error_names(type(error)), "shown": describe_error(error)}
    try:
        return {"value": to_plain(got), "shown": _describe(got)}
    except NotPlainData as error:
        return {"not_plain": str(error), "shown": _describe(got)}


def _leaf(value: Any) -> str:
    """A value inside a difference: short, with its type when the repr could hide it."""
    if isinstance(value, list) and len(repr(value)) > 60:
        return f"a list of {len(value)} items"
    if isinstance(value, dict) and len(repr(value)) > 60:
        return f"a dict of {len(value)} entries"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _label(path: str, key: Any) -> str:
    return str(key) if not path else f"{path}[{key}]"


def first_difference(got: Any, expected: Any, equal: Callable[[Any, Any], bool] = strict_equal,
                     path: str = "") -> str | None:
    """Where plain ``got`` first differs from plain ``expected``, led by the part's label.

    Dict keys label their parts (``arena.copied: got 11, expected 10``), list items their
    index (``result[3]``); None when ``equal`` finds no differing part.
    """
    if isinstance(expected, dict) and isinstance(got, dict):
        for key, want in expected.items():
            if key not in got:
                return f"{_label(path, key)}: missing"
            found = first_difference(got[key], want, equal, _label(path, key))
            if found:
                return found
        extra = [key for key in got if key not in expected]
        return f"{_label(path, extra[0])}: not expected" if extra else None
    if isinstance(expected, list) and isinstance(got, list):
        for index, (item, want) in enumerate(zip(got, expected, strict=False)):
            found = first_difference(item, want, equal, _label(path or "result", index))
            if found:
                return found
        if len(got) != len(expected):
            return f"{path or 'result'}: {len(got)} items, expected {len(expected)}"
        return None
    if equal(got, expected):
        return None
    where, numbers = path or "result", (int, float)
    if type(got) is not type(expected) and (
            repr(got) == repr(expected) or got == expected
            or not (isinstance(got, numbers) and isinstance(expected, numbers))):
        return (f"{where}: got {_leaf(got)} ({type(got).__name__}), expected "
                f"{_leaf(expected)} ({type(expected).__name__})")
    return f"{where}: got {_leaf(got)}, expected {_leaf(expected)}"


def hint_for(case: Case, differs: str) -> str:
    """The hint of the mistake ``differs`` names: ``case.hints`` by the longest label that
    leads ``differs`` (``"a"`` matches ``"a: ..."``, ``"a[2]: ..."``, ``"a.b: ..."`` and
    ``"a #2: ..."``), else ``case.hint``."""
    label = differs.split(": ", 1)[0]
    matching = [key for key in case.hints
                if label == key or (label.startswith(key) and label[len(key)] in "[. ")]
    return case.hints[max(matching, key=len)] if matching else case.hint


def recognising(mistakes: Sequence[tuple[Any, str]],
                equal: Callable[[Any, Any], bool] = strict_equal,
                compare: Callable[[Any, Any], Verdict] | None = None
                ) -> Callable[[Any, Any], Verdict]:
    """A ``compare`` that names the mistake a wrong value comes from.

    ``mistakes`` pairs the value a known mistake gives on this case's inputs (computed by
    the check, in the grader) with the hint for that mistake; a wrong value equal to one of
    them gets its hint, and the hints of every mistake that gives that value when several
    do (the report cannot tell which was made, so it must not name only one), in the order
    of their text: the mistake chooses the hint, never its place in ``mistakes``. Any other
    wrong value gets the case's hints. ``compare`` judges first where a case needs its own
    comparison (one that may already name a hint).
    """
    def judged(got: Any, expected: Any) -> Verdict:
        if compare is not None:
            verdict = compare(got, expected)
        elif equal(got, expected):
            verdict = Verdict(True)
        else:
            verdict = Verdict(False, first_difference(got, expected, equal) or "")
        if verdict.passed or verdict.hint:
            return verdict
        hints = [hint for value, hint in mistakes
                 if not equal(to_plain(value), expected) and equal(got, to_plain(value))]
        return replace(verdict, hint="; or else: ".join(sorted(set(hints)))) if hints \
            else verdict

    return judged


def naming_type(compare: Callable[[Any, Any], Verdict],
                hint: str) -> Callable[[Any, Any], Verdict]:
    """``compare``, naming with ``hint`` a number of the other type that equals the
    expected one (``1.0`` for ``1``, ``0`` for ``0.0``): the right value, the wrong type."""
    def typed(got: Any, expected: Any) -> Verdict:
        verdict = compare(got, expected)
        numbers = (int, float)
        if (not verdict.passed and type(got) in numbers and type(expected) in numbers
                and type(got) is not type(expected) and got == expected):
            return Verdict(False, verdict.differs, hint)
        return verdict

    return typed


def _compared(case: Case, got: Any, expected: Any) -> Verdict:
    """The case's comparison as a :class:`Verdict` that names the part that differs."""
    try:
        found = case.compare(got, expected)
    except Exception as error:  # a comparison on a malformed result
        return Verdict(False, f"result: cannot be read as expected ({type(error).__name__}: "
                              f"{error})")
    if isinstance(found, Verdict):
        return found
    if found:
        return Verdict(True)
    if isinstance(expected, Satisfies):
        return Verdict(False)
    return Verdict(False, first_difference(got, expected) or "")


def judge(case: Case, observation: Observation) -> CaseResult:
    """Compare an observation with the case's expected value, computed in this process."""
    expected, shown = case.expected, observation["shown"]
    if "raised" in observation:
        passed = isinstance(expected, Raises) and error_names(expected.error)[0] in (
            observation["raised"])
        verdict = Verdict(passed, "" if passed else f"raised: {shown.removeprefix('raised ')}")
    elif "not_plain" in observation:
        verdict = Verdict(False, f"returned: {observation['not_plain']}")
    elif isinstance(expected, Raises):
        verdict = Verdict(False, f"returned: {_leaf(observation['value'])}, expected a raise")
    else:
        want = expected if isinstance(expected, Satisfies) else to_plain(expected)
        verdict = _compared(case, observation["value"], want)
    hint = verdict.hint or hint_for(case, verdict.differs)
    return CaseResult(case.call, verdict.passed, shown, _describe(expected), hint,
                      "" if verdict.passed else verdict.differs)


def run_case(case: Case, obj: Any) -> CaseResult:
    """Run one case; a learner's exception is evidence, never a crash."""
    return judge(case, observe(case, obj))


def evaluate(exercise: Exercise, obj: Any, seed: int | None = None) -> CheckResult:
    """Run every case of ``exercise`` (and its fresh cases for ``seed``) against ``obj``."""
    cases = exercise_cases(exercise, seed)
    results: list[CaseResult] = []
    for case in cases:
        try:
            results.append(run_case(case, obj))
        except NotImplementedError:
            return CheckResult(exercise.name, exercise.title, "not-solved", 0, len(cases))
    passed = sum(r.passed for r in results)
    status: Status = "passed" if passed == len(cases) else "failed"
    return CheckResult(exercise.name, exercise.title, status, passed, len(cases), tuple(results))


def first_failure(result: CheckResult) -> CaseResult | None:
    """The first failing case of ``result``: the one a learner reads first."""
    return next((case for case in result.cases if not case.passed), None)


def publish(result: CheckResult) -> None:
    """Show the report in a notebook (with the JSON bundle) or print it elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is a dependency
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(result.mimebundle(), raw=True)
    else:
        print(result.report_text())
