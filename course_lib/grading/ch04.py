"""Chapter 04 exercises: fork, copy-on-write, the block-hash chain, prefix lookup, sharing,
and the prefix cache's free queue (eviction order).

Expected values come from ``course_lib.paged``, ``course_lib.prefix_cache`` and
``course_lib.sharing``. The learner's ``fork`` and ``append_token`` work on block tables
held as plain lists over a library ``BlockPool``; a case runs a short script of operations
and compares what it leaves behind with what ``PagedKVManager`` leaves: every table, every
length, every reference count and the number of free blocks. How the learner's code reaches
that state (``copy_on_write``, or ``allocate`` plus ``free``) is up to them.

Nothing that travels into the learner's kernel forks or appends on the learner's behalf:
a fork case runs only adds and frees (plain pool operations) around the learner's ``fork``
and looks at the state right after, and an append case starts from the state the library
leaves after the script's adds, forks and frees, computed here and shipped as plain data
that the kernel rebuilds from primitive pool operations, so only the learner's
``append_token`` runs there. The learner's free queue is driven only through its
four methods and compared, block id by block id, with ``PrefixCachingBlockPool`` running the
same script.

Every case's ``run`` returns plain data (ints, None, str, lists, tuples, dicts). Each case
also replays the usual slips (a fork that shares nothing, an append without
copy-on-write, a hash chain without its parent, a lookup past a miss, ...) on its own
inputs, so a wrong answer that matches one is told which slip it is. Fresh cases draw every
kind of fixed case again, with other sizes and lengths.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from course_lib.grading.check import (
    Case,
    Exercise,
    labelled,
    recognising,
)
from course_lib.kv_math import blocks_needed
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.prefix_cache import (
    BlockHash,
    PrefixCachingBlockPool,
    block_hashes,
    hash_block_tokens,
)
from course_lib.sharing import cow_demo, system_prompt_sharing

# --- scripts of block-table operations ------------------------------------------------------

Op = tuple[Any, ...]
"""``("add", seq, tokens)``, ``("fork", parent, child)``, ``("append", seq, tokens)`` or
``("free", seq)``; appends go one token at a time, as decoding does."""


Mistakes = Sequence[tuple[Any, str]]
"""What each recognised slip gives on a case's inputs, with its hint."""


def _case(call: str, run: Callable[[Any], Any], expected: Any, hint: str,
          mistakes: Mistakes = (), hints: Mapping[str, str] | None = None) -> Case:
    """A case that recognises ``mistakes``."""
    return Case(call, run, expected, hint, recognising(mistakes),
                hints=hints or {})


def _slips(replay: Callable[[Any], Any], slips: Sequence[tuple[Any, str]]) -> list[
        tuple[Any, str]]:
    """``replay`` of every slip that runs to the end, with its hint (``recognising`` names
    every slip that gives a learner's wrong value)."""
    found: list[tuple[Any, str]] = []
    for slip, hint in slips:
        try:
            found.append((replay(slip), hint))
        except (ValueError, RuntimeError, IndexError, KeyError, TypeError):
            continue
    return found


PoolState = dict[str, Any]
"""What a script leaves behind, as plain data: ``{"tables": {seq: [block, ...]},
"lengths": {seq: tokens}, "refs": {block: count}, "free": blocks}``."""


def _state(
    pool: BlockPool, tables: Mapping[str, Sequence[Any]], lengths: Mapping[str, Any]
) -> PoolState:
    """The state of ``pool`` and the live tables; only blocks held by someone are listed."""
    names = sorted(tables)
    return {
        "tables": {seq: list(tables[seq]) for seq in names},
        "lengths": {seq: lengths[seq] for seq in names},
        "refs": {
            block: pool.ref_count(block)
            for block in range(1, pool.num_blocks)
            if pool.ref_count(block)
        },
        "free": pool.num_free,
    }


def _library_steps(manager: PagedKVManager, script: Sequence[Op]) -> Iterator[None]:
    """Run ``script`` through the library's ``PagedKVManager`` (in the grader), pausing after
    each operation."""
    for op in script:
        if op[0] == "add":
            manager.add_sequence(op[1], op[2])
        elif op[0] == "fork":
            manager.fork(op[1], op[2])
        elif op[0] == "append":
            for _ in range(op[2]):
                manager.append_tokens(op[1])
        else:
            manager.free_sequence(op[1])
        yield


def _library_run(num_blocks: int, block_size: int, script: Sequence[Op]) -> PagedKVManager:
    """The library's manager after ``script``."""
    manager = PagedKVManager(BlockPool(num_blocks, block_size))
    for _ in _library_steps(manager, script):
        pass
    return manager


def _expected_state(num_blocks: int, block_size: int, script: Sequence[Op]) -> PoolState:
    """The state the library leaves after ``script``."""
    manager = _library_run(num_blocks, block_size, script)
    tables = {seq: manager.block_table(seq) for seq in manager.sequences}
    lengths = {seq: manager.seq_len(seq) for seq in manager.sequences}
    return _state(manager.pool, tables, lengths)


def _pool_size(block_size: int, script: Sequence[Op], spare: int = 2) -> int:
    """A pool size for a drawn script: its peak use in the library, ``spare`` blocks more (so
    the usual slips run to the end too), and the null block."""
    manager = PagedKVManager(BlockPool(10_000, block_size))
    return max(manager.pool.num_used for _ in _library_steps(manager, script)) + spare + 1


def _free(pool: BlockPool, table: Sequence[int]) -> None:
    """Release a finished sequence's table as the library does: one batch, last block first."""
    pool.free_batch(list(table)[::-1])


def _script_text(block_size: int, script: Sequence[Op]) -> str:
    """A one-line description of a script for the report."""
    steps = []
    for op in script:
        if op[0] == "add":
            steps.append(f"{op[1]} = {op[2]} tokens")
        elif op[0] == "fork":
            steps.append(f"fork {op[1]} -> {op[2]}")
        elif op[0] == "append":
            steps.append(f"{op[1]} appends {op[2]}")
        else:
            steps.append(f"free {op[1]}")
    return f"blocks of {block_size}: " + "; ".join(steps)


def _forked_samples(prompt: int, count: int) -> list[Op]:
    """Prefill ``prompt`` tokens, fork ``count`` samples, free the prompt."""
    return [("add", "p", prompt), *(("fork", "p", f"s{i}") for i in range(count)),
            ("free", "p")]


def _turns(count: int, new: int) -> list[Op]:
    """``count`` samples decode ``new`` tokens each, one token at a time, in turns."""
    return [("append", f"s{i}", 1) for _ in range(new) for i in range(count)]


def _partly_filled(rng: random.Random, size: int, blocks: tuple[int, int] = (1, 4)) -> int:
    """A drawn length whose last block is partly filled (``blocks`` full blocks before it)."""
    return rng.randint(*blocks) * size + rng.randint(1, size - 1)


def _elsewhere(rng: random.Random, size: int, script: list[Op]) -> list[Op]:
    """``script`` after another sequence took some blocks (and, half the time, gave them back
    last block first), so the ids a case sees are drawn too."""
    other: list[Op] = [("add", "x", rng.randint(1, 3 * size))]
    return other + ([("free", "x")] if rng.random() < 0.5 else []) + script


