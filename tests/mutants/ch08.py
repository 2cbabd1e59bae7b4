"""Chapter 08's kept wrong answers, each with the hint its report must show first, and right
answers of other designs than the solution notebook's (see ``tests/mutants/__init__.py``).

Each pure-Python answer is one correct design whose mistakes can be switched on one at a
time. The kernel is the notebook's design with switchable mistakes too; it runs under the
Triton interpreter on a CPU, so every mutant of it is a constexpr of one kernel, not a kernel
of its own. It is defined here, outside ``course_lib``, so the check counts its launches as
the learner's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tests.mutants import Mutant, Right
from tests.mutants.ch06 import launch_splits

# isort: split
# Triton after course_lib.attention, which switches the interpreter on without a GPU.
import triton
import triton.language as tl

# --- 08.bytes_at_length: bytes per token at a length --------------------------------------------


def bytes_at_length(mistake: str = "") -> Any:
    """The notebook's design, with ``mistake`` switched on (empty: none)."""
    def fn(windows: list[int | None], kv_heads: int, head_dim: int, dtype_bytes: int,
           num_tokens: int) -> float:
        if mistake != "no_check" and (
                num_tokens < 1 or any(w is not None and w < 1 for w in windows)):
            raise ValueError(f"bad num_tokens={num_tokens} or windows={windows}")
        kept = 0
        for window in windows:
            if window is None or mistake == "all_full":
                kept += num_tokens
            elif mistake == "always_w":
                kept += window
            else:
                kept += min(num_tokens, window + {"plus_one": 1, "minus_one": -1}.get(mistake, 0))
        vectors = 1 if mistake == "k_only" else 2
        total = vectors * kv_heads * head_dim * dtype_bytes * kept
        return total / (1 if mistake == "total" else num_tokens)

    return fn


def bytes_by_counting(windows: list[int | None], kv_heads: int, head_dim: int,
                      dtype_bytes: int, num_tokens: int) -> float:
    """Another design: count, for each position, the layers that still hold it."""
    if num_tokens < 1 or any(w is not None and w < 1 for w in windows):
        raise ValueError("bad input")
    held = sum(sum(1 for w in windows if w is None or num_tokens - p <= w)
               for p in range(num_tokens))
    return 2 * kv_heads * head_dim * dtype_bytes * held / num_tokens


# --- 08.window_free: what a window group hands back -----------------------------------------------


