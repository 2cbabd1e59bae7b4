"""Chapter 10's kernel exercise (``10.fp8_decode``): kept wrong answers, each with the hint
its report must show first, and a right answer of another design.

The kernels stand in for the learner's: one correct design (tiles of 16, ``tl.dot``, the
scales applied to the scores and the output) whose mistakes can be switched on one at a
time, and a second correct design that walks whole blocks and dequantizes every element in
fp32 without ``tl.dot``. They live outside ``course_lib``, so the check counts their
launches as the learner's. ``tests/mutants/ch10.py`` includes :data:`KERNEL_MUTANTS` and
:data:`KERNEL_RIGHT`.
"""

from __future__ import annotations

from typing import Any

import torch

from course_lib.attention import gather_paged_kv, reference_attention
from course_lib.fp8 import dequantize

# isort: split
# Triton after course_lib.attention, which switches the interpreter on when there is no GPU.
import triton
import triton.language as tl

from tests.mutants import Mutant, Right

# Which mistake a kernel makes; constexpr so that the kernel may read them as globals.
(NONE, SWAPPED, TWICE, DIVIDED, NO_V, QUERY_HEAD, FIRST_HEAD, MASK_LE, INT32_BLOCK,
 K_TWICE) = map(tl.constexpr, range(10))


