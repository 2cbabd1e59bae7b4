"""KV-cache arithmetic: bytes per token, model shapes, and what a memory budget holds.

Every number in chapter 01 comes from here. The one formula is

    bytes per token = 2 x layers x kv_heads x head_dim x dtype_bytes

where the 2 counts one key and one value vector per layer. Grouped-query attention (GQA)
shrinks ``kv_heads`` below the number of query heads, and with it the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.validate import check_int, check_positive_number, describe

GIB = 2**30
"""One gibibyte, 1,073,741,824 bytes (the source guide's unit, and vLLM's log unit)."""

DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
"""Bytes per stored number for the cache dtypes a serving engine offers."""


def dtype_bytes(dtype: str) -> int:
    """Bytes per number for a cache dtype name such as ``"fp16"``; unknown names raise."""
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
        known = ", ".join(DTYPE_BYTES)
        raise ValueError(f"unknown dtype {describe(dtype)}; expected one of {known}") from None


def bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str = "fp16") -> int:
    """KV-cache bytes one token occupies across all layers: 2 x L x H_kv x D x bytes."""
    check_int("layers", layers, 1)
    check_int("kv_heads", kv_heads, 1)
    check_int("head_dim", head_dim, 1)
    return 2 * layers * kv_heads * head_dim * dtype_bytes(dtype)


@dataclass(frozen=True)
class ModelShape:
    """The parts of a decoder's shape that size its KV cache, and where they come from."""

    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    source: str

    def __post_init__(self) -> None:
        for field_name in ("layers", "q_heads", "kv_heads", "head_dim"):
            check_int(field_name, getattr(self, field_name), 1)
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"q_heads={self.q_heads} is not a multiple of kv_heads={self.kv_heads}"
            )

    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head (1 = multi-head attention, q_heads = MQA)."""
        return self.q_heads // self.kv_heads

    def bytes_per_token(self, dtype: str = "fp16") -> int:
        """KV bytes per token for this model with the cache stored as ``dtype``."""
        return bytes_per_token(self.layers, self.kv_heads, self.head_dim, dtype)


MODELS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape(
            "guide-8kv", layers=32, q_heads=32, kv_heads=8, head_dim=128,
            source="the source guide's made-up support-chat model",
        ),
        ModelShape(
            "opt-13b", layers=40, q_heads=40, kv_heads=40, head_dim=128,
            source="OPT-13B (hidden 5,120 = 40 heads x 128), the vLLM paper's example",
        ),
        ModelShape(
            "llama-2-7b", layers=32, q_heads=32, kv_heads=32, head_dim=128,
            source="meta-llama/Llama-2-7b-hf config.json (no GQA)",
        ),
        ModelShape(
            "llama-3-8b", layers=32, q_heads=32, kv_heads=8, head_dim=128,
            source="meta-llama/Meta-Llama-3-8B config.json",
        ),
        ModelShape(
            "mistral-7b", layers=32, q_heads=32, kv_heads=8, head_dim=128,
            source="mistralai/Mistral-7B-v0.1 config.json",
        ),
        ModelShape(
            "qwen2.5-7b", layers=28, q_heads=28, kv_heads=4, head_dim=128,
            source="Qwen/Qwen2.5-7B config.json (hidden 3,584 = 28 heads x 128)",
        ),
        ModelShape(
            "llama-3-70b", layers=80, q_heads=64, kv_heads=8, head_dim=128,
            source="meta-llama/Meta-Llama-3-70B config.json",
        ),
        ModelShape(
            "smollm2-135m", layers=30, q_heads=9, kv_heads=3, head_dim=64,
            source="HuggingFaceTB/SmolLM2-135M config.json (hidden 576 = 9 heads x 64)",
        ),
    )
}
"""Model presets by name. Shapes are read from each model's published config.json."""


