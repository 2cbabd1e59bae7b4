"""Chapter 03 exercises: block tables. Expected values come from ``course_lib.paged``,
``course_lib.kv_math`` and the simulator.

Classes are exercised through their methods only. Where a correct answer is not unique (which
free block a pool hands out next, say) a case checks the property that matters instead of
one particular value, so more than one design passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_lib.grading.check import Case, Exercise, Raises, Satisfies, satisfies
from course_lib.kv_math import paged_utilization
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.simulator import CostModel, SimConfig, simulate
from course_lib.workload import generate_trace

# --- exercise 1: blocks and the last block's fill --------------------------------------------


def _last_block(tokens: int, block_size: int) -> tuple[int, int]:
    """(blocks a sequence of ``tokens`` holds, tokens in its last block), from the library."""
    manager = PagedKVManager(BlockPool(tokens // block_size + 2, block_size))
    manager.add_sequence("s", tokens)
    table = manager.block_table("s")
    if not table:
        return 0, 0
    fill = {b.block_id: b.tokens for b in manager.snapshot().blocks}
    return len(table), fill[table[-1]]


def _last_block_cases() -> list[Case]:
    hint = ("blocks = ceil(tokens / block_size), in integers; the last block holds what is "
            "left after the full ones (a whole block when tokens divides evenly)")
    pairs = [(900, 16), (896, 16), (897, 16), (1, 16), (16, 16), (1000, 128), (8192, 16),
             (0, 16)]
    cases = [
        Case(f"fn(tokens={t}, block_size={b})", lambda fn, t=t, b=b: tuple(fn(t, b)),
             _last_block(t, b), hint)
        for t, b in pairs
    ]
    cases.append(Case("fn(tokens=10, block_size=0)", lambda fn: fn(10, 0), Raises(ValueError),
                      "a block of zero tokens is impossible: raise ValueError"))
    cases.append(Case("fn(tokens=-1, block_size=16)", lambda fn: fn(-1, 16), Raises(ValueError),
                      "a negative length is a mistake: raise ValueError"))
    return cases


# --- exercise 2: U_paged ------------------------------------------------------------------------


def _utilization_cases() -> list[Case]:
    hint = "U_paged = L / (ceil(L / B) x B): tokens over the slots of the blocks they occupy"
    pairs = [(512, 16), (900, 16), (17, 16), (1, 16), (128, 512), (2048, 16), (1000, 128)]
    cases = [
        Case(f"fn(tokens={t}, block_size={b})", lambda fn, t=t, b=b: fn(t, b),
             paged_utilization(t, b), hint)
        for t, b in pairs
    ]

    def worst_waste(fn: Any) -> float:
        return max(round(t / fn(t, 16)) - t for t in range(1, 513))

    worst = max(round(t / paged_utilization(t, 16)) - t for t in range(1, 513))
    cases.append(Case("max(round(L / fn(L, 16)) - L for L in range(1, 513))  # empty slots",
                      worst_waste, worst, "the waste of a sequence is at most B - 1 slots"))
    cases.append(Case("fn(tokens=0, block_size=16)", lambda fn: fn(0, 16), Raises(ValueError),
                      "an empty sequence has no utilisation (0 / 0): raise ValueError"))
    return cases


# --- exercise 3: a free-block pool --------------------------------------------------------------


def _free_count(pool: Any) -> Any:
    """``pool.num_free`` whether the learner wrote a property or a method."""
    value = pool.num_free
    return value() if callable(value) else value


def _library_pool(num_blocks: int) -> BlockPool:
    return BlockPool(num_blocks, 16)


def _take(pool: Any, count: int) -> list[Any]:
    return [pool.allocate() for _ in range(count)]


def _ids_in_range(num_blocks: int, count: int) -> Satisfies:
    def holds(ids: Any) -> bool:
        return (isinstance(ids, list) and len(ids) == count and len(set(ids)) == count
                and all(isinstance(b, int) and 1 <= b < num_blocks for b in ids))

    return Satisfies(f"{count} different ids, each in 1..{num_blocks - 1} (0 is the null "
                     f"block)", holds)


def _after_free(cls: Any) -> list[Any]:
    pool = cls(8)
    ids = _take(pool, 7)
    pool.free(ids[3])
    return [ids[3], pool.allocate()]


def _recycle(cls: Any) -> tuple[Any, bool]:
    pool = cls(8)
    distinct = True
    for _ in range(50):
        ids = _take(pool, 5)
        distinct = distinct and len(set(ids)) == 5
        for block in ids:
            pool.free(block)
    return _free_count(pool), distinct


def _counts(cls: Any) -> list[Any]:
    pool = cls(8)
    seen = [_free_count(pool)]
    ids = _take(pool, 3)
    seen.append(_free_count(pool))
    pool.free(ids[0])
    seen.append(_free_count(pool))
    return seen


def _free_then(cls: Any, block: int, *, allocate: int = 0, twice: bool = False) -> Any:
    pool = cls(8)
    ids = _take(pool, allocate)
    if twice:
        pool.free(ids[0])
        return pool.free(ids[0])
    return pool.free(block)


def _block_pool_cases() -> list[Case]:
    library = _library_pool(8)
    counts = [library.num_free]
    first = _take(library, 3)
    counts.append(library.num_free)
    library.free(first[0])
    counts.append(library.num_free)
    free_error = "raise ValueError naming the id: freeing it would corrupt the free list"
    return [
        Case("pool = cls(8); [pool.allocate() for _ in range(7)]", lambda cls: _take(cls(8), 7),
             _ids_in_range(8, 7), "hand out every block except the null block 0, each once",
             compare=satisfies),
        Case("pool = cls(8); num_free; allocate 3; num_free; free one; num_free", _counts,
             counts, "num_free counts the blocks allocate can still hand out (not block 0)"),
        Case("pool = cls(8); allocate 7 blocks; pool.allocate()",
             lambda cls: _take(cls(8), 8)[-1], Raises(RuntimeError),
             "an empty pool raises OutOfBlocks (a RuntimeError), never hands out 0 or a "
             "block in use"),
        Case("pool = cls(8); ids = allocate 7; pool.free(ids[3]); [ids[3], pool.allocate()]",
             _after_free, Satisfies("the freed block handed out again (the only free one)",
                                    lambda got: isinstance(got, list) and len(got) == 2
                                    and got[0] == got[1]),
             "a freed block goes back on the free list", compare=satisfies),
        Case("pool = cls(8); 50 rounds of allocate 5 and free them: (num_free, ids distinct)",
             _recycle, (7, True), "allocate and free must balance: nothing lost, nothing twice"),
        Case("pool = cls(8); pool.free(0)", lambda cls: _free_then(cls, 0), Raises(ValueError),
             f"block 0 is the reserved null block: {free_error}"),
        Case("pool = cls(8); b = pool.allocate(); pool.free(b); pool.free(b)",
             lambda cls: _free_then(cls, 0, allocate=1, twice=True), Raises(ValueError),
             f"a double free: {free_error}"),
        Case("pool = cls(8); pool.free(5)  # never allocated", lambda cls: _free_then(cls, 5),
             Raises(ValueError), f"block 5 is free already: {free_error}"),
        Case("pool = cls(8); pool.free(8)", lambda cls: _free_then(cls, 8), Raises(ValueError),
             f"8 is not a block of this pool: {free_error}"),
    ]


# --- exercise 4: block tables with allocate-on-demand ----------------------------------------


Op = tuple[str, str, int]
"""``("add", seq_id, tokens)``, ``("append", seq_id, tokens)`` or ``("free", seq_id, 0)``."""


def _replay(manager: Any, ops: Sequence[Op]) -> None:
    for op, seq, tokens in ops:
        if op == "add":
            manager.add_sequence(seq, tokens)
        elif op == "append":
            manager.append_tokens(seq, tokens)
        else:
            manager.free_sequence(seq)


def _ops_text(ops: Sequence[Op]) -> str:
    calls = {"add": "add_sequence({!r}, {})", "append": "append_tokens({!r}, {})",
             "free": "free_sequence({!r})"}
    return "; ".join(calls[op].format(seq, tokens) for op, seq, tokens in ops)


def _tables(cls: Any, num_blocks: int, ops: Sequence[Op], seqs: Sequence[str]) -> list[Any]:
    """Replay ``ops`` on a fresh library pool; the block tables of ``seqs`` and num_free."""
    pool = BlockPool(num_blocks, 16)
    manager = cls(pool)
    _replay(manager, ops)
    return [*(tuple(manager.block_table(s)) for s in seqs), pool.num_free]


def _growth(cls: Any) -> list[int]:
    """Table length after each single-token append from 0 to 40 tokens."""
    manager = cls(BlockPool(8, 16))
    manager.add_sequence("a", 0)
    lengths = []
    for _ in range(40):
        manager.append_tokens("a", 1)
        lengths.append(len(manager.block_table("a")))
    return lengths


def _reuse(cls: Any, num_blocks: int) -> tuple[bool, int]:
    """Fill the pool, free one sequence, grow another: does it use only freed blocks?"""
    pool = BlockPool(num_blocks, 16)
    manager = cls(pool)
    manager.add_sequence("a", 16 * 3)
    manager.add_sequence("b", 16 * (num_blocks - 4))
    freed = set(manager.block_table("a"))
    manager.free_sequence("a")
    manager.append_tokens("b", 16 * 3)
    grown = set(manager.block_table("b")[-3:])
    return grown == freed, pool.num_free


def _block_table_cases() -> list[Case]:
    hint = ("take a block from the pool only when the last one is full (length % B == 0), "
            "as many as the new tokens need; free gives every block back")
    scenarios: list[tuple[int, list[Op], list[str], str]] = [
        (64, [("add", "chat", 0), *[("append", "chat", 1)] * 900], ["chat"],
         "the source guide's 900-token chat, one token at a time: 57 blocks"),
        (64, [("add", "chat", 600), ("append", "chat", 300)], ["chat"],
         "a prompt of 600, then 300 tokens in one append"),
        (16, [("add", "a", 20), ("add", "b", 10), ("append", "a", 13), ("append", "b", 6),
              ("append", "b", 1)], ["a", "b"],
         "two sequences interleave: each table lists its own blocks in logical order"),
        (16, [("add", "a", 16), ("append", "a", 16), ("append", "a", 1)], ["a"],
         "16 tokens fill one block exactly; the 33rd token needs a third block"),
        (16, [("add", "a", 40), ("add", "b", 5), ("free", "a", 0)], ["b"],
         "free_sequence returns every block of the sequence to the pool"),
    ]
    cases = []
    for num_blocks, ops, seqs, why in scenarios:
        shown = _ops_text(ops) if len(ops) < 10 else (
            "add_sequence('chat', 0); then append_tokens('chat', 1) 900 times")
        cases.append(Case(
            f"pool = BlockPool({num_blocks}, 16); m = cls(pool); {shown}; "
            f"[m.block_table(s) for s in {seqs}] + [pool.num_free]",
            lambda cls, n=num_blocks, o=ops, s=seqs: _tables(cls, n, o, s),
            _tables(PagedKVManager, num_blocks, ops, seqs), f"{why}; {hint}"))
    cases += [
        Case("m = cls(BlockPool(8, 16)); add_sequence('a', 0); table length after each of 40 "
             "single-token appends", _growth, _growth(PagedKVManager),
             "allocate on demand: a new block at tokens 1, 17 and 33, never earlier"),
        Case("pool of 12: add 'a' (3 blocks) and 'b' (8 blocks); free 'a'; append 48 tokens to "
             "'b': (b's new blocks are a's old ones, pool.num_free)",
             lambda cls: _reuse(cls, 12), _reuse(PagedKVManager, 12),
             "freed blocks go back to the pool and are handed out again"),
        Case("m = cls(BlockPool(4, 16)); m.add_sequence('a', 40); m.add_sequence('b', 1)",
             lambda cls: _replay(cls(BlockPool(4, 16)), [("add", "a", 40), ("add", "b", 1)]),
             Raises(OutOfBlocks), "3 usable blocks are all taken: let the pool's OutOfBlocks "
             "propagate"),
        Case("m = cls(BlockPool(8, 16)); m.free_sequence('ghost')",
             lambda cls: cls(BlockPool(8, 16)).free_sequence("ghost"), Raises(ValueError),
             "an unknown sequence id is a bug: raise ValueError naming it"),
    ]
    return cases


# --- exercise 5: cost per million tokens ---------------------------------------------------------


def _runs() -> list[tuple[str, Any]]:
    """A few small simulated backlogs (no idle steps) under different cost models."""
    trace = generate_trace(40, seed=3, median_total=120, sigma=0.5, max_total=512)
    small = {"budget_bytes": 4096 * 16, "bytes_per_token": 16, "max_len": 512}
    return [
        ("reserve-max, 25 ms, 250/h", simulate(trace, SimConfig(allocator="reserve-max",
                                                                **small))),
        ("paged, 25 ms, 250/h", simulate(trace, SimConfig(**small))),
        ("paged, 40 ms, 90/h", simulate(trace, SimConfig(
            costs=CostModel(step_seconds=0.04, price_per_hour=90.0), **small))),
    ]


def _cost_cases() -> list[Case]:
    hint = ("seconds = steps x step_seconds; money = seconds / 3600 x price_per_hour; "
            "divide by output_tokens and multiply by 1,000,000")
    cases = []
    for label, run in _runs():
        costs = run.config.costs
        cases.append(Case(
            f"fn(output_tokens={run.output_tokens}, steps={run.steps}, "
            f"step_seconds={costs.step_seconds}, price_per_hour={costs.price_per_hour})  "
            f"# {label}",
            lambda fn, r=run, c=costs: fn(r.output_tokens, r.steps, c.step_seconds,
                                           c.price_per_hour),
            run.cost_per_million_tokens, hint,
            compare=lambda got, want: abs(got - want) <= 1e-9 * abs(want)))
    default = CostModel()
    guide_steps, guide_tokens = 17_663, 60 * 17_663
    cases.append(Case(
        f"fn(output_tokens={guide_tokens}, steps={guide_steps})  # defaults: 25 ms, 250/h",
        lambda fn: fn(guide_tokens, guide_steps),
        default.price_per_hour * guide_steps * default.step_seconds / 3600 / guide_tokens * 1e6,
        "give step_seconds a default of 0.025 and price_per_hour a default of 250",
        compare=lambda got, want: abs(got - want) <= 1e-9 * abs(want)))
    cases.append(Case("fn(output_tokens=0, steps=10)", lambda fn: fn(0, 10), Raises(ValueError),
                      "no tokens, no cost per token: raise ValueError"))
    return cases


EXERCISES = (
    Exercise("03.last_block", "Blocks for a length, and the last block's fill",
             _last_block_cases,
             reference=("course_lib.paged.PagedKVManager", "course_lib.kv_math.blocks_needed")),
    Exercise("03.u_paged", "Utilisation of a paged sequence", _utilization_cases,
             reference=("course_lib.kv_math.paged_utilization",)),
    Exercise("03.block_pool", "A free-block pool with a null block", _block_pool_cases,
             reference=("course_lib.paged.BlockPool",)),
    Exercise("03.block_tables", "Block tables with allocate-on-demand", _block_table_cases,
             reference=("course_lib.paged.PagedKVManager",)),
    Exercise("03.cost_per_million", "Cost per million output tokens", _cost_cases,
             reference=("course_lib.simulator.simulate", "course_lib.simulator.SimResult")),
)
