"""KV-cache arithmetic: the source material's figures, error handling, and invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from course_lib import kv_math
from course_lib.kv_math import GIB, MODELS
from course_lib.validate import (
    check_int,
    check_non_negative_number,
    check_positive_number,
    describe,
)


def test_guide_model_figures() -> None:
    per_token = MODELS["guide-8kv"].bytes_per_token("fp16")
    assert per_token == 131_072 == 128 * 1024
    assert per_token * 8192 == 1 * GIB
    cap = kv_math.capacity(per_token, 60 * GIB, block_size=16, max_len=8192)
    assert (cap.blocks, cap.tokens, cap.max_requests) == (30_720, 491_520, 60)


def test_opt_13b_figures() -> None:
    per_token = MODELS["opt-13b"].bytes_per_token("fp16")
    assert per_token == 819_200 == 800 * 1024
    assert round(per_token * 2048 / GIB, 2) == 1.56


def test_fourteen_gib_example_about_8_vs_71() -> None:
    per_token = MODELS["opt-13b"].bytes_per_token()
    assert kv_math.concurrent_requests(per_token, 14 * GIB, 2048) == 8
    assert kv_math.concurrent_requests(per_token, 14 * GIB, 256, block_size=16) == 71


def test_900_token_chat_blocks_and_utilisation() -> None:
    assert kv_math.blocks_needed(900, 16) == 57
    assert kv_math.paged_utilization(900, 16) == pytest.approx(900 / 912)
    assert kv_math.contiguous_utilization(512, 2048) == 0.25
    assert kv_math.contiguous_utilization(128, 2048) == 0.0625


@pytest.mark.parametrize(
    ("name", "expected"),
    [("llama-3-8b", 131_072), ("mistral-7b", 131_072), ("qwen2.5-7b", 57_344),
     ("llama-2-7b", 524_288), ("llama-3-70b", 327_680), ("smollm2-135m", 23_040)],
)
def test_real_model_presets(name: str, expected: int) -> None:
    assert MODELS[name].bytes_per_token("fp16") == expected
    assert MODELS[name].bytes_per_token("fp8") == expected // 2
    assert MODELS[name].bytes_per_token("fp32") == expected * 2


def test_vllm_log_lines_agree_with_capacity() -> None:
    lines = kv_math.vllm_kv_log_lines(60, MODELS["guide-8kv"], "fp16", 16, 8192)
    assert lines == [
        "Available KV cache memory: 60.00 GiB",
        "GPU KV cache size: 491,520 tokens",
        "Maximum concurrency for 8,192 tokens per request: 60.00x",
    ]


@pytest.mark.parametrize(
    ("call", "bad"),
    [
        (lambda: kv_math.bytes_per_token(0, 8, 128), "layers"),
        (lambda: kv_math.bytes_per_token(32, -1, 128), "kv_heads"),
        (lambda: kv_math.bytes_per_token(32, 8, 1.5), "head_dim"),
        (lambda: kv_math.bytes_per_token(32, 8, 128, "fp7"), "fp7"),
        (lambda: kv_math.capacity(131072, 0), "budget_bytes"),
        (lambda: kv_math.capacity(131072, float("nan")), "budget_bytes"),
        (lambda: kv_math.capacity(131072, GIB, block_size=0), "block_size"),
        (lambda: kv_math.capacity(131072, GIB, max_len=-5), "max_len"),
        (lambda: kv_math.blocks_needed(-1, 16), "tokens"),
        (lambda: kv_math.contiguous_utilization(3000, 2048), "3000"),
        (lambda: kv_math.model_shape("gpt-5"), "gpt-5"),
        (lambda: kv_math.ModelShape("x", 2, 6, 4, 64, "test"), "kv_heads=4"),
        (lambda: kv_math.bytes_per_token(True, 8, 128), "layers"),
    ],
)
def test_bad_values_raise_value_error_naming_them(call, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        call()


@given(
    per_token=st.integers(1, 2**21),
    budget=st.integers(1, 2**40),
    block=st.integers(1, 1024),
    max_len=st.integers(1, 2**17),
)
def test_capacity_uses_whole_blocks_and_never_overfills(per_token, budget, block, max_len) -> None:
    cap = kv_math.capacity(per_token, budget, block, max_len)
    block_bytes = per_token * block
    assert cap.blocks * block_bytes <= budget < (cap.blocks + 1) * block_bytes
    assert cap.tokens == cap.blocks * block
    per_request = kv_math.blocks_needed(max_len, block)
    assert cap.max_requests * per_request <= cap.blocks < (cap.max_requests + 1) * per_request
    assert cap.max_concurrency == pytest.approx(cap.blocks / per_request)


@given(tokens=st.integers(1, 10**6), block=st.integers(1, 4096))
def test_paged_waste_is_below_one_block(tokens: int, block: int) -> None:
    slots = kv_math.blocks_needed(tokens, block) * block
    assert 0 <= slots - tokens <= block - 1
    assert 0 < kv_math.paged_utilization(tokens, block) <= 1


def test_numbers_too_large_for_a_float_are_refused_not_overflowed() -> None:
    with pytest.raises(ValueError, match="budget_bytes must be a positive number, got an "
                                         "integer of 1,329 bits"):
        kv_math.capacity(131072, 10**400)
    with pytest.raises(ValueError, match="budget_bytes"):
        kv_math.concurrent_requests(131072, 10**400, 100)
    assert kv_math.capacity(131072, 2**60).blocks == 2**60 // (131072 * 16)


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [(lambda v: check_int("n", v, 1, 10), 11, "n must be an integer <= 10, got 11"),
     (lambda v: check_int("n", v, 1), -(10**5000), "n must be an integer >= 1, got an integer"),
     (lambda v: check_int("n", v, 1), [[]] * 100, "got [[], [], "),
     (lambda v: check_positive_number("x", v, 5.0), 6, "x must be at most 5, got 6"),
     (lambda v: check_non_negative_number("x", v), -0.5, "x must be a non-negative number"),
     (lambda v: check_non_negative_number("x", v), "1", "got '1'")],
    ids=["above-maximum", "5000-digits", "long-list", "number-maximum", "negative", "text"],
)
def test_checks_name_the_value_even_when_it_is_huge(check, value, message: str) -> None:
    with pytest.raises(ValueError) as error:
        check(value)
    assert message in str(error.value) and len(str(error.value)) < 200


def test_describe_shortens_what_it_cannot_print_whole() -> None:
    nested: list = []
    for _ in range(10_000):
        nested = [nested]
    assert describe(nested) == "a list nested too deeply to print"
    assert describe(-(10**5000)).startswith("an integer of 16,610 bits")
    assert describe("x" * 100).endswith("...") and len(describe("x" * 100)) == 60
    assert describe(1.5) == "1.5"


@given(value=st.one_of(st.floats(allow_nan=True), st.integers(-(10**400), 10**400),
                       st.text(max_size=5), st.none(), st.booleans()))
def test_positive_number_check_accepts_exactly_finite_positive_numbers(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        finite_positive = False
    elif isinstance(value, int):
        assume(value.bit_length() != 1024)  # the boundary where float() starts to overflow
        finite_positive = value > 0 and value.bit_length() < 1024
    else:
        finite_positive = math.isfinite(value) and value > 0
    try:
        assert check_positive_number("x", value) == float(value) and finite_positive
    except ValueError:
        assert not finite_positive


def test_vllm_log_lines_refuse_a_budget_that_is_not_a_number() -> None:
    """``"14" * GIB`` would be a 14 GiB string, not 14 GiB."""
    with pytest.raises(ValueError, match="available_gib must be a positive number, got '14'"):
        kv_math.vllm_kv_log_lines("14", MODELS["opt-13b"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape must be a ModelShape, got 'opt-13b'"):
        kv_math.vllm_kv_log_lines(14.0, "opt-13b")  # type: ignore[arg-type]