def window_free(mistake: str = "") -> Any:
    """The notebook's design, with ``mistake`` switched on (empty: none)."""
    def fn(table: list[int], ref_counts: dict[int, int], num_computed: int, window: int,
           block_size: int) -> tuple[list[int], list[int]]:
        checked = {"no_check": (), "window_only": (window,),
                   "no_computed_check": (window, block_size)}.get(
                       mistake, (window, block_size, num_computed + 1))
        if any(value < 1 for value in checked):
            raise ValueError("bad input")
        reads_from = num_computed - window + (0 if mistake == "off_by_one" else 1)
        first = max(0, reads_from) // block_size
        if mistake == "ceil":
            first = math.ceil(max(0, reads_from) / block_size)
        if mistake == "whole_blocks":  # the window as window // block_size blocks behind
            first = max(0, num_computed // block_size - window // block_size)
        if mistake == "truncate":  # drops the entries instead of nulling them
            freed = [b for b in table[:first] if b and ref_counts[b] == 1]
            return table[first:], freed
        after, returned = list(table), []
        for index in range(min(first, len(table))):
            block = after[index]
            if block or mistake == "no_null_skip":
                shared = ref_counts[block] > 1
                if not shared or mistake == "ignore_refs":
                    returned.append(block)
                if not shared or mistake != "keep_shared":
                    after[index] = 0
        return after, returned

    return fn


def window_free_by_positions(table: list[int], ref_counts: dict[int, int], num_computed: int,
                             window: int, block_size: int) -> tuple[list[int], list[int]]:
    """Another design: a block goes when its last position is before the first read."""
    if window < 1 or block_size < 1 or num_computed < 0:
        raise ValueError("bad input")
    first_read = num_computed - window + 1
    gone = [i for i, b in enumerate(table) if b and (i + 1) * block_size - 1 < first_read]
    return ([0 if i in gone else b for i, b in enumerate(table)],
            [table[i] for i in gone if ref_counts[table[i]] < 2])


# --- 08.prefix_hit: the prefix hit across groups --------------------------------------------------


def prefix_hit(mistake: str = "") -> Any:
    """The notebook's design, with ``mistake`` switched on (empty: none)."""
    def serves(flags: list[bool], window: int | None, blocks: int, block_size: int) -> bool:
        if window is None or mistake == "window_as_full":
            return all(flags[:blocks])
        if mistake == "full_only":
            return True
        span = window if mistake == "window_w" else window - 1
        first = max(0, blocks * block_size - span) // block_size
        return all(flags[first:blocks])

    def fn(cached: list[list[bool]], windows: list[int | None], block_size: int,
           num_tokens: int) -> int:
        limit = (num_tokens if mistake == "last_token" else max(num_tokens - 1, 0)) // block_size
        unit = {"in_blocks": 1, "a_float": block_size / 1}.get(mistake, block_size)
        groups = list(zip(cached, windows, strict=True))
        if mistake == "upward":  # grow k while every group serves it
            k = 0
            while k < limit and all(serves(f, w, k + 1, block_size) for f, w in groups):
                k += 1
            return k * unit
        if mistake == "min_of_bests":  # each group's own best k, then the smallest
            return min(next((k for k in range(limit, 0, -1) if serves(f, w, k, block_size)), 0)
                       for f, w in groups) * unit
        for k in range(limit, 0, -1):
            if all(serves(f, w, k, block_size) for f, w in groups):
                return k * unit
        return 0

    return fn


def prefix_hit_upward(cached: list[list[bool]], windows: list[int | None], block_size: int,
                      num_tokens: int) -> int:
    """Another design: the full groups' run bounds k, then test each k from there down by
    the positions each window group needs."""
    k = max(num_tokens - 1, 0) // block_size
    for flags, window in zip(cached, windows, strict=True):
        if window is None:
            k = min(k, next((i for i, f in enumerate(flags) if not f), len(flags)))
    while k > 0:
        needed = [{p // block_size for p in range(max(0, k * block_size - w + 1), k * block_size)}
                  for w in windows if w is not None]
        groups = [f for f, w in zip(cached, windows, strict=True) if w is not None]
        if all(all(flags[b] for b in need) for flags, need in zip(groups, needed, strict=True)):
            break
        k -= 1
    return k * block_size


# --- 08.windowed_decode: a windowed decode kernel with switchable mistakes ----------------------

NONE, IGNORE_WINDOW, WINDOW_PLUS_ONE, WINDOW_MINUS_ONE, SCORES_ONLY, BLOCK_START, \
    INT32_BLOCK, RANGE_TO_WINDOW, RANGE_TO_WINDOW_NAN = map(tl.constexpr, range(9))


@triton.jit
def windowed_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, scale, window,
                    stride_qb, stride_qh, stride_qd, stride_kb, stride_kt, stride_kh, stride_kd,
                    stride_vb, stride_vt, stride_vh, stride_vd, stride_tb, stride_tn,
                    stride_ob, stride_oh, stride_od,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MISTAKE: tl.constexpr):
    """The notebook's kernel (tiles of TILE_N, tl.dot, natural exp) with a lower mask too;
    ``MISTAKE`` switches one learner mistake on."""
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo = tl.maximum(seq_len - window, 0)
    if MISTAKE == WINDOW_PLUS_ONE:
        lo = tl.maximum(seq_len - window - 1, 0)
    if MISTAKE == WINDOW_MINUS_ONE:  # the chunk's rule of window_free, num_computed = seq_len
        lo = tl.maximum(seq_len - window + 1, 0)
    loop_from = lo
    if MISTAKE == IGNORE_WINDOW:
        lo = 0
        loop_from = 0
    if MISTAKE == SCORES_ONLY:
        loop_from = 0
    if MISTAKE == BLOCK_START:  # from the window's first block, unmasked below the window
        loop_from = lo // BLOCK_SIZE * BLOCK_SIZE
        lo = loop_from
    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    loop_to = seq_len
    if MISTAKE == RANGE_TO_WINDOW:  # a length taken for an end
        loop_to = window
    if MISTAKE == RANGE_TO_WINDOW_NAN:
        loop_to = window
    for start in range(loop_from, loop_to, TILE_N):
        tokens = start + tl.arange(0, TILE_N)
        ok = (tokens < seq_len) & (tokens >= lo)
        load_ok = tokens < seq_len if MISTAKE == SCORES_ONLY else ok
        block = tl.load(table_ptr + seq * stride_tb + (tokens // BLOCK_SIZE) * stride_tn,
                        mask=load_ok, other=0)
        if MISTAKE != INT32_BLOCK:
            block = block.to(tl.int64)
        slot = tokens % BLOCK_SIZE
        k = tl.load(k_ptr + (block * stride_kb + slot * stride_kt + kv_head * stride_kh)[:, None]
                    + dims[None, :] * stride_kd, mask=load_ok[:, None], other=0.0)
        v = tl.load(v_ptr + (block * stride_vb + slot * stride_vt + kv_head * stride_vh)[:, None]
                    + dims[None, :] * stride_vd, mask=load_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    if MISTAKE == RANGE_TO_WINDOW:  # with chapter 06's guard of an empty split: zeros
        l_i = tl.where(l_i > 0, l_i, 1.0)
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
             acc / l_i[:, None], mask=row_ok[:, None])


def windowed(mistake: int = NONE) -> Any:
    """A launcher of ``windowed_kernel`` with ``mistake`` switched on."""
    def windowed_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        tables: torch.Tensor, lens: torch.Tensor, scale: float,
                        window: int) -> torch.Tensor:
        batch, q_heads, head_dim = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        group = q_heads // kv_heads
        out = torch.empty(batch, q_heads, head_dim, dtype=torch.float32, device=q.device)
        windowed_kernel[(batch, kv_heads)](
            q, k_cache, v_cache, tables, lens, out, scale, window, *q.stride(),
            *k_cache.stride(), *v_cache.stride(), *tables.stride(), *out.stride(),
            GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size, TILE_N=16, MISTAKE=mistake, enable_fp_fusion=True)
        return out

    return windowed_decode


def block_walk_windowed(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        tables: torch.Tensor, lens: torch.Tensor, scale: float,
                        window: int) -> torch.Tensor:
    """Another design: chapter 06's block-walking kernel (whole blocks, base 2, no tl.dot)
    starting at the window, one split."""
    out, _ = launch_splits(q, k_cache, v_cache, tables, lens, scale, 1, None, window=window)
    return out[:, :, 0]


# --- the tables -----------------------------------------------------------------------------------

BYTES, FREE, HIT, DECODE = ("08.bytes_at_length", "08.window_free", "08.prefix_hit",
                            "08.windowed_decode")

RIGHT = [
    Right(BYTES, "count, for each position, the layers that hold it", bytes_by_counting),
    Right(FREE, "a block goes when its last position is before the first read",
          window_free_by_positions),
    Right(HIT, "the full groups bound k, then the window groups' positions from there down",
          prefix_hit_upward),
    Right(DECODE, "chapter 06's block walk (whole blocks, base 2, no tl.dot) from the window",
          block_walk_windowed),
    Right(BYTES, "the notebook's design", bytes_at_length()),
    Right(FREE, "the notebook's design", window_free()),
    Right(HIT, "the notebook's design", prefix_hit()),
    Right(DECODE, "the notebook's design", windowed()),
]

MUTANTS = [
    Mutant(BYTES, "a window layer keeps W + 1 tokens", bytes_at_length("plus_one"),
           "exactly W tokens"),
    Mutant(BYTES, "a window layer keeps W - 1 tokens", bytes_at_length("minus_one"),
           "exactly W tokens"),
    Mutant(BYTES, "every layer keeps every token", bytes_at_length("all_full"),
           "only for its last W tokens"),
    Mutant(BYTES, "a window layer keeps W tokens while L < W", bytes_at_length("always_w"),
           "min(L, W)"),
    Mutant(BYTES, "the request's total, not per token", bytes_at_length("total"),
           "divide the request's total bytes by L"),
    Mutant(BYTES, "keys only, no values", bytes_at_length("k_only"), "a key AND a value"),
    Mutant(BYTES, "no check of the inputs", bytes_at_length("no_check"),
           "no bytes per token: raise ValueError"),
    Mutant(FREE, "the chunk reads from num_computed - window (a window off by one)",
           window_free("off_by_one"), "a window off by one"),
    Mutant(FREE, "ceil for floor at a block boundary", window_free("ceil"), "not ceil"),
    Mutant(FREE, "frees a block a shared prefix still holds", window_free("ignore_refs"),
           "does not return to the pool"),
    Mutant(FREE, "a shared block stays in the table", window_free("keep_shared"),
           "a shared block leaves this table too"),
    Mutant(FREE, "entries dropped, the table shortened", window_free("truncate"),
           "the table keeps its length"),
    Mutant(FREE, "the null entries not skipped", window_free("no_null_skip"),
           "entries already 0 are the null block"),
    Mutant(FREE, "no check of the inputs", window_free("no_check"),
           "a window below 1 token"),
    Mutant(FREE, "only the window checked: block_size 0 divides by zero",
           window_free("window_only"), "not a ZeroDivisionError"),
    Mutant(FREE, "a negative num_computed not checked", window_free("no_computed_check"),
           "a negative num_computed"),
    Mutant(FREE, "the window counted in whole blocks (window // block_size behind)",
           window_free("whole_blocks"), "not window // block_size whole blocks"),
    Mutant(HIT, "a hit that satisfies only the full group", prefix_hit("full_only"),
           "every group must serve the hit"),
    Mutant(HIT, "the window group needs W positions before k x block_size",
           prefix_hit("window_w"), "not of W"),
    Mutant(HIT, "the hit may cover the prompt's last token", prefix_hit("last_token"),
           "never covers it"),
    Mutant(HIT, "the hit in blocks, not tokens", prefix_hit("in_blocks"),
           "return the hit in tokens"),
    Mutant(HIT, "a window group needs the whole prefix", prefix_hit("window_as_full"),
           "try k from the largest down"),
    Mutant(HIT, "k grown upward until a group fails", prefix_hit("upward"),
           "try k from the largest down"),
    Mutant(HIT, "each group's own best k, then the smallest", prefix_hit("min_of_bests"),
           "the SAME k"),
    Mutant(HIT, "the hit as a float", prefix_hit("a_float"), "return an int"),
    Mutant(DECODE, "the window ignored: the loop from 0", windowed(IGNORE_WINDOW),
           "not at 0"),
    Mutant(DECODE, "the window from seq_len - window - 1", windowed(WINDOW_PLUS_ONE),
           "the window is off by one"),
    Mutant(DECODE, "the window from seq_len - window + 1", windowed(WINDOW_MINUS_ONE),
           "the window is off by one"),
    Mutant(DECODE, "the window masked on the scores only", windowed(SCORES_ONLY),
           "mask the loads as well as the scores"),
    Mutant(DECODE, "the loop from the window's first block, unmasked below the window",
           windowed(BLOCK_START), "inside the block that holds it"),
    Mutant(DECODE, "block id in 32 bits", windowed(INT32_BLOCK), "tl.int64"),
    Mutant(DECODE, "the loop to window, not to seq_len: nothing read, l guarded",
           windowed(RANGE_TO_WINDOW), "nothing was attended"),
    Mutant(DECODE, "the loop to window, not to seq_len: nothing read, 0 / 0",
           windowed(RANGE_TO_WINDOW_NAN), "no position was kept at all"),
]
