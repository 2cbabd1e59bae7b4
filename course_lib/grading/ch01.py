"""Chapter 01 exercises: KV-cache arithmetic. Expected values come from ``kv_math``.

The lecture states the bytes-per-token formula for a model shape; exercise 1 asks for the
next step a deployment needs, the same number read from a Hugging Face ``config.json``
(where the KV heads and the head size are often implicit). Exercise 5 runs the capacity
sum backwards, from a required concurrency to the longest request that allows it.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.check import Case, Exercise, Raises
from course_lib.kv_math import (
    DTYPE_BYTES,
    GIB,
    MODELS,
    ModelShape,
    blocks_needed,
    bytes_per_token,
    capacity,
)
from course_lib.validate import check_int

# --- exercise 1: bytes per token from a config.json ----------------------------------------

TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
"""A config's ``torch_dtype`` as the cache dtype name ``cache_dtype="auto"`` stands for."""


def config_of(shape: ModelShape, torch_dtype: str = "bfloat16", *, implicit_kv: bool = False,
              head_dim: bool = False) -> dict[str, Any]:
    """A config.json dict for ``shape``; the KV heads and the head size written or implicit."""
    config: dict[str, Any] = {
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.q_heads,
        "hidden_size": shape.q_heads * shape.head_dim, "torch_dtype": torch_dtype,
    }
    if not implicit_kv:
        config["num_key_value_heads"] = shape.kv_heads
    if head_dim:
        config["head_dim"] = shape.head_dim
    return config


GEMMA_7B: dict[str, Any] = {
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
    "hidden_size": 3072, "head_dim": 256, "torch_dtype": "bfloat16",
}
"""google/gemma-7b's config.json: its head size 256 is not hidden_size / heads (192)."""


