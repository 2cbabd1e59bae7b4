"""Chapter 01 exercises: KV-cache arithmetic. Expected values come from ``kv_math``."""

from __future__ import annotations

from course_lib.grading.check import Case, Exercise, Raises
from course_lib.kv_math import (
    DTYPE_BYTES,
    GIB,
    MODELS,
    blocks_needed,
    bytes_per_token,
    capacity,
)


def _bytes_per_token_cases() -> list[Case]:
    hint = "2 (one key, one value) x layers x kv_heads x head_dim x dtype_bytes"
    cases = [
        Case(
            f"fn(layers={m.layers}, kv_heads={m.kv_heads}, head_dim={m.head_dim}, dtype_bytes=2)",
            lambda fn, m=m: fn(m.layers, m.kv_heads, m.head_dim, 2),
            bytes_per_token(m.layers, m.kv_heads, m.head_dim, "fp16"),
            hint,
        )
        for m in (MODELS["guide-8kv"], MODELS["opt-13b"], MODELS["qwen2.5-7b"])
    ]
    cases.append(Case(
        "fn(layers=80, kv_heads=8, head_dim=128, dtype_bytes=1)  # fp8 cache",
        lambda fn: fn(80, 8, 128, 1), bytes_per_token(80, 8, 128, "fp8"), hint,
    ))
    cases.append(Case(
        "fn(layers=0, kv_heads=8, head_dim=128, dtype_bytes=2)",
        lambda fn: fn(0, 8, 128, 2), Raises(ValueError),
        "a model with no layers is a mistake: raise ValueError naming the bad value",
    ))
    return cases


def _blocks_needed_cases() -> list[Case]:
    hint = "round up: a partly filled last block is still a whole block (stay in integers)"
    pairs = [(900, 16), (896, 16), (1, 16), (16, 16), (17, 16), (0, 16), (1000, 128)]
    cases = [
        Case(f"fn(tokens={t}, block_size={b})", lambda fn, t=t, b=b: fn(t, b),
             blocks_needed(t, b), hint)
        for t, b in pairs
    ]
    cases.append(Case("fn(tokens=10, block_size=0)", lambda fn: fn(10, 0), Raises(ValueError),
                      "a block of zero tokens is impossible: raise ValueError"))
    return cases


def _max_requests_cases() -> list[Case]:
    hint = ("whole blocks fit in the budget: budget // (bytes_per_token x block_size); each "
            "request reserves ceil(max_len / block_size) blocks")
    guide, opt = MODELS["guide-8kv"].bytes_per_token(), MODELS["opt-13b"].bytes_per_token()
    settings = [(60 * GIB, guide, 8192, 16), (14 * GIB, opt, 2048, 16),
                (14 * GIB, opt, 256, 16), (60 * GIB, guide, 1000, 128), (1 * GIB, guide, 8192, 16)]
    return [
        Case(f"fn(budget_bytes={b}, bytes_per_token={p}, max_len={m}, block_size={s})",
             lambda fn, b=b, p=p, m=m, s=s: fn(b, p, m, s), capacity(p, b, s, m).max_requests, hint)
        for b, p, m, s in settings
    ]


def _predict_log_cases() -> list[Case]:
    hint = ("tokens = whole blocks x block_size, blocks = available bytes // (bytes/token x "
            "block_size); concurrency = tokens / (blocks per max-length request x block_size)")
    settings = [
        (60.0, MODELS["guide-8kv"], "fp16", 16, 8192),
        (21.5, MODELS["llama-3-8b"], "fp16", 16, 8192),
        (35.25, MODELS["qwen2.5-7b"], "fp16", 16, 32768),
        (10.0, MODELS["mistral-7b"], "fp8", 32, 4096),
    ]

    def expected(gib: float, shape, dtype: str, block: int, max_len: int) -> tuple[int, float]:
        cap = capacity(shape.bytes_per_token(dtype), gib * GIB, block, max_len)
        return cap.tokens, round(cap.max_concurrency, 2)

    return [
        Case(
            f"fn(available_gib={g}, layers={s.layers}, kv_heads={s.kv_heads}, "
            f"head_dim={s.head_dim}, dtype_bytes={DTYPE_BYTES[d]}, block_size={b}, max_len={m})",
            lambda fn, g=g, s=s, d=d, b=b, m=m: tuple(
                fn(g, s.layers, s.kv_heads, s.head_dim, DTYPE_BYTES[d], b, m)
            ),
            expected(g, s, d, b, m),
            hint,
            compare=lambda got, want: got[0] == want[0] and abs(got[1] - want[1]) < 0.006,
        )
        for g, s, d, b, m in settings
    ]


_KV = "course_lib.kv_math"

EXERCISES = (
    Exercise("01.bytes_per_token", "KV bytes per token", _bytes_per_token_cases,
             reference=(f"{_KV}.bytes_per_token", f"{_KV}.ModelShape.bytes_per_token",
                        f"{_KV}.capacity")),
    Exercise("01.blocks_needed", "Blocks for a sequence", _blocks_needed_cases,
             reference=(f"{_KV}.blocks_needed", "course_lib.paged.PagedKVManager.blocks_needed")),
    Exercise("01.max_requests", "Requests that fit at a maximum length", _max_requests_cases,
             reference=(f"{_KV}.capacity", f"{_KV}.concurrent_requests")),
    Exercise("01.predict_vllm_log", "Predict vLLM's KV log lines", _predict_log_cases,
             reference=(f"{_KV}.capacity", f"{_KV}.vllm_kv_log_lines")),
)
