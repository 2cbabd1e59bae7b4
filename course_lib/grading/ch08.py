"""Chapter 08 exercises: hybrid models, from the arithmetic to the kernel.

Expected values come from the library: ``HybridModel`` (bytes at a length),
``first_needed_block`` (what a window group hands back), ``hit_blocks`` (the prefix-hit rule)
and the fp32 reference with a window (``paged_attention_reference``). ``08.window_free``,
``08.prefix_hit`` and ``08.windowed_decode`` are built from a specification alone. Every
``run`` calls only the learner's function on inputs it carries; the expected values live
in each case's ``expected`` (or, for tensors, in the ``Satisfies`` the grader keeps), never
in what travels to the learner's kernel. A wrong value that a known slip gives is named by
that slip's hint (``recognising``; for the kernel, ``WindowMatch``), computed on the grader's
side too.

``fresh(seed)`` draws from ``random.Random(seed)`` a case of every kind the fixed ones hold
(each boundary, each slip's telling input, each input that must raise), so an answer that
copies what ``check`` showed earns nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from course_lib.attention import kernel_device, paged_attention_reference
from course_lib.grading.ch06 import (
    _WIDE_HINT,
    DecodeInputs,
    TensorMatch,
    Want,
    WideInputs,
    _decode_inputs,
    _drawn_wide_inputs,
    _tensor_case,
    _tolerance,
    _wide_offset_inputs,
)
from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    Satisfies,
    labelled,
    naming_type,
    recognising,
)
from course_lib.hybrid import first_needed_block, hit_blocks
from course_lib.kv_math import HYBRID_MODELS, HybridModel, bytes_per_token

# --- 08.bytes_at_length: bytes per token at a length -------------------------------------------

DTYPE_NAMES = {1: "fp8", 2: "fp16", 4: "fp32"}


def bytes_at(windows: Sequence[int | None], kv_heads: int, head_dim: int, dtype_bytes: int,
             num_tokens: int) -> float:
    """The library's KV bytes per token of a request of ``num_tokens`` tokens."""
    model = HybridModel("exercise", tuple(windows), kv_heads, kv_heads, head_dim, "exercise")
    return model.bytes_per_token(num_tokens, DTYPE_NAMES[dtype_bytes])


_BYTES_HINT = ("a full layer keeps K and V for every token, a window layer only for the last "
               "W tokens (all of them while L <= W); add the layers up, then divide by L")
OFF_BY_ONE_WINDOW = ("a window layer keeps exactly W tokens: the newest and the W - 1 before it, "
                     "not W + 1 or W - 1")
WINDOW_IGNORED = ("a window layer keeps K and V only for its last W tokens, not for the whole "
                  "request: that is what makes bytes per token fall as L grows")
WINDOW_NOT_FULL_YET = ("while L <= W a window layer holds all L tokens, no more: min(L, W), "
                       "not W")
NOT_PER_TOKEN = "bytes PER TOKEN: divide the request's total bytes by L"
K_AND_V = ("every layer keeps a key AND a value vector for each KV head: 2 x kv_heads x "
           "head_dim x dtype_bytes for each token it keeps")


def _bytes_mistakes(windows: Sequence[int | None], kv_heads: int, head_dim: int,
                    dtype_bytes: int, num_tokens: int) -> list[tuple[float, str]]:
    """What each recognised slip gives for these layers at ``num_tokens``, with its hint."""
    args = (kv_heads, head_dim, dtype_bytes, num_tokens)
    right = bytes_at(windows, *args)
    per_layer = bytes_per_token(1, kv_heads, head_dim, DTYPE_NAMES[dtype_bytes])
    mistakes = [(bytes_at([None if w is None else w + 1 for w in windows], *args),
                 OFF_BY_ONE_WINDOW)]
    if all(w is None or w > 1 for w in windows):
        mistakes.append((bytes_at([None if w is None else w - 1 for w in windows], *args),
                         OFF_BY_ONE_WINDOW))
    return [*mistakes,
            (bytes_at([None] * len(windows), *args), WINDOW_IGNORED),
            (per_layer * sum(num_tokens if w is None else w for w in windows) / num_tokens,
             WINDOW_NOT_FULL_YET),
            (right * num_tokens, NOT_PER_TOKEN),
            (right / 2, K_AND_V)]


def _bytes_call(windows: Sequence[int | None], kv_heads: int, head_dim: int, dtype_bytes: int,
                num_tokens: int) -> str:
    shown = windows if len(windows) <= 8 else f"{list(windows[:6])} + {len(windows) - 6} more"
    return (f"fn(windows={shown}, kv_heads={kv_heads}, head_dim={head_dim}, "
            f"dtype_bytes={dtype_bytes}, num_tokens={num_tokens})")


