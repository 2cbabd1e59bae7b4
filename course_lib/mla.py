"""Multi-head latent attention (MLA): the shape of its cache, and the absorbed query.

MLA caches one ``kv_lora_rank``-wide latent vector ``c`` per token and layer, plus one
``qk_rope_head_dim``-wide rotary key shared by every head. Each head's key is rebuilt as
``k_nope[h] = W_UK[h] @ c`` (``W_UK[h]`` shaped ``[qk_nope_head_dim, kv_lora_rank]``), so
``q_nope[h] . k_nope[h] = (q_nope[h] @ W_UK[h]) . c``: multiplying the query by ``W_UK``
once ("absorbing" it) lets decode attend over the latent directly, as if every head shared
one KV head of width ``kv_lora_rank + qk_rope_head_dim``.

torch is imported by the helpers that use it, so sizing an MLA cache (``kv-size --mla``)
does not load it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from course_lib.validate import check_int, check_non_negative_number, check_positive_number

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MLAConfig:
    """The parts of an MLA model's config that shape its cache and its softmax scale.

    ``rope_factor`` and ``mscale_all_dim`` are the YaRN ``rope_scaling`` entries
    ``factor`` and ``mscale_all_dim`` (1.0 and 0.0: no YaRN correction).
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    num_heads: int
    num_layers: int
    rope_factor: float = 1.0
    mscale_all_dim: float = 0.0
    name: str = "custom"
    source: str = ""

    def __post_init__(self) -> None:
        for field_name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                           "v_head_dim", "num_heads", "num_layers"):
            check_int(field_name, getattr(self, field_name), 1)
        check_positive_number("rope_factor", self.rope_factor)
        check_non_negative_number("mscale_all_dim", self.mscale_all_dim)

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key: the no-rope part plus the rope part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        """Numbers cached per token and layer: the latent plus the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def mscale(self) -> float:
        """YaRN's attention correction, ``0.1 * mscale_all_dim * ln(factor) + 1`` (1 without
        YaRN), as ``yarn_get_mscale`` in DeepSeek-V3's ``modeling_deepseek.py``."""
        if not self.mscale_all_dim or self.rope_factor <= 1:
            return 1.0
        return 0.1 * self.mscale_all_dim * math.log(self.rope_factor) + 1.0

    @property
    def softmax_scale(self) -> float:
        """The scale on q . k: ``mscale**2 / sqrt(qk_head_dim)``. DeepSeek-V3 multiplies
        mscale in twice because its YaRN rotary embedding does not scale q and k itself."""
        return self.mscale**2 / math.sqrt(self.qk_head_dim)


DEEPSEEK_V3 = MLAConfig(
    kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    num_heads=128, num_layers=61, rope_factor=40.0, mscale_all_dim=1.0, name="deepseek-v3",
    source="deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, "
           "num_attention_heads 128, kv_lora_rank 512, qk_nope_head_dim 128, "
           "qk_rope_head_dim 64, v_head_dim 128, rope_scaling yarn factor 40, mscale 1.0, "
           "mscale_all_dim 1.0",
)
"""DeepSeek-V3 (and R1, which shares its architecture), from its published config.json."""

MLA_MODELS: dict[str, MLAConfig] = {DEEPSEEK_V3.name: DEEPSEEK_V3}
"""MLA presets by name."""


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """The latent query ``q_nope[..., h, :] @ W_UK[h]``: ``[..., num_heads, kv_lora_rank]``
    from ``q_nope`` ``[..., num_heads, qk_nope_head_dim]`` and ``w_uk``
    ``[num_heads, qk_nope_head_dim, kv_lora_rank]``; its dot product with a cached latent
    equals ``q_nope``'s with the up-projected key."""
    import torch

    if not isinstance(q_nope, torch.Tensor) or not isinstance(w_uk, torch.Tensor) \
            or w_uk.dim() != 3 or q_nope.dim() < 2 \
            or tuple(q_nope.shape[-2:]) != tuple(w_uk.shape[:2]):
        raise ValueError(f"q_nope [..., num_heads, qk_nope_head_dim] and w_uk [num_heads, "
                         f"qk_nope_head_dim, kv_lora_rank] do not fit: got {_shape(q_nope)} "
                         f"and {_shape(w_uk)}")
    return torch.einsum("...hn,hnr->...hr", q_nope, w_uk)


def up_project(latent: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """Each head's keys (``w_up`` = W_UK) or values (W_UV) rebuilt from cached latents:
    ``[..., num_heads, width]`` from ``latent`` ``[..., kv_lora_rank]`` and ``w_up``
    ``[num_heads, width, kv_lora_rank]``. This is the work absorption avoids."""
    import torch

    if not isinstance(latent, torch.Tensor) or not isinstance(w_up, torch.Tensor) \
            or w_up.dim() != 3 or latent.dim() < 1 or latent.shape[-1] != w_up.shape[-1]:
        raise ValueError(f"latent [..., kv_lora_rank] and w_up [num_heads, width, "
                         f"kv_lora_rank] do not fit: got {_shape(latent)} and {_shape(w_up)}")
    return torch.einsum("...r,hwr->...hw", latent, w_up)


def _shape(value: object) -> object:
    """A value's shape for an error message, or its type name if it has none."""
    return tuple(value.shape) if hasattr(value, "shape") else type(value).__name__