def model_shape(name: str) -> ModelShape:
    """Look up a preset by name; unknown names raise and list the known ones."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {describe(name)}; "
                         f"expected one of {', '.join(MODELS)}") from None


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
    if type(num_tokens) is not int or type(block_size) is not int \
            or num_tokens < 0 or block_size < 1:  # the checks name what is wrong
        check_int("num_tokens", num_tokens, 0)
        check_int("block_size", block_size, 1)
    return -(-num_tokens // block_size)


def paged_utilization(num_tokens: int, block_size: int) -> float:
    """U_paged = L / (ceil(L / B) * B): the share of one sequence's slots holding tokens."""
    check_int("num_tokens", num_tokens, 1)
    return num_tokens / (blocks_needed(num_tokens, block_size) * block_size)


def contiguous_utilization(tokens: int, max_len: int) -> float:
    """U_contig = L / L_max: the share of a max-length reservation holding real tokens."""
    check_int("tokens", tokens, 1)
    check_int("max_len", max_len, 1)
    if tokens > max_len:
        raise ValueError(f"tokens={tokens} exceeds max_len={max_len}")
    return tokens / max_len


@dataclass(frozen=True)
class Capacity:
    """What a KV budget holds for one model shape, block size and maximum request length."""

    bytes_per_token: int
    budget_bytes: int
    block_size: int
    max_len: int
    blocks: int
    tokens: int
    max_requests: int
    max_concurrency: float

    def as_dict(self) -> dict[str, int | float]:
        """Plain fields for JSON output and tables."""
        return {
            "bytes_per_token": self.bytes_per_token,
            "budget_bytes": self.budget_bytes,
            "block_size": self.block_size,
            "max_len": self.max_len,
            "blocks": self.blocks,
            "tokens": self.tokens,
            "max_requests": self.max_requests,
            "max_concurrency": self.max_concurrency,
        }


