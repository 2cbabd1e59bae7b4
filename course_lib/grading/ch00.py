"""Chapter 00's warm-up exercise, used to show how ``check`` reports."""

from __future__ import annotations

from course_lib.grading.check import Case, Exercise, Raises


def _to_kib_cases() -> list[Case]:
    hint = ("one KiB is 1,024 bytes and the answer is a float (1.0, not 1); negative sizes are "
            "a mistake: raise ValueError")
    sizes = (0, 1024, 131_072, 1536)
    cases = [Case(f"fn({n})", lambda fn, n=n: fn(n), n / 1024, hint) for n in sizes]
    cases.append(Case("fn(-1)", lambda fn: fn(-1), Raises(ValueError), hint))
    return cases


EXERCISES = (Exercise("00.to_kib", "Bytes to KiB", _to_kib_cases),)
