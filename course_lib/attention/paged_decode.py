"""Paged decode attention with Triton: checks, launch parameters and the split-KV choice.

The kernels themselves are in ``triton_kernels``; this module decides how to launch them
(tile size, how many splits) and refuses inputs they would read wrongly. It defines the
kernels on import, after ``backend`` has chosen the mode, and skips them when Triton is
missing, so that importing it always works.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from course_lib.attention.backend import KERNEL_MODE, require_kernels
from course_lib.attention.validation import PagedShape, check_paged_inputs, check_window

if KERNEL_MODE != "unavailable":
    from course_lib.attention import triton_kernels

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_DOT_ROWS = 16  # tl.dot needs >= 16 rows on every GPU generation Triton supports
MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost outweighs the parallelism
MAX_SPLITS = 64


@dataclass(frozen=True)
class LaunchConfig:
    """How one call is launched: token tile, padded query-head group, splits, warps."""

    tile_n: int
    group_pad: int
    num_splits: int
    num_warps: int
    num_stages: int


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Splits per sequence so that about two waves of programs fill ``num_sms`` processors.

    Decode has one query token per sequence, so ``batch * num_kv_heads`` programs may leave
    most of a GPU idle at small batch. Splitting each sequence's KV range multiplies the
    programs, at the price of a merge; no split gets fewer than ``MIN_TOKENS_PER_SPLIT``
    tokens, and there are never more than ``MAX_SPLITS``.
    """
    programs = batch * num_kv_heads
    wanted = math.ceil(2 * num_sms / programs)
    by_length = max(1, max_seq_len // MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, by_length, MAX_SPLITS))


def launch_config(shape: PagedShape, num_splits: int | None, device: torch.device) -> LaunchConfig:
    """Tile sizes for ``shape``; ``num_splits=None`` picks the count with :func:`choose_num_splits`.

    The automatic count uses the block table's capacity as the length, not ``seq_lens``, so
    it is a function of shapes only and needs no read from the GPU.
    """
    tile_n = 64 if shape.head_dim <= 128 else 32
    group_pad = max(MIN_DOT_ROWS, _next_power_of_2(shape.group))
    if num_splits is None:
        num_splits = choose_num_splits(
            shape.batch, shape.num_kv_heads, shape.capacity, _processor_count(device)
        )
    return LaunchConfig(tile_n, group_pad, num_splits, num_warps=4, num_stages=2)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int | None = None,
    *,
    check_values: bool = True,
    window: int | None = None,
) -> torch.Tensor:
    """Decode attention read through a block table by a Triton kernel; output like ``q``.

    ``q`` is ``[batch, num_q_heads, head_dim]``; ``k_cache``/``v_cache`` are
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` (any strides); ``block_table`` is
    int32 ``[batch, max_blocks_per_seq]`` and ``seq_lens`` int32 ``[batch]``. ``num_splits``
    divides each sequence's KV range among that many programs (flash-decoding); ``None``
    chooses from the shapes and the GPU's size. ``window`` (chapter 08) is a sliding window
    in tokens: the query attends to the last ``window`` positions only, and the kernel never
    reads the blocks before them (their table entries may be the null block).

    Lengths and block ids are checked by reading them on the host: free on the CPU, one
    synchronisation on a GPU. ``check_values=False`` skips that on a GPU (for a caller that
    validated already, such as a timing loop); a block id outside the pool then reads
    outside the cache, as in any serving kernel. On the CPU the checks always run, because a
    wild read would crash the interpreter.
    """
    require_kernels()
    window = check_window(window)
    shape = check_paged_inputs(
        q, k_cache, v_cache, block_table, seq_lens,
        check_values=check_values or q.device.type != "cuda",
    )
    _check_kernel_support(q, shape)
    if scale is None:
        scale = 1.0 / math.sqrt(shape.head_dim)
    if not (isinstance(scale, float | int) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if num_splits is not None and (
        isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1
    ):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if shape.batch == 0:
        return out
    config = launch_config(shape, num_splits, q.device)
    _launch(q, k_cache, v_cache, block_table, seq_lens.contiguous(), out, float(scale), shape,
            config, window)
    return out


def _check_kernel_support(q: torch.Tensor, shape: PagedShape) -> None:
    """What this kernel cannot do, beyond the general input contract."""
    problem = kernel_support_problem(shape.head_dim, q.dtype, q.device)
    if problem is not None:
        raise ValueError(problem)


def kernel_support_problem(head_dim: int, dtype: torch.dtype,
                           device: str | torch.device) -> str | None:
    """Why the decode kernel cannot run on ``head_dim``-wide heads of ``dtype`` tensors on
    ``device`` here, or None when it can (an engine asks before it takes a model)."""
    device = torch.device(device)
    if dtype not in KERNEL_DTYPES:
        return f"dtype {dtype} is not supported; use float16, bfloat16 or float32"
    d = head_dim
    if d < 16 or d > 256 or d & (d - 1):
        return f"head_dim {d} must be a power of two from 16 to 256"
    if KERNEL_MODE == "cuda" and device.type != "cuda":
        return f"tensors are on {device} but the kernels are compiled for CUDA"
    if KERNEL_MODE == "interpreter" and device.type != "cpu":
        return f"tensors are on {device} but the Triton interpreter needs CPU tensors"
    if dtype == torch.bfloat16:
        if KERNEL_MODE == "interpreter":
            return ("bfloat16 is computed wrongly by the Triton interpreter; use "
                    "float16 or float32 on the CPU")
        if not torch.cuda.is_bf16_supported():
            return f"{torch.cuda.get_device_name(device)} does not support bfloat16"
    return None


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    shape: PagedShape,
    config: LaunchConfig,
    window: int,
) -> None:
    splits = config.num_splits
    write_output = splits == 1
    if write_output:  # the kernel never touches the partial buffers; pass any pointer
        part_out = part_lse = out
    else:
        part_out = torch.empty(
            (shape.batch, shape.num_q_heads, splits, shape.head_dim),
            dtype=torch.float32, device=q.device,
        )
        part_lse = torch.empty(part_out.shape[:-1], dtype=torch.float32, device=q.device)
    grid = (shape.batch, shape.num_kv_heads, splits)
    triton_kernels.paged_decode_kernel[grid](
        q, k_cache, v_cache, block_table, seq_lens, out, part_out, part_lse,
        scale * math.log2(math.e),
        splits,
        window,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(), *out.stride(),
        GROUP=shape.group,
        GROUP_PAD=config.group_pad,
        HEAD_DIM=shape.head_dim,
        BLOCK_SIZE=shape.block_size,
        TILE_N=config.tile_n,
        WRITE_OUTPUT=write_output,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        enable_fp_fusion=True,  # explicit: Triton 3.9 warns when it is left to its default
    )
    if not write_output:
        triton_kernels.merge_splits_kernel[(shape.batch, shape.num_q_heads)](
            part_out, part_lse, out, splits, *out.stride(), HEAD_DIM=shape.head_dim,
            num_warps=1, enable_fp_fusion=True,
        )


@functools.cache
def _processor_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 for the interpreter, which runs serially."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
