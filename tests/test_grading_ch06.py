"""Chapter 06's checks: a kernel exercise needs a kernel of the learner's own, float32
results and tl.dot operands of 16; a wrong tensor is named by its first wrong part
(``out[b=2, h=5]``); a stub Triton kernel reads as not solved. The kernels that stand in for
the learner's, the other designs and the kept mistakes with their hints are in
tests/mutants/ch06.py.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import paged_attention_decode
from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch06 import _shape_of, split_bounds
from course_lib.grading.check import (
    Case,
    CaseResult,
    CheckResult,
    Raises,
    evaluate,
    judge,
    observe,
)
from course_lib.grading.source import graded_checks, parse_cells
from tests.mutants.ch06 import (
    GQA_MODULO,
    decoder,
    splitter,
    torch_decode,
    torch_split,
)

# isort: split
# Triton after course_lib.attention, which switches the interpreter on when there is no GPU.
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]

NAMES = [exercise.name for exercise in chapter_exercises("06")]


def run(name: str, obj: Any) -> CheckResult:
    with warnings.catch_warnings():  # a wrong kernel's NaN makes numpy warn in the interpreter
        warnings.simplefilter("ignore", RuntimeWarning)
        return evaluate(find_exercise(name), obj)


# --- other designs and mistakes: tests/mutants/ch06.py (their hints: tests/test_mutant_hints.py)


def test_the_old_torch_answers_and_the_course_kernel_are_refused_for_want_of_a_kernel() -> None:
    for name, answer in (("06.paged_decode", torch_decode), ("06.paged_decode",
                                                            paged_attention_decode),
                         ("06.split_decode", torch_split)):
        result = run(name, answer)
        assert result.passed == 0 and all(
            case.differs.startswith("launches: none of your own") for case in result.cases)


def test_launches_are_counted_and_the_interpreter_is_restored() -> None:
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    before = (JITFunction.run, interpreter.InterpretedFunction.run,
              interpreter.interpreter_builder.codegen_fns["min_dot_size"])
    case = find_exercise("06.paged_decode").cases()[0]
    observed = observe(case, decoder())
    assert observed["value"]["launched"] == ["split_kernel"]
    assert (JITFunction.run, interpreter.InterpretedFunction.run,
            interpreter.interpreter_builder.codegen_fns["min_dot_size"]) == before


# --- reports and stubs ----------------------------------------------------------------------------


def test_a_non_tensor_answer_is_described_not_crashed() -> None:
    result = run("06.merge_splits", lambda outputs, lses: "merged")
    assert result.status == "failed"
    assert result.cases[0].differs == "out: str 'merged', not a tensor"
    result = run("06.merge_splits", lambda outputs, lses: outputs)
    assert "expected shape (16,)" in result.cases[1].differs
    result = run("06.split_decode", splitter_returning_one())
    assert "not a tuple of 3 (part_out, part_lse, out)" in result.cases[0].differs


def splitter_returning_one() -> Any:
    """A launcher that runs a kernel of its own, then returns one tensor, not three."""
    def launch(*args: Any) -> torch.Tensor:
        return splitter()(*args)[0]
    return launch


@given(seq_len=st.integers(1, 500), num_splits=st.integers(1, 40))
def test_split_bounds_cover_the_sequence_in_order(seq_len: int, num_splits: int) -> None:
    bounds = split_bounds(seq_len, num_splits)
    assert len(bounds) == num_splits and bounds[0][0] == 0 and bounds[-1][1] == seq_len
    share = math.ceil(seq_len / num_splits)
    for (lo, hi), (next_lo, _) in zip(bounds, [*bounds[1:], (seq_len, None)], strict=True):
        assert 0 <= hi - lo <= share and hi == next_lo


def judged(case: Case, got: Any) -> CaseResult:
    """The case run on a learner's function returning ``got``, judged as the grader does."""
    return judge(case, observe(case, lambda *args: got))


@settings(max_examples=50, deadline=None)
@given(index=st.integers(0, 15), error=st.floats(2e-3, 1e6) | st.just(math.nan))
def test_one_element_off_is_rejected_and_named(index: int, error: float) -> None:
    case = find_exercise("06.merge_splits").cases()[1]
    got = case.expected.explain.wants[0].value.clone()
    got[index] += error
    result = judged(case, got)
    assert not result.passed
    assert result.differs.startswith("out: largest error " if error == error else "out: 1 of")
    assert f"1 of 16 elements wrong, first at [{index}]: " in result.differs