# --- 04.fork ------------------------------------------------------------------------------

FORK_HINT = ("after a fork the child reads exactly the parent's blocks, and the pool must know "
             "that each of them now has one more reader; nothing new is stored")
TWO_FORKS_HINT = "how many tables point at each block after two forks of the same parent?"
EMPTY_FORK_HINT = "an empty table forks into an empty table"
FREED_PARENT_HINT = ("when the parent is freed, the child still reads those blocks: they must "
                     "stay in use")
FULL_FORK_HINT = ("copy-on-write decides from the pool's counts whether a block is shared: "
                  "after your fork, are they right for full blocks too?")
GRANDPARENT_HINT = "a fork of a fork reads the same physical blocks as its grandparent"
FORK_DEMO_HINT = "free blocks after the source's demo forks: forks must share, not copy"

OWN = "own lists"
"""The part of a fork case's result naming the sequences whose table is a list of their own."""

FORK_SCRIPTS: tuple[tuple[int, int, list[Op], str], ...] = (
    (8, 4, [("add", "a", 6), ("fork", "a", "b")], FORK_HINT),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("fork", "a", "c")], TWO_FORKS_HINT),
    (8, 4, [("add", "a", 0), ("fork", "a", "b")], EMPTY_FORK_HINT),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("free", "a")], FREED_PARENT_HINT),
    (8, 4, [("add", "a", 8), ("fork", "a", "b")], FULL_FORK_HINT),
    (12, 4, [("add", "a", 5), ("fork", "a", "b"), ("fork", "b", "c"), ("free", "a")],
     GRANDPARENT_HINT),
)


def _fork_sharing_nothing(pool: BlockPool, table: list[int]) -> list[int]:
    return list(table)


def _fork_copying(pool: BlockPool, table: list[int]) -> list[int]:
    return [pool.allocate() for _ in table]


def _fork_all_but_last(pool: BlockPool, table: list[int]) -> list[int]:
    for block in table[:-1]:
        pool.share(block)
    return list(table)


def _fork_same_list(pool: BlockPool, table: list[int]) -> list[int]:
    for block in table:
        pool.share(block)
    return table


FORK_SLIPS = (
    (_fork_sharing_nothing, "the pool must know that each of the parent's blocks now has one "
                            "more reader: share every block"),
    (_fork_copying, "a fork stores nothing new: the child reads the parent's own blocks"),
    (_fork_all_but_last, "every block of the parent gets one more reader, its last (partly "
                         "filled) block too"),
    (_fork_same_list, "the child's table must be a list of its own: growing one table must not "
                      "change the other"),
)
"""Wrong forks the checks recognise, with their hints."""


def _forked(num_blocks: int, block_size: int, script: Sequence[Op],
            fork: Callable[[BlockPool, list[int]], Any]) -> PoolState:
    """Run ``script`` (adds, forks and frees, no appends) on plain-list tables with ``fork``:
    the state right after, and which sequences hold a list of their own."""
    pool = BlockPool(num_blocks, block_size)
    tables: dict[str, Any] = {}
    lengths: dict[str, Any] = {}
    for op in script:
        if op[0] == "add":
            tables[op[1]] = pool.allocate_many(blocks_needed(op[2], block_size))
            lengths[op[1]] = op[2]
        elif op[0] == "fork":
            tables[op[2]] = fork(pool, tables[op[1]])
            lengths[op[2]] = lengths[op[1]]
        else:
            _free(pool, tables.pop(op[1]))
            del lengths[op[1]]
    own = [seq for seq in sorted(tables) if type(tables[seq]) is list
           and sum(table is tables[seq] for table in tables.values()) == 1]
    return {**_state(pool, tables, lengths), OWN: own}


def _fork_state_case(num_blocks: int, block_size: int, script: list[Op], hint: str) -> Case:
    expected = _expected_state(num_blocks, block_size, script)
    return _case(
        f"fork(pool, table) in: {_script_text(block_size, script)}",
        lambda fn, n=num_blocks, b=block_size, s=tuple(script): _forked(n, b, s, fn),
        {**expected, OWN: sorted(expected["tables"])},
        hint,
        _slips(lambda slip: _forked(num_blocks, block_size, script, slip), FORK_SLIPS),
        {OWN: FORK_SLIPS[3][1]},
    )


def _fork_keeps_parent(fn: Callable[[BlockPool, list[int]], Any]) -> list[int]:
    pool = BlockPool(8, 4)
    parent = [pool.allocate(), pool.allocate()]
    child = fn(pool, parent)
    if isinstance(child, list):
        child.append(7)  # the child's next block must not appear in the parent's table
    return parent


def _fork_demo_case(num_blocks: int, prompt: int, samples: int, call: str) -> Case:
    """Free blocks once ``samples`` forks of a ``prompt``-token prompt (blocks of 16) alone
    hold it."""
    script, size = _forked_samples(prompt, samples), 16
    return _case(
        call,
        lambda fn, n=num_blocks, s=tuple(script): _forked(n, size, s, fn)["free"],
        _expected_state(num_blocks, size, script)["free"],
        FORK_DEMO_HINT,
        _slips(lambda slip: _forked(num_blocks, size, script, slip)["free"], FORK_SLIPS),
    )


def _fork_cases() -> list[Case]:
    cases = [_fork_state_case(*args) for args in FORK_SCRIPTS]
    cases.append(_case(
        "parent = [1, 2]; child = fork(pool, parent); child.append(7); parent",
        _fork_keeps_parent,
        [1, 2],
        FORK_SLIPS[3][1],
    ))
    cases.append(_fork_demo_case(
        301, 1000, 4, "fork(pool, table) in the source's demo: a 1,000-token prompt forked "
                      "into 4 samples, then freed, blocks of 16 -> free blocks"))
    return cases


def _fork_fresh(seed: int) -> list[Case]:
    """Every kind of fixed fork case, drawn: an empty table, full blocks only, two forks of
    one parent, a freed parent, a fork of a fork, and a prompt the size of the demo's."""
    rng = random.Random(seed)
    sizes = [rng.choice([2, 4, 8, 16]) for _ in range(5)]
    part = [_partly_filled(rng, size) for size in sizes]
    scripts = [
        ([("add", "a", 0), ("fork", "a", "b")], EMPTY_FORK_HINT),
        ([("add", "a", rng.randint(1, 5) * sizes[1]), ("fork", "a", "b")], FULL_FORK_HINT),
        ([("add", "a", part[2]), ("fork", "a", "b"), ("fork", "a", "c")], TWO_FORKS_HINT),
        ([("add", "a", part[3]), ("fork", "a", "b"), ("free", "a")], FREED_PARENT_HINT),
        ([("add", "a", part[4]), ("fork", "a", "b"), ("fork", "b", "c"),
          ("free", rng.choice("ab"))], GRANDPARENT_HINT),
    ]
    cases = []
    for size, (script, hint) in zip(sizes, scripts, strict=True):
        copies = 2 * blocks_needed(script[0][2], size)  # room for a fork that copies
        script = _elsewhere(rng, size, script)
        cases.append(_fork_state_case(_pool_size(size, script, copies), size, script, hint))
    prompt, samples = rng.randint(500, 1500), rng.randint(2, 6)
    cases.append(_fork_demo_case(
        blocks_needed(prompt, 16) * (samples + 1) + 1, prompt, samples,
        f"fork(pool, table): a {prompt}-token prompt forked into {samples} samples, then "
        "freed, blocks of 16 -> free blocks"))
    return cases


