"""One forward pass over the paged pool: where each token's K/V go, and how attention reads.

The engine runs two kinds of pass, as vLLM's first engine did:

* **prefill**: every token of some whole sequences (new prompts, or preempted requests
  being recomputed). Each layer writes the tokens' K/V into their slots through the block
  tables, then computes plain causal attention over the sequence's own tokens, which are
  all in hand, so nothing is read back from the pool.
* **decode**: one new token per running sequence. Each layer writes the token's K/V into
  its slot, then the Triton paged kernel reads every earlier token's K/V from the pool
  through the block table (``decode_attention="torch"`` gathers with the torch reference
  instead, for timing on a CPU, where the kernel runs in the slow Triton interpreter).

A *slot* is ``block * block_size + offset`` (``PagedKVManager.slot_mapping``); writing a
whole batch's slots is one indexed copy per layer, like vLLM's ``reshape_and_cache``. The
caller appends the tokens to their sequences first, which performs any copy-on-write, so
no slot written here lies in a block another sequence can read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from course_lib.attention import paged_attention_decode, paged_attention_reference
from course_lib.engine.model import packed_causal_attention
from course_lib.paged import BlockPool

DecodeAttention = Literal["triton", "torch"]
DECODE_ATTENTIONS: tuple[DecodeAttention, ...] = ("triton", "torch")


class _SlotWriter:
    """Writes a pass's K/V ``[T, kv_heads, head_dim]`` into the pool at ``slots`` ``[T]``."""

    def __init__(self, pool: BlockPool, slots: Sequence[int]) -> None:
        device = pool.kv_cache(0).device
        index = torch.tensor(slots, dtype=torch.long, device=device)
        self.pool = pool
        self.blocks, self.offsets = index // pool.block_size, index % pool.block_size

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        kv = self.pool.kv_cache(layer)
        kv[self.blocks, 0, self.offsets] = k.to(kv.dtype)
        kv[self.blocks, 1, self.offsets] = v.to(kv.dtype)


class PagedPrefill:
    """Prefill attention (an ``Attention`` for ``LlamaModel``) for whole sequences packed
    back to back: ``lengths[i]`` tokens each, written to ``slots`` (one per token)."""

    def __init__(self, pool: BlockPool, slots: Sequence[int], lengths: Sequence[int]) -> None:
        if sum(lengths) != len(slots):
            raise ValueError(f"{len(slots)} slots for {sum(lengths)} tokens")
        self.write = _SlotWriter(pool, slots)
        self.lengths = list(lengths)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        self.write(layer, k, v)
        return packed_causal_attention(q, k, v, self.lengths)


class PagedDecode:
    """Decode attention (an ``Attention`` for ``LlamaModel``): one token per sequence,
    written to ``slots``, attending over the pool through ``block_table`` and ``seq_lens``
    (both int32, from ``PagedKVManager.batch_tables``)."""

    def __init__(self, pool: BlockPool, slots: Sequence[int], block_table: torch.Tensor,
                 seq_lens: torch.Tensor, decode_attention: DecodeAttention = "triton") -> None:
        if decode_attention not in DECODE_ATTENTIONS:
            raise ValueError(f"unknown decode_attention {decode_attention!r}; expected one of "
                             f"{', '.join(DECODE_ATTENTIONS)}")
        if not len(slots) == block_table.shape[0] == seq_lens.shape[0]:
            raise ValueError(f"{len(slots)} slots for {block_table.shape[0]} block-table rows "
                             f"and {seq_lens.shape[0]} lengths")
        self.pool = pool
        self.write = _SlotWriter(pool, slots)
        self.block_table, self.seq_lens = block_table, seq_lens
        self.decode_attention = decode_attention

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        self.write(layer, k, v)
        args = (q, self.pool.key_cache(layer), self.pool.value_cache(layer), self.block_table,
                self.seq_lens)
        if self.decode_attention == "torch":
            return paged_attention_reference(*args).to(q.dtype)
        # The engine built the tables itself; skip the kernel's value check (a GPU sync).
        return paged_attention_decode(*args, check_values=False)
