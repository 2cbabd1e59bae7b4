"""Wrong answers (mutants) and right answers, one table per chapter: ``tests/mutants/chNN.py``.

Each table exports ``MUTANTS`` (a list of :class:`Mutant`) and ``RIGHT`` (a list of
:class:`Right`); :func:`tables` finds them, and the registry-wide tests read them:
``tests/test_mutant_hints.py`` requires every mutant to fail with its own hint on the first
failing case of its report, every right answer to pass (with fresh cases too), and at least
four mutants and one right answer per exercise; ``tests/test_fresh_coverage.py`` requires the
fresh cases to catch what the fixed ones catch; ``tests/test_grading_runs_without_reference.py``
runs each exercise's first right answer where the exercise's reference objects are gone, so
that one uses none of them. A helper module here that is not a chapter's table is named
otherwise than ``chNN``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Mutant:
    """A plausible wrong answer to ``exercise`` and the hint its report must show first.

    ``hint`` is a phrase of the hint (not the whole text), so a hint's wording may improve
    while the table still says which mistake each mutant must be told about.
    """

    exercise: str
    name: str
    obj: Any
    hint: str


@dataclass(frozen=True)
class Right:
    """A right answer to ``exercise``: the library's or the notebook's design, or another.

    The first one of each exercise in its table uses none of the exercise's reference
    objects (the grader would refuse it otherwise)."""

    exercise: str
    name: str
    obj: Any


def tables() -> dict[str, ModuleType]:
    """Chapter (``"01"``) -> its table, for every ``tests/mutants/chNN.py``."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__)
                   if re.fullmatch(r"ch\d\d", info.name))
    return {name[2:]: importlib.import_module(f"{__name__}.{name}") for name in names}