@triton.jit
def fp8_tile_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, k_scale_ptr,
                    v_scale_ptr, scale,
                    stride_qb, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd,
                    stride_vb, stride_vt, stride_vh, stride_vd, stride_tb, stride_tn,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MISTAKE: tl.constexpr):
    """One (sequence, KV head): tiles of TILE_N tokens, FP8 codes widened to fp32, tl.dot,
    the KV head's k_scale on the scores and v_scale on the output. ``MISTAKE`` switches one
    learner mistake on."""
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    if MISTAKE == QUERY_HEAD:  # the scale of query head h, not of its KV head
        kv_heads = tl.num_programs(1)
        k_s = tl.load(k_scale_ptr + heads, mask=heads < kv_heads, other=1.0)[:, None]
        v_s = tl.load(v_scale_ptr + heads, mask=heads < kv_heads, other=1.0)[:, None]
    elif MISTAKE == FIRST_HEAD:
        k_s = tl.load(k_scale_ptr)
        v_s = tl.load(v_scale_ptr)
    elif MISTAKE == SWAPPED:
        k_s = tl.load(v_scale_ptr + kv_head)
        v_s = tl.load(k_scale_ptr + kv_head)
    elif MISTAKE == DIVIDED:
        k_s = 1.0 / tl.load(k_scale_ptr + kv_head)
        v_s = 1.0 / tl.load(v_scale_ptr + kv_head)
    else:
        k_s = tl.load(k_scale_ptr + kv_head)
        v_s = tl.load(v_scale_ptr + kv_head)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, TILE_N):
        tokens = start + tl.arange(0, TILE_N)
        ok = tokens < seq_len
        block = tl.load(table_ptr + seq * stride_tb + (tokens // BLOCK_SIZE) * stride_tn,
                        mask=ok, other=0)
        if MISTAKE != INT32_BLOCK:
            block = block.to(tl.int64)
        if MISTAKE == MASK_LE:
            ok = tokens <= seq_len
        slot = tokens % BLOCK_SIZE
        k = tl.load(k_ptr + (block * stride_kb + slot * stride_kt + kv_head * stride_kh)[:, None]
                    + dims[None, :] * stride_kd, mask=ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (block * stride_vb + slot * stride_vt + kv_head * stride_vh)[:, None]
                    + dims[None, :] * stride_vd, mask=ok[:, None], other=0.0).to(tl.float32)
        if MISTAKE == TWICE:  # dequantized here, and scaled again below
            k = k * k_s
            v = v * v_s
        if MISTAKE == K_TWICE:  # K only
            k = k * k_s
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * (scale * k_s)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    if MISTAKE != NO_V:
        acc = acc * v_s
    tl.store(out_ptr + (seq * tl.num_programs(1) * GROUP + heads)[:, None] * HEAD_DIM
             + dims[None, :], acc / l_i[:, None], mask=row_ok[:, None])


@triton.jit
def fp8_block_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, k_scale_ptr,
                     v_scale_ptr, scale,
                     stride_qb, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd,
                     stride_vb, stride_vt, stride_vh, stride_vd, stride_tb, stride_tn,
                     GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    """Another design: one whole block per step (a scalar block id), every code dequantized
    in fp32 (code x scale) as it is loaded, base-2 exponentials, no tl.dot."""
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=(rows < GROUP)[:, None], other=0.0).to(tl.float32)
    q = q * (scale * 1.4426950408889634)  # log2(e): scores in base 2
    k_s = tl.load(k_scale_ptr + kv_head)
    v_s = tl.load(v_scale_ptr + kv_head)
    m2 = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    slots = tl.arange(0, BLOCK_SIZE)
    for logical in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        physical = tl.load(table_ptr + seq * stride_tb + logical * stride_tn).to(tl.int64)
        ok = logical * BLOCK_SIZE + slots < seq_len
        k = tl.load(k_ptr + physical * stride_kb + kv_head * stride_kh
                    + slots[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=ok[:, None], other=0.0).to(tl.float32) * k_s
        v = tl.load(v_ptr + physical * stride_vb + kv_head * stride_vh
                    + slots[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=ok[:, None], other=0.0).to(tl.float32) * v_s
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m2, tl.max(s, 1))
        alpha = tl.exp2(m2 - m_new)
        p = tl.exp2(s - m_new[:, None])
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m2 = m_new
    tl.store(out_ptr + (seq * tl.num_programs(1) * GROUP + heads)[:, None] * HEAD_DIM
             + dims[None, :], acc / total[:, None], mask=(rows < GROUP)[:, None])


def fp8_decoder(mistake: int | None = NONE) -> Any:
    """A ``paged_decode_fp8`` launcher; ``mistake=None`` runs the whole-block design."""
    def paged_decode_fp8(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         tables: torch.Tensor, lens: torch.Tensor, scale: float,
                         k_scale: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
        batch, q_heads, head_dim = q.shape
        kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
        group = q_heads // kv_heads
        out = torch.empty(batch, q_heads, head_dim, device=q.device)
        scales = [s.float().expand(kv_heads).contiguous() for s in (k_scale, v_scale)]
        args = (q, k_cache, v_cache, tables, lens, out, *scales, scale, *q.stride(),
                *k_cache.stride(), *v_cache.stride(), *tables.stride())
        sizes = {"GROUP": group, "GROUP_PAD": max(16, triton.next_power_of_2(group)),
                 "HEAD_DIM": head_dim, "BLOCK_SIZE": block_size}
        grid = (batch, kv_heads)
        if mistake is None:
            fp8_block_kernel[grid](*args, **sizes)
        else:
            fp8_tile_kernel[grid](*args, **sizes, TILE_N=16, MISTAKE=mistake)
        return out

    return paged_decode_fp8


def torch_fp8_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     tables: torch.Tensor, lens: torch.Tensor, scale: float,
                     k_scale: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
    """Right values in plain torch: no Triton at all (the used blocks gathered first, so the
    4 GiB cache of the wide case is never dequantized whole)."""
    k_codes, v_codes = gather_paged_kv(k_cache, v_cache, tables, lens)
    return reference_attention(q.float(), dequantize(k_codes, k_scale),
                               dequantize(v_codes, v_scale), lens, scale)


FP8_DECODE = "10.fp8_decode"

KERNEL_RIGHT = (
    Right(FP8_DECODE, "tiles of 16 with tl.dot, scales on scores and output", fp8_decoder()),
    Right(FP8_DECODE, "whole blocks, every code dequantized, no tl.dot", fp8_decoder(None)),
)

KERNEL_MUTANTS = (
    Mutant(FP8_DECODE, "plain torch, no Triton", torch_fp8_decode, "answered with a kernel"),
    Mutant(FP8_DECODE, "k_scale and v_scale swapped", fp8_decoder(SWAPPED), "swapped"),
    Mutant(FP8_DECODE, "codes dequantized and the scores scaled again", fp8_decoder(TWICE),
           "applied once"),
    Mutant(FP8_DECODE, "K dequantized and its scores scaled again", fp8_decoder(K_TWICE),
           "applied once"),
    Mutant(FP8_DECODE, "codes divided by the scale", fp8_decoder(DIVIDED), "multiplies by"),
    Mutant(FP8_DECODE, "v_scale never applied", fp8_decoder(NO_V), "v_scale is missing"),
    Mutant(FP8_DECODE, "per-head scale of query head h", fp8_decoder(QUERY_HEAD),
           "k_scale[h // group]"),
    Mutant(FP8_DECODE, "head 0's scale for every head", fp8_decoder(FIRST_HEAD),
           "not element 0"),
    Mutant(FP8_DECODE, "tokens <= seq_len kept", fp8_decoder(MASK_LE), "NaN code 0x7F"),
    Mutant(FP8_DECODE, "block id in 32 bits", fp8_decoder(INT32_BLOCK), "tl.int64"),
)
