"""A refused call changes nothing: random valid and invalid operations on the block pools,
the KV managers and the scheduler.

After every refused operation the whole state (public views and every internal field,
K/V tensor contents included) must equal what it was before; after every accepted one the
bookkeeping invariants must hold.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from course_lib.kv_math import blocks_needed
from course_lib.lazy_serving import LazyServingCore
from course_lib.paged import NULL_BLOCK, TOKEN_ID_LIMIT, BlockPool, OutOfBlocks, PagedKVManager
from course_lib.prefix_cache import (
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
    block_hashes,
)
from course_lib.scheduler import Scheduler, SchedulerConfig
from course_lib.serving import Sample, ServingCore, ServingRequest
from course_lib.simulator import Positions
from course_lib.workload import Request
from tests.frozen_state import freeze

NUM_BLOCKS, BLOCK, HEADS, DIM = 9, 4, 1, 2
REFUSED = (ValueError, OutOfBlocks)
SETTINGS = settings(max_examples=30, stateful_step_count=50, deadline=None,
                    derandomize=True, database=None)

Call = tuple[str, Callable[[], object]]


def _hash(label: object) -> bytes:
    """A 32-byte hash no real token chain produces."""
    return hashlib.sha256(f"test {label}".encode()).digest()


class ManagerMachine(RuleBasedStateMachine):
    """Sequences through a manager plus references the test takes straight from the pool.

    ``held`` counts the test's own references, so a block's reference count must always be
    its block-table entries plus ``held``.
    """

    caching = False

    def __init__(self) -> None:
        super().__init__()
        pool_type = PrefixCachingBlockPool if self.caching else BlockPool
        self.pool = pool_type(NUM_BLOCKS, BLOCK, num_kv_heads=HEADS, head_dim=DIM,
                              dtype=torch.float32)
        self.manager = (PrefixCachingKVManager if self.caching else PagedKVManager)(self.pool)
        self.held: Counter[int] = Counter()
        self.tokens: dict[str, list[int] | None] = {}  # None: the sequence tracks no ids
        self.salts: dict[str, str | None] = {}
        self.written: dict[str, dict[int, float]] = {}  # K written at each position
        self.counter = 0

    # --- helpers ----------------------------------------------------------------------------

    def _snapshot(self) -> tuple:
        """Everything observable, through the public API and inside every object."""
        pool, manager = self.pool, self.manager
        public = (
            pool.num_free, pool.num_used, pool.free_blocks(),
            tuple(pool.ref_count(b) for b in range(NUM_BLOCKS)),
            tuple(pool.block_hash(b) for b in range(NUM_BLOCKS)) if self.caching else (),
            manager.sequences,
            tuple((s, manager.block_table(s), manager.seq_len(s)) for s in manager.sequences),
            freeze(pool.kv_cache()),
        )
        return public, freeze(manager)

    def _refused(self, label: str, call: Callable[[], object]) -> None:
        """``call`` must raise a ValueError or OutOfBlocks and leave the snapshot unchanged."""
        note(f"refused: {label}")
        before = self._snapshot()
        with pytest.raises(REFUSED):
            call()
        assert self._snapshot() == before, f"{label} changed the state"

    def _attempt(self, label: str, call: Callable[[], object]) -> bool:
        """Run ``call``; on OutOfBlocks check that nothing changed and return False."""
        note(label)
        before = self._snapshot()
        try:
            call()
        except OutOfBlocks:
            assert self._snapshot() == before, f"{label} ran out of blocks but changed the state"
            return False
        return True

    def _name(self) -> str:
        self.counter += 1
        return f"s{self.counter}"

    def _pick(self, index: int) -> str:
        return sorted(self.tokens)[index % len(self.tokens)]

    def _cached(self) -> list[int]:
        return [b for b in range(NUM_BLOCKS) if self.caching and self.pool.block_hash(b)]

    # --- accepted (or out-of-blocks) operations ----------------------------------------------

    @rule(tokens=st.lists(st.integers(0, 2), max_size=14), track=st.booleans(),
          salt=st.sampled_from([None, "t"]))
    def add(self, tokens: list[int], track: bool, salt: str | None) -> None:
        name = self._name()
        track = track or (self.caching and salt is not None)
        extra = {"cache_salt": salt} if self.caching and track else {}
        call = (lambda: self.manager.add_sequence(name, token_ids=tokens, **extra)) if track \
            else (lambda: self.manager.add_sequence(name, len(tokens)))
        if self._attempt(f"add {name} {tokens} track={track} {extra}", call):
            self.tokens[name] = list(tokens) if track else None
            self.salts[name] = extra.get("cache_salt")
            self.written[name] = {}

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99), new=st.lists(st.integers(0, 2), min_size=1, max_size=9))
    def append(self, index: int, new: list[int]) -> None:
        name = self._pick(index)
        tracked = self.tokens[name]
        call = (lambda: self.manager.append_tokens(name, len(new))) if tracked is None \
            else (lambda: self.manager.append_tokens(name, token_ids=new))
        if self._attempt(f"append {name} {new}", call) and tracked is not None:
            tracked.extend(new)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99))
    def fork(self, index: int) -> None:
        parent, child = self._pick(index), self._name()
        note(f"fork {parent} -> {child}")
        self.manager.fork(parent, child)
        tokens = self.tokens[parent]
        self.tokens[child] = None if tokens is None else list(tokens)
        self.salts[child] = self.salts[parent]
        self.written[child] = dict(self.written[parent])

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99))
    def free_sequence(self, index: int) -> None:
        name = self._pick(index)
        note(f"free {name}")
        self.manager.free_sequence(name)
        del self.tokens[name], self.salts[name], self.written[name]

    @precondition(lambda self: any(self.manager.seq_len(s) for s in self.tokens))
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([s for s in self.tokens if self.manager.seq_len(s)]))
        positions = data.draw(st.lists(st.integers(0, self.manager.seq_len(name) - 1),
                                       min_size=1, max_size=6, unique=True))
        values = [float(self.counter + i) for i in range(len(positions))]
        self.counter += len(positions)
        key = torch.tensor(values).repeat_interleave(HEADS * DIM).reshape(-1, HEADS, DIM)
        table = self.manager.block_table(name)
        shared = any(self.pool.ref_count(table[p // BLOCK]) > 1 for p in positions)
        call = lambda: self.manager.write_kv(name, positions, key, -key)  # noqa: E731
        if shared:
            self._refused(f"write_kv into a shared block of {name}", call)
            return
        note(f"write {name} {positions}")
        call()
        self.written[name].update(zip(positions, values, strict=True))

    @precondition(lambda self: self.held.total() < 3)  # leave most blocks to sequences
    @rule()
    def pool_allocate(self) -> None:
        if self.pool.num_free == 0:
            self._refused("allocate from an empty pool", self.pool.allocate)
        else:
            self.held[self.pool.allocate()] += 1

    @precondition(lambda self: +self.held)
    @rule(data=st.data())
    def pool_free(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from(sorted(+self.held)))
        self.pool.free(block)
        self.held[block] -= 1

    @precondition(lambda self: +self.held)
    @rule(data=st.data())
    def pool_free_batch(self, data: st.DataObject) -> None:
        held = sorted((+self.held).elements())
        blocks = data.draw(st.permutations(held).map(lambda p: p[: max(1, len(p) // 2)]))
        self.pool.free_batch(blocks)
        self.held.subtract(blocks)

    @precondition(lambda self: self.pool.num_used)
    @rule(data=st.data())
    def pool_share(self, data: st.DataObject) -> None:
        used = [b for b in range(1, NUM_BLOCKS) if self.pool.ref_count(b)]
        block = data.draw(st.sampled_from(used))
        self.pool.share(block)
        self.held[block] += 1

    @precondition(lambda self: any(self.pool.ref_count(b) > 1 for b in +self.held))
    @rule(data=st.data())
    def pool_copy_on_write(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from([b for b in sorted(+self.held)
                                           if self.pool.ref_count(b) > 1]))
        if self.pool.num_free == 0:
            self._refused(f"copy_on_write({block}) with no free block",
                          lambda: self.pool.copy_on_write(block))
            return
        new = self.pool.copy_on_write(block)
        self.held[block] -= 1
        self.held[new] += 1
        assert freeze(self.pool.kv_cache()[new]) == freeze(self.pool.kv_cache()[block])

    @precondition(lambda self: self.caching and +self.held)
    @rule(data=st.data())
    def pool_cache_block(self, data: st.DataObject) -> None:
        mine = [b for b in sorted(+self.held) if self.held[b] == self.pool.ref_count(b)
                and self.pool.block_hash(b) is None]
        if mine:
            block = data.draw(st.sampled_from(mine))
            self.pool.cache_block(block, _hash(block))

    @precondition(lambda self: self._cached())
    @rule(data=st.data())
    def pool_touch(self, data: st.DataObject) -> None:
        blocks = data.draw(st.lists(st.sampled_from(self._cached()), min_size=1, unique=True))
        self.pool.touch(iter(blocks))
        self.held.update(blocks)

    # --- refused operations ------------------------------------------------------------------

    def _refuse_one(self, data: st.DataObject, calls: list[Call]) -> None:
        label, call = data.draw(st.sampled_from(calls))
        self._refused(label, call)

    @rule(data=st.data())
    def refused_pool_call(self, data: st.DataObject) -> None:
        self._refuse_one(data, self._bad_pool_calls())

    @rule(data=st.data())
    def refused_manager_call(self, data: st.DataObject) -> None:
        self._refuse_one(data, self._bad_manager_calls())

    @rule(data=st.data())
    def refused_kv_call(self, data: st.DataObject) -> None:
        self._refuse_one(data, self._bad_kv_calls())

    @precondition(lambda self: self.caching)
    @rule(data=st.data())
    def refused_cache_call(self, data: st.DataObject) -> None:
        self._refuse_one(data, self._bad_cache_calls())

    def _bad_pool_calls(self) -> list[Call]:
        pool = self.pool
        foreign: list[object] = [-1, NUM_BLOCKS, 10**9, "1", True, 1.0, None, [1]]
        unheld = [NULL_BLOCK, *pool.free_blocks()[:2]]
        calls: list[Call] = []
        for block in foreign + unheld:
            calls += [(f"free({block!r})", lambda b=block: pool.free(b)),
                      (f"share({block!r})", lambda b=block: pool.share(b)),
                      (f"copy_on_write({block!r})", lambda b=block: pool.copy_on_write(b))]
        calls += [(f"ref_count({b!r})", lambda b=b: pool.ref_count(b)) for b in foreign]
        held = sorted(+self.held)
        calls += [(f"free_batch({[*held[:1], b]!r})", lambda b=b: pool.free_batch([*held[:1], b]))
                  for b in foreign + unheld]
        calls += [(f"free_batch of block {b} once more than held",
                   lambda b=b: pool.free_batch([b] * (pool.ref_count(b) + 1))) for b in held[:2]]
        alone = [b for b in range(1, NUM_BLOCKS) if pool.ref_count(b) == 1]
        calls += [(f"copy_on_write({b}) of an unshared block", lambda b=b: pool.copy_on_write(b))
                  for b in alone[:2]]
        calls += [(f"kv_cache(layer={layer!r})", lambda layer=layer: pool.kv_cache(layer))
                  for layer in (1, -1, True)]
        if pool.num_free == 0:
            calls.append(("allocate from an empty pool", pool.allocate))
        return calls

    def _bad_manager_calls(self) -> list[Call]:
        m = self.manager
        big = (NUM_BLOCKS + 1) * BLOCK
        calls: list[Call] = [
            ("add non-str id", lambda: m.add_sequence(7, 1)),  # type: ignore[arg-type]
            ("add unhashable id", lambda: m.add_sequence(["x"], 1)),  # type: ignore[arg-type]
            *[(f"add num_tokens={n!r}", lambda n=n: m.add_sequence("new", n))
              for n in (-1, True, 2.5, "3", big, 10**30)],
            *[(f"add token_ids={ids!r}", lambda ids=ids: m.add_sequence("new", token_ids=ids))
              for ids in ([1, -1], [1, TOKEN_ID_LIMIT], [0, True], [1, "a"], [1, 2.0], 5, "ab",
                          [3] * big)],
            ("add count disagrees", lambda: m.add_sequence("new", 3, token_ids=[1, 2])),
            ("add count True for one id", lambda: m.add_sequence("new", True, token_ids=[1])),
            *[(f"append to {s!r}", lambda s=s: m.append_tokens(s)) for s in ("nope", 3, [])],
            *[(f"fork {p!r} -> {c!r}", lambda p=p, c=c: m.fork(p, c))
              for p, c in (("nope", "new"), ([], "new"))],
            *[(f"free_sequence({s!r})", lambda s=s: m.free_sequence(s)) for s in ("nope", None)],
            ("snapshot(label=5)", lambda: m.snapshot(5)),  # type: ignore[arg-type]
            ("batch_tables with an unknown id", lambda: m.batch_tables(["nope"])),
        ]
        for name, tokens in list(self.tokens.items())[:2]:
            calls += [
                (f"add existing {name}", lambda s=name: m.add_sequence(s, 1)),
                (f"fork {name} -> itself", lambda s=name: m.fork(s, s)),
                (f"fork {name} -> 5", lambda s=name: m.fork(s, 5)),  # type: ignore[arg-type]
                *[(f"append {name} num_tokens={n!r}", lambda s=name, n=n: m.append_tokens(s, n))
                  for n in (0, -2, True, 1.5, big)],
                *[(f"append {name} token_ids={ids!r}",
                   lambda s=name, ids=ids: m.append_tokens(s, token_ids=ids))
                  for ids in ([], [TOKEN_ID_LIMIT], [-3], [1, None], 9, [3] * big)],
                (f"slot_mapping {name} past its end",
                 lambda s=name: m.slot_mapping(s, [m.seq_len(s)])),
            ]
            if tokens is not None:  # a tracked sequence refuses bare counts
                calls.append((f"append {name} without ids", lambda s=name: m.append_tokens(s, 1)))
        return calls

    def _bad_kv_calls(self) -> list[Call]:
        m = self.manager
        row = torch.ones(1, HEADS, DIM)
        calls: list[Call] = [
            ("write_kv unknown", lambda: m.write_kv("nope", [0], row, row)),
        ]
        for name in [s for s in self.tokens if m.seq_len(s)][:2]:
            n = m.seq_len(name)
            two = torch.ones(2, HEADS, DIM)

            def write(positions: object, key: object = row, value: object = row,
                      layer: object = 0, s: str = name) -> Callable[[], object]:
                return lambda: m.write_kv(s, positions, key, value, layer)  # type: ignore[arg-type]

            calls += [
                (f"write_kv {name} at {n}", write([n])),
                (f"write_kv {name} at -1", write([-1])),
                (f"write_kv {name} at True", write([True])),
                (f"write_kv {name} positions=5", write(5)),
                (f"write_kv {name} twice at 0", write([0, 0], two, two)),
                (f"write_kv {name} key of the wrong shape", write([0], two, row)),
                (f"write_kv {name} value of the wrong shape", write([0], row, two)),
                (f"write_kv {name} value numpy", write([0], row, np.ones((1, HEADS, DIM)))),
                (f"write_kv {name} value int", write([0], row, torch.ones(1, HEADS, DIM,
                                                                          dtype=torch.long))),
                (f"write_kv {name} value list", write([0], row, [[[1.0] * DIM] * HEADS])),
                (f"write_kv {name} layer 1", write([0], layer=1)),
                (f"write_kv {name} layer True", write([0], layer=True)),
            ]
        return calls

    def _bad_cache_calls(self) -> list[Call]:
        pool, m = self.pool, self.manager
        assert isinstance(pool, PrefixCachingBlockPool)
        cached = self._cached()
        held = [b for b in range(1, NUM_BLOCKS) if pool.ref_count(b)]
        uncached_held = [b for b in held if pool.block_hash(b) is None]
        calls: list[Call] = [
            ("touch(5)", lambda: pool.touch(5)),  # type: ignore[arg-type]
            ("touch(['1'])", lambda: pool.touch(["1"])),  # type: ignore[list-item]
            ("touch([True])", lambda: pool.touch([True])),
            ("longest_cached_prefix([b'short'])", lambda: pool.longest_cached_prefix([b"x"])),
            ("longest_cached_prefix([['x']])",
             lambda: pool.longest_cached_prefix([["x"]])),  # type: ignore[list-item]
            ("add with salt 3", lambda: m.add_sequence("new", token_ids=[1], cache_salt=3)),
            ("add salt without ids", lambda: m.add_sequence("new", 2, cache_salt="t")),
        ]
        for block in cached[:2]:
            calls += [(f"touch([{block}, {bad!r}])", lambda b=block, x=bad: pool.touch([b, x]))
                      for bad in (999, -1, NULL_BLOCK, *uncached_held[:1])]
            calls.append((f"touch([{block}, {block}])", lambda b=block: pool.touch([b, b])))
        for block in held[:2]:
            calls += [(f"cache_block({block}, {h!r})", lambda b=block, h=h: pool.cache_block(b, h))
                      for h in (["x"], "x" * 32, b"short", bytearray(32), None, _hash(block)[:31])]
        for block in [b for b in held if pool.block_hash(b)][:2]:
            calls.append((f"cache_block({block}) with a different hash",
                          lambda b=block: pool.cache_block(b, _hash(("other", b)))))
        for block in (NULL_BLOCK, *pool.free_blocks()[:1], NUM_BLOCKS):
            calls.append((f"cache_block({block}) of an unheld block",
                          lambda b=block: pool.cache_block(b, _hash(b))))
        return calls

    # --- invariants after every step ---------------------------------------------------------

    @invariant()
    def every_block_is_free_or_referenced_exactly_as_counted(self) -> None:
        pool, free = self.pool, self.pool.free_blocks()
        assert len(set(free)) == len(free) == pool.num_free
        assert pool.num_free + pool.num_used == NUM_BLOCKS - 1
        assert NULL_BLOCK not in free and pool.ref_count(NULL_BLOCK) == 0
        entries = Counter(self.held)
        for name in self.tokens:
            table = self.manager.block_table(name)
            assert NULL_BLOCK not in table and len(set(table)) == len(table)
            assert len(table) == blocks_needed(self.manager.seq_len(name), BLOCK)
            entries.update(table)
        for block in range(1, NUM_BLOCKS):
            assert pool.ref_count(block) == entries[block]
            assert (block in free) == (entries[block] == 0)

    @invariant()
    def hash_maps_agree_and_full_blocks_carry_their_prefix_hash(self) -> None:
        if not self.caching:
            return
        pool = self.pool
        assert isinstance(pool, PrefixCachingBlockPool)
        pairs = {(b, h) for h, holders in pool._blocks_of.items() for b in holders}
        assert pairs == set(pool._hash_of.items()) and all(pool._blocks_of.values())
        for name, tokens in self.tokens.items():
            if tokens is None:
                continue
            assert self.manager.seq_len(name) == len(tokens)
            expected = block_hashes(tokens, BLOCK, cache_salt=self.salts[name])
            table = self.manager.block_table(name)
            assert [pool.block_hash(b) for b in table[: len(expected)]] == expected

    @invariant()
    def written_kv_reads_back(self) -> None:
        for name, written in self.written.items():
            key, value = self.manager.read_kv(name)
            for position, expected in written.items():
                assert torch.all(key[position] == expected)
                assert torch.all(value[position] == -expected)

    def teardown(self) -> None:
        for name in list(self.tokens):
            self.manager.free_sequence(name)
        for block, count in self.held.items():
            for _ in range(count):
                self.pool.free(block)
        assert self.pool.num_free == NUM_BLOCKS - 1


class CachingManagerMachine(ManagerMachine):
    """The same with prefix caching: hashes, touch, cache hits and evictions."""

    caching = True


TestRefusedManagerCalls = ManagerMachine.TestCase
TestRefusedManagerCalls.settings = SETTINGS
TestRefusedCachingCalls = CachingManagerMachine.TestCase
TestRefusedCachingCalls.settings = SETTINGS


# --- the scheduler ----------------------------------------------------------------------------

TRACE = [Request(i, 2, 2, arrival=i // 2, priority=i % 3) for i in range(6)]


class SchedulerMachine(RuleBasedStateMachine):
    """Arrive, admit, preempt and finish, interleaved with refused calls."""

    scheduler: Scheduler

    @initialize(policy=st.sampled_from(["fcfs", "priority"]))
    def start(self, policy: str) -> None:
        self.scheduler = Scheduler(SchedulerConfig(policy=policy), TRACE)
        self.new = list(range(len(TRACE)))
        self.finished: set[int] = set()

    def _snapshot(self) -> tuple:
        s = self.scheduler
        return s.num_waiting, s.next_waiting(), tuple(s.running), freeze(s)

    @precondition(lambda self: self.new)
    @rule()
    def arrive(self) -> None:
        self.scheduler.arrive(self.new.pop(0))

    @precondition(lambda self: self.scheduler.num_waiting)
    @rule()
    def admit(self) -> None:
        self.scheduler.admit_next()

    @precondition(lambda self: self.scheduler.running)
    @rule(requeue=st.booleans())
    def stop(self, requeue: bool) -> None:
        index = self.scheduler.victim()
        self.scheduler.stop(index)
        if requeue:
            self.scheduler.requeue(index)
        else:
            self.finished.add(index)

    @precondition(lambda self: self.scheduler.num_waiting)
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        s = self.scheduler
        waiting = [i for i in range(len(TRACE)) if i not in self.new and i not in self.finished
                   and i not in s.running]
        index = data.draw(st.sampled_from(waiting))
        s.withdraw(index)
        self.finished.add(index)

    @rule(data=st.data())
    def refused(self, data: st.DataObject) -> None:
        s = self.scheduler
        label, call = data.draw(st.sampled_from(self._bad_calls(s)))
        note(f"refused: {label}")
        before = self._snapshot()
        with pytest.raises(ValueError):
            call()
        assert self._snapshot() == before, f"{label} changed the state"

    def _bad_calls(self, s: Scheduler) -> list[Call]:
        queued = [i for i in range(len(TRACE)) if i not in self.new and i not in self.finished]
        bad: list[object] = [-1, len(TRACE), True, "0", None, 1.0]
        calls: list[Call] = [
            *[(f"{verb}({i!r})", lambda i=i, verb=verb: getattr(s, verb)(i))
              for verb in ("arrive", "requeue") for i in bad + queued[:4]],
            *[(f"withdraw({i!r})", lambda i=i: s.withdraw(i))
              for i in [*bad, *s.running, *self.new[:1], *sorted(self.finished)[:2]]],
            *[(f"stop({i!r})", lambda i=i: s.stop(i))
              for i in [*bad, *[i for i in range(len(TRACE)) if i not in s.running][:2]]],
            *[(f"admits({p!r}, {t!r})", lambda p=p, t=t: s.admits(p, t))
              for p, t in ((-1, 0), (0, -1), (True, 0), (1.5, 0), (0, None))],
        ]
        if not s.num_waiting:
            calls.append(("admit_next with nobody waiting", s.admit_next))
        if not s.running:
            calls.append(("victim with nobody running", s.victim))
        return calls

    @invariant()
    def every_request_is_new_waiting_running_or_finished_once(self) -> None:
        s, running = self.scheduler, set(self.scheduler.running)
        assert len(running) + s.num_waiting + len(self.new) + len(self.finished) == len(TRACE)
        assert not running & (set(self.new) | self.finished)


TestRefusedSchedulerCalls = SchedulerMachine.TestCase
TestRefusedSchedulerCalls.settings = SETTINGS


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: PagedKVManager(object()), "pool must be a BlockPool, got <object"),
        (lambda: Scheduler(None, []), "config must be a SchedulerConfig, got None"),
        (lambda: Scheduler(SchedulerConfig(), [3]), "requests must be Request objects, got 3"),
        (lambda: Scheduler(SchedulerConfig(), []).admit_next(), "no request is waiting"),
        (lambda: Scheduler(SchedulerConfig(), TRACE).stop(4), "request 4 is not running"),
        (lambda: Scheduler(SchedulerConfig(), TRACE).arrive(6),
         r"request index 6 is outside the trace \(6 requests\)"),
    ],
)
def test_construction_and_empty_scheduler_errors_name_the_value(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


class ServingCoreMachine(RuleBasedStateMachine):
    """Requests added, stepped and aborted through the serving core, interleaved with
    refused aborts (``True`` is not request 1, ``1.0`` is no id): a refused call changes
    nothing, and an aborted request's blocks are all free again."""

    @initialize(policy=st.sampled_from(["fcfs", "priority"]), caching=st.booleans())
    def start(self, policy: str, caching: bool) -> None:
        pool = (PrefixCachingBlockPool if caching else BlockPool)(NUM_BLOCKS, BLOCK)
        self.core = ServingCore(SchedulerConfig(policy=policy, max_num_batched_tokens=6), pool)

    @precondition(lambda self: len(self.core.requests) < 6)
    @rule(prompt=st.lists(st.integers(0, 9), min_size=1, max_size=6),
          max_tokens=st.integers(1, 4), n=st.integers(1, 2), priority=st.integers(0, 2))
    def add(self, prompt: list[int], max_tokens: int, n: int, priority: int) -> None:
        index = len(self.core.requests)
        samples = [Sample(f"r{index}.{k}", list(prompt)) for k in range(n)]
        request = ServingRequest(index, tuple(prompt), max_tokens, priority, samples)
        try:
            self.core.check_fits(request)
        except ValueError:
            return
        self.core.add(request)

    @precondition(lambda self: self.core.unfinished)
    @rule()
    def step(self) -> None:
        core = self.core
        core.retire(core.advance(core.schedule(),
                                 lambda i, request, sample: request.append_token(sample, 1, ())))

    @precondition(lambda self: self.core.unfinished)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        index = data.draw(st.sampled_from(sorted(self.core.unfinished)))
        request = self.core.abort(index)
        assert all(s.finish_reason is not None for s in request.samples)
        assert not any(self.core.manager.holds(s.seq_id) for s in request.samples)

    @rule(data=st.data())
    def refused_abort(self, data: st.DataObject) -> None:
        core = self.core
        ended = [i for i in range(len(core.requests)) if i not in core.unfinished]
        bad = data.draw(st.sampled_from([True, False, 1.0, "0", None, -1, len(core.requests),
                                         *ended[:2]]))
        note(f"refused: abort({bad!r})")
        before = freeze(vars(core))
        with pytest.raises(ValueError, match="is not running or waiting"):
            core.abort(bad)
        assert freeze(vars(core)) == before, f"abort({bad!r}) changed the core"

    @invariant()
    def blocks_are_held_only_by_unfinished_requests(self) -> None:
        core = self.core
        held = {s.seq_id for i in core.unfinished for s in core.requests[i].samples}
        assert set(core.manager.sequences) <= held
        if not core.unfinished:
            assert core.pool.num_used == 0 and not core.scheduler.num_waiting


