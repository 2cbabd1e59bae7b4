"""MLA decode: the absorbed Triton kernel over a paged latent cache against MLA as trained.

The ground truth is :func:`mla_attention_reference`, which never absorbs: it projects every
cached latent up to per-head keys and values with ``W_UK``/``W_UV`` and attends per head with
the model's scale, ``1 / sqrt(qk_nope + qk_rope)``. The kernel attends over the latent with
one shared KV head (``absorb_query``), and its output is projected by ``W_UV`` afterwards.
Small widths keep the interpreter quick; DeepSeek-V3's real ones (512 + 64 wide rows, 128
heads, blocks of 64) run once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import (
    KERNEL_MODE,
    gather_paged_kv,
    mla_absorbed_reference,
    mla_attention_reference,
    mla_decode,
    mla_paged_reference,
    project_latent_output,
)
from course_lib.mla import DEEPSEEK_V3, MLAConfig, absorb_query

DEVICE = torch.device("cuda" if KERNEL_MODE == "cuda" else "cpu")
SMALL = MLAConfig(kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                  num_heads=4, num_layers=1, name="small")


@dataclass(frozen=True)
class MLACase:
    """Weights, a query and a paged latent cache (NaN in every slot no sequence holds)."""

    config: MLAConfig
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    q_nope: torch.Tensor
    q_rope: torch.Tensor
    latent_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    def kernel_args(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
        """``mla_decode``'s tensors in ``dtype`` on the kernel's device."""
        q_latent = absorb_query(self.q_nope, self.w_uk)
        return tuple(t.to(DEVICE, dtype) if t.is_floating_point() else t.to(DEVICE)
                     for t in (q_latent, self.q_rope, self.latent_cache, self.block_table,
                               self.seq_lens))

    def naive(self, scale: float | None = None) -> torch.Tensor:
        """MLA as trained, per head, on the gathered cache: ``[batch, heads, v_head_dim]``."""
        rows = self.latent_cache[:, :, None, :]
        gathered = gather_paged_kv(rows, rows, self.block_table, self.seq_lens)[0][:, :, 0]
        rank = self.config.kv_lora_rank
        return mla_attention_reference(self.q_nope, self.q_rope, gathered[..., :rank],
                                       gathered[..., rank:], self.w_uk, self.w_uv,
                                       self.seq_lens, scale or self.config.softmax_scale)


def make_case(config: MLAConfig, block_size: int, lens: list[int], seed: int = 0) -> MLACase:
    gen = torch.Generator().manual_seed(seed)
    rank, rope, heads = config.kv_lora_rank, config.qk_rope_head_dim, config.num_heads
    needed = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(needed) + 2
    cache = torch.randn(num_blocks, block_size, rank + rope, generator=gen)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros((len(lens), max(needed)), dtype=torch.int32)
    used = torch.zeros((num_blocks, block_size), dtype=torch.bool)
    for row, (length, count) in enumerate(zip(lens, needed, strict=True)):
        table[row, :count] = torch.tensor([ids.pop() for _ in range(count)])
        for t in range(length):
            used[table[row, t // block_size], t % block_size] = True
    cache[~used] = math.nan
    w_uk = torch.randn(heads, config.qk_nope_head_dim, rank, generator=gen) / math.sqrt(rank)
    w_uv = torch.randn(heads, config.v_head_dim, rank, generator=gen) / math.sqrt(rank)
    q_nope = torch.randn(len(lens), heads, config.qk_nope_head_dim, generator=gen)
    q_rope = torch.randn(len(lens), heads, rope, generator=gen)
    return MLACase(config, w_uk, w_uv, q_nope, q_rope, cache, table,
                   torch.tensor(lens, dtype=torch.int32))


def test_absorbing_w_uk_changes_no_score_at_deepseek_v3_widths() -> None:
    """The two torch forms agree at the real widths; 1 / sqrt(576) would not."""
    config = MLAConfig(**{**DEEPSEEK_V3.__dict__, "num_heads": 8})
    case = make_case(config, 64, [100, 3])
    q_latent = absorb_query(case.q_nope, case.w_uk)
    absorbed = project_latent_output(
        mla_paged_reference(q_latent, case.q_rope, case.latent_cache, case.block_table,
                            case.seq_lens, config.softmax_scale), case.w_uv)
    torch.testing.assert_close(absorbed, case.naive(), atol=1e-5, rtol=1e-4)
    wrong = project_latent_output(
        mla_paged_reference(q_latent, case.q_rope, case.latent_cache, case.block_table,
                            case.seq_lens, 1 / math.sqrt(576)), case.w_uv)
    assert not torch.allclose(wrong, absorbed, atol=1e-3)


def test_absorbed_reference_is_one_kv_head_over_the_latent() -> None:
    case = make_case(SMALL, 16, [20])
    rank = SMALL.kv_lora_rank
    rows = case.latent_cache[case.block_table[0].long()].reshape(1, -1, SMALL.latent_width)
    q_latent = absorb_query(case.q_nope, case.w_uk)
    scores = (torch.einsum("hr,tr->ht", q_latent[0], rows[0, :20, :rank])
              + torch.einsum("hd,td->ht", case.q_rope[0], rows[0, :20, rank:]))
    weights = torch.softmax(scores * SMALL.softmax_scale, dim=-1)
    by_hand = weights @ rows[0, :20, :rank]
    got = mla_absorbed_reference(q_latent, case.q_rope, rows[..., :rank], rows[..., rank:],
                                 case.seq_lens, SMALL.softmax_scale)
    torch.testing.assert_close(got[0], by_hand)


@pytest.mark.parametrize(
    ("heads", "block_size", "lens", "splits"),
    [
        (4, 16, [1, 15, 16, 17], 1),  # lengths at block boundaries
        (4, 64, [64, 65, 200], 3),  # blocks of 64, split-KV
        (1, 8, [33], 2),  # one head
        (20, 64, [130, 2], 2),  # a head count that is no power of two
    ],
)
def test_kernel_matches_mla_as_trained(heads: int, block_size: int, lens: list[int],
                                       splits: int) -> None:
    config = MLAConfig(**{**SMALL.__dict__, "num_heads": heads})
    case = make_case(config, block_size, lens, seed=heads)
    out = mla_decode(*case.kernel_args(), config.softmax_scale, num_splits=splits)
    assert out.shape == (len(lens), heads, config.kv_lora_rank) and out.isfinite().all()
    torch.testing.assert_close(project_latent_output(out.cpu(), case.w_uv), case.naive(),
                               atol=2e-5, rtol=2e-5)


def test_kernel_at_deepseek_v3_size() -> None:
    """128 heads over one 576-wide KV head (8 programs of 16 heads), blocks of 64, with the
    model's own scale (YaRN's mscale squared over sqrt(192))."""
    case = make_case(DEEPSEEK_V3, 64, [100])
    assert DEEPSEEK_V3.latent_width == 576 and DEEPSEEK_V3.qk_head_dim == 192
    out = mla_decode(*case.kernel_args(), DEEPSEEK_V3.softmax_scale, num_splits=2)
    torch.testing.assert_close(project_latent_output(out.cpu(), case.w_uv), case.naive(),
                               atol=2e-5, rtol=2e-5)


def test_half_precision_matches_the_absorbed_reference() -> None:
    case = make_case(SMALL, 16, [40, 9], seed=3)
    args = case.kernel_args(torch.float16)
    out = mla_decode(*args, SMALL.softmax_scale, num_splits=2)
    want = mla_paged_reference(*(t.cpu() for t in args), SMALL.softmax_scale)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().float(), want, atol=2e-3, rtol=1e-3)


def test_nan_in_unused_slots_is_never_read() -> None:
    case = make_case(SMALL, 16, [5, 33], seed=4)
    args = case.kernel_args()
    clean = args[2].nan_to_num(0.0)
    poisoned = mla_decode(*args, SMALL.softmax_scale, num_splits=3)
    again = mla_decode(*args[:2], clean, *args[3:], SMALL.softmax_scale, num_splits=3)
    assert args[2].isnan().any() and poisoned.isfinite().all()
    assert torch.equal(poisoned, again)


@settings(max_examples=10, deadline=None)
@given(heads=st.integers(1, 20), rank=st.sampled_from([16, 32, 64]),
       rope=st.sampled_from([16, 32]), block_size=st.sampled_from([4, 16, 64]),
       lens=st.lists(st.integers(1, 80), min_size=1, max_size=3), splits=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_kernel_matches_the_absorbed_reference_on_random_shapes(
        heads: int, rank: int, rope: int, block_size: int, lens: list[int], splits: int,
        seed: int) -> None:
    config = MLAConfig(kv_lora_rank=rank, qk_rope_head_dim=rope, qk_nope_head_dim=16,
                       v_head_dim=16, num_heads=heads, num_layers=1)
    case = make_case(config, block_size, lens, seed)
    args = case.kernel_args()
    out = mla_decode(*args, 0.1, num_splits=splits)
    torch.testing.assert_close(out.cpu(), mla_paged_reference(*args, 0.1), atol=2e-5,
                               rtol=2e-5)


def _args(**changes: object) -> dict[str, object]:
    case = make_case(SMALL, 16, [20, 3])
    names = ("q_latent", "q_rope", "latent_cache", "block_table", "seq_lens")
    return dict(zip(names, case.kernel_args(), strict=True), scale=0.1) | changes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {"latent_cache": a["latent_cache"][:, :, None]},
         r"latent_cache must be \[num_blocks, block_size, kv_lora_rank \+ rope_dim\], got"),
        (lambda a: {"latent_cache": a["latent_cache"][..., :72]},
         r"latent_cache rows are 72 wide, but q_latent \(64\) \+ q_rope \(16\) = 80"),
        (lambda a: {"q_rope": a["q_rope"][:1]}, r"q_rope must be \[batch, num_heads, rope_dim\]"),
        (lambda a: {"q_latent": a["q_latent"][0]}, r"q_latent must be \[batch, num_heads, "),
        (lambda a: {"q_rope": a["q_rope"].half()}, "q_rope is torch.float16 on cpu, but q_latent"),
        (lambda a: {"latent_cache": a["latent_cache"].half()},
         "latent_cache is torch.float16 on cpu, but q_latent is torch.float32 on cpu"),
        (lambda a: {"q_latent": a["q_latent"][..., :48], "latent_cache":
                    a["latent_cache"][..., 16:]}, "kv_lora_rank 48 must be a power of two"),
        (lambda a: {"q_rope": a["q_rope"][..., :8], "latent_cache": a["latent_cache"][..., :72]},
         "rope_dim 8 must be a power of two from 16"),
        (lambda a: {"seq_lens": torch.tensor([20, 33], dtype=torch.int32)},
         r"seq_lens\[1\] = 33 exceeds"),
        (lambda a: {"scale": None}, "scale must be a positive number, got None"),
        (lambda a: {"num_splits": 1.5}, "num_splits must be an integer >= 1, got 1.5"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_value(change, message) -> None:
    args = _args()
    args |= change(args)
    with pytest.raises(ValueError, match=message):
        mla_decode(**args)
