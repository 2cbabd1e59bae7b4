"""Nothing shipped can answer: what the grader ships into a learner's kernel carries no
exercise's answer, however the learner reaches it.

For every graded chapter, every callable reachable from the shipped cases (the ``run``
functions, their globals, closures, defaults, code constants, classes and containers, as
they unpickle in the chapter's sandbox library) is tried as the graded object of every
exercise of the chapter, and none may pass more cases than a function that only raises or
only returns None. Then, through the real grader, a chapter 04 notebook that searches the
call stack and every unpickled case for something that answers scores zero beside a
classmate's solution that scores full marks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import GRADED_CHAPTERS
from course_lib.grading.check import Case, judge
from course_lib.grading.grade import build_chapter, grade_folder, judge_cases
from course_lib.grading.sandbox import library_copy, write_library
from course_lib.limits import GRADER_MEMORY_MB

pytestmark = pytest.mark.filterwarnings(  # a stray kernel's NaN makes the interpreter warn
    "ignore::RuntimeWarning:triton.runtime.interpreter")

ROOT = Path(__file__).resolve().parent.parent
CH04 = "04_copy_on_write_and_prefix_sharing.ipynb"
SEED = 5

STAND_INS = ("<raises ValueError>", "<returns None>")
"""The trivial answers every candidate is measured against."""

PROBE = r'''
import base64, contextlib, gc, io, json, resource, signal, sys, types
from pathlib import Path

LIMIT_AS = int(sys.argv[3]) << 20  # a graded kernel's address space, set before any import
resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))

import cloudpickle

import course_lib
from course_lib.grading.harvest import harvest

COPY, NONCE, LIMIT = Path(sys.argv[1]).resolve(), "e" * 32, int(sys.argv[2])
assert COPY in Path(course_lib.__file__).resolve().parents, course_lib.__file__
shipped = json.load(sys.stdin)


class Overran(BaseException):
    """A candidate that ran past its time: it answers nothing."""


def overran(*args):
    raise Overran


def importable(obj):
    """Whether ``obj`` is what its module names it (a library function or class, shipped by
    reference: the learner may import it anyway), so not the payload's own."""
    try:
        found = module = sys.modules.get(getattr(obj, "__module__", None) or "")
        for part in (getattr(obj, "__qualname__", None) or "<>").split("."):
            found = getattr(found, part, None)
    except Exception:  # a withheld stand-in refuses to be looked into
        return False
    return module is not None and found is obj


def reachable(roots):
    """Every object reachable from ``roots`` through the payload's own objects (functions
    with their globals, closures, defaults and code constants, classes with their members,
    bound methods, containers, instances): modules, module namespaces and what the library
    names are reached, never entered."""
    namespaces = {id(vars(m)) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    seen, todo = {}, list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in namespaces or isinstance(obj, types.ModuleType):
            continue
        seen[id(obj)] = obj
        if importable(obj):
            continue
        todo.extend(gc.get_referents(obj))
        if isinstance(obj, types.FunctionType):
            todo.extend([obj.__globals__, obj.__closure__, obj.__defaults__,
                         obj.__kwdefaults__, obj.__code__.co_consts])
    return list(seen.values())


def key(obj):
    """One name for copies of one object that several exercises' payloads each unpickle."""
    code = getattr(obj, "__code__", None)
    where = (code.co_filename, code.co_firstlineno, code.co_code) if code else ()
    if code or isinstance(obj, type):
        return (type(obj).__name__, getattr(obj, "__module__", ""), obj.__qualname__, where)
    return (type(obj).__name__, id(obj))


def name(obj):
    return (f"{getattr(obj, '__module__', None) or type(obj).__module__}."
            f"{getattr(obj, '__qualname__', None) or type(obj).__qualname__}")


def raises(*args, **kwargs):
    raise ValueError("a stand-in")


def returns_none(*args, **kwargs):
    return None


candidates = {"<raises ValueError>": raises, "<returns None>": returns_none}
found = {}
for text in shipped.values():
    for obj in reachable(cloudpickle.loads(base64.b64decode(text))):
        if callable(obj):
            found.setdefault(key(obj), obj)
for obj in found.values():
    label = name(obj)
    while label in candidates:
        label += "'"
    candidates[label] = obj

signal.signal(signal.SIGALRM, overran)
results = {}
for exercise, text in shipped.items():
    for label, obj in candidates.items():
        out = io.StringIO()
        signal.alarm(LIMIT)
        try:
            with contextlib.redirect_stdout(out):
                harvest(text, lambda: obj, NONCE)
        except BaseException as error:  # a candidate may raise SystemExit, or overrun
            out = io.StringIO(f"{NONCE}{type(error).__name__}{NONCE}")
        finally:
            signal.alarm(0)
        results.setdefault(exercise, {})[label] = out.getvalue().split(NONCE)[1]
print(NONCE + json.dumps(results) + NONCE)
'''


def _passed(text: str, cases: list[Case]) -> int:
    """How many cases one harvest passes (0 when it is not a valid harvest)."""
    try:
        observations = json.loads(text).get("observations") or []
    except (ValueError, AttributeError):
        return 0
    return sum(judge(case, obs).passed for case, obs in zip(cases, observations, strict=False))


def _harvests(chapter: str, shipped: dict[str, str], folder: Path) -> dict[str, dict[str, str]]:
    """Exercise -> candidate -> the harvest it gave, observed in the sandbox's library."""
    write_library(library_copy(chapter), folder)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(folder), "MPLBACKEND": "Agg",
           "HOME": str(folder), "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE, str(folder), "120",
                           str(GRADER_MEMORY_MB)],
                          input=json.dumps(shipped), env=env, cwd=folder, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("e" * 32)[1])


@pytest.mark.parametrize("chapter", GRADED_CHAPTERS)
def test_no_shipped_callable_answers_any_exercise(chapter: str, tmp_path: Path) -> None:
    built = build_chapter(chapter, SEED)
    harvests = _harvests(chapter, dict(built.shipped), tmp_path)
    leaks = []
    for exercise, by_candidate in harvests.items():
        cases, fixed = built.cases[exercise], built.fixed[exercise]

        def measured(text: str, cases: list[Case] = cases, fixed: int = fixed) -> tuple:
            return judge_cases(text, cases, fixed).score, _passed(text, cases)

        scores = {label: measured(text) for label, text in by_candidate.items()}
        floor = tuple(max(scores[s][i] for s in STAND_INS) for i in range(2))
        leaks += [f"{label} scores {score:.2f} ({passed} cases) on {exercise}, a stand-in "
                  f"{floor[0]:.2f} ({floor[1]} cases)"
                  for label, (score, passed) in scores.items()
                  if score > floor[0] or passed > floor[1]]
    assert len(harvests) == len(built.shipped) and all(
        len(by) > len(STAND_INS) for by in harvests.values())
    assert not leaks, "\n".join(leaks)


# --- the same attack through the real grader ----------------------------------------------

SNOOP = r'''
import copy, inspect, sys, types
import cloudpickle

LOADED, CHOSEN = [], {}
_real_loads = cloudpickle.loads


def _loads(data, *args, **kwargs):
    value = _real_loads(data, *args, **kwargs)
    LOADED.append(value)
    return value


cloudpickle.loads = _loads


def _inside(obj):
    """What an object leads to: globals, closures, defaults, members, items."""
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, list | tuple | set | frozenset):
        return list(obj)
    if isinstance(obj, types.FunctionType):
        cells = []
        for cell in obj.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:
                pass
        return [obj.__globals__, obj.__defaults__ or (), obj.__kwdefaults__ or {}, cells]
    if isinstance(obj, types.MethodType):
        return [obj.__func__, obj.__self__]
    if isinstance(obj, type):
        return list(vars(obj).values())
    return [vars(obj)] if isinstance(getattr(obj, "__dict__", None), dict) else []


