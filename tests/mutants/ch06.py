"""Chapter 06's kept wrong answers, each with the hint its report must show first, and right
answers of other designs than the solution notebook's (see ``tests/mutants/__init__.py``).

The kernels stand in for the learner's: one correct design whose mistakes can be switched on
one at a time, and a second correct design that walks whole blocks in base 2. They are
defined here, outside ``course_lib``, so the check counts their launches as the learner's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from course_lib.attention import paged_attention_decode, paged_attention_reference
from course_lib.grading.ch06 import DecodeInputs, _split_expected

# isort: split
# Triton after course_lib.attention, which switches the interpreter on when there is no GPU.
import triton
import triton.language as tl

from tests.mutants import Mutant, Right

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
                      num_splits, window,
                      stride_qb, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh,
                      stride_kd, stride_vb, stride_vt, stride_vh, stride_vd, stride_tb,
                      stride_tn,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr):
    """Another design: one whole block per step (a scalar block id), base-2 exponentials, no
    tl.dot (broadcast products summed), and the log-sum-exp converted back to natural log.
    Only the last ``window`` tokens of a sequence are attended to (chapter 08)."""
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    share = tl.cdiv(seq_len, num_splits)
    lo = tl.minimum(split * share, seq_len)
    hi = tl.minimum(lo + share, seq_len)
    lo = tl.minimum(tl.maximum(lo, seq_len - window), hi)
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
                  mistake: int | None, pad_to_16: bool = True,
                  window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's output and lse; ``mistake=None`` runs the block-walking design (which
    also takes a ``window``); ``pad_to_16=False`` pads the query rows only to a power of two
    (tl.dot rows below 16)."""
    batch, q_heads, head_dim = q.shape
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = q_heads // kv_heads
    part_out = torch.empty(batch, q_heads, num_splits, head_dim, device=q.device)
    part_lse = torch.empty(batch, q_heads, num_splits, device=q.device)
    args = (q, k_cache, v_cache, tables, lens, part_out, part_lse, scale, num_splits,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *tables.stride())
    pad = triton.next_power_of_2(group)
    sizes = {"GROUP": group, "GROUP_PAD": max(16, pad) if pad_to_16 else pad,
             "HEAD_DIM": head_dim, "BLOCK_SIZE": block_size, "enable_fp_fusion": True}
    grid = (batch, kv_heads, num_splits)
    if mistake is None:
        reach = int(lens.max()) + 1 if window is None else window
        block_walk_kernel[grid](*args[:9], reach, *args[9:], **sizes)
    else:
        split_kernel[grid](*args, **sizes, TILE_N=16, MISTAKE=mistake)
    return part_out, part_lse


def softmax_merge(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """torch.softmax over the splits does the max subtraction itself."""
    return (torch.softmax(lses, dim=-1)[..., None] * outputs).sum(dim=-2)


def decoder(mistake: int | None = NONE, pad_to_16: bool = True) -> Any:
    """A ``paged_decode`` launcher: one split, whose normalised output is the answer."""
    def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     tables: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
        return launch_splits(q, k_cache, v_cache, tables, lens, scale, 1, mistake,
                             pad_to_16)[0][:, :, 0]

    return paged_decode


def splitter(mistake: int | None = NONE, merge: Any = softmax_merge,
             pad_to_16: bool = True) -> Any:
    """A ``paged_decode_split`` launcher: partials, then ``merge``."""
    def paged_decode_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           tables: torch.Tensor, lens: torch.Tensor, scale: float,
                           num_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        part_out, part_lse = launch_splits(q, k_cache, v_cache, tables, lens, scale,
                                           num_splits, mistake, pad_to_16)
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




def torch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 tables: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Right values in plain torch: no Triton at all."""
    return paged_attention_reference(q, k_cache, v_cache, tables, lens, scale).float()


def torch_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                tables: torch.Tensor, lens: torch.Tensor, scale: float,
                num_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right values in plain torch: no Triton at all."""
    inputs = DecodeInputs(q.cpu(), k_cache.cpu(), v_cache.cpu(), tables.cpu(), lens.cpu(), scale)
    part_out, part_lse = _split_expected(inputs, num_splits)
    return torch_decode(q, k_cache, v_cache, tables, lens, scale), part_out, part_lse


def in_q_dtype(launcher: Any) -> Any:
    """The launcher's results made like q, as ``empty_like(q)`` would: float16 for fp16 q."""
    def launch(q: torch.Tensor, *args: Any) -> Any:
        result = launcher(q, *args)
        if isinstance(result, tuple):
            return tuple(part.to(q.dtype) for part in result)
        return result.to(q.dtype)
    return launch


def own_scale(launcher: Any) -> Any:
    """The launcher given 1 / sqrt(head_dim) instead of the scale it was called with."""
    def launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               tables: torch.Tensor, lens: torch.Tensor, scale: float) -> Any:
        return launcher(q, k_cache, v_cache, tables, lens, q.shape[-1] ** -0.5)
    return launch