# --- 04.append_token ----------------------------------------------------------------------

APPEND_HINT = ("a token needs a slot: in the last block if it has room, else in a new block; "
               "and no sequence may change a block that another sequence still reads")
FIRST_TOKEN_HINT = "an empty sequence has no block: its first token needs a fresh one"
IN_PLACE_HINT = ("the last block has a free slot and nobody else reads it: does anything need "
                 "to change?")
FULL_BLOCK_HINT = "where does the 5th token go when 4 tokens fill a block of 4?"
SHARED_TAIL_HINT = ("the last block is partly filled and another sequence still reads it: "
                    "writing there would change what that sequence sees")
LAST_SHARER_HINT = "after the other sharer made its copy, who else reads the old block?"
SHARED_FULL_HINT = ("a full block is never written again, shared or not: what does the next "
                    "token need?")
SAMPLES_HINT = "three samples of one prompt: think about what the third writer finds"
ONE_AT_A_TIME_HINT = "nine tokens one at a time: a block is taken only when one is needed"
APPEND_DEMO_HINT = ("the source's demo: which of the four samples still shares the prompt's "
                    "partly filled last block when it writes?")

APPEND_SCRIPTS: tuple[tuple[int, int, list[Op], str], ...] = (
    (8, 4, [("add", "a", 0), ("append", "a", 1)], FIRST_TOKEN_HINT),
    (8, 4, [("add", "a", 3), ("append", "a", 1)], IN_PLACE_HINT),
    (8, 4, [("add", "a", 4), ("append", "a", 1)], FULL_BLOCK_HINT),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("append", "b", 1)], SHARED_TAIL_HINT),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("append", "b", 1), ("append", "a", 1)],
     LAST_SHARER_HINT),
    (8, 4, [("add", "a", 8), ("fork", "a", "b"), ("append", "b", 1)], SHARED_FULL_HINT),
    (10, 4, [("add", "p", 6), ("fork", "p", "s0"), ("fork", "p", "s1"), ("fork", "p", "s2"),
             ("free", "p"), ("append", "s0", 1), ("append", "s1", 1), ("append", "s2", 1),
             ("append", "s0", 2), ("append", "s1", 2), ("append", "s2", 2)], SAMPLES_HINT),
    (12, 4, [("add", "a", 2), ("append", "a", 9)], ONE_AT_A_TIME_HINT),
)


def _demo_summary(state: PoolState) -> tuple[int, tuple[Any, ...], Any]:
    """(blocks in use, last prompt block per sample, first block's count) of the demo."""
    tables, refs = state["tables"], state["refs"]
    lasts = tuple(tables[f"s{i}"][62] if len(tables[f"s{i}"]) > 62 else None for i in range(4))
    first = tables["s0"][0] if tables["s0"] else None
    return len(refs), lasts, refs.get(first, 0)


def _append_without_copy(pool: BlockPool, table: list[int], length: int) -> int:
    if length % pool.block_size == 0:
        table.append(pool.allocate())
    return length + 1


def _append_copying_alone(pool: BlockPool, table: list[int], length: int) -> int:
    if length % pool.block_size == 0:
        table.append(pool.allocate())
    else:
        old = table[-1]
        table[-1] = pool.allocate()
        pool.free(old)
    return length + 1


def _append_copying_full(pool: BlockPool, table: list[int], length: int) -> int:
    if table and pool.ref_count(table[-1]) > 1:
        table[-1] = pool.copy_on_write(table[-1])
    elif length % pool.block_size == 0:
        table.append(pool.allocate())
    return length + 1


APPEND_SLIPS = (
    (_append_without_copy, "the last block is partly filled and another sequence still reads "
                           "it: copy it before writing (copy-on-write)"),
    (_append_copying_alone, "a block nobody else reads is written in place: copy only a "
                            "shared block"),
    (_append_copying_full, "a full block is never written again, shared or not: the next token "
                           "needs a new block, not a copy"),
)
"""Wrong appends the checks recognise, with their hints."""

APPEND_LABELS = {"lengths": "append_token returns the sequence's new length"}

Start = dict[str, Any]
"""Where an append case starts, as plain data: the library's ``tables``, ``lengths`` and
``refs`` after the script's adds, forks and frees, and its free ``queue``, front first."""


def _start(num_blocks: int, block_size: int, setup: Sequence[Op]) -> Start:
    """The state the library leaves after ``setup``, computed here, for the kernel to rebuild."""
    manager = _library_run(num_blocks, block_size, setup)
    pool, seqs = manager.pool, manager.sequences
    return {"tables": {seq: list(manager.block_table(seq)) for seq in seqs},
            "lengths": {seq: manager.seq_len(seq) for seq in seqs},
            "refs": {block: pool.ref_count(block) for block in range(1, pool.num_blocks)
                     if pool.ref_count(block)},
            "queue": list(pool.free_blocks())}


def _rebuilt(num_blocks: int, block_size: int, start: Start) -> BlockPool:
    """A pool in the state ``start`` describes, made of primitive pool operations: every block
    handed out, each held block shared up to its count, the free ones given back in queue
    order."""
    pool = BlockPool(num_blocks, block_size)
    pool.allocate_many(num_blocks - 1)
    for block, count in start["refs"].items():
        for _ in range(count - 1):
            pool.share(block)
    pool.free_batch(start["queue"])
    return pool


def _appended(num_blocks: int, block_size: int, start: Start, appends: Sequence[Op],
              append: Callable[[BlockPool, list[int], int], Any]) -> PoolState:
    """From ``start``, run ``appends`` with ``append``: the state they leave."""
    pool = _rebuilt(num_blocks, block_size, start)
    tables = {seq: list(table) for seq, table in start["tables"].items()}
    lengths = dict(start["lengths"])
    for _, seq, tokens in appends:
        for _ in range(tokens):
            lengths[seq] = append(pool, tables[seq], lengths[seq])
    return _state(pool, tables, lengths)


def _split(script: Sequence[Op]) -> tuple[list[Op], list[Op]]:
    """(setup, appends): the operations before the first append, and the appends."""
    first = next((i for i, op in enumerate(script) if op[0] == "append"), len(script))
    setup, appends = list(script[:first]), list(script[first:])
    if any(op[0] != "append" for op in appends):
        raise ValueError(f"an append case adds, forks and frees before its appends: {script}")
    return setup, appends


def _append_case(num_blocks: int, size: int, script: Sequence[Op], hint: str,
                 call: str | None = None) -> Case:
    """A case that runs ``script``'s appends from the state the library leaves before them;
    ``call`` describes the script when the default text would be long."""
    setup, appends = _split(script)
    start = _start(num_blocks, size, setup)
    return _case(
        f"append_token(pool, table, length) in: {call or _script_text(size, script)}",
        lambda fn, n=num_blocks, b=size, s=start, t=tuple(appends): _appended(n, b, s, t, fn),
        _expected_state(num_blocks, size, script),
        hint,
        _slips(lambda slip: _appended(num_blocks, size, start, appends, slip), APPEND_SLIPS),
        APPEND_LABELS,
    )


