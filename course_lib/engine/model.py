"""A Llama-architecture decoder in plain torch, written so that the KV cache is pluggable.

The layers are Llama's (the names match Hugging Face's ``LlamaForCausalLM``, so its weights
load as they are): RMSNorm, rotary position embeddings (with Llama-3 frequency scaling),
grouped-query attention and a SwiGLU MLP. What the model does *not* know is where keys and
values live: every attention layer hands its rotated ``q``, ``k`` and ``v`` to an
:class:`Attention` object, which stores K/V wherever its cache is (a paged pool through
block tables, or a contiguous tensor) and returns the attention output. The paged engine
and the contiguous baseline therefore run exactly the same weights and arithmetic, and
differ only in how they keep the cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.validate import check_int, check_positive_number


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's rotary frequency scaling: long wavelengths slowed by ``factor``."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-architecture model (field names follow Hugging Face's)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            check_int(name, getattr(self, name), 1)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        check_positive_number("rms_norm_eps", self.rms_norm_eps)
        check_positive_number("rope_theta", self.rope_theta)
        for token in self.eos_token_ids:
            check_int("eos token id", token, 0)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """KV-cache bytes one token takes: 2 x layers x kv_heads x head_dim x dtype bytes."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize


def tiny_config(**overrides: Any) -> ModelConfig:
    """A randomly initialised toy Llama (2 layers, 4 query / 2 KV heads of 16): no download.

    Small enough that the Triton interpreter decodes with it in CPU tests and notebooks;
    ``overrides`` replace any field.
    """
    config = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=512)
    return replace(config, **overrides)


class Attention(Protocol):
    """Where a layer's K/V go and how its attention is computed (the cache is the caller's).

    Called with the layer index and, for the ``T`` tokens of this forward pass, the rotated
    ``q`` ``[T, num_heads, head_dim]`` and ``k``, ``v`` ``[T, num_kv_heads, head_dim]``;
    stores ``k`` and ``v`` in its cache and returns ``[T, num_heads, head_dim]``.
    """

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor: ...


def packed_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            lengths: Sequence[int]) -> torch.Tensor:
    """Causal attention for whole sequences packed back to back (``lengths[i]`` tokens each),
    each attending only to its own earlier tokens; ``[T, num_heads, head_dim]`` out.

    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention). Prefill uses
    this in both the paged engine and the contiguous baseline, so a prompt's K/V and first
    token come out of the same arithmetic in both.
    """
    if sum(lengths) != q.shape[0]:
        raise ValueError(f"lengths add up to {sum(lengths)} but there are {q.shape[0]} tokens")
    group = q.shape[1] // k.shape[1]
    outputs, start = [], 0
    for length in lengths:
        span = slice(start, start + length)
        keys = k[span].repeat_interleave(group, dim=1).transpose(0, 1)
        values = v[span].repeat_interleave(group, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(q[span].transpose(0, 1), keys, values,
                                             is_causal=True)
        outputs.append(out.transpose(0, 1))
        start += length
    return torch.cat(outputs)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned gain, computed in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension of ``x``."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies ``[head_dim / 2]``, with Llama-3 scaling when configured."""
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((old_len / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class GroupedQueryAttention(nn.Module):
    """Llama's attention block: project, rotate, hand q/k/v to the cache, project back."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, dim, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(hidden, config.num_heads * dim, bias=bias)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * dim, bias=bias)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * dim, bias=bias)
        self.o_proj = nn.Linear(config.num_heads * dim, hidden, bias=bias)
        self.shape = (config.num_heads, config.num_kv_heads, dim)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                attention: Attention) -> torch.Tensor:
        """``h`` ``[T, hidden]`` -> ``[T, hidden]``; K/V go to ``attention``'s cache."""
        heads, kv_heads, dim = self.shape
        q = self.q_proj(h).view(-1, heads, dim)
        k = self.k_proj(h).view(-1, kv_heads, dim)
        v = self.v_proj(h).view(-1, kv_heads, dim)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = attention(layer, q, k, v)
        return self.o_proj(out.reshape(-1, heads * dim).to(h.dtype))


class SwiGLU(nn.Module):
    """Llama's MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[T, hidden]`` -> ``[T, hidden]``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One Llama block: RMSNorm -> attention -> residual, RMSNorm -> SwiGLU -> residual."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = GroupedQueryAttention(config)
        self.mlp = SwiGLU(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                attention: Attention) -> torch.Tensor:
        """``x`` ``[T, hidden]`` -> ``[T, hidden]``; K/V go to ``attention``'s cache."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder: embeddings, ``num_layers`` blocks, a final RMSNorm and the LM head.

    ``forward`` takes a flat batch of tokens (any mix of sequences: the ``Attention``
    object knows which token belongs to which) with their positions, and returns the final
    hidden states; ``logits`` turns only the rows that are needed into vocabulary scores.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # Not a buffer: ``model.half()`` would round the frequencies; they stay float32.
        self._inv_freq = rope_inv_freq(config)

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype (also the KV cache's)."""
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return self.embed_tokens.weight.device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` after the final norm for tokens ``input_ids`` ``[T]``
        at ``positions`` ``[T]``."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"input_ids and positions must be equal 1-D tensors, got shapes "
                             f"{tuple(input_ids.shape)} and {tuple(positions.shape)}")
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self._inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        x = self.embed_tokens(input_ids)
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, index, attention)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary scores (float32) for hidden states ``[N, hidden]``."""
        return self.lm_head(hidden).float()

    def next_token_logits(self, input_ids: Sequence[int], positions: Sequence[int],
                          attention: Attention,
                          last_of: Sequence[int] | None = None) -> torch.Tensor:
        """Float32 logits on the CPU, without autograd, for a flat batch of tokens: one row
        per token, or with ``last_of`` (the packed sequences' lengths) one per sequence."""
        device = self.device
        with torch.inference_mode():
            hidden = self(torch.tensor(input_ids, dtype=torch.long, device=device),
                          torch.tensor(positions, dtype=torch.long, device=device), attention)
            if last_of is not None:
                hidden = hidden[torch.tensor(last_of, device=device).cumsum(0) - 1]
            return self.logits(hidden).cpu()


def random_model(config: ModelConfig, *, seed: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> LlamaModel:
    """A model with seeded random weights (normal, std 0.02, norms at 1), in eval mode."""
    check_int("seed", seed, 0)
    model = LlamaModel(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("layernorm.weight") and name != "norm.weight":
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    return model.to(device=device, dtype=dtype).eval()
