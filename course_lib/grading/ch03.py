"""Chapter 03 exercises: block tables. Expected values come from ``course_lib.paged``,
``course_lib.kv_math`` and ``course_lib.simulator``.

The lecture shows the free queue and allocate-on-demand as ideas, not code; the exercises
ask for the next step of each from a specification: the utilisation of a whole batch, a
pool that hands out the lowest free block, block tables that say where each new token's
keys and values go (and refuse a request they cannot serve in full), and the cost of a run
whose steps slow down with what they read. Classes are exercised through their methods
only, and every case returns plain data, labelled part by part; a wrong number that a
known mistake gives is recognised, so its hint names that mistake.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from course_lib.grading.ch01 import bad_length_cases
from course_lib.grading.check import (
    Case,
    Exercise,
    Raises,
    labelled,
    recognising,
    unique_labels,
)
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.simulator import CostModel

# --- 03.last_block: blocks and the last block's fill -----------------------------------------


def _last_block(tokens: int, block_size: int) -> tuple[int, int]:
    """(blocks a sequence of ``tokens`` holds, tokens in its last block), from the library."""
    manager = PagedKVManager(BlockPool(tokens // block_size + 2, block_size))
    manager.add_sequence("s", tokens)
    table = manager.block_table("s")
    if not table:
        return 0, 0
    fill = {b.block_id: b.tokens for b in manager.snapshot().blocks}
    return len(table), fill[table[-1]]


LAST_LABELS = ("blocks", "tokens in the last block")


def _last_block_case(tokens: int, block_size: int) -> Case:
    blocks, fill = _last_block(tokens, block_size)
    mistakes = [
        ({"blocks": blocks, "tokens in the last block": tokens % block_size},
         "a length that fills its blocks exactly has a full last block, not an empty one"),
        ({"blocks": blocks, "tokens in the last block": (tokens - 1) % block_size + 1},
         "an empty sequence has no last block: it holds 0 blocks and 0 tokens in them"),
    ]
    return Case(f"fn(tokens={tokens}, block_size={block_size}) -> (blocks, tokens in the last "
                "block)", lambda fn, t=tokens, b=block_size: labelled(LAST_LABELS, fn(t, b)),
                dict(zip(LAST_LABELS, (blocks, fill), strict=True)),
                "count the blocks first, then what the last of them holds",
                compare=recognising(mistakes),
                hints={"blocks": "a partly filled last block is still a block"})


def _last_block_cases() -> list[Case]:
    pairs = [(900, 16), (896, 16), (897, 16), (1, 16), (16, 16), (1000, 128), (8192, 16),
             (0, 16), (32, 16)]
    return [*(_last_block_case(t, b) for t, b in pairs), *bad_length_cases(10, 0, -1, 16)]


def _last_block_fresh(seed: int) -> list[Case]:
    """At a seeded block size: whole blocks, one token past them, a partly filled last
    block, no tokens, less than a block; then both bad inputs."""
    rng = random.Random(seed)
    b = rng.choice([8, 16, 32, 128])
    whole = rng.randint(1, 400) * b
    lengths = [whole, whole + 1, whole + rng.randint(2, b - 1), 0, rng.randint(1, b - 1)]
    return [*(_last_block_case(t, b) for t in lengths),
            *bad_length_cases(rng.randint(1, 5000), -rng.randint(0, 16),
                                   -rng.randint(1, 5000), rng.choice([8, 16, 32, 128]))]


# --- 03.u_paged: the utilisation of a batch ------------------------------------------------------


def batch_utilization(lengths: Sequence[int], block_size: int) -> float:
    """The library's pooled U_paged of sequences of ``lengths`` tokens sharing one pool."""
    manager = PagedKVManager(BlockPool(sum(-(-n // block_size) for n in lengths) + 1,
                                       block_size))
    for i, length in enumerate(lengths):
        manager.add_sequence(str(i), length)
    return manager.utilization()


def _utilization_mistakes(lengths: Sequence[int], block_size: int) -> list[tuple[float, str]]:
    """What each recognised mistake gives for the batch, with its hint."""
    def pooled(held: Sequence[int]) -> float:
        return sum(lengths) / (sum(held) * block_size)

    live = [n for n in lengths if n]
    mean = sum(n / (-(-n // block_size) * block_size) for n in live) / len(live)
    return [
        (mean, "pool the batch before dividing: the mean of each sequence's utilisation "
               "weighs a short sequence as much as a long one"),
        (pooled([n // block_size or 1 for n in lengths]),
         "a partly filled last block is still a block the sequence holds"),
        (pooled([max(1, -(-n // block_size)) for n in lengths]),
         "a sequence of 0 tokens holds no block"),
    ]


def _utilization_case(lengths: Sequence[int], block_size: int) -> Case:
    return Case(f"fn(lengths={list(lengths)}, block_size={block_size})",
                lambda fn, n=tuple(lengths), b=block_size: fn(list(n), b),
                batch_utilization(lengths, block_size),
                "utilisation is the share of all the slots the batch holds that hold a token",
                compare=recognising(_utilization_mistakes(lengths, block_size)))


def _utilization_cases() -> list[Case]:
    batches = [([900], 16), ([512, 128], 16), ([1, 17, 33], 16), ([900, 0, 16], 16),
               ([1000, 24], 128), ([100, 5000, 7, 7, 7], 32), ([2048] * 3, 16)]
    return [*(_utilization_case(lengths, b) for lengths, b in batches),
            *_no_utilization_cases([([], 16), ([0, 0], 16), ([10, -1], 16), ([10], 0)])]


def _no_utilization_cases(batches: Sequence[tuple[list[int], int]]) -> list[Case]:
    bad = ("no tokens at all has no utilisation (zero over zero); a negative length or block "
           "size is a mistake: raise ValueError naming it")
    return [Case(f"fn(lengths={lengths}, block_size={b})",
                 lambda fn, n=tuple(lengths), b=b: fn(list(n), b), Raises(ValueError), bad)
            for lengths, b in batches]


def _utilization_fresh(seed: int) -> list[Case]:
    """Seeded batches, one with an empty sequence; then no sequences, only empty ones, a
    negative length, and a block size below 1."""
    rng = random.Random(seed)
    batches = [[rng.randint(1, 3000) for _ in range(rng.randint(1, 6))] for _ in range(3)]
    batches[0].insert(rng.randint(0, len(batches[0])), 0)
    sizes = [rng.choice([8, 16, 32, 128]) for _ in batches]
    negative = [*batches[1]]
    negative.insert(rng.randint(0, len(negative)), -rng.randint(1, 99))
    return [*(_utilization_case(lengths, b) for lengths, b in zip(batches, sizes, strict=True)),
            *_no_utilization_cases([([], sizes[0]), ([0] * rng.randint(1, 5), sizes[1]),
                                    (negative, sizes[2]), (batches[2], -rng.randint(0, 16))])]


# --- 03.block_pool: a pool that hands out the lowest free block ---------------------------------


def _free_count(pool: Any) -> Any:
    """``pool.num_free`` whether the learner wrote a property or a method."""
    value = pool.num_free
    return value() if callable(value) else value


Script = Sequence[tuple[str, int]]
"""``("allocate", 0)``, ``("free", block_id)`` or ``("count", 0)`` (read num_free)."""


def _play(pool: Any, script: Script) -> dict[str, Any]:
    """Run ``script`` on ``pool``; what each allocate and count returned, by its call."""
    labels = iter(unique_labels(["allocate()" if op == "allocate" else "num_free"
                                 for op, _ in script if op != "free"]))
    seen = {}
    for op, block in script:
        if op == "allocate":
            seen[next(labels)] = pool.allocate()
        elif op == "free":
            pool.free(block)
        else:
            seen[next(labels)] = _free_count(pool)
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


COUNT_HINT = "num_free counts the blocks allocate can still hand out: never the null block"


def _block_pool_case(size: int, script: Script, hint: str) -> Case:
    return Case(_script_text(size, script), lambda cls, n=size, s=tuple(script): _play(cls(n), s),
                _play(LowestFirstPool(size), script), hint, hints={"num_free": COUNT_HINT})


def _recycle(cls: Any, size: int, take: int, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds of ``take`` allocations freed again: num_free, and whether every
    round's ids were distinct."""
    pool, distinct = cls(size), True
    for _ in range(rounds):
        ids = [pool.allocate() for _ in range(take)]
        distinct = distinct and len(set(ids)) == take
        for block in ids:
            pool.free(block)
    return {"num_free": _free_count(pool), "ids distinct in every round": distinct}


def _recycle_case(size: int, take: int, rounds: int) -> Case:
    return Case(f"pool = cls({size}); {rounds} rounds of allocate {take} and free them -> "
                "num_free, and whether the ids of every round were distinct",
                lambda cls, a=(size, take, rounds): _recycle(cls, *a),
                _recycle(LowestFirstPool, size, take, rounds),
                "allocate and free must balance: nothing lost, nothing twice",
                hints={"num_free": COUNT_HINT})


def _exhausted_case(size: int) -> Case:
    return Case(f"pool = cls({size}); allocate() {size - 1} times; allocate()",
                lambda cls, n=size: _play(cls(n), [("allocate", 0)] * n), Raises(RuntimeError),
                "an empty pool raises OutOfBlocks (a RuntimeError), never hands out 0 or a "
                "block in use")


def _bad_frees(size: int, taken: int, twice: int, free: int, outside: int,
               negative: int) -> list[Case]:
    """Frees a pool of ``size`` blocks must refuse, after ``taken`` allocations: the null
    block, ``twice`` freed twice, ``free`` (never handed out), ``outside`` the pool, and a
    ``negative`` id."""
    take = [("allocate", 0)] * taken
    refused = "raise ValueError naming the id: accepting it would later hand one block to " \
              "two requests"
    return [Case(_script_text(size, script) + f"  # {why}",
                 lambda cls, n=size, s=script: _play(cls(n), s), Raises(ValueError),
                 f"{why}: {refused}")
            for why, script in [("the null block", [("free", 0)]),
                                ("a double free", [*take, ("free", twice), ("free", twice)]),
                                ("a block that is free already", [*take, ("free", free)]),
                                ("not a block of this pool", [("free", outside)]),
                                ("a negative id", [*take, ("free", negative)])]]


def _block_pool_cases() -> list[Case]:
    take = [("allocate", 0)]
    scripts: list[tuple[int, list[tuple[str, int]], str]] = [
        (8, take * 7, "block 0 is the null block: never handed out"),
        (8, [("count", 0), *take * 3, ("count", 0), ("free", 2), ("count", 0)], COUNT_HINT),
        (8, [*take * 7, ("free", 2), ("free", 5), *take * 2],
         "the lowest free id comes first, whatever order the blocks were freed in"),
        (8, [*take * 4, ("free", 3), ("free", 1), *take * 3],
         "freed blocks are handed out again, lowest first, before untouched higher ones"),
        (64, [*take * 40, *(("free", b) for b in range(39, 0, -3)), *take * 5, ("count", 0)],
         "lowest first keeps the blocks in use packed at the start of the pool"),
    ]
    return [*(_block_pool_case(n, script, why) for n, script, why in scripts),
            _recycle_case(8, 5, 50), _exhausted_case(8), *_bad_frees(8, 1, 1, 5, 8, -1)]


def _block_pool_fresh(seed: int) -> list[Case]:
    """A seeded script; blocks freed in address order before untouched higher ones are left;
    rounds that must balance, an empty pool, and each refused free, on seeded pools."""
    rng = random.Random(seed)
    size, held, script = rng.randint(6, 20), [], []
    pool = LowestFirstPool(size)
    for _ in range(24):
        roll = rng.random()
        if held and roll < 0.4:
            block = held.pop(rng.randrange(len(held)))
            pool.free(block)
            script.append(("free", block))
        elif roll < 0.5 or not pool.num_free:
            script.append(("count", 0))
        else:
            held.append(pool.allocate())
            script.append(("allocate", 0))
    lowest = "the lowest free id comes first, whatever order the blocks were freed in"
    cases = [_block_pool_case(size, script, lowest)]
    size = rng.randint(8, 30)
    taken = rng.randint(4, size - 2)
    freed = sorted(rng.sample(range(1, taken + 1), rng.randint(2, taken)))
    take = [("allocate", 0)]
    cases.append(_block_pool_case(size, [*take * taken, *(("free", b) for b in freed),
                                         *take * (len(freed) + 1), ("count", 0)], lowest))
    return [*cases, _recycle_case(size, rng.randint(2, size - 1), rng.randint(10, 60)),
            _exhausted_case(rng.randint(2, 40)),
            *_bad_frees(size, taken, rng.choice(freed), rng.randint(taken + 1, size - 1),
                        rng.randint(size, size + 50), -rng.randint(1, 50))]


# --- 03.block_tables: block tables and slot mappings ------------------------------------------


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


class HeadFirstTables(LibraryTables):
    """The mistake of freeing a table first block first (one batch, or block by block from
    the last, each to the front): the first block is handed out next."""

    def free_sequence(self, seq_id: str) -> None:
        pool, table = self.manager.pool, self.manager.block_table(seq_id)
        for block in table:
            pool.share(block)  # held once more, so the manager's free releases nothing
        self.manager.free_sequence(seq_id)
        pool.free_batch(list(table))


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


def _outcome(cls: Any, num_blocks: int, ops: Sequence[Op], seqs: Sequence[str]) -> dict[str, Any]:
    """Replay ``ops`` on a fresh library pool: the slots, each table in ``seqs``, num_free."""
    pool = BlockPool(num_blocks, 16)
    tables = cls(pool)
    slots = _replay(tables, ops)
    return {"slots": slots, **{f"block_table[{s}]": list(tables.block_table(s)) for s in seqs},
            "pool.num_free": pool.num_free}


def _refused(cls: Any, num_blocks: int, setup: Sequence[Op], refused: Op,
             after: Sequence[Op], seqs: Sequence[str]) -> dict[str, Any]:
    """Replay ``setup``; ``refused`` must raise OutOfBlocks; then ``after`` must still work."""
    pool = BlockPool(num_blocks, 16)
    tables = cls(pool)
    _replay(tables, setup)
    try:
        _replay(tables, [refused])
        raised = "nothing raised"
    except OutOfBlocks:
        raised = "OutOfBlocks"
    state = {"pool.num_free": pool.num_free,
             **{f"block_table[{s}]": list(tables.block_table(s)) for s in seqs}}
    return {"the refused call raised": raised, "after the refusal": state,
            "then": {"slots": _replay(tables, after), "pool.num_free": pool.num_free}}


def _growth(cls: Any, start: int, count: int) -> dict[str, int]:
    """Table length after each of ``count`` single-token appends to ``start`` tokens."""
    tables = cls(BlockPool(8, 16))
    tables.add_sequence("a", start)
    lengths = {}
    for tokens in range(start + 1, start + count + 1):
        tables.append_tokens("a", 1)
        lengths[f"len(block_table[a]) at {tokens} tokens"] = len(tables.block_table("a"))
    return lengths


LAST_FIRST = ("free_sequence returns every block in ONE batch (free_batch), last block first, "
              "so the freed sequence's LAST block is the next one handed out and its first "
              "block the last")

TABLE_HINTS = {
    "slots": "a token's slot is where its keys and values sit in the pool: found through the "
             "table (its block's first slot plus its offset in the block), not from its "
             "position alone",
    "block_table": "allocate on demand: a new block only when the last one is full, and a "
                   "block for every started block of tokens",
    "pool.num_free": "every block a table holds comes from the pool, and free_sequence gives "
                     "every one back",
    "raised": "a table needs a block for every started block of its tokens, a partly filled "
              "one too",
    "len(block_table[a])": "allocate on demand: a new block at tokens 1, 17 and 33, never "
                           "earlier",
}
"""Hints by the part of a block-table outcome that differs."""


def _tables_case(num_blocks: int, ops: Sequence[Op], seqs: Sequence[str], hint: str,
                 hints: dict[str, str] | None = None) -> Case:
    return Case(f"pool = BlockPool({num_blocks}, 16); t = cls(pool); {_ops_text(ops)} -> the "
                f"slots returned, block_table of {list(seqs)}, pool.num_free",
                lambda cls, n=num_blocks, o=tuple(ops), s=tuple(seqs): _outcome(cls, n, o, s),
                _outcome(LibraryTables, num_blocks, ops, seqs), hint,
                compare=recognising([(_outcome(HeadFirstTables, num_blocks, ops, seqs),
                                      LAST_FIRST)]),
                hints=TABLE_HINTS | (hints or {}))


def _block_table_cases() -> list[Case]:
    forgotten = "a freed sequence is forgotten: its id may start again"
    scenarios: list[tuple[int, list[Op], list[str], str, dict[str, str]]] = [
        (64, [("add", "chat", 600), ("append", "chat", 300)], ["chat"],
         "a prompt of 600, then 300 tokens in one append", {}),
        (16, [("add", "a", 20), ("add", "b", 10), ("append", "a", 13), ("append", "b", 6),
              ("append", "b", 1)], ["a", "b"],
         "two sequences interleave: each table lists its own blocks in logical order", {}),
        (16, [("add", "a", 16), ("append", "a", 16), ("append", "a", 1)], ["a"],
         "16 tokens fill one block exactly; the 33rd token needs a third block", {}),
        (16, [("add", "a", 40), ("add", "b", 5), ("free", "a", 0), ("append", "b", 30)], ["b"],
         "a frees 3 blocks, then b takes 2 of them: " + LAST_FIRST, {"slots": LAST_FIRST}),
        (16, [("add", "a", 40), ("free", "a", 0), ("add", "a", 3)], ["a"],
         forgotten, {"raised": forgotten}),
        (8, [("add", "a", 0), ("append", "a", 1), ("add", "b", 0), ("append", "b", 17)],
         ["a", "b"], "an empty prompt holds no block until its first token", {}),
    ]
    cases = [_tables_case(*scenario) for scenario in scenarios]
    cases.append(_growth_case(0, 40))
    refusals: list[tuple[int, list[Op], Op, list[Op], list[str], str]] = [
        (5, [("add", "a", 40)], ("append", "a", 40), [("append", "a", 8)], ["a"],
         "append: a needs 2 more blocks and 1 is free"),
        (4, [("add", "a", 20)], ("add", "b", 60), [("add", "b", 16)], ["a"],
         "add: b needs 4 blocks and 1 is free; b is not created"),
    ]
    return [*cases, *(_refusal_case(*refusal) for refusal in refusals),
            *_table_bugs("ghost", "a", 5, -3)]


def _growth_case(start: int, count: int) -> Case:
    return Case(f"t = cls(BlockPool(8, 16)); add_sequence('a', {start}); table length after "
                f"each of {count} single-token appends",
                lambda cls, a=(start, count): _growth(cls, *a),
                _growth(LibraryTables, start, count), TABLE_HINTS["len(block_table[a])"],
                hints=TABLE_HINTS)


REFUSAL = ("a request the pool cannot serve in full is refused with OutOfBlocks and changes "
           "nothing: no block taken, no table or length changed")


def _refusal_case(num_blocks: int, setup: Sequence[Op], refused: Op, after: Sequence[Op],
                  seqs: Sequence[str], why: str) -> Case:
    return Case(f"pool = BlockPool({num_blocks}, 16); t = cls(pool); {_ops_text(setup)}; "
                f"{_ops_text([refused])} -> what it raised, pool.num_free and block_table of "
                f"{list(seqs)} after the refusal, then {_ops_text(after)}'s slots and "
                f"pool.num_free  # {why}",
                lambda cls, a=(num_blocks, setup, refused, after, seqs): _refused(cls, *a),
                _refused(LibraryTables, num_blocks, setup, refused, after, seqs), REFUSAL,
                hints={"raised": f"{REFUSAL}; a refused add creates no sequence, so the same id "
                                 "may be added later", "then": REFUSAL})


def _table_bugs(ghost: str, seq: str, tokens: int, negative: int) -> list[Case]:
    """Calls that are bugs: on the unknown ``ghost``, adding ``seq`` twice or freeing it
    twice, a ``negative`` length, an empty append."""
    errors = [
        ([("free", ghost, 0)], "an unknown sequence id is a bug"),
        ([("append", ghost, 1)], "an unknown sequence id is a bug"),
        ([("add", seq, tokens), ("add", seq, tokens)], "a live id cannot be added twice"),
        ([("add", seq, tokens), ("free", seq, 0), ("free", seq, 0)],
         "a freed sequence is forgotten: freeing it again is a bug"),
        ([("add", seq, negative)], "a negative length is a mistake"),
        ([("add", seq, tokens), ("append", seq, 0)], "an append brings at least one token"),
    ]
    return [Case(f"t = cls(BlockPool(8, 16)); {_ops_text(ops)}",
                 lambda cls, o=tuple(ops): _replay(cls(BlockPool(8, 16)), o), Raises(ValueError),
                 f"{why}: raise ValueError naming it")
            for ops, why in errors]


def _random_ops(rng: random.Random, num_blocks: int, count: int) -> list[Op]:
    """Adds, appends and frees that the pool can always serve."""
    tables, live, ops = LibraryTables(BlockPool(num_blocks, 16)), [], []
    for index in range(count):
        roll, free = rng.random(), tables.manager.pool.num_free
        if live and roll < 0.25:
            op: Op = ("free", live.pop(rng.randrange(len(live))), 0)
        elif live and roll < 0.7:
            seq = rng.choice(live)
            room = -tables.manager.seq_len(seq) % 16 + 16 * free
            if room < 1:
                continue
            op = ("append", seq, rng.randint(1, min(room, 40)))
        elif free:
            op = ("add", f"s{index}", rng.randint(0, 16 * free))
            live.append(op[1])
        else:
            continue
        _replay(tables, [op])
        ops.append(op)
    return ops


def _block_table_fresh(seed: int) -> list[Case]:
    """A seeded script that ends by freeing its longest sequence and adding its id again
    with nearly every free block; appends one token at a time from a seeded length; an
    append and an add the pool cannot serve; each bug, at seeded ids and lengths."""
    rng = random.Random(seed)
    num_blocks = rng.randint(8, 24)
    ops = _random_ops(rng, num_blocks, 10)
    tables = LibraryTables(BlockPool(num_blocks, 16))
    _replay(tables, ops)
    live = list(tables.manager.sequences)
    again = max(live, key=lambda seq: len(tables.block_table(seq)), default="again")
    reuse: list[Op] = [*([] if live else [("add", again, 0)]), ("free", again, 0)]
    _replay(tables, reuse)
    spare = tables.manager.pool.num_free  # the new add takes nearly all: their order shows
    reuse.append(("add", again, rng.randint(16 * max(spare - 1, 0), 16 * spare)))
    seqs = sorted({*live, again})
    pool = rng.randint(4, 12)
    held = rng.randint(1, 16 * (pool - 2))
    free = pool - 1 - -(-held // 16)
    room = -held % 16 + 16 * free
    setup: list[Op] = [("add", "a", held)]
    return [
        _tables_case(num_blocks, [*ops, *reuse], seqs, "each table lists its own blocks in "
                     "logical order; a freed sequence is forgotten: its id may start again",
                     {"raised": "a freed sequence is forgotten: its id may start again"}),
        _growth_case(rng.randint(1, 40), rng.randint(20, 40)),
        _refusal_case(pool, setup, ("append", "a", room + rng.randint(1, 16)),
                      [("append", "a", rng.randint(1, room))], ["a"],
                      f"append: a needs more blocks than the {free} free"),
        _refusal_case(pool, setup, ("add", "b", 16 * free + rng.randint(1, 16)),
                      [("add", "b", rng.randint(0, 16 * free))], ["a"],
                      f"add: b needs more blocks than the {free} free; b is not created"),
        *_table_bugs(f"ghost{rng.randint(0, 99)}", f"s{rng.randint(0, 99)}", rng.randint(0, 99),
                     -rng.randint(1, 99)),
    ]


# --- 03.cost_per_million: cost per million tokens when steps slow down ---------------------------


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


def _cost_mistakes(steps: Sequence[Step], per: int, extra: dict[str, float]) -> list[
        tuple[float, str]]:
    """What each recognised mistake gives for the run, with its hint."""
    def priced(run: Sequence[Step], **changed: Any) -> float | None:
        try:
            return cost_per_million(run, **({"bytes_per_token": per} | extra | changed))
        except ValueError:
            return None

    decoding = [step for step in steps if step[0]]
    as_output = [(d + p, kv, p) for d, kv, p in steps]
    right = priced(steps) or 0.0
    return [
        (priced(decoding), "every step costs time, even one that decodes nothing"),
        (priced(steps, bytes_per_token=0), "a step also reads the keys and values it attends "
                                           "over: its KV bytes over the bandwidth is time too"),
        (priced(as_output), "only decoded tokens are sold: prefilled prompt tokens cost time "
                            "but are not output"),
        (right * 3600, "the price is per hour: turn the seconds into hours first"),
        (right / 1e6, "the answer is per million decoded tokens, not per token"),
    ]


def _cost_case(why: str, steps: Sequence[Step], per: int, extra: dict[str, float]) -> Case:
    shown = list(steps) if len(steps) < 6 else f"[{len(steps)} steps]"
    return Case(f"fn(steps={shown}, bytes_per_token={per}"
                f"{''.join(f', {k}={v}' for k, v in extra.items())})  # {why}",
                lambda fn, s=tuple(steps), p=per, e=dict(extra): fn(list(s), p, **e),
                cost_per_million(steps, per, **extra),
                "every step costs its fixed part, its KV bytes over the bandwidth and its "
                "prefill; price the hours, then share them over the decoded tokens",
                compare=recognising(_cost_mistakes(steps, per, extra)))


def _cost_cases() -> list[Case]:
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
    return [*(_cost_case(*run) for run in runs),
            *_no_output_cases(guide, [([], "no steps"), ([(0, 0, 100)], "a prefill-only run")])]


def _no_output_cases(per: int, runs: Sequence[tuple[list[Step], str]]) -> list[Case]:
    """Runs that decode no token: each must raise."""
    return [Case(f"fn(steps={steps}, bytes_per_token={per})  # {why}",
                 lambda fn, s=tuple(steps), p=per: fn(list(s), p), Raises(ValueError),
                 "no decoded token, no cost per token: raise ValueError")
            for steps, why in runs]


def _cost_fresh(seed: int) -> list[Case]:
    """Two seeded runs with an idle step and a prefill, at seeded prices and speeds; then no
    steps, and a prefill-only run."""
    rng = random.Random(seed)
    cases = []
    for index in range(2):
        batch = rng.randint(1, 64)
        steps = [(batch, batch * rng.randint(100, 4000), rng.choice([0, 0, rng.randint(1, 900)]))
                 for _ in range(rng.randint(2, 5))]
        steps[0] = (steps[0][0], steps[0][1], rng.randint(1, 900))
        steps.insert(rng.randrange(len(steps)), (0, 0, 0))
        extra = {"step_seconds": rng.choice([0.02, 0.025, 0.04]),
                 "price_per_hour": float(rng.randint(50, 400)),
                 "kv_read_bandwidth": rng.choice([1e12, 2e12, 3e12, 4.8e12])}
        cases.append(_cost_case(f"seeded run {index + 1}", steps,
                                rng.choice([16_384, 131_072]), extra))
    prefill = [(0, rng.choice([0, rng.randint(1, 4000)]), rng.randint(1, 900))
               for _ in range(rng.randint(1, 3))]
    return cases + _no_output_cases(rng.choice([16_384, 131_072]),
                                    [([], "no steps"), (prefill, "a prefill-only run")])


# --- 03.pack_tables: a batch of block tables for the kernel ---------------------------------------


def _library_batch(num_blocks: int, ops: Sequence[Op]) -> tuple[Any, Any, list[Any]]:
    """Replay ``ops`` with the library: the live tables, their lengths, and ``batch_tables``."""
    tables = LibraryTables(BlockPool(num_blocks, 16))
    _replay(tables, ops)
    manager = tables.manager
    seqs = manager.sequences
    packed, _ = manager.batch_tables(seqs)
    return ([list(manager.block_table(s)) for s in seqs], [manager.seq_len(s) for s in seqs],
            [packed.tolist(), True])


def _pack(fn: Any, tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> dict[str, Any]:
    """Call the learner on copies: the packed rows as plain ints, were the inputs untouched."""
    given = [list(table) for table in tables]
    out = fn(given, list(lengths), 16)
    return {"rows": [[int(b) for b in row] for row in out],
            "inputs unchanged": given == [list(t) for t in tables]}


def _pack_case(num_blocks: int, ops: Sequence[Op], why: str) -> Case:
    tables, lengths, (rows, _) = _library_batch(num_blocks, ops)
    width = max((len(table) for table in tables), default=0)
    first = len(tables[0]) if tables else 0
    mistakes = [
        ({"rows": [t + [-1] * (width - len(t)) for t in tables], "inputs unchanged": True},
         "fill the unused places with the null block 0, the block no request owns"),
        ({"rows": [t + [0] * (first - len(t)) for t in tables], "inputs unchanged": True},
         "every row is as wide as the longest table, not the first"),
    ]
    return Case(f"fn(tables={tables}, seq_lens={lengths}, block_size=16)  # {why} -> the rows, "
                "and whether the caller's tables were left unchanged",
                lambda fn, t=tables, ln=lengths: _pack(fn, t, ln),
                {"rows": rows, "inputs unchanged": True},
                "every row as wide as the longest table, the gaps filled with the block no "
                "request owns", compare=recognising(mistakes),
                hints={"inputs unchanged": "leave the caller's tables as they were: build new "
                                           "rows instead of padding theirs"})


def _pack_cases() -> list[Case]:
    scenarios: list[tuple[int, list[Op], str]] = [
        (64, [("add", "chat", 600), ("add", "other", 100), ("append", "other", 150)],
         "the lecture's chat and its companion"),
        (16, [("add", "a", 20), ("add", "b", 10), ("append", "a", 13), ("add", "c", 0)],
         "three sequences, one still empty"),
        (16, [("add", "a", 40), ("add", "b", 5), ("free", "a", 0), ("append", "b", 30),
              ("add", "c", 60)], "after a sequence was freed"),
        (8, [], "an empty batch"),
    ]
    bad = [([[1, 2]], [40], "a table one block short of its length"),
           ([[1, 2, 3, 4]], [40], "a table with a block its length does not need"),
           ([[1, 2, 3], [4]], [40, 17], "the second table is one block short"),
           ([[3, 0, 5]], [40], "a live table holding the null block"),
           ([[1], [2]], [5], "two tables, one length")]
    return [*(_pack_case(*scenario) for scenario in scenarios), *_bad_pack_cases(bad)]


def _bad_pack_cases(bad: Sequence[tuple[list[list[int]], list[int], str]]) -> list[Case]:
    return [Case(f"fn(tables={t}, seq_lens={ln}, block_size=16)  # {why}",
                 lambda fn, t=t, ln=ln: _pack(fn, t, ln), Raises(ValueError),
                 f"{why} would make the kernel read the wrong memory: raise ValueError "
                 "naming it (check every table)")
            for t, ln, why in bad]


def _spoilt(rng: random.Random, tables: list[list[int]],
            lengths: list[int]) -> list[tuple[list[list[int]], list[int], str]]:
    """A live batch (its first table shortest, each at least one block), spoilt each way a
    batch can be wrong."""
    def changed(index: int, table: list[int]) -> list[list[int]]:
        return [table if i == index else list(t) for i, t in enumerate(tables)]

    later = rng.randrange(1, len(tables))
    null = rng.randrange(len(tables))
    spare = max(b for table in tables for b in table) + rng.randint(1, 9)
    held = list(tables[null])
    held[rng.randrange(len(held))] = 0
    return [(changed(0, tables[0][:-1]), lengths, "the first table is one block short"),
            (changed(later, [*tables[later], spare]), lengths,
             "a table with a block its length does not need"),
            (changed(later, tables[later][:-1]), lengths, f"table {later} is one block short"),
            (changed(null, held), lengths, f"table {null} holds the null block"),
            (tables, lengths[:-1], f"{len(tables)} tables, {len(lengths) - 1} lengths")]


def _pack_fresh(seed: int) -> list[Case]:
    """A seeded script's batch; a seeded batch whose first table is the shortest and whose
    blocks were freed and handed out again; that batch spoilt each way a batch can be wrong."""
    rng = random.Random(seed)
    size = rng.randint(12, 24)
    short = rng.randint(1, 16)
    ops: list[Op] = [("add", "a", short), ("add", "gone", rng.randint(1, 48)),
                     ("add", "b", rng.randint(17, 64)), ("free", "gone", 0),
                     ("add", "c", rng.randint(short, 48)), ("append", "b", rng.randint(1, 20))]
    tables, lengths, _ = _library_batch(size, ops)
    scripted = rng.randint(8, 24)
    return [_pack_case(scripted, _random_ops(rng, scripted, 8), "seeded batch 1"),
            _pack_case(size, ops, "seeded batch 2"),
            *_bad_pack_cases(_spoilt(rng, tables, lengths))]


EXERCISES = (
    Exercise("03.last_block", "Blocks for a length, and the last block's fill",
             _last_block_cases,
             reference=("course_lib.paged.PagedKVManager", "course_lib.kv_math.blocks_needed"),
             fresh=_last_block_fresh),
    Exercise("03.u_paged", "Utilisation of a batch of paged sequences", _utilization_cases,
             reference=("course_lib.kv_math.paged_utilization",), fresh=_utilization_fresh),
    Exercise("03.block_pool", "A pool that hands out the lowest free block", _block_pool_cases,
             reference=(), fresh=_block_pool_fresh),  # the library's pool hands out another order
    Exercise("03.block_tables", "Block tables that map tokens to slots, all or nothing",
             _block_table_cases,
             reference=("course_lib.paged.PagedKVManager",), fresh=_block_table_fresh),
    Exercise("03.cost_per_million", "Cost per million tokens when steps slow down",
             _cost_cases,
             reference=("course_lib.simulator.simulate", "course_lib.simulator.SimResult",
                        "course_lib.simulator.CostModel"), fresh=_cost_fresh),
    Exercise("03.pack_tables", "A batch of block tables for the kernel", _pack_cases,
             reference=("course_lib.paged.PagedKVManager.batch_tables",), fresh=_pack_fresh),
)