def _config_bytes(config: dict[str, Any], cache_dtype: str) -> int:
    """The library's bytes per token for a config (the expected value of every case)."""
    heads = config["num_attention_heads"]
    dtype = TORCH_DTYPES[config["torch_dtype"]] if cache_dtype == "auto" else cache_dtype
    return bytes_per_token(config["num_hidden_layers"],
                           config.get("num_key_value_heads", heads),
                           config.get("head_dim", config["hidden_size"] // heads), dtype)


def _bytes_per_token_cases() -> list[Case]:
    hint = ("every layer keeps a key and a value vector for each KV head; read the KV heads "
            "and the head size the way the config defines them when they are not written")
    configs = [
        ("llama-3-8b, bf16 weights", config_of(MODELS["llama-3-8b"]), "auto"),
        ("opt-13b: no num_key_value_heads key", config_of(MODELS["opt-13b"], "float16",
                                                          implicit_kv=True), "auto"),
        ("qwen2.5-7b with an fp8 cache", config_of(MODELS["qwen2.5-7b"]), "fp8"),
        ("smollm2-135m, head_dim written", config_of(MODELS["smollm2-135m"], head_dim=True),
         "auto"),
        ("gemma-7b: head_dim is not hidden_size / heads", GEMMA_7B, "auto"),
        ("llama-3-70b, fp32 weights", config_of(MODELS["llama-3-70b"], "float32"), "auto"),
        ("llama-3-70b, fp32 weights, fp16 cache", config_of(MODELS["llama-3-70b"], "float32"),
         "fp16"),
    ]
    cases = [
        Case(f"fn(config, cache_dtype={dtype!r})  # {label}: config = {config}",
             lambda fn, c=config, d=dtype: fn(dict(c), d), _config_bytes(config, dtype), hint)
        for label, config, dtype in configs
    ]
    missing = {k: v for k, v in config_of(MODELS["llama-3-8b"]).items()
               if k != "num_hidden_layers"}
    zero = config_of(MODELS["llama-3-8b"]) | {"num_hidden_layers": 0}
    bad = [
        ("a config without num_hidden_layers", missing, "auto"),
        ("num_hidden_layers = 0", zero, "auto"),
        ("num_key_value_heads = 0", config_of(MODELS["llama-3-8b"]) | {"num_key_value_heads": 0},
         "auto"),
        ("an unknown cache dtype", config_of(MODELS["llama-3-8b"]), "int3"),
    ]
    cases += [
        Case(f"fn(config, cache_dtype={dtype!r})  # {label}", lambda fn, c=c, d=dtype: fn(c, d),
             Raises(ValueError), "a config that cannot size the cache is the caller's mistake: "
             "raise ValueError naming the missing or bad entry (not KeyError, not a number)")
        for label, c, dtype in bad
    ]
    return cases


# --- exercise 2: blocks for a sequence -----------------------------------------------------


def _blocks_needed_cases() -> list[Case]:
    hint = "a partly filled last block is still a whole block; stay in integers"
    pairs = [(900, 16), (896, 16), (1, 16), (16, 16), (17, 16), (0, 16), (1000, 128),
             (2**60 + 1, 16)]
    cases = [
        Case(f"fn(tokens={t}, block_size={b})", lambda fn, t=t, b=b: fn(t, b),
             blocks_needed(t, b), hint)
        for t, b in pairs
    ]
    cases.append(Case("fn(tokens=10, block_size=0)", lambda fn: fn(10, 0), Raises(ValueError),
                      "a block of zero tokens is impossible: raise ValueError"))
    cases.append(Case("fn(tokens=-5, block_size=16)", lambda fn: fn(-5, 16), Raises(ValueError),
                      "a negative length is a mistake: raise ValueError naming it"))
    return cases


# --- exercise 3: requests that fit at a maximum length ----------------------------------------


def _max_requests_cases() -> list[Case]:
    hint = ("the budget holds whole blocks only, and a request reserves whole blocks for "
            "max_len tokens, however few of its last block's slots it could fill")
    guide, opt = MODELS["guide-8kv"].bytes_per_token(), MODELS["opt-13b"].bytes_per_token()
    settings = [(60 * GIB, guide, 8192, 16), (14 * GIB, opt, 2048, 16),
                (14 * GIB, opt, 256, 16), (60 * GIB, guide, 1000, 128), (1 * GIB, guide, 8192, 16),
                (60 * GIB, guide, 4000, 128), (3 * GIB - 1, guide, 16, 16)]
    cases = [
        Case(f"fn(budget_bytes={b}, bytes_per_token={p}, max_len={m}, block_size={s})",
             lambda fn, b=b, p=p, m=m, s=s: fn(b, p, m, s), capacity(p, b, s, m).max_requests, hint)
        for b, p, m, s in settings
    ]
    bad = "raise ValueError naming the bad argument (every argument, not only the first)"
    cases += [
        Case(f"fn(budget_bytes={b}, bytes_per_token={p}, max_len={m}, block_size={s})",
             lambda fn, b=b, p=p, m=m, s=s: fn(b, p, m, s), Raises(ValueError), bad)
        for b, p, m, s in [(GIB, 0, 8192, 16), (GIB, guide, 0, 16), (GIB, guide, 8192, 0),
                           (-GIB, guide, 8192, 16)]
    ]
    return cases


# --- exercise 4: predict vLLM's log lines -----------------------------------------------------


def _predict_log_cases() -> list[Case]:
    hint = ("the log's GiB are 2**30 bytes; the cache holds whole blocks; concurrency compares "
            "them with the whole blocks one max_len request needs, rounded as the log rounds")
    settings = [
        (60.0, MODELS["guide-8kv"], "fp16", 16, 8192),
        (21.5, MODELS["llama-3-8b"], "fp16", 16, 8192),
        (35.25, MODELS["qwen2.5-7b"], "fp16", 16, 32768),
        (10.0, MODELS["mistral-7b"], "fp8", 32, 4096),
        (20.0, MODELS["llama-3-8b"], "fp16", 16, 10_100),
        (7.3, MODELS["llama-2-7b"], "fp16", 16, 4096),
    ]

    def expected(gib: float, shape: ModelShape, dtype: str, block: int,
                 max_len: int) -> tuple[int, float]:
        cap = capacity(shape.bytes_per_token(dtype), gib * GIB, block, max_len)
        return cap.tokens, round(cap.max_concurrency, 2)

    return [
        Case(
            f"fn(available_gib={g}, layers={s.layers}, kv_heads={s.kv_heads}, "
            f"head_dim={s.head_dim}, dtype_bytes={DTYPE_BYTES[d]}, block_size={b}, max_len={m})",
            lambda fn, g=g, s=s, d=d, b=b, m=m: list(
                fn(g, s.layers, s.kv_heads, s.head_dim, DTYPE_BYTES[d], b, m)
            ),
            list(expected(g, s, d, b, m)),
            hint,
            compare=lambda got, want: got[0] == want[0] and abs(got[1] - want[1]) < 5e-4,
        )
        for g, s, d, b, m in settings
    ]


# --- exercise 5: the longest request at a required concurrency ---------------------------------


def longest_max_len(budget_bytes: int, per_token: int, block_size: int, requests: int) -> int:
    """The largest max_len at which ``requests`` full-length reservations fit (from capacity)."""
    check_int("requests", requests, 1)
    blocks = capacity(per_token, budget_bytes, block_size, block_size).blocks
    if blocks < requests:
        raise ValueError(f"{blocks} blocks cannot give each of {requests} requests one block")
    return blocks // requests * block_size


def _longest_cases() -> list[Case]:
    hint = ("every request must be able to reserve its whole max_len in whole blocks, all at "
            "once; the answer is a length the capacity sum of exercise 3 accepts, and one "
            "token more must not be")
    guide, opt = MODELS["guide-8kv"].bytes_per_token(), MODELS["opt-13b"].bytes_per_token()
    settings = [(60 * GIB, guide, 16, 60), (60 * GIB, guide, 16, 64), (60 * GIB, guide, 16, 7),
                (14 * GIB, opt, 16, 8), (14 * GIB, opt, 32, 71), (GIB + 12345, guide, 128, 3),
                (60 * GIB, guide, 16, 30_720)]
    cases = [
        Case(f"fn(budget_bytes={b}, bytes_per_token={p}, block_size={s}, requests={n})",
             lambda fn, b=b, p=p, s=s, n=n: fn(b, p, s, n), longest_max_len(b, p, s, n), hint)
        for b, p, s, n in settings
    ]
    cases += [
        Case(f"fn(budget_bytes={b}, bytes_per_token={guide}, block_size=16, requests={n})  # {why}",
             lambda fn, b=b, n=n: fn(b, guide, 16, n), Raises(ValueError),
             "no max_len works (or the request count is no count): raise ValueError")
        for b, n, why in [(60 * GIB, 30_721, "more requests than blocks"),
                          (60 * GIB, 0, "zero requests"), (GIB, -2, "negative requests")]
    ]
    return cases


EXERCISES = (
    Exercise("01.bytes_per_token", "KV bytes per token from a config.json",
             _bytes_per_token_cases,
             reference=("course_lib.kv_math.bytes_per_token",
                        "course_lib.kv_math.ModelShape.bytes_per_token",
                        "course_lib.kv_math.capacity", "course_lib.engine.config_from_hf")),
    Exercise("01.blocks_needed", "Blocks for a sequence", _blocks_needed_cases,
             reference=("course_lib.kv_math.blocks_needed",
                        "course_lib.paged.PagedKVManager.blocks_needed")),
    Exercise("01.max_requests", "Requests that fit at a maximum length", _max_requests_cases,
             reference=("course_lib.kv_math.capacity", "course_lib.kv_math.concurrent_requests")),
    Exercise("01.predict_vllm_log", "Predict vLLM's KV log lines", _predict_log_cases,
             reference=("course_lib.kv_math.capacity", "course_lib.kv_math.vllm_kv_log_lines")),
    Exercise("01.longest_max_len", "The longest max_len at a required concurrency",
             _longest_cases,
             reference=("course_lib.kv_math.capacity", "course_lib.kv_math.concurrent_requests")),
)
