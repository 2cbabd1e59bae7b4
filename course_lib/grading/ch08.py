"""Chapter 08 exercises: hybrid models, from the arithmetic to the kernel.

Expected values come from the library: ``HybridModel`` (bytes at a length),
``first_needed_block`` (what a window group hands back), ``hit_blocks`` (the prefix-hit rule)
and the fp32 reference with a window (``paged_attention_reference``). Exercises 2 to 4 are
built from a specification alone. Every ``run`` calls only the learner's function on inputs
it carries; the expected values live in each case's ``expected`` (or, for tensors, in the
``Satisfies`` the grader keeps), never in what travels to the learner's kernel.

``fresh(seed)`` draws a few more cases of each exercise from ``random.Random(seed)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from course_lib.attention import kernel_device, paged_attention_reference
from course_lib.grading.ch06 import (
    DecodeInputs,
    Want,
    _decode_inputs,
    _tensor_case,
    _tolerance,
)
from course_lib.grading.check import Case, Exercise, Raises
from course_lib.hybrid import first_needed_block, hit_blocks
from course_lib.kv_math import HYBRID_MODELS, HybridModel

# --- exercise 1: bytes per token at a length ---------------------------------------------------

DTYPE_NAMES = {1: "fp8", 2: "fp16", 4: "fp32"}


def bytes_at(windows: Sequence[int | None], kv_heads: int, head_dim: int, dtype_bytes: int,
             num_tokens: int) -> float:
    """The library's KV bytes per token of a request of ``num_tokens`` tokens."""
    model = HybridModel("exercise", tuple(windows), kv_heads, kv_heads, head_dim, "exercise")
    return model.bytes_per_token(num_tokens, DTYPE_NAMES[dtype_bytes])


_BYTES_HINT = ("a full layer keeps K and V for every token, a window layer only for the last "
               "W tokens (all of them while L <= W); add the layers up, then divide by L")


def _bytes_case(windows: Sequence[int | None], kv_heads: int, head_dim: int, dtype_bytes: int,
                num_tokens: int, label: str) -> Case:
    shown = windows if len(windows) <= 8 else f"{list(windows[:6])} + {len(windows) - 6} more"
    return Case(
        f"fn(windows={shown}, kv_heads={kv_heads}, head_dim={head_dim}, "
        f"dtype_bytes={dtype_bytes}, num_tokens={num_tokens})  # {label}",
        lambda fn, w=tuple(windows): fn(list(w), kv_heads, head_dim, dtype_bytes, num_tokens),
        bytes_at(windows, kv_heads, head_dim, dtype_bytes, num_tokens), _BYTES_HINT)


def _bytes_cases() -> list[Case]:
    oss, gemma = HYBRID_MODELS["gpt-oss-20b"], HYBRID_MODELS["gemma-3-27b"]
    settings = [
        (oss, 100, "gpt-oss-20b, shorter than its window"),
        (oss, 128, "gpt-oss-20b, exactly its window"),
        (oss, 129, "gpt-oss-20b, one past its window"),
        (oss, 8192, "gpt-oss-20b at 8k"),
        (gemma, 1025, "gemma-3-27b, one past its window"),
        (gemma, 131_072, "gemma-3-27b at 128k"),
    ]
    cases = [_bytes_case(m.windows, m.kv_heads, m.head_dim, 2, n, label)
             for m, n, label in settings]
    cases.append(_bytes_case([None, None], 8, 128, 2, 1000, "no window at all: chapter 01"))
    cases.append(_bytes_case([1, None, 1], 2, 64, 1, 50, "windows of one token, fp8"))
    bad = "a request of no tokens has no bytes per token: raise ValueError"
    cases.append(Case("fn(windows=[128, None], kv_heads=8, head_dim=64, dtype_bytes=2, "
                      "num_tokens=0)", lambda fn: fn([128, None], 8, 64, 2, 0),
                      Raises(ValueError), bad))
    cases.append(Case("fn(windows=[0, None], kv_heads=8, head_dim=64, dtype_bytes=2, "
                      "num_tokens=10)", lambda fn: fn([0, None], 8, 64, 2, 10),
                      Raises(ValueError), "a window of 0 tokens attends to nothing: raise "
                      "ValueError naming it"))
    return cases


