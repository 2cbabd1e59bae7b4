"""Wrong answers (mutants) and right answers of other designs, one module per chapter.

Each ``tests/mutants/chNN.py`` exports ``MUTANTS`` (a list of :class:`Mutant`) and ``RIGHT``
(a list of :class:`Right`). ``tests/test_mutant_hints.py`` requires every mutant to fail
with its own hint on the first failing case of its report, every right answer to pass (with
fresh cases too), and at least four mutants and one right answer per exercise.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    """A right answer to ``exercise`` of another design than the solution notebook's."""

    exercise: str
    name: str
    obj: Any
