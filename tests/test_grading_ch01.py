"""Chapter 01's checks: a correct answer passes every case, a second correct design passes
too, and at least three mistakes learners really make fail each exercise with a report that
names the call, what came back, what was expected and a hint."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch01 import longest_max_len
from course_lib.grading.check import CheckResult, evaluate
from course_lib.kv_math import GIB, blocks_needed, capacity

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
WEIGHTS = {"float32": 4, "float16": 2, "bfloat16": 2}

# --- one correct design per exercise, with mistakes that can be switched on one at a time ------


def config_bytes(mistake: str = "") -> Any:
    """01.bytes_per_token; ``mistake`` names the learner's slip."""
    def fn(config: dict[str, Any], cache_dtype: str) -> int:
        needed = ["num_hidden_layers", "num_attention_heads", "hidden_size", "torch_dtype"]
        if mistake != "keyerror":
            missing = [k for k in needed if k not in config]
            if missing:
                raise ValueError(f"config lacks {missing}")
        layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
        kv = heads if mistake == "q_heads" else config.get("num_key_value_heads", heads)
        dim = config["hidden_size"] // heads
        if mistake != "ignore_head_dim":
            dim = config.get("head_dim", dim)
        if mistake == "dim_from_kv":
            dim = config["hidden_size"] // kv
        for name, value in (("layers", layers), ("kv_heads", kv)):
            if mistake != "no_validation" and value < 1:
                raise ValueError(f"{name}={value}")
        if cache_dtype == "auto":
            size = WEIGHTS[config["torch_dtype"]]
        elif cache_dtype in BYTES:
            size = BYTES[cache_dtype]
        else:
            raise ValueError(f"unknown cache dtype {cache_dtype!r}")
        return (1 if mistake == "no_two" else 2) * layers * kv * dim * size

    return fn


