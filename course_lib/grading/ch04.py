"""Chapter 04 exercises: fork, copy-on-write, the block-hash chain, prefix lookup, sharing.

Expected values come from ``course_lib.paged``, ``course_lib.prefix_cache`` and
``course_lib.sharing``. The learner's ``fork`` and ``append_token`` work on block tables
held as plain lists over a library ``BlockPool``; a case replays a short script of
operations twice, once through the learner's function and once through
``PagedKVManager``, and compares what each leaves behind: every table, every length, every
reference count and the number of free blocks. How the learner's code reaches that state
(``copy_on_write``, or ``allocate`` plus ``free``) is up to them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from course_lib.grading.check import Case, Exercise
from course_lib.kv_math import blocks_needed
from course_lib.paged import BlockPool, PagedKVManager
from course_lib.prefix_cache import (
    BlockHash,
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
    block_hashes,
)
from course_lib.sharing import cow_demo, system_prompt_sharing

# --- replaying a script of block-table operations ---------------------------------------

Op = tuple[Any, ...]
"""``("add", seq, tokens)``, ``("fork", parent, child)``, ``("append", seq, tokens)`` or
``("free", seq)``; appends go one token at a time, as decoding does."""


@dataclass(frozen=True)
class PoolState:
    """What a script leaves behind, in a form that reads well in a failure report."""

    tables: tuple[tuple[str, tuple[Any, ...]], ...]
    lengths: tuple[tuple[str, Any], ...]
    refs: tuple[tuple[int, int], ...]
    free: int

    def __repr__(self) -> str:
        tables = ", ".join(f"{seq}: {list(table)}" for seq, table in self.tables)
        lengths = ", ".join(f"{seq}: {length!r}" for seq, length in self.lengths)
        refs = ", ".join(f"{block}: {count}" for block, count in self.refs)
        return f"tables {{{tables}}} lengths {{{lengths}}} ref counts {{{refs}}} free {self.free}"


def _state(
    pool: BlockPool, tables: Mapping[str, Sequence[Any]], lengths: Mapping[str, Any]
) -> PoolState:
    """The state of ``pool`` and the live tables; only blocks held by someone are listed."""
    names = sorted(tables)
    return PoolState(
        tables=tuple((seq, tuple(tables[seq])) for seq in names),
        lengths=tuple((seq, lengths[seq]) for seq in names),
        refs=tuple(
            (block, pool.ref_count(block))
            for block in range(1, pool.num_blocks)
            if pool.ref_count(block)
        ),
        free=pool.num_free,
    )


def _expected_state(num_blocks: int, block_size: int, script: Sequence[Op]) -> PoolState:
    """Run ``script`` through the library's ``PagedKVManager``."""
    manager = PagedKVManager(BlockPool(num_blocks, block_size))
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
    tables = {seq: manager.block_table(seq) for seq in manager.sequences}
    lengths = {seq: manager.seq_len(seq) for seq in manager.sequences}
    return _state(manager.pool, tables, lengths)


def _library_fork(pool: BlockPool, table: list[int]) -> list[int]:
    """What ``PagedKVManager.fork`` does to one table, for scripts that test ``append``."""
    for block in table:
        pool.share(block)
    return list(table)


def _library_append(pool: BlockPool, table: list[int], length: int) -> int:
    """What ``PagedKVManager.append_tokens`` does for one token, for scripts that test ``fork``."""
    if length % pool.block_size == 0:
        table.append(pool.allocate())
    elif pool.ref_count(table[-1]) > 1:
        table[-1] = pool.copy_on_write(table[-1])
    return length + 1


def _replay(
    num_blocks: int,
    block_size: int,
    script: Sequence[Op],
    fork: Callable[[BlockPool, list[int]], Any],
    append: Callable[[BlockPool, list[int], int], Any],
) -> PoolState:
    """Run ``script`` on plain-list tables with the given ``fork`` and ``append``."""
    pool = BlockPool(num_blocks, block_size)
    tables: dict[str, Any] = {}
    lengths: dict[str, Any] = {}
    for op in script:
        if op[0] == "add":
            tables[op[1]] = [pool.allocate() for _ in range(blocks_needed(op[2], block_size))]
            lengths[op[1]] = op[2]
        elif op[0] == "fork":
            tables[op[2]] = fork(pool, tables[op[1]])
            lengths[op[2]] = lengths[op[1]]
        elif op[0] == "append":
            for _ in range(op[2]):
                lengths[op[1]] = append(pool, tables[op[1]], lengths[op[1]])
        else:
            for block in reversed(tables.pop(op[1])):
                pool.free(block)
            del lengths[op[1]]
    return _state(pool, tables, lengths)


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


