"""Chapter 01: wrong answers, each with the hint its report must show first, and right
answers of other designs. Each wrong answer is a correct design with one slip switched on."""

from __future__ import annotations

import math
from typing import Any

from course_lib.kv_math import GIB, capacity
from tests.mutants import Mutant, Right

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
WEIGHTS = {"float32": 4, "float16": 2, "bfloat16": 2}


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
        if cache_dtype == "auto" or mistake == "weights_dtype":
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
        tokens = int(budget // (2 * layers * kv * dim * size)) if mistake == "tokens" else (
            whole * block)
        return tokens, (math.floor(ratio * 100) / 100 if mistake == "truncate"
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
    """Another design: grow max_len a block at a time while max_requests's sum still allows it."""
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


MUTANTS = [
    Mutant("01.bytes_per_token", "q_heads", config_bytes("q_heads"), "num_key_value_heads"),
    Mutant("01.bytes_per_token", "dim_from_kv", config_bytes("dim_from_kv"),
           "num_key_value_heads"),
    Mutant("01.bytes_per_token", "ignore_head_dim", config_bytes("ignore_head_dim"),
           "writes head_dim means it"),
    Mutant("01.bytes_per_token", "no_two", config_bytes("no_two"), "two vectors"),
    Mutant("01.bytes_per_token", "weights_dtype", config_bytes("weights_dtype"),
           "cache_dtype sets the bytes"),
    Mutant("01.bytes_per_token", "keyerror", config_bytes("keyerror"), "not KeyError"),
    Mutant("01.bytes_per_token", "no_validation", config_bytes("no_validation"),
           "raise ValueError naming the missing or bad entry"),
    Mutant("01.blocks_needed", "floor", blocks("floor"),
           "a partly filled last block is still a whole block"),
    Mutant("01.blocks_needed", "plus_one", blocks("plus_one"), "needs no extra block"),
    Mutant("01.blocks_needed", "float_ceil", blocks("float_ceil"), "a float cannot hold"),
    Mutant("01.blocks_needed", "no_negative_check", blocks("no_negative_check"),
           "a negative length is a mistake"),
    Mutant("01.blocks_needed", "no_block_check", blocks("no_block_check"),
           "a block of zero tokens is impossible"),
    Mutant("01.max_requests", "no_blocks", max_requests("no_blocks"),
           "count its blocks before sharing them out"),
    Mutant("01.max_requests", "floor_len", max_requests("floor_len"),
           "its partly filled last block counts"),
    Mutant("01.max_requests", "tokens_over_len", max_requests("tokens_over_len"),
           "count blocks per request, not tokens"),
    Mutant("01.max_requests", "validate_one", max_requests("validate_one"),
           "every argument, not only the first"),
    Mutant("01.predict_vllm_log", "decimal_gb", predict("decimal_gb"), "not 10**9"),
    Mutant("01.predict_vllm_log", "fractional_blocks", predict("fractional_blocks"),
           "round max_len up to whole blocks"),
    Mutant("01.predict_vllm_log", "truncate", predict("truncate"),
           "it does not cut the rest off"),
    Mutant("01.predict_vllm_log", "tokens", predict("tokens"),
           "its token count is a whole number of blocks"),
    Mutant("01.longest_max_len", "tokens_not_blocks", longest("tokens_not_blocks"),
           "a whole number of blocks"),
    Mutant("01.longest_max_len", "block_count", longest("block_count"),
           "a length in tokens, not a count of blocks"),
    Mutant("01.longest_max_len", "ceil_share", longest("ceil_share"), "rounding down"),
    Mutant("01.longest_max_len", "returns_zero", longest("returns_zero"), "no max_len works"),
    Mutant("01.longest_max_len", "no_request_check", longest("no_request_check"),
           "the request count is no count"),
]

RIGHT = [
    Right("01.bytes_per_token", "the notebook's design", config_bytes()),
    Right("01.blocks_needed", "the notebook's design", blocks()),
    Right("01.max_requests", "the notebook's design", max_requests()),
    Right("01.predict_vllm_log", "the notebook's design", predict()),
    Right("01.longest_max_len", "the notebook's design", longest()),
    Right("01.bytes_per_token", "a table of keys and math.prod", config_bytes_other),
    Right("01.blocks_needed", "divmod", blocks_other),
    Right("01.max_requests", "bytes per reservation", max_requests_other),
    Right("01.predict_vllm_log", "through capacity, as a list", predict_other),
    Right("01.longest_max_len", "a binary search over whole blocks", longest_other),
]