def _bytes_case(windows: Sequence[int | None], kv_heads: int, head_dim: int, dtype_bytes: int,
                num_tokens: int, label: str) -> Case:
    args = (kv_heads, head_dim, dtype_bytes, num_tokens)
    return Case(
        f"{_bytes_call(windows, *args)}  # {label}",
        lambda fn, w=tuple(windows): fn(list(w), kv_heads, head_dim, dtype_bytes, num_tokens),
        bytes_at(windows, *args), _BYTES_HINT,
        compare=recognising(_bytes_mistakes(windows, *args)))


NO_TOKENS = "a request of no tokens has no bytes per token: raise ValueError"


def _bytes_raises(windows: Sequence[int | None], kv_heads: int, head_dim: int,
                  dtype_bytes: int, num_tokens: int, hint: str) -> Case:
    """A case whose inputs must raise ValueError (as the library does for them)."""
    return Case(_bytes_call(windows, kv_heads, head_dim, dtype_bytes, num_tokens),
                lambda fn, w=tuple(windows): fn(list(w), kv_heads, head_dim, dtype_bytes,
                                                num_tokens),
                Raises(ValueError), hint)


def _bytes_cases() -> list[Case]:
    oss, gemma = HYBRID_MODELS["gpt-oss-20b"], HYBRID_MODELS["gemma-3-27b"]
    settings = [
        (oss, 8192, "gpt-oss-20b at 8k: its window layers hold 128 of the 8192 tokens"),
        (oss, 100, "gpt-oss-20b, shorter than its window"),
        (oss, 128, "gpt-oss-20b, exactly its window"),
        (oss, 129, "gpt-oss-20b, one past its window"),
        (gemma, 1025, "gemma-3-27b, one past its window"),
        (gemma, 131_072, "gemma-3-27b at 128k"),
    ]
    cases = [_bytes_case(m.windows, m.kv_heads, m.head_dim, 2, n, label)
             for m, n, label in settings]
    cases.append(_bytes_case([None, None], 8, 128, 2, 1000, "no window at all: chapter 01"))
    cases.append(_bytes_case([1, None, 1], 2, 64, 1, 50, "windows of one token, fp8"))
    cases.append(_bytes_raises([128, None], 8, 64, 2, 0, NO_TOKENS))
    cases.append(_bytes_raises([0, None], 8, 64, 2, 10, "a window of 0 tokens attends to "
                               "nothing: raise ValueError naming it"))
    return cases


def _drawn_layers(rng: random.Random, window: int | None) -> list[int | None]:
    """2 to 40 layers: runs of 1 to 5 layers of ``window`` between full ones."""
    pattern = [window] * rng.randint(1, 5) + [None]
    return [pattern[i % len(pattern)] for i in range(rng.randint(2, 40))]


def _drawn_shape(rng: random.Random) -> tuple[int, int, int]:
    """KV heads, head size and bytes per number."""
    return rng.choice([1, 2, 4, 8]), rng.choice([64, 128, 256]), rng.choice([1, 2, 4])


def _bytes_fresh(seed: int) -> list[Case]:
    """A drawn window and request lengths about it (shorter, exactly, one past, far past),
    no window at all, windows of one token, and both kinds of input that must raise."""
    rng = random.Random(seed)
    window = rng.randint(2, 2000)
    lengths = [(rng.randint(1, window - 1), "shorter than the window"),
               (window, "exactly the window"), (window + 1, "one past the window"),
               (rng.randint(2 * window, 200_000), "far past the window")]
    cases = [_bytes_case(_drawn_layers(rng, window), *_drawn_shape(rng), tokens, label)
             for tokens, label in lengths]
    cases.append(_bytes_case([None] * rng.randint(1, 40), *_drawn_shape(rng),
                             rng.randint(1, 50_000), "no window at all"))
    cases.append(_bytes_case(_drawn_layers(rng, 1), *_drawn_shape(rng), rng.randint(2, 5000),
                             "windows of one token"))
    cases.append(_bytes_raises(_drawn_layers(rng, window), *_drawn_shape(rng),
                               rng.choice([0, -rng.randint(1, 1000)]), NO_TOKENS))
    layers = _drawn_layers(rng, window)[:8]  # all shown in the call
    layers[rng.randrange(len(layers))] = rng.choice([0, -rng.randint(1, 100)])
    cases.append(_bytes_raises(layers, *_drawn_shape(rng), rng.randint(1, 50_000),
                               "a window below 1 token attends to nothing: raise ValueError "
                               "naming it"))
    return cases


# --- 08.window_free: what a window group hands back before a step ---------------------------------


def freed_by_window(table: Sequence[int], ref_counts: dict[int, int], num_computed: int,
                    window: int, block_size: int) -> tuple[list[int], list[int]]:
    """The table after the window group lets go of what the next chunk will not read, and
    the blocks whose count drops to zero (library rule: ``first_needed_block``)."""
    return _let_go(table, ref_counts, first_needed_block(num_computed, window, block_size))


