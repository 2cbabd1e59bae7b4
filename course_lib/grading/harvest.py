"""Both sides of the harvest: the cases the grader ships in, the plain data that comes out.

The grader builds every case in its own process and ships into the learner's kernel only
each case's ``call`` text and ``run`` code (by value, with cloudpickle), in the cell it adds
after an exercise's last ``check``, so no case is in the kernel before that cell runs and
no expected value ever is. In the kernel, :func:`harvest` runs the cases on the graded
object and prints the observations (see ``check.observe``) as JSON between two copies of a
nonce. Nothing here decides a score: the grader validates the JSON and judges it.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import cloudpickle

from course_lib.grading.check import Case, Observation, describe_error, error_names, observe
from course_lib.grading.withheld import WITHHELD, GradingUnavailable, is_withheld

_UNAVAILABLE = error_names(GradingUnavailable)[0]


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with the ``functools.cache`` functions of the by-value modules by value
    too (cloudpickle would name them, and their module is not in the sandbox)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, functools._lru_cache_wrapper) and (
                obj.__module__ in self.by_value):
            return functools.cache, (obj.__wrapped__,)
        return super().reducer_override(obj)


_SHIPPING = threading.Lock()
"""cloudpickle's by-value registry is global: chapters are shipped from several threads."""


def ship(cases: Sequence[Case], modules: Sequence[ModuleType]) -> str:
    """The cases' calls and run code as text for a cell: ``modules`` (the exercise modules,
    absent from the sandbox) travel by value, everything else by reference. They stay
    registered in this process, which only ever pickles to ship cases."""
    buffer = io.BytesIO()
    with _SHIPPING:
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
        pickler = _Pickler(buffer)
        pickler.by_value = {module.__name__ for module in modules}
        pickler.dump([(case.call, case.run) for case in cases])
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def uses_withheld(observation: Observation) -> bool:
    """Whether a case ran into the withheld answer key."""
    return _UNAVAILABLE in observation.get("raised", ())


def withheld_name(observation: Observation) -> str:
    """The withheld object an observation's refusal names."""
    shown = observation["shown"]
    name = shown.partition(": ")[2].partition(f" {WITHHELD}")[0]
    return name[:120] or "the answer key"


def _refusing_withheld(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``run``, raising the refusal where it returns a value built from a withheld object."""

    def guarded(obj: Any) -> Any:
        value = run(obj)
        if is_withheld(value):
            raise GradingUnavailable(f"{value!r} is the reference implementation")
        return value

    return guarded


def harvest(shipped: str, graded: Callable[[], Any], nonce: str) -> None:
    """Run the shipped cases on ``graded()`` and print the observations between nonces."""
    pairs = cloudpickle.loads(base64.b64decode(shipped))
    cases = [Case(call, _refusing_withheld(run), None, "") for call, run in pairs]
    payload: dict[str, Any] = {"calls": [case.call for case in cases]}
    try:
        obj = graded()
    except Exception as error:  # the graded name may be undefined, or raise
        payload["missing"] = describe_error(error)
    else:
        try:
            payload["observations"] = [observe(case, obj) for case in cases]
        except NotImplementedError:
            payload["not_solved"] = True
    sys.stdout.write(f"{nonce}{json.dumps(payload)}{nonce}\n")
    sys.stdout.flush()
