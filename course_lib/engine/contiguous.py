"""Ordinary generation with a contiguous KV cache: the baseline the paged engine must match.

Every sample gets a row of one preallocated tensor ``[layers, 2, rows, max_len, kv_heads,
head_dim]`` for its whole life: the reserve-max contiguous allocation of chapter 02, the
way serving systems kept the cache before paging. With ``max_batch`` rows, at most that
many samples run at once (continuous batching: a freed row takes the next sample at once),
and each row holds ``max_len`` slots whatever the sample's length. Parallel samples share
nothing: each prefills its own copy of the prompt.

Prefill is the same packed causal attention as the paged engine's; decode attends over each
row's first ``length`` slots with torch's scaled-dot-product attention.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from course_lib.engine.model import LlamaModel, packed_causal_attention
from course_lib.engine.requests import (
    GenerationRequest,
    PreparedRequest,
    RequestOutput,
    Sample,
    prepare_requests,
)
from course_lib.engine.sampling import SamplingParams
from course_lib.validate import check_int


class _RowCache:
    """The contiguous cache and, for one forward pass, the rows and positions it writes."""

    def __init__(self, model: LlamaModel, rows: int, max_len: int) -> None:
        config = model.config
        self.kv = torch.zeros((config.num_layers, 2, rows, max_len, config.num_kv_heads,
                               config.head_dim), dtype=model.dtype, device=model.device)
        self.rows = self.positions = torch.zeros(0, dtype=torch.long)
        self.lengths: list[int] = []
        self.decoding = False

    def prepare(self, rows: list[int], positions: list[int], lengths: list[int],
                decoding: bool) -> None:
        """Say which row and position each token of the next pass has."""
        device = self.kv.device
        self.rows = torch.tensor(rows, dtype=torch.long, device=device)
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)
        self.lengths, self.decoding = lengths, decoding

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        kv = self.kv[layer]
        kv[0, self.rows, self.positions] = k
        kv[1, self.rows, self.positions] = v
        if not self.decoding:
            return packed_causal_attention(q, k, v, self.lengths)
        width = max(self.lengths)
        group = q.shape[1] // k.shape[1]
        keys = kv[0, self.rows, :width].repeat_interleave(group, dim=2).transpose(1, 2)
        values = kv[1, self.rows, :width].repeat_interleave(group, dim=2).transpose(1, 2)
        lengths = torch.tensor(self.lengths, device=q.device)
        mask = torch.arange(width, device=q.device)[None, :] < lengths[:, None]
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values,
                                             attn_mask=mask[:, None, None, :])
        return out[:, :, 0]


def generate(
    model: LlamaModel,
    requests: Sequence[GenerationRequest | str | Sequence[int]],
    params: SamplingParams | None = None,
    *,
    max_batch: int | None = None,
    max_len: int | None = None,
    tokenizer: Any | None = None,
) -> list[RequestOutput]:
    """Generate with a contiguous cache of ``max_batch`` rows of ``max_len`` slots each.

    Defaults: a row for every sample, each as long as the longest request. Samples start in
    submission order as rows free up; ``priority`` is ignored. Outputs are in submission
    order and equal the paged engine's whenever both compute the same logits.
    """
    if not isinstance(model, LlamaModel):
        raise ValueError(f"model must be a LlamaModel, got {type(model).__name__}")
    prepared = prepare_requests(requests, params, model.config, tokenizer)
    queue = deque((r, s) for r in prepared for s in r.samples)
    longest = max(len(r.prompt) + r.params.max_tokens for r in prepared)
    max_len = longest if max_len is None else check_int("max_len", max_len, 1)
    if max_len < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest request "
                         f"({longest} tokens)")
    rows = len(queue) if max_batch is None else check_int("max_batch", max_batch, 1)
    cache = _RowCache(model, rows, max_len)
    free_rows = deque(range(rows))
    running: dict[int, tuple[PreparedRequest, Sample]] = {}
    while queue or running:
        decoding = sorted(running)
        admitted = []
        while queue and free_rows:
            row = free_rows.popleft()
            running[row] = queue.popleft()
            admitted.append(row)
        if admitted:
            samples = [running[row][1] for row in admitted]
            lengths = [len(s.tokens) for s in samples]
            positions = [p for n in lengths for p in range(n)]
            cache.prepare([row for row, n in zip(admitted, lengths, strict=True)
                           for _ in range(n)], positions, lengths, decoding=False)
            _sample_next(model, [running[row] for row in admitted],
                         [t for s in samples for t in s.tokens], positions, cache, lengths)
        if decoding:
            samples = [running[row][1] for row in decoding]
            positions = [len(s.tokens) - 1 for s in samples]
            cache.prepare(decoding, positions, [p + 1 for p in positions], decoding=True)
            _sample_next(model, [running[row] for row in decoding],
                         [s.tokens[-1] for s in samples], positions, cache)
        for row in [row for row, (_, s) in running.items() if s.finish_reason is not None]:
            del running[row]
            free_rows.append(row)
    return [r.output(tokenizer) for r in prepared]


def _sample_next(model: LlamaModel, pairs: list[tuple[PreparedRequest, Sample]],
                 tokens: list[int], positions: list[int], cache: _RowCache,
                 last_of: list[int] | None = None) -> None:
    """Run the model on a flat batch and give each sample the token it draws next."""
    logits = model.next_token_logits(tokens, positions, cache, last_of)
    eos = model.config.eos_token_ids
    for (request, sample), row in zip(pairs, logits, strict=True):
        request.add_token(sample, row, eos)