def _samples(prompt: int, count: int, new: int) -> list[Op]:
    """Prefill ``prompt`` tokens, fork ``count`` samples, free the prompt, decode in turns."""
    names = [f"s{i}" for i in range(count)]
    script: list[Op] = [("add", "p", prompt), *(("fork", "p", n) for n in names), ("free", "p")]
    for _ in range(new):
        script += [("append", n, 1) for n in names]
    return script


# --- 04.fork ------------------------------------------------------------------------------

FORK_HINT = ("share every block once (pool.share(block)) and return a NEW list with the same "
             "block ids; fork allocates nothing and leaves the parent's table as it was")

FORK_SCRIPTS: tuple[tuple[int, int, list[Op], str], ...] = (
    (8, 4, [("add", "a", 6), ("fork", "a", "b")], FORK_HINT),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("fork", "a", "c")],
     "each fork adds one reference to every block: two forks -> count 3"),
    (8, 4, [("add", "a", 0), ("fork", "a", "b")], "an empty table forks into an empty table"),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("free", "a")],
     "after the parent is freed, the child must still hold every block (count 1 each)"),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("append", "b", 1)],
     "the child's first token goes into a shared block, so the pool must see count 2 there "
     "(copy-on-write depends on your counts)"),
    (12, 4, [("add", "a", 5), ("fork", "a", "b"), ("fork", "b", "c"), ("free", "a"),
             ("append", "c", 2), ("append", "b", 4)],
     "a fork of a fork shares the same physical blocks: counts add up across generations"),
)


def _fork_state_case(num_blocks: int, block_size: int, script: list[Op], hint: str) -> Case:
    return Case(
        f"fork(pool, table) in: {_script_text(block_size, script)}",
        lambda fn: _replay(num_blocks, block_size, script, fn, _library_append),
        _expected_state(num_blocks, block_size, script),
        hint,
    )


def _fork_keeps_parent(fn: Callable[[BlockPool, list[int]], Any]) -> list[int]:
    pool = BlockPool(8, 4)
    parent = [pool.allocate(), pool.allocate()]
    child = fn(pool, parent)
    if isinstance(child, list):
        child.append(7)  # the child's next block must not appear in the parent's table
    return parent


def _fork_cases() -> list[Case]:
    cases = [_fork_state_case(*args) for args in FORK_SCRIPTS]
    cases.append(Case(
        "parent = [1, 2]; child = fork(pool, parent); child.append(7); parent",
        _fork_keeps_parent,
        [1, 2],
        "return a new list (list(table)), not the parent's own list: appending to the child "
        "must not change the parent",
    ))
    demo = _samples(1000, 4, 200)
    cases.append(Case(
        "fork(pool, table) in the source's demo: 1,000-token prompt, 4 samples x 200 tokens, "
        "blocks of 16",
        lambda fn: _replay(301, 16, demo, fn, _library_append).free,
        _expected_state(301, 16, demo).free,
        "free blocks at the end: 300 usable - 114 in use when every fork shares correctly",
    ))
    return cases


# --- 04.append_token ----------------------------------------------------------------------

APPEND_HINT = ("length % block_size == 0 means the last block is full (or there is none): "
               "append pool.allocate(); otherwise, if the last block's ref_count is above 1, "
               "replace it by a copy (pool.copy_on_write); return length + 1")

APPEND_SCRIPTS: tuple[tuple[int, int, list[Op], str], ...] = (
    (8, 4, [("add", "a", 0), ("append", "a", 1)],
     "an empty sequence has no block: its first token needs a fresh one"),
    (8, 4, [("add", "a", 3), ("append", "a", 1)],
     "the last block has a free slot and is yours alone: write in place, allocate nothing"),
    (8, 4, [("add", "a", 4), ("append", "a", 1)],
     "4 tokens fill a block of 4: the 5th token needs a fresh block"),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("append", "b", 1)],
     "the last block is shared and partly filled: copy it first (new block, old count - 1)"),
    (8, 4, [("add", "a", 6), ("fork", "a", "b"), ("append", "b", 1), ("append", "a", 1)],
     "once the other sharer has its copy, the count is 1: the last holder writes in place"),
    (8, 4, [("add", "a", 8), ("fork", "a", "b"), ("append", "b", 1)],
     "a shared FULL block is never written again: take a fresh block and copy nothing"),
    (10, 4, [("add", "p", 6), ("fork", "p", "s0"), ("fork", "p", "s1"), ("fork", "p", "s2"),
             ("free", "p"), ("append", "s0", 1), ("append", "s1", 1), ("append", "s2", 1),
             ("append", "s0", 2), ("append", "s1", 2), ("append", "s2", 2)],
     "the lecture's three samples: two copies, then the last sample writes in place"),
    (12, 4, [("add", "a", 2), ("append", "a", 9)],
     "append 9 tokens one at a time: a new block at lengths 4 and 8, none in between"),
)


