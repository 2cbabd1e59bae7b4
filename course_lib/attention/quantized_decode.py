"""Decode attention over fewer bytes per token: an FP8 paged cache, and MLA's latent cache.

Both launch ``quantized_kernels.scaled_decode_kernel`` (split-KV partials merged by chapter
06's ``merge_splits_kernel``), after the same input contract as chapter 06
(``check_paged_inputs``) plus what is new here: FP8 cache dtypes, the scales' shapes and
values, MLA's two key parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.attention.backend import KERNEL_MODE, require_kernels
from course_lib.attention.paged_decode import (
    MIN_DOT_ROWS,
    LaunchConfig,
    kernel_support_problem,
    launch_config,
)
from course_lib.attention.validation import PagedShape, check_paged_inputs
from course_lib.validate import check_int, check_positive_number, describe

if KERNEL_MODE != "unavailable":
    from course_lib.attention import quantized_kernels, triton_kernels

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
"""Cache dtypes the FP8 kernel reads: OCP E4M3 (finite only) and E5M2."""
MAX_ROW_ELEMENTS = 8192
"""Most fp32 accumulator elements (query rows x head_dim) one program holds: 64 rows of 128,
16 rows of MLA's 512-wide latent; more query heads are spread over more programs."""
MAX_LATENT_DIM = 512
MAX_ROPE_DIM = 256


def paged_attention_decode_fp8(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: torch.Tensor | float,
    v_scale: torch.Tensor | float,
    scale: float | None = None,
    num_splits: int | None = None,
    *,
    check_values: bool = True,
) -> torch.Tensor:
    """Chapter 06's paged decode reading an FP8 cache, dequantized inside the kernel.

    ``q`` is ``[batch, num_q_heads, head_dim]`` (float16, bfloat16 or float32; the output
    is like it); ``k_cache``/``v_cache`` are FP8 (``float8_e4m3fn`` or ``float8_e5m2``)
    ``[num_blocks, block_size, num_kv_heads, head_dim]``, holding ``x / scale``;
    ``block_table`` and ``seq_lens`` are int32 as in chapter 06. ``k_scale`` and ``v_scale``
    are float32: one per tensor (a number or shape ``()``) or one per KV head (shape
    ``[num_kv_heads]``), finite and positive. The kernel computes exactly
    ``softmax(scale * k_scale * q . k_codes) @ v_codes * v_scale``: a KV head's scales are
    constants of its program, so no element is scaled one at a time.

    ``check_values=False`` skips, on a GPU only, the host reads of lengths, block ids and
    scale values (as in :func:`~course_lib.attention.paged_attention_decode`).
    """
    require_kernels()
    check_values = check_values or q.device.type != "cuda"
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if isinstance(cache, torch.Tensor) and cache.dtype not in FP8_DTYPES:
            raise ValueError(f"{name} must be float8_e4m3fn or float8_e5m2, got {cache.dtype}")
    if isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor) and (
            k_cache.dtype != v_cache.dtype):
        raise ValueError(f"v_cache dtype {v_cache.dtype} differs from k_cache's {k_cache.dtype}")
    shape = check_paged_inputs(q, _like("k_cache", k_cache, q), _like("v_cache", v_cache, q),
                               block_table, seq_lens, check_values=check_values)
    _refuse(kernel_support_problem(shape.head_dim, q.dtype, q.device))
    scales = tuple(_head_scales(name, value, shape.num_kv_heads, q.device, check_values)
                   for name, value in (("k_scale", k_scale), ("v_scale", v_scale)))
    scale = _check_scale(scale, shape.head_dim)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if shape.batch:
        _launch(_Operands(q, q, k_cache, k_cache, v_cache, *scales, block_table, seq_lens),
                out, scale, shape, launch_config(shape, _check_splits(num_splits), q.device),
                has_rope=False, scaled=True, shared_kv=False)
    return out


def mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    *,
    check_values: bool = True,
) -> torch.Tensor:
    """MLA decode as it is served: attention over the latent with one shared KV head.

    With ``W_UK`` absorbed into the query (``q_latent = q_nope @ W_UK``, per head), every
    head attends to the same cached rows: the key is a row's whole width (latent, then the
    shared rope key), the value its first ``kv_lora_rank`` columns, the latent itself.
    ``q_latent`` is ``[batch, num_heads, kv_lora_rank]``, ``q_rope`` ``[batch, num_heads,
    rope_dim]``, ``latent_cache`` ``[num_blocks, block_size, kv_lora_rank + rope_dim]``
    (DeepSeek-V3: 512 + 64, blocks of 64), all of one dtype; the table and lengths as in
    chapter 06. Returns the attention-weighted latent ``[batch, num_heads, kv_lora_rank]``
    like ``q_latent``; ``W_UV`` turns it into each head's output.

    ``scale`` has no default: it is the model's, ``1 / sqrt(qk_nope + qk_rope)`` (1 / sqrt(192)
    for DeepSeek-V3), not ``1 / sqrt`` of the 576-wide key that absorption produces.
    """
    require_kernels()
    if not isinstance(latent_cache, torch.Tensor) or latent_cache.dim() != 3:
        shown = (tuple(latent_cache.shape) if isinstance(latent_cache, torch.Tensor)
                 else describe(latent_cache))
        raise ValueError("latent_cache must be [num_blocks, block_size, kv_lora_rank + "
                         f"rope_dim], got {shown}")
    if not isinstance(q_latent, torch.Tensor) or q_latent.dim() != 3:
        shown = tuple(q_latent.shape) if isinstance(q_latent, torch.Tensor) else describe(q_latent)
        raise ValueError(f"q_latent must be [batch, num_heads, kv_lora_rank], got {shown}")
    rank = q_latent.shape[-1]
    if not isinstance(q_rope, torch.Tensor) or tuple(q_rope.shape[:-1]) != tuple(
            q_latent.shape[:-1]) or q_rope.dim() != 3:
        shown = tuple(q_rope.shape) if isinstance(q_rope, torch.Tensor) else describe(q_rope)
        raise ValueError(f"q_rope must be [batch, num_heads, rope_dim] with q_latent's batch and "
                         f"heads {tuple(q_latent.shape[:-1])}, got {shown}")
    rope_dim = q_rope.shape[-1]
    if latent_cache.shape[-1] != rank + rope_dim:
        raise ValueError(f"latent_cache rows are {latent_cache.shape[-1]} wide, but q_latent "
                         f"({rank}) + q_rope ({rope_dim}) = {rank + rope_dim}")
    for name, tensor in (("q_rope", q_rope), ("latent_cache", latent_cache)):
        if tensor.dtype != q_latent.dtype or tensor.device != q_latent.device:
            raise ValueError(f"{name} is {tensor.dtype} on {tensor.device}, but q_latent is "
                             f"{q_latent.dtype} on {q_latent.device}")
    latent = latent_cache[:, :, None, :rank]  # [num_blocks, block_size, 1, rank]: K and V
    rope = latent_cache[:, :, None, rank:]
    check_values = check_values or q_latent.device.type != "cuda"
    shape = check_paged_inputs(q_latent, latent, latent, block_table, seq_lens,
                               check_values=check_values)
    for name, width, top in (("kv_lora_rank", rank, MAX_LATENT_DIM),
                             ("rope_dim", rope_dim, MAX_ROPE_DIM)):
        if width < MIN_DOT_ROWS or width > top or width & (width - 1):
            raise ValueError(f"{name} {width} must be a power of two from {MIN_DOT_ROWS} to {top}")
    # Widths are checked above; what is left is the dtype and the device.
    _refuse(kernel_support_problem(MIN_DOT_ROWS, q_latent.dtype, q_latent.device))
    out = torch.empty(q_latent.shape, dtype=q_latent.dtype, device=q_latent.device)
    if shape.batch:
        config = launch_config(shape, _check_splits(num_splits), q_latent.device)
        _launch(_Operands(q_latent, q_rope, latent, rope, latent, out, out, block_table,
                          seq_lens), out, _check_scale(scale, None), shape, config,
                has_rope=True, scaled=False, shared_kv=True)
    return out


