"""Run one exercise's behavioural cases against a learner's function or class.

``check(name, obj)`` never raises because of the learner's code: every case runs inside a
guard, and the report says what was called, what came back, what was expected and a hint.
The result also goes into the cell output under ``CHECK_MIME`` as JSON, for tools and
tests; the instructor's grader never reads it. Both ``check`` and the grader compare only
plain data (``to_plain``): ``observe`` runs a case where the learner's code is, ``judge``
compares where the expected value is, so the grader can judge outside the learner's process.
"""

from __future__ import annotations

import html
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
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
class Satisfies:
    """Expected outcome of a case with more than one right answer: any value ``holds`` accepts.

    ``description`` is what the report shows as expected (e.g. "3 slabs of 30 slots inside
    0..100, none overlapping"). Use it with ``compare=satisfies``.
    """

    description: str
    holds: Callable[[Any], bool]

    def __repr__(self) -> str:
        return self.description


def satisfies(got: Any, expected: Satisfies) -> bool:
    """``compare`` for a :class:`Satisfies` expectation."""
    return bool(expected.holds(got))


def approx_equal(got: Any, expected: Any, rel: float = 1e-9, abs_: float = 1e-12) -> bool:
    """Equality that tolerates float rounding, element-wise through tuples and lists."""
    if isinstance(expected, float) or isinstance(got, float):
        try:
            return math.isclose(float(got), float(expected), rel_tol=rel, abs_tol=abs_)
        except (TypeError, ValueError):
            return False
    if isinstance(expected, tuple | list) and isinstance(got, tuple | list):
        return len(got) == len(expected) and all(
            approx_equal(g, e, rel, abs_) for g, e in zip(got, expected, strict=True)
        )
    return bool(got == expected)


def strict_equal(got: Any, expected: Any) -> bool:
    """Equal plain data of the same types all the way down: ``True`` is not ``1`` and ``7.0``
    is not ``7``; floats may differ by rounding, as in :func:`approx_equal`."""
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
    """One behavioural test: ``run(obj)`` calls the learner's code as ``call`` describes."""

    call: str
    run: Callable[[Any], Any]
    expected: Any
    hint: str
    compare: Callable[[Any, Any], bool] = approx_equal


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


@dataclass(frozen=True)
class CaseResult:
    """What one case did: passed or not, and the evidence for the report."""

    call: str
    passed: bool
    got: str
    expected: str
    hint: str


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
                    lines.append(f"         got      {case.got}")
                    lines.append(f"         expected {case.expected}")
                    lines.append(f"         hint     {case.hint}")
        return "\n".join(lines)

    def report_html(self) -> str:
        """The same report as a small styled block for Jupyter."""
        colour = {"passed": "#1a7f37", "failed": "#cf222e", "not-solved": "#9a6700"}[self.status]
        body = html.escape(self.report_text())
        return (
            f'<pre class="course-check" data-status="{self.status}" '
            f'style="border-left:4px solid {colour};padding:6px 10px;'
            f'background:#f6f8fa;white-space:pre-wrap">{body}</pre>'
        )

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


def _plain_array(value: Any) -> Any | None:
    """numpy arrays and scalars, torch tensors: nested lists of Python numbers, else None."""
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return torch.Tensor.tolist(torch.Tensor.detach(value).cpu())
    if numpy is not None and isinstance(value, numpy.ndarray | numpy.generic):
        array = numpy.asarray(value)
        if array.dtype.kind not in "biuf":
            raise NotPlainData(f"an array of dtype {array.dtype} is not plain data")
        return numpy.ndarray.tolist(array)
    return None


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


def describe_error(error: BaseException) -> str:
    """``raised TypeError: message`` plus the line of learner code that raised it."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames and frames[-1].line else ""
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


def judge(case: Case, observation: Observation) -> CaseResult:
    """Compare an observation with the case's expected value, computed in this process."""
    expected, shown = case.expected, observation["shown"]
    if "raised" in observation:
        passed = isinstance(expected, Raises) and error_names(expected.error)[0] in (
            observation["raised"])
    elif "not_plain" in observation:
        passed, shown = False, f"{shown} ({observation['not_plain']})"
    elif isinstance(expected, Raises):
        passed = False
    else:
        try:
            want = expected if isinstance(expected, Satisfies) else to_plain(expected)
            passed = bool(case.compare(observation["value"], want))
        except Exception as error:  # a comparison on a malformed result
            passed, shown = False, f"{shown} ({describe_error(error)})"
    return CaseResult(case.call, passed, shown, _describe(expected), case.hint)


def run_case(case: Case, obj: Any) -> CaseResult:
    """Run one case; a learner's exception is evidence, never a crash."""
    return judge(case, observe(case, obj))


def evaluate(exercise: Exercise, obj: Any) -> CheckResult:
    """Run every case of ``exercise`` against ``obj`` and collect a result."""
    cases = list(exercise.cases())
    results: list[CaseResult] = []
    for case in cases:
        try:
            results.append(run_case(case, obj))
        except NotImplementedError:
            return CheckResult(exercise.name, exercise.title, "not-solved", 0, len(cases))
    passed = sum(r.passed for r in results)
    status: Status = "passed" if passed == len(cases) else "failed"
    return CheckResult(exercise.name, exercise.title, status, passed, len(cases), tuple(results))


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
