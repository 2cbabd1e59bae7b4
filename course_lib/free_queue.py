"""The free-block queue a pool owns, and the eviction orders that arrange it.

A pool (``course_lib.paged.BlockPool``) hands out the block at the front of its free queue.
With prefix caching a free block may still carry a hash, so the queue's order is also the
order in which cached blocks are evicted. vLLM v1 gives this queue a class of its own
(``FreeKVCacheBlockQueue``); here it is :class:`FreeBlockQueue`, and *where a freed block
goes* is the one thing an eviction order decides:

* ``"vllm"`` (:class:`VllmOrder`, the default): as in vLLM since May 2026 (PR 42656), the
  blocks a batch frees that carry no hash go to the front together, in the order given, and
  cached ones to the back, so an uncached block is reused first and a cached one waits.
* ``"fifo"`` (:class:`FifoOrder`): vLLM's older order, every freed block to the back.

An order is one subclass that sets ``name`` and implements :meth:`FreeBlockQueue.release`,
which may insert the freed blocks anywhere but never moves a queued one (and, if it needs
them, :meth:`~FreeBlockQueue.hit` to hear of cache hits, with :meth:`~FreeBlockQueue.snapshot`
and :meth:`~FreeBlockQueue.restore` extended to any state of its own). Defining it
registers it in :data:`FREE_ORDERS`, which every pool, ``SimConfig``, the cluster and the
engine read, so the class and its test are the whole change. Under that rule the engine's
step rollback (``course_lib.rollback``) undoes any order exactly: a block handed out goes
back to the front, a freed one is removed, and a step's first cache hit saves a snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from typing import Any, ClassVar

FREE_ORDERS: dict[str, type[FreeBlockQueue]] = {}
"""Every eviction order by name, in the order they were defined (``"vllm"`` first)."""


class FreeBlockQueue(OrderedDict[int, None]):
    """The free blocks, front (next handed out, next evicted) first.

    Taking from the front and from the middle (a cache hit revives a freed cached block)
    and putting back are O(1): the queue is an ordered dict of block ids (a subclass, so
    that its length and membership, read at every step of a simulation, cost what a
    dict's do).
    """

    name: ClassVar[str] = ""
    """What ``free_order=`` takes; set by each concrete order."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            if cls.name in FREE_ORDERS:
                raise ValueError(f"an eviction order named {cls.name!r} already exists")
            FREE_ORDERS[cls.name] = cls

    def __init__(self, block_ids: Iterable[int]) -> None:
        """A queue holding ``block_ids`` in that order (a fresh pool's 1, 2, 3, ...)."""
        super().__init__(dict.fromkeys(block_ids))

    def pop_front(self) -> int:
        """Take the front block (the caller checks the queue is not empty)."""
        return self.popitem(last=False)[0]

    def pop_front_many(self, count: int) -> list[int]:
        """Take the ``count`` front blocks, front first (the caller checks there are
        enough)."""
        pop = self.popitem
        return [pop(last=False)[0] for _ in range(count)]

    def remove(self, block_id: int) -> None:
        """Take ``block_id`` from wherever it is (a cache hit on a freed cached block)."""
        del self[block_id]

    def push_front(self, block_ids: Sequence[int]) -> None:
        """Put ``block_ids`` at the front together, in the order given."""
        move = self.move_to_end
        for block_id in reversed(block_ids):
            self[block_id] = None
            move(block_id, last=False)

    def push_back(self, block_ids: Iterable[int]) -> None:
        """Put ``block_ids`` at the back, in the order given."""
        self.update(dict.fromkeys(block_ids))

    def release(self, block_ids: list[int], cached: Container[int]) -> None:
        """Queue the blocks one batch has just freed, in the order they were freed;
        ``cached`` tells which of them carry a hash. This is the eviction order: it may put
        them anywhere, but moves no block already queued."""
        raise NotImplementedError(f"{type(self).__name__} must say where freed blocks go")

    def hit(self, block_ids: Sequence[int]) -> None:
        """Hear that ``block_ids`` were just found in the prefix cache (an order that ranks
        blocks by use counts them here; the queue's own orders ignore it)."""

    def snapshot(self) -> Any:
        """Everything :meth:`restore` needs to put the queue back as it is now."""
        return tuple(self)

    def restore(self, snapshot: Any) -> None:
        """Put the queue back as it was when ``snapshot`` was taken."""
        self.clear()
        self.update(dict.fromkeys(snapshot))


class VllmOrder(FreeBlockQueue):
    """vLLM's order since PR 42656: blocks without a hash to the front (reused first, in
    the order freed), cached blocks to the back (evicted least recently freed first)."""

    name = "vllm"

    def release(self, block_ids: list[int], cached: Container[int]) -> None:
        front = []
        for block_id in block_ids:  # all to the back, in order; then the uncached forward
            self[block_id] = None
            if block_id not in cached:
                front.append(block_id)
        move = self.move_to_end
        for block_id in reversed(front):
            move(block_id, last=False)


class FifoOrder(FreeBlockQueue):
    """vLLM's order before PR 42656: every freed block to the back."""

    name = "fifo"

    def release(self, block_ids: list[int], cached: Container[int]) -> None:
        self.push_back(block_ids)


def free_queue_class(name: object) -> type[FreeBlockQueue]:
    """The eviction order called ``name``; a ValueError naming it and the known ones
    otherwise."""
    order = FREE_ORDERS.get(name) if isinstance(name, str) else None
    if order is None:
        raise ValueError(f"unknown free_order {name!r}; expected one of "
                         f"{', '.join(FREE_ORDERS)}")
    return order