def _demo_summary(state: PoolState) -> tuple[int, tuple[Any, ...], Any]:
    """(blocks in use, last prompt block per sample, first block's count) of the demo."""
    tables = dict(state.tables)
    lasts = tuple(tables[f"s{i}"][62] if len(tables[f"s{i}"]) > 62 else None for i in range(4))
    refs = dict(state.refs)
    first = tables["s0"][0] if tables["s0"] else None
    return len(state.refs), lasts, refs.get(first, 0)


def _append_cases() -> list[Case]:
    cases = [
        Case(
            f"append_token(pool, table, length) in: {_script_text(size, script)}",
            lambda fn, n=n, size=size, script=script: _replay(n, size, script, _library_fork, fn),
            _expected_state(n, size, script),
            hint,
        )
        for n, size, script, hint in APPEND_SCRIPTS
    ]
    demo = cow_demo(prompt_tokens=1000, samples=4, new_tokens=200, block_size=16)
    cases.append(Case(
        "the source's demo with append_token: 1,000-token prompt, 4 samples x 200 tokens, "
        "blocks of 16 -> (blocks in use, last prompt block per sample, first block's count)",
        lambda fn: _demo_summary(
            _replay(301, 16, _samples(1000, 4, 200), _library_fork, fn)
        ),
        (demo.blocks_in_use, demo.last_prompt_block_per_sample, demo.first_block_refcount),
        "the first three writers copy the shared last prompt block, the fourth finds count 1 "
        "and keeps it; 62 full prompt blocks stay shared by all 4",
    ))
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


def _block_hashes_cases() -> list[Case]:
    hint = ("one hash per FULL block: hash_block_tokens(parent, the block's tokens, extra "
            "keys), with parent None for the first block and the previous block's hash after")
    salt_hint = ("the cache salt goes into the FIRST block's extra keys only "
                 "([cache_salt]); later blocks inherit it through their parent's hash")
    inputs: list[tuple[list[int], int, str | None, str]] = [
        (list(range(10)), 4, None, hint),
        (list(range(8)), 4, None, "8 tokens fill exactly 2 blocks of 4: both get a hash"),
        ([1, 2, 3], 4, None, "a partly filled block gets no hash: 3 tokens in blocks of 4 -> []"),
        ([], 4, None, "no tokens, no hashes"),
        ([99, *range(1, 10)], 4, None, "the parent of block i is the hash of block i - 1"),
        (list(range(10)), 4, "tenant-a", salt_hint),
        (list(range(5)), 1, "tenant-b", salt_hint),
        (_prompt(1000), 16, None, "a 1,000-token prompt has 62 full blocks of 16"),
    ]
    cases = []
    for tokens, size, salt, case_hint in inputs:
        shown = tokens if len(tokens) <= 10 else f"<{len(tokens)} tokens>"
        cases.append(Case(
            f"fn({shown}, block_size={size}{_salt_text(salt)})",
            lambda fn, t=tokens, s=size, c=salt: _short(list(_with_salt(fn, c, list(t), s))),
            _short(block_hashes(tokens, size, cache_salt=salt)),
            case_hint,
        ))
    return cases


# --- 04.longest_cached_prefix -------------------------------------------------------------


def _cache_of(pool: PrefixCachingBlockPool) -> dict[BlockHash, int]:
    """The cache as the exercise sees it: block hash -> the block that holds it."""
    cache: dict[BlockHash, int] = {}
    for block in range(1, pool.num_blocks):
        block_hash = pool.block_hash(block)
        if block_hash is not None:
            cache.setdefault(block_hash, block)
    return cache


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
    """The cache after running ``prompts`` (tokens, salt) through the prefix-caching manager."""
    manager = PrefixCachingKVManager(PrefixCachingBlockPool(256, size))
    for index, (tokens, salt) in enumerate(prompts):
        manager.add_sequence(f"r{index}", token_ids=tokens, cache_salt=salt)
        manager.free_sequence(f"r{index}")
    return _cache_of(manager.pool)