@settings(max_examples=20, deadline=None)
@given(b=st.integers(0, 1), h=st.integers(0, 2), d=st.integers(0, 15))
def test_the_first_wrong_row_is_named_by_its_dimensions(b: int, h: int, d: int) -> None:
    case = find_exercise("06.merge_splits").cases()[-1]
    got = case.expected.explain.wants[0].value.clone()
    got[b, h, d] += 3.0
    result = judged(case, got)
    assert result.differs.startswith(f"out[b={b}, h={h}]: largest error 3; 1 of 16 elements "
                                     f"wrong, first at [{d}]: ")


def test_the_comparison_takes_plain_lists_and_keeps_nan() -> None:
    case = find_exercise("06.merge_splits").cases()[1]
    want = case.expected.explain.wants[0].value
    assert judged(case, want).passed and judged(case, want.tolist()).passed
    poisoned = want.tolist()
    poisoned[3] = math.nan
    assert "1 NaN" in judged(case, poisoned).differs
    assert "expected shape (16,)" in judged(case, [[x] for x in want.tolist()]).differs


def test_a_wrong_gqa_mapping_gets_the_gqa_hint_not_the_cases() -> None:
    """Issue 20: a wrong head mapping was told to subtract the maximum."""
    for case in find_exercise("06.paged_decode").cases():
        if "q x 1000" in case.call:
            result = judge(case, observe(case, decoder(GQA_MODULO)))
            assert not result.passed and "h // group" in result.hint, result
            assert "subtract the maximum" not in result.hint


def test_a_faked_verdict_string_is_not_accepted() -> None:
    for name in ("06.paged_decode", "06.merge_splits", "06.split_decode"):
        case = find_exercise(name).cases()[0]
        assert not judged(case, "a tensor of shape (1, 2, 16), every element within "
                                "tolerance").passed
        assert not judge(case, {"value": {"parts": {"out": "right"}, "launched": ["k"],
                                          "refused": ""}, "shown": ""}).passed


def test_the_grader_finds_every_check_of_the_solution() -> None:
    """The grader's static reading finds each exercise's graded object in the solution (the
    course's own kernel is withheld from the sandbox: tests/test_grader_sandbox.py)."""
    path = ROOT / "solutions" / "06_triton_paged_attention.ipynb"
    sources = ["".join(c["source"]) if c["cell_type"] == "code" else ""
               for c in json.loads(path.read_text())["cells"]]
    exercises = {e.name: e for e in chapter_exercises("06")}
    assert set(graded_checks(parse_cells(sources), exercises)) == set(exercises)


@triton.jit
def stub_kernel(q_ptr, HEAD_DIM: tl.constexpr):
    raise NotImplementedError("one program per (sequence, KV head)")


def stub_launcher(q: torch.Tensor, *args: Any) -> torch.Tensor:
    stub_kernel[(1,)](q, HEAD_DIM=q.shape[-1])
    return q


def kinds(cases: Sequence[Case]) -> set[tuple[str, str, bool]]:
    """The kinds of cases: each one's hint with its numbers blanked, the mistake a tensor
    case alone is built to show, and whether it must raise."""
    return {(re.sub(r"\d+", "N", case.hint),
             getattr(getattr(case.expected, "explain", None), "targeted", ""),
             isinstance(case.expected, Raises)) for case in cases}


@pytest.mark.parametrize("name", NAMES)
def test_fresh_cases_hold_every_kind_of_fixed_case(name: str) -> None:
    """The grader scores fresh cases only: each seed's draw holds a case of every kind the
    fixed cases hold (each mistake's hint, each targeted mistake, each impossible input)."""
    exercise = find_exercise(name)
    assert exercise.fresh is not None
    for seed in (0, 1):
        fresh = exercise.fresh(seed)
        assert kinds(exercise.cases()) <= kinds(fresh), seed
        assert {case.call for case in fresh}.isdisjoint(case.call for case in exercise.cases())


def test_a_stub_kernel_is_not_yet_solved() -> None:
    for name in ("06.paged_decode", "06.split_decode"):
        result = run(name, stub_launcher)
        assert (result.status, result.passed) == ("not-solved", 0)


def test_a_returned_object_is_shown_by_its_type_never_its_own_repr() -> None:
    class Costly:  # a tensor view of a 4 GiB FP8 cache took 30 s to print
        def __repr__(self) -> str:
            raise AssertionError("the report printed a returned object")

    assert _shape_of(Costly()) == "<Costly object>"
    assert _shape_of([Costly(), torch.zeros(2, 3), None, 1.5, True, "ab"]) == (
        "[<Costly object>, float32 tensor (2, 3), None, 1.5, True, 'ab']")