def _append_cases() -> list[Case]:
    cases = [_append_case(*args) for args in APPEND_SCRIPTS]
    demo = cow_demo(prompt_tokens=1000, samples=4, new_tokens=200, block_size=16)
    setup, appends = _split(_forked_samples(1000, 4) + _turns(4, 200))
    start = _start(301, 16, setup)
    cases.append(_case(
        "the source's demo with append_token: 1,000-token prompt, 4 samples x 200 tokens, "
        "blocks of 16 -> (blocks in use, last prompt block per sample, first block's count)",
        lambda fn: _demo_summary(_appended(301, 16, start, appends, fn)),
        (demo.blocks_in_use, demo.last_prompt_block_per_sample, demo.first_block_refcount),
        APPEND_DEMO_HINT,
        _slips(lambda slip: _demo_summary(_appended(301, 16, start, appends, slip)), APPEND_SLIPS),
    ))
    return cases


def _drawn_samples(rng: random.Random, size: int, prompt: int, count: int, new: int,
                   hint: str) -> Case:
    """An append case: ``count`` samples of a freed ``prompt``-token prompt decode ``new``
    tokens each, in turns, after another sequence took some blocks."""
    setup = _elsewhere(rng, size, _forked_samples(prompt, count))
    script = setup + _turns(count, new)
    call = (f"{_script_text(size, setup)}; then s0 .. s{count - 1} append {new} each, one "
            "token at a time, in turns")
    return _append_case(_pool_size(size, script), size, script, hint, call)


def _append_fresh(seed: int) -> list[Case]:
    """Every kind of fixed append case, drawn: a first token, writes in place, a full last
    block, a shared partly filled block and its last sharer, a shared full block, samples
    of a freed prompt, and a prompt the size of the demo's."""
    rng = random.Random(seed)
    sizes = [rng.choice([2, 4, 8]) for _ in range(6)]
    full = [rng.randint(1, 4) * size for size in sizes]
    part = [_partly_filled(rng, size) for size in sizes]
    long = [rng.randint(size + 1, 3 * size) for size in sizes]
    short = [rng.randint(1, size) for size in sizes]
    scripts = [
        ([("add", "a", 0), ("append", "a", long[0])], FIRST_TOKEN_HINT),
        ([("add", "a", part[1]), ("append", "a", long[1])], IN_PLACE_HINT),
        ([("add", "a", full[2]), ("append", "a", long[2])], FULL_BLOCK_HINT),
        ([("add", "a", part[3]), ("fork", "a", "b"), ("append", "b", short[3]),
          ("append", "a", short[3])], LAST_SHARER_HINT),
        ([("add", "a", full[4]), ("fork", "a", "b"), ("append", "b", long[4]),
          ("append", "a", short[4])], SHARED_FULL_HINT),
    ]
    cases = []
    for size, (script, hint) in zip(sizes, scripts, strict=False):
        script = _elsewhere(rng, size, script)
        cases.append(_append_case(_pool_size(size, script), size, script, hint))
    cases.append(_drawn_samples(rng, sizes[5], part[5], rng.randint(2, 4), short[5],
                                SAMPLES_HINT))
    cases.append(_drawn_samples(rng, 16, rng.randint(300, 1200), rng.randint(3, 5),
                                rng.randint(10, 40), APPEND_HINT))
    return cases


# --- 04.block_hashes ----------------------------------------------------------------------


def _short(hashes: Any) -> Any:
    """Hashes as 8-hex-digit prefixes (other values shown as they are), for readable reports."""
    if not isinstance(hashes, list | tuple):
        return hashes
    return [h.hex()[:8] if isinstance(h, bytes) else h for h in hashes]


def _salt_text(salt: str | None) -> str:
    """How a case's call passes the salt: not at all when there is none."""
    return "" if salt is None else f", cache_salt={salt!r}"


def _with_salt(fn: Callable[..., Any], salt: str | None, *args: Any) -> Any:
    """Call ``fn(*args)``, adding ``cache_salt=salt`` only when there is a salt."""
    return fn(*args) if salt is None else fn(*args, cache_salt=salt)


def _prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32_000) for _ in range(length)]


def _hash_chain(tokens: Sequence[int], size: int, salt: str | None, *, chained: bool = True,
                salted: str = "first", partial: bool = False) -> list[BlockHash]:
    """The hash chain, or what a slip makes of it: no parent, the salt on every block (or
    on none), the partly filled tail hashed too."""
    hashes: list[BlockHash] = []
    end = len(tokens) if partial else len(tokens) - len(tokens) % size
    for start in range(0, end, size):
        keys = (salt,) if salt is not None and (salted == "every" or (
            salted == "first" and not start)) else ()
        parent = hashes[-1] if hashes and chained else None
        hashes.append(hash_block_tokens(parent, tokens[start:start + size], keys))
    return hashes


def _hash_mistakes(tokens: Sequence[int], size: int, salt: str | None) -> list[tuple[Any, str]]:
    slips = [
        ({"chained": False}, "each full block's hash must name its whole prefix: chain it from "
                             "the previous block's hash"),
        ({"partial": True}, "a block that is still being filled has no hash: only full blocks "
                            "are hashed"),
        ({"salted": "every"}, "the salt is an extra key of the first block only; the others "
                              "inherit it through the chain"),
        ({"salted": "none"}, "the salt must change every hash of the chain: pass it as the "
                             "first block's extra key"),
    ]
    return [(_short(_hash_chain(tokens, size, salt, **slip)), hint) for slip, hint in slips]


def _hashes_case(tokens: Sequence[int], size: int, salt: str | None, hint: str) -> Case:
    shown = list(tokens) if len(tokens) <= 10 else f"<{len(tokens)} tokens>"
    return _case(
        f"fn({shown}, block_size={size}{_salt_text(salt)})",
        lambda fn, t=tuple(tokens), s=size, c=salt: _short(list(_with_salt(fn, c, list(t), s))),
        _short(block_hashes(tokens, size, cache_salt=salt)),
        hint,
        _hash_mistakes(tokens, size, salt),
    )


CHAIN_HINT = ("each full block's hash must name its whole prefix, not only its own tokens: "
              "what does hash_block_tokens take besides the tokens?")
SALT_HINT = ("the salt must change every hash of the chain, yet it is an extra key of one "
             "block only: which block, and how do the others inherit it?")
PARTIAL_HINT = "can a block that is still being filled be named by a hash?"
NO_TOKENS_HINT = "no tokens, no hashes"
LONG_PROMPT_HINT = "a long prompt: how many of its blocks are full?"


