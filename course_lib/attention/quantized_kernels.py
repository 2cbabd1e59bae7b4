"""The Triton kernel of chapter 10: paged decode that reads fewer bytes per token.

``scaled_decode_kernel`` is chapter 06's paged decode pass (same cache layout, block
table, GQA rows and online softmax in base 2) with three switches:

- ``SCALED``: the cache holds FP8 codes and one float32 scale per KV head (a per-tensor
  scale arrives repeated per head). A program serves one KV head, so its scales are two
  numbers: ``k_scale`` multiplies the scores and ``v_scale`` the finished sum of weights x
  V. The codes are widened to q's dtype exactly; nothing is rounded on the way in.
- ``HAS_ROPE``: each key has a second, separate part (MLA's shared rope key), whose scores
  are added to the first part's.
- ``SHARED_KV``: V is the key's first part itself (MLA's latent), so a tile is read once.

Query heads of one KV head may be spread over several programs (``ROWS`` at a time; MLA
serves up to 128 heads over one KV head). Several splits write partial results that
chapter 06's ``merge_splits_kernel`` combines.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scaled_decode_kernel(
    q_ptr, q_rope_ptr, k_ptr, k_rope_ptr, v_ptr, k_scale_ptr, v_scale_ptr,
    table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale,
    num_splits,
    num_q_heads,
    stride_qb, stride_qh, stride_qd,
    stride_rb, stride_rh, stride_rd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_krb, stride_krt, stride_krh, stride_krd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_tb, stride_tn,
    stride_ob, stride_oh, stride_od,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    SCALED: tl.constexpr,
    SHARED_KV: tl.constexpr,
    WRITE_OUTPUT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    row_tiles = (GROUP + ROWS - 1) // ROWS
    kv_head = (tl.program_id(1) // row_tiles).to(tl.int64)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), TILE_N) * TILE_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    rows = (tl.program_id(1) % row_tiles) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=row_ok[:, None], other=0.0,
    )
    if HAS_ROPE:
        rope_dims = tl.arange(0, ROPE_DIM)
        q_rope = tl.load(q_rope_ptr + seq * stride_rb + heads[:, None] * stride_rh
                         + rope_dims[None, :] * stride_rd, mask=row_ok[:, None], other=0.0)
    score_scale = qk_scale
    if SCALED:  # one KV head per program: its key scale is one number, applied to the scores
        score_scale = score_scale * tl.load(k_scale_ptr + kv_head)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)  # running max score (base 2)
    l_i = tl.zeros([ROWS], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)  # running sum of weights * V (codes if SCALED)

    table_row = table_ptr + seq * stride_tb
    k_base = k_ptr + kv_head * stride_kh + dims[None, :] * stride_kd
    v_base = v_ptr + kv_head * stride_vh + dims[None, :] * stride_vd
    offs_n = tl.arange(0, TILE_N)
    for tile_start in range(start, end, TILE_N):
        tokens = tile_start + offs_n
        token_ok = tokens < end
        block = tl.load(table_row + (tokens // BLOCK_SIZE) * stride_tn, mask=token_ok, other=0)
        block = block.to(tl.int64)
        slot = tokens % BLOCK_SIZE
        k = tl.load(k_base + (block * stride_kb + slot * stride_kt)[:, None],
                    mask=token_ok[:, None], other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        if HAS_ROPE:
            k_rope = tl.load(k_rope_ptr + kv_head * stride_krh
                             + (block * stride_krb + slot * stride_krt)[:, None]
                             + rope_dims[None, :] * stride_krd,
                             mask=token_ok[:, None], other=0.0)
            scores += tl.dot(q_rope, tl.trans(k_rope.to(q_rope.dtype)), input_precision="ieee")
        scores = tl.where(token_ok[None, :], scores * score_scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        correction = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * correction + tl.sum(p, 1)
        if SHARED_KV:
            v = k
        else:
            v = tl.load(v_base + (block * stride_vb + slot * stride_vt)[:, None],
                        mask=token_ok[:, None], other=0.0).to(q.dtype)
        acc = tl.dot(p.to(v.dtype), v, acc * correction[:, None], input_precision="ieee")
        m_i = m_new

    if SCALED:
        acc = acc * tl.load(v_scale_ptr + kv_head)
    if WRITE_OUTPUT:
        out = acc / l_i[:, None]
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        # As chapter 06's kernel: an empty split stores output 0 and log-sum-exp -inf.
        has_tokens = l_i > 0
        l_safe = tl.where(has_tokens, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(has_tokens, m_i + tl.log2(l_safe), float("-inf"))
        part = (seq * num_q_heads + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], out,
                 mask=row_ok[:, None])
        tl.store(part_lse_ptr + part, lse, mask=row_ok)
