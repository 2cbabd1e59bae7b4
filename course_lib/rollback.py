"""All or nothing at the price of what a step changes: an undo log for the engine's step.

The engine promises that a step which raises (the kernel, the model, the sampler) leaves it
exactly as it was, K/V of evicted cached blocks included. Copying the whole state before
every step would keep that promise, but its cost grows with the pool (30,720 blocks for
chapter 01's Llama-3-8B budget) although a step touches a handful of blocks. Here, instead:

* a pool made undoable (:func:`undoable`) records, while an :class:`UndoLog` is attached,
  how to put back each change it makes: a reference count, a place in the free queue (by
  the queue's own operations: a block handed out goes back to the front, a freed one
  leaves, as every eviction order of ``course_lib.free_queue`` allows), a block event, a
  prefix-cache hash, and the K/V of a block it hands out again after that block was cached
  or freed in the same step (the only K/V a later write destroys; a block taken as a cache
  hit is only read);
* the serving core snapshots the bookkeeping of the live requests (their samples, block
  tables, queues), which is what a step of continuous batching changes anyway.

Undo runs the log newest first, so every dict regains its order as well as its values
(all but the keys of the prefix cache's two hash maps, which nothing iterates: an undone
eviction puts its block's entries back at their ends).
One change costs one log entry, except a cache hit that revives a freed cached block: that
takes it from the middle of the free queue, so the step's first such hit saves the queue's
snapshot (``FreeBlockQueue.snapshot``) once, as does any hit under an order that counts
hits (one that overrides ``FreeBlockQueue.hit``). A hit on blocks still held saves nothing.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from course_lib.free_queue import FreeBlockQueue
from course_lib.paged import BlockPool, OutOfBlocks, PagedKVManager
from course_lib.prefix_cache import (
    BlockHash,
    PrefixCachingBlockPool,
    PrefixCachingKVManager,
)
from course_lib.tier import TieredBlockPool
from course_lib.validate import check_int

_ABSENT = object()


class UndoLog:
    """Actions that put back what happened since the log began, run newest first."""

    __slots__ = ("_actions",)

    def __init__(self) -> None:
        self._actions: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._actions)

    def add(self, action: Callable[[], None]) -> None:
        """Record how to undo the change just made (or about to be made)."""
        self._actions.append(action)

    def undo(self) -> None:
        """Undo every recorded change, newest first, and empty the log."""
        actions = self._actions
        while actions:
            actions.pop()()


def restore_key(mapping: dict, key: Any, old: Any) -> None:
    """Put ``mapping[key]`` back to ``old`` (remove it when ``old`` is ``_ABSENT``)."""
    if old is _ABSENT:
        mapping.pop(key, None)
    else:
        mapping[key] = old


class UndoablePool:
    """The mutators of a block pool, recording their undo in ``undo_log`` when one is
    attached (``attach``); without one they are the pool's own, plus one check."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As the pool's own constructor; no log attached."""
        super().__init__(*args, **kwargs)
        self.attach(None)

    def attach(self, log: UndoLog | None) -> None:
        """Start recording into ``log`` (None stops recording)."""
        self.undo_log = log
        self._queue_saved = False  # this log holds the free queue's snapshot (a cache hit)
        self._freed_in_log: set[int] = set()  # blocks freed since (their K/V still matter)

    def _save_queue(self, log: UndoLog) -> None:
        """Before this log's first cache hit, record the free queue's snapshot."""
        if not self._queue_saved:
            queue = self.free_queue
            snapshot = queue.snapshot()
            log.add(lambda: queue.restore(snapshot))
            self._queue_saved = True

    def _note_block(self, log: UndoLog, block_id: int) -> None:
        """Record ``block_id``'s reference count and latest event as they are now."""
        ref, event = self._ref[block_id], self._events.get(block_id, _ABSENT)

        def undo() -> None:
            self._ref[block_id] = ref
            restore_key(self._events, block_id, event)
        log.add(undo)

    def allocate(self) -> int:
        log = self.undo_log
        if log is None or not self.free_queue:
            return super().allocate()
        block_id = next(iter(self.free_queue))  # the front: the block handed out next
        self._save_kv(log, block_id)
        self._note_block(log, block_id)
        self._note_hash(log, block_id)
        log.add(lambda: self.free_queue.push_front([block_id]))
        return super().allocate()

    def allocate_many(self, count: int) -> list[int]:
        if self.undo_log is None:
            return super().allocate_many(count)
        if check_int("count", count, 0) > self.num_free:
            raise OutOfBlocks(count, self.num_free)
        return [self.allocate() for _ in range(count)]

    def _free_checked(self, block_ids: list[int]) -> None:
        log = self.undo_log
        if log is not None:
            for block_id, count in Counter(block_ids).items():
                self._note_block(log, block_id)
                if self._ref[block_id] == count:
                    log.add(lambda block_id=block_id: self.free_queue.remove(block_id))
                    self._freed_in_log.add(block_id)
        super()._free_checked(block_ids)

    def share(self, block_id: int) -> None:
        log = self.undo_log
        if log is not None:
            self._check_held(block_id)
            self._note_block(log, block_id)
        super().share(block_id)

    def copy_on_write(self, block_id: int) -> int:
        log = self.undo_log
        if log is not None:
            self._check_held(block_id)
            self._note_block(log, block_id)
        return super().copy_on_write(block_id)

    def _save_kv(self, log: UndoLog, block_id: int) -> None:
        """Before ``block_id`` is handed out again: keep its K/V if a rollback needs them
        (it holds a cached prefix, or a sequence freed it in this step)."""
        if not self.owns_kv:
            return
        if not (block_id in self._cached_ids() or block_id in self._freed_in_log):
            return
        saved = self._kv[:, block_id].clone()
        log.add(lambda: self._kv[:, block_id].copy_(saved))

    def _note_hash(self, log: UndoLog, block_id: int) -> None:
        """Record ``block_id``'s prefix-cache entry (none without prefix caching)."""