TestRefusedServingCoreCalls = ServingCoreMachine.TestCase
TestRefusedServingCoreCalls.settings = SETTINGS


class LazyServingCoreMachine(ServingCoreMachine):
    """The same for the simulator's lazy core (one sample per request, its own cache salt
    with caching, recompute or swap), and refused adds too: two samples, a salt already
    taken, a priority that is no integer, an empty prompt."""

    @initialize(policy=st.sampled_from(["fcfs", "priority"]), caching=st.booleans(),
                 preemption=st.sampled_from(["recompute", "swap"]))
    def start(self, policy: str, caching: bool, preemption: str) -> None:  # type: ignore[override]
        pool = (PrefixCachingBlockPool if caching else BlockPool)(NUM_BLOCKS, BLOCK)
        self.core = LazyServingCore(SchedulerConfig(  # type: ignore[assignment]
            policy=policy, preemption=preemption, max_num_batched_tokens=6), pool)  # type: ignore[arg-type]

    @precondition(lambda self: len(self.core.requests) < 6)
    @rule(prompt=st.integers(1, 6), max_tokens=st.integers(1, 4), priority=st.integers(0, 2))
    def add(self, prompt: int, max_tokens: int, priority: int) -> None:  # type: ignore[override]
        index = len(self.core.requests)
        request = ServingRequest(index, range(prompt), max_tokens, priority,
                                 [Sample(f"r{index}", Positions(prompt))], f"salt {index}")
        try:
            self.core.check_fits(request)
        except ValueError:
            return
        self.core.add(request)

    @rule(kind=st.sampled_from(["two samples", "salt taken", "priority", "empty prompt"]))
    def refused_add(self, kind: str) -> None:
        core = self.core
        index = len(core.requests)
        samples = [Sample(f"r{index}", Positions(2))]
        salt, priority, prompt = f"salt {index}", 0, range(2)
        if kind == "two samples":
            samples.append(Sample(f"r{index}.1", Positions(2)))
        elif kind == "salt taken":
            if not core._caching or not index:
                return
            salt = "salt 0"
        elif kind == "priority":
            priority = 0.5  # type: ignore[assignment]
        else:
            prompt, samples = range(0), [Sample(f"r{index}", Positions(0))]
        note(f"refused: add with {kind}")
        before = freeze(vars(core))
        with pytest.raises(ValueError):
            core.add(ServingRequest(index, prompt, 2, priority, samples, salt))
        assert freeze(vars(core)) == before, f"an add with {kind} changed the core"

    @precondition(lambda self: self.core.unfinished)
    @rule()
    def step(self) -> None:
        core = self.core
        core.retire(core.advance(core.schedule()))  # type: ignore[call-arg]


TestRefusedLazyServingCoreCalls = LazyServingCoreMachine.TestCase
TestRefusedLazyServingCoreCalls.settings = SETTINGS
