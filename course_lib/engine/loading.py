"""Weights from Hugging Face: a ``LlamaForCausalLM`` object, a local checkpoint or a hub id.

The course's :class:`~course_lib.engine.model.LlamaModel` uses Hugging Face's parameter
names (less the ``model.`` prefix), so converting is copying the state dict after reading
the shape off the configuration. ``transformers`` is imported only here, and only when a
function of this module is called: the rest of the engine runs without it.
"""

from __future__ import annotations

from typing import Any

import torch

from course_lib.engine.model import Llama3RopeScaling, LlamaModel, ModelConfig

SUPPORTED_MODEL_TYPES = ("llama",)
"""``config.model_type`` values whose checkpoints this decoder reproduces exactly."""


def config_from_hf(hf_config: Any) -> ModelConfig:
    """The :class:`ModelConfig` of a transformers ``LlamaConfig`` (transformers 4 or 5)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; expected one of "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    # transformers 5 keeps theta and scaling in rope_parameters; 4 has rope_theta and
    # rope_scaling (None without scaling).
    rope = dict(getattr(hf_config, "rope_parameters", None)
                or getattr(hf_config, "rope_scaling", None) or {})
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
        scaling = Llama3RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    elif rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not supported; expected 'default' or "
                         "'llama3'")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported; Llama uses "
                         "'silu'")
    eos = getattr(hf_config, "eos_token_id", None)
    eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return ModelConfig(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        max_position_embeddings=hf_config.max_position_embeddings,
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=float(theta),
        rope_scaling=scaling,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(hf_config, "attention_bias", False)),
        mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
        eos_token_ids=eos_ids,
    )


def from_hf(hf_model: Any, *, dtype: torch.dtype | None = None,
            device: str | torch.device | None = None) -> LlamaModel:
    """A :class:`LlamaModel` holding a copy of a transformers ``LlamaForCausalLM``'s weights.

    ``dtype`` and ``device`` default to the source model's. The result is in eval mode.
    """
    config = config_from_hf(hf_model.config)
    state = {name.removeprefix("model."): tensor
             for name, tensor in hf_model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the same tensor as the embeddings
    model = LlamaModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not (config.tie_word_embeddings
                                                and name == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match a Llama of this shape: missing "
                         f"{missing[:5]}, unexpected {unexpected[:5]}")
    source = next(hf_model.parameters())
    return model.to(device=device or source.device, dtype=dtype or source.dtype).eval()


def load_pretrained(name_or_path: str, *, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> tuple[LlamaModel, Any]:
    """Load a Llama-architecture checkpoint (a local folder, or a hub id when online) and its
    tokenizer (None when the checkpoint has none); returns ``(model, tokenizer)``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config_from_hf(AutoConfig.from_pretrained(name_or_path))  # refuse before loading weights
    hf_model = AutoModelForCausalLM.from_pretrained(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError):
        tokenizer = None
    return from_hf(hf_model, dtype=dtype, device=device), tokenizer
