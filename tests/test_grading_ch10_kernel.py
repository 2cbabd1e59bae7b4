"""Chapter 10's kernel exercise (``10.fp8_decode``), checked directly on its Exercise object
(so it is tested before ``course_lib.grading.ch10`` lists it): the right answers of two
designs pass fixed and fresh cases, each kept mistake fails with its own hint first and is
caught by the fresh cases too, a stub reads as not solved, and the learner's side of a case
holds the codes, never the answer. The kernels are in tests/mutants/ch10_kernel.py.
"""

from __future__ import annotations

import base64
import sys
import warnings
from typing import Any

import pytest
import torch

from course_lib.grading.ch10_kernel import FP8_DECODE, fp8_inputs
from course_lib.grading.check import CheckResult, evaluate, first_failure, observe
from course_lib.grading.harvest import ship
from tests.mutants.ch10_kernel import KERNEL_MUTANTS, KERNEL_RIGHT, fp8_decoder

# isort: split
# Triton after course_lib.attention, which switches the interpreter on when there is no GPU.
import triton
import triton.language as tl

FIXED = len(FP8_DECODE.cases())


def run(obj: Any, seed: int | None = None) -> CheckResult:
    with warnings.catch_warnings():  # a wrong kernel's NaN makes numpy warn in the interpreter
        warnings.simplefilter("ignore", RuntimeWarning)
        return evaluate(FP8_DECODE, obj, seed=seed)


@pytest.mark.parametrize("right", KERNEL_RIGHT, ids=lambda r: r.name)
@pytest.mark.parametrize("seed", [0, 7])
def test_a_right_answer_passes_fixed_and_fresh_cases(right: Any, seed: int) -> None:
    result = run(right.obj, seed)
    assert result.status == "passed", result.report_text()
    assert result.total == FIXED + len(FP8_DECODE.fresh(seed))


@pytest.mark.parametrize("mutant", KERNEL_MUTANTS, ids=lambda m: m.name)
def test_a_mistake_fails_first_with_its_hint_and_fresh_cases_catch_it(mutant: Any) -> None:
    result = run(mutant.obj, seed=3)
    first = first_failure(result)
    assert result.status == "failed" and first is not None, result.report_text()
    assert mutant.hint in first.hint, result.report_text()
    assert first.differs
    assert not all(case.passed for case in result.cases[FIXED:]), "no fresh case caught it"


def test_fresh_cases_are_drawn_from_the_seed() -> None:
    calls = {seed: [case.call for case in FP8_DECODE.fresh(seed)] for seed in (1, 2)}
    assert calls[1] == [case.call for case in FP8_DECODE.fresh(1)]
    assert calls[1] != calls[2]
    assert len(calls[1]) == FIXED


@triton.jit
def _stub_kernel(out_ptr):
    raise NotImplementedError("write the kernel")
    tl.store(out_ptr, 0.0)


def test_a_stub_kernel_reads_as_not_solved() -> None:
    def launcher(q: torch.Tensor, *args: Any) -> torch.Tensor:
        out = torch.empty(q.shape, device=q.device)
        _stub_kernel[(1,)](out)
        return out

    assert run(launcher).status == "not-solved"


def test_the_learners_side_holds_codes_not_the_answer() -> None:
    """A case's run returns what the learner's launch gave, with the kernels it launched;
    what the grader ships of it holds the FP8 codes, never the expected tensor."""
    case = FP8_DECODE.cases()[0]
    observed = observe(case, fp8_decoder())
    assert observed["value"]["launched"] == ["fp8_tile_kernel"]
    modules = [sys.modules[name] for name in ("course_lib.grading.ch10_kernel",
                                              "course_lib.grading.ch06")]
    shipped = base64.b64decode(ship([case], modules))
    inputs = fp8_inputs(2, 2, 16, [5], seed=1)
    assert inputs.k_cache.view(torch.uint8).numpy().tobytes() in shipped
    want = case.expected.explain.match.wants[0].value
    assert want.numpy().tobytes() not in shipped
    assert (inputs.k_cache.view(torch.uint8)[inputs.block_tables[0, 0], 5:] == 0x7F).all()