def _let_go(table: Sequence[int], ref_counts: dict[int, int], first: int, *,
            shared_freed: bool = False, shared_kept: bool = False
            ) -> tuple[list[int], list[int]]:
    """The table with its entries before ``first`` made null, and the blocks that return to
    the pool; the flags are two slips with shared blocks (for the hints)."""
    after, returned = list(table), []
    for index in range(min(first, len(table))):
        block = after[index]
        if block:
            alone = ref_counts[block] == 1
            if alone or not shared_kept:
                after[index] = 0
            if alone or shared_freed:
                returned.append(block)
    return after, returned


_FREE_HINT = ("the chunk's first token, at position num_computed, reads positions "
              "num_computed - window + 1 onwards; a block goes only when all its positions lie "
              "before that (floor, not ceil), and it returns to the pool only if no other "
              "sequence still holds it")
OFF_BY_ONE_READ = ("the chunk's first token, at position num_computed, reads the window "
                   "positions num_computed - window + 1 .. num_computed (itself and the "
                   "window - 1 before it): a window off by one frees one position too many or "
                   "too few")
CEIL_BLOCK = ("a block goes only when ALL its positions lie before the first one read: "
              "floor((num_computed - window + 1) / block_size) blocks, not ceil (the block "
              "holding that position is still read)")
WHOLE_BLOCKS = ("the window is window POSITIONS, not window // block_size whole blocks behind the "
                "chunk's block: the chunk's first token reads from position num_computed - "
                "window + 1, which need not start a block; the first block kept is the one "
                "holding it, floor((num_computed - window + 1) / block_size)")
SHARED_FREED = ("a block another sequence still holds (ref count above 1) leaves this table "
                "but does not return to the pool: return only the blocks whose count drops to "
                "zero")
SHARED_KEPT = ("a shared block leaves this table too (the null block 0 in its place): this "
               "window no longer reads it; only its return to the pool waits for its last "
               "holder")
TABLE_LENGTH = ("the table keeps its length: put the null block 0 in place of each entry let "
                "go, so logical block i stays at index i")
NULL_SKIPPED = ("entries already 0 are the null block: the window let them go earlier; skip "
                "them (the null block has no ref count and never returns to the pool)")


