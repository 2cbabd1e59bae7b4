"""Chapter 03: wrong answers, each with the hint its report must show first, and right
answers of other designs. Each wrong answer is a correct design with one slip switched on."""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from course_lib.grading.ch03 import LibraryTables, LowestFirstPool, cost_per_million
from course_lib.kv_math import blocks_needed
from course_lib.paged import BlockPool, OutOfBlocks
from tests.mutants import Mutant, Right


def last_block_by_ceil(tokens: int, block_size: int) -> tuple[int, int]:
    """Another design: a float ceiling (exact at these sizes) and a remainder trick."""
    if block_size < 1 or tokens < 0:
        raise ValueError(f"tokens={tokens}, block_size={block_size}")
    return math.ceil(tokens / block_size), (tokens - 1) % block_size + 1 if tokens else 0


def pack_with(mistake: str = "") -> Any:
    """Pads rows; ``mistake`` switches one slip on (empty: correct)."""
    def fn(tables: list[list[int]], seq_lens: list[int], block_size: int) -> list[list[int]]:
        if len(tables) != len(seq_lens) and mistake != "zip_loose":
            raise ValueError(f"{len(tables)} tables, {len(seq_lens)} lengths")
        pairs = list(zip(tables, seq_lens, strict=False))
        for table, length in pairs[:1] if mistake == "check_first" else pairs:
            if len(table) != blocks_needed(length, block_size):
                raise ValueError(f"table {table} does not fit length {length}")
            if 0 in table and mistake != "null_allowed":
                raise ValueError(f"table {table} holds the null block")
        width = len(tables[0]) if mistake == "first_width" and tables else max(
            map(len, tables), default=0)
        pad = -1 if mistake == "pad_minus_one" else 0
        if mistake == "mutates":
            for table in tables:
                table.extend([pad] * (width - len(table)))
            return tables
        return [table + [pad] * (width - len(table)) for table in tables]

    return fn


def pack_numpy(tables: list[list[int]], seq_lens: list[int], block_size: int) -> Any:
    """Another design: a zero array filled row by row (an array, not lists)."""
    if len(tables) != len(seq_lens):
        raise ValueError("one length per table")
    need = [math.ceil(n / block_size) for n in seq_lens]
    if [len(t) for t in tables] != need or any(0 in t for t in tables):
        raise ValueError(f"tables {tables} do not match lengths {seq_lens}")
    out = np.zeros((len(tables), max(need, default=0)), dtype=np.int32)
    for row, table in zip(out, tables, strict=True):
        row[:len(table)] = table
    return out


class HeapPool:
    """Lowest first with a heap and an in-use set; num_free as a method."""

    def __init__(self, num_blocks: int) -> None:
        self.heap = list(range(1, num_blocks))
        self.in_use: set[int] = set()

    def num_free(self) -> int:
        return len(self.heap)

    def allocate(self) -> int:
        if not self.heap:
            raise OutOfBlocks(1, 0)
        block = heapq.heappop(self.heap)
        self.in_use.add(block)
        return block

    def free(self, block_id: int) -> None:
        if block_id not in self.in_use:
            raise ValueError(f"block {block_id!r} is not in use")
        self.in_use.remove(block_id)
        heapq.heappush(self.heap, block_id)


class BitmapPool:
    """Lowest first by scanning a list of flags (slow, and just as correct)."""

    def __init__(self, num_blocks: int) -> None:
        self.used = [True] + [False] * (num_blocks - 1)

    @property
    def num_free(self) -> int:
        return self.used.count(False)

    def allocate(self) -> int:
        if all(self.used):
            raise OutOfBlocks(1, 0)
        block = self.used.index(False)
        self.used[block] = True
        return block

    def free(self, block_id: int) -> None:
        if not 0 < block_id < len(self.used) or not self.used[block_id]:
            raise ValueError(f"cannot free block {block_id!r}")
        self.used[block_id] = False


