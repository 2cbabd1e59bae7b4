"""Multi-head latent attention (MLA) decode in plain torch: as trained, and absorbed.

A token's cache row is its latent ``c`` (``kv_lora_rank`` wide) and one rope key shared by
every head. As trained, head ``h`` projects the latent up: ``k_nope = W_UK[h] c`` and
``v = W_UV[h] c``, and attends with the key ``[k_nope, k_rope]``. Absorbed, as served,
``q_nope . (W_UK[h] c) = (W_UK[h]^T q_nope) . c``: the query moves into latent space once
(``course_lib.mla.absorb_query``), every head attends to the same rows (one KV head, a
``rank + rope`` wide key, the latent as value) and ``W_UV[h]`` is applied to the weighted
latent afterwards. Both forms use the model's scale, ``1 / sqrt(qk_nope + qk_rope)``
(``MLAConfig.softmax_scale``): absorption changes no score.

Weights are laid out per head: ``w_uk`` ``[num_heads, qk_nope_head_dim, kv_lora_rank]`` and
``w_uv`` ``[num_heads, v_head_dim, kv_lora_rank]`` (DeepSeek-V3's ``kv_b_proj`` split by
head). Everything is computed and returned in float32.
"""

from __future__ import annotations

import torch

from course_lib.attention.reference import gather_paged_kv, reference_attention
from course_lib.attention.validation import check_paged_inputs
from course_lib.mla import up_project


def mla_attention_reference(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """MLA decode without absorption: per-head keys and values projected up from the latent.

    ``q_nope`` ``[batch, heads, nope]``, ``q_rope`` ``[batch, heads, rope]``, ``latent``
    ``[batch, max_len, rank]``, ``k_rope`` ``[batch, max_len, rope]``; positions at or past
    ``seq_lens[b]`` are ignored. Returns ``[batch, heads, v_head_dim]``.
    """
    heads = q_nope.shape[1]
    k_nope = up_project(latent.float(), w_uk.float())  # [batch, max_len, heads, nope]
    shared = k_rope.float()[:, :, None, :].expand(-1, -1, heads, -1)
    keys = torch.cat((k_nope, shared), dim=-1)  # [batch, max_len, heads, nope + rope]
    values = up_project(latent.float(), w_uv.float())
    query = torch.cat((q_nope.float(), q_rope.float()), dim=-1)
    return reference_attention(query, keys, values, seq_lens, scale)


def project_latent_output(latent_out: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """``W_UV[h]`` applied to head h's own attention-weighted latent ``[batch, heads, rank]``:
    the heads' outputs ``[batch, heads, v_head_dim]``."""
    return torch.einsum("bhr,hvr->bhv", latent_out.float(), w_uv.float())


def mla_absorbed_reference(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """MLA decode absorbed: one shared KV head, key ``[latent, k_rope]``, value the latent.

    Shapes as :func:`mla_attention_reference`, with ``q_latent`` ``[batch, heads, rank]``
    (``course_lib.mla.absorb_query``); returns the weighted latent ``[batch, heads, rank]``.
    """
    keys = torch.cat((latent.float(), k_rope.float()), dim=-1)[:, :, None, :]
    query = torch.cat((q_latent.float(), q_rope.float()), dim=-1)
    return reference_attention(query, keys, latent.float()[:, :, None, :], seq_lens, scale)


def mla_paged_reference(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """:func:`mla_absorbed_reference` read through a block table from ``latent_cache``
    ``[num_blocks, block_size, rank + rope]``: what ``mla_decode`` computes, in float32."""
    rows = latent_cache[:, :, None, :]
    full_q = torch.cat((q_latent, q_rope), dim=-1)
    check_paged_inputs(full_q, rows, rows, block_table, seq_lens)
    gathered, _ = gather_paged_kv(rows, rows, block_table, seq_lens)
    rank = q_latent.shape[-1]
    return mla_absorbed_reference(q_latent, q_rope, gathered[:, :, 0, :rank],
                                  gathered[:, :, 0, rank:], seq_lens, scale)