def config_bytes_other(config: dict[str, Any], cache_dtype: str) -> int:
    """Another design: a table of (key, default) pairs and math.prod."""
    try:
        heads = config["num_attention_heads"]
        parts = [config["num_hidden_layers"], config.get("num_key_value_heads", heads),
                 config.get("head_dim", config["hidden_size"] // heads)]
        dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[
            config["torch_dtype"]] if cache_dtype == "auto" else cache_dtype
        if dtype not in BYTES or min(parts) < 1:
            raise ValueError(f"cannot size {parts} x {dtype!r}")
    except KeyError as missing:
        raise ValueError(f"config lacks {missing}") from None
    return 2 * math.prod(parts) * BYTES[dtype]


def blocks(mistake: str = "") -> Any:
    def fn(tokens: int, block_size: int) -> int:
        if block_size < 1 and mistake != "no_block_check":
            raise ValueError(f"block_size={block_size}")
        if tokens < 0 and mistake != "no_negative_check":
            raise ValueError(f"tokens={tokens}")
        if mistake == "floor":
            return tokens // block_size
        if mistake == "plus_one":
            return tokens // block_size + 1
        if mistake == "float_ceil":
            return math.ceil(tokens / block_size)
        return -(-tokens // block_size)

    return fn


def blocks_other(tokens: int, block_size: int) -> int:
    if block_size < 1 or tokens < 0:
        raise ValueError(f"bad tokens={tokens} or block_size={block_size}")
    whole, rest = divmod(tokens, block_size)
    return whole + (rest > 0)


def max_requests(mistake: str = "") -> Any:
    def fn(budget: int, per_token: int, max_len: int, block_size: int) -> int:
        checked = (("budget", budget),) if mistake == "validate_one" else (
            ("budget", budget), ("bytes_per_token", per_token), ("max_len", max_len),
            ("block_size", block_size))
        for name, value in checked:
            if value < 1:
                raise ValueError(f"{name}={value}")
        if mistake == "no_blocks":
            return budget // (per_token * max_len)
        whole = budget // (per_token * block_size)
        if mistake == "floor_len":
            return whole // (max_len // block_size)
        if mistake == "tokens_over_len":
            return whole * block_size // max_len
        return whole // -(-max_len // block_size)

    return fn


def max_requests_other(budget: int, per_token: int, max_len: int, block_size: int) -> int:
    """Another design: bytes one reservation costs, then whole reservations in whole blocks."""
    if min(budget, per_token, max_len, block_size) < 1:
        raise ValueError(f"every argument must be positive: {budget, per_token, max_len}")
    usable = budget - budget % (per_token * block_size)
    reservation = math.ceil(max_len / block_size) * block_size * per_token
    return usable // reservation


def predict(mistake: str = "") -> Any:
    def fn(gib: float, layers: int, kv: int, dim: int, size: int, block: int,
           max_len: int) -> tuple[int, float]:
        budget = gib * (1e9 if mistake == "decimal_gb" else 2**30)
        whole = int(budget // (2 * layers * kv * dim * size * block))
        per_request = max_len / block if mistake == "fractional_blocks" else -(-max_len // block)
        ratio = whole / per_request
        return whole * block, (math.floor(ratio * 100) / 100 if mistake == "truncate"
                               else round(ratio, 2))

    return fn


def predict_other(gib: float, layers: int, kv: int, dim: int, size: int, block: int,
                  max_len: int) -> list[float]:
    """Another design: through the library's capacity, returned as a list."""
    cap = capacity(2 * layers * kv * dim * size, gib * GIB, block, max_len)
    return [cap.tokens, round(cap.max_concurrency, 2)]


def longest(mistake: str = "") -> Any:
    def fn(budget: int, per_token: int, block_size: int, requests: int) -> int:
        if requests < 1 and mistake != "no_request_check":
            raise ValueError(f"requests={requests}")
        whole = budget // (per_token * block_size)
        if mistake == "tokens_not_blocks":
            answer = budget // per_token // requests
        elif mistake == "block_count":
            answer = whole // requests
        elif mistake == "ceil_share":
            answer = -(-whole // requests) * block_size
        else:
            answer = whole // requests * block_size
        if answer < 1 and mistake != "returns_zero":
            raise ValueError(f"{whole} blocks for {requests} requests")
        return answer

    return fn


def longest_other(budget: int, per_token: int, block_size: int, requests: int) -> int:
    """Another design: grow max_len a block at a time while exercise 3's sum still allows it."""
    if requests < 1:
        raise ValueError(f"requests={requests}")
    step = 1 << 40
    length = 0
    while step >= block_size:  # binary search over whole blocks
        trial = length + step
        if capacity(per_token, budget, block_size, trial).max_requests >= requests:
            length = trial
        step //= 2
    if length == 0:
        raise ValueError(f"not even one block each for {requests} requests")
    return length


CORRECT: dict[str, Any] = {
    "01.bytes_per_token": config_bytes(),
    "01.blocks_needed": blocks(),
    "01.max_requests": max_requests(),
    "01.predict_vllm_log": predict(),
    "01.longest_max_len": longest(),
}

OTHER_DESIGNS = [
    ("01.bytes_per_token", config_bytes_other),
    ("01.blocks_needed", blocks_other),
    ("01.max_requests", max_requests_other),
    ("01.predict_vllm_log", predict_other),
    ("01.longest_max_len", longest_other),
]

MISTAKES = [  # (exercise, wrong answer, evidence in the report)
    ("01.bytes_per_token", config_bytes("q_heads"), "# llama-3-8b"),
    ("01.bytes_per_token", config_bytes("ignore_head_dim"), "# gemma-7b"),
    ("01.bytes_per_token", config_bytes("dim_from_kv"), "# llama-3-8b"),
    ("01.bytes_per_token", config_bytes("no_two"), "every layer keeps a key and"),
    ("01.bytes_per_token", config_bytes("keyerror"), "raised KeyError"),
    ("01.bytes_per_token", config_bytes("no_validation"), "num_hidden_layers = 0"),
    ("01.blocks_needed", blocks("floor"), "fn(tokens=900, block_size=16)"),
    ("01.blocks_needed", blocks("plus_one"), "fn(tokens=896, block_size=16)"),
    ("01.blocks_needed", blocks("float_ceil"), f"fn(tokens={2**60 + 1}, block_size=16)"),
    ("01.blocks_needed", blocks("no_negative_check"), "fn(tokens=-5, block_size=16)"),
    ("01.blocks_needed", blocks("no_block_check"), "raised ZeroDivisionError"),
    ("01.max_requests", max_requests("no_blocks"), "max_len=1000, block_size=128"),
    ("01.max_requests", max_requests("floor_len"), "max_len=1000, block_size=128"),
    ("01.max_requests", max_requests("tokens_over_len"), "max_len=4000, block_size=128"),
    ("01.max_requests", max_requests("validate_one"), "max_len=0, block_size=16"),
    ("01.predict_vllm_log", predict("decimal_gb"), "the log's GiB"),
    ("01.predict_vllm_log", predict("fractional_blocks"), "max_len=10100"),
    ("01.predict_vllm_log", predict("truncate"), "available_gib=7.3"),
    ("01.longest_max_len", longest("tokens_not_blocks"), "block_size=128, requests=3"),
    ("01.longest_max_len", longest("block_count"), "requests=60"),
    ("01.longest_max_len", longest("ceil_share"), "requests=7"),
    ("01.longest_max_len", longest("returns_zero"), "more requests than blocks"),
    ("01.longest_max_len", longest("no_request_check"), "zero requests"),
]


def run(name: str, obj: Any) -> CheckResult:
    return evaluate(find_exercise(name), obj)


def test_every_exercise_has_a_correct_answer() -> None:
    assert {e.name for e in chapter_exercises("01")} == set(CORRECT)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_answer_passes_every_case(name: str) -> None:
    result = run(name, CORRECT[name])
    assert result.status == "passed", result.report_text()


@pytest.mark.parametrize("name, answer", OTHER_DESIGNS)
def test_other_correct_designs_pass(name: str, answer: Any) -> None:
    result = run(name, answer)
    assert result.status == "passed", result.report_text()


@pytest.mark.parametrize("name, answer, evidence", MISTAKES)
def test_typical_mistakes_fail_with_evidence(name: str, answer: Any, evidence: str) -> None:
    result = run(name, answer)
    text = result.report_text()
    assert result.status == "failed", text
    failed = "\n".join(f"{c.call}\n{c.got}\n{c.hint}" for c in result.cases if not c.passed)
    assert evidence in failed, text


def test_every_exercise_has_three_mistakes_and_another_design() -> None:
    for exercise in chapter_exercises("01"):
        assert sum(name == exercise.name for name, *_ in MISTAKES) >= 3, exercise.name
        assert any(name == exercise.name for name, _ in OTHER_DESIGNS), exercise.name


def test_no_prompt_or_hint_states_a_formula() -> None:
    for exercise in chapter_exercises("01"):
        for case in exercise.cases():
            assert " x " not in case.hint and "//" not in case.hint, case.hint


def test_stubs_are_not_yet_solved() -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError

    for name in CORRECT:
        assert run(name, stub).status == "not-solved"


@given(budget=st.integers(1, 200 * GIB), per_token=st.integers(1, 2**20),
       block_size=st.sampled_from([1, 8, 16, 32, 128]), requests=st.integers(1, 500))
def test_longest_max_len_is_the_edge_of_what_fits(budget: int, per_token: int,
                                                  block_size: int, requests: int) -> None:
    blocks_total = budget // (per_token * block_size)
    if blocks_total < requests:
        with pytest.raises(ValueError, match=str(requests)):
            longest_max_len(budget, per_token, block_size, requests)
        return
    length = longest_max_len(budget, per_token, block_size, requests)
    assert length % block_size == 0
    assert capacity(per_token, budget, block_size, length).max_requests >= requests
    assert capacity(per_token, budget, block_size, length + 1).max_requests < requests
    assert blocks_needed(length, block_size) * requests <= blocks_total
