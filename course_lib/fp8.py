"""FP8 for a KV cache: the two formats, a scale from calibration, quantize and dequantize.

An FP8 cache stores ``q = fp8(x / scale)`` and reads back ``q * scale``. The scale maps the
largest magnitude seen in calibration onto the format's largest finite value, so nothing
overflows and the format's few mantissa bits are spent on the values' own range. A scale
is float32, one per tensor (shape ``()``) or one per KV head (shape ``[num_heads]``) for a
tensor laid out ``[..., num_heads, head_dim]``.

Facts this module is built on, each pinned by ``tests/test_fp8.py``:

- torch's cast to ``float8_e4m3fn`` rounds to nearest, ties to even (1.0625 -> 1.0).
- Past +-448 that cast saturates in torch 2.13, but gave NaN in releases before a 2026
  change, so :func:`quantize` clamps explicitly and behaves the same on every torch.
- ``float8_e5m2`` has infinities and does not saturate: 61,440 (halfway from its largest
  value, 57,344, to 65,536) and above become inf, so the clamp to +-57,344 is what makes
  an E5M2 quantizer saturate.
- A float64 -> FP8 cast rounds twice, through float32 (1.0625 + 2**-30 becomes 1.0, not
  1.125), so float64 input is refused: convert it yourself with ``x.float()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.validate import describe


@dataclass(frozen=True)
class FP8Format:
    """One 8-bit float format: 1 sign bit, ``exponent_bits`` + ``mantissa_bits`` = 7.

    ``saturates`` says what torch 2.13's plain cast does past ``max_finite``: True for
    E4M3 (it gives +-max_finite; it gave NaN before 2026), False for E5M2 (it gives inf).
    """

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int
    max_finite: float
    saturates: bool

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2**(1 - bias); below it values are subnormal."""
        return 2.0 ** (1 - self.exponent_bias)

    def spacing(self, values: torch.Tensor) -> torch.Tensor:
        """Gap between neighbouring representable values at each of ``values`` (float32):
        2**(floor(log2|v|) - mantissa_bits), and the subnormal gap below ``min_normal``.
        Rounding to nearest is off by at most half of it."""
        magnitude = values.float().abs().clamp(min=self.min_normal)
        return torch.exp2(torch.floor(torch.log2(magnitude)) - self.mantissa_bits)


FP8_FORMATS: dict[str, FP8Format] = {
    "e4m3": FP8Format("e4m3", torch.float8_e4m3fn, exponent_bits=4, mantissa_bits=3,
                      exponent_bias=7, max_finite=448.0, saturates=True),
    "e5m2": FP8Format("e5m2", torch.float8_e5m2, exponent_bits=5, mantissa_bits=2,
                      exponent_bias=15, max_finite=57344.0, saturates=False),
}
"""The OCP FP8 formats by name: E4M3 (finite-only, torch ``float8_e4m3fn``; the usual KV
cache format, more precision) and E5M2 (IEEE-like with inf; more range, less precision)."""

SCALE_LAYOUTS = ("tensor", "head")
"""What one scale covers: the whole tensor, or one KV head (axis -2 of ``[..., H, D]``)."""

MIN_SCALE = torch.finfo(torch.float32).tiny
"""Smallest scale :func:`calibrate_scale` returns (float32's smallest normal, ~1.2e-38): an
all-zero tensor or head gets it, so its zeros stay zeros and ``1 / scale`` stays finite."""

_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Dtypes quantized directly: each converts to float32 exactly, so the cast rounds once."""


def fp8_format(fmt: str | FP8Format) -> FP8Format:
    """The format named ``fmt`` (``"e4m3"`` or ``"e5m2"``), or ``fmt`` itself; others raise."""
    if isinstance(fmt, FP8Format):
        return fmt
    try:
        return FP8_FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown FP8 format {describe(fmt)}; expected one of "
                         f"{', '.join(FP8_FORMATS)}") from None


def _check_input(x: object) -> torch.Tensor:
    """``x`` if it is a non-empty, finite tensor of a dtype that rounds once to FP8."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {describe(x)}")
    if x.dtype == torch.float64:
        raise ValueError("x is float64: a float64 -> FP8 cast rounds twice (through "
                         "float32); convert with x.float() first")
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"x is empty (shape {tuple(x.shape)})")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x holds NaN or inf; only finite values can be scaled")
    return x


def calibrate_scale(x: torch.Tensor, fmt: str | FP8Format = "e4m3",
                    per: str = "tensor") -> torch.Tensor:
    """The float32 scale that maps max|x| onto the format's largest value: max|x| / max.

    ``per="tensor"`` gives one scale (shape ``()``); ``per="head"`` one per KV head (shape
    ``[num_heads]``) for ``x`` laid out ``[..., num_heads, head_dim]``, each from its own
    head's values. A scale is never below :data:`MIN_SCALE` (an all-zero head's rule).
    """
    spec = fp8_format(fmt)
    x = _check_input(x)
    if per == "tensor":
        amax = x.abs().amax().float()
    elif per == "head":
        if x.dim() < 2:
            raise ValueError(f"per='head' needs x shaped [..., num_heads, head_dim], "
                             f"got shape {tuple(x.shape)}")
        amax = x.abs().movedim(-2, 0).reshape(x.shape[-2], -1).amax(dim=1).float()
    else:
        raise ValueError(f"unknown scale layout per={describe(per)}; expected one of "
                         f"{', '.join(SCALE_LAYOUTS)}")
    return (amax / spec.max_finite).clamp(min=MIN_SCALE)


