"""Chapter 10's kernel exercise (``10.fp8_decode``) beyond what every exercise is held to
(its right answers and mistakes, in tests/mutants/ch10_kernel.py, are checked by
tests/test_mutant_hints.py and tests/test_fresh_coverage.py): a stub *kernel* reads as not
solved, and the learner's side of a case holds the codes, never the answer.
"""

from __future__ import annotations

import base64
import sys
import warnings
from typing import Any

import torch

from course_lib.grading.ch10_kernel import FP8_DECODE, fp8_inputs
from course_lib.grading.check import CheckResult, evaluate, observe
from course_lib.grading.harvest import ship
from tests.mutants.ch10_kernel import fp8_decoder

# isort: split
# Triton after course_lib.attention, which switches the interpreter on when there is no GPU.
import triton
import triton.language as tl

FIXED = len(FP8_DECODE.cases())


def run(obj: Any, seed: int | None = None) -> CheckResult:
    with warnings.catch_warnings():  # a wrong kernel's NaN makes numpy warn in the interpreter
        warnings.simplefilter("ignore", RuntimeWarning)
        return evaluate(FP8_DECODE, obj, seed=seed)


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
