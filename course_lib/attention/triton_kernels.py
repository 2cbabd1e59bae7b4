"""The Triton kernels of paged decode attention: a pass over the KV blocks, and a merge.

``paged_decode_kernel`` runs one program per (sequence, KV head, split). The program holds
the queries of every query head that shares this KV head (grouped-query attention), padded
to at least 16 rows so that ``tl.dot`` compiles on a GPU. It walks its share of the
sequence (with a sliding window, of its last ``window`` tokens) in tiles of ``TILE_N``
tokens; for each token it looks up the physical block in the block table, so the cache's
block size and the tile size are independent. Scores are kept in
base 2 (the scale is pre-multiplied by log2(e)) and combined with an online softmax in fp32.

With one split the program normalises and writes the output. With several, each writes its
normalised partial output and its log-sum-exp, and ``merge_splits_kernel`` combines them
(flash-decoding). Host-side checks and launch parameters live in ``paged_decode``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    qk_scale,
    num_splits,
    window,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_tb, stride_tn,
    stride_ob, stride_oh, stride_od,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    WRITE_OUTPUT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    # The positions the query attends to: the last ``window`` (all of them without one), so
    # the blocks before ``first`` are never read. This split's token range: an equal share
    # of them, rounded up to whole tiles.
    seq_len = tl.load(seq_lens_ptr + seq)
    first = tl.maximum(seq_len - window, 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - first, num_splits), TILE_N) * TILE_N
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=row_ok[:, None], other=0.0,
    )

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max score (base 2)
    l_i = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)  # running sum of weights * V

    table_row = table_ptr + seq * stride_tb
    k_base = k_ptr + kv_head * stride_kh + dims[None, :] * stride_kd
    v_base = v_ptr + kv_head * stride_vh + dims[None, :] * stride_vd
    offs_n = tl.arange(0, TILE_N)
    for tile_start in range(start, end, TILE_N):
        tokens = tile_start + offs_n
        token_ok = tokens < end
        # Logical token -> (physical block, slot). Masked lanes read block 0, never used.
        block = tl.load(table_row + (tokens // BLOCK_SIZE) * stride_tn, mask=token_ok, other=0)
        block = block.to(tl.int64)
        slot = tokens % BLOCK_SIZE
        k = tl.load(k_base + (block * stride_kb + slot * stride_kt)[:, None],
                    mask=token_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        scores = tl.where(token_ok[None, :], scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        correction = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * correction + tl.sum(p, 1)
        v = tl.load(v_base + (block * stride_vb + slot * stride_vt)[:, None],
                    mask=token_ok[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * correction[:, None], input_precision="ieee")
        m_i = m_new

    if WRITE_OUTPUT:
        out = acc / l_i[:, None]
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        # An empty split (short sequence, many splits) has l_i = 0: it stores output 0 and
        # log-sum-exp -inf, which gives it weight 0 in the merge.
        has_tokens = l_i > 0
        l_safe = tl.where(has_tokens, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(has_tokens, m_i + tl.log2(l_safe), float("-inf"))
        part = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], out,
                 mask=row_ok[:, None])
        tl.store(part_lse_ptr + part, lse, mask=row_ok)


@triton.jit
def merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    num_splits,
    stride_ob, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr,
):
    """Combine the splits of one (sequence, query head) by log-sum-exp: online softmax again."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    first = (seq * tl.num_programs(1) + head) * num_splits
    dims = tl.arange(0, HEAD_DIM)

    # Split 0 always holds the first attended token, so its log-sum-exp is finite.
    m = tl.load(part_lse_ptr + first)
    total = tl.full([], 1.0, tl.float32)
    acc = tl.load(part_out_ptr + first * HEAD_DIM + dims)
    for split in range(1, num_splits):
        lse = tl.load(part_lse_ptr + first + split)
        m_new = tl.maximum(m, lse)
        correction = tl.exp2(m - m_new)
        weight = tl.exp2(lse - m_new)
        part = tl.load(part_out_ptr + (first + split) * HEAD_DIM + dims)
        acc = acc * correction + weight * part
        total = total * correction + weight
        m = m_new
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
             (acc / total).to(out_ptr.dtype.element_ty))
