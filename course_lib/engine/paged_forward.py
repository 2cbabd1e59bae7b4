"""One forward pass over the paged pool: where each token's K/V go, and how attention reads.

Each engine step runs **one** pass over a mix of sequences, as vLLM v1 does: every
scheduled sequence contributes a *chunk* of consecutive new tokens, ``count`` of them from
position ``start`` (everything before ``start`` is already in the pool, computed in an
earlier step or found in the prefix cache). A decode is a chunk of one token; a prompt is
one chunk, or several over several steps when the token budget splits it (chunked
prefill). Each layer first writes the chunks' K/V into their slots through the block
tables (one indexed copy, like vLLM's ``reshape_and_cache``), then every chunk attends over
its sequence's whole context, read back from the pool through its block table:

* one-token chunks (decodes) go together through the Triton paged kernel of chapter 06
  (``decode_attention="torch"`` instead gathers each sequence's blocks through its block
  table once per layer and attends with torch's scaled-dot-product attention, the same
  call the contiguous baseline makes: for timing on a CPU, where the kernel runs in the
  slow Triton interpreter, and for a fair comparison there);
* longer chunks gather their context with ``gather_paged_kv`` and attend with a causal
  mask shifted by ``start``, in torch. A GPU engine runs a varlen paged-prefill kernel
  here instead (vLLM uses FlashAttention's ``flash_attn_varlen_func`` with a block table,
  or FlashInfer), which reads the same pool in the same layout.

A *slot* is ``block * block_size + offset`` (``PagedKVManager.slot_mapping``). The caller
appends the tokens to their sequences first, which performs any copy-on-write, so no slot
written here lies in a block another sequence can read.

With an FP8 pool (chapter 10, ``kv_quant``) K/V are quantized with their layer's scales as
they are written, dequantized by the torch paths after they are gathered, and by the FP8
decode kernel inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Literal

import torch
import torch.nn.functional as F

from course_lib.attention import (
    gather_paged_kv,
    paged_attention_decode,
    paged_attention_decode_fp8,
    paged_attention_reference,
)
from course_lib.engine.kv_quant import KVQuantization
from course_lib.paged import BlockPool

DecodeAttention = Literal["triton", "torch"]
DECODE_ATTENTIONS: tuple[DecodeAttention, ...] = ("triton", "torch")


def check_decode_attention(decode_attention: object) -> None:
    """Raise ValueError unless ``decode_attention`` is one of ``DECODE_ATTENTIONS``."""
    if decode_attention not in DECODE_ATTENTIONS:
        raise ValueError(f"unknown decode_attention {decode_attention!r}; expected one of "
                         f"{', '.join(DECODE_ATTENTIONS)}")


class _SlotWriter:
    """Writes a pass's K/V ``[T, kv_heads, head_dim]`` into the pool at ``slots`` ``[T]``
    (quantized with their layer's scales for an FP8 pool)."""

    def __init__(self, pool: BlockPool, slots: Sequence[int],
                 kv_quant: KVQuantization | None = None) -> None:
        size = pool.block_size
        where = torch.tensor([[slot // size for slot in slots], [slot % size for slot in slots]],
                             dtype=torch.long, device=pool.kv_cache(0).device)
        self.pool, self.kv_quant = pool, kv_quant
        self.blocks, self.offsets = where[0], where[1]

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        kv = self.pool.kv_cache(layer)
        for which, x in enumerate((k, v)):
            kv[self.blocks, which, self.offsets] = (
                x.to(kv.dtype) if self.kv_quant is None else self.kv_quant.store(layer, which, x))


def _readable(kv_quant: KVQuantization | None, layer: int, which: int, x: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
    """K (0) or V (1) gathered from the pool, in ``dtype`` (dequantized if FP8)."""
    return x.to(dtype) if kv_quant is None else kv_quant.load(layer, which, x, dtype)


class PagedBatch:
    """Attention (an ``Attention`` for ``LlamaModel``) for one engine step: chunk ``i``
    is ``counts[i]`` new tokens of a sequence from position ``starts[i]``, packed back to
    back, written to ``slots`` (one per token); ``block_table`` (int32, one row per chunk,
    from ``PagedKVManager.batch_tables``) says where each sequence's context lies. With a
    sliding ``window`` (chapter 08) each token attends only to the last ``window``
    positions, itself included, and the table's entries before them are never read."""

    def __init__(self, pool: BlockPool, slots: Sequence[int], block_table: torch.Tensor,
                 starts: Sequence[int], counts: Sequence[int],
                 decode_attention: DecodeAttention = "triton", *,
                 window: int | None = None, kv_quant: KVQuantization | None = None) -> None:
        check_decode_attention(decode_attention)
        if not len(starts) == len(counts) == block_table.shape[0]:
            raise ValueError(f"{len(starts)} starts and {len(counts)} counts for "
                             f"{block_table.shape[0]} block-table rows")
        if min(counts, default=1) < 1 or sum(counts) != len(slots):
            raise ValueError(f"{len(slots)} slots for chunks of {list(counts)} tokens")
        if kv_quant is not None and window is not None:
            raise ValueError(f"an FP8 pool with a window ({window}) is not supported: the "
                             f"FP8 decode kernel attends over whole sequences")
        self.pool, self.decode_attention, self.window = pool, decode_attention, window
        self.kv_quant = kv_quant
        self.write = _SlotWriter(pool, slots, kv_quant)
        self.block_table = block_table
        self.starts, self.counts = list(starts), list(counts)
        self.offsets = list(accumulate(counts, initial=0))
        device = block_table.device
        self.decodes = [i for i, count in enumerate(counts) if count == 1]
        self.only_decodes = len(self.decodes) == len(self.counts)
        lengths = [self.starts[i] + 1 for i in self.decodes]
        self.decode_tables = block_table if self.only_decodes else block_table[self.decodes]
        self.decode_rows = None if self.only_decodes else torch.tensor(
            [self.offsets[i] for i in self.decodes], dtype=torch.long, device=device)
        self.gather = self.decode_lens = None
        if self.decodes and decode_attention == "torch" and window is None:
            self.gather = _DecodeGather(self.decode_tables, lengths, pool.block_size, kv_quant)
        elif self.decodes:
            self.decode_lens = torch.tensor(lengths, dtype=torch.int32, device=device)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        self.write(layer, k, v)
        if self.only_decodes:  # the common step: nothing to scatter
            return self._decode(layer, q)
        out = torch.empty_like(q)
        if self.decodes:
            out[self.decode_rows] = self._decode(layer, q[self.decode_rows])
        for i, count in enumerate(self.counts):
            if count > 1:
                span = slice(self.offsets[i], self.offsets[i + 1])
                out[span] = self._chunk(layer, q[span], i)
        return out

    def _decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of the decodes' queries (one token each) over their sequences."""
        if self.gather is not None:
            return self.gather(q, self.pool, layer)
        return _decode(q, self.pool, layer, self.decode_tables, self.decode_lens,
                       self.decode_attention, self.window, self.kv_quant)

    def _chunk(self, layer: int, q: torch.Tensor, index: int) -> torch.Tensor:
        """Causal attention of one chunk's queries over its sequence's context in the pool."""
        length = self.starts[index] + self.counts[index]
        keys, values = gather_paged_kv(
            self.pool.key_cache(layer), self.pool.value_cache(layer),
            self.block_table[index : index + 1],
            torch.tensor([length], dtype=torch.int32, device=q.device))
        keys, values = (_readable(self.kv_quant, layer, which, x[0, :length], q.dtype)
                        for which, x in enumerate((keys, values)))
        return causal_attention(q, keys, values, self.window)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int | None = None) -> torch.Tensor:
    """Causal attention of queries ``[Tq, heads, head_dim]``, the last ``Tq`` positions of
    the context, over its K/V ``[T, kv_heads, head_dim]`` (only the last ``window``
    positions of each query's, itself included, with a window)."""
    length, group = k.shape[0], q.shape[1] // k.shape[1]
    rows = torch.arange(length - q.shape[0], length, device=q.device)[:, None]
    columns = torch.arange(length, device=q.device)[None, :]
    mask = columns <= rows
    if window is not None:
        mask &= columns > rows - window
    keys = k.repeat_interleave(group, dim=1).transpose(0, 1)
    values = v.repeat_interleave(group, dim=1).transpose(0, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)
    return out.transpose(0, 1)


class _DecodeGather:
    """Decode attention in torch for one step's decodes: each sequence's blocks gathered
    through its block table (the index built once per step, every layer reusing it), then
    ``scaled_dot_product_attention`` under a length mask, as the contiguous baseline
    attends over its rows. ``block_table`` rows are padded with the null block past each
    sequence's blocks, as ``PagedKVManager.batch_tables`` pads them."""

    def __init__(self, block_table: torch.Tensor, lengths: list[int], block_size: int,
                 kv_quant: KVQuantization | None = None) -> None:
        device = block_table.device
        self.kv_quant = kv_quant
        self.width = max(lengths)
        blocks = -(-self.width // block_size)
        if blocks < block_table.shape[1]:
            block_table = block_table[:, :blocks]
        self.flat = block_table.reshape(-1)  # int32 indexes as well as int64
        self.batch, self.span = len(lengths), blocks * block_size
        self.mask = None  # every sequence as long as the longest (one decode): no mask
        if min(lengths) < self.width:
            lens = torch.tensor(lengths, device=device)
            self.mask = (torch.arange(self.width, device=device)[None, :] < lens[:, None])[
                :, None, None, :]

    def __call__(self, q: torch.Tensor, pool: BlockPool, layer: int) -> torch.Tensor:
        """Attention of one query token per sequence ``[batch, heads, head_dim]``."""
        keys, values = (
            _readable(self.kv_quant, layer, which, cache[self.flat].reshape(
                self.batch, self.span, *cache.shape[2:])[:, :self.width], q.dtype)
            .repeat_interleave(q.shape[1] // cache.shape[2], dim=2).transpose(1, 2)
            for which, cache in enumerate((pool.key_cache(layer), pool.value_cache(layer))))
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=self.mask)
        return out[:, :, 0]


class PagedDecode:
    """Decode attention (an ``Attention`` for ``LlamaModel``): one token per sequence,
    written to ``slots``, attending over the pool through ``block_table`` and ``seq_lens``
    (both int32, from ``PagedKVManager.batch_tables``)."""

    def __init__(self, pool: BlockPool, slots: Sequence[int], block_table: torch.Tensor,
                 seq_lens: torch.Tensor, decode_attention: DecodeAttention = "triton") -> None:
        check_decode_attention(decode_attention)
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
        return _decode(q, self.pool, layer, self.block_table, self.seq_lens,
                       self.decode_attention)


def _decode(q: torch.Tensor, pool: BlockPool, layer: int, block_table: torch.Tensor,
            seq_lens: torch.Tensor, decode_attention: DecodeAttention,
            window: int | None = None, kv_quant: KVQuantization | None = None) -> torch.Tensor:
    """Decode attention of one query token per sequence over the pool (over its last
    ``window`` positions, with a window): the kernel, or the torch reference. An FP8 pool
    (no window: ``PagedBatch`` refuses one) goes to the FP8 kernel, which dequantizes."""
    args = (q, pool.key_cache(layer), pool.value_cache(layer), block_table, seq_lens)
    if kv_quant is not None:
        k_scale, v_scale = kv_quant.scales[layer]
        return paged_attention_decode_fp8(*args, k_scale, v_scale, check_values=False)
    windowed = {} if window is None else {"window": window}
    if decode_attention == "torch":
        return paged_attention_reference(*args, **windowed).to(q.dtype)
    # The engine built the tables itself; skip the kernel's value check (a GPU sync).
    return paged_attention_decode(*args, check_values=False, **windowed)
