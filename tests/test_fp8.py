"""FP8 quantization: the facts about torch's casts the module is built on, calibration, the
quantizer's properties, the error it measures, and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.fp8 import (
    FP8_FORMATS,
    MIN_SCALE,
    calibrate_scale,
    dequantize,
    fp8_format,
    quantization_error,
    quantize,
)

E4M3, E5M2 = FP8_FORMATS["e4m3"], FP8_FORMATS["e5m2"]


def cast(values: list[float], dtype: torch.dtype, source: torch.dtype = torch.float32
         ) -> list[float]:
    return torch.tensor(values, dtype=source).to(dtype).float().tolist()


# --- the facts --------------------------------------------------------------------------------


def test_the_formats_match_torch() -> None:
    for spec in FP8_FORMATS.values():
        info = torch.finfo(spec.dtype)
        assert spec.max_finite == info.max and spec.min_normal == info.smallest_normal
        assert 1 + spec.exponent_bits + spec.mantissa_bits == 8
        assert spec.spacing(torch.tensor(1.0)).item() == info.eps
    assert (E4M3.max_finite, E5M2.max_finite) == (448.0, 57344.0)


def test_the_e4m3_cast_rounds_to_nearest_even() -> None:
    # 1.0625 is halfway from 1.0 (mantissa 000) to 1.125 (001); 1.1875 from 1.125 to 1.25 (010)
    assert cast([1.0625, 1.1875, -1.0625, 1.0625 + 2**-20], E4M3.dtype) == [1.0, 1.25, -1.0,
                                                                             1.125]


def test_the_e4m3_cast_saturates_in_this_torch_and_quantize_clamps_anyway() -> None:
    """torch 2.13 saturates; releases before its 2026 change gave NaN, hence the clamp."""
    assert E4M3.saturates
    assert cast([449.0, 1e6, -1e6], E4M3.dtype) == [448.0, 448.0, -448.0]
    assert quantize(torch.tensor([1e6, -1e6]), 1.0, "e4m3").float().tolist() == [448.0, -448.0]


def test_the_e5m2_cast_overflows_to_inf_and_quantize_saturates() -> None:
    assert not E5M2.saturates
    assert cast([57344.0, 61439.0, 61440.0, -61440.0], E5M2.dtype) == [
        57344.0, 57344.0, math.inf, -math.inf]
    q = quantize(torch.tensor([61440.0, -1e9, 57344.0]), 1.0, "e5m2")
    assert q.dtype == torch.float8_e5m2 and q.float().tolist() == [57344.0, -57344.0, 57344.0]


def test_a_float64_cast_rounds_twice_so_quantize_refuses_float64() -> None:
    # just above the midpoint 1.0625: rounds to 1.125 directly, but to 1.0625 in float32 first,
    # a tie that goes to even, 1.0
    value = 1.0625 + 2**-30
    assert cast([value], E4M3.dtype, torch.float64) == [1.0]
    assert torch.tensor(value, dtype=torch.float64).float().item() == 1.0625
    with pytest.raises(ValueError, match="float64"):
        quantize(torch.tensor([value], dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match="float64"):
        calibrate_scale(torch.tensor([value], dtype=torch.float64))


# --- calibration --------------------------------------------------------------------------------


def test_a_per_tensor_scale_maps_the_largest_magnitude_onto_the_format_max() -> None:
    x = torch.tensor([[1.0, -896.0], [3.0, 4.0]])
    scale = calibrate_scale(x)
    assert scale.shape == () and scale.dtype == torch.float32 and scale.item() == 2.0
    assert calibrate_scale(x, "e5m2").item() == pytest.approx(896 / 57344)


def test_per_head_scales_come_from_each_heads_own_values() -> None:
    x = torch.zeros(3, 2, 4)  # [tokens, heads, head_dim]
    x[1, 0, 2], x[2, 1, 0] = -44.8, 4480.0
    scale = calibrate_scale(x, per="head")
    assert scale.shape == (2,) and scale.dtype == torch.float32
    assert scale.tolist() == pytest.approx([0.1, 10.0])


@pytest.mark.parametrize(("outlier", "worse"), [(1e3, (0.9, 1.1)), (1e5, (10.0, math.inf))])
def test_one_outlier_head_costs_the_other_heads_once_it_pushes_them_below_normal(
        outlier: float, worse: tuple[float, float]) -> None:
    """A floating-point format keeps its relative precision over its normal range, so an
    outlier head 1,000x larger barely hurts the others under a per-tensor scale; 100,000x
    pushes their values into E4M3's subnormals (below 2**-6), where the error grows."""
    x = torch.randn(64, 4, 32, generator=torch.Generator().manual_seed(0))
    x[:, 3] *= outlier
    tensor = quantization_error(x[:, :3], calibrate_scale(x))
    head = quantization_error(x[:, :3], calibrate_scale(x, per="head")[:3])
    low, high = worse
    assert low * head.relative_rms < tensor.relative_rms < high * head.relative_rms


def test_an_all_zero_tensor_or_head_gets_the_smallest_normal_scale() -> None:
    x = torch.zeros(2, 3, 4)
    x[:, 1] = 1.0
    assert calibrate_scale(torch.zeros(5)).item() == MIN_SCALE
    assert calibrate_scale(x, per="head").tolist() == [MIN_SCALE, torch.tensor(1 / 448).item(),
                                                         MIN_SCALE]
    q = quantize(x, calibrate_scale(x, per="head"))
    assert dequantize(q, calibrate_scale(x, per="head")).equal(x)