class SlotListTables:
    """Keeps every token's slot (not the length): the table is derived from the slots."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.slots = pool, {}

    def add_sequence(self, seq_id: str, num_tokens: int) -> list[int]:
        if seq_id in self.slots or num_tokens < 0:
            raise ValueError(f"cannot add {seq_id!r} with {num_tokens!r} tokens")
        self.slots[seq_id] = []
        try:
            return self._grow(seq_id, num_tokens)
        except OutOfBlocks:
            del self.slots[seq_id]
            raise

    def append_tokens(self, seq_id: str, num_tokens: int = 1) -> list[int]:
        if seq_id not in self.slots or num_tokens < 1:
            raise ValueError(f"cannot append {num_tokens!r} to {seq_id!r}")
        return self._grow(seq_id, num_tokens)

    def _grow(self, seq_id: str, count: int) -> list[int]:
        size, slots = self.pool.block_size, self.slots[seq_id]
        room = -len(slots) % size
        needed = -(-(count - room) // size) if count > room else 0
        if needed > self.pool.num_free:
            raise OutOfBlocks(needed, self.pool.num_free)
        new = [slots[-1] + 1 + i for i in range(min(room, count))] if room else []
        for _ in range(needed):
            block = self.pool.allocate()
            new += [block * size + i for i in range(size)]
        new = new[:count]
        slots.extend(new)
        return new

    def block_table(self, seq_id: str) -> list[int]:
        if seq_id not in self.slots:
            raise ValueError(f"unknown sequence {seq_id!r}")
        return [s // self.pool.block_size for s in self.slots[seq_id][::self.pool.block_size]]

    def free_sequence(self, seq_id: str) -> None:
        self.pool.free_batch(self.block_table(seq_id)[::-1])
        del self.slots[seq_id]


def cost_by_phases(steps: list[tuple[int, int, int]], bytes_per_token: int,
                   step_seconds: float = 0.025, kv_read_bandwidth: float = 3e12,
                   prefill_seconds_per_token: float = 4e-5,
                   price_per_hour: float = 250.0) -> float:
    """Sums each time term over the run first, then prices: another order of operations."""
    decoded = sum(d for d, _, _ in steps)
    if decoded < 1:
        raise ValueError(f"no decoded tokens in {len(steps)} steps")
    seconds = (len(steps) * step_seconds
               + sum(kv for _, kv, _ in steps) * bytes_per_token / kv_read_bandwidth
               + sum(p for _, _, p in steps) * prefill_seconds_per_token)
    return seconds / 3600 * price_per_hour * 1_000_000 / decoded


def batch_u_numpy(lengths: list[int], block_size: int) -> float:
    array = np.asarray(lengths, dtype=np.int64)
    if block_size < 1 or (array < 0).any() or array.sum() == 0:
        raise ValueError(f"no utilisation for {lengths}")
    return float(array.sum() / (np.ceil(array / block_size) * block_size).sum())


def last_block_with(mistake: str) -> Any:
    def fn(tokens: int, block_size: int) -> tuple[int, int]:
        if block_size < 1 or (tokens < 0 and mistake != "no_negative"):
            raise ValueError((tokens, block_size))
        blocks = tokens // block_size if mistake == "floor" else -(-tokens // block_size)
        if mistake == "modulo":
            return blocks, tokens % block_size
        if mistake == "empty_full":
            return blocks, (tokens - 1) % block_size + 1
        return blocks, tokens - (blocks - 1) * block_size if blocks else 0

    return fn


def batch_u_with(mistake: str) -> Any:
    def fn(lengths: list[int], block_size: int) -> float:
        if block_size < 1 or not sum(lengths) or (
                mistake != "no_negative" and any(n < 0 for n in lengths)):
            raise ValueError(lengths)
        held = [max(1, blocks_needed(n, block_size)) if mistake == "empty_takes_block"
                else (n // block_size or 1 if mistake == "floor" else -(-n // block_size))
                for n in lengths]
        if mistake == "mean_of_ratios":
            return sum(n / (h * block_size) for n, h in zip(lengths, held, strict=True)
                       if n) / len([n for n in lengths if n])
        return sum(lengths) / (sum(held) * block_size)

    return fn


class PoolWith(HeapPool):
    MISTAKE = ""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.size = num_blocks
        if self.MISTAKE == "hands_out_null":
            self.heap.insert(0, 0)

    def num_free(self) -> int:
        return len(self.heap) + (self.MISTAKE == "counts_null")

    def free(self, block_id: int) -> None:
        if self.MISTAKE == "range_check_only":
            if not 0 < block_id < self.size:
                raise ValueError(block_id)
            self.in_use.discard(block_id)
            heapq.heappush(self.heap, block_id)
            return
        super().free(block_id)


def pool_with(mistake: str) -> type:
    return type(f"Pool_{mistake}", (PoolWith,), {"MISTAKE": mistake})


class QueuePool(LowestFirstPool):
    """The lecture's free queue (a freed block goes to the front), transcribed: correct
    checks, but not lowest first."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.pool = BlockPool(num_blocks, 1)

    def allocate(self) -> int:
        return self.pool.allocate()


