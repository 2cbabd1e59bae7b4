"""An FP8 KV cache for the engine: the format, per-layer scales, and their calibration.

With ``PagedEngine(..., kv_cache_dtype="fp8")`` the pool's K/V tensors are FP8 (one byte a
number), so the same bytes hold twice the tokens of a 16-bit cache. Each layer has one
scale for K and one for V (vLLM's ``k_scale`` / ``v_scale``, per tensor): a token's K/V
are stored as ``fp8(clamp(k / k_scale))`` when written and read back as ``code x k_scale``,
by the torch paths here and inside the Triton decode kernel
(``course_lib.attention.quantized_decode``). Per-layer scales cost nothing per token.

vLLM's scales are 1.0 unless the checkpoint carries calibrated ones (or it computes them
from the first batch); a random toy model's K/V are far below 1, where E4M3 has few
values, so :func:`calibrate_kv_scales` measures each layer's largest |K| and |V| over
calibration prompts, as ``llm-compressor`` does offline: ``scale = max |x| / 448``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from course_lib.engine.model import LlamaModel, packed_causal_attention
from course_lib.engine.sampling import SamplingParams
from course_lib.fp8 import FP8Format, calibrate_scale, dequantize, encode
from course_lib.validate import check_int, check_list, describe

if TYPE_CHECKING:
    from course_lib.engine.engine import PagedEngine


@dataclass(frozen=True)
class KVQuantization:
    """How an FP8 pool's K/V are written and read: ``fmt`` and ``scales``, float32
    ``[num_layers, 2]`` (each layer's K scale, then its V scale)."""

    fmt: FP8Format
    scales: torch.Tensor

    def store(self, layer: int, which: int, x: torch.Tensor) -> torch.Tensor:
        """K (``which`` 0) or V (1) of ``layer`` as the FP8 codes the pool keeps (the scales
        were checked once, by :func:`kv_quantization`)."""
        return encode(x, self.scales[layer, which], self.fmt)

    def load(self, layer: int, which: int, codes: torch.Tensor,
             dtype: torch.dtype) -> torch.Tensor:
        """FP8 codes read from the pool, as K (0) or V (1) of ``layer`` in ``dtype``."""
        return dequantize(codes, self.scales[layer, which], dtype)


def kv_quantization(fmt: FP8Format, num_layers: int,
                    scales: torch.Tensor | Sequence[Sequence[float]] | None) -> KVQuantization:
    """An FP8 cache's quantization: ``scales`` per layer (K, V), or 1.0 each (vLLM's
    default without calibrated scales); refuses a wrong shape or a scale that is not finite
    and positive."""
    if scales is None:
        table = torch.ones(num_layers, 2)
    else:
        if not isinstance(scales, torch.Tensor):
            check_list("kv_scales", scales)
        table = torch.as_tensor(scales, dtype=torch.float32).detach().cpu()
    if table.shape != (num_layers, 2):
        raise ValueError(f"kv_scales must be [num_layers={num_layers}, 2] (K and V scale per "
                         f"layer), got shape {tuple(table.shape)}")
    if not bool(torch.isfinite(table).all() and (table > 0).all()):
        raise ValueError(f"kv_scales must be finite and positive, got {table.tolist()}")
    return KVQuantization(fmt, table)


class _RangeRecorder:
    """Attention for whole prompts (causal) that keeps each layer's K and V (one forward
    pass calls a layer once)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.keys: dict[int, list[torch.Tensor]] = {}
        self.values: dict[int, list[torch.Tensor]] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        self.keys.setdefault(layer, []).append(k.float().cpu())
        self.values.setdefault(layer, []).append(v.float().cpu())
        return packed_causal_attention(q, k, v, self.lengths)


def record_kv(model: LlamaModel, prompts: Sequence[Sequence[int]]
              ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's K and V, float32 ``[tokens, num_kv_heads, head_dim]``, for ``prompts``
    run whole through ``model`` (their tokens one after another): the values an FP8
    cache would hold, to calibrate its scales or measure its error."""
    if not isinstance(model, LlamaModel):
        raise ValueError(f"model must be a LlamaModel, got {describe(model)}")
    rows = [check_list("prompt", p) for p in check_list("prompts", prompts)]
    if not rows or not all(rows):
        raise ValueError("record_kv needs at least one prompt, none empty")
    for token in (t for r in rows for t in r):
        check_int("token id", token, 0, model.config.vocab_size - 1)
    recorder = _RangeRecorder([len(r) for r in rows])
    model.next_token_logits([t for r in rows for t in r],
                            [p for r in rows for p in range(len(r))], recorder)
    return [(torch.cat(recorder.keys[layer]), torch.cat(recorder.values[layer]))
            for layer in range(model.config.num_layers)]


def calibrate_kv_scales(model: LlamaModel, prompts: Sequence[Sequence[int]],
                        fmt: str | FP8Format = "e4m3") -> torch.Tensor:
    """Per-layer K and V scales, float32 ``[num_layers, 2]``: each layer's largest |K| (and
    |V|) over ``prompts`` (:func:`record_kv`) divided by the format's largest value, so
    those maxima land on it and nothing saturates on prompts like these."""
    return torch.stack([torch.stack([calibrate_scale(k, fmt), calibrate_scale(v, fmt)])
                        for k, v in record_kv(model, prompts)])


@dataclass(frozen=True)
class KVCacheAccuracy:
    """What an FP8 cache changed against the model's own dtype, greedy, same prompts:
    ``agreeing`` of the ``tokens`` generated are the same token at the same place, and
    ``max_logit_error`` is the largest |logit difference| at any step whose context was
    still the same in both runs (after a first different token the contexts differ)."""

    tokens: int
    agreeing: int
    compared_steps: int
    max_logit_error: float

    @property
    def agreement(self) -> float:
        """Share of generated tokens that are the same in both runs."""
        return self.agreeing / self.tokens


class _LogitTap:
    """Wraps an engine's forward pass to keep each sampled row of logits by (sequence id,
    context length)."""

    def __init__(self, engine: PagedEngine) -> None:
        self.rows: dict[tuple[str, int], torch.Tensor] = {}
        forward = engine._forward

        def tapped(chunks: list) -> torch.Tensor:
            logits = forward(chunks)
            for chunk, row in zip(chunks, logits, strict=True):
                self.rows[chunk.sample.seq_id, chunk.start + chunk.count] = row
            return logits
        engine._forward = tapped  # type: ignore[method-assign]


def kv_cache_accuracy(model: LlamaModel, prompts: Sequence[Sequence[int]], *,
                      max_tokens: int, kv_cache_dtype: str = "fp8",
                      kv_scales: torch.Tensor | None = None,
                      **engine_options: Any) -> KVCacheAccuracy:
    """Serve ``prompts`` greedily (``max_tokens`` each, end tokens ignored) twice, with the
    model's dtype and with ``kv_cache_dtype``, every other engine option the same, and
    compare the tokens and the logits they were drawn from."""
    from course_lib.engine.engine import PagedEngine  # the engine imports this module

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    runs = []
    for options in ({}, {"kv_cache_dtype": kv_cache_dtype, "kv_scales": kv_scales}):
        engine = PagedEngine(model, **engine_options, **options)
        tap = _LogitTap(engine)
        outputs = engine.generate(prompts, params)
        seq_ids = [engine.core.requests[o.request_id].samples[0].seq_id for o in outputs]
        runs.append(([o.token_ids[0] for o in outputs], tap.rows))
    (base, base_rows), (other, other_rows) = runs
    agreeing = compared = 0
    worst = 0.0
    for seq_id, prompt, a, b in zip(seq_ids, prompts, base, other, strict=True):
        for step, (x, y) in enumerate(zip(a, b, strict=True)):
            if a[:step] == b[:step]:
                key = (seq_id, len(prompt) + step)
                worst = max(worst, float((base_rows[key] - other_rows[key]).abs().max()))
                compared += 1
            agreeing += x == y
    return KVCacheAccuracy(sum(map(len, base)), agreeing, compared, worst)