def _broadcast_scale(scale: object, x: torch.Tensor) -> torch.Tensor:
    """``scale`` as float32, shaped to broadcast over ``x``: a number or shape ``()`` for a
    per-tensor scale, shape ``[num_heads]`` matching axis -2 of ``x`` for per-head scales."""
    if isinstance(scale, bool) or not isinstance(scale, int | float | torch.Tensor):
        raise ValueError(f"scale must be a float32 tensor or a number, got {describe(scale)}")
    if isinstance(scale, torch.Tensor) and scale.dtype.is_complex:
        raise ValueError(f"scale must be real, got dtype {scale.dtype}")
    value = torch.as_tensor(scale, dtype=torch.float32)
    if not bool(torch.isfinite(value).all()) or not bool((value > 0).all()):
        shown = value.item() if value.numel() == 1 else value.tolist()
        raise ValueError(f"scale must be finite and positive, got {describe(shown)}")
    if value.dim() == 0:
        return value
    if value.dim() == 1 and x.dim() >= 2 and value.shape[0] == x.shape[-2]:
        return value[:, None]
    raise ValueError(f"scale of shape {tuple(value.shape)} fits neither one scale (shape ()) "
                     f"nor one per head of x shaped {tuple(x.shape)} (shape [num_heads] "
                     f"for x laid out [..., num_heads, head_dim])")


def quantize(x: torch.Tensor, scale: torch.Tensor | float,
             fmt: str | FP8Format = "e4m3") -> torch.Tensor:
    """``fp8(clamp(x / scale, -max, max))``: divide in float32, saturate, cast (rounding to
    nearest even). The clamp is explicit because E4M3's cast gave NaN past 448 before
    torch's 2026 change and E5M2's gives inf; with it both formats saturate on any torch."""
    return encode(_check_input(x), _broadcast_scale(scale, x), fp8_format(fmt))


def encode(x: torch.Tensor, scale: torch.Tensor, spec: FP8Format) -> torch.Tensor:
    """:func:`quantize` without its checks, for a caller that checked ``scale`` once and
    writes K/V every step (the engine's FP8 pool): checking ``x`` for NaN there would wait
    for the GPU at every layer. ``scale`` is float32, shaped to broadcast over ``x``."""
    return (x.float() / scale).clamp(-spec.max_finite, spec.max_finite).to(spec.dtype)


def dequantize(q: torch.Tensor, scale: torch.Tensor | float,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` in float32, returned as ``dtype``: what an attention kernel reads back."""
    dtypes = {spec.dtype for spec in FP8_FORMATS.values()}
    if not isinstance(q, torch.Tensor) or q.dtype not in dtypes:
        shown = q.dtype if isinstance(q, torch.Tensor) else describe(q)
        raise ValueError(f"q must be a float8_e4m3fn or float8_e5m2 tensor, got {shown}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype, got {describe(dtype)}")
    return (q.float() * _broadcast_scale(scale, q)).to(dtype)


@dataclass(frozen=True)
class QuantizationError:
    """How far the round trip ``dequantize(quantize(x))`` lands from ``x``.

    ``relative_rms`` is ||x' - x|| / ||x|| (0 for an all-zero x), ``max_abs`` the largest
    |x' - x|, and ``saturated`` how many values the clamp changed: once scaled they lay
    past the largest value by more than rounding to it would absorb (half a step), so a
    calibrated maximum that lands a hair above 448 in float32 does not count.
    """

    rms: float
    relative_rms: float
    max_abs: float
    saturated: int

    def as_dict(self) -> dict[str, float | int]:
        """Plain fields for tables and JSON."""
        return dict(vars(self))


def quantization_error(x: torch.Tensor, scale: torch.Tensor | float,
                       fmt: str | FP8Format = "e4m3") -> QuantizationError:
    """Quantize ``x`` with ``scale`` and measure the round trip against ``x`` in float32."""
    spec = fp8_format(fmt)
    q = quantize(x, scale, spec)
    exact = x.float()
    diff = dequantize(q, scale) - exact
    norm = float(exact.norm())
    rms = math.sqrt(float(diff.square().mean()))
    scaled = exact / _broadcast_scale(scale, x)
    limit = spec.max_finite + float(spec.spacing(torch.tensor(spec.max_finite))) / 2
    return QuantizationError(
        rms=rms,
        relative_rms=float(diff.norm()) / norm if norm else 0.0,
        max_abs=float(diff.abs().max()),
        saturated=int((scaled.abs() > limit).sum()),
    )