class TablesWith:
    """Block tables as (table, length) in a dict; ``MISTAKE`` switches one slip on."""

    MISTAKE = ""

    def __init__(self, pool: Any) -> None:
        self.pool, self.seqs = pool, {}
        self.freed: dict[str, Any] = {}

    def add_sequence(self, seq_id: str, num_tokens: int) -> list[int]:
        if seq_id in self.seqs or seq_id in self.freed or num_tokens < 0:
            raise ValueError(seq_id)
        if self.MISTAKE == "add_not_atomic":
            self.seqs[seq_id] = ([], 0)
            return self._grow(seq_id, num_tokens)
        self.seqs[seq_id] = ([], 0)
        try:
            return self._grow(seq_id, num_tokens)
        except OutOfBlocks:
            del self.seqs[seq_id]
            raise

    def append_tokens(self, seq_id: str, num_tokens: int = 1) -> list[int]:
        if seq_id not in self.seqs or num_tokens < 1:
            raise ValueError(seq_id)
        return self._grow(seq_id, num_tokens)

    def _grow(self, seq_id: str, count: int) -> list[int]:
        size = self.pool.block_size
        table, length = self.seqs[seq_id]
        target = length + count
        needed = -(-target // size) - len(table)
        if self.MISTAKE == "eager":
            needed = max(needed, 1)
        if self.MISTAKE == "floor":
            needed = target // size - len(table)
        if needed > self.pool.num_free and self.MISTAKE != "not_atomic":
            raise OutOfBlocks(needed, self.pool.num_free)
        for _ in range(max(needed, 0)):
            table.append(self.pool.allocate())
        self.seqs[seq_id] = (table, target)
        if self.MISTAKE == "slot_ignores_table":
            return list(range(length, target))
        return [table[p // size] * size + p % size for p in range(length, target)]

    def block_table(self, seq_id: str) -> list[int]:
        if seq_id in self.freed:
            return self.freed[seq_id]
        if seq_id not in self.seqs:
            raise ValueError(seq_id)
        return list(self.seqs[seq_id][0])

    def free_sequence(self, seq_id: str) -> None:
        if seq_id not in self.seqs:
            raise ValueError(seq_id)
        table, _ = self.seqs.pop(seq_id)
        if self.MISTAKE == "frees_one_by_one":  # each to the front: the first block ends up first
            for block in reversed(table):
                self.pool.free(block)
        elif self.MISTAKE == "head_first_batch":  # one batch, first block first
            self.pool.free_batch(table)
        else:
            self.pool.free_batch(table[::-1])
        if self.MISTAKE == "keeps_record":
            self.freed[seq_id] = table


def tables_with(mistake: str) -> type:
    return type(f"Tables_{mistake}", (TablesWith,), {"MISTAKE": mistake})


def cost_with(mistake: str) -> Any:
    def fn(steps: list[tuple[int, int, int]], bytes_per_token: int, step_seconds: float = 0.025,
           kv_read_bandwidth: float = 3e12, prefill_seconds_per_token: float = 4e-5,
           price_per_hour: float = 250.0) -> float:
        if mistake == "no_idle":
            steps = [s for s in steps if s[0]]
        decoded = sum(d + (p if mistake == "prefill_as_output" else 0) for d, _, p in steps)
        if decoded < 1:
            raise ValueError(steps)
        kv_bytes = 0 if mistake == "no_kv" else bytes_per_token
        seconds = sum(step_seconds + kv * kv_bytes / kv_read_bandwidth
                      + p * prefill_seconds_per_token for _, kv, p in steps)
        per_token = seconds / (1 if mistake == "seconds_not_hours" else 3600) \
            * price_per_hour / decoded
        return per_token if mistake == "per_token" else per_token * 1e6

    return fn


MUTANTS = [
    Mutant("03.last_block", "modulo", last_block_with("modulo"), "has a full last block"),
    Mutant("03.last_block", "floor", last_block_with("floor"),
           "a partly filled last block is still a block"),
    Mutant("03.last_block", "empty_full", last_block_with("empty_full"),
           "an empty sequence has no last block"),
    Mutant("03.last_block", "no_negative", last_block_with("no_negative"),
           "a negative length is a mistake"),
    Mutant("03.u_paged", "mean_of_ratios", batch_u_with("mean_of_ratios"),
           "pool the batch before dividing"),
    Mutant("03.u_paged", "floor", batch_u_with("floor"),
           "a partly filled last block is still a block"),
    Mutant("03.u_paged", "empty_takes_block", batch_u_with("empty_takes_block"),
           "a sequence of 0 tokens holds no block"),
    Mutant("03.u_paged", "no_negative", batch_u_with("no_negative"),
           "a negative length or block size"),
    Mutant("03.block_pool", "a free queue", QueuePool, "the lowest free id comes first"),
    Mutant("03.block_pool", "hands_out_null", pool_with("hands_out_null"),
           "block 0 is the null block"),
    Mutant("03.block_pool", "counts_null", pool_with("counts_null"),
           "num_free counts the blocks allocate can still hand out"),
    Mutant("03.block_pool", "range_check_only", pool_with("range_check_only"),
           "a double free"),
    Mutant("03.block_tables", "eager", tables_with("eager"), "allocate on demand"),
    Mutant("03.block_tables", "not_atomic", tables_with("not_atomic"), "changes nothing"),
    Mutant("03.block_tables", "add_not_atomic", tables_with("add_not_atomic"),
           "a refused add creates no sequence"),
    Mutant("03.block_tables", "slot_ignores_table", tables_with("slot_ignores_table"),
           "found through the table"),
    Mutant("03.block_tables", "floor", tables_with("floor"),
           "a block for every started block of its tokens"),
    Mutant("03.block_tables", "keeps_record", tables_with("keeps_record"),
           "its id may start again"),
    Mutant("03.block_tables", "frees_one_by_one", tables_with("frees_one_by_one"),
           "last block first"),
    Mutant("03.block_tables", "head_first_batch", tables_with("head_first_batch"),
           "last block first"),
    Mutant("03.cost_per_million", "no_idle", cost_with("no_idle"),
           "even one that decodes nothing"),
    Mutant("03.cost_per_million", "no_kv", cost_with("no_kv"), "its KV bytes over the bandwidth"),
    Mutant("03.cost_per_million", "prefill_as_output", cost_with("prefill_as_output"),
           "only decoded tokens are sold"),
    Mutant("03.cost_per_million", "seconds_not_hours", cost_with("seconds_not_hours"),
           "turn the seconds into hours"),
    Mutant("03.cost_per_million", "per_token", cost_with("per_token"),
           "per million decoded tokens"),
    Mutant("03.pack_tables", "pad_minus_one", pack_with("pad_minus_one"), "null block 0"),
    Mutant("03.pack_tables", "first_width", pack_with("first_width"), "not the first"),
    Mutant("03.pack_tables", "mutates", pack_with("mutates"), "leave the caller's tables"),
    Mutant("03.pack_tables", "check_first", pack_with("check_first"),
           "the second table is one block short"),
    Mutant("03.pack_tables", "null_allowed", pack_with("null_allowed"), "the null block"),
    Mutant("03.pack_tables", "zip_loose", pack_with("zip_loose"), "two tables, one length"),
]

# --- the library behind the exercises' interfaces ---------------------------------------------


def last_block(tokens: int, block_size: int) -> tuple[int, int]:
    blocks = blocks_needed(tokens, block_size)
    return blocks, tokens - (blocks - 1) * block_size if blocks else 0


def batch_u(lengths: list[int], block_size: int) -> float:
    """Through the library's per-sequence helpers: tokens over slots, pooled."""
    if block_size < 1 or any(n < 0 for n in lengths) or not sum(lengths):
        raise ValueError(f"no utilisation for {lengths} in blocks of {block_size}")
    return sum(lengths) / sum(blocks_needed(n, block_size) * block_size for n in lengths)


RIGHT = [
    Right("03.last_block", "float ceiling and remainder", last_block_by_ceil),
    Right("03.u_paged", "numpy", batch_u_numpy),
    Right("03.block_pool", "a heap", HeapPool),
    Right("03.block_pool", "a list of flags", BitmapPool),
    Right("03.block_tables", "every token's slot kept", SlotListTables),
    Right("03.cost_per_million", "phases summed first", cost_by_phases),
    Right("03.pack_tables", "a numpy array", pack_numpy),
    Right("03.last_block", "the library's blocks_needed", last_block),
    Right("03.u_paged", "the library's blocks_needed", batch_u),
    Right("03.block_pool", "the grader's reference", LowestFirstPool),
    Right("03.block_tables", "the grader's reference", LibraryTables),
    Right("03.cost_per_million", "the grader's reference", cost_per_million),
    Right("03.pack_tables", "the notebook's design", pack_with()),
]
