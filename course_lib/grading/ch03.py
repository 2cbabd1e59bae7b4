"""Chapter 03 exercises: block tables. Expected values come from ``course_lib.paged``,
``course_lib.kv_math`` and ``course_lib.simulator``.

The lecture shows the free queue and allocate-on-demand as ideas, not code; the exercises
ask for the next step of each from a specification: the utilisation of a whole batch, a
pool that hands out the lowest free block, block tables that say where each new token's
keys and values go (and refuse a request they cannot serve in full), and the cost of a run
whose steps slow down with what they read. Classes are exercised through their methods
only, and every case returns plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_lib.grading.check import Case, Exercise, Raises
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.simulator import CostModel

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
    hint = ("a partly filled last block is still a block; a length that fills its blocks "
            "exactly has a full last block, and an empty sequence has no last block")
    pairs = [(900, 16), (896, 16), (897, 16), (1, 16), (16, 16), (1000, 128), (8192, 16),
             (0, 16), (32, 16)]
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


# --- exercise 2: the utilisation of a batch ------------------------------------------------------


def batch_utilization(lengths: Sequence[int], block_size: int) -> float:
    """The library's pooled U_paged of sequences of ``lengths`` tokens sharing one pool."""
    manager = PagedKVManager(BlockPool(sum(-(-n // block_size) for n in lengths) + 1,
                                       block_size))
    for i, length in enumerate(lengths):
        manager.add_sequence(str(i), length)
    return manager.utilization()


def _utilization_cases() -> list[Case]:
    hint = ("utilisation is the share of all the slots the batch holds that hold a token: "
            "pool the batch before dividing, and an empty sequence holds no block")
    batches = [([900], 16), ([512, 128], 16), ([1, 17, 33], 16), ([900, 0, 16], 16),
               ([1000, 24], 128), ([100, 5000, 7, 7, 7], 32), ([2048] * 3, 16)]
    cases = [
        Case(f"fn(lengths={lengths}, block_size={b})", lambda fn, n=lengths, b=b: fn(list(n), b),
             batch_utilization(lengths, b), hint)
        for lengths, b in batches
    ]
    bad = "no tokens at all has no utilisation (zero over zero); a negative length or block size " \
          "is a mistake: raise ValueError naming it"
    cases += [Case(f"fn(lengths={lengths}, block_size={b})",
                   lambda fn, n=lengths, b=b: fn(list(n), b), Raises(ValueError), bad)
              for lengths, b in [([], 16), ([0, 0], 16), ([10, -1], 16), ([10], 0)]]
    return cases


# --- exercise 3: a pool that hands out the lowest free block ------------------------------------


def _free_count(pool: Any) -> Any:
    """``pool.num_free`` whether the learner wrote a property or a method."""
    value = pool.num_free
    return value() if callable(value) else value


Script = Sequence[tuple[str, int]]
"""``("allocate", 0)``, ``("free", block_id)`` or ``("count", 0)`` (read num_free)."""


def _play(pool: Any, script: Script) -> list[Any]:
    """Run ``script`` on ``pool``; what each allocate and count returned, in order."""
    seen = []
    for op, block in script:
        if op == "allocate":
            seen.append(pool.allocate())
        elif op == "free":
            pool.free(block)
        else:
            seen.append(_free_count(pool))
    return seen


class LowestFirstPool:
    """The expected behaviour: the library's checks, the lowest free id handed out first."""

    def __init__(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks, 1, free_order="fifo")  # rotation needs freed ids last
        self.in_use: set[int] = set()

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def allocate(self) -> int:
        if not self.pool.num_free:
            raise OutOfBlocks(1, 0)
        block = min(self.pool.free_blocks())
        while (taken := self.pool.allocate()) != block:  # rotate the queue to the lowest
            self.pool.free(taken)
        return block

    def free(self, block_id: int) -> None:
        self.pool.free(block_id)


def _script_text(size: int, script: Script) -> str:
    calls = {"allocate": "allocate()", "free": "free({})", "count": "num_free"}
    return (f"pool = cls({size}); " + "; ".join(calls[op].format(b) for op, b in script)
            + "  -> what each allocate() and num_free gave")


def _block_pool_cases() -> list[Case]:
    take = [("allocate", 0)]
    scripts: list[tuple[int, list[tuple[str, int]], str]] = [
        (8, take * 7, "block 0 is the null block: never handed out"),
        (8, [("count", 0), *take * 3, ("count", 0), ("free", 2), ("count", 0)],
         "num_free counts the blocks allocate can still hand out"),
        (8, [*take * 7, ("free", 2), ("free", 5), *take * 2],
         "the lowest free id comes first, whatever order the blocks were freed in"),
        (8, [*take * 4, ("free", 3), ("free", 1), *take * 3],
         "freed blocks are handed out again, lowest first, before untouched higher ones"),
        (64, [*take * 40, *(("free", b) for b in range(39, 0, -3)), *take * 5, ("count", 0)],
         "lowest first keeps the blocks in use packed at the start of the pool"),
    ]
    cases = [Case(_script_text(n, script), lambda cls, n=n, s=script: _play(cls(n), s),
                  _play(LowestFirstPool(n), script), why)
             for n, script, why in scripts]

    def recycle(cls: Any) -> list[Any]:
        pool, distinct = cls(8), True
        for _ in range(50):
            ids = [pool.allocate() for _ in range(5)]
            distinct = distinct and len(set(ids)) == 5
            for block in ids:
                pool.free(block)
        return [_free_count(pool), distinct]

    cases.append(Case("pool = cls(8); 50 rounds of allocate 5 and free them: "
                      "[num_free, ids distinct]", recycle, [7, True],
                      "allocate and free must balance: nothing lost, nothing twice"))
    cases.append(Case("pool = cls(8); allocate() 7 times; allocate()",
                      lambda cls: _play(cls(8), take * 8), Raises(RuntimeError),
                      "an empty pool raises OutOfBlocks (a RuntimeError), never hands out 0 or "
                      "a block in use"))
    refused = "raise ValueError naming the id: accepting it would later hand one block to " \
              "two requests"
    for why, script in [("the null block", [("free", 0)]),
                        ("a double free", [*take, ("free", 1), ("free", 1)]),
                        ("a block that is free already", [*take, ("free", 5)]),
                        ("not a block of this pool", [("free", 8)]),
                        ("a negative id", [*take, ("free", -1)])]:
        cases.append(Case(_script_text(8, script) + f"  # {why}",
                          lambda cls, s=script: _play(cls(8), s), Raises(ValueError),
                          f"{why}: {refused}"))
    return cases


# --- exercise 4: block tables and slot mappings -----------------------------------------------


Op = tuple[str, str, int]
"""``("add", seq_id, tokens)``, ``("append", seq_id, tokens)`` or ``("free", seq_id, 0)``."""


class LibraryTables:
    """``PagedKVManager`` behind the exercise's interface: add and append return slots."""

    def __init__(self, pool: BlockPool) -> None:
        self.manager = PagedKVManager(pool)

    def add_sequence(self, seq_id: str, num_tokens: int) -> list[int]:
        self.manager.add_sequence(seq_id, num_tokens)
        return self.manager.slot_mapping(seq_id, range(num_tokens))

    def append_tokens(self, seq_id: str, num_tokens: int = 1) -> list[int]:
        old = self.manager.seq_len(seq_id)
        self.manager.append_tokens(seq_id, num_tokens)
        return self.manager.slot_mapping(seq_id, range(old, old + num_tokens))

    def block_table(self, seq_id: str) -> list[int]:
        return list(self.manager.block_table(seq_id))

    def free_sequence(self, seq_id: str) -> None:
        self.manager.free_sequence(seq_id)


def _replay(tables: Any, ops: Sequence[Op]) -> list[Any]:
    """Run ``ops``; every slot that add and append returned, in order, as one list."""
    slots: list[Any] = []
    for op, seq, tokens in ops:
        if op == "add":
            slots.extend(tables.add_sequence(seq, tokens))
        elif op == "append":
            slots.extend(tables.append_tokens(seq, tokens))
        else:
            tables.free_sequence(seq)
    return slots


def _ops_text(ops: Sequence[Op]) -> str:
    calls = {"add": "add_sequence({!r}, {})", "append": "append_tokens({!r}, {})",
             "free": "free_sequence({!r})"}
    return "; ".join(calls[op].format(seq, tokens) for op, seq, tokens in ops)


def _outcome(cls: Any, num_blocks: int, ops: Sequence[Op], seqs: Sequence[str]) -> list[Any]:
    """Replay ``ops`` on a fresh library pool: [the slots, each table in ``seqs``, num_free]."""
    pool = BlockPool(num_blocks, 16)
    tables = cls(pool)
    slots = _replay(tables, ops)
    return [slots, *(list(tables.block_table(s)) for s in seqs), pool.num_free]


def _refused(cls: Any, num_blocks: int, setup: Sequence[Op], refused: Op,
             after: Sequence[Op], seqs: Sequence[str]) -> list[Any]:
    """Replay ``setup``; ``refused`` must raise OutOfBlocks; then ``after`` must still work."""
    pool = BlockPool(num_blocks, 16)
    tables = cls(pool)
    _replay(tables, setup)
    try:
        _replay(tables, [refused])
        raised = "nothing raised"
    except OutOfBlocks:
        raised = "OutOfBlocks"
    state = [raised, pool.num_free, *(list(tables.block_table(s)) for s in seqs)]
    return [*state, _replay(tables, after), pool.num_free]


def _growth(cls: Any) -> list[int]:
    """Table length after each single-token append from 0 to 40 tokens."""
    tables = cls(BlockPool(8, 16))
    tables.add_sequence("a", 0)
    lengths = []
    for _ in range(40):
        tables.append_tokens("a", 1)
        lengths.append(len(tables.block_table("a")))
    return lengths


def _block_table_cases() -> list[Case]:
    hint = ("a token's slot is where its keys and values sit in the pool, found through the "
            "table, not from its position alone; a new block only when the last one is full")
    scenarios: list[tuple[int, list[Op], list[str], str]] = [
        (64, [("add", "chat", 600), ("append", "chat", 300)], ["chat"],
         "a prompt of 600, then 300 tokens in one append"),
        (16, [("add", "a", 20), ("add", "b", 10), ("append", "a", 13), ("append", "b", 6),
              ("append", "b", 1)], ["a", "b"],
         "two sequences interleave: each table lists its own blocks in logical order"),
        (16, [("add", "a", 16), ("append", "a", 16), ("append", "a", 1)], ["a"],
         "16 tokens fill one block exactly; the 33rd token needs a third block"),
        (16, [("add", "a", 40), ("add", "b", 5), ("free", "a", 0), ("append", "b", 30)], ["b"],
         "free_sequence returns every block; b's new blocks may be a's old ones"),
        (16, [("add", "a", 40), ("free", "a", 0), ("add", "a", 3)], ["a"],
         "a freed sequence is forgotten: its id may start again"),
        (8, [("add", "a", 0), ("append", "a", 1), ("add", "b", 0), ("append", "b", 17)],
         ["a", "b"], "an empty prompt holds no block until its first token"),
    ]
    cases = [
        Case(f"pool = BlockPool({n}, 16); t = cls(pool); {_ops_text(ops)}; "
             f"[slots returned, *[t.block_table(s) for s in {seqs}], pool.num_free]",
             lambda cls, n=n, o=ops, s=seqs: _outcome(cls, n, o, s),
             _outcome(LibraryTables, n, ops, seqs), f"{why}; {hint}")
        for n, ops, seqs, why in scenarios
    ]
    cases.append(Case("t = cls(BlockPool(8, 16)); add_sequence('a', 0); table length after "
                      "each of 40 single-token appends", _growth, _growth(LibraryTables),
                      "allocate on demand: a new block at tokens 1, 17 and 33, never earlier"))
    refusals: list[tuple[int, list[Op], Op, list[Op], list[str], str]] = [
        (5, [("add", "a", 40)], ("append", "a", 40), [("append", "a", 8)], ["a"],
         "append: a needs 2 more blocks and 1 is free"),
        (4, [("add", "a", 20)], ("add", "b", 60), [("add", "b", 16)], ["a"],
         "add: b needs 4 blocks and 1 is free; b is not created"),
    ]
    for n, setup, refused, after, seqs, why in refusals:
        cases.append(Case(
            f"pool = BlockPool({n}, 16); t = cls(pool); {_ops_text(setup)}; "
            f"{_ops_text([refused])} -> [what it raised, pool.num_free, tables of {seqs}, "
            f"then {_ops_text(after)}'s slots, pool.num_free]  # {why}",
            lambda cls, a=(n, setup, refused, after, seqs): _refused(cls, *a),
            _refused(LibraryTables, n, setup, refused, after, seqs),
            "a request the pool cannot serve in full is refused with OutOfBlocks and "
            "changes nothing: no block taken, no table or length changed"))
    errors = [
        ([("free", "ghost", 0)], "an unknown sequence id is a bug"),
        ([("append", "ghost", 1)], "an unknown sequence id is a bug"),
        ([("add", "a", 5), ("add", "a", 5)], "a live id cannot be added twice"),
        ([("add", "a", 5), ("free", "a", 0), ("free", "a", 0)],
         "a freed sequence is forgotten: freeing it again is a bug"),
        ([("add", "a", -3)], "a negative length is a mistake"),
        ([("add", "a", 5), ("append", "a", 0)], "an append brings at least one token"),
    ]
    cases += [Case(f"t = cls(BlockPool(8, 16)); {_ops_text(ops)}",
                   lambda cls, o=ops: _replay(cls(BlockPool(8, 16)), o), Raises(ValueError),
                   f"{why}: raise ValueError naming it")
              for ops, why in errors]
    return cases


# --- exercise 5: cost per million tokens when steps slow down ------------------------------------


Step = tuple[int, int, int]
"""One decode step: (tokens decoded, KV tokens read, tokens prefilled)."""


def cost_per_million(steps: Sequence[Step], bytes_per_token: int, step_seconds: float = 0.025,
                     kv_read_bandwidth: float = 3e12, prefill_seconds_per_token: float = 4e-5,
                     price_per_hour: float = 250.0) -> float:
    """The expected answer: every step timed by the library's CostModel, priced per hour."""
    costs = CostModel(step_seconds=step_seconds, kv_read_bandwidth=kv_read_bandwidth,
                      prefill_seconds_per_token=prefill_seconds_per_token,
                      price_per_hour=price_per_hour)
    decoded = sum(d for d, _, _ in steps)
    if decoded < 1:
        raise ValueError(f"{len(steps)} steps decoded {decoded} tokens: no cost per token")
    seconds = sum(costs.step_time(kv * bytes_per_token, prefill, 0, 0)
                  for _, kv, prefill in steps)
    return costs.price_per_hour * seconds / 3600 / decoded * 1e6


def _cost_cases() -> list[Case]:
    hint = ("every step costs time, even one that decodes nothing: its fixed part, its KV "
            "bytes over the bandwidth and its prefill; price the hours, then share them over "
            "the decoded tokens (millions of them)")
    guide = 131_072
    runs: list[tuple[str, list[Step], int, dict[str, float]]] = [
        ("one step of 60 requests at 900 tokens", [(60, 60 * 900, 0)], guide, {}),
        ("a prefill step, then decode", [(1, 600, 600), *[(1, 600 + i, 0) for i in range(99)]],
         guide, {}),
        ("an idle step costs time too", [(4, 4000, 0), (0, 0, 0), (4, 4004, 0)], guide, {}),
        ("flat 25 ms steps (no KV term)", [(10, 9000, 0)] * 5, guide,
         {"kv_read_bandwidth": 1e30, "prefill_seconds_per_token": 0.0}),
        ("40 ms, 90/h, 1 TB/s", [(32, 32 * 2000, 128), (32, 32 * 2001, 0)], 16_384,
         {"step_seconds": 0.04, "price_per_hour": 90.0, "kv_read_bandwidth": 1e12}),
    ]
    cases = [
        Case(f"fn(steps={steps if len(steps) < 6 else f'[{len(steps)} steps]'}, "
             f"bytes_per_token={per}{''.join(f', {k}={v}' for k, v in extra.items())})  # {why}",
             lambda fn, s=steps, p=per, e=extra: fn(list(s), p, **e),
             cost_per_million(steps, per, **extra), hint)
        for why, steps, per, extra in runs
    ]
    cases += [Case(f"fn(steps={steps}, bytes_per_token={guide})  # {why}",
                   lambda fn, s=steps: fn(list(s), guide), Raises(ValueError),
                   "no decoded token, no cost per token: raise ValueError")
              for steps, why in [([], "no steps"), ([(0, 0, 100)], "a prefill-only run")]]
    return cases


# --- exercise 6: a batch of block tables for the kernel -------------------------------------------


def _library_batch(num_blocks: int, ops: Sequence[Op]) -> tuple[Any, Any, list[Any]]:
    """Replay ``ops`` with the library: the live tables, their lengths, and ``batch_tables``."""
    tables = LibraryTables(BlockPool(num_blocks, 16))
    _replay(tables, ops)
    manager = tables.manager
    seqs = manager.sequences
    packed, _ = manager.batch_tables(seqs)
    return ([list(manager.block_table(s)) for s in seqs], [manager.seq_len(s) for s in seqs],
            [packed.tolist(), True])


def _pack(fn: Any, tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[Any]:
    """Call the learner on copies: [the packed rows as plain ints, were the inputs untouched]."""
    given = [list(table) for table in tables]
    out = fn(given, list(lengths), 16)
    return [[[int(b) for b in row] for row in out], given == [list(t) for t in tables]]


def _pack_cases() -> list[Case]:
    hint = ("every row as wide as the longest table, the gaps filled with the block no "
            "request owns; the caller's tables stay as they were")
    scenarios: list[tuple[int, list[Op], str]] = [
        (64, [("add", "chat", 600), ("add", "other", 100), ("append", "other", 150)],
         "the lecture's chat and its companion"),
        (16, [("add", "a", 20), ("add", "b", 10), ("append", "a", 13), ("add", "c", 0)],
         "three sequences, one still empty"),
        (16, [("add", "a", 40), ("add", "b", 5), ("free", "a", 0), ("append", "b", 30),
              ("add", "c", 60)], "after a sequence was freed"),
        (8, [], "an empty batch"),
    ]
    cases = []
    for n, ops, why in scenarios:
        tables, lengths, expected = _library_batch(n, ops)
        cases.append(Case(f"fn(tables={tables}, seq_lens={lengths}, block_size=16)  # {why} "
                          "-> [rows, inputs unchanged]",
                          lambda fn, t=tables, ln=lengths: _pack(fn, t, ln), expected, hint))
    bad = [([[1, 2]], [40], "a table one block short of its length"),
           ([[1, 2, 3, 4]], [40], "a table with a block its length does not need"),
           ([[1, 2, 3], [4]], [40, 17], "the second table is one block short"),
           ([[3, 0, 5]], [40], "a live table holding the null block"),
           ([[1], [2]], [5], "two tables, one length")]
    cases += [Case(f"fn(tables={t}, seq_lens={ln}, block_size=16)  # {why}",
                   lambda fn, t=t, ln=ln: _pack(fn, t, ln), Raises(ValueError),
                   "a table that does not match its length, or holds the null block, would make "
                   "the kernel read the wrong memory: raise ValueError naming it (check them all)")
              for t, ln, why in bad]
    return cases


EXERCISES = (
    Exercise("03.last_block", "Blocks for a length, and the last block's fill",
             _last_block_cases,
             reference=("course_lib.paged.PagedKVManager", "course_lib.kv_math.blocks_needed")),
    Exercise("03.u_paged", "Utilisation of a batch of paged sequences", _utilization_cases,
             reference=("course_lib.kv_math.paged_utilization",)),
    Exercise("03.block_pool", "A pool that hands out the lowest free block", _block_pool_cases,
             reference=()),  # the library's pool hands out another order: no answer key
    Exercise("03.block_tables", "Block tables that map tokens to slots, all or nothing",
             _block_table_cases,
             reference=("course_lib.paged.PagedKVManager",)),
    Exercise("03.cost_per_million", "Cost per million tokens when steps slow down",
             _cost_cases,
             reference=("course_lib.simulator.simulate", "course_lib.simulator.SimResult",
                        "course_lib.simulator.CostModel")),
    Exercise("03.pack_tables", "A batch of block tables for the kernel", _pack_cases,
             reference=("course_lib.paged.PagedKVManager.batch_tables",)),
)