def _block_hashes_cases() -> list[Case]:
    inputs: list[tuple[list[int], int, str | None, str]] = [
        (list(range(10)), 4, None, CHAIN_HINT),
        (list(range(8)), 4, None, "8 tokens fill exactly 2 blocks of 4: both get a hash"),
        ([1, 2, 3], 4, None, PARTIAL_HINT),
        ([], 4, None, NO_TOKENS_HINT),
        ([99, *range(1, 10)], 4, None,
         "a change in the first block must change every later hash too"),
        (list(range(10)), 4, "tenant-a", SALT_HINT),
        (list(range(5)), 1, "tenant-b", SALT_HINT),
        (_prompt(1000), 16, None, LONG_PROMPT_HINT),
    ]
    return [_hashes_case(*entry) for entry in inputs]


def _block_hashes_fresh(seed: int) -> list[Case]:
    """Every kind of fixed hash-chain case, drawn: no tokens, less than a block, full blocks
    only, a partly filled tail, a salt (over blocks of 1 too), and a long prompt."""
    rng = random.Random(seed)
    sizes = [rng.choice([2, 4, 8, 16]) for _ in range(5)]
    salts = [f"tenant-{rng.randrange(1000)}" for _ in range(2)]
    inputs: list[tuple[int, int, str | None, str]] = [
        (0, sizes[0], None, NO_TOKENS_HINT),
        (rng.randint(1, sizes[1] - 1), sizes[1], None, PARTIAL_HINT),
        (rng.randint(2, 5) * sizes[2], sizes[2], None,
         "the prompt fills its blocks exactly: each of them gets a hash"),
        (_partly_filled(rng, sizes[3], (2, 5)), sizes[3], None, CHAIN_HINT),
        (_partly_filled(rng, sizes[4], (2, 4)), sizes[4], salts[0], SALT_HINT),
        (rng.randint(3, 9), 1, salts[1], SALT_HINT),
        (rng.randint(300, 1500), 16, None, LONG_PROMPT_HINT),
    ]
    return [_hashes_case(_prompt(length, rng.randrange(10**6)), size, salt, hint)
            for length, size, salt, hint in inputs]


# --- 04.longest_cached_prefix -------------------------------------------------------------


def _library_lookup(
    cache: Mapping[BlockHash, int], tokens: Sequence[int], size: int, salt: str | None
) -> list[int]:
    """The library pool's answer for a cache holding exactly ``cache``."""
    pool = PrefixCachingBlockPool(max(cache.values(), default=0) + 2, size)
    held = {pool.allocate() for _ in range(pool.num_blocks - 1)}
    for block_hash, block in cache.items():
        assert block in held
        pool.cache_block(block, block_hash)
    usable = max(len(tokens) - 1, 0) // size  # at least the last prompt token is computed
    return pool.longest_cached_prefix(block_hashes(tokens, size, cache_salt=salt)[:usable])


def _cached_after(
    size: int, prompts: Sequence[tuple[list[int], str | None]]
) -> dict[BlockHash, int]:
    """The cache after ``prompts`` (tokens, salt) ran one after another: each full block's
    hash -> a block id, new ids in order of first use. Built from the hash chain alone, so
    the input that travels to the learner's kernel owes nothing to the answer key."""
    cache: dict[BlockHash, int] = {}
    for tokens, salt in prompts:
        for block_hash in block_hashes(tokens, size, cache_salt=salt):
            cache.setdefault(block_hash, len(cache) + 1)
    return cache


STOP_HINT = ("a cached block is useful only if every block before it is cached too: what "
             "happens after the first miss?")
LAST_TOKEN_HINT = ("the model must compute the last prompt token itself to choose the next "
                   "token: can the block holding it come from the cache?")
SHORT_PROMPT_HINT = "a prompt shorter than a block has no full block"
EMPTY_CACHE_HINT = "an empty cache finds nothing"
NO_SALT_HINT = "a request without the salt must not see the salted blocks"
SAME_SALT_HINT = "the same salt gives the same hashes: does your lookup hash with the salt?"
OTHER_SALT_HINT = "a different salt changes every hash: nothing found"


def _lookup_cases() -> list[Case]:
    a = list(range(10))
    cached_a = _cached_after(4, [(a, None)])
    salted = _cached_after(4, [(a, "acme")])
    first, second = block_hashes(a, 4)
    system = _prompt(1000)
    cached_system = _cached_after(16, [([*system, 1, 2, 3], None)])
    inputs: list[tuple[str, dict[BlockHash, int], list[int], int, str | None, str]] = [
        ("cache after A = 0..9", cached_a, a, 4, None,
         "A's two full blocks are cached, and the prompt's last token is in its third block"),
        ("cache after A = 0..9", cached_a, [*a[:8], 99, 98, 97], 4, None,
         "the first 8 tokens match A"),
        ("cache after A = 0..9", cached_a, [0, 1, 2, 3, 99, 5, 6, 7, 8], 4, None, STOP_HINT),
        ("cache after A = 0..9", cached_a, [99, *a[1:]], 4, None,
         "the first block differs, so no hash matches (every later hash chains from it)"),
        ("cache after A = 0..9", cached_a, a[:8], 4, None, LAST_TOKEN_HINT),
        ("cache after A = 0..9", cached_a, a[:3], 4, None, SHORT_PROMPT_HINT),
        ("empty cache", {}, a, 4, None, EMPTY_CACHE_HINT),
        ("cache after A = 0..9 with cache_salt='acme'", salted, a, 4, None, NO_SALT_HINT),
        ("cache after A = 0..9 with cache_salt='acme'", salted, a, 4, "acme", SAME_SALT_HINT),
        ("cache after A = 0..9 with cache_salt='acme'", salted, a, 4, "globex",
         OTHER_SALT_HINT),
        ("cache with only A's SECOND block (the first was evicted)", {second: 2}, a, 4, None,
         STOP_HINT),
        ("cache with only A's first block", {first: 1}, a, 4, None, STOP_HINT),
        ("cache after a chat with a 1,000-token system prompt", cached_system,
         [*system, 7, 7, 7], 16, None, "the whole system prompt was cached by the first chat"),
    ]
    return [_lookup_case(*entry) for entry in inputs]


def _lookup_slip(cache: Mapping[BlockHash, int], tokens: Sequence[int], size: int,
                 salt: str | None, usable: int, stop: bool = True) -> list[int]:
    """A lookup over the first ``usable`` blocks, stopping at the first miss or not."""
    found = []
    for block_hash in block_hashes(tokens, size, cache_salt=salt)[:max(usable, 0)]:
        if block_hash in cache:
            found.append(cache[block_hash])
        elif stop:
            break
    return found