def _reachable(roots):
    namespaces = {id(vars(m)) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    seen, todo = {}, list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in namespaces or isinstance(obj, types.ModuleType):
            continue
        seen[id(obj)] = obj
        todo += _inside(obj)
    return seen.values()


def _choose(keyword, args, accept):
    """The first callable on the stack or in the unpickled cases, named like the answer,
    that runs on copies of the arguments and gives a plausible result."""
    frames, frame = [LOADED], sys._getframe()
    while frame is not None:
        frames += [frame.f_locals, frame.f_globals]
        frame = frame.f_back
    for found in _reachable(frames):
        name = str(getattr(found, "__name__", "")).lower()
        if not callable(found) or keyword not in name or getattr(
                found, "__module__", "") == "__main__":
            continue
        try:
            inspect.signature(found).bind(*args)
            if accept(found(*copy.deepcopy(args))):
                return found
        except Exception:
            continue
    return None


def _delegate(keyword, args, accept):
    key = (keyword, len(LOADED))
    if key not in CHOSEN:
        CHOSEN[key] = _choose(keyword, args, accept)
    if CHOSEN[key] is None:
        raise NotImplementedError(f"nothing shipped answers {keyword}")
    return CHOSEN[key](*args)


def fork(pool, table):
    return _delegate("fork", (pool, table), lambda child: isinstance(child, list))


def append_token(pool, table, length):
    return _delegate("append", (pool, table, length), lambda new: type(new) is int)
'''
"""A notebook's ``fork`` and ``append_token`` that answer with whatever the grader ships:
any callable named like the answer, found through the call stack (locals, globals and
closures of every function there) or in what ``cloudpickle.loads`` unpickles."""


def _notebook(*cells: str) -> str:
    sources = ["from course_lib.grading import check", *map(textwrap.dedent, cells)]
    return nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in sources]))


def test_a_notebook_that_answers_with_what_is_shipped_scores_zero(tmp_path: Path) -> None:
    """Each exercise's harvest runs after its last check: one snoop meets fork's cases first,
    the other append_token's, so each can use what the other exercise's cases brought."""
    subs = tmp_path / "subs"
    checks = {"fork": 'check("04.fork", fork)',
              "append_token": 'check("04.append_token", append_token)'}
    snoops = {"snoop-fork-first": [checks["fork"], checks["append_token"]],
              "snoop-append-first": [checks["append_token"], checks["fork"]]}
    for learner, cells in snoops.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / CH04).write_text(_notebook(SNOOP, *cells))
    (subs / "classmate").mkdir()
    shutil.copy(ROOT / "solutions" / CH04, subs / "classmate" / CH04)
    report = grade_folder(subs, jobs=2, chapters=["04"], seed=SEED)
    assert not report.problems, report.problems
    rows = {(row.learner, row.exercise): row for row in report.rows}
    for learner in snoops:
        for exercise in ("04.fork", "04.append_token"):
            assert rows[learner, exercise].score == 0.0, rows[learner, exercise]
    assert {row.score for row in report.rows if row.learner == "classmate"} == {1.0}, [
        row for row in report.rows if row.learner == "classmate"]