def _lookup_cases() -> list[Case]:
    a = list(range(10))
    cached_a = _cached_after(4, [(a, None)])
    salted = _cached_after(4, [(a, "acme")])
    first, second = block_hashes(a, 4)
    system = _prompt(1000)
    cached_system = _cached_after(16, [([*system, 1, 2, 3], None)])
    stop = "walk the hashes from the first block and stop at the first one not in the cache"
    inputs: list[tuple[str, dict[BlockHash, int], list[int], int, str | None, str]] = [
        ("cache after A = 0..9", cached_a, a, 4, None,
         "A's two full blocks are cached; the last prompt token must be computed, but here "
         "it sits in the partly filled third block, so both blocks are usable"),
        ("cache after A = 0..9", cached_a, [*a[:8], 99, 98, 97], 4, None,
         "the first 8 tokens match A: both of A's full blocks"),
        ("cache after A = 0..9", cached_a, [0, 1, 2, 3, 99, 5, 6, 7, 8], 4, None, stop),
        ("cache after A = 0..9", cached_a, [99, *a[1:]], 4, None,
         "the first block differs, so no hash matches (every later hash chains from it)"),
        ("cache after A = 0..9", cached_a, a[:8], 4, None,
         "8 tokens are exactly 2 full blocks, but the last prompt token is always computed: "
         "use at most (len(token_ids) - 1) // block_size blocks"),
        ("cache after A = 0..9", cached_a, a[:3], 4, None, "fewer tokens than a block: nothing"),
        ("empty cache", {}, a, 4, None, "an empty cache finds nothing"),
        ("cache after A = 0..9 with cache_salt='acme'", salted, a, 4, None,
         "a request without the salt must not see the salted blocks"),
        ("cache after A = 0..9 with cache_salt='acme'", salted, a, 4, "acme",
         "the same salt, the same hashes: pass cache_salt on to your block hashes"),
        ("cache after A = 0..9 with cache_salt='acme'", salted, a, 4, "globex",
         "a different salt changes every hash: nothing found"),
        ("cache with only A's SECOND block (the first was evicted)", {second: 2}, a, 4, None,
         stop + "; a later block is useless without the blocks before it"),
        ("cache with only A's first block", {first: 1}, a, 4, None, stop),
        ("cache after a chat with a 1,000-token system prompt", cached_system,
         [*system, 7, 7, 7], 16, None, "the system prompt's 62 full blocks are all cached"),
    ]
    cases = []
    for label, cache, tokens, size, salt, hint in inputs:
        shown = tokens if len(tokens) <= 11 else f"<{len(tokens)} tokens>"
        cases.append(Case(
            f"fn(<{label}>, {shown}, block_size={size}{_salt_text(salt)})",
            lambda fn, c=cache, t=tokens, s=size, k=salt: list(
                _with_salt(fn, k, dict(c), list(t), s)
            ),
            _library_lookup(cache, tokens, size, salt),
            hint,
        ))
    return cases


# --- 04.system_prompt_blocks --------------------------------------------------------------


def _system_prompt_cases() -> list[Case]:
    hint = ("without sharing: chats x ceil(prompt / block_size). With sharing, the full blocks a "
            "later chat can take from the cache are held once, and every chat holds the rest")
    inputs = [
        (1000, 50, 16, hint),
        (1000, 50, 128, "blocks of 128: only 7 full blocks (896 tokens) can be shared"),
        (1000, 1, 16, "one chat shares with nobody: it holds all its blocks"),
        (10, 5, 16, "a prompt shorter than a block has no full block to share"),
        (1024, 50, 16,
         "1,024 tokens fill 64 blocks, but a later chat must compute its last prompt token, so "
         "it takes only (prompt - 1) // block_size blocks from the cache"),
        (16, 3, 16, "one full block, but the last prompt token is always computed: no sharing"),
        (33, 4, 16, hint),
    ]
    cases = []
    for prompt, chats, size, case_hint in inputs:
        demo = system_prompt_sharing(prompt, chats, size)
        cases.append(Case(
            f"fn(prompt_tokens={prompt}, chats={chats}, block_size={size})",
            lambda fn, p=prompt, c=chats, s=size: tuple(fn(p, c, s)),
            (demo.blocks_with_sharing, demo.blocks_without_sharing),
            case_hint,
        ))
    return cases


EXERCISES = (
    Exercise("04.fork", "Fork a block table", _fork_cases),
    Exercise("04.append_token", "Append a token with copy-on-write", _append_cases),
    Exercise("04.block_hashes", "The block-hash chain", _block_hashes_cases),
    Exercise("04.longest_cached_prefix", "Longest cached prefix", _lookup_cases),
    Exercise("04.system_prompt_blocks", "Blocks for chats behind one system prompt",
             _system_prompt_cases),
)