def offset_in_32_bits(block_table: Any, t: int, kv_head: int, block_size: int,
                      strides: tuple[int, ...]) -> int:
    """The right offset, kept in 32 bits as an int32 kernel variable would be."""
    return offset_unchecked(block_table, t, kv_head, block_size, strides) % 2**32 if (
        0 <= t < len(block_table) * block_size) else offset_unchecked(
        block_table, t, kv_head, block_size, strides)


OFFSET, DECODE, MERGE, SPLIT = ("06.token_offset", "06.paged_decode", "06.merge_splits",
                                "06.split_decode")

RIGHT = [
    Right(OFFSET, "torch's own view arithmetic on a meta tensor", token_offset),
    Right(OFFSET, "numpy dot product of index and strides", offset_numpy),
    Right(DECODE, "tiles of 16 with tl.dot", decoder()),
    Right(DECODE, "whole blocks, base 2, no tl.dot", decoder(None)),
    Right(MERGE, "torch.softmax over the splits", softmax_merge),
    Right(MERGE, "torch.logsumexp, nested lists", logsumexp_merge),
    Right(SPLIT, "tiles of 16, softmax merge", splitter()),
    Right(SPLIT, "whole blocks, base 2, logsumexp merge", splitter(None, merge=logsumexp_merge)),
]

MUTANTS = [
    Mutant(OFFSET, "the table skipped", offset_without_table, "block = block_table[t // "),
    Mutant(OFFSET, "offsets from the shape, not the strides", offset_from_shape,
           "not the shape"),
    Mutant(OFFSET, "no ValueError past the table", offset_unchecked, "raise ValueError"),
    Mutant(OFFSET, "32-bit offsets", offset_in_32_bits, "more than 32 bits"),
    Mutant(DECODE, "plain torch, no Triton", torch_decode, "answered with a kernel"),
    Mutant(DECODE, "the course's own kernel", paged_attention_decode, "answered with a kernel"),
    Mutant(DECODE, "out made with empty_like(q)", in_q_dtype(decoder()), "float32"),
    Mutant(DECODE, "GROUP_PAD below 16", decoder(pad_to_16=False), "at least 16"),
    Mutant(DECODE, "1 / sqrt(head_dim) instead of scale", own_scale(decoder()),
           "multiply the scores by scale"),
    Mutant(DECODE, "block id in 32 bits", decoder(INT32_BLOCK), "tl.int64"),
    Mutant(DECODE, "the maximum of each tile only", decoder(TILE_MAX), "every tile so far"),
    Mutant(DECODE, "no maximum subtracted", decoder(NO_MAX), "subtract the maximum"),
    Mutant(DECODE, "values loaded unmasked", decoder(UNMASKED_V), "the keys AND the values"),
    Mutant(DECODE, "query head h reads KV head h % kv_heads", decoder(GQA_MODULO),
           "h // group"),
    Mutant(DECODE, "tokens <= seq_len kept", decoder(MASK_LE), "mask every load"),
    Mutant(DECODE, "acc not rescaled", decoder(NO_RESCALE), "rescale l and acc"),
    Mutant(DECODE, "never divided by l", decoder(NO_NORMALISE), "divide by l"),
    Mutant(MERGE, "the plain average", average_merge, "share of its row's softmax mass"),
    Mutant(MERGE, "exp without the max", naive_merge, "largest lse before exp"),
    Mutant(MERGE, "exp2 of natural logs", base2_merge, "not base 2"),
    Mutant(MERGE, "the batch's max, not the row's", global_max_merge, "max per row"),
    Mutant(SPLIT, "plain torch, no Triton", torch_split, "answered with a kernel"),
    Mutant(SPLIT, "results made like q", in_q_dtype(splitter()), "float32"),
    Mutant(SPLIT, "GROUP_PAD below 16", splitter(pad_to_16=False), "at least 16"),
    Mutant(SPLIT, "lse without the max", splitter(LSE_NO_MAX), "max m added back"),
    Mutant(SPLIT, "lse in base 2", splitter(LSE_BASE2), "NATURAL log"),
    Mutant(SPLIT, "an empty split stores NaN", splitter(EMPTY_NAN), "never NaN"),
    Mutant(SPLIT, "share = floor(seq_len / num_splits)", splitter(FLOOR_SHARE),
           "ceil(seq_len / num_splits)"),
    Mutant(SPLIT, "the maximum of each tile only", splitter(TILE_MAX), "every tile so far"),
    Mutant(SPLIT, "block id in 32 bits", splitter(INT32_BLOCK), "tl.int64"),
    Mutant(SPLIT, "the splits averaged", splitter(NONE, merge=average_merge),
           "merge_splits(part_out, part_lse)"),
]
