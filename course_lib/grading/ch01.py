"""Chapter 01 exercises: KV-cache arithmetic. Expected values come from ``kv_math``.

The lecture states the bytes-per-token formula for a model shape; ``01.bytes_per_token``
asks for the next step a deployment needs, the same number read from a Hugging Face
``config.json`` (where the KV heads and the head size are often implicit).
``01.longest_max_len`` runs the capacity sum backwards, from a required concurrency to the
longest request that allows it.

Every case recognises the numbers the usual slips give on its inputs (reading the query
heads as KV heads, forgetting the value vector, rounding blocks down, ...), so a wrong
answer is told which slip it looks like.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    first_difference,
    labelled,
    recognising,
)
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

# --- 01.bytes_per_token: bytes per token from a config.json --------------------------------

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


def _config_mistakes(config: dict[str, Any], cache_dtype: str) -> list[tuple[int, str]]:
    """What each recognised slip gives for ``config``, with its hint."""
    heads = config["num_attention_heads"]
    right = _config_bytes(config, cache_dtype)
    kv, dim = config.get("num_key_value_heads", heads), config["hidden_size"] // heads
    return [
        (right // kv * heads, "with grouped-query attention the cache holds num_key_value_heads "
                              "heads, not num_attention_heads"),
        (right // config.get("head_dim", dim) * dim,
         "a config that writes head_dim means it: it is not always hidden_size over the heads"),
        (right // 2, "every layer keeps a key and a value vector for each KV head: two vectors"),
        (_config_bytes(config, "auto"),
         "cache_dtype sets the bytes of the cache's numbers; only 'auto' means the weights' "
         "torch_dtype"),
    ]


def _config_case(label: str, config: dict[str, Any], dtype: str) -> Case:
    return Case(f"fn(config, cache_dtype={dtype!r})  # {label}: config = {config}",
                lambda fn, c=dict(config), d=dtype: fn(dict(c), d), _config_bytes(config, dtype),
                "every layer keeps a key and a value vector for each KV head; read the KV heads "
                "and the head size the way the config defines them when they are not written",
                compare=recognising(_config_mistakes(config, dtype)))


def _bytes_per_token_cases() -> list[Case]:
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
    return [*(_config_case(*entry) for entry in configs),
            *_bad_config_cases(config_of(MODELS["llama-3-8b"]), 0, 0, "int3")]


def _bad_config_cases(config: dict[str, Any], layers: int, kv_heads: int,
                      dtype: str) -> list[Case]:
    """``config`` without num_hidden_layers, with ``layers`` layers, with ``kv_heads`` KV heads,
    and with the cache dtype ``dtype``: each cannot size a cache."""
    missing = {k: v for k, v in config.items() if k != "num_hidden_layers"}
    bad = [
        ("a config without num_hidden_layers", missing, "auto"),
        (f"num_hidden_layers = {layers}", config | {"num_hidden_layers": layers}, "auto"),
        (f"num_key_value_heads = {kv_heads}", config | {"num_key_value_heads": kv_heads}, "auto"),
        ("an unknown cache dtype", config, dtype),
    ]
    return [
        Case(f"fn(config, cache_dtype={dtype!r})  # {label}", lambda fn, c=c, d=dtype: fn(c, d),
             Raises(ValueError), "a config that cannot size the cache is the caller's mistake: "
             "raise ValueError naming the missing or bad entry (not KeyError, not a number)")
        for label, c, dtype in bad
    ]


def _seeded_config(rng: random.Random, index: int, *, gqa: bool) -> dict[str, Any]:
    """A config.json of a model shape drawn from ``rng``: grouped-query (fewer KV heads than
    query heads) or not, the KV heads and the head size written or implicit."""
    heads = rng.choice([8, 16, 32, 40, 64])
    kv = rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0 and d < heads]) if gqa else heads
    shape = ModelShape(f"seeded-{index}", rng.randint(2, 96), heads, kv,
                       rng.choice([64, 80, 128]), "drawn for a fresh case")
    return config_of(shape, rng.choice(sorted(TORCH_DTYPES)), implicit_kv=not gqa,
                     head_dim=rng.random() < 0.5)


def _bytes_per_token_fresh(seed: int) -> list[Case]:
    """Seeded models: one whose head_dim is not hidden_size / heads, one without
    num_key_value_heads, one whose cache dtype is not its weights'; then each way a config
    cannot size a cache."""
    rng = random.Random(seed)
    odd = _seeded_config(rng, 1, gqa=True) | {"head_dim": rng.choice([96, 160, 256])}
    implicit = _seeded_config(rng, 2, gqa=False)
    recast = _seeded_config(rng, 3, gqa=True)
    weights = TORCH_DTYPES[recast["torch_dtype"]]
    cache = rng.choice([d for d in DTYPE_BYTES if DTYPE_BYTES[d] != DTYPE_BYTES[weights]])
    cases = [_config_case("seeded model 1, head_dim written", odd, "auto"),
             _config_case("seeded model 2: no num_key_value_heads key", implicit, "auto"),
             _config_case(f"seeded model 3, a {cache} cache", recast, cache)]
    return cases + _bad_config_cases(_seeded_config(rng, 4, gqa=True), -rng.randint(0, 8),
                                     -rng.randint(0, 8),
                                     rng.choice(["int3", "int4", "fp12", "fp64", "e5m2"]))


# --- 01.blocks_needed: blocks for a sequence -----------------------------------------------


def _blocks_case(tokens: int, block_size: int) -> Case:
    mistakes = [  # the float slip first: on huge lengths it also looks like rounding down
        (math.ceil(tokens / block_size) if tokens >= 0 else None,
         "stay in integers: a float cannot hold every large integer exactly"),
        (tokens // block_size, "a partly filled last block is still a whole block"),
        (tokens // block_size + 1, "a length that fills its blocks exactly needs no extra block"),
    ]
    return Case(f"fn(tokens={tokens}, block_size={block_size})",
                lambda fn, t=tokens, b=block_size: fn(t, b), blocks_needed(tokens, block_size),
                "a partly filled last block is still a whole block; stay in integers",
                compare=recognising(mistakes))


def _blocks_needed_cases() -> list[Case]:
    pairs = [(900, 16), (896, 16), (1, 16), (16, 16), (17, 16), (0, 16), (1000, 128),
             (2**60 + 1, 16)]
    return [*(_blocks_case(t, b) for t, b in pairs), *bad_length_cases(10, 0, -5, 16)]


def bad_length_cases(tokens: int, bad_size: int, bad_tokens: int,
                     block_size: int) -> list[Case]:
    """A block size below 1, then a negative length: both must raise (chapters 01 and 03)."""
    return [
        Case(f"fn(tokens={tokens}, block_size={bad_size})",
             lambda fn, t=tokens, b=bad_size: fn(t, b), Raises(ValueError),
             "a block of zero tokens is impossible: raise ValueError"),
        Case(f"fn(tokens={bad_tokens}, block_size={block_size})",
             lambda fn, t=bad_tokens, b=block_size: fn(t, b), Raises(ValueError),
             "a negative length is a mistake: raise ValueError naming it"),
    ]


def _blocks_needed_fresh(seed: int) -> list[Case]:
    """An exact multiple, one token past one, some length, an empty and a huge one, and both
    bad inputs, at seeded block sizes."""
    rng = random.Random(seed)
    b = rng.choice([8, 16, 32, 128])
    whole = rng.randint(1, 999) * b
    lengths = [whole, whole + 1, rng.randint(1, 10**6), 0,  # then one a float cannot hold
               b * 2**rng.randint(53, 60) + rng.randint(1, b - 1)]
    return [*(_blocks_case(t, b) for t in lengths),
            *bad_length_cases(rng.randint(1, 999), -rng.randint(0, 16), -rng.randint(1, 999),
                               rng.choice([8, 16, 32, 128]))]


# --- 01.max_requests: requests that fit at a maximum length -----------------------------------


def _max_requests_case(budget: int, per_token: int, max_len: int, block_size: int) -> Case:
    whole = budget // (per_token * block_size)
    mistakes = [  # the slips often agree; the first case tells all three apart
        (whole * block_size // max_len, "a request reserves whole blocks, however few of its "
                                        "last block's slots it could fill: count blocks per "
                                        "request, not tokens"),
        (whole // max(max_len // block_size, 1), "a request reserves whole blocks for max_len "
                                                 "tokens: its partly filled last block counts"),
        (budget // (per_token * max_len), "the budget holds whole blocks only: count its "
                                          "blocks before sharing them out"),
    ]
    return Case(f"fn(budget_bytes={budget}, bytes_per_token={per_token}, max_len={max_len}, "
                f"block_size={block_size})",
                lambda fn, a=(budget, per_token, max_len, block_size): fn(*a),
                capacity(per_token, budget, block_size, max_len).max_requests,
                "the budget holds whole blocks only, and a request reserves whole blocks for "
                "max_len tokens", compare=recognising(mistakes))


def _max_requests_cases() -> list[Case]:
    guide, opt = MODELS["guide-8kv"].bytes_per_token(), MODELS["opt-13b"].bytes_per_token()
    settings = [(1_182_793_728, guide, 1000, 128), (60 * GIB, guide, 8192, 16),
                (14 * GIB, opt, 2048, 16),
                (14 * GIB, opt, 256, 16), (60 * GIB, guide, 1000, 128), (1 * GIB, guide, 8192, 16),
                (60 * GIB, guide, 4000, 128), (3 * GIB - 1, guide, 16, 16)]
    return [*(_max_requests_case(*setting) for setting in settings),
            *_bad_max_requests_cases((GIB, guide, 8192, 16), (-GIB, 0, 0, 0))]


def _bad_max_requests_cases(good: tuple[int, int, int, int],
                            bad: tuple[int, int, int, int]) -> list[Case]:
    """``good`` arguments with one of them, in turn from the last, replaced by its ``bad``."""
    cases = []
    for index in (1, 2, 3, 0):
        b, p, m, s = (*good[:index], bad[index], *good[index + 1:])
        cases.append(Case(f"fn(budget_bytes={b}, bytes_per_token={p}, max_len={m}, "
                          f"block_size={s})", lambda fn, a=(b, p, m, s): fn(*a),
                          Raises(ValueError), "raise ValueError naming the bad argument (every "
                          "argument, not only the first)"))
    return cases


def _max_requests_fresh(seed: int) -> list[Case]:
    """A max_len of whole blocks, one a token past them, a budget a byte short of whole
    blocks, then each argument bad in turn, on a seeded model."""
    rng = random.Random(seed)
    per_token = MODELS[rng.choice(sorted(MODELS))].bytes_per_token()
    block_size = rng.choice([16, 32, 128])
    block_bytes = per_token * block_size
    budget = block_bytes * rng.randint(500, 50_000) + rng.randint(0, block_bytes - 1)
    whole = block_size * rng.randint(2, 64)
    short = block_bytes * rng.randint(500, 50_000) - 1
    return [_max_requests_case(budget, per_token, whole, block_size),
            _max_requests_case(budget, per_token, whole + 1, block_size),
            _max_requests_case(short, per_token, rng.randint(block_size, 64 * block_size),
                               block_size),
            *_bad_max_requests_cases((budget, per_token, whole, block_size),
                                     (-rng.randint(0, GIB), -rng.randint(0, 64),
                                      -rng.randint(0, 8192), -rng.randint(0, 64)))]


# --- 01.predict_vllm_log: predict vLLM's log lines --------------------------------------------


LOG_LABELS = ("GPU KV cache size (tokens)", "Maximum concurrency")


def _log_close(got: Any, want: Any) -> bool:
    """Equal as the log prints them: numbers to within its two decimals, the rest exactly."""
    numbers = (int, float)
    if isinstance(got, numbers) and isinstance(want, numbers) and type(got) is not bool:
        return math.isclose(got, want, rel_tol=0.0, abs_tol=5e-4)
    if isinstance(want, dict) and isinstance(got, dict):
        return first_difference(got, want, _log_close) is None
    return bool(got == want)


def _log_lines(gib: float, per_token: int, block: int, max_len: int, *, gib_bytes: float = GIB,
               whole_blocks: bool = True, request_blocks: float | None = None,
               rounding: Any = round) -> dict[str, Any]:
    """The two numbers of the log, or what a slip (in the keywords) makes of them."""
    blocks = int(gib * gib_bytes // (per_token * block))
    tokens = blocks * block if whole_blocks else int(gib * gib_bytes // per_token)
    per_request = request_blocks if request_blocks is not None else -(-max_len // block)
    return dict(zip(LOG_LABELS, (tokens, rounding(blocks / per_request * 100) / 100),
                    strict=True))


def _predict_case(gib: float, shape: ModelShape, dtype: str, block: int, max_len: int) -> Case:
    per = shape.bytes_per_token(dtype)
    cap = capacity(per, gib * GIB, block, max_len)
    mistakes = [
        (_log_lines(gib, per, block, max_len, gib_bytes=1e9),
         "the log's GiB are 2**30 bytes, not 10**9"),
        (_log_lines(gib, per, block, max_len, request_blocks=max_len / block),
         "a request reserves whole blocks: round max_len up to whole blocks before dividing"),
        (_log_lines(gib, per, block, max_len, rounding=math.floor),
         "the log rounds the concurrency to 2 decimals; it does not cut the rest off"),
        (_log_lines(gib, per, block, max_len, whole_blocks=False),
         "the cache holds whole blocks only: its token count is a whole number of blocks"),
    ]
    return Case(
        f"fn(available_gib={gib}, layers={shape.layers}, kv_heads={shape.kv_heads}, "
        f"head_dim={shape.head_dim}, dtype_bytes={DTYPE_BYTES[dtype]}, block_size={block}, "
        f"max_len={max_len}) -> (GPU KV cache size (tokens), Maximum concurrency)",
        lambda fn, g=gib, s=shape, d=dtype, b=block, m=max_len: labelled(
            LOG_LABELS, fn(g, s.layers, s.kv_heads, s.head_dim, DTYPE_BYTES[d], b, m)),
        dict(zip(LOG_LABELS, (cap.tokens, round(cap.max_concurrency, 2)), strict=True)),
        "the log's GiB are 2**30 bytes; the cache holds whole blocks; concurrency compares "
        "them with the whole blocks one max_len request needs, rounded as the log rounds",
        compare=recognising(mistakes, _log_close))


def _predict_log_cases() -> list[Case]:
    settings = [
        (60.0, MODELS["guide-8kv"], "fp16", 16, 8192),
        (21.5, MODELS["llama-3-8b"], "fp16", 16, 8192),
        (35.25, MODELS["qwen2.5-7b"], "fp16", 16, 32768),
        (10.0, MODELS["mistral-7b"], "fp8", 32, 4096),
        (20.0, MODELS["llama-3-8b"], "fp16", 16, 10_100),
        (7.3, MODELS["llama-2-7b"], "fp16", 16, 4096),
    ]
    return [_predict_case(*setting) for setting in settings]


def _predict_setting(rng: random.Random) -> tuple[float, ModelShape, str, int, int]:
    """A seeded (available GiB, model, dtype, block size, max_len)."""
    return (round(rng.uniform(2, 70), 2), MODELS[rng.choice(sorted(MODELS))],
            rng.choice(["fp16", "fp8"]), rng.choice([16, 32]), rng.randint(1000, 40_000))


def _rounds_up(gib: float, shape: ModelShape, dtype: str, block: int, max_len: int) -> bool:
    """Whether the logged concurrency rounds up, and differs when a request's partly filled
    last block is left out."""
    cap = capacity(shape.bytes_per_token(dtype), gib * GIB, block, max_len)
    shown = round(cap.max_concurrency, 2)
    return (shown > math.floor(cap.max_concurrency * 100) / 100
            and shown != round(cap.blocks / (max_len / block), 2))


def _predict_log_fresh(seed: int) -> list[Case]:
    """Three seeded settings, and one whose concurrency rounds up and counts a partly filled
    last block (drawn until it does)."""
    rng = random.Random(seed)
    settings = [_predict_setting(rng) for _ in range(3)]
    while not _rounds_up(*(setting := _predict_setting(rng))):
        pass
    return [_predict_case(*s) for s in [*settings, setting]]


# --- 01.longest_max_len: the longest request at a required concurrency -------------------------


def longest_max_len(budget_bytes: int, per_token: int, block_size: int, requests: int) -> int:
    """The largest max_len at which ``requests`` full-length reservations fit (from capacity)."""
    check_int("requests", requests, 1)
    blocks = capacity(per_token, budget_bytes, block_size, block_size).blocks
    if blocks < requests:
        raise ValueError(f"{blocks} blocks cannot give each of {requests} requests one block")
    return blocks // requests * block_size


def _longest_case(budget: int, per_token: int, block_size: int, requests: int) -> Case:
    whole = budget // (per_token * block_size)
    mistakes = [
        (budget // per_token // requests, "every request reserves whole blocks: the longest "
                                          "max_len is a whole number of blocks"),
        (whole // requests, "the answer is a length in tokens, not a count of blocks"),
        (-(-whole // requests) * block_size, "all the requests must fit at once: share the "
                                             "blocks out rounding down"),
    ]
    return Case(f"fn(budget_bytes={budget}, bytes_per_token={per_token}, "
                f"block_size={block_size}, requests={requests})",
                lambda fn, a=(budget, per_token, block_size, requests): fn(*a),
                longest_max_len(budget, per_token, block_size, requests),
                "every request must be able to reserve its whole max_len in whole blocks, all "
                "at once; one token more must not fit", compare=recognising(mistakes))


def _longest_cases() -> list[Case]:
    guide, opt = MODELS["guide-8kv"].bytes_per_token(), MODELS["opt-13b"].bytes_per_token()
    settings = [(60 * GIB, guide, 16, 60), (60 * GIB, guide, 16, 64), (60 * GIB, guide, 16, 7),
                (14 * GIB, opt, 16, 8), (14 * GIB, opt, 32, 71), (GIB + 12345, guide, 128, 3),
                (60 * GIB, guide, 16, 30_720)]
    return [*(_longest_case(*setting) for setting in settings),
            *_bad_longest_cases(guide, 16, [(60 * GIB, 30_721, "more requests than blocks"),
                                            (60 * GIB, 0, "zero requests"),
                                            (GIB, -2, "negative requests")])]


def _bad_longest_cases(per_token: int, block_size: int,
                       bad: Sequence[tuple[int, int, str]]) -> list[Case]:
    """``(budget, requests, why)`` settings at which no max_len works."""
    return [
        Case(f"fn(budget_bytes={b}, bytes_per_token={per_token}, block_size={block_size}, "
             f"requests={n})  # {why}",
             lambda fn, a=(b, per_token, block_size, n): fn(*a), Raises(ValueError),
             "no max_len works (or the request count is no count): raise ValueError")
        for b, n, why in bad
    ]


def _longest_fresh(seed: int) -> list[Case]:
    """Three seeded settings, one request per block, then one request too many, zero and a
    negative count."""
    rng = random.Random(seed)
    names = sorted(MODELS)
    cases = []
    for _ in range(3):
        budget = rng.randint(1, 80) * GIB + rng.randint(0, GIB)
        per_token, block_size = MODELS[rng.choice(names)].bytes_per_token(), rng.choice([16, 32])
        blocks = capacity(per_token, budget, block_size, block_size).blocks
        cases.append(_longest_case(budget, per_token, block_size,
                                   rng.randint(1, min(200, blocks))))
    cases.append(_longest_case(budget, per_token, block_size, blocks))
    return cases + _bad_longest_cases(per_token, block_size, [
        (budget, blocks + 1, "more requests than blocks"), (budget, 0, "zero requests"),
        (budget, -rng.randint(1, 99), "negative requests")])


EXERCISES = (
    Exercise("01.bytes_per_token", "KV bytes per token from a config.json",
             _bytes_per_token_cases,
             reference=("course_lib.kv_math.bytes_per_token",
                        "course_lib.kv_math.ModelShape.bytes_per_token",
                        "course_lib.kv_math.capacity", "course_lib.engine.config_from_hf"),
             fresh=_bytes_per_token_fresh),
    Exercise("01.blocks_needed", "Blocks for a sequence", _blocks_needed_cases,
             reference=("course_lib.kv_math.blocks_needed", "course_lib.kv_math.window_blocks",
                        "course_lib.paged.PagedKVManager.blocks_needed"),
             fresh=_blocks_needed_fresh),
    Exercise("01.max_requests", "Requests that fit at a maximum length", _max_requests_cases,
             reference=("course_lib.kv_math.capacity", "course_lib.kv_math.concurrent_requests"),
             fresh=_max_requests_fresh),
    Exercise("01.predict_vllm_log", "Predict vLLM's KV log lines", _predict_log_cases,
             reference=("course_lib.kv_math.capacity", "course_lib.kv_math.vllm_kv_log_lines"),
             fresh=_predict_log_fresh),
    Exercise("01.longest_max_len", "The longest max_len at a required concurrency",
             _longest_cases,
             reference=("course_lib.kv_math.capacity", "course_lib.kv_math.concurrent_requests"),
             fresh=_longest_fresh),
)
