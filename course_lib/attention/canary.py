"""A canary for the kernels: one tiny paged case, compared with the torch reference.

A broken Triton interpreter (or a miscompiled kernel) does not raise; it returns zeros or
plausible garbage. Running a small case with a known answer before trusting the kernel
turns that into a clear error. The case is chosen to touch every path: grouped-query heads,
a block size smaller than the token tile, a shuffled block table, ragged lengths, NaN in the
unused slots, and both the one-split and the split-and-merge launch.
"""

from __future__ import annotations

import torch

from course_lib.attention.backend import kernel_device
from course_lib.attention.paged_decode import paged_attention_decode
from course_lib.attention.reference import paged_attention_reference


class KernelCanaryError(RuntimeError):
    """The kernel disagreed with the reference on the canary case."""


CANARY_TOLERANCE = 1e-3


def run_canary(seed: int = 0) -> float:
    """Run the canary; return the largest absolute error, or raise :class:`KernelCanaryError`."""
    device = kernel_device()
    gen = torch.Generator().manual_seed(seed)
    block_size, num_blocks, seq_lens = 8, 12, [1, 9, 23]
    q = torch.randn(3, 4, 16, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, 2, 16, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, 2, 16, generator=gen)
    block_table = torch.randperm(num_blocks, generator=gen)[:9].reshape(3, 3).int()
    for row, length in enumerate(seq_lens):
        last = block_table[row, (length - 1) // block_size]
        k_cache[last, (length - 1) % block_size + 1:] = float("nan")
        v_cache[last, (length - 1) % block_size + 1:] = float("nan")
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    args = [t.to(device) for t in (q, k_cache, v_cache, block_table, lens)]
    expected = paged_attention_reference(*args)
    worst = 0.0
    for num_splits in (1, 2):
        got = paged_attention_decode(*args, num_splits=num_splits).float()
        if not torch.isfinite(got).all() or not got.abs().any():
            raise KernelCanaryError(
                f"paged_attention_decode(num_splits={num_splits}) returned "
                f"{'all zeros' if torch.isfinite(got).all() else 'NaN or inf'} on the canary case; "
                "the Triton backend is broken here (try another triton version)"
            )
        error = float((got - expected).abs().max())
        if error > CANARY_TOLERANCE:
            raise KernelCanaryError(
                f"paged_attention_decode(num_splits={num_splits}) is off by {error:.3g} "
                f"(tolerance {CANARY_TOLERANCE}) on the canary case; the Triton backend "
                "computes wrong results here (try another triton version)"
            )
        worst = max(worst, error)
    return worst