class UndoableBlockPool(UndoablePool, BlockPool):
    """A ``BlockPool`` whose changes can be undone (see the module)."""


class UndoablePrefixCachingBlockPool(UndoablePool, PrefixCachingBlockPool):
    """A ``PrefixCachingBlockPool`` whose changes can be undone (see the module)."""

    def _note_hash(self, log: UndoLog, block_id: int) -> None:
        """Record ``block_id``'s hash, the order of that hash's holders and the eviction
        count, all of which handing the block out again may change."""
        block_hash = self._hash_of.get(block_id)
        if block_hash is not None:
            self._note_holders(log, block_hash)
            evictions = self.num_evictions

            def undo() -> None:
                self._hash_of[block_id] = block_hash
                self.num_evictions = evictions
            log.add(undo)

    def _note_holders(self, log: UndoLog, block_hash: BlockHash) -> None:
        """Record which blocks hold ``block_hash``, in order."""
        holders = self._blocks_of.get(block_hash)
        order = None if holders is None else list(holders)

        def undo() -> None:
            if order is None:
                self._blocks_of.pop(block_hash, None)
            else:
                self._blocks_of[block_hash] = dict.fromkeys(order)
        log.add(undo)

    def _record_hashes(self, block_ids: list[int], hashes: list[BlockHash]) -> None:
        log = self.undo_log
        if log is not None:
            for block_id, block_hash in zip(block_ids, hashes, strict=True):
                self._note_holders(log, block_hash)
                old = self._hash_of.get(block_id, _ABSENT)
                log.add(lambda block_id=block_id, old=old:
                        restore_key(self._hash_of, block_id, old))
        super()._record_hashes(block_ids, hashes)

    def touch(self, block_ids: Any) -> None:
        log = self.undo_log
        if log is None:
            return super().touch(block_ids)
        ids = list(block_ids)
        known = [b for b in ids if type(b) is int and 0 <= b < self.num_blocks]
        if type(self.free_queue).hit is not FreeBlockQueue.hit or not all(
                map(self._ref.__getitem__, known)):  # the order counts hits, or one revives
            self._save_queue(log)
        for block_id in known:
            self._note_block(log, block_id)
        return super().touch(ids)


class UndoableTieredBlockPool(UndoablePrefixCachingBlockPool, TieredBlockPool):
    """A ``TieredBlockPool`` whose GPU-side changes can be undone. Its CPU tier is not rolled
    back: a block a failed step copied there stays, which changes no output, since a hash
    always names the same K/V."""


def undoable(pool_type: type[BlockPool]) -> type[BlockPool]:
    """The undoable version of ``BlockPool``, ``PrefixCachingBlockPool`` or
    ``TieredBlockPool``."""
    if issubclass(pool_type, TieredBlockPool):
        return UndoableTieredBlockPool
    if issubclass(pool_type, PrefixCachingBlockPool):
        return UndoablePrefixCachingBlockPool
    if issubclass(pool_type, BlockPool):
        return UndoableBlockPool
    raise ValueError(f"pool_type must be a BlockPool class, got {pool_type!r}")


def saved_fields(obj: object, names: Iterable[str]) -> Callable[[], None]:
    """Save ``obj``'s attributes ``names``, each a value or a container of values (copied
    one level deep); returns the function that puts them back."""
    saved = {name: _copy(getattr(obj, name)) for name in names}

    def undo() -> None:
        for name, value in saved.items():
            setattr(obj, name, _copy(value))
    return undo


def _copy(value: Any) -> Any:
    """A one-level copy of a container (dict, list, set, deque), else ``value`` itself."""
    return value.copy() if isinstance(value, dict | list | set | deque) else value


def saved_manager(manager: PagedKVManager) -> Callable[[], None]:
    """Save a KV-cache manager's bookkeeping (its live sequences: tables, lengths, token
    ids, hash chains, and the prefix-cache statistics); returns the function that puts it
    back. Token ids and hash chains only grow in a step, so their lengths are enough. A
    manager of another kind saves itself (``manager.saved()``, e.g. chapter 08's groups)."""
    if not isinstance(manager, PagedKVManager):
        return manager.saved()
    seqs = {s: (q, list(q.table), q.length, None if q.token_ids is None else len(q.token_ids))
            for s, q in manager._seqs.items()}
    extra = []
    if isinstance(manager, PrefixCachingKVManager):
        chains = {s: (h, len(h)) for s, h in manager._hashes.items()}
        extra.append(saved_fields(manager, ("_salts", "_queries", "_query_tokens",
                                            "_hit_tokens")))

        def undo_chains() -> None:
            for chain, length in chains.values():
                del chain[length:]
            manager._hashes = {s: chain for s, (chain, _) in chains.items()}
        extra.append(undo_chains)

    def undo() -> None:
        for seq, table, length, known in seqs.values():
            seq.table[:], seq.length = table, length
            if known is not None:
                del seq.token_ids[known:]
        manager._seqs = {s: entry[0] for s, entry in seqs.items()}
        for action in extra:
            action()
    return undo