def _free_mistakes(table: Sequence[int], refs: dict[int, int], num_computed: int, window: int,
                   block_size: int) -> list[tuple[Any, str]]:
    """What each recognised slip gives for these inputs, with its hint."""
    first = first_needed_block(num_computed, window, block_size)
    right = _let_go(table, refs, first)
    ceil = -(-max(0, num_computed - window + 1) // block_size)  # ceil, in integers
    whole = max(0, num_computed // block_size - window // block_size)
    # A wrong first block is one block off, so slips share values: window + 1 first (the
    # whole-block count can agree with it), the whole-block count before ceil (with which it
    # agrees wherever it is wrong and the window is no multiple of a block), and both before
    # window - 1 (which can agree with ceil); the fixed cases put a case that tells each
    # slip before any where a slip listed ahead of it gives the same value.
    mistakes = [(_let_go(table, refs, first_needed_block(num_computed, window + 1, block_size)),
                 OFF_BY_ONE_READ),
                (_let_go(table, refs, whole), WHOLE_BLOCKS),
                (_let_go(table, refs, ceil), CEIL_BLOCK)]
    if window > 1:
        mistakes.append((_let_go(table, refs, first_needed_block(num_computed, window - 1,
                                                                 block_size)), OFF_BY_ONE_READ))
    return [(_listed(value), hint) for value, hint in [
        *mistakes,
        (_let_go(table, refs, first, shared_freed=True), SHARED_FREED),
        (_let_go(table, refs, first, shared_kept=True), SHARED_KEPT),
        ((table[first:], right[1]), TABLE_LENGTH),
        ((right[0], [b for b in table[:first] if b == 0 or refs[b] == 1]), NULL_SKIPPED)]]


def _free_case(table: Sequence[int], refs: dict[int, int], num_computed: int, window: int,
               block_size: int, label: str, hints: dict[str, str] | None = None) -> Case:
    return Case(
        f"fn(table={list(table)}, ref_counts={refs}, num_computed={num_computed}, "
        f"window={window}, block_size={block_size})  # {label}",
        lambda fn, t=tuple(table), r=dict(refs): _listed(
            fn(list(t), dict(r), num_computed, window, block_size)),
        _listed(freed_by_window(table, refs, num_computed, window, block_size)), _FREE_HINT,
        compare=recognising(_free_mistakes(table, refs, num_computed, window, block_size)),
        hints=hints or {})


def _listed(result: Any) -> Any:
    """A (table, returned) pair as two labelled lists, whatever sequence types the learner
    used, so that a report names the part that differs (``table[2]: got 0, expected 2``)."""
    if isinstance(result, tuple | list) and len(result) == 2:
        return labelled(("table", "returned"), [list(result[0]), list(result[1])])
    return result


def _free_raises(table: Sequence[int], refs: dict[int, int], num_computed: int, window: int,
                 block_size: int, hint: str) -> Case:
    """A case whose inputs must raise ValueError (as the library does for them)."""
    return Case(f"fn(table={list(table)}, ref_counts={refs}, num_computed={num_computed}, "
                f"window={window}, block_size={block_size})",
                lambda fn, t=tuple(table), r=dict(refs): fn(list(t), dict(r), num_computed,
                                                            window, block_size),
                Raises(ValueError), hint)


BAD_WINDOW = "a window below 1 token reads nothing: raise ValueError naming it"
BAD_BLOCK_SIZE = ("a block size below 1 holds no position: raise ValueError naming it (before "
                  "dividing by it: not a ZeroDivisionError)")
BAD_COMPUTED = ("a negative num_computed is no position of the sequence: raise ValueError "
                "naming it, do not return the table unchanged")


def _free_cases() -> list[Case]:
    table, refs = [5, 9, 2, 7, 4], {5: 1, 9: 1, 2: 1, 7: 1, 4: 1}
    shared = {5: 2, 9: 2, 2: 1, 7: 1, 4: 1}
    return [
        _free_case(table, refs, 18, 8, 4, "the chunk at 18 reads 11..: blocks 0 and 1 go"),
        _free_case(table, refs, 16, 8, 4, "reads 9..: blocks 0 and 1 (positions 0..7) go, "
                   "block 2 (8..11) stays"),
        _free_case(table, refs, 16, 7, 4, "a window of 7 positions, no whole number of "
                   "blocks: reads 10.., so block 2 (8..11) stays"),
        _free_case(table, refs, 15, 8, 4, "reads 8.., a block boundary: blocks 0 and 1 go"),
        _free_case(table, refs, 14, 8, 4, "reads 7..: block 1 still holds position 7"),
        _free_case(table, shared, 18, 8, 4, "blocks 0 and 1 are shared with another request's "
                   "prefix: they leave the table but stay out of the pool"),
        _free_case([0, 0, 2, 7, 4], refs, 19, 5, 4, "blocks 0 and 1 went earlier (null)",
                   {"raised": NULL_SKIPPED}),
        _free_case(table, refs, 3, 8, 4, "shorter than the window: nothing goes"),
        _free_case(table, refs, 16, 1, 4, "a window of one token: only the new token's block "
                   "stays"),
        _free_case([3, 6, 8], {3: 1, 6: 1, 8: 1}, 40, 9, 16, "a window smaller than a block, "
                   "reading from a block boundary"),
        _free_raises([5, 9], {5: 1, 9: 1}, 6, 0, 4, BAD_WINDOW),
        _free_raises([5, 9], {5: 1, 9: 1}, 6, 3, 0, BAD_BLOCK_SIZE),
        _free_raises([5, 9], {5: 1, 9: 1}, -2, 3, 4, BAD_COMPUTED),
    ]


def _drawn_free(rng: random.Random, num_computed: int, window: int, block_size: int,
                label: str, *, shared: bool = False, nulls: bool = False) -> Case:
    """A table with room for the chunk's first token, of drawn block ids; with ``shared``
    some blocks the window lets go are held by another sequence too, with ``nulls`` the
    first of them went earlier (null)."""
    ids = rng.sample(range(1, 100), num_computed // block_size + 1 + rng.randint(0, 2))
    first = first_needed_block(num_computed, window, block_size)
    refs = {block: 1 for block in ids}
    if shared:
        for block in rng.sample(ids[:first], rng.randint(1, first - 1)):
            refs[block] = rng.randint(2, 3)
    if nulls:
        for index in range(rng.randint(1, first - 1)):
            del refs[ids[index]]
            ids[index] = 0
    return _free_case(ids, refs, num_computed, window, block_size, label,
                      {"raised": NULL_SKIPPED} if nulls else None)


def _drawn_read(rng: random.Random, size: int, blocks: int, offset: int, label: str,
                **flags: bool) -> Case:
    """A drawn window whose chunk reads from ``offset`` into logical block ``blocks``."""
    window = rng.randint(1, 3 * size)
    return _drawn_free(rng, blocks * size + offset + window - 1, window, size, label, **flags)


def _drawn_whole_blocks(rng: random.Random) -> Case:
    """A window of no whole number of blocks whose first read lies in the block before the
    one ``window // block_size`` blocks behind the chunk's: counted in whole blocks, that
    block would go."""
    size = rng.choice([4, 8, 16])
    part = rng.randint(2, size - 1)  # window % size
    behind = rng.randint(0, 2)  # window // size
    window = behind * size + part
    num_computed = rng.randint(behind + 1, behind + 6) * size + rng.randint(0, part - 2)
    return _drawn_free(rng, num_computed, window, size,
                       "a window of no whole number of blocks")


def _free_fresh(seed: int) -> list[Case]:
    """The chunk's first read inside a block, on a block boundary, a window of no whole
    number of blocks, shared blocks, null entries, shorter than the window, a window below a
    block, and each input that must raise, all drawn."""
    rng = random.Random(seed)
    size = rng.choice([2, 4, 8, 16])
    short = rng.randint(2, 3 * size)
    cases = [
        _drawn_whole_blocks(rng),
        _drawn_read(rng, size, rng.randint(1, 6), rng.randint(1, size - 1),
                    "reads from inside a block"),
        _drawn_read(rng, size, rng.randint(1, 6), 0, "reads from a block boundary"),
        _drawn_read(rng, size, rng.randint(2, 6), rng.randint(0, size - 1),
                    "some blocks are shared with another request's prefix", shared=True),
        _drawn_read(rng, size, rng.randint(2, 6), rng.randint(0, size - 1),
                    "the first blocks went earlier (null)", nulls=True),
        _drawn_free(rng, rng.randint(0, short - 1), short, size,
                    "shorter than the window: nothing goes"),
        _drawn_free(rng, rng.randint(size, 8 * size), rng.randint(1, size - 1), size,
                    "a window smaller than a block"),
    ]
    table = rng.sample(range(1, 100), rng.randint(1, 6))
    refs = {block: 1 for block in table}
    computed = rng.randint(0, len(table) * size - 1)
    return [*cases,
            _free_raises(table, refs, computed, rng.choice([0, -rng.randint(1, 50)]), size,
                         BAD_WINDOW),
            _free_raises(table, refs, computed, rng.randint(1, 3 * size),
                         rng.choice([0, -rng.randint(1, 16)]), BAD_BLOCK_SIZE),
            _free_raises(table, refs, -rng.randint(1, 50), rng.randint(1, 3 * size), size,
                         BAD_COMPUTED)]


# --- 08.prefix_hit: the prefix hit across groups -----------------------------------------------

_HIT_HINT = ("a full group needs blocks 0..k-1 cached; a window group only those holding the "
             "W - 1 positions before k x block_size (the first recomputed token reads them "
             "and itself); the hit is the largest k every group serves, and never covers the "
             "prompt's last token")
HIT_SAME_K = ("every group must serve the SAME k: a k that each group serves on its own, "
              "taken group by group (the smallest of their best), need not be served by all")
HIT_EVERY_GROUP = ("every group must serve the hit, the window groups too: a window group "
                   "needs the blocks holding the W - 1 positions before k x block_size, and "
                   "when it lacks them the hit is shorter, however much the full group holds")
HIT_W_MINUS_ONE = ("the first recomputed token reads W positions, itself and the W - 1 before "
                   "it: a window group needs the blocks of those W - 1 positions, not of W")
HIT_NOT_MONOTONE = ("a window group needs only the blocks its window reads: it may lack "
                    "earlier blocks (it let them go) and still serve a longer hit, so do not "
                    "stop at the first k that fails; try k from the largest down")
HIT_LAST_TOKEN = ("the prompt's last token is always computed (it yields the first output "
                  "token), so the hit never covers it: at most (num_tokens - 1) // block_size "
                  "blocks")
HIT_IN_TOKENS = "return the hit in tokens: k full blocks are k x block_size tokens"
HIT_AN_INT = ("return an int: the hit is k x block_size tokens, a whole number (integer "
              "arithmetic, not / or a float)")


def _hit_mistakes(cached: Sequence[Sequence[bool]], windows: Sequence[int | None],
                  block_size: int, num_tokens: int) -> list[tuple[int, str]]:
    """What each recognised slip gives for these groups (in tokens), with its hint; the
    first that matches wins, so a slip comes before any other that can give its value on
    the case that first tells it apart."""
    def hit(flags: Sequence[Sequence[bool]], spans: Sequence[int | None],
            tokens: int = num_tokens) -> int:
        return hit_blocks(flags, spans, block_size, tokens) * block_size

    mistakes = [
        (min(hit([f], [w]) for f, w in zip(cached, windows, strict=True)), HIT_SAME_K),
        (hit([f if w is None else [True] * len(f) for f, w in zip(cached, windows, strict=True)],
             windows), HIT_EVERY_GROUP),
        (hit(cached, [None if w is None else w + 1 for w in windows]), HIT_W_MINUS_ONE),
        (hit(cached, [None] * len(windows)), HIT_NOT_MONOTONE),
        (hit(cached, windows) // block_size, HIT_IN_TOKENS),
    ]
    if all(len(flags) >= num_tokens // block_size for flags in cached):
        mistakes.append((hit(cached, windows, num_tokens + 1), HIT_LAST_TOKEN))
    return mistakes


def _hit_case(cached: Sequence[Sequence[bool]], windows: Sequence[int | None], block_size: int,
              num_tokens: int, label: str) -> Case:
    flags = [[int(f) for f in group] for group in cached]
    return Case(
        f"fn(cached={flags}, windows={list(windows)}, block_size={block_size}, "
        f"num_tokens={num_tokens})  # {label}",
        lambda fn, c=tuple(tuple(bool(f) for f in g) for g in cached), w=tuple(windows): fn(
            [list(g) for g in c], list(w), block_size, num_tokens),
        hit_blocks(cached, windows, block_size, num_tokens) * block_size, _HIT_HINT,
        compare=naming_type(recognising(_hit_mistakes(cached, windows, block_size, num_tokens)),
                        HIT_AN_INT))


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
        _hit_case([[yes, yes, yes, no, yes, yes], [no, no, no, no, yes, yes]], [None, 8], 4, 25,
                  "the full group serves 3 blocks and the window group 6, but no k both: no "
                  "hit"),
        _hit_case([[yes] * 6, [no, no, no, no, no, yes]], [None, 5], 4, 25,
                  "W = 5: 4 positions before k x 4 fit in one block"),
        _hit_case([[yes] * 6, [no, no, no, no, yes, yes]], [None, 5], 4, 24,
                  "24 tokens: the last token is computed, so at most 5 blocks"),
        _hit_case([[yes] * 4, [yes] * 4, [no, no, yes, yes]], [None, 1, 9], 4, 17,
                  "three groups, a window of one token"),
        _hit_case([[no, yes, yes]], [3], 4, 13, "only a window group"),
    ]


def _needed_only(blocks: int, first: int) -> list[bool]:
    """A window group's flags that hold blocks ``first`` .. ``blocks - 1`` and no earlier one."""
    return [index >= first for index in range(blocks)]


def _hit_all_cached(rng: random.Random, size: int) -> Case:
    """Every block cached and the prompt an exact number of blocks: the last one is not hit."""
    blocks = rng.randint(2, 10)
    windows = [None, rng.randint(1, 3 * size), *([1] * rng.randint(0, 1))]
    return _hit_case([[True] * blocks for _ in windows], windows, size, blocks * size,
                     "everything cached, the prompt a whole number of blocks")


def _hit_window_needs(rng: random.Random, size: int) -> Case:
    """The window group holds exactly the blocks of the W - 1 positions before the hit; W - 1
    is a whole number of blocks, so a window of W positions would need one more."""
    blocks = rng.randint(3, 10)
    behind = min(rng.randint(1, 2), blocks - 2)
    window = 1 + behind * size
    return _hit_case([[True] * blocks, _needed_only(blocks, blocks - behind)], [None, window],
                     size, blocks * size + rng.randint(1, size),
                     "the window group kept only the blocks the hit needs")


def _hit_no_common(rng: random.Random, size: int) -> Case:
    """The full group serves up to k1 blocks, the window group only a longer hit: no k both."""
    blocks = rng.randint(4, 10)
    window = rng.randint(2, min(3 * size, (blocks - 1) * size))
    first = first_needed_block(blocks * size, window, size)
    served = rng.randint(1, first)
    full = [index != served and (index < served or rng.random() < 0.7)
            for index in range(blocks)]
    return _hit_case([full, _needed_only(blocks, first)], [None, window], size,
                     blocks * size + rng.randint(1, size),
                     "each group serves a hit of its own, but no k both")


def _hit_drawn(rng: random.Random, size: int, windows: list[int | None], label: str) -> Case:
    """Drawn flags, most blocks cached, for groups of ``windows``."""
    num_tokens = rng.randint(1, 12 * size)
    blocks = max(num_tokens - 1, 0) // size
    cached = [[rng.random() < 0.85 for _ in range(blocks)] for _ in windows]
    return _hit_case(cached, windows, size, num_tokens, label)


def _hit_fresh(seed: int) -> list[Case]:
    """Everything cached, a window group holding just what the hit needs, groups with hits
    of their own but none in common, and drawn flags (a full group with window groups, and
    window groups alone)."""
    rng = random.Random(seed)
    size = rng.choice([2, 4, 8])
    return [
        _hit_all_cached(rng, size), _hit_window_needs(rng, size), _hit_no_common(rng, size),
        _hit_drawn(rng, size, [None, *(rng.randint(1, 3 * size)
                                       for _ in range(rng.randint(1, 2)))], "drawn flags"),
        _hit_drawn(rng, size, [rng.randint(1, 3 * size) for _ in range(rng.randint(1, 2))],
                   "only window groups, drawn flags"),
    ]


# --- 08.windowed_decode: the decode kernel with a window ----------------------------------------

_WINDOW_HINT = ("the query is the token at position seq_len - 1 and reads positions "
                "max(0, seq_len - window) .. seq_len - 1: start the loop there, mask loads and "
                "scores at both ends; the table's entries before the window are the null block "
                "(NaN here), never read them")
WINDOW_IGNORED_KERNEL = ("only the last window positions are read: start the loop at "
                         "max(0, seq_len - window), not at 0")
WINDOW_OFF_BY_ONE = ("the query at position seq_len - 1 reads exactly window positions, "
                     "max(0, seq_len - window) .. seq_len - 1: the window is off by one")
WINDOW_BLOCK_START = ("a window rarely starts on a block boundary: mask the positions before "
                      "max(0, seq_len - window) inside the block that holds it")
NULL_READ = ("NaN: a tile before the window was read: its positions are all masked, so its "
             "scores are all -inf and exp(-inf - (-inf)) is NaN, and its table entries may be "
             "the null block (NaN here): start the loop at max(0, seq_len - window) and mask "
             "the loads as well as the scores; if it starts there, no position was kept at all "
             "(l = 0, acc / l = 0 / 0): keep each position of the window")
NOTHING_ATTENDED = ("nothing was attended: no position of the window was kept (every score "
                    "masked, or the loop never ran), so l stayed 0 and the row is 0 / 0, NaN, "
                    "or zero where l was guarded: the loop runs over max(0, seq_len - window) "
                    ".. seq_len - 1 and keeps each of those positions")


@dataclass(frozen=True)
class WindowMatch(TensorMatch):
    """Chapter 06's tensor judge, which also names a window's slips by the output they give
    (``mistakes``: each slip's output on the case's inputs, and its hint). A row of zeros
    attended to nothing (the sum l guarded); a NaN row is the case's ``targeted`` mistake (a
    64-bit offset) where it has one, else it read a tile before the window, unless nothing
    lies before the window (``covered[b]``: sequence b is no longer than the window), when
    it attended to nothing (0 / 0)."""

    mistakes: tuple[tuple[torch.Tensor, str], ...] = ()
    covered: tuple[bool, ...] = ()

    def _recognised(self, want: Want, index: tuple[int, ...], row: torch.Tensor,
                    expected: torch.Tensor) -> str:
        for value, hint in self.mistakes:
            wrong = value[index].double()
            close = torch.allclose(row, wrong, rtol=self.rtol, atol=self.atol)
            if (close and wrong.isfinite().all()
                    and not torch.allclose(wrong, expected, rtol=self.rtol, atol=self.atol)):
                return hint
        if not row.any():
            return NOTHING_ATTENDED
        if not row.isnan().any():
            return super()._recognised(want, index, row, expected)
        if self.targeted:
            return self.targeted
        return NOTHING_ATTENDED if self.covered[index[0]] else NULL_READ


def window_inputs(q_heads: int, kv_heads: int, block_size: int, lens: Sequence[int],
                  window: int, *, seed: int, dtype: torch.dtype = torch.float32,
                  null_before: bool = True) -> DecodeInputs:
    """Chapter 06's NaN-poisoned pool, with every table entry wholly before the window
    pointing at the null block, as a window group's table does (unless ``null_before`` is
    False: a table that still holds them)."""
    inputs = _decode_inputs(q_heads, kv_heads, block_size, lens, seed=seed, dtype=dtype)
    if not null_before:
        return inputs
    table = inputs.block_tables.clone()
    for row, length in enumerate(lens):
        table[row, : first_needed_block(length - 1, window, block_size)] = 0
    assert torch.isnan(inputs.k_cache[0]).all()  # the null block holds no token
    return DecodeInputs(inputs.q, inputs.k_cache, inputs.v_cache, table, inputs.seq_lens,
                        inputs.scale)


def _window_mistakes(inputs: DecodeInputs, window: int) -> tuple[tuple[torch.Tensor, str], ...]:
    """Each slip's output on ``inputs`` (NaN where it reads the null block), with its hint."""
    q, k_cache, v_cache, table, lens, scale = inputs.on(torch.device("cpu"))

    def attend(rows: slice, reach: int | None) -> torch.Tensor:
        return paged_attention_reference(q[rows], k_cache, v_cache, table[rows], lens[rows],
                                         scale, window=reach)

    block = k_cache.shape[1]
    from_block = torch.cat([  # each sequence from the start of the block its window starts in
        attend(slice(row, row + 1), length - max(0, length - window) // block * block)
        for row, length in enumerate(lens.tolist())])
    everything = slice(None)
    slips = [(attend(everything, None), WINDOW_IGNORED_KERNEL),
             (attend(everything, window + 1), WINDOW_OFF_BY_ONE),
             (from_block, WINDOW_BLOCK_START)]
    if window > 1:
        slips.append((attend(everything, window - 1), WINDOW_OFF_BY_ONE))
    return tuple(slips)


def _window_case(inputs: DecodeInputs, window: int, label: str,
                 arguments: Callable[[torch.device], tuple[Any, ...]] | None = None,
                 targeted: str = "") -> Case:
    """A kernel case on ``inputs`` (or, where given, on the ``arguments`` made on the
    kernel's device, which ``inputs`` stands in for on the grader's side)."""
    want = paged_attention_reference(*inputs.on(torch.device("cpu")), window=window)
    made = arguments or inputs.on
    case = _tensor_case(
        f"fn(q, k_cache, v_cache, block_tables, seq_lens, scale, window={window})  # {label}: "
        f"{inputs.describe()}",
        lambda fn: fn(*made(kernel_device()), window),
        [Want("out", want, ("b", "h"), "float32")], _WINDOW_HINT,
        *_tolerance(inputs.q.dtype), "paged_attention_reference with the window", kernel=True,
        targeted=targeted)
    match = case.expected.explain
    recognised = WindowMatch(**{f.name: getattr(match, f.name) for f in fields(TensorMatch)},
                             mistakes=_window_mistakes(inputs, window),
                             covered=tuple(n <= window for n in inputs.seq_lens.tolist()))
    return replace(case, expected=Satisfies(case.expected.description, explain=recognised))


def _wide_window_case(wide: WideInputs, window: int) -> Case:
    """Chapter 06's block past 2**32 elements (:func:`_wide_offset_inputs`) inside a window,
    the table's entries wholly before the window made null: 64-bit offsets, and the caches
    used where they are (a copy of them needs 8 GiB)."""
    twin, build, label = wide
    length, size = int(twin.seq_lens[0]), twin.k_cache.shape[1]
    before = first_needed_block(length - 1, window, size)
    table = twin.block_tables.clone()
    table[0, :before] = 0

    def nulled(device: torch.device) -> tuple[Any, ...]:
        q, k_cache, v_cache, tables, lens, scale = build(device)
        tables = tables.clone()
        tables[0, :before] = 0
        return q, k_cache, v_cache, tables, lens, scale

    return _window_case(replace(twin, block_tables=table), window, label, nulled, _WIDE_HINT)


def _wide_window(wide: WideInputs, rng: random.Random | None = None) -> Case:
    """:func:`_wide_window_case` with a window that reads the wide block: 20 positions, or
    drawn from ``rng``."""
    twin = wide[0]
    length, size = int(twin.seq_lens[0]), twin.k_cache.shape[1]
    at = int((twin.block_tables[0] == 8).nonzero()[0])  # the twin's stand-in for the wide block
    lowest = max(1, length - (at + 1) * size + 1)  # the window reaches the wide block
    window = 20 if rng is None else rng.randint(lowest, length - 1)
    assert lowest <= window < length
    return _wide_window_case(wide, window)


_WINDOW_SETTINGS = (
    # (label, q heads, kv heads, block size, lengths, window, keyword arguments)
    ("a table that still holds the blocks before the window: read only the window", 4, 2, 8,
     [30, 13, 5], 11, {"null_before": False}),
    ("GQA group 4, a window smaller than a block", 8, 2, 8, [1, 8, 9, 45], 5, {}),
    ("GQA group 7, a window that is not a multiple of the block", 7, 1, 16, [70, 16], 37, {}),
    ("a window longer than every sequence: full attention", 2, 2, 16, [5, 20], 100, {}),
    ("a window of one token: each query reads only itself", 4, 2, 8, [1, 30], 1, {}),
    ("a window of exactly two blocks", 4, 1, 16, [33, 48, 49], 32, {}),
    ("float16 q and cache", 4, 1, 16, [40, 3], 20, {"dtype": torch.float16}),
)


def _window_cases() -> list[Case]:
    return [*(_window_case(window_inputs(hq, hkv, b, lens, w, seed=19 + i, **kw), w, label)
              for i, (label, hq, hkv, b, lens, w, kw) in enumerate(_WINDOW_SETTINGS)),
            _wide_window(_wide_offset_inputs())]


def _drawn_window(rng: random.Random, label: str, below_block: bool,
                  **options: Any) -> Case:
    """Drawn heads, block size and window (below a block, or not a multiple of one), for one
    sequence longer than the window by more than a block, its window starting inside a
    block, one no longer than the window, and maybe one more; ``options`` go to
    :func:`window_inputs`."""
    kv_heads, size = rng.choice([1, 2]), rng.choice([4, 8, 16])
    window = (rng.randint(1, size - 1) if below_block else
              rng.randint(1, 3) * size + rng.randint(1, size - 1))
    longer = window + size + rng.randint(1, 24)
    longer += (longer - window) % size == 0
    lens = [longer, rng.randint(1, window), *(rng.randint(1, 60)
                                              for _ in range(rng.randint(0, 1)))]
    rng.shuffle(lens)
    inputs = window_inputs(kv_heads * rng.choice([1, 3, 4]), kv_heads, size, lens, window,
                           seed=rng.randint(0, 10_000), **options)
    return _window_case(inputs, window, f"drawn: {label}")


def _window_fresh(seed: int) -> list[Case]:
    """A table that still holds the blocks before the window, a window that starts inside a
    block, a window below a block in float16, and a window over a block past 2**32
    elements, all drawn; small, as the interpreter runs them on a CPU."""
    rng = random.Random(seed)
    return [
        _drawn_window(rng, "a table that still holds the blocks before the window", False,
                      null_before=False),
        _drawn_window(rng, "a window that starts inside a block", False),
        _drawn_window(rng, "a window smaller than a block, float16", True,
                      dtype=torch.float16),
        _wide_window(_drawn_wide_inputs(rng), rng),
    ]


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