def _like(name: str, cache: object, q: object) -> object:
    """A zero-byte stand-in for an FP8 ``cache`` with ``q``'s dtype and device, for the shape
    checks that chapter 06's contract makes (it wants caches of q's dtype)."""
    if not (isinstance(cache, torch.Tensor) and isinstance(q, torch.Tensor)):
        return cache
    if cache.device != q.device:
        raise ValueError(f"{name} is on {cache.device} but q is on {q.device}")
    return torch.empty((), dtype=q.dtype, device=q.device).expand(cache.shape)


def _head_scales(name: str, value: object, num_kv_heads: int, device: torch.device,
                 check_values: bool) -> torch.Tensor:
    """``value`` as a contiguous float32 ``[num_kv_heads]`` tensor on ``device``: one scale
    (a number or shape ``()``) repeated, or one per KV head."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = torch.tensor(check_positive_number(name, value), device=device)
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a float32 tensor or a number, got {describe(value)}")
    if value.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but q is on {device}")
    if value.dim() > 1 or (value.dim() == 1 and value.shape[0] != num_kv_heads):
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected () for one scale or "
                         f"[{num_kv_heads}] for one per KV head")
    if check_values and not bool(((value > 0) & value.isfinite()).all()):
        shown = value.tolist()
        raise ValueError(f"{name} must be finite and positive, got {describe(shown)}")
    return value.expand(num_kv_heads).contiguous()


def _check_scale(scale: object, head_dim: int | None) -> float:
    """The softmax scale, ``1 / sqrt(head_dim)`` when None (and ``head_dim`` is known)."""
    if scale is None and head_dim is not None:
        return 1.0 / math.sqrt(head_dim)
    return check_positive_number("scale", scale)


def _check_splits(num_splits: object) -> int | None:
    return None if num_splits is None else check_int("num_splits", num_splits, 1)


def _refuse(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


@dataclass(frozen=True)
class _Operands:
    """The tensors one launch reads: the query and key in two parts (the second part unused
    without rope), values, per-KV-head scales (unused when not scaled), table, lengths."""

    q: torch.Tensor
    q_rope: torch.Tensor
    k: torch.Tensor
    k_rope: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor


def _launch(ops: _Operands, out: torch.Tensor, scale: float, shape: PagedShape,
            config: LaunchConfig, *, has_rope: bool, scaled: bool, shared_kv: bool) -> None:
    splits = config.num_splits
    write_output = splits == 1
    if write_output:  # the kernel never touches the partial buffers; pass any pointer
        part_out = part_lse = out
    else:
        part_out = torch.empty((shape.batch, shape.num_q_heads, splits, shape.head_dim),
                               dtype=torch.float32, device=out.device)
        part_lse = torch.empty(part_out.shape[:-1], dtype=torch.float32, device=out.device)
    rows = min(config.group_pad, max(MIN_DOT_ROWS, MAX_ROW_ELEMENTS // shape.head_dim))
    row_tiles = -(-shape.group // rows)
    grid = (shape.batch, shape.num_kv_heads * row_tiles, splits)
    quantized_kernels.scaled_decode_kernel[grid](
        ops.q, ops.q_rope, ops.k, ops.k_rope, ops.v, ops.k_scale, ops.v_scale,
        ops.block_table, ops.seq_lens.contiguous(), out, part_out, part_lse,
        scale * math.log2(math.e), splits, shape.num_q_heads,
        *ops.q.stride(), *ops.q_rope.stride(), *ops.k.stride(), *ops.k_rope.stride(),
        *ops.v.stride(), *ops.block_table.stride(), *out.stride(),
        GROUP=shape.group,
        ROWS=rows,
        HEAD_DIM=shape.head_dim,
        ROPE_DIM=ops.q_rope.shape[-1],
        BLOCK_SIZE=shape.block_size,
        TILE_N=config.tile_n,
        HAS_ROPE=has_rope,
        SCALED=scaled,
        SHARED_KV=shared_kv,
        WRITE_OUTPUT=write_output,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        enable_fp_fusion=True,
    )
    if not write_output:
        triton_kernels.merge_splits_kernel[(shape.batch, shape.num_q_heads)](
            part_out, part_lse, out, splits, *out.stride(), HEAD_DIM=shape.head_dim,
            num_warps=1, enable_fp_fusion=True,
        )
