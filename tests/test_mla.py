"""MLA's config arithmetic (softmax scale with YaRN's mscale) and the absorbed query."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.mla import DEEPSEEK_V3, MLA_MODELS, MLAConfig, absorb_query, up_project


def test_deepseek_v3_from_its_config() -> None:
    c = DEEPSEEK_V3
    assert (c.num_layers, c.num_heads, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
            c.v_head_dim) == (61, 128, 512, 128, 64, 128)
    assert c.qk_head_dim == 192 and c.latent_width == 576
    assert "config.json" in c.source and MLA_MODELS["deepseek-v3"] is c


def test_the_softmax_scale_carries_yarns_mscale_twice() -> None:
    mscale = 0.1 * 1.0 * math.log(40) + 1  # yarn_get_mscale(40, mscale_all_dim=1.0)
    assert DEEPSEEK_V3.mscale == pytest.approx(1.368888, abs=1e-6) == mscale
    assert DEEPSEEK_V3.softmax_scale == pytest.approx(mscale**2 / math.sqrt(192))
    assert DEEPSEEK_V3.softmax_scale == pytest.approx(0.135234, abs=1e-6)


def test_without_yarn_the_scale_is_one_over_root_d() -> None:
    plain = MLAConfig(kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32,
                      v_head_dim=32, num_heads=4, num_layers=2)
    assert plain.mscale == 1.0 and plain.softmax_scale == 1 / math.sqrt(48)
    assert MLAConfig(64, 16, 32, 32, 4, 2, rope_factor=40.0).mscale == 1.0  # mscale_all_dim 0
    assert MLAConfig(64, 16, 32, 32, 4, 2, rope_factor=1.0, mscale_all_dim=1.0).mscale == 1.0


def test_the_absorbed_query_scores_the_latent_as_the_up_projected_keys() -> None:
    gen = torch.Generator().manual_seed(0)
    heads, nope, rank, tokens = 4, 8, 16, 5
    q_nope = torch.randn(2, heads, nope, generator=gen, dtype=torch.float64)
    w_uk = torch.randn(heads, nope, rank, generator=gen, dtype=torch.float64)
    latent = torch.randn(tokens, rank, generator=gen, dtype=torch.float64)
    keys = up_project(latent, w_uk)
    assert keys.shape == (tokens, heads, nope)
    q_latent = absorb_query(q_nope, w_uk)
    assert q_latent.shape == (2, heads, rank)
    assert torch.allclose(torch.einsum("bhn,thn->bht", q_nope, keys),
                          torch.einsum("bhr,tr->bht", q_latent, latent))


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: MLAConfig(0, 64, 128, 128, 128, 61), "kv_lora_rank"),
    (lambda: MLAConfig(512, 64, 128, 128, 128, 61, rope_factor=-1.0), "rope_factor"),
    (lambda: MLAConfig(512, 64, 128, 128, 128, 61, mscale_all_dim=float("nan")),
     "mscale_all_dim"),
    (lambda: absorb_query(torch.ones(4, 8), torch.ones(4, 9, 16)), "(4, 9, 16)"),
    (lambda: absorb_query([1.0], torch.ones(4, 8, 16)), "list"),
    (lambda: up_project(torch.ones(5, 16), torch.ones(4, 8, 15)), "(4, 8, 15)"),
])
def test_bad_values_raise_naming_them(call: object, needle: str) -> None:
    with pytest.raises(ValueError) as error:
        call()  # type: ignore[operator]
    assert needle in str(error.value)
