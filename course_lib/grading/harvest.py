"""Kernel side of grading: run one exercise's cases on the learner's object, print plain data.

The grader adds one cell per exercise after the notebook's last ``check`` for it, calling
``harvest(name, lambda: EXPR, nonce)``. The observations (see ``check.observe``) go to stdout
as JSON between two copies of the nonce. Nothing here decides a score: the grader validates
the JSON and judges it against expected values it computes in its own process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from course_lib.grading import find_exercise
from course_lib.grading.check import Case, describe_error, observe


def _blind_cases(name: str) -> list[Case]:
    """Exercise ``name``'s cases without their expected values, which the grader keeps: the
    learner's code runs next, and must not find the answers in this process."""
    return [replace(case, expected=None, compare=None) for case in find_exercise(name).cases()]


def harvest(name: str, graded: Callable[[], Any], nonce: str) -> None:
    """Observe every case of exercise ``name`` on ``graded()`` and print the JSON."""
    cases = _blind_cases(name)
    payload: dict[str, Any] = {"exercise": name, "calls": [case.call for case in cases]}
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
