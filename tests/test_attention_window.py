"""Chapter 08's decode kernel with a sliding window, against the fp32 reference.

Chapter 06's grid (``tests/test_attention.py``) extended with windows: GQA and MQA, odd
lengths, windows smaller than a block, larger than the sequence and not a multiple of the
block size, one split and several. The table entries before each window point at a block
full of NaN, so a kernel that reads a block it should skip fails loudly.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import (
    paged_attention_decode,
    paged_attention_reference,
    reference_attention,
)
from tests.test_attention import TOLERANCE, make_case, ragged_lengths


def skip_before_window(case, window: int, block_size: int) -> torch.Tensor:
    """The case's table with every block wholly before the window replaced by a NaN block
    (the pool's free blocks hold NaN), as a window group's table holds the null block."""
    table = case.block_table.clone()
    used = {int(b) for b in table.flatten() if b >= 0}
    nan_block = next(b for b in range(case.k_cache.shape[0]) if b not in used)
    assert torch.isnan(case.k_cache[nan_block]).all()
    for row, length in enumerate(case.seq_lens.tolist()):
        skipped = max(0, length - window) // block_size
        table[row, :skipped] = nan_block
    return table


# (q heads, kv heads, head_dim, block size, splits, dtype, window)
WINDOW_GRID = [
    pytest.param(8, 2, 64, 16, 1, torch.float32, 5, id="gqa4-b16-window5<block"),
    pytest.param(8, 2, 64, 16, 4, torch.float16, 37, id="gqa4-b16-4splits-window37-odd"),
    pytest.param(4, 4, 32, 8, 3, torch.float32, 64, id="mha-b8-3splits-window64=8blocks"),
    pytest.param(8, 1, 128, 16, None, torch.float32, 1, id="mqa-auto-window1"),
    pytest.param(7, 1, 64, 64, 12, torch.float16, 100, id="gqa7-b64-12splits-window100"),
    pytest.param(3, 1, 16, 8, 2, torch.float32, 1000, id="mqa3-window>sequence"),
]


@pytest.mark.parametrize("num_q_heads, num_kv_heads, head_dim, block_size, num_splits, dtype, "
                         "window", WINDOW_GRID)
def test_windowed_kernel_matches_fp32_reference(
    num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
    num_splits: int | None, dtype: torch.dtype, window: int,
) -> None:
    case = make_case(num_q_heads, num_kv_heads, head_dim, block_size,
                     ragged_lengths(block_size), dtype)
    table = skip_before_window(case, window, block_size)
    expected = reference_attention(case.q, case.k_seq, case.v_seq, case.seq_lens,
                                   window=window)
    got = paged_attention_decode(case.q, case.k_cache, case.v_cache, table, case.seq_lens,
                                 num_splits=num_splits, window=window)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), expected, **TOLERANCE[dtype])
    paged = paged_attention_reference(case.q, case.k_cache, case.v_cache, table,
                                      case.seq_lens, window=window)
    torch.testing.assert_close(paged, expected, **TOLERANCE[torch.float32])


@settings(max_examples=12, deadline=None, derandomize=True)
@given(group=st.integers(1, 4), block_size=st.integers(1, 24),
       lens=st.lists(st.integers(1, 90), min_size=1, max_size=3),
       num_splits=st.one_of(st.none(), st.integers(1, 5)), window=st.integers(1, 120))
def test_windowed_kernel_on_random_shapes(group: int, block_size: int, lens: list[int],
                                          num_splits: int | None, window: int) -> None:
    case = make_case(group * 2, 2, 16, block_size, lens, torch.float32,
                     seed=len(lens) + window)
    table = skip_before_window(case, window, block_size)
    expected = reference_attention(case.q, case.k_seq, case.v_seq, case.seq_lens,
                                   window=window)
    got = paged_attention_decode(case.q, case.k_cache, case.v_cache, table, case.seq_lens,
                                 num_splits=num_splits, window=window)
    torch.testing.assert_close(got, expected, **TOLERANCE[torch.float32])


def test_window_is_the_last_w_positions() -> None:
    # One KV head, V = position: with equal scores the output is the mean position.
    q = torch.zeros(1, 1, 16)
    k = torch.zeros(1, 10, 1, 16)
    v = torch.arange(10.0).reshape(1, 10, 1, 1).expand(1, 10, 1, 16)
    lens = torch.tensor([9], dtype=torch.int32)
    out = reference_attention(q, k, v, lens, window=3)
    assert out[0, 0, 0].item() == pytest.approx((6 + 7 + 8) / 3)
    assert reference_attention(q, k, v, lens, window=None)[0, 0, 0].item() == pytest.approx(4)


@pytest.mark.parametrize("window", [0, -3, 1.5, True, "8", 2**31])
def test_bad_windows_are_refused(window: object) -> None:
    case = make_case(2, 1, 16, 4, [5], torch.float32)
    with pytest.raises(ValueError, match="window"):
        paged_attention_decode(*case.paged_args, window=window)
    with pytest.raises(ValueError, match="window"):
        reference_attention(case.q, case.k_seq, case.v_seq, case.seq_lens, window=window)

