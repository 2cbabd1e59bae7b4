"""Chapter 04's checks: library-backed answers pass, other correct designs pass, wrong ones
fail with a report that says what was called, what came back, what was expected and why."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest

from course_lib.grading import chapter_exercises, find_exercise
from course_lib.grading.ch04 import _library_append as library_append
from course_lib.grading.ch04 import _library_fork as library_fork
from course_lib.grading.check import CheckResult, evaluate
from course_lib.kv_math import blocks_needed
from course_lib.paged import BlockPool, OutOfBlocks
from course_lib.prefix_cache import block_hashes, hash_block_tokens
from course_lib.sharing import system_prompt_sharing

# --- answers built from the library -----------------------------------------------------


def library_hashes(token_ids: list[int], block_size: int, cache_salt: str | None = None) -> list:
    return block_hashes(token_ids, block_size, cache_salt=cache_salt)


def library_lookup(
    cached: dict, token_ids: list[int], block_size: int, cache_salt: str | None = None
) -> list[int]:
    usable = max(len(token_ids) - 1, 0) // block_size
    found = []
    for block_hash in block_hashes(token_ids, block_size, cache_salt=cache_salt)[:usable]:
        if block_hash not in cached:
            break
        found.append(cached[block_hash])
    return found


def library_system_prompt(prompt_tokens: int, chats: int, block_size: int) -> tuple[int, int]:
    demo = system_prompt_sharing(prompt_tokens, chats, block_size)
    return demo.blocks_with_sharing, demo.blocks_without_sharing


class ReferenceQueue:
    """A prefix-caching pool's free blocks: which block is handed out (and evicted) next."""

    def __init__(self, num_blocks: int) -> None:
        """Blocks 1 .. num_blocks - 1 start free, carrying no hash, queued in id order."""
        self.queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.holders = [0] * num_blocks
        self.hash_of: dict[int, Any] = {}  # block -> the hash it carries
        self.block_of: dict[Any, int] = {}  # hash -> the block that carries it

    def allocate(self) -> int:
        """Hand out the front block with one holder, evicting any hash it carries."""
        if not self.queue:
            raise OutOfBlocks(1, 0)
        block, _ = self.queue.popitem(last=False)
        evicted = self.hash_of.pop(block, None)
        if evicted is not None:
            del self.block_of[evicted]
        self.holders[block] = 1
        return block

    def free(self, blocks: list[int], hashes: list[Any]) -> None:
        """A request is done: release its table ``blocks`` (``hashes[i]`` names ``blocks[i]``)."""
        for block, block_hash in reversed(list(zip(blocks, hashes, strict=True))):
            if block_hash is not None:
                self.hash_of[block] = block_hash
                self.block_of[block_hash] = block
            self.holders[block] -= 1
            if self.holders[block] == 0:
                self.requeue(block)

    def requeue(self, block: int) -> None:
        """A block nobody holds rejoins the queue: at the front without a hash, at the back
        (evicted last) with one."""
        self.queue[block] = None
        if block not in self.hash_of:
            self.queue.move_to_end(block, last=False)

    def lookup(self, block_hash: Any) -> int | None:
        """The block that carries ``block_hash``, or None."""
        return self.block_of.get(block_hash)

    def touch(self, block: int) -> None:
        """A cache hit on ``block``: one more holder, and out of the free queue."""
        if self.holders[block] == 0:
            del self.queue[block]
        self.holders[block] += 1


LIBRARY: dict[str, Callable[..., Any]] = {
    "04.fork": library_fork,
    "04.append_token": library_append,
    "04.block_hashes": library_hashes,
    "04.longest_cached_prefix": library_lookup,
    "04.free_queue": ReferenceQueue,
    "04.system_prompt_blocks": library_system_prompt,
}


def run(name: str, fn: Callable[..., Any]) -> CheckResult:
    return evaluate(find_exercise(name), fn)


def test_chapter_04_registers_six_exercises_in_notebook_order() -> None:
    assert [e.name for e in chapter_exercises("04")] == list(LIBRARY)