def capacity(
    per_token_bytes: int, budget_bytes: int | float, block_size: int = 16, max_len: int = 8192
) -> Capacity:
    """Budget -> whole blocks -> tokens -> requests that fit when each may reach ``max_len``.

    ``blocks`` counts whole blocks (a partial block is useless); ``max_requests`` is how many
    requests fit if each one reserves room for ``max_len`` tokens in whole blocks, and
    ``max_concurrency`` is the same ratio unrounded, which is what vLLM logs as
    "Maximum concurrency for M tokens per request: Yx".
    """
    check_int("bytes_per_token", per_token_bytes, 1)
    budget = check_positive_number("budget_bytes", budget_bytes)
    check_int("max_len", max_len, 1)
    blocks = int(budget // (per_token_bytes * check_int("block_size", block_size, 1)))
    blocks_per_request = blocks_needed(max_len, block_size)
    return Capacity(
        bytes_per_token=per_token_bytes,
        budget_bytes=int(budget),
        block_size=block_size,
        max_len=max_len,
        blocks=blocks,
        tokens=blocks * block_size,
        max_requests=blocks // blocks_per_request,
        max_concurrency=blocks / blocks_per_request,
    )


def concurrent_requests(
    per_token_bytes: int, budget_bytes: int | float, tokens_per_request: int,
    block_size: int | None = None,
) -> int:
    """Requests of ``tokens_per_request`` tokens that fit in the budget at once.

    With ``block_size=None`` each request holds exactly its tokens (a contiguous slab of
    that size); with a block size it holds whole blocks, ceil(L/B) x B slots.
    """
    check_int("bytes_per_token", per_token_bytes, 1)
    budget = check_positive_number("budget_bytes", budget_bytes)
    check_int("tokens_per_request", tokens_per_request, 1)
    slots = (
        tokens_per_request
        if block_size is None
        else blocks_needed(tokens_per_request, block_size) * block_size
    )
    return int(budget // (slots * per_token_bytes))


def vllm_kv_log_lines(
    available_gib: float, shape: ModelShape, dtype: str = "fp16",
    block_size: int = 16, max_len: int = 8192,
) -> list[str]:
    """The KV lines a single-GPU vLLM (v1 engine) startup log shows for these settings.

    vLLM divides the available bytes into whole blocks of ``block_size`` tokens across all
    layers, logs the tokens those blocks hold, and logs how many ``max_len``-token requests
    fit at once. The log prints the budget rounded to 0.01 GiB, so a prediction from the
    printed number can differ from the real log by a block or so.
    """
    if not isinstance(shape, ModelShape):
        raise ValueError(f"shape must be a ModelShape, got {describe(shape)}")
    gib = check_positive_number("available_gib", available_gib)
    cap = capacity(shape.bytes_per_token(dtype), gib * GIB, block_size, max_len)
    return [
        f"Available KV cache memory: {available_gib:.2f} GiB",
        f"GPU KV cache size: {cap.tokens:,} tokens",
        f"Maximum concurrency for {max_len:,} tokens per request: {cap.max_concurrency:.2f}x",
    ]


# --- hybrid models: layers of different attention kinds (chapter 08) ----------------------

FULL = None
"""The window of a full-attention layer: none (it attends to every earlier token)."""


def window_tokens(num_tokens: int, window: int | None) -> int:
    """Tokens one layer keeps K/V for at a request of ``num_tokens`` tokens: all of them for
    full attention, else the last ``window`` (the ones the newest token attends to)."""
    check_int("num_tokens", num_tokens, 0)
    if window is None:
        return num_tokens
    return min(num_tokens, check_int("window", window, 1))


def window_blocks(num_tokens: int, window: int | None, block_size: int) -> int:
    """Blocks one layer holds for a request of ``num_tokens`` tokens when the blocks wholly
    before its last ``window`` tokens have been handed back: the blocks that tokens
    ``num_tokens - window .. num_tokens - 1`` touch (all ceil(L/B) for full attention).

    A window rarely starts on a block boundary, so W tokens can touch ceil(W/B) + 1 blocks.
    """
    check_int("block_size", block_size, 1)
    kept = window_tokens(num_tokens, window)
    if kept == 0:
        return 0
    first = num_tokens - kept
    return (num_tokens - 1) // block_size - first // block_size + 1


GROUPING_RULES = ("vllm", "fill")
"""How ``HybridModel.kv_cache_groups`` splits a model's layers: ``"vllm"`` is vLLM's rule,
``"fill"`` the simpler one chapter 08 compares it with."""


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers of one attention kind that share a block table (vLLM's KV-cache group):
    ``window`` is None for full attention; ``layers`` are the model layers in the group and
    ``slots`` the layers one block has room for (a group with fewer layers is padded)."""

    window: int | None
    layers: tuple[int, ...]
    slots: int

    @property
    def kind(self) -> str:
        """``"full"`` or ``"window W"``, for tables and legends."""
        return "full" if self.window is None else f"window {self.window}"


@dataclass(frozen=True)
class HybridModel:
    """A decoder whose layers differ in attention kind: ``windows[i]`` is layer i's sliding
    window in tokens, or None (``FULL``) for full attention. Every layer has the same KV
    heads and head size, as in the published hybrids."""

    name: str
    windows: tuple[int | None, ...]
    q_heads: int
    kv_heads: int
    head_dim: int
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.windows, tuple) or not self.windows:
            raise ValueError(f"windows must be a non-empty tuple, got {describe(self.windows)}")
        for window in self.windows:
            if window is not None:
                check_int("window", window, 1)
        ModelShape(self.name, len(self.windows), self.q_heads, self.kv_heads, self.head_dim,
                   self.source)  # the same shape checks

    @property
    def layers(self) -> int:
        """Decoder layers."""
        return len(self.windows)

    def layer_counts(self) -> dict[int | None, int]:
        """Layers of each kind (window size, or None for full attention), in first-seen order."""
        counts: dict[int | None, int] = {}
        for window in self.windows:
            counts[window] = counts.get(window, 0) + 1
        return counts

    def layer_bytes_per_token(self, dtype: str = "fp16") -> int:
        """KV bytes one token takes in one layer: 2 x H_kv x D x bytes."""
        return bytes_per_token(1, self.kv_heads, self.head_dim, dtype)

    def all_full(self) -> HybridModel:
        """The same model with full attention in every layer (the comparison chapter 08 draws)."""
        return HybridModel(f"{self.name} (all full)", (FULL,) * self.layers, self.q_heads,
                           self.kv_heads, self.head_dim, self.source)

    def kv_bytes(self, num_tokens: int, dtype: str = "fp16") -> int:
        """Exact KV bytes of one request of ``num_tokens`` tokens: every layer keeps the tokens
        its attention can still reach (all, or the last W)."""
        kept = sum(window_tokens(num_tokens, window) for window in self.windows)
        return kept * self.layer_bytes_per_token(dtype)

    def bytes_per_token(self, num_tokens: int, dtype: str = "fp16") -> float:
        """KV bytes per token at a request of ``num_tokens`` tokens: it falls as L grows,
        towards the full layers' share alone."""
        check_int("num_tokens", num_tokens, 1)
        return self.kv_bytes(num_tokens, dtype) / num_tokens

    def kv_cache_groups(self, rule: str = "vllm") -> tuple[KVCacheGroup, ...]:
        """The layers grouped as vLLM's hybrid manager groups them
        (``_get_kv_cache_groups_uniform_page_size`` in vLLM's ``kv_cache_utils``): every
        group has the same number of layer slots, so one block id names a page of the same
        size in every group. The size is the rarest kind's layer count, or the commonest
        kind's when that is under 1.5 times it (6 full + 5 window layers: two groups of 6,
        not three of 5). A kind of n layers takes ceil(n / size) groups and deals its layers
        round-robin (group i gets ``layers[i::groups]``), so its groups differ by at most one
        layer. ``rule="fill"`` is the simpler rule chapter 08 compares: always the rarest
        kind's count, groups filled in layer order, the last one short."""
        if rule not in GROUPING_RULES:
            raise ValueError(f"unknown rule {describe(rule)}; expected one of "
                             f"{', '.join(GROUPING_RULES)}")
        by_kind: dict[int | None, list[int]] = {}
        for layer, window in enumerate(self.windows):
            by_kind.setdefault(window, []).append(layer)
        counts = [len(layers) for layers in by_kind.values()]
        size = min(counts)
        if rule == "fill":
            return tuple(KVCacheGroup(window, tuple(layers[start:start + size]), size)
                         for window, layers in by_kind.items()
                         for start in range(0, len(layers), size))
        if 2 * max(counts) < 3 * size:  # vLLM: max_num_layers < min_num_layers * 1.5
            size = max(counts)
        groups = []
        for window, layers in by_kind.items():
            count = -(-len(layers) // size)
            groups.extend(KVCacheGroup(window, tuple(layers[i::count]), size)
                          for i in range(count))
        return tuple(groups)

    def block_bytes(self, block_size: int, dtype: str = "fp16") -> int:
        """Bytes of one block of the shared pool: ``block_size`` tokens of every layer slot of
        one group."""
        slots = self.kv_cache_groups()[0].slots
        return check_int("block_size", block_size, 1) * slots * self.layer_bytes_per_token(dtype)

    def blocks_per_request(self, num_tokens: int, block_size: int,
                           window_freeing: bool = True) -> int:
        """Blocks one request of ``num_tokens`` tokens holds across all groups; without
        ``window_freeing`` a window group keeps every block, as a full one does."""
        check_int("num_tokens", num_tokens, 1)
        return sum(
            window_blocks(num_tokens, group.window if window_freeing else None, block_size)
            for group in self.kv_cache_groups()
        )


@dataclass(frozen=True)
class HybridCapacity:
    """What a KV budget holds for a hybrid model at one request length."""

    model: str
    num_tokens: int
    block_size: int
    block_bytes: int
    blocks: int
    kv_bytes_exact: int
    blocks_per_request: int
    blocks_per_request_no_freeing: int
    max_requests: int
    max_requests_no_freeing: int

    def as_dict(self) -> dict[str, int | str]:
        """Plain fields for JSON output and tables."""
        return dict(vars(self))


def hybrid_capacity(model: HybridModel, budget_bytes: int | float, num_tokens: int,
                    block_size: int = 16, dtype: str = "fp16") -> HybridCapacity:
    """Requests of ``num_tokens`` tokens that fit in ``budget_bytes`` at once, with window
    groups handing back the blocks their window has passed, and without."""
    if not isinstance(model, HybridModel):
        raise ValueError(f"model must be a HybridModel, got {describe(model)}")
    budget = check_positive_number("budget_bytes", budget_bytes)
    blocks = int(budget // model.block_bytes(block_size, dtype))
    freeing = model.blocks_per_request(num_tokens, block_size, window_freeing=True)
    keeping = model.blocks_per_request(num_tokens, block_size, window_freeing=False)
    return HybridCapacity(model.name, num_tokens, block_size, model.block_bytes(block_size, dtype),
                          blocks, model.kv_bytes(num_tokens, dtype), freeing, keeping,
                          blocks // freeing, blocks // keeping)


def reserved_blocks(max_model_len: int, window: int | None, block_size: int,
                    max_num_batched_tokens: int) -> int:
    """Blocks vLLM budgets one request in one group when it reports its maximum concurrency
    (``max_memory_usage_bytes`` of vLLM's ``FullAttentionSpec`` and ``SlidingWindowSpec``):
    ceil(L / B) for full attention; for a window, the blocks of a chunked-prefill step, the
    last W - 1 tokens computed plus ``max_num_batched_tokens`` new ones (at most L), one
    more for a window that starts inside a block: ceil(min(W - 1 + T, L) / B) + 1."""
    check_int("max_model_len", max_model_len, 1)
    check_int("block_size", block_size, 1)
    check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
    if window is None:
        return blocks_needed(max_model_len, block_size)
    tokens = min(check_int("window", window, 1) - 1 + max_num_batched_tokens, max_model_len)
    return blocks_needed(tokens, block_size) + 1


def vllm_max_concurrency(model: HybridModel, num_blocks: int, max_model_len: int,
                         max_num_batched_tokens: int, block_size: int = 16) -> float:
    """The "Maximum concurrency for L tokens per request" vLLM logs for ``model`` with
    ``num_blocks`` blocks (``get_max_concurrency_for_kv_cache_config``): the blocks over the
    sum of every group's ``reserved_blocks``. It covers a chunked-prefill step in every
    window group, so it is lower than what the groups hold while they decode
    (``HybridModel.blocks_per_request``)."""
    if not isinstance(model, HybridModel):
        raise ValueError(f"model must be a HybridModel, got {describe(model)}")
    check_int("num_blocks", num_blocks, 0)
    per_request = sum(reserved_blocks(max_model_len, group.window, block_size,
                                      max_num_batched_tokens)
                      for group in model.kv_cache_groups())
    return num_blocks / per_request


def alternating(pattern: tuple[int | None, ...], layers: int) -> tuple[int | None, ...]:
    """Layer windows repeating ``pattern`` over ``layers`` layers (the published configs'
    ``layer_types`` spelt as windows)."""
    check_int("layers", layers, 1)
    return tuple(pattern[i % len(pattern)] for i in range(layers))


HYBRID_MODELS: dict[str, HybridModel] = {
    model.name: model
    for model in (
        HybridModel(
            "gpt-oss-20b", alternating((128, FULL), 24), q_heads=64, kv_heads=8, head_dim=64,
            source="openai/gpt-oss-20b config.json: 24 layers, layer_types alternating "
                   "sliding_attention/full_attention from layer 0, sliding_window 128, "
                   "64 heads, 8 KV heads, head_dim 64",
        ),
        HybridModel(
            "gpt-oss-120b", alternating((128, FULL), 36), q_heads=64, kv_heads=8, head_dim=64,
            source="openai/gpt-oss-120b config.json: 36 layers, layer_types alternating "
                   "sliding_attention/full_attention from layer 0, sliding_window 128, "
                   "64 heads, 8 KV heads, head_dim 64",
        ),
        HybridModel(
            "gemma-3-27b", alternating((1024,) * 5 + (FULL,), 62), q_heads=32, kv_heads=16,
            head_dim=128,
            source="google/gemma-3-27b-it config.json (text_config): 62 layers, "
                   "sliding_window_pattern 6 (five local layers, then one global), "
                   "sliding_window 1024, 32 heads, 16 KV heads, head_dim 128",
        ),
    )
}
"""Published hybrid models by name; figures read from each model's config.json."""


def hybrid_model(name: str) -> HybridModel:
    """Look up a hybrid preset by name; unknown names raise and list the known ones."""
    try:
        return HYBRID_MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown hybrid model {describe(name)}; "
                         f"expected one of {', '.join(HYBRID_MODELS)}") from None
