"""Chapter 04: wrong answers, each with the hint its report must show first, and right
answers of other designs."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from course_lib.kv_math import blocks_needed
from course_lib.paged import BlockPool, OutOfBlocks
from course_lib.prefix_cache import block_hashes, hash_block_tokens
from course_lib.sharing import system_prompt_sharing
from tests.mutants import Mutant, Right


def library_fork(pool: BlockPool, table: list[int]) -> list[int]:
    """What ``PagedKVManager.fork`` does to one table."""
    for block in table:
        pool.share(block)
    return list(table)


def library_append(pool: BlockPool, table: list[int], length: int) -> int:
    """What ``PagedKVManager.append_tokens`` does for one token."""
    if length % pool.block_size == 0:
        table.append(pool.allocate())
    elif pool.ref_count(table[-1]) > 1:
        table[-1] = pool.copy_on_write(table[-1])
    return length + 1


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


def library_hashes(token_ids: list[int], block_size: int, cache_salt: str | None = None) -> list:
    return block_hashes(token_ids, block_size, cache_salt=cache_salt)


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


def hashes_ignoring_the_salt(token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    return block_hashes(token_ids, block_size)


def lookup_always_one_short(cached, token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    usable = len(token_ids) // block_size - 1
    found = []
    for block_hash in block_hashes(token_ids, block_size, cache_salt=cache_salt)[:max(usable, 0)]:
        if block_hash not in cached:
            break
        found.append(cached[block_hash])
    return found


def system_prompt_without_sharing_once(
    prompt_tokens: int, chats: int, block_size: int
) -> tuple[int, int]:
    return library_system_prompt(prompt_tokens, chats, block_size)[0], blocks_needed(
        prompt_tokens, block_size)


def fork_assuming_a_block(pool: BlockPool, table: list[int]) -> list[int]:
    child = [table[0], *table[1:]]  # an empty table has no first block
    for block in child:
        pool.share(block)
    return child


def append_forgetting_the_first_block(pool: BlockPool, table: list[int], length: int) -> int:
    if table and length % pool.block_size == 0:
        table.append(pool.allocate())
    elif table and pool.ref_count(table[-1]) > 1:
        table[-1] = pool.copy_on_write(table[-1])
    return length + 1


def hashes_missing_the_last_full_block(token_ids, block_size, cache_salt=None):  # type: ignore[no-untyped-def]
    hashes: list = []
    for i in range(0, len(token_ids) - block_size, block_size):  # one block short when exact
        keys = [cache_salt] if i == 0 and cache_salt is not None else []
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None,
                                        token_ids[i:i + block_size], keys))
    return hashes


class EmptyQueueRaisingKeyError(ReferenceQueue):
    def allocate(self) -> int:
        block, _ = self.queue.popitem(last=False)  # KeyError once every block is out
        evicted = self.hash_of.pop(block, None)
        if evicted is not None:
            del self.block_of[evicted]
        self.holders[block] = 1
        return block


MUTANTS = [
    Mutant("04.fork", "without sharing", fork_without_sharing, "one more reader"),
    Mutant("04.fork", "returning the parent", fork_returning_the_parent, "a list of its own"),
    Mutant("04.fork", "copying every block", fork_copying_every_block, "stores nothing new"),
    Mutant("04.fork", "missing the last block", fork_missing_the_last_block,
           "its last (partly filled) block too"),
    Mutant("04.fork", "assuming a block", fork_assuming_a_block,
           "an empty table forks into an empty table"),
    Mutant("04.append_token", "forgetting the first block", append_forgetting_the_first_block,
           "its first token needs a fresh one"),
    Mutant("04.append_token", "without copy-on-write", append_without_copy_on_write,
           "copy it before writing"),
    Mutant("04.append_token", "copying full blocks too", append_copying_full_blocks_too,
           "a full block is never written again"),
    Mutant("04.append_token", "forgetting to return", append_forgetting_to_return,
           "returns the sequence's new length"),
    Mutant("04.append_token", "copying when alone too", append_copying_when_alone_too,
           "copy only a shared block"),
    Mutant("04.block_hashes", "without the chain", hashes_without_the_chain,
           "chain it from the previous block's hash"),
    Mutant("04.block_hashes", "the salt everywhere", hashes_with_the_salt_everywhere,
           "extra key of the first block only"),
    Mutant("04.block_hashes", "the partial block too", hashes_including_the_partial_block,
           "only full blocks are hashed"),
    Mutant("04.block_hashes", "ignoring the salt", hashes_ignoring_the_salt,
           "the salt must change every hash"),
    Mutant("04.block_hashes", "missing the last full block", hashes_missing_the_last_full_block,
           "both get a hash"),
    Mutant("04.longest_cached_prefix", "not stopping at a miss", lookup_not_stopping_at_a_miss,
           "stop at the first miss"),
    Mutant("04.longest_cached_prefix", "every full block", lookup_using_every_full_block,
           "must compute the last prompt token itself"),
    Mutant("04.longest_cached_prefix", "ignoring the salt", lookup_ignoring_the_salt,
           "hash the prompt with its salt"),
    Mutant("04.longest_cached_prefix", "always one short", lookup_always_one_short,
           "leave out only the block that holds the last prompt token"),
    Mutant("04.free_queue", "tail appended at the back", TailAppendedAtTheBack,
           "ahead of cached blocks"),
    Mutant("04.free_queue", "head freed before tail", HeadFreedBeforeTail,
           "free a request's blocks tail first"),
    Mutant("04.free_queue", "most recently freed evicted first", MostRecentlyFreedEvictedFirst,
           "the one freed longer ago is evicted first"),
    Mutant("04.free_queue", "evicted hash kept", EvictedHashKept, "must no longer be found"),
    Mutant("04.free_queue", "hit left in the queue", HitLeftInTheQueue,
           "takes its block back out of the queue"),
    Mutant("04.free_queue", "holders not counted", HoldersNotCounted,
           "free again only when both are done"),
    Mutant("04.free_queue", "an empty queue raising KeyError", EmptyQueueRaisingKeyError,
           "the third allocate raises OutOfBlocks"),
    Mutant("04.system_prompt_blocks", "sharing every full block",
           system_prompt_sharing_every_full_block, "the block that holds it is never shared"),
    Mutant("04.system_prompt_blocks", "forgetting the shared blocks",
           system_prompt_forgetting_the_shared_blocks, "count them too"),
    Mutant("04.system_prompt_blocks", "in the wrong order", system_prompt_in_the_wrong_order,
           "in that order"),
    Mutant("04.system_prompt_blocks", "without sharing counted once",
           system_prompt_without_sharing_once, "every chat holds all its own blocks"),
]

RIGHT = [
    Right("04.fork", "a comprehension", fork_with_comprehension),
    Right("04.append_token", "allocate and free by hand", append_by_allocate_and_free),
    Right("04.block_hashes", "a while loop and a tuple", hashes_from_a_while_loop),
    Right("04.longest_cached_prefix", "recursion", lookup_recursive),
    Right("04.free_queue", "an ordered dict", ReferenceQueue),
    Right("04.free_queue", "stamps", QueueByStamps),
    Right("04.system_prompt_blocks", "counting chat by chat", system_prompt_by_counting),
    Right("04.fork", "the library's steps", library_fork),
    Right("04.append_token", "the library's steps", library_append),
    Right("04.block_hashes", "the library's", library_hashes),
    Right("04.longest_cached_prefix", "the library's hashes", library_lookup),
    Right("04.system_prompt_blocks", "the library's demo", library_system_prompt),
]