# --- quantize and dequantize ----------------------------------------------------------------------


def test_quantize_divides_in_float32_and_dequantize_multiplies_back() -> None:
    x = torch.tensor([[0.5, -1.0], [3.0, 6.0]])  # [heads, head_dim]
    scale = torch.tensor([0.5, 2.0])
    q = quantize(x, scale)
    assert q.dtype == torch.float8_e4m3fn and q.float().tolist() == [[1.0, -2.0], [1.5, 3.0]]
    assert dequantize(q, scale).tolist() == x.tolist()
    assert dequantize(q, scale, torch.bfloat16).dtype == torch.bfloat16


def test_bfloat16_and_float16_input_are_quantized_as_float32() -> None:
    x = torch.randn(100, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.bfloat16, torch.float16):
        low = x.to(dtype)
        assert quantize(low, 0.01).equal(quantize(low.float(), 0.01))


finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)
scales = st.floats(2.0**-10, 2.0**10, allow_nan=False, width=32)
formats = st.sampled_from(sorted(FP8_FORMATS))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=16), scale=scales, fmt=formats)
def test_round_trip_error_is_at_most_half_a_step_of_the_saturated_value(
        values: list[float], scale: float, fmt: str) -> None:
    spec = FP8_FORMATS[fmt]
    x = torch.tensor(values)
    s = torch.tensor(scale)
    target = (x / s).clamp(-spec.max_finite, spec.max_finite)
    got = quantize(x, s, fmt).float()
    assert torch.isfinite(got).all()
    assert ((got - target).abs() <= spec.spacing(target) / 2).all()


@settings(max_examples=200, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=16), scale=scales, fmt=formats)
def test_quantize_is_sign_symmetric(values: list[float], scale: float, fmt: str) -> None:
    x = torch.tensor(values)
    assert quantize(-x, scale, fmt).float().equal(-quantize(x, scale, fmt).float())


@settings(max_examples=200, deadline=None)
@given(values=st.lists(finite, min_size=2, max_size=32), scale=scales, fmt=formats)
def test_quantize_is_monotonic_and_saturates(values: list[float], scale: float,
                                             fmt: str) -> None:
    x = torch.tensor(sorted(values))
    got = quantize(x, scale, fmt).float()
    assert (got[1:] >= got[:-1]).all()
    assert got.abs().max() <= FP8_FORMATS[fmt].max_finite


# --- the error ------------------------------------------------------------------------------


def test_quantization_error_by_hand() -> None:
    # 1.0625 -> 1.0 (error 0.0625), 3.0 exact, 1000 -> 448 saturated (error 552)
    x = torch.tensor([1.0625, 3.0, 1000.0])
    error = quantization_error(x, 1.0)
    assert error.max_abs == 552.0 and error.saturated == 1
    assert error.rms == pytest.approx(math.sqrt((0.0625**2 + 552**2) / 3))
    assert error.relative_rms == pytest.approx(math.sqrt(0.0625**2 + 552**2)
                                               / math.sqrt(1.0625**2 + 9 + 1e6))
    assert quantization_error(torch.zeros(3), 1.0).as_dict() == {
        "rms": 0.0, "relative_rms": 0.0, "max_abs": 0.0, "saturated": 0}


def test_a_calibrated_maximum_does_not_count_as_saturated() -> None:
    x = torch.randn(50, 8, 16, generator=torch.Generator().manual_seed(3))
    for per in ("tensor", "head"):
        assert quantization_error(x, calibrate_scale(x, per=per)).saturated == 0


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: fp8_format("e4m3fnuz"), "e4m3fnuz"),
    (lambda: quantize(torch.ones(2), 1.0, "int8"), "int8"),
    (lambda: quantize(torch.ones(2), torch.tensor(float("nan"))), "nan"),
    (lambda: quantize(torch.ones(2), 0.0), "0.0"),
    (lambda: quantize(torch.ones(2), float("inf")), "inf"),
    (lambda: quantize(torch.ones(3, 2, 4), torch.ones(3)), "(3,)"),
    (lambda: quantize(torch.ones(4), torch.ones(4)), "(4,)"),
    (lambda: quantize(torch.ones(2, 2), torch.ones(1, 1)), "(1, 1)"),
    (lambda: quantize(torch.ones(2), True), "True"),
    (lambda: quantize([1.0], 1.0), "[1.0]"),
    (lambda: quantize(torch.ones(2, dtype=torch.int32), 1.0), "int32"),
    (lambda: quantize(torch.tensor([1.0, float("inf")]), 1.0), "inf"),
    (lambda: calibrate_scale(torch.ones(0)), "empty"),
    (lambda: calibrate_scale(torch.ones(4), per="head"), "per='head'"),
    (lambda: calibrate_scale(torch.ones(2, 4), per="channel"), "channel"),
    (lambda: dequantize(torch.ones(2), 1.0), "float32"),
    (lambda: dequantize(torch.ones(2).to(torch.float8_e5m2), 1.0, torch.int8), "int8"),
])
def test_bad_input_raises_naming_the_value(call: object, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as error:
        call()  # type: ignore[operator]
    assert needle in str(error.value)