def _bytes_fresh(seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for index in range(3):
        window = rng.randint(1, 600)
        pattern = [window] * rng.randint(1, 5) + [None]
        layers = rng.randint(2, 40)
        windows = [pattern[i % len(pattern)] for i in range(layers)]
        tokens = rng.choice([window - 1, window, window + 1, rng.randint(1, 50_000)])
        cases.append(_bytes_case(windows, rng.choice([1, 2, 4, 8]), rng.choice([64, 128]),
                                 rng.choice([1, 2, 4]), max(1, tokens), f"drawn {index}"))
    return cases


# --- exercise 2: what a window group hands back before a step -------------------------------------


def freed_by_window(table: Sequence[int], ref_counts: dict[int, int], num_computed: int,
                    window: int, block_size: int) -> tuple[list[int], list[int]]:
    """The table after the window group lets go of what the next chunk will not read, and
    the blocks whose count drops to zero (library rule: ``first_needed_block``)."""
    first = first_needed_block(num_computed, window, block_size)
    after, returned = list(table), []
    for index in range(min(first, len(table))):
        block = after[index]
        if block:
            after[index] = 0
            if ref_counts[block] == 1:
                returned.append(block)
    return after, returned


_FREE_HINT = ("the chunk's first token, at position num_computed, reads positions "
              "num_computed - window + 1 onwards; a block goes only when all its positions lie "
              "before that (floor, not ceil), and it returns to the pool only if no other "
              "sequence still holds it")


def _free_case(table: Sequence[int], refs: dict[int, int], num_computed: int, window: int,
               block_size: int, label: str) -> Case:
    return Case(
        f"fn(table={list(table)}, ref_counts={refs}, num_computed={num_computed}, "
        f"window={window}, block_size={block_size})  # {label}",
        lambda fn, t=tuple(table), r=dict(refs): _listed(
            fn(list(t), dict(r), num_computed, window, block_size)),
        list(freed_by_window(table, refs, num_computed, window, block_size)), _FREE_HINT)


def _listed(result: Any) -> Any:
    """A (table, returned) pair as two lists, whatever sequence types the learner used."""
    if isinstance(result, tuple | list) and len(result) == 2:
        return [list(result[0]), list(result[1])]
    return result


def _free_cases() -> list[Case]:
    table, refs = [5, 9, 2, 7, 4], {5: 1, 9: 1, 2: 1, 7: 1, 4: 1}
    shared = {5: 2, 9: 2, 2: 1, 7: 1, 4: 1}
    cases = [
        _free_case(table, refs, 18, 8, 4, "the chunk at 18 reads 11..: blocks 0 and 1 go"),
        _free_case(table, refs, 16, 8, 4, "reads 9..: blocks 0 and 1 (positions 0..7) go, "
                   "block 2 (8..11) stays"),
        _free_case(table, refs, 15, 8, 4, "reads 8.., a block boundary: blocks 0 and 1 go"),
        _free_case(table, refs, 14, 8, 4, "reads 7..: block 1 still holds position 7"),
        _free_case(table, shared, 18, 8, 4, "blocks 0 and 1 are shared with another request's "
                   "prefix: they leave the table but stay out of the pool"),
        _free_case([0, 0, 2, 7, 4], refs, 19, 5, 4, "blocks 0 and 1 went earlier (null)"),
        _free_case(table, refs, 3, 8, 4, "shorter than the window: nothing goes"),
        _free_case(table, refs, 16, 1, 4, "a window of one token: only the new token's block "
                   "stays"),
        _free_case([3, 6, 8], {3: 1, 6: 1, 8: 1}, 40, 9, 16, "a window smaller than a block, "
                   "reading from a block boundary"),
    ]
    cases.append(Case("fn(table=[5, 9], ref_counts={5: 1, 9: 1}, num_computed=6, window=0, "
                      "block_size=4)", lambda fn: fn([5, 9], {5: 1, 9: 1}, 6, 0, 4),
                      Raises(ValueError), "a window of 0 tokens: raise ValueError"))
    return cases


def _free_fresh(seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for index in range(3):
        block_size = rng.choice([1, 2, 4, 16])
        blocks = rng.randint(1, 12)
        num_computed = rng.randint(0, blocks * block_size - 1)
        window = rng.randint(1, 3 * block_size + 2)
        ids = rng.sample(range(1, 100), blocks)
        refs = {b: rng.choice([1, 1, 2]) for b in ids}
        cases.append(_free_case(ids, refs, num_computed, window, block_size, f"drawn {index}"))
    return cases


# --- exercise 3: the prefix hit across groups --------------------------------------------------

_HIT_HINT = ("a full group needs blocks 0..k-1 cached; a window group only those holding the "
             "W - 1 positions before k x block_size (the first recomputed token reads them "
             "and itself); the hit is the largest k every group serves, and never covers the "
             "prompt's last token")


def _hit_case(cached: Sequence[Sequence[bool]], windows: Sequence[int | None], block_size: int,
              num_tokens: int, label: str) -> Case:
    flags = [[int(f) for f in group] for group in cached]
    return Case(
        f"fn(cached={flags}, windows={list(windows)}, block_size={block_size}, "
        f"num_tokens={num_tokens})  # {label}",
        lambda fn, c=tuple(tuple(bool(f) for f in g) for g in cached), w=tuple(windows): fn(
            [list(g) for g in c], list(w), block_size, num_tokens),
        hit_blocks(cached, windows, block_size, num_tokens) * block_size, _HIT_HINT)


def _hit_cases() -> list[Case]:
    yes, no = True, False
    return [
        _hit_case([[yes] * 6, [yes] * 6], [None, 8], 4, 25, "everything cached"),
        _hit_case([[yes] * 6, [no, no, no, no, yes, yes]], [None, 8], 4, 25,
                  "the window group kept only its last blocks: enough"),
        _hit_case([[yes] * 6, [yes, yes, yes, yes, yes, no]], [None, 8], 4, 25,
                  "the window group lacks block 5: the hit drops to 5 blocks"),
        _hit_case([[yes] * 6, [no, no, yes, no, yes, no]], [None, 8], 4, 25,
                  "scattered window blocks: every k above 0 misses one"),
        _hit_case([[yes] * 6, [no] * 6], [None, 8], 4, 25,
                  "the window group's blocks were all evicted: no hit, however much the full "
                  "group holds"),
        _hit_case([[yes, yes, no, yes, yes, yes], [yes] * 6], [None, 8], 4, 25,
                  "the full group misses block 2"),
        _hit_case([[yes] * 6, [no, no, no, no, no, yes]], [None, 5], 4, 25,
                  "W = 5: 4 positions before k x 4 fit in one block"),
        _hit_case([[yes] * 6, [no, no, no, no, yes, yes]], [None, 5], 4, 24,
                  "24 tokens: the last token is computed, so at most 5 blocks"),
        _hit_case([[yes] * 4, [yes] * 4, [no, no, yes, yes]], [None, 1, 9], 4, 17,
                  "three groups, a window of one token"),
        _hit_case([[no, yes, yes]], [3], 4, 13, "only a window group"),
    ]


def _hit_fresh(seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for index in range(3):
        block_size = rng.choice([2, 4, 8])
        num_tokens = rng.randint(1, 12 * block_size)
        blocks = max(num_tokens - 1, 0) // block_size
        windows = [None] + [rng.randint(1, 3 * block_size) for _ in range(rng.randint(1, 2))]
        cached = [[rng.random() < 0.85 for _ in range(blocks)] for _ in windows]
        cases.append(_hit_case(cached, windows, block_size, num_tokens, f"drawn {index}"))
    return cases


# --- exercise 4: the decode kernel with a window ------------------------------------------------

_WINDOW_HINT = ("the query is the token at position seq_len - 1 and reads positions "
                "max(0, seq_len - window) .. seq_len - 1: start the loop there, mask loads and "
                "scores at both ends; the table's entries before the window are the null block "
                "(NaN here), never read them")


def window_inputs(q_heads: int, kv_heads: int, block_size: int, lens: Sequence[int],
                  window: int, *, seed: int, dtype: torch.dtype = torch.float32) -> DecodeInputs:
    """Chapter 06's NaN-poisoned pool, with every table entry wholly before the window
    pointing at the null block, as a window group's table does."""
    inputs = _decode_inputs(q_heads, kv_heads, block_size, lens, seed=seed, dtype=dtype)
    table = inputs.block_tables.clone()
    for row, length in enumerate(lens):
        table[row, : first_needed_block(length - 1, window, block_size)] = 0
    assert torch.isnan(inputs.k_cache[0]).all()  # the null block holds no token
    return DecodeInputs(inputs.q, inputs.k_cache, inputs.v_cache, table, inputs.seq_lens,
                        inputs.scale)


def _window_case(inputs: DecodeInputs, window: int, label: str) -> Case:
    want = paged_attention_reference(*inputs.on(torch.device("cpu")), window=window)
    return _tensor_case(
        f"fn(q, k_cache, v_cache, block_tables, seq_lens, scale, window={window})  # {label}: "
        f"{inputs.describe()}",
        lambda fn: fn(*inputs.on(kernel_device()), window),
        [Want("out", want, ("b", "h"), "float32")], _WINDOW_HINT,
        *_tolerance(inputs.q.dtype), "paged_attention_reference with the window", kernel=True)


_WINDOW_SETTINGS = (
    # (label, q heads, kv heads, block size, lengths, window, keyword arguments)
    ("GQA group 4, a window smaller than a block", 8, 2, 8, [1, 8, 9, 45], 5, {}),
    ("GQA group 7, a window that is not a multiple of the block", 7, 1, 16, [70, 16], 37, {}),
    ("a window longer than every sequence: full attention", 2, 2, 16, [5, 20], 100, {}),
    ("a window of one token: each query reads only itself", 4, 2, 8, [1, 30], 1, {}),
    ("a window of exactly two blocks", 4, 1, 16, [33, 48, 49], 32, {}),
    ("float16 q and cache", 4, 1, 16, [40, 3], 20, {"dtype": torch.float16}),
)


def _window_cases() -> list[Case]:
    return [_window_case(window_inputs(hq, hkv, b, lens, w, seed=20 + i, **kw), w, label)
            for i, (label, hq, hkv, b, lens, w, kw) in enumerate(_WINDOW_SETTINGS)]


def _window_fresh(seed: int) -> list[Case]:
    rng = random.Random(seed)
    kv_heads = rng.choice([1, 2])
    block_size = rng.choice([4, 8, 16])
    lens = [rng.randint(1, 60) for _ in range(rng.randint(1, 3))]
    window = rng.randint(1, 70)
    inputs = window_inputs(kv_heads * rng.choice([1, 3, 4]), kv_heads, block_size, lens, window,
                           seed=rng.randint(0, 10_000))
    return [_window_case(inputs, window, "drawn")]


# --- registry ------------------------------------------------------------------------------------


def _exercise(name: str, title: str, cases: Callable[[], Sequence[Case]],
              fresh: Callable[[int], Sequence[Case]], reference: tuple[str, ...]) -> Exercise:
    """An Exercise with its fresh cases."""
    return Exercise(name, title, cases, reference=reference, fresh=fresh)


FRESH: dict[str, Callable[[int], Sequence[Case]]] = {
    "08.bytes_at_length": _bytes_fresh,
    "08.window_free": _free_fresh,
    "08.prefix_hit": _hit_fresh,
    "08.windowed_decode": _window_fresh,
}
"""Each exercise's fresh cases, drawn from a seed."""

_HYBRID = ("course_lib.hybrid",)
_KERNELS = ("course_lib.attention.paged_attention_decode", "course_lib.attention.paged_decode",
            "course_lib.attention.triton_kernels", "course_lib.attention.paged_attention_reference",
            "course_lib.attention.gather_paged_kv", "course_lib.attention.reference_attention",
            "course_lib.attention.reference")

EXERCISES = (
    _exercise("08.bytes_at_length", "KV bytes per token of a hybrid model at L tokens",
              _bytes_cases, _bytes_fresh,
              ("course_lib.kv_math.HybridModel.kv_bytes",
               "course_lib.kv_math.HybridModel.bytes_per_token",
               "course_lib.kv_math.HybridModel.blocks_per_request",
               "course_lib.kv_math.window_tokens", "course_lib.kv_math.hybrid_capacity")),
    _exercise("08.window_free", "What a window group hands back, from its specification",
              _free_cases, _free_fresh, _HYBRID),
    _exercise("08.prefix_hit", "The prefix hit across KV-cache groups, from its specification",
              _hit_cases, _hit_fresh, _HYBRID),
    _exercise("08.windowed_decode", "Your chapter 06 decode kernel with a sliding window",
              _window_cases, _window_fresh, _KERNELS),
)