@pytest.mark.parametrize("name", list(LIBRARY))
def test_library_answers_pass_every_case(name: str) -> None:
    result = run(name, LIBRARY[name])
    assert result.status == "passed", result.report_text()
    assert result.total >= 5


@pytest.mark.parametrize("name", list(LIBRARY))
def test_cases_are_deterministic_and_printable(name: str) -> None:
    exercise = find_exercise(name)
    first, second = exercise.cases(), exercise.cases()
    assert [(c.call, c.expected) for c in first] == [(c.call, c.expected) for c in second]
    for case in first:
        assert "0x" not in repr(case.expected) and "object at" not in repr(case.expected)
        assert case.hint and len(case.call) < 400


def _is_plain(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(map(_is_plain, value))
    if isinstance(value, dict):
        return all(_is_plain(k) and _is_plain(v) for k, v in value.items())
    return value is None or type(value) in (int, str)


@pytest.mark.parametrize("name", list(LIBRARY))
def test_every_case_expects_plain_data(name: str) -> None:
    for case in find_exercise(name).cases():
        assert _is_plain(case.expected), (case.call, case.expected)


def test_comparisons_are_type_strict() -> None:
    def as_floats(prompt_tokens: int, chats: int, block_size: int) -> tuple[float, ...]:
        return tuple(float(n) for n in library_system_prompt(prompt_tokens, chats, block_size))

    def float_lengths(pool: BlockPool, table: list[int], length: int) -> float:
        return float(library_append(pool, table, length))

    assert run("04.system_prompt_blocks", as_floats).status == "failed"
    assert run("04.append_token", float_lengths).status == "failed"


@pytest.mark.parametrize("name", list(LIBRARY))
def test_a_stub_is_not_yet_solved(name: str) -> None:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("fill me in")

    assert run(name, stub).status == "not-solved"


# --- other correct designs pass ---------------------------------------------------------


def fork_with_comprehension(pool: BlockPool, table: list[int]) -> list[int]:
    child = [block for block in table]  # a different way to copy
    for block in child:
        pool.share(block)
    return child


def append_by_allocate_and_free(pool: BlockPool, table: list[int], length: int) -> int:
    """Copy-on-write by hand: a new block, then one reference fewer on the shared one."""
    if length % pool.block_size == 0:
        table.append(pool.allocate())
        return length + 1
    last = table[-1]
    if pool.ref_count(last) > 1:
        table[-1] = pool.allocate()
        pool.free(last)
    return length + 1


def hashes_from_a_while_loop(token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    out: tuple = ()
    start = 0
    while start + block_size <= len(token_ids):
        keys = () if start or cache_salt is None else (cache_salt,)
        out += (hash_block_tokens(out[-1] if out else None, token_ids[start:start + block_size],
                                  keys),)
        start += block_size
    return out  # a tuple is fine too


def lookup_recursive(cached, token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    limit = (len(token_ids) - 1) // block_size if token_ids else 0
    hashes = hashes_from_a_while_loop(token_ids, block_size, cache_salt)[:limit]

    def walk(index: int) -> list[int]:
        if index == len(hashes) or hashes[index] not in cached:
            return []
        return [cached[hashes[index]], *walk(index + 1)]

    return walk(0)


def system_prompt_by_counting(prompt_tokens: int, chats: int, block_size: int) -> list[int]:
    per_chat = blocks_needed(prompt_tokens, block_size)
    cacheable = (prompt_tokens - 1) // block_size
    held = cacheable  # the first chat computes them; the others take them from the cache
    for _ in range(chats):
        held += per_chat - cacheable
    return [held, per_chat * chats]  # a list is fine too


class QueueByStamps:
    """Another design: each free block has a stamp and the smallest stamp goes out next."""

    def __init__(self, num_blocks: int) -> None:
        self.stamp = {block: block for block in range(1, num_blocks)}
        self.low, self.high = 0, num_blocks
        self.holders: dict[int, int] = {}
        self.cached: dict[Any, int] = {}

    def allocate(self) -> int:
        if not self.stamp:
            raise OutOfBlocks(1, 0)
        block = min(self.stamp, key=self.stamp.__getitem__)
        del self.stamp[block]
        self.cached = {h: b for h, b in self.cached.items() if b != block}
        self.holders[block] = 1
        return block

    def free(self, blocks: list[int], hashes: list[Any]) -> None:
        for block, block_hash in zip(blocks[::-1], hashes[::-1], strict=True):
            if block_hash is not None:
                self.cached[block_hash] = block
            self.holders[block] -= 1
            if self.holders[block] == 0 and block in self.cached.values():
                self.high += 1
                self.stamp[block] = self.high
            elif self.holders[block] == 0:
                self.low -= 1
                self.stamp[block] = self.low

    def lookup(self, block_hash: Any) -> int | None:
        return self.cached.get(block_hash)

    def touch(self, block: int) -> None:
        self.stamp.pop(block, None)
        self.holders[block] = self.holders.get(block, 0) + 1


@pytest.mark.parametrize(
    ("name", "fn"),
    [
        ("04.fork", fork_with_comprehension),
        ("04.append_token", append_by_allocate_and_free),
        ("04.block_hashes", hashes_from_a_while_loop),
        ("04.longest_cached_prefix", lookup_recursive),
        ("04.free_queue", QueueByStamps),
        ("04.system_prompt_blocks", system_prompt_by_counting),
    ],
)
def test_other_correct_designs_pass(name: str, fn: Callable[..., Any]) -> None:
    result = run(name, fn)
    assert result.status == "passed", result.report_text()


# --- wrong answers fail helpfully -------------------------------------------------------


def fork_without_sharing(pool: BlockPool, table: list[int]) -> list[int]:
    return list(table)


def fork_returning_the_parent(pool: BlockPool, table: list[int]) -> list[int]:
    for block in table:
        pool.share(block)
    return table


def append_without_copy_on_write(pool: BlockPool, table: list[int], length: int) -> int:
    if length % pool.block_size == 0:
        table.append(pool.allocate())
    return length + 1


def append_copying_full_blocks_too(pool: BlockPool, table: list[int], length: int) -> int:
    if table and pool.ref_count(table[-1]) > 1:
        table[-1] = pool.copy_on_write(table[-1])
    elif length % pool.block_size == 0:
        table.append(pool.allocate())
    return length + 1


def append_forgetting_to_return(pool: BlockPool, table: list[int], length: int) -> None:
    library_append(pool, table, length)


def hashes_without_the_chain(token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    return [
        hash_block_tokens(None, token_ids[i:i + block_size], [cache_salt] if cache_salt else [])
        for i in range(0, len(token_ids) - block_size + 1, block_size)
    ]


def hashes_with_the_salt_everywhere(token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    hashes: list = []
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        keys = [cache_salt] if cache_salt is not None else []
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None,
                                        token_ids[i:i + block_size], keys))
    return hashes


def hashes_including_the_partial_block(token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    hashes: list = []
    for i in range(0, len(token_ids), block_size):
        keys = [cache_salt] if i == 0 and cache_salt is not None else []
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None,
                                        token_ids[i:i + block_size], keys))
    return hashes


def lookup_not_stopping_at_a_miss(cached, token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    usable = (len(token_ids) - 1) // block_size
    hashes = block_hashes(token_ids, block_size, cache_salt=cache_salt)[:usable]
    return [cached[h] for h in hashes if h in cached]


def lookup_using_every_full_block(cached, token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    found = []
    for block_hash in block_hashes(token_ids, block_size, cache_salt=cache_salt):
        if block_hash not in cached:
            break
        found.append(cached[block_hash])
    return found


def lookup_ignoring_the_salt(cached, token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    return library_lookup(cached, token_ids, block_size)


def system_prompt_sharing_every_full_block(
    prompt_tokens: int, chats: int, block_size: int
) -> tuple[int, int]:
    per_chat = blocks_needed(prompt_tokens, block_size)
    full = prompt_tokens // block_size
    return full + chats * (per_chat - full), chats * per_chat


def fork_copying_every_block(pool: BlockPool, table: list[int]) -> list[int]:
    return [pool.allocate() for _ in table]


def fork_missing_the_last_block(pool: BlockPool, table: list[int]) -> list[int]:
    for block in table[:-1]:
        pool.share(block)
    return list(table)


def append_copying_when_alone_too(pool: BlockPool, table: list[int], length: int) -> int:
    if length % pool.block_size == 0:
        table.append(pool.allocate())
    else:
        old = table[-1]
        table[-1] = pool.allocate()
        pool.free(old)
    return length + 1


class TailAppendedAtTheBack(ReferenceQueue):
    """vLLM's order before PR 42656: every freed block joins the back."""

    def requeue(self, block: int) -> None:
        self.queue[block] = None


class HeadFreedBeforeTail(ReferenceQueue):
    def free(self, blocks: list[int], hashes: list[Any]) -> None:
        for block, block_hash in zip(blocks, hashes, strict=True):
            super().free([block], [block_hash])


class MostRecentlyFreedEvictedFirst(ReferenceQueue):
    """LRU reversed: a cached block freed just now is the first to go."""

    def requeue(self, block: int) -> None:
        self.queue[block] = None
        self.queue.move_to_end(block, last=False)


class EvictedHashKept(ReferenceQueue):
    def allocate(self) -> int:
        if not self.queue:
            raise OutOfBlocks(1, 0)
        block, _ = self.queue.popitem(last=False)
        self.holders[block] = 1
        return block


class HitLeftInTheQueue(ReferenceQueue):
    def touch(self, block: int) -> None:
        self.holders[block] += 1


class HoldersNotCounted(ReferenceQueue):
    """Touch takes the block out of the queue but free ignores a second holder."""

    def touch(self, block: int) -> None:
        self.queue.pop(block, None)
        self.holders[block] = 1


def system_prompt_forgetting_the_shared_blocks(
    prompt_tokens: int, chats: int, block_size: int
) -> tuple[int, int]:
    per_chat = blocks_needed(prompt_tokens, block_size)
    shared = (prompt_tokens - 1) // block_size
    return chats * (per_chat - shared), chats * per_chat


def system_prompt_in_the_wrong_order(
    prompt_tokens: int, chats: int, block_size: int
) -> tuple[int, int]:
    return library_system_prompt(prompt_tokens, chats, block_size)[::-1]


@pytest.mark.parametrize(
    ("name", "fn", "failing_call", "hint"),
    [
        ("04.fork", fork_without_sharing, "a = 6 tokens; fork a -> b", "one more reader"),
        ("04.fork", fork_returning_the_parent, "child.append(7)", "must be its own"),
        ("04.fork", fork_copying_every_block, "a = 6 tokens; fork a -> b", "nothing new"),
        ("04.fork", fork_missing_the_last_block, "fork a -> b; free a",
         "they must stay in use"),
        ("04.append_token", append_without_copy_on_write, "fork a -> b; b appends 1",
         "another sequence still reads"),
        ("04.append_token", append_copying_full_blocks_too, "a = 8 tokens; fork a -> b",
         "full block is never written again"),
        ("04.append_token", append_forgetting_to_return, "a = 2 tokens; a appends 9", ""),
        ("04.append_token", append_copying_when_alone_too, "a = 3 tokens; a appends 1",
         "nobody else reads it"),
        ("04.block_hashes", hashes_without_the_chain, "fn([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]",
         "whole prefix"),
        ("04.block_hashes", hashes_with_the_salt_everywhere, "cache_salt='tenant-a'",
         "extra key of one block only"),
        ("04.block_hashes", hashes_including_the_partial_block, "fn([1, 2, 3], block_size=4)",
         "still being filled"),
        ("04.longest_cached_prefix", lookup_not_stopping_at_a_miss, "SECOND block",
         "after the first miss"),
        ("04.longest_cached_prefix", lookup_using_every_full_block,
         "[0, 1, 2, 3, 4, 5, 6, 7], block_size=4)", "compute the last prompt token itself"),
        ("04.longest_cached_prefix", lookup_ignoring_the_salt, "cache_salt='acme')",
         "hash with the salt"),
        ("04.free_queue", TailAppendedAtTheBack, "free(B, [None])", "must not push a cached"),
        ("04.free_queue", HeadFreedBeforeTail, "free(A, ['a0', 'a1', 'a2']); B = 5",
         "which block of a prefix is worth least"),
        ("04.free_queue", MostRecentlyFreedEvictedFirst, "free(B, ['b0', 'b1']); C = 7",
         "freed longer ago is evicted first"),
        ("04.free_queue", EvictedHashKept, "B = 2 x allocate(); lookup('a2')",
         "must no longer be found"),
        ("04.free_queue", HitLeftInTheQueue, "B = hit on 'a1'; C = 3 x allocate()",
         "takes its block back"),
        ("04.free_queue", HoldersNotCounted, "C = hit on 'a0'", "only when both are done"),
        ("04.system_prompt_blocks", system_prompt_sharing_every_full_block,
         "fn(prompt_tokens=1024, chats=50, block_size=16)", "must compute its last prompt"),
        ("04.system_prompt_blocks", system_prompt_forgetting_the_shared_blocks,
         "fn(prompt_tokens=1000, chats=50, block_size=16)", "instead of holding its own"),
        ("04.system_prompt_blocks", system_prompt_in_the_wrong_order,
         "fn(prompt_tokens=1000, chats=50, block_size=16)", "count what one chat holds"),
    ],
)
def test_wrong_answers_fail_with_call_got_expected_and_hint(
    name: str, fn: Callable[..., Any], failing_call: str, hint: str
) -> None:
    result = run(name, fn)
    assert result.status == "failed"
    assert 0 <= result.passed < result.total
    failing = [case for case in result.cases if not case.passed]
    matching = [case for case in failing if failing_call in case.call]
    assert matching, [case.call for case in failing]
    case = matching[0]
    assert case.got and case.expected and case.got != case.expected
    assert hint in case.hint
    text = result.report_text()
    assert f"FAIL {case.call}" in text and "got" in text and "expected" in text


def test_a_failing_script_shows_both_pool_states() -> None:
    result = run("04.append_token", append_without_copy_on_write)
    script = "a = 6 tokens; fork a -> b; b appends 1"
    case = next(c for c in result.cases if c.call.endswith(script))
    assert case.got == ("{'tables': {'a': [1, 2], 'b': [1, 2]}, 'lengths': {'a': 6, 'b': 7}, "
                        "'refs': {1: 2, 2: 2}, 'free': 5}")
    assert case.expected == ("{'tables': {'a': [1, 2], 'b': [1, 3]}, 'lengths': {'a': 6, 'b': 7}, "
                             "'refs': {1: 2, 2: 1, 3: 1}, 'free': 4}")


def test_the_demo_case_reports_the_source_figures() -> None:
    result = run("04.append_token", append_without_copy_on_write)
    demo = result.cases[-1]
    assert "1,000-token prompt" in demo.call and not demo.passed
    assert demo.expected == "(114, (64, 65, 66, 63), 4)"
    assert demo.got == "(111, (63, 63, 63, 63), 4)"


def test_a_crash_in_learner_code_is_reported_with_its_line() -> None:
    def broken(pool: BlockPool, table: list[int]) -> list[int]:
        return [pool.share(block) for block in tabel]  # type: ignore[name-defined]  # noqa: F821

    result = run("04.fork", broken)
    assert result.status == "failed" and result.passed == 0
    assert "raised NameError" in result.cases[0].got and "tabel" in result.cases[0].got
