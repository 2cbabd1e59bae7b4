"""Chapter 06's checks: a correct answer passes every case, other correct designs pass too,
typical mistakes (at least three per exercise) fail with a report that names the call, what
came back, what was expected and a hint, and stubs (a Triton kernel's included) read as not
solved. The kernels below stand in for the learner's: one correct design whose mistakes can
be switched on one at a time, and a second correct design that walks whole blocks in base 2.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import paged_attention_decode
from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch06 import split_bounds
from course_lib.grading.check import (
    Case,
    CaseResult,
    CheckResult,
    evaluate,
    judge,
    observe,
)
from course_lib.grading.source import graded_checks, parse_cells, uses_reference

# isort: split
# Triton after course_lib.attention, which switches the interpreter on when there is no GPU.
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]

# --- kernels like the learner's: one correct design with switchable mistakes, and another -----

# Which mistake a kernel makes; constexpr so that the kernels may read them as globals.
NONE, INT32_BLOCK, TILE_MAX, NO_MAX, UNMASKED_V, GQA_MODULO, MASK_LE, NO_RESCALE, \
    NO_NORMALISE, LSE_NO_MAX, LSE_BASE2, EMPTY_NAN, FLOOR_SHARE = map(tl.constexpr, range(13))


@triton.jit
def split_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, lse_ptr, scale,
                 num_splits,
                 stride_qb, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd,
                 stride_vb, stride_vt, stride_vh, stride_vd, stride_tb, stride_tn,
                 GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MISTAKE: tl.constexpr):
    """One (sequence, KV head, split): tiles of TILE_N tokens, tl.dot, natural exp.

    Writes the split's normalised output to out[seq, head, split] and its log-sum-exp to
    lse[seq, head, split] (both contiguous, float32). ``MISTAKE`` switches one learner
    mistake on.
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    if MISTAKE == FLOOR_SHARE:
        share = tl.maximum(seq_len // num_splits, 1)
    else:
        share = tl.cdiv(seq_len, num_splits)
    lo = tl.minimum(split * share, seq_len)
    hi = tl.minimum(lo + share, seq_len)
    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    # Query head h reads KV head h // GROUP; the mistake reads KV head h % kv_heads.
    heads = rows * tl.num_programs(1) + kv_head if MISTAKE == GQA_MODULO else kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(lo, hi, TILE_N):
        tokens = start + tl.arange(0, TILE_N)
        ok = tokens < hi
        block = tl.load(table_ptr + seq * stride_tb + (tokens // BLOCK_SIZE) * stride_tn,
                        mask=ok, other=0)
        if MISTAKE != INT32_BLOCK:
            block = block.to(tl.int64)
        if MISTAKE == MASK_LE:
            ok = tokens <= hi
        slot = tokens % BLOCK_SIZE
        k = tl.load(k_ptr + (block * stride_kb + slot * stride_kt + kv_head * stride_kh)[:, None]
                    + dims[None, :] * stride_kd, mask=ok[:, None], other=0.0)
        v_rows = v_ptr + (block * stride_vb + slot * stride_vt + kv_head * stride_vh)[:, None]
        if MISTAKE == UNMASKED_V:
            v = tl.load(v_rows + dims[None, :] * stride_vd)
        else:
            v = tl.load(v_rows + dims[None, :] * stride_vd, mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        if MISTAKE == TILE_MAX:
            m_new = tl.max(s, 1)
        elif MISTAKE == NO_MAX:
            m_new = tl.zeros([GROUP_PAD], tl.float32)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MISTAKE != NO_RESCALE:
            acc = acc * alpha[:, None]
        acc += tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    if MISTAKE == EMPTY_NAN:
        out = acc / l_i[:, None]
        lse = m_i + tl.log(l_i)
    else:
        has = l_i > 0
        l_safe = tl.where(has, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(has, m_i + tl.log(l_safe), float("-inf"))
    if MISTAKE == NO_NORMALISE:
        out = acc
    if MISTAKE == LSE_NO_MAX:
        lse = tl.log(l_i)
    if MISTAKE == LSE_BASE2:
        lse = m_i + tl.log2(l_i)
    part = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
    tl.store(out_ptr + part[:, None] * HEAD_DIM + dims[None, :], out, mask=row_ok[:, None])
    tl.store(lse_ptr + part, lse, mask=row_ok)


@triton.jit
def block_walk_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, lse_ptr, scale,
                      num_splits,
                      stride_qb, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh,
                      stride_kd, stride_vb, stride_vt, stride_vh, stride_vd, stride_tb,
                      stride_tn,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr):
    """Another design: one whole block per step (a scalar block id), base-2 exponentials, no
    tl.dot (broadcast products summed), and the log-sum-exp converted back to natural log."""
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    share = tl.cdiv(seq_len, num_splits)
    lo = tl.minimum(split * share, seq_len)
    hi = tl.minimum(lo + share, seq_len)
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=(rows < GROUP)[:, None], other=0.0).to(tl.float32)
    q = q * (scale * 1.4426950408889634)  # log2(e): scores in base 2
    m2 = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    last = tl.where(hi > lo, tl.cdiv(hi, BLOCK_SIZE), lo // BLOCK_SIZE)  # empty: no step
    for logical in range(lo // BLOCK_SIZE, last):
        physical = tl.load(table_ptr + seq * stride_tb + logical * stride_tn).to(tl.int64)
        tokens = logical * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        ok = (tokens >= lo) & (tokens < hi)
        k = tl.load(k_ptr + physical * stride_kb + kv_head * stride_kh
                    + tl.arange(0, BLOCK_SIZE)[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + physical * stride_vb + kv_head * stride_vh
                    + tl.arange(0, BLOCK_SIZE)[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m2, tl.max(s, 1))
        alpha = tl.exp2(m2 - m_new)
        p = tl.exp2(s - m_new[:, None])
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m2 = m_new
    has = total > 0
    safe = tl.where(has, total, 1.0)
    lse = tl.where(has, (m2 + tl.log2(safe)) * 0.6931471805599453, float("-inf"))
    part = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
    tl.store(out_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc / safe[:, None],
             mask=(rows < GROUP)[:, None])
    tl.store(lse_ptr + part, lse, mask=rows < GROUP)


def launch_splits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  tables: torch.Tensor, lens: torch.Tensor, scale: float, num_splits: int,
                  mistake: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's output and lse; ``mistake=None`` runs the block-walking design."""
    batch, q_heads, head_dim = q.shape
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = q_heads // kv_heads
    part_out = torch.empty(batch, q_heads, num_splits, head_dim, device=q.device)
    part_lse = torch.empty(batch, q_heads, num_splits, device=q.device)
    args = (q, k_cache, v_cache, tables, lens, part_out, part_lse, scale, num_splits,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *tables.stride())
    sizes = {"GROUP": group, "GROUP_PAD": max(16, triton.next_power_of_2(group)),
             "HEAD_DIM": head_dim, "BLOCK_SIZE": block_size, "enable_fp_fusion": True}
    grid = (batch, kv_heads, num_splits)
    if mistake is None:
        block_walk_kernel[grid](*args, **sizes)
    else:
        split_kernel[grid](*args, **sizes, TILE_N=16, MISTAKE=mistake)
    return part_out, part_lse


def softmax_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """torch.softmax over the splits does the max subtraction itself."""
    return (torch.softmax(lses, dim=-1)[..., None] * outputs).sum(dim=-2)


def decoder(mistake: int | None = NONE) -> Any:
    """A ``paged_decode`` launcher: one split, whose normalised output is the answer."""
    def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     tables: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
        return launch_splits(q, k_cache, v_cache, tables, lens, scale, 1, mistake)[0][:, :, 0]

    return paged_decode


def splitter(mistake: int | None = NONE, merge: Any = softmax_merge) -> Any:
    """A ``paged_decode_split`` launcher: partials, then ``merge``."""
    def paged_decode_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           tables: torch.Tensor, lens: torch.Tensor, scale: float,
                           num_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        part_out, part_lse = launch_splits(q, k_cache, v_cache, tables, lens, scale,
                                           num_splits, mistake)
        return merge(part_out, part_lse), part_out, part_lse

    return paged_decode_split


# --- answers for the exercises without a kernel ---------------------------------------------------


def token_offset(block_table: Any, t: int, kv_head: int, block_size: int,
                 strides: tuple[int, ...]) -> int:
    """Torch's own view arithmetic on an empty (meta) tensor with those strides."""
    if not 0 <= t < len(block_table) * block_size:
        raise ValueError(f"token {t} is not covered by the block table")
    block = block_table[t // block_size]
    size = (block + 1, block_size, kv_head + 1, 1)
    cache = torch.empty(0, device="meta").as_strided(size, strides)
    return cache[block, t % block_size, kv_head, 0].storage_offset()


def offset_numpy(block_table: Any, t: int, kv_head: int, block_size: int,
                 strides: tuple[int, ...]) -> int:
    if t < 0 or t >= len(block_table) * block_size:
        raise ValueError(f"t={t} is outside the table")
    index = np.array([block_table[t // block_size], t % block_size, kv_head, 0], dtype=np.int64)
    return int(index @ np.array(strides, dtype=np.int64))


def logsumexp_merge(outputs: torch.Tensor, lses: torch.Tensor) -> list[Any]:
    """Weights from torch.logsumexp, returned as nested lists (plain data, not a tensor)."""
    weights = torch.exp(lses - torch.logsumexp(lses, dim=-1, keepdim=True))
    return (weights[..., None] * outputs).sum(dim=-2).tolist()


def library_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   tables: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """The course's own kernel (tiles of 64, exp2, output in q's dtype)."""
    return paged_attention_decode(q, k_cache, v_cache, tables, lens, scale, num_splits=1)


CORRECT: dict[str, Any] = {
    "06.token_offset": token_offset,
    "06.paged_decode": decoder(),
    "06.merge_splits": softmax_merge,
    "06.split_decode": splitter(),
}


def run(name: str, obj: Any) -> CheckResult:
    with warnings.catch_warnings():  # a wrong kernel's NaN makes numpy warn in the interpreter
        warnings.simplefilter("ignore", RuntimeWarning)
        return evaluate(find_exercise(name), obj)


def test_every_exercise_has_a_correct_answer() -> None:
    assert {e.name for e in chapter_exercises("06")} == set(CORRECT)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_answer_passes_every_case(name: str) -> None:
    result = run(name, CORRECT[name])
    assert result.status == "passed", result.report_text()


OTHER_DESIGNS = [  # (exercise, a correct answer built differently from CORRECT's)
    ("06.token_offset", offset_numpy),
    ("06.paged_decode", decoder(None)),
    ("06.paged_decode", library_decode),
    ("06.merge_splits", logsumexp_merge),
    ("06.split_decode", splitter(None)),
    ("06.split_decode", splitter(None, merge=logsumexp_merge)),
]


@pytest.mark.parametrize("name, answer", OTHER_DESIGNS)
def test_other_correct_designs_pass(name: str, answer: Any) -> None:
    result = run(name, answer)
    assert result.status == "passed", result.report_text()


# --- typical mistakes -----------------------------------------------------------------------------


def offset_without_table(block_table: Any, t: int, kv_head: int, block_size: int,
                         strides: tuple[int, ...]) -> int:
    return (t // block_size) * strides[0] + (t % block_size) * strides[1] + kv_head * strides[2]


def offset_from_shape(block_table: Any, t: int, kv_head: int, block_size: int,
                      strides: tuple[int, ...]) -> int:
    if not 0 <= t < len(block_table) * block_size:
        raise ValueError(t)
    heads, dim = 8, strides[2]  # assumes a contiguous [blocks, B, H, D] cache
    return ((block_table[t // block_size] * block_size + t % block_size) * heads + kv_head) * dim


def offset_unchecked(block_table: Any, t: int, kv_head: int, block_size: int,
                     strides: tuple[int, ...]) -> int:
    return (block_table[t // block_size] * strides[0] + (t % block_size) * strides[1]
            + kv_head * strides[2])


def average_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    return outputs.mean(dim=-2)


def naive_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    weights = torch.exp(lses)
    return (weights[..., None] * outputs).sum(dim=-2) / weights.sum(dim=-1, keepdim=True)


def base2_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """Natural-log lses weighed with exp2, as if they were base 2."""
    weights = torch.exp2(lses - lses.max(dim=-1, keepdim=True).values)
    return (weights[..., None] * outputs).sum(dim=-2) / weights.sum(dim=-1, keepdim=True)


def global_max_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """Subtracts the largest lse of the whole batch instead of each row's own."""
    weights = torch.exp(lses - lses.max())
    return (weights[..., None] * outputs).sum(dim=-2) / weights.sum(dim=-1, keepdim=True)


MISTAKES = [  # (exercise, answer, cases passed, evidence in the report)
    ("06.token_offset", offset_without_table, 0, "hint     block = block_table[t // block_size]"),
    ("06.token_offset", offset_from_shape, 4, "head-major"),
    ("06.token_offset", offset_unchecked, 7, "raised IndexError"),
    ("06.paged_decode", decoder(INT32_BLOCK), 5, "cast the block id to tl.int64"),
    ("06.paged_decode", decoder(TILE_MAX), 5, "scores ~1e3"),
    ("06.paged_decode", decoder(NO_MAX), 5, "NaN"),
    ("06.paged_decode", decoder(UNMASKED_V), 0, "NaN"),
    ("06.paged_decode", decoder(GQA_MODULO), 4, "h // group"),
    ("06.paged_decode", decoder(MASK_LE), 0, "NaN"),
    ("06.paged_decode", decoder(NO_RESCALE), 1, "elements wrong"),
    ("06.paged_decode", decoder(NO_NORMALISE), 1, "elements wrong"),
    ("06.merge_splits", average_merge, 1, "equal to reference_attention"),
    ("06.merge_splits", naive_merge, 4, "every score + 200"),
    ("06.merge_splits", base2_merge, 1, "elements wrong"),
    ("06.merge_splits", global_max_merge, 6, "not over the whole batch"),
    ("06.split_decode", splitter(LSE_NO_MAX), 0, "part_lse: a tensor"),
    ("06.split_decode", splitter(LSE_BASE2), 1, "part_lse: a tensor"),
    ("06.split_decode", splitter(EMPTY_NAN), 4, "not NaN"),
    ("06.split_decode", splitter(FLOOR_SHARE), 2, "ceil(seq_len / num_splits)"),
    ("06.split_decode", splitter(TILE_MAX), 4, "scores ~1e3"),
    ("06.split_decode", splitter(INT32_BLOCK), 4, "cast the block id to tl.int64"),
    ("06.split_decode", splitter(NONE, merge=average_merge), 1, "out: a tensor"),
]


@pytest.mark.parametrize("name, answer, passed, evidence", MISTAKES)
def test_typical_mistakes_fail_with_evidence(name: str, answer: Any, passed: int,
                                             evidence: str) -> None:
    result = run(name, answer)
    text = result.report_text()
    assert (result.status, result.passed) == ("failed", passed), text
    assert evidence in text
    assert "got" in text and "expected" in text and "hint" in text


def test_every_exercise_has_three_mistakes_and_another_design() -> None:
    for exercise in chapter_exercises("06"):
        assert sum(name == exercise.name for name, *_ in MISTAKES) >= 3, exercise.name
        assert any(name == exercise.name for name, _ in OTHER_DESIGNS), exercise.name


# --- reports and stubs ----------------------------------------------------------------------------


def test_a_non_tensor_answer_is_described_not_crashed() -> None:
    result = run("06.merge_splits", lambda outputs, lses: "merged")
    assert result.status == "failed"
    assert "str 'merged', not a tensor" in result.cases[0].got
    result = run("06.merge_splits", lambda outputs, lses: outputs)
    assert "expected shape (16,)" in result.cases[1].got
    result = run("06.split_decode", lambda *args: torch.zeros(1))
    assert "not a tuple of 3 (out, part_out, part_lse)" in result.cases[0].got


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
    got = case.expected.holds.parts[0][1].clone()
    got[index] += error
    result = judged(case, got)
    assert not result.passed
    assert f"1 of 16 elements wrong, first at [{index}]" in result.got


def test_the_comparison_takes_plain_lists_and_keeps_nan() -> None:
    case = find_exercise("06.merge_splits").cases()[1]
    want = case.expected.holds.parts[0][1]
    assert judged(case, want).passed and judged(case, want.tolist()).passed
    poisoned = want.tolist()
    poisoned[3] = math.nan
    assert "1 NaN" in judged(case, poisoned).got
    assert "expected shape (16,)" in judged(case, [[x] for x in want.tolist()]).got


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_the_learner_side_holds_no_expected_tensor(name: str) -> None:
    """What runs with the learner's code is the case without its expectation: a blind case
    still returns the learner's own result, and a right one passes once judged."""
    for case in find_exercise(name).cases()[:2]:
        blind = replace(case, expected=None, compare=None)
        assert judge(case, observe(blind, CORRECT[name])).passed, case.call


def test_a_faked_verdict_string_is_not_accepted() -> None:
    for name in ("06.paged_decode", "06.merge_splits", "06.split_decode"):
        case = find_exercise(name).cases()[0]
        assert not judged(case, "a tensor of shape (1, 2, 16), every element within "
                                "tolerance").passed


@pytest.mark.parametrize("notebook, flagged", [("solutions", False), ("cheat", True)])
def test_the_answer_key_flags_the_library_kernel_not_the_solution(notebook: str,
                                                                  flagged: bool) -> None:
    path = ROOT / "solutions" / "06_triton_paged_attention.ipynb"
    sources = ["".join(c["source"]) if c["cell_type"] == "code" else ""
               for c in json.loads(path.read_text())["cells"]]
    if notebook == "cheat":
        sources += ["from course_lib.attention import paged_attention_decode as paged_decode",
                    'check("06.paged_decode", paged_decode)']
    trees = parse_cells(sources)
    exercises = {e.name: e for e in chapter_exercises("06")}
    checks = graded_checks(trees, exercises)
    assert set(checks) == set(exercises)
    assert uses_reference(trees, checks["06.paged_decode"],
                          find_exercise("06.paged_decode").reference) is flagged
    for name in set(exercises) - {"06.paged_decode"}:
        assert not uses_reference(trees, checks[name], exercises[name].reference), name


@triton.jit
def stub_kernel(q_ptr, HEAD_DIM: tl.constexpr):
    raise NotImplementedError("one program per (sequence, KV head)")


def stub_launcher(q: torch.Tensor, *args: Any) -> torch.Tensor:
    stub_kernel[(1,)](q, HEAD_DIM=q.shape[-1])
    return q


def test_stubs_are_not_yet_solved() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError("your code here")

    for name in CORRECT:
        assert run(name, stub).status == "not-solved"
    for name in ("06.paged_decode", "06.split_decode"):
        result = run(name, stub_launcher)
        assert (result.status, result.passed) == ("not-solved", 0)
