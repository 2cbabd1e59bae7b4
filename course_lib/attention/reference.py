"""Torch references for decode attention: the ground truth every kernel is tested against.

``reference_attention`` is plain attention over contiguous K/V, computed in float32.
``paged_attention_reference`` reads a paged cache the obvious way (gather each sequence's
blocks into a contiguous tensor, then call the reference), which is also what a serving
engine would have to do without a paged kernel.
"""

from __future__ import annotations

import math

import torch

from course_lib.attention.validation import check_paged_inputs, check_window


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    window: int | None = None,
) -> torch.Tensor:
    """Decode attention over contiguous K/V, computed and returned in float32.

    ``q`` is ``[batch, num_q_heads, head_dim]`` (one new token per sequence); ``k`` and ``v``
    are ``[batch, max_len, num_kv_heads, head_dim]``. Query head ``h`` attends with KV head
    ``h // (num_q_heads // num_kv_heads)`` (grouped-query attention). Positions at or past
    ``seq_lens[b]`` are ignored, whatever they hold (NaN included). ``scale`` defaults to
    ``1 / sqrt(head_dim)``. With a sliding ``window`` W the query (the token at position
    ``seq_lens[b] - 1``) attends only to the last W positions. The result is
    ``[batch, num_q_heads, head_dim]``.
    """
    window = check_window(window)
    batch, num_q_heads, head_dim = q.shape
    _, max_len, num_kv_heads, _ = k.shape
    if num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if seq_lens is None:
        seq_lens = torch.full((batch,), max_len, device=q.device)
    positions = torch.arange(max_len, device=q.device)[None, :]
    ends = seq_lens.to(q.device)[:, None]
    valid = (positions < ends) & (positions >= ends - window)
    group = num_q_heads // num_kv_heads
    # [batch, num_q_heads, max_len, head_dim]: each query head sees its group's KV head.
    keys = k.float().transpose(1, 2).repeat_interleave(group, dim=1)
    values = v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    values = torch.where(valid[:, None, :, None], values, 0.0)  # 0 * NaN would still be NaN
    scores = torch.einsum("bhd,bhtd->bht", q.float(), keys) * scale
    scores = torch.where(valid[:, None, :], scores, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bht,bhtd->bhd", weights, values)


def gather_paged_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy each sequence's blocks into contiguous ``[batch, max_blocks * block_size, H, D]``.

    Table entries past a sequence's last block are never read (they may hold anything), so
    they are pointed at block 0 before the gather.
    """
    block_size = k_cache.shape[1]
    blocks_used = (seq_lens.to(torch.int64) + block_size - 1) // block_size
    columns = torch.arange(block_table.shape[1], device=block_table.device)
    table = torch.where(columns[None, :] < blocks_used[:, None], block_table.long(), 0)
    batch, max_blocks = table.shape
    flat = table.reshape(-1)

    def gather(cache: torch.Tensor) -> torch.Tensor:
        return cache[flat].reshape(batch, max_blocks * block_size, *cache.shape[2:])

    return gather(k_cache), gather(v_cache)


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    window: int | None = None,
) -> torch.Tensor:
    """Paged decode attention the slow, obvious way: gather through the block table, then attend.

    Same inputs and validation as ``paged_attention_decode``; returns float32.
    """
    check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens)
    keys, values = gather_paged_kv(k_cache, v_cache, block_table, seq_lens)
    return reference_attention(q, keys, values, seq_lens, scale, window=window)
