"""Chapter 08's engine: a model whose layers alternate sliding-window and full attention,
served from KV-cache groups, and the ordinary generation it must equal.

The model is chapter 07's :class:`LlamaModel`; what makes it hybrid is only how each layer
attends, so a hybrid model here is a ``LlamaModel`` plus one window per layer (None for
full attention). :class:`HybridEngine` is :class:`PagedEngine` with the hybrid serving core
(``course_lib.hybrid_serving``): one KV-cache group per attention kind, one block table per
group, every group drawing on the engine's one pool. Each layer reads and writes K/V through
its group's table, with its window in the decode kernel and in the prefill mask.

Simplification: the pool keeps room for every layer in every block (chapter 07's layout), so
a block taken by one group leaves the other groups' layers of it unused; vLLM instead gives
each group's layers their own pages of one size (``kv_math.HybridModel.kv_cache_groups``).

:func:`generate_windowed` is the baseline: plain greedy generation that recomputes the whole
sequence every token with a causal mask cut to each layer's window, no cache at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from course_lib.engine.engine import PagedEngine
from course_lib.engine.model import LlamaModel
from course_lib.engine.paged_forward import PagedBatch, causal_attention
from course_lib.hybrid_serving import HybridServingCore
from course_lib.paged import NULL_BLOCK
from course_lib.serving import Chunk
from course_lib.validate import check_int, check_list


def check_windows(model: LlamaModel, windows: Sequence[int | None]) -> tuple[int | None, ...]:
    """One window per layer of ``model`` (a positive int, or None for full attention)."""
    windows = tuple(check_list("windows", windows))
    if len(windows) != model.config.num_layers:
        raise ValueError(f"{len(windows)} windows for a model of {model.config.num_layers} "
                         f"layers")
    for window in windows:
        if window is not None:
            check_int("window", window, 1)
    return windows


class WindowedAttention:
    """Attention (an ``Attention`` for ``LlamaModel``) over one whole sequence, recomputed
    from scratch: causal, and for a window layer only the last W positions."""

    def __init__(self, windows: Sequence[int | None]) -> None:
        self.windows = tuple(windows)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        return causal_attention(q, k, v, self.windows[layer])


def generate_windowed(model: LlamaModel, windows: Sequence[int | None],
                      prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt by ``max_tokens`` tokens (or up to an end token),
    every token computed from the whole sequence with each layer's window mask."""
    windows = check_windows(model, windows)
    check_int("max_tokens", max_tokens, 1)
    eos = model.config.eos_token_ids
    outputs = []
    for prompt in prompts:
        tokens, generated = list(prompt), []
        while len(generated) < max_tokens:
            logits = model.next_token_logits(tokens, list(range(len(tokens))),
                                             WindowedAttention(windows), last_of=[len(tokens)])
            token = int(torch.argmax(logits[0]))
            tokens.append(token)
            generated.append(token)
            if token in eos:
                break
        outputs.append(generated)
    return outputs


class _GroupedBatch:
    """Attention for one engine step of a hybrid model: layer l goes through the
    ``PagedBatch`` of its group (that group's tables and slots, and its window)."""

    def __init__(self, batches: Sequence[PagedBatch], layer_group: Sequence[int]) -> None:
        self.batches, self.layer_group = list(batches), list(layer_group)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        return self.batches[self.layer_group[layer]](layer, q, k, v)


class HybridEngine(PagedEngine):
    """``PagedEngine`` for a model whose layer ``l`` attends over ``windows[l]`` tokens (None:
    all); the same options, recompute preemption, prefix caching across groups."""

    def __init__(self, model: LlamaModel, windows: Sequence[int | None], **options: Any
                 ) -> None:
        windows = check_windows(model, windows)
        if any(w is not None for w in windows) and options.get("kv_cache_dtype", "auto") != "auto":
            raise ValueError(f"kv_cache_dtype={options['kv_cache_dtype']!r} with sliding "
                             f"windows is not supported: the FP8 decode kernel has no window")
        super().__init__(model, **options)
        self.group_windows = tuple(dict.fromkeys(windows))
        self.layer_group = [self.group_windows.index(w) for w in windows]
        self.core = HybridServingCore(self.scheduler_config, self.core.pool, self.group_windows,
                                      chunked_prefill=self.core.chunked_prefill)
        self.pool, self.manager = self.core.pool, self.core.manager

    def _attention(self, chunks: list[Chunk], spans: list[range]) -> _GroupedBatch:
        """The step's attention: each layer through its group's tables."""
        batches = [self._group_batch(group, window, chunks, spans)
                   for group, window in enumerate(self.group_windows)]
        return _GroupedBatch(batches, self.layer_group)

    def _group_batch(self, group: int, window: int | None, chunks: list[Chunk],
                     spans: list[range]) -> PagedBatch:
        """The ``PagedBatch`` of group ``group``: its block tables, padded with the null
        block, and the slots of every chunk's tokens in them."""
        size = self.pool.block_size
        tables = [self.manager.block_table(c.sample.seq_id, group) for c in chunks]
        width = max(len(t) for t in tables)
        slots = [table[p // size] * size + p % size
                 for table, span in zip(tables, spans, strict=True) for p in span]
        padded = torch.tensor([list(t) + [NULL_BLOCK] * (width - len(t)) for t in tables],
                              dtype=torch.int32, device=self.model.device)
        return PagedBatch(self.pool, slots, padded, [c.start for c in chunks],
                          [c.count for c in chunks], self.decode_attention, window=window,
                          kv_quant=self.kv_quant)

    def held_blocks(self) -> dict[int | None, int]:
        """Blocks each group's tables hold now, by window (None: full attention)."""
        held = dict.fromkeys(self.group_windows, 0)
        for seq_id in self.manager.sequences:
            for window, table in zip(self.group_windows, self.manager.block_tables(seq_id),
                                     strict=True):
                held[window] += sum(b != NULL_BLOCK for b in table)
        return held