def _lookup_mistakes(cache: Mapping[BlockHash, int], tokens: Sequence[int], size: int,
                     salt: str | None) -> list[tuple[Any, str]]:
    usable = max(len(tokens) - 1, 0) // size
    return [
        (_lookup_slip(cache, tokens, size, salt, usable, stop=False),
         "a cached block is useful only if every block before it is cached too: stop at the "
         "first miss"),
        (_lookup_slip(cache, tokens, size, salt, len(tokens) // size),
         "the model must compute the last prompt token itself: the block holding it cannot "
         "come from the cache"),
        (_lookup_slip(cache, tokens, size, salt, len(tokens) // size - 1),
         "leave out only the block that holds the last prompt token: every full block before "
         "it may come from the cache"),
        (_lookup_slip(cache, tokens, size, None, usable),
         "hash the prompt with its salt, as the cache hashed it"),
    ]


def _lookup_case(label: str, cache: dict[BlockHash, int], tokens: list[int], size: int,
                 salt: str | None, hint: str) -> Case:
    shown = tokens if len(tokens) <= 11 else f"<{len(tokens)} tokens>"
    return _case(
        f"fn(<{label}>, {shown}, block_size={size}{_salt_text(salt)})",
        lambda fn, c=cache, t=tokens, s=size, k=salt: list(_with_salt(fn, k, dict(c), list(t), s)),
        _library_lookup(cache, tokens, size, salt),
        hint,
        _lookup_mistakes(cache, tokens, size, salt),
    )


LOOKUP_KINDS = {
    "whole": "the whole prompt was cached by the first chat",
    "full blocks": LAST_TOKEN_HINT,
    "leaves A": "only the blocks the prompt shares with A, from the first on, can be found",
    "gap": STOP_HINT,
    "same salt": SAME_SALT_HINT,
    "other salt": NO_SALT_HINT,
    "short": SHORT_PROMPT_HINT,
    "empty": EMPTY_CACHE_HINT,
}
"""Each kind of fixed lookup case, drawn fresh, with its hint."""


def _drawn_lookup(rng: random.Random, kind: str) -> Case:
    """A lookup case of ``kind`` (see ``LOOKUP_KINDS``): a cache after another prompt and A
    (A's last block partly filled), and a prompt made from A."""
    size = 16 if kind == "whole" else rng.choice([2, 4, 8])
    salt = f"tenant-{rng.randrange(1000)}" if "salt" in kind else None
    a = _prompt(_partly_filled(rng, size, (10, 70) if kind == "whole" else (2, 5)),
                rng.randrange(10**6))
    other = _prompt(rng.randint(0, 4 * size), rng.randrange(10**6))
    cache = {} if kind == "empty" else _cached_after(size, [(other, salt), (a, salt)])
    query, asked, full = a, salt, len(a) // size
    if kind == "full blocks":
        query = a[:full * size]
    elif kind == "leaves A":
        query = a[:rng.randint(0, len(a) - 1)] + _prompt(rng.randint(1, 2 * size),
                                                         rng.randrange(10**6))
    elif kind == "gap":  # a block evicted before the last one the prompt could use
        del cache[block_hashes(a, size, cache_salt=salt)[rng.randrange(full - 1)]]
    elif kind == "other salt":
        asked = rng.choice([None, f"tenant-{rng.randrange(1000, 2000)}"])
    elif kind == "short":
        query = a[:rng.randint(1, size - 1)]
    label = ("empty cache" if kind == "empty" else
             f"seeded cache after prompts of {len(other)} and {len(a)} tokens (A)"
             + _salt_text(salt) + (", one of A's blocks evicted" if kind == "gap" else ""))
    return _lookup_case(label, cache, query, size, asked, LOOKUP_KINDS[kind])


def _lookup_fresh(seed: int) -> list[Case]:
    rng = random.Random(seed)
    return [_drawn_lookup(rng, kind) for kind in LOOKUP_KINDS]


# --- 04.free_queue ------------------------------------------------------------------------

QueueOp = tuple[Any, ...]
"""``("alloc", seq, n)``: ``n`` allocations make ``seq``'s table (``OutOfBlocks`` is
recorded as ``"OutOfBlocks"``); ``("free", seq, hashes)``:
``free(seq's table, hashes)``; ``("hit", seq, name)``: ``lookup(name)`` and, if found,
``touch`` that block, which becomes ``seq``'s table; ``("lookup", name)``: ``lookup`` alone."""


def _digest(name: str) -> BlockHash:
    """A stand-in block hash for a case's hash name (the learner's class sees the name)."""
    return hashlib.sha256(name.encode()).digest()


class _LibraryQueue:
    """The exercise's interface over ``PrefixCachingBlockPool``: the expected behaviour."""

    def __init__(self, num_blocks: int) -> None:
        self.pool = PrefixCachingBlockPool(num_blocks, 1)

    def allocate(self) -> int:
        return self.pool.allocate()

    def free(self, blocks: Sequence[int], hashes: Sequence[str | None]) -> None:
        for block, name in reversed(list(zip(blocks, hashes, strict=True))):
            if name is not None:
                self.pool.cache_block(block, _digest(name))
            self.pool.free(block)

    def lookup(self, name: str) -> int | None:
        found = self.pool.longest_cached_prefix([_digest(name)])
        return found[0] if found else None

    def touch(self, block: int) -> None:
        self.pool.touch([block])


def _play(
    queue: Any, script: Sequence[QueueOp], tables: dict[str, list[Any]] | None = None
) -> list[Any]:
    """Run ``script`` on ``queue``; what ``allocate`` and ``lookup`` returned, by label: a
    table's blocks as ``A[0]``, ``A[1]``, a hit as ``B = hit on 'a1'``, a lookup by its call."""
    tables = {} if tables is None else tables
    out: dict[str, Any] = {}
    for op in script:
        if op[0] == "alloc":
            tables[op[1]] = []
            try:
                for index in range(op[2]):
                    tables[op[1]].append(queue.allocate())
                    out[f"{op[1]}[{index}]"] = tables[op[1]][-1]
            except OutOfBlocks:
                out[f"{op[1]}[{len(tables[op[1]])}]"] = "OutOfBlocks"
        elif op[0] == "free" and op[1] not in tables:  # the learner's hit missed
            out[f"free({op[1]})"] = "skipped: the hit found no block"
        elif op[0] == "free" and len(tables[op[1]]) != len(op[2]):  # ran out of blocks early
            out[f"free({op[1]})"] = (f"skipped: {op[1]} holds {len(tables.pop(op[1]))} "
                                     f"blocks, the script frees {len(op[2])}")
        elif op[0] == "free":
            queue.free(list(tables.pop(op[1])), list(op[2]))
        elif op[0] == "hit":
            found = out[f"{op[1]} = hit on {op[2]!r}"] = queue.lookup(op[2])
            if found is not None:
                queue.touch(found)
                tables[op[1]] = [found]
        else:
            out[_free_label(out, f"lookup({op[1]!r})")] = queue.lookup(op[1])
    return out


def _free_label(seen: Mapping[str, Any], label: str) -> str:
    """``label``, or ``label #n`` when an earlier lookup took it."""
    count = 1
    while (label if count == 1 else f"{label} #{count}") in seen:
        count += 1
    return label if count == 1 else f"{label} #{count}"


def _queue_text(num_blocks: int, script: Sequence[QueueOp]) -> str:
    """A one-line description of a free-queue script for the report."""
    steps = [f"q = cls({num_blocks})"]
    for op in script:
        if op[0] == "alloc":
            steps.append(f"{op[1]} = {op[2]} x allocate()")
        elif op[0] == "free":
            steps.append(f"free({op[1]}, {list(op[2])})")
        elif op[0] == "hit":
            steps.append(f"{op[1]} = hit on {op[2]!r}")
        else:
            steps.append(f"lookup({op[1]!r})")
    return "; ".join(steps)


def _random_script(seed: int, num_blocks: int, steps: int) -> list[QueueOp]:
    """A seeded mix of allocations (now and then past the last free block), frees (half
    with an uncached tail) and cache hits."""
    rng = random.Random(seed)
    library, tables = _LibraryQueue(num_blocks), {}
    live: dict[str, list[Any]] = {}  # hash names of each live sequence's blocks
    freed: list[str] = []  # every name freed with its block so far
    script: list[QueueOp] = []
    for step in range(steps):
        seq, roll = f"r{step}", rng.random()
        if live and roll < 0.4:
            seq = rng.choice(sorted(live))
            hashes = live.pop(seq)
            if hashes[-1] == f"{seq}.{len(hashes) - 1}" and rng.random() < 0.5:
                hashes[-1] = None  # a partly filled tail
            op: QueueOp = ("free", seq, tuple(hashes))
            freed += [name for name in hashes if name is not None]
        elif freed and roll < 0.65:
            op = ("hit", seq, rng.choice(freed))
        else:  # at times one block more than is free: it must raise OutOfBlocks
            op = ("alloc", seq, rng.randint(1, min(3, library.pool.num_free + 1)))
        found = list(_play(library, [op], tables).values())
        if op[0] == "alloc" and tables[seq]:
            live[seq] = [f"{seq}.{i}" for i in range(len(tables[seq]))]
        elif op[0] == "hit" and found[0] is not None:
            live[seq] = [op[2]]
        script.append(op)
    return script


QUEUE_SCRIPTS: tuple[tuple[int, list[QueueOp], str], ...] = (
    (6, [("alloc", "A", 5)], "a new pool hands its blocks out in id order, block 0 never"),
    (3, [("alloc", "A", 3)], "only blocks 1 and 2 exist: the third allocate raises OutOfBlocks"),
    (6, [("alloc", "A", 3), ("free", "A", (None, None, None)), ("alloc", "B", 5)],
     "blocks without a hash hold nothing a later request can find: which should be reused "
     "first, they or blocks never used?"),
    (6, [("alloc", "A", 3), ("free", "A", ("a0", "a1", "a2")), ("alloc", "B", 5)],
     "cached blocks wait behind every other free block; when one must go, which block of a "
     "prefix is worth least to the next request?"),
    (4, [("alloc", "A", 2), ("alloc", "B", 1), ("free", "A", ("a0", "a1")),
         ("free", "B", (None,)), ("alloc", "C", 1), ("lookup", "a1"), ("lookup", "a0")],
     "B's stale, partly filled block was freed last, yet it must not push a cached block out"),
    (8, [("alloc", "A", 2), ("alloc", "B", 2), ("free", "A", ("a0", "a1")),
         ("free", "B", ("b0", "b1")), ("alloc", "C", 7)],
     "two requests' cached blocks: the one freed longer ago is evicted first"),
    (5, [("alloc", "A", 3), ("free", "A", ("a0", "a1", "a2")), ("alloc", "B", 2),
         ("lookup", "a2"), ("lookup", "a1"), ("lookup", "a0")],
     "a block handed out again is overwritten: its hash must no longer be found"),
    (5, [("alloc", "A", 2), ("free", "A", ("a0", "a1")), ("hit", "B", "a1"), ("alloc", "C", 3)],
     "a cache hit takes its block back: nobody else may be handed it while B reads it"),
    (5, [("alloc", "A", 2), ("free", "A", ("a0", "a1")), ("hit", "B", "a0"),
         ("hit", "C", "a0"), ("free", "B", ("a0",)), ("alloc", "D", 4)],
     "two requests hit the same block: it is free again only when both are done"),
    (5, [("alloc", "A", 2), ("free", "A", ("a0", "a1")), ("alloc", "B", 2),
         ("free", "B", ("b0", "b1")), ("hit", "C", "a1"), ("free", "C", ("a1",)),
         ("alloc", "D", 4)],
     "a block used again is recently used: freed again, it joins the back of the queue"),
    (5, [("alloc", "A", 3), ("free", "A", ("a0", "a1", "a2")), ("hit", "B", "a0"),
         ("alloc", "C", 2), ("hit", "D", "a2"), ("hit", "E", "a1")],
     "a hit on a block that was evicted is a miss (lookup returns None)"),
)


class _QueueSlip:
    """The free queue with one slip switched on, to tell a wrong queue by what it returns."""

    def __init__(self, num_blocks: int, slip: str) -> None:
        self.queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.holders = [0] * num_blocks
        self.hash_of: dict[int, str] = {}
        self.block_of: dict[str, int] = {}
        self.slip = slip

    def allocate(self) -> int:
        if not self.queue:
            raise OutOfBlocks(1, 0)
        block, _ = self.queue.popitem(last=False)
        if self.slip != "hash_kept" and block in self.hash_of:
            del self.block_of[self.hash_of.pop(block)]
        self.holders[block] = 1
        return block

    def free(self, blocks: Sequence[int], hashes: Sequence[str | None]) -> None:
        pairs = list(zip(blocks, hashes, strict=True))
        for block, name in pairs if self.slip == "head_first" else reversed(pairs):
            if name is not None:
                self.hash_of[block], self.block_of[name] = name, block
            self.holders[block] -= 1
            if self.holders[block] == 0:
                self.queue[block] = None
                to_front = self.slip == "newest_first" or block not in self.hash_of
                if to_front and self.slip != "tail_at_back":
                    self.queue.move_to_end(block, last=False)

    def lookup(self, name: str) -> int | None:
        return self.block_of.get(name)

    def touch(self, block: int) -> None:
        if self.slip != "hit_stays" and (self.holders[block] == 0
                                         or self.slip == "holders_ignored"):
            self.queue.pop(block, None)
        self.holders[block] = 1 if self.slip == "holders_ignored" else self.holders[block] + 1


QUEUE_SLIPS = (
    ("tail_at_back", "a freed block without a hash holds nothing a later request can find: it "
                     "goes to the front of the queue, ahead of cached blocks, so it never "
                     "pushes a cached block out"),
    ("head_first", "free a request's blocks tail first: the last block of a prefix is worth "
                   "least to the next request, so it must be evicted first"),
    ("newest_first", "cached blocks join the back of the queue: the one freed longer ago is "
                     "evicted first"),
    ("hash_kept", "a block handed out again is overwritten: its hash must no longer be found"),
    ("holders_ignored", "a block two requests hold is free again only when both are done: "
                        "count its holders"),
    ("hit_stays", "a cache hit takes its block back out of the queue: nobody else may be "
                  "handed it while it is read"),
)
"""Wrong free queues the checks recognise, with their hints."""


def _queue_case(num_blocks: int, script: Sequence[QueueOp], call: str, hint: str,
                hints: Mapping[str, str] | None = None) -> Case:
    return _case(
        f"{call} -> what allocate and lookup returned",
        lambda cls, n=num_blocks, s=tuple(script): _play(cls(n), s),
        _play(_LibraryQueue(num_blocks), script),
        hint,
        _slips(lambda slip: _play(_QueueSlip(num_blocks, slip), script), QUEUE_SLIPS),
        hints,
    )


RANDOM_QUEUE_HINT = ("compare your queue with the rules one by one: front or back, tail before "
                     "head, hits leave the queue, evicted hashes are forgotten")
QUEUE_RAISED = ("allocate from an empty queue must raise OutOfBlocks (the script records it and "
                "goes on); no other call may raise")


def _random_queue_case(seed: int, num_blocks: int = 9) -> Case:
    script = _random_script(seed, num_blocks, 60)
    return _queue_case(num_blocks, script, f"q = cls({num_blocks}); a seeded mix of "
                       f"{len(script)} allocations, frees and hits (seed {seed})",
                       RANDOM_QUEUE_HINT, {"raised": QUEUE_RAISED})


def _queue_cases() -> list[Case]:
    cases = [_queue_case(n, script, _queue_text(n, script), hint)
             for n, script, hint in QUEUE_SCRIPTS]
    return cases + [_random_queue_case(seed) for seed in (1, 2)]


def _tells_every_slip(seed: int, num_blocks: int) -> bool:
    """Whether the seeded mix runs out of blocks and tells every known slip from the rules."""
    script = _random_script(seed, num_blocks, 60)
    expected = _play(_LibraryQueue(num_blocks), script)
    slips = _slips(lambda slip: _play(_QueueSlip(num_blocks, slip), script), QUEUE_SLIPS)
    return "OutOfBlocks" in expected.values() and all(found != expected for found, _ in slips)


def _queue_fresh(seed: int) -> list[Case]:
    """Four seeded mixes, each drawn until it runs out of blocks and tells every known slip
    from the rules, so each behaviour the fixed scripts probe is probed again."""
    rng = random.Random(seed)
    drawn: list[tuple[int, int]] = []
    while len(drawn) < 4:
        mix, num_blocks = rng.randrange(3, 10**6), rng.randint(6, 12)
        if _tells_every_slip(mix, num_blocks):
            drawn.append((mix, num_blocks))
    return [_random_queue_case(*pair) for pair in drawn]


# --- 04.system_prompt_blocks --------------------------------------------------------------


PROMPT_LABELS = ("blocks with sharing", "blocks without sharing")


def _system_prompt_case(prompt: int, chats: int, size: int, hint: str) -> Case:
    demo = system_prompt_sharing(prompt, chats, size)
    per_chat, shared = blocks_needed(prompt, size), (prompt - 1) // size
    full = prompt // size
    with_, without = demo.blocks_with_sharing, demo.blocks_without_sharing
    mistakes = [
        ({PROMPT_LABELS[0]: full + chats * (per_chat - full), PROMPT_LABELS[1]: without},
         "a later chat must compute its last prompt token itself, so the block that holds it "
         "is never shared"),
        ({PROMPT_LABELS[0]: chats * (per_chat - shared), PROMPT_LABELS[1]: without},
         "the shared blocks are still held once, by the cache: count them too"),
        ({PROMPT_LABELS[0]: without, PROMPT_LABELS[1]: with_},
         "return (with sharing, without sharing), in that order"),
        ({PROMPT_LABELS[0]: with_, PROMPT_LABELS[1]: per_chat},
         "without sharing every chat holds all its own blocks"),
    ]
    return _case(
        f"fn(prompt_tokens={prompt}, chats={chats}, block_size={size}) -> (blocks with sharing, "
        "blocks without sharing)",
        lambda fn, p=prompt, c=chats, s=size: labelled(PROMPT_LABELS, fn(p, c, s)),
        {PROMPT_LABELS[0]: with_, PROMPT_LABELS[1]: without},
        hint,
        mistakes,
    )


PROMPT_HINT = ("count what one chat holds, then which of those blocks a later chat can take "
               "from the cache instead of holding its own")
ONE_CHAT_HINT = "one chat shares with nobody: it holds all its blocks"
SHORT_SYSTEM_HINT = "a prompt shorter than a block has no full block to share"
ONE_BLOCK_HINT = ("one full block that holds the last prompt token: the rule of "
                  "longest_cached_prefix")


def _system_prompt_cases() -> list[Case]:
    inputs = [
        (1000, 50, 16, PROMPT_HINT),
        (1000, 50, 128, "bigger blocks: only full blocks are cached"),
        (1000, 1, 16, ONE_CHAT_HINT),
        (10, 5, 16, SHORT_SYSTEM_HINT),
        (1024, 50, 16,
         "1,024 tokens fill 64 blocks exactly, but a later chat must compute its last prompt "
         "token (the rule of longest_cached_prefix)"),
        (16, 3, 16, ONE_BLOCK_HINT),
        (33, 4, 16, PROMPT_HINT),
    ]
    return [_system_prompt_case(*entry) for entry in inputs]


def _system_prompt_fresh(seed: int) -> list[Case]:
    """Every kind of fixed case, drawn: a prompt with a partly filled last block, one that
    fills its blocks exactly, one shorter than a block, exactly one block, and one chat."""
    rng = random.Random(seed)
    sizes = [rng.choice([8, 16, 32, 128]) for _ in range(5)]
    chats = [rng.randint(2, 80) for _ in range(4)]
    inputs = [
        (_partly_filled(rng, sizes[0], (1, 60)), chats[0], sizes[0], PROMPT_HINT),
        (rng.randint(2, 60) * sizes[1], chats[1], sizes[1],
         "the prompt fills its blocks exactly, but a later chat must compute its last prompt "
         "token (the rule of longest_cached_prefix)"),
        (rng.randint(1, sizes[2] - 1), chats[2], sizes[2], SHORT_SYSTEM_HINT),
        (sizes[3], chats[3], sizes[3], ONE_BLOCK_HINT),
        (rng.randint(1, 4000), 1, sizes[4], ONE_CHAT_HINT),
    ]
    return [_system_prompt_case(*entry) for entry in inputs]


EXERCISES = (
    Exercise("04.fork", "Fork a block table", _fork_cases,
             reference=("course_lib.paged.PagedKVManager.fork",), fresh=_fork_fresh),
    Exercise("04.append_token", "Append a token with copy-on-write", _append_cases,
             reference=("course_lib.paged.PagedKVManager.append_tokens",), fresh=_append_fresh),
    Exercise("04.block_hashes", "The block-hash chain", _block_hashes_cases,
             reference=("course_lib.prefix_cache.block_hashes",
                        "course_lib.prefix_cache.extend_chain",
                        "course_lib.prefix_cache.PrefixCachingKVManager"),
             fresh=_block_hashes_fresh),
    Exercise("04.longest_cached_prefix", "Longest cached prefix", _lookup_cases,
             reference=("course_lib.prefix_cache.PrefixCachingBlockPool",
                        "course_lib.prefix_cache.PrefixCachingKVManager"),
             fresh=_lookup_fresh),
    Exercise("04.free_queue", "The prefix cache's free queue and eviction order",
             _queue_cases,
             reference=("course_lib.prefix_cache.PrefixCachingBlockPool",
                        "course_lib.prefix_cache.PrefixCachingKVManager"),
             fresh=_queue_fresh),
    Exercise("04.system_prompt_blocks", "Blocks for chats behind one system prompt",
             _system_prompt_cases,
             reference=("course_lib.sharing",), fresh=_system_prompt_fresh),
)
