"""Chapter 06's checks: the library (behind each exercise's interface) passes every case, other
correct designs pass too, typical mistakes fail with a report that names the call, what came
back, what was expected and a hint, and stubs (a Triton kernel's included) read as not solved.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from course_lib.attention import (
    gather_paged_kv,
    kernel_device,
    paged_attention_decode,
    paged_attention_reference,
)
from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.check import CheckResult, evaluate

# isort: split
# Triton after course_lib.attention, which switches the interpreter on when there is no GPU.
import triton
import triton.language as tl

# --- the library behind the exercises' interfaces -----------------------------------------------


def library_token_offset(block_table: Any, t: int, kv_head: int, block_size: int,
                         strides: tuple[int, ...]) -> int:
    """Torch's own view arithmetic on an empty (meta) tensor with those strides."""
    if not 0 <= t < len(block_table) * block_size:
        raise ValueError(f"token {t} is not covered by the block table")
    block = block_table[t // block_size]
    size = (block + 1, block_size, kv_head + 1, 1)
    cache = torch.empty(0, device="meta").as_strided(size, strides)
    return cache[block, t % block_size, kv_head, 0].storage_offset()


def library_copy(cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    keys, _ = gather_paged_kv(cache, cache, table, lens)
    keys = keys[:, : int(lens.max())]
    valid = torch.arange(keys.shape[1], device=keys.device)[None, :] < lens[:, None]
    return torch.where(valid[:, :, None, None], keys, torch.zeros((), dtype=keys.dtype,
                                                                   device=keys.device))


def library_kernel_program(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           table_row: torch.Tensor, seq_len: int, kv_head: int,
                           tile_n: int = 16) -> torch.Tensor:
    """The course's Triton kernel on a batch of one sequence and one KV head, in fp32."""
    heads = slice(kv_head, kv_head + 1)
    args = (q[None].float(), k_cache[:, :, heads].float(), v_cache[:, :, heads].float(),
            table_row[None].int(), torch.tensor([seq_len], dtype=torch.int32))
    device = kernel_device()
    return paged_attention_decode(*(a.to(device) for a in args))[0].cpu()


def library_reference_program(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              table_row: torch.Tensor, seq_len: int, kv_head: int,
                              tile_n: int = 16) -> torch.Tensor:
    heads = slice(kv_head, kv_head + 1)
    return paged_attention_reference(q[None], k_cache[:, :, heads], v_cache[:, :, heads],
                                     table_row[None].int(),
                                     torch.tensor([seq_len], dtype=torch.int32))[0]


def softmax_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    return torch.softmax(lses, dim=0) @ outputs


LIBRARY: dict[str, Any] = {
    "06.token_offset": library_token_offset,
    "06.paged_copy": library_copy,
    "06.decode_program": library_kernel_program,
    "06.merge_splits": softmax_merge,
}


def run(name: str, obj: Any) -> CheckResult:
    return evaluate(find_exercise(name), obj)


def test_every_exercise_has_a_library_answer() -> None:
    assert {e.name for e in chapter_exercises("06")} == set(LIBRARY)


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_library_passes_every_case(name: str) -> None:
    result = run(name, LIBRARY[name])
    assert result.status == "passed", result.report_text()


# --- a Triton kernel like the learner's, its launcher, and two wrong ones ----------------------


@triton.jit
def copy_kernel(cache_ptr, table_ptr, seq_lens_ptr, out_ptr,
                stride_cb, stride_ct, stride_ch, stride_cd, stride_tb, stride_tn,
                stride_ob, stride_ot, stride_oh, stride_od,
                BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr,
                USE_TABLE: tl.constexpr, MASK_STORE: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    tokens = tl.program_id(2) * TILE_N + tl.arange(0, TILE_N)
    dims = tl.arange(0, HEAD_DIM)
    ok = tokens < tl.load(seq_lens_ptr + seq)
    if USE_TABLE:
        block = tl.load(table_ptr + seq * stride_tb + (tokens // BLOCK_SIZE) * stride_tn,
                        mask=ok, other=0).to(tl.int64)
    else:  # the mistake: logical block = physical block
        block = (tokens // BLOCK_SIZE).to(tl.int64)
    src = cache_ptr + (block * stride_cb + (tokens % BLOCK_SIZE) * stride_ct
                       + head * stride_ch)[:, None] + dims[None, :] * stride_cd
    rows = tl.load(src, mask=ok[:, None], other=float("nan"))
    dst = out_ptr + seq * stride_ob + tokens[:, None] * stride_ot + head * stride_oh
    store_mask = ok[:, None] if MASK_STORE else None  # the mistake: store every lane
    tl.store(dst + dims[None, :] * stride_od, rows, mask=store_mask)


@triton.jit
def stub_kernel(cache_ptr, BLOCK_SIZE: tl.constexpr):
    raise NotImplementedError("look up the block, load, store")


def launcher(use_table: bool = True, mask_store: bool = True, stub: bool = False) -> Any:
    def paged_copy(cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        batch, max_len, tile_n = table.shape[0], int(lens.max()), 16
        _, block_size, heads, head_dim = cache.shape
        padded = triton.cdiv(max_len, tile_n) * tile_n  # a whole last tile stays inside out
        out = torch.zeros(batch, padded, heads, head_dim, dtype=cache.dtype, device=cache.device)
        if stub:
            stub_kernel[(1,)](cache, BLOCK_SIZE=block_size)
        copy_kernel[(batch, heads, padded // tile_n)](
            cache, table, lens, out, *cache.stride(), *table.stride(), *out.stride(),
            BLOCK_SIZE=block_size, HEAD_DIM=head_dim, TILE_N=tile_n, USE_TABLE=use_table,
            MASK_STORE=mask_store)
        return out[:, :max_len]

    return paged_copy


def test_a_triton_kernel_passes_and_its_stub_is_not_yet_solved() -> None:
    assert run("06.paged_copy", launcher()).status == "passed"
    result = run("06.paged_copy", launcher(stub=True))
    assert (result.status, result.passed) == ("not-solved", 0)


# --- other correct designs ----------------------------------------------------------------------


def offset_numpy(block_table: Any, t: int, kv_head: int, block_size: int,
                 strides: tuple[int, ...]) -> int:
    if t < 0 or t >= len(block_table) * block_size:
        raise ValueError(f"t={t} is outside the table")
    index = np.array([block_table[t // block_size], t % block_size, kv_head, 0], dtype=np.int64)
    return int(index @ np.array(strides, dtype=np.int64))


def whole_sequence_program(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           table_row: torch.Tensor, seq_len: int, kv_head: int,
                           tile_n: int = 16) -> torch.Tensor:
    """No tiles and no online softmax: gather every token, then an ordinary softmax."""
    tokens = torch.arange(seq_len)
    blocks = table_row.long()[tokens // k_cache.shape[1]]
    slots = tokens % k_cache.shape[1]
    k = k_cache[blocks, slots, kv_head].double()
    v = v_cache[blocks, slots, kv_head].double()
    weights = torch.softmax(q.double() @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    return (weights @ v).float()


def loop_merge(outputs: torch.Tensor, lses: torch.Tensor) -> list[float]:
    """A running merge, one split at a time, returning a plain list."""
    m, total, acc = -math.inf, 0.0, [0.0] * outputs.shape[1]
    for row, lse in zip(outputs.tolist(), lses.tolist(), strict=True):
        if lse == -math.inf:
            continue
        m_new = max(m, lse)
        correction, weight = math.exp(m - m_new), math.exp(lse - m_new)
        acc = [a * correction + weight * x for a, x in zip(acc, row, strict=True)]
        total, m = total * correction + weight, m_new
    return [a / total for a in acc]


@pytest.mark.parametrize("name, answer", [
    ("06.token_offset", offset_numpy),
    ("06.decode_program", whole_sequence_program),
    ("06.decode_program", library_reference_program),
    ("06.merge_splits", loop_merge),
])
def test_other_correct_designs_pass(name: str, answer: Any) -> None:
    result = run(name, answer)
    assert result.status == "passed", result.report_text()


# --- typical mistakes ---------------------------------------------------------------------------


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


def program_without_running_max(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                table_row: torch.Tensor, seq_len: int, kv_head: int,
                                tile_n: int = 16) -> torch.Tensor:
    tokens = torch.arange(seq_len)
    blocks = table_row.long()[tokens // k_cache.shape[1]]
    k = k_cache[blocks, tokens % k_cache.shape[1], kv_head].float()
    v = v_cache[blocks, tokens % k_cache.shape[1], kv_head].float()
    p = torch.exp(q.float() @ k.T / math.sqrt(q.shape[-1]))
    return (p @ v) / p.sum(dim=1, keepdim=True)


def program_unmasked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     table_row: torch.Tensor, seq_len: int, kv_head: int,
                     tile_n: int = 16) -> torch.Tensor:
    """Reads whole blocks: the unused slots of the last block leak in."""
    block_size = k_cache.shape[1]
    tokens = torch.arange(-(-seq_len // block_size) * block_size)
    blocks = table_row.long()[tokens // block_size]
    k = k_cache[blocks, tokens % block_size, kv_head].float()
    v = v_cache[blocks, tokens % block_size, kv_head].float()
    weights = torch.softmax(q.float() @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v


def average_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    return outputs.mean(dim=0)


def naive_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    weights = torch.exp(lses)
    return (weights[:, None] * outputs).sum(dim=0) / weights.sum()


@pytest.mark.parametrize("name, answer, passed, evidence", [
    ("06.token_offset", offset_without_table, 0, "hint     block = block_table[t // block_size]"),
    ("06.token_offset", offset_from_shape, 4, "head-major"),
    ("06.token_offset", offset_unchecked, 7, "raised IndexError"),
    ("06.paged_copy", launcher(use_table=False), 0, "elements wrong, first at ["),
    ("06.paged_copy", launcher(mask_store=False), 0, "NaN"),
    ("06.decode_program", program_without_running_max, 6, "running max"),
    ("06.decode_program", program_unmasked, 2, "NaN"),
    ("06.merge_splits", average_merge, 1, "expected a tensor of shape (16,) equal to reference"),
    ("06.merge_splits", naive_merge, 4, "every score + 200"),
])
def test_typical_mistakes_fail_with_evidence(name: str, answer: Any, passed: int,
                                             evidence: str) -> None:
    result = run(name, answer)
    text = result.report_text()
    assert (result.status, result.passed) == ("failed", passed), text
    assert evidence in text
    assert "got" in text and "expected" in text and "hint" in text


def test_a_non_tensor_answer_is_described_not_crashed() -> None:
    result = run("06.merge_splits", lambda outputs, lses: "merged")
    assert result.status == "failed"
    assert "str 'merged', not a tensor" in result.cases[0].got
    result = run("06.merge_splits", lambda outputs, lses: outputs)
    assert "expected shape (16,)" in result.cases[1].got


def test_a_plain_stub_is_not_yet_solved() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError("your code here")

    for name in LIBRARY:
        assert run(name, stub).status == "not-solved"
