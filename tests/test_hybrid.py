"""The hybrid KV-cache manager: KV-cache groups over one pool, window freeing, the per-group
prefix-hit rule, copy-on-write and preemption per group, and refused calls."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from course_lib.hybrid import HybridKVManager, first_needed_block, group_hash
from course_lib.kv_math import HYBRID_MODELS, blocks_needed
from course_lib.paged import NULL_BLOCK, BlockPool, OutOfBlocks
from course_lib.prefix_cache import PrefixCachingBlockPool, block_hashes
from tests.test_refused_calls import freeze

B = 4


def test_window_group_frees_blocks_behind_the_window_and_keeps_null_in_the_table() -> None:
    manager = HybridKVManager(BlockPool(32, B), [None, 6])
    manager.add_sequence("a", 10)
    assert manager.block_tables("a") == ((1, 2, 3), (4, 5, 6))
    for _ in range(6):  # decode positions 10 .. 15
        manager.append_tokens("a")
    # position 15 attends to 10..15: blocks 0 and 1 (tokens 0..7) went back to the pool,
    # block 0 of the window group as soon as position 12 was decoded (the full group's
    # fourth block reused it)
    full, window = manager.block_tables("a")
    assert full == (1, 2, 3, 4)
    assert window[:2] == (NULL_BLOCK, NULL_BLOCK) and NULL_BLOCK not in window[2:]
    assert manager.pool.ref_count(5) == 0 and manager.pool.num_used == 4 + 2


def test_window_blocks_go_back_last_first_so_the_later_one_is_evicted_first() -> None:
    """vLLM's ``remove_skipped_blocks`` frees the blocks a window passed in one step as one
    batch, last block first: cached, they join the back of the free queue in that order, so
    the later block is evicted first; uncached, the last one is the next handed out."""
    pool = PrefixCachingBlockPool(32, B)
    manager = HybridKVManager(pool, [5])
    manager.add_sequence("a", token_ids=list(range(16)))  # four full blocks, cached
    table = manager.block_table("a")
    manager.append_tokens("a", token_ids=[99])  # the chunk at 16 reads 12..: blocks 0-2 go
    assert pool.free_blocks()[-3:] == (table[2], table[1], table[0])
    while pool.block_hash(table[2]) is not None:
        pool.allocate()
    assert pool.num_evictions == 1
    assert pool.block_hash(table[1]) is not None and pool.block_hash(table[0]) is not None

    plain = HybridKVManager(BlockPool(32, B), [5])
    plain.add_sequence("a", 16)
    table = plain.block_table("a")
    plain.append_tokens("a")  # blocks 0-2 go back, then block 4 is taken: the last freed
    assert plain.block_table("a")[4] == table[2]
    assert plain.pool.free_blocks()[:2] == (table[1], table[0])


def test_a_finished_sequence_goes_back_group_by_group_last_block_first() -> None:
    manager = HybridKVManager(BlockPool(32, B), [None, 5])
    manager.add_sequence("a", 10)
    full, window = manager.block_tables("a")
    manager.free_sequence("a")
    assert manager.pool.free_blocks()[:6] == (*window[::-1], *full[::-1])


def test_the_hit_is_the_longest_prefix_every_group_serves() -> None:
    pool = PrefixCachingBlockPool(64, B)
    manager = HybridKVManager(pool, [None, 5])
    prompt = list(range(40))
    manager.add_sequence("a", token_ids=prompt)
    manager.append_tokens("a", token_ids=[7])  # frees window blocks before 40 - 5 + 1 = 36
    manager.free_sequence("a")
    # Every full block is still cached in the full group; the window group kept its last
    # blocks cached only because freed blocks keep their hashes.
    assert manager.add_sequence("b", token_ids=[*prompt, 1, 2]) == 40
    full, window = manager.block_tables("b")
    assert first_needed_block(40, 5, B) == 9 and NULL_BLOCK not in full
    assert window[:9] == (NULL_BLOCK,) * 9 and window[9] != NULL_BLOCK
    manager.free_sequence("b")


def test_a_window_group_miss_shortens_the_hit_below_the_full_groups() -> None:
    pool = PrefixCachingBlockPool(64, B)
    manager = HybridKVManager(pool, [None, 5])
    manager.add_sequence("a", token_ids=list(range(16)))
    # Evict the window group's copy of block 3 (tokens 12..15) only.
    block = manager.block_table("a", 1)[3]
    manager.free_sequence("a")
    while pool.block_hash(block) is not None:
        pool.allocate()
    hit = manager.cache_hit(block_hashes(list(range(17)), B)[:4])
    assert len(hit[0]) < 4  # the full group alone could serve 4 blocks
    assert len(hit[0]) == len(hit[1])


def test_for_model_has_one_group_per_kv_cache_group() -> None:
    manager = HybridKVManager.for_model(BlockPool(8, B), HYBRID_MODELS["gemma-3-27b"])
    assert manager.windows == (1024,) * 6 + (None,)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: HybridKVManager(BlockPool(8, B), []), "group"),
    (lambda: HybridKVManager(BlockPool(8, B), [0]), "window"),
    (lambda: HybridKVManager("pool", [None]), "BlockPool"),
    (lambda: HybridKVManager.for_model(BlockPool(8, B), "gpt-oss-20b"), "HybridModel"),
    (lambda: first_needed_block(-1, 4, B), "start"),
    (lambda: group_hash(b"short", 0), "hash"),
])
def test_bad_arguments_raise_naming_them(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def needed_from(start: int, window: int | None) -> int:
    """The test's own statement of the rule: the first block holding a position the token
    at ``start`` attends to (``start - window + 1``), 0 for full attention."""
    return 0 if window is None else max(0, start - window + 1) // B


WINDOW_SETS = [(None, 6), (3, None), (None, 9, 9), (5,), (None, 1)]


class HybridMachine(RuleBasedStateMachine):
    """Add, append (decodes and chunks), fork, free, preempt-and-resume, with prefix hits;
    refused calls change nothing."""

    caching = True

    @initialize(windows=st.sampled_from(WINDOW_SETS), blocks=st.integers(6, 24))
    def setup(self, windows: tuple[int | None, ...], blocks: int) -> None:
        pool = (PrefixCachingBlockPool if self.caching else BlockPool)(blocks, B)
        self.manager = HybridKVManager(pool, windows)
        self.tokens: dict[str, list[int]] = {}
        self.start: dict[str, int] = {}
        self.decoded: set[str] = set()
        self.counter = 0

    def _state(self) -> object:
        pool = self.manager.pool
        return freeze((pool.free_blocks(), [pool.ref_count(b) for b in range(pool.num_blocks)],
                       vars(self.manager)))

    def _attempt(self, label: str, call) -> bool:
        note(label)
        before = self._state()
        try:
            call()
        except OutOfBlocks:
            assert self._state() == before, f"{label} ran out of blocks but changed the state"
            return False
        return True

    def _add(self, name: str, tokens: list[int]) -> None:
        manager = self.manager
        hashes = block_hashes(tokens, B)[: max(len(tokens) - 1, 0) // B]
        expected = self._hit_by_the_rule(hashes)
        call = (lambda: manager.add_sequence(name, token_ids=tokens)) if self.caching \
            else (lambda: manager.add_sequence(name, len(tokens)))
        hit: list[int] = []
        if self._attempt(f"add {name} {tokens}", lambda: hit.append(call())):
            assert hit[0] == expected * B, f"hit {hit[0]} tokens, the rule gives {expected}"
            self.tokens[name], self.start[name] = list(tokens), hit[0]
            self.decoded.discard(name)

    def _hit_by_the_rule(self, hashes: list[bytes]) -> int:
        """The longest hit every group serves, read off the pool's hashes directly."""
        if not self.caching:
            return 0
        pool, windows = self.manager.pool, self.manager.windows
        cached = {pool.block_hash(b) for b in range(1, pool.num_blocks)} - {None}
        for blocks in range(len(hashes), 0, -1):
            if all(group_hash(hashes[i], g) in cached
                   for g, window in enumerate(windows)
                   for i in range(needed_from(blocks * B, window), blocks)):
                return blocks
        return 0

    def _name(self) -> str:
        self.counter += 1
        return f"s{self.counter}"

    def _pick(self, index: int) -> str:
        return sorted(self.tokens)[index % len(self.tokens)]

    @rule(tokens=st.lists(st.integers(0, 1), max_size=22))
    def add(self, tokens: list[int]) -> None:
        self._add(self._name(), tokens)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99), new=st.lists(st.integers(0, 1), min_size=1, max_size=7))
    def append(self, index: int, new: list[int]) -> None:
        name = self._pick(index)
        call = (lambda: self.manager.append_tokens(name, token_ids=new)) if self.caching \
            else (lambda: self.manager.append_tokens(name, len(new)))
        if self._attempt(f"append {name} {new}", call):
            self.start[name] = len(self.tokens[name])
            self.tokens[name] += new
            if len(new) == 1:
                self.decoded.add(name)
            else:
                self.decoded.discard(name)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99))
    def fork(self, index: int) -> None:
        parent, child = self._pick(index), self._name()
        note(f"fork {parent} -> {child}")
        self.manager.fork(parent, child)
        self.tokens[child], self.start[child] = list(self.tokens[parent]), self.start[parent]
        if parent in self.decoded:
            self.decoded.add(child)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99))
    def free(self, index: int) -> None:
        name = self._pick(index)
        note(f"free {name}")
        self.manager.free_sequence(name)
        del self.tokens[name], self.start[name]
        self.decoded.discard(name)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99))
    def preempt_and_resume(self, index: int) -> None:
        """Recompute preemption: free everything, come back through the prefix cache."""
        name = self._pick(index)
        tokens = self.tokens.pop(name)
        del self.start[name]
        note(f"preempt {name}")
        self.manager.free_sequence(name)
        self._add(self._name(), tokens)

    @rule(data=st.data())
    def refused(self, data: st.DataObject) -> None:
        manager = self.manager
        existing = sorted(self.tokens) or ["s0"]
        calls = [
            ("append to an unknown sequence", lambda: manager.append_tokens("nope", 1)),
            ("free an unknown sequence", lambda: manager.free_sequence("nope")),
            ("add an existing id", lambda: manager.add_sequence(existing[0], 1)
             if self.tokens else manager.fork("nope", "x")),
            ("fork onto an existing id", lambda: manager.fork(existing[0], existing[0])),
            ("append zero tokens", lambda: manager.append_tokens(existing[0], 0)),
            ("negative token id", lambda: manager.add_sequence("new", token_ids=[1, -1])),
        ]
        label, call = data.draw(st.sampled_from(calls))
        note(f"refused: {label}")
        before = self._state()
        with pytest.raises((ValueError, OutOfBlocks)):
            call()
        assert self._state() == before, f"{label} changed the state"

    @invariant()
    def no_leak_and_counts_match_tables(self) -> None:
        if not hasattr(self, "manager"):
            return
        pool, entries = self.manager.pool, Counter()
        for name in self.tokens:
            for table in self.manager.block_tables(name):
                entries.update(b for b in table if b != NULL_BLOCK)
        for block in range(1, pool.num_blocks):
            assert pool.ref_count(block) == entries[block], f"block {block}"
        assert pool.num_used == len(entries)
        assert set(self.manager.sequences) == set(self.tokens)

    @invariant()
    def tables_follow_the_window_rule(self) -> None:
        if not hasattr(self, "manager"):
            return
        for name, tokens in self.tokens.items():
            length, tables = len(tokens), self.manager.block_tables(name)
            assert self.manager.seq_len(name) == length
            for window, table in zip(self.manager.windows, tables, strict=True):
                assert len(table) == blocks_needed(length, B)
                first = needed_from(self.start[name], window)
                assert all(b == NULL_BLOCK for b in table[:first]), (name, window, table)
                assert NULL_BLOCK not in table[first:], (name, window, table)
                if window is not None and name in self.decoded:
                    held = sum(b != NULL_BLOCK for b in table)
                    assert held <= math.ceil(window / B) + 1, (name, window, table)

    @invariant()
    def cached_blocks_hold_what_their_hash_says(self) -> None:
        if not hasattr(self, "manager") or not self.caching:
            return
        pool = self.manager.pool
        for name, tokens in self.tokens.items():
            chain = block_hashes(tokens, B)
            for group, table in enumerate(self.manager.block_tables(name)):
                for index, block in enumerate(table):
                    if block == NULL_BLOCK:
                        continue
                    held = pool.block_hash(block)
                    if index < len(chain):
                        assert held in (None, group_hash(chain[index], group))
                    else:  # a partly filled block is never cached
                        assert held is None
                if table and len(tokens) % B and pool.ref_count(table[-1]) > 1:
                    siblings = [s for s in self.tokens if s != name
                                and self.manager.block_tables(s)[group][-1:] == table[-1:]]
                    assert all(self.tokens[s] == tokens for s in siblings)


