"""Chapter 08's checks: a correct answer passes every case (fresh ones too), another design
passes, and the mistakes learners make (a window off by one, ceil for floor at a block
boundary, freeing a block a shared prefix still holds, a hit that satisfies only the full
group, a kernel that ignores the window or masks it on the scores only) fail with evidence."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from typing import Any

import pytest
import torch

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch08 import FRESH
from course_lib.grading.check import CheckResult, Exercise, evaluate, judge, observe
from course_lib.kv_math import blocks_needed
from tests.mutants.ch06 import launch_splits

# isort: split
# Triton after course_lib.attention, which switches the interpreter on without a GPU.
import triton
import triton.language as tl

# --- exercise 1 -----------------------------------------------------------------------------------


def bytes_at_length(mistake: str = "") -> Any:
    def fn(windows: list[int | None], kv_heads: int, head_dim: int, dtype_bytes: int,
           num_tokens: int) -> float:
        if num_tokens < 1 or any(w is not None and w < 1 for w in windows):
            raise ValueError(f"bad num_tokens={num_tokens} or windows={windows}")
        kept = 0
        for window in windows:
            if window is None or mistake == "all_full":
                kept += num_tokens
            elif mistake == "window_plus_one":
                kept += min(num_tokens, window + 1)
            else:
                kept += min(num_tokens, window)
        total = 2 * kv_heads * head_dim * dtype_bytes * kept
        return total / (1 if mistake == "total" else num_tokens)

    return fn


def bytes_by_counting(windows: list[int | None], kv_heads: int, head_dim: int,
                      dtype_bytes: int, num_tokens: int) -> float:
    """Another design: count, for each position, the layers that still hold it."""
    if num_tokens < 1 or any(w is not None and w < 1 for w in windows):
        raise ValueError("bad input")
    held = sum(sum(1 for w in windows if w is None or num_tokens - p <= w)
               for p in range(num_tokens))
    return 2 * kv_heads * head_dim * dtype_bytes * held / num_tokens


# --- exercise 2 -----------------------------------------------------------------------------------


def window_free(mistake: str = "") -> Any:
    def fn(table: list[int], ref_counts: dict[int, int], num_computed: int, window: int,
           block_size: int) -> tuple[list[int], list[int]]:
        if window < 1 or block_size < 1 or num_computed < 0:
            raise ValueError("bad input")
        reads_from = num_computed - window + 1
        if mistake == "off_by_one":
            reads_from = num_computed - window
        first = max(0, reads_from) // block_size
        if mistake == "ceil":
            first = math.ceil(max(0, reads_from) / block_size)
        after, returned = list(table), []
        for index in range(min(first, len(table))):
            if after[index]:
                if ref_counts[after[index]] == 1 or mistake == "ignore_refs":
                    returned.append(after[index])
                after[index] = 0
        return after, returned

    return fn


def window_free_by_positions(table: list[int], ref_counts: dict[int, int], num_computed: int,
                             window: int, block_size: int) -> tuple[list[int], list[int]]:
    """Another design: a block goes when its last position is before the first read."""
    if window < 1 or block_size < 1:
        raise ValueError("bad input")
    first_read = num_computed - window + 1
    gone = [i for i, b in enumerate(table) if b and (i + 1) * block_size - 1 < first_read]
    return ([0 if i in gone else b for i, b in enumerate(table)],
            [table[i] for i in gone if ref_counts[table[i]] < 2])


# --- exercise 3 -----------------------------------------------------------------------------------


def prefix_hit(mistake: str = "") -> Any:
    def fn(cached: list[list[bool]], windows: list[int | None], block_size: int,
           num_tokens: int) -> int:
        limit = num_tokens // block_size if mistake == "last_token" else \
            max(num_tokens - 1, 0) // block_size
        for blocks in range(limit, 0, -1):
            def serves(flags: list[bool], window: int | None, blocks: int = blocks) -> bool:
                if window is None:
                    return all(flags[:blocks])
                if mistake == "full_only":
                    return True
                span = window if mistake == "window_w" else window - 1
                first = max(0, blocks * block_size - span) // block_size
                return all(flags[first:blocks])
            if all(serves(f, w) for f, w in zip(cached, windows, strict=True)):
                return blocks * block_size
        return 0

    return fn


def prefix_hit_upward(cached: list[list[bool]], windows: list[int | None], block_size: int,
                      num_tokens: int) -> int:
    """Another design: the full groups' run bounds k, then test each k from there down by
    the positions each window group needs."""
    k = max(num_tokens - 1, 0) // block_size
    for flags, window in zip(cached, windows, strict=True):
        if window is None:
            k = min(k, next((i for i, f in enumerate(flags) if not f), len(flags)))
    while k > 0:
        needed = [{p // block_size for p in range(max(0, k * block_size - w + 1), k * block_size)}
                  for w in windows if w is not None]
        groups = [f for f, w in zip(cached, windows, strict=True) if w is not None]
        if all(all(flags[b] for b in need) for flags, need in zip(groups, needed, strict=True)):
            break
        k -= 1
    return k * block_size


# --- exercise 4: a windowed decode kernel with switchable mistakes ------------------------------

NONE, IGNORE_WINDOW, WINDOW_PLUS_ONE, SCORES_ONLY = map(tl.constexpr, range(4))


@triton.jit
def windowed_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, scale, window,
                    stride_qb, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd,
                    stride_vb, stride_vt, stride_vh, stride_vd, stride_tb, stride_tn,
                    stride_ob, stride_oh, stride_od,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MISTAKE: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo = tl.maximum(seq_len - window, 0)
    if MISTAKE == WINDOW_PLUS_ONE:
        lo = tl.maximum(seq_len - window - 1, 0)
    loop_from = lo
    if MISTAKE == IGNORE_WINDOW:
        lo = 0
        loop_from = 0
    if MISTAKE == SCORES_ONLY:
        loop_from = 0
    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(loop_from, seq_len, TILE_N):
        tokens = start + tl.arange(0, TILE_N)
        ok = (tokens < seq_len) & (tokens >= lo)
        load_ok = tokens < seq_len if MISTAKE == SCORES_ONLY else ok
        block = tl.load(table_ptr + seq * stride_tb + (tokens // BLOCK_SIZE) * stride_tn,
                        mask=load_ok, other=0).to(tl.int64)
        slot = tokens % BLOCK_SIZE
        k = tl.load(k_ptr + (block * stride_kb + slot * stride_kt + kv_head * stride_kh)[:, None]
                    + dims[None, :] * stride_kd, mask=load_ok[:, None], other=0.0)
        v = tl.load(v_ptr + (block * stride_vb + slot * stride_vt + kv_head * stride_vh)[:, None]
                    + dims[None, :] * stride_vd, mask=load_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
             acc / l_i[:, None], mask=row_ok[:, None])


def windowed(mistake: int = NONE) -> Any:
    def windowed_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        tables: torch.Tensor, lens: torch.Tensor, scale: float,
                        window: int) -> torch.Tensor:
        batch, q_heads, head_dim = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        group = q_heads // kv_heads
        out = torch.empty(batch, q_heads, head_dim, dtype=torch.float32, device=q.device)
        windowed_kernel[(batch, kv_heads)](
            q, k_cache, v_cache, tables, lens, out, scale, window, *q.stride(),
            *k_cache.stride(), *v_cache.stride(), *tables.stride(), *out.stride(),
            GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size, TILE_N=16, MISTAKE=mistake, enable_fp_fusion=True)
        return out

    return windowed_decode


def block_walk_windowed(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        tables: torch.Tensor, lens: torch.Tensor, scale: float,
                        window: int) -> torch.Tensor:
    """Another design: chapter 06's block-walking kernel (whole blocks, base 2, no tl.dot)
    starting at the window, one split."""
    out, _ = launch_splits(q, k_cache, v_cache, tables, lens, scale, 1, None, window=window)
    return out[:, :, 0]


# --- the tests ------------------------------------------------------------------------------------

CORRECT = {
    "08.bytes_at_length": bytes_at_length(),
    "08.window_free": window_free(),
    "08.prefix_hit": prefix_hit(),
    "08.windowed_decode": windowed(),
}

OTHER_DESIGNS = [
    ("08.bytes_at_length", bytes_by_counting),
    ("08.window_free", window_free_by_positions),
    ("08.prefix_hit", prefix_hit_upward),
    ("08.windowed_decode", block_walk_windowed),
]

MISTAKES = [  # (exercise, answer, cases passed, text the report must show)
    ("08.bytes_at_length", bytes_at_length("window_plus_one"), 5, "last W tokens"),
    ("08.bytes_at_length", bytes_at_length("all_full"), 5, "shorter than its window"),
    ("08.bytes_at_length", bytes_at_length("total"), 2, "divide by L"),
    ("08.window_free", window_free("off_by_one"), 7, "num_computed - window + 1"),
    ("08.window_free", window_free("ceil"), 5, "floor, not ceil"),
    ("08.window_free", window_free("ignore_refs"), 9, "no other sequence still holds it"),
    ("08.prefix_hit", prefix_hit("full_only"), 7, "a window group only"),
    ("08.prefix_hit", prefix_hit("window_w"), 7, "W - 1 positions"),
    ("08.prefix_hit", prefix_hit("last_token"), 9, "never covers the prompt's last token"),
    ("08.windowed_decode", windowed(IGNORE_WINDOW), 1, "max(0, seq_len - window)"),
    ("08.windowed_decode", windowed(WINDOW_PLUS_ONE), 1, "elements wrong"),
    ("08.windowed_decode", windowed(SCORES_ONLY), 1, "NaN"),
]


def run(name: str, obj: Any, cases: Any = None) -> CheckResult:
    exercise = find_exercise(name)
    if cases is not None:
        exercise = Exercise(exercise.name, exercise.title, lambda: cases)
    with warnings.catch_warnings():  # a wrong kernel's NaN makes numpy warn in the interpreter
        warnings.simplefilter("ignore", RuntimeWarning)
        return evaluate(exercise, obj)


def test_every_exercise_has_a_correct_answer_and_fresh_cases() -> None:
    assert {e.name for e in chapter_exercises("08")} == set(CORRECT) == set(FRESH)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_answer_passes_every_case_and_fresh_ones(name: str) -> None:
    result = run(name, CORRECT[name])
    assert result.status == "passed", result.report_text()
    for seed in (1, 2):
        fresh = run(name, CORRECT[name], FRESH[name](seed))
        assert fresh.status == "passed", fresh.report_text()


@pytest.mark.parametrize("name", sorted(FRESH))
def test_fresh_cases_are_deterministic_per_seed_and_differ_between_seeds(name: str) -> None:
    calls = [[c.call for c in FRESH[name](seed)] for seed in (5, 5, 6)]
    assert calls[0] == calls[1] != calls[2]


@pytest.mark.parametrize("name, answer", OTHER_DESIGNS)
def test_other_correct_designs_pass(name: str, answer: Any) -> None:
    result = run(name, answer)
    assert result.status == "passed", result.report_text()


@pytest.mark.parametrize("name, answer, passed, evidence", MISTAKES)
def test_typical_mistakes_fail_with_evidence(name: str, answer: Any, passed: int,
                                             evidence: str) -> None:
    result = run(name, answer)
    text = result.report_text()
    assert (result.status, result.passed) == ("failed", passed), text
    assert evidence in text
    assert "got" in text and "expected" in text and "hint" in text


def test_every_exercise_has_three_mistakes_and_another_design() -> None:
    for exercise in chapter_exercises("08"):
        assert sum(name == exercise.name for name, *_ in MISTAKES) >= 3, exercise.name
        assert any(name == exercise.name for name, _ in OTHER_DESIGNS), exercise.name


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_the_learner_side_holds_no_expected_value(name: str) -> None:
    """A case stripped of its expectation (what the grader ships) still runs the learner's
    code, and the result passes once judged where the expectation is."""
    for case in find_exercise(name).cases()[:2]:
        blind = replace(case, expected=None, compare=None)
        assert judge(case, observe(blind, CORRECT[name])).passed, case.call


def test_stubs_are_not_yet_solved() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError("your code here")

    for name in CORRECT:
        assert run(name, stub).status == "not-solved"


def test_window_free_keeps_table_length() -> None:
    # the library rule never drops more than the table holds
    after, returned = window_free()([5, 9], {5: 1, 9: 1}, 100, 3, 4)
    assert after == [0, 0] and returned == [5, 9]
    assert blocks_needed(8, 4) == len(after)
