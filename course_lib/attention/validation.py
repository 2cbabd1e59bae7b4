"""The input contract of paged decode attention, checked before any kernel touches memory.

A kernel that is handed a wrong shape or a block id outside the pool does not fail politely:
it reads someone else's memory and returns a plausible wrong answer (or crashes the
interpreter). Both the torch reference and the Triton kernel therefore go through
:func:`check_paged_inputs`, which raises ``ValueError`` naming the bad value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedShape:
    """The sizes a paged decode call works with, read off validated inputs."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    max_blocks_per_seq: int

    @property
    def group(self) -> int:
        """Query heads sharing one KV head (1 for MHA, ``num_q_heads`` for MQA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def capacity(self) -> int:
        """The most tokens a block-table row can address."""
        return self.max_blocks_per_seq * self.block_size


def check_paged_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    check_values: bool = True,
) -> PagedShape:
    """Check shapes, dtypes and devices (and, with ``check_values``, lengths and block ids).

    ``q`` is ``[batch, num_q_heads, head_dim]``; ``k_cache`` and ``v_cache`` are
    ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``block_table`` is int32
    ``[batch, max_blocks_per_seq]``; ``seq_lens`` is int32 ``[batch]``. The value checks read
    ``seq_lens`` and the used part of ``block_table``, which on a GPU costs one
    device-to-host synchronisation.
    """
    _check_ranks(q, k_cache, v_cache, block_table, seq_lens)
    batch, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(
            f"v_cache shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)}"
        )
    if kv_head_dim != head_dim:
        raise ValueError(f"q head_dim {head_dim} differs from the cache's head_dim {kv_head_dim}")
    if num_kv_heads == 0 or num_q_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads={num_q_heads} must be a positive multiple of num_kv_heads={num_kv_heads}"
        )
    for name, tensor in (("block_table", block_table), ("seq_lens", seq_lens)):
        if tensor.shape[0] != batch:
            raise ValueError(f"{name} has {tensor.shape[0]} rows but q has batch {batch}")
    if block_size < 1 or num_blocks < 1:
        raise ValueError(
            f"the cache holds {num_blocks} blocks of {block_size} tokens; need >= 1 of each"
        )
    _check_dtypes_and_devices(q, k_cache, v_cache, block_table, seq_lens)
    shape = PagedShape(
        batch, num_q_heads, num_kv_heads, head_dim, block_size, num_blocks, block_table.shape[1]
    )
    if check_values and batch:
        _check_lengths_and_block_ids(block_table, seq_lens, shape)
    return shape


NO_WINDOW = 2**31 - 1
"""The window a full-attention call uses: more positions than any int32 length."""


def check_window(window: object) -> int:
    """A sliding window in tokens (a positive int, at most ``NO_WINDOW``), or None for full
    attention, as the number of positions a query attends to."""
    if window is None:
        return NO_WINDOW
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= NO_WINDOW:
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    return window


def _check_ranks(*tensors: torch.Tensor) -> None:
    names = ("q", "k_cache", "v_cache", "block_table", "seq_lens")
    layouts = (
        "[batch, num_q_heads, head_dim]",
        "[num_blocks, block_size, num_kv_heads, head_dim]",
        "[num_blocks, block_size, num_kv_heads, head_dim]",
        "[batch, max_blocks_per_seq]",
        "[batch]",
    )
    for name, layout, tensor in zip(names, layouts, tensors, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != layout.count(",") + 1:
            raise ValueError(f"{name} must be {layout}, got shape {tuple(tensor.shape)}")


def _check_dtypes_and_devices(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    if not q.dtype.is_floating_point:
        raise ValueError(f"q must be a floating-point tensor, got {q.dtype}")
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        if tensor.dtype != q.dtype:
            raise ValueError(f"{name} dtype {tensor.dtype} differs from q dtype {q.dtype}")
    for name, tensor in (("block_table", block_table), ("seq_lens", seq_lens)):
        if tensor.dtype != torch.int32:
            raise ValueError(f"{name} must be torch.int32, got {tensor.dtype}")
    named = (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
             ("seq_lens", seq_lens))
    for name, tensor in named:
        if tensor.device != q.device:
            raise ValueError(f"{name} is on {tensor.device} but q is on {q.device}")


def _check_lengths_and_block_ids(
    block_table: torch.Tensor, seq_lens: torch.Tensor, shape: PagedShape
) -> None:
    lens = seq_lens.to(torch.int64)
    bad_len = (lens < 1) | (lens > shape.capacity)
    blocks_used = (lens.clamp(min=0) + shape.block_size - 1) // shape.block_size
    columns = torch.arange(shape.max_blocks_per_seq, device=lens.device)
    used = columns[None, :] < blocks_used[:, None]
    bad_id = used & ((block_table < 0) | (block_table >= shape.num_blocks))
    # One small host read decides; the detailed search below runs only on failure.
    if not torch.stack((bad_len.any(), bad_id.any())).any().item():
        return
    if bad_len.any():
        row = int(bad_len.nonzero()[0, 0])
        length = int(lens[row])
        if length < 1:
            raise ValueError(f"seq_lens[{row}] = {length}: every sequence needs at least one token")
        raise ValueError(
            f"seq_lens[{row}] = {length} exceeds what its block-table row covers "
            f"({shape.max_blocks_per_seq} blocks x {shape.block_size} tokens = {shape.capacity})"
        )
    row, column = (int(i) for i in bad_id.nonzero()[0])
    raise ValueError(
        f"block_table[{row}, {column}] = {int(block_table[row, column])} is outside the pool "
        f"of {shape.num_blocks} blocks (valid ids are 0..{shape.num_blocks - 1})"
    )