class PlainHybridMachine(HybridMachine):
    """The same without prefix caching (a plain pool, counts instead of token ids)."""

    caching = False


SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None, derandomize=True,
                    database=None)
TestHybridMachine = HybridMachine.TestCase
TestHybridMachine.settings = SETTINGS
TestPlainHybridMachine = PlainHybridMachine.TestCase
TestPlainHybridMachine.settings = SETTINGS


def test_hit_blocks_rule_and_refusals() -> None:
    from course_lib.hybrid import hit_blocks, serves_hit

    assert hit_blocks([[True] * 6, [False] * 4 + [True] * 2], [None, 8], 4, 25) == 6
    assert hit_blocks([[True] * 6, [True] * 5 + [False]], [None, 8], 4, 25) == 5
    assert hit_blocks([[True] * 6], [None], 4, 24) == 5  # the last token is computed
    assert serves_hit([False, True], 2, 5, 4) and not serves_hit([False, True], 2, 6, 4)
    for call, message in [
        (lambda: hit_blocks([[True]], [None, 4], 4, 5), "groups"),
        (lambda: hit_blocks([[True]], [None], 4, 13), "flags"),
        (lambda: hit_blocks([[True]], [None], 0, 5), "block_size"),
        (lambda: serves_hit([True], 2, None, 4), "blocks"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()
