"""The paged KV cache: a pool of fixed-size blocks and per-sequence block tables.

Chapter 03 builds it, chapter 04 shares it, chapters 06 and 07 read real K/V through it.

* ``BlockPool`` hands out physical block ids from its free queue
  (``course_lib.free_queue``) and keeps a reference count per block. Block 0 is the
  reserved null block (as in vLLM), so a pool of 8 blocks has 7 for requests. A fresh pool
  hands out 1, 2, 3, ... in order. As in vLLM since May 2026 (PR 42656), a freed block that
  holds nothing a later request could find goes to the *front* of the queue and is reused
  first; only cached blocks (``course_lib.prefix_cache``) go to the back, in
  least-recently-freed order. A finished sequence's blocks are freed in one batch, last
  block first (``free_batch``): its blocks without a hash go to the front together, in that
  order, so its last block is the next one handed out. ``free_order="fifo"`` restores
  vLLM's older order, in which every freed block went to the back; any order registered in
  ``course_lib.free_queue.FREE_ORDERS`` may be named.
* ``PagedKVManager`` keeps one block table per sequence (logical block i -> physical
  block), allocates a block only when the last one is full, forks sequences by sharing
  every block, and copies a shared, partly filled last block before writing into it
  (copy-on-write).

The pool can own the K/V tensors: one tensor per layer laid out
``[num_blocks, 2, block_size, num_kv_heads, head_dim]``; K and V are the views
``[:, 0]`` and ``[:, 1]``, each ``[num_blocks, block_size, num_kv_heads, head_dim]``
(not contiguous: a kernel must use their strides). torch is imported only for such a pool.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from course_lib.free_queue import FREE_ORDERS, FreeBlockQueue
from course_lib.kv_math import blocks_needed
from course_lib.snapshot import BlockEvent, BlockView, PoolSnapshot
from course_lib.validate import check_int, check_list

if TYPE_CHECKING:
    import torch

NULL_BLOCK = 0
"""The reserved block id: never handed out, never freed (vLLM pads block tables with it)."""

TOKEN_ID_LIMIT = 2**64
"""Token ids are unsigned 64-bit integers (prefix caching hashes them as such)."""

FreeOrder = str
"""The name of an eviction order in ``course_lib.free_queue.FREE_ORDERS`` (``"vllm"``,
``"fifo"``, ...): where the pool's free queue puts a freed block."""


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than an operation needs; nothing was changed."""

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(f"out of KV-cache blocks: needed {needed}, only {free} free")
        self.needed = needed
        self.free = free


class BlockPool:
    """Physical KV blocks: a free queue, reference counts and, optionally, the K/V tensors.

    ``allocate`` and ``free`` are O(1). The free queue (``free_queue``, a
    ``course_lib.free_queue.FreeBlockQueue``) lets a block also leave from the middle
    (prefix caching revives freed blocks that way); its class is the eviction order.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        num_layers: int = 1,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        free_order: FreeOrder = "vllm",
    ) -> None:
        """Make ``num_blocks`` blocks of ``block_size`` tokens (block 0 reserved).

        Pass ``num_kv_heads`` and ``head_dim`` to own zeroed K/V tensors for
        ``num_layers`` layers (fp16 unless ``dtype`` says otherwise) on ``device``.
        ``free_order`` says where a freed block without a hash goes (see the module doc).
        """
        self.num_blocks = check_int("num_blocks", num_blocks, 2)
        self.block_size = check_int("block_size", block_size, 1)
        if not isinstance(free_order, str) or free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {tuple(FREE_ORDERS)}, got "
                             f"{free_order!r}")
        self.free_order = free_order
        self._ref = [0] * num_blocks
        self.free_queue: FreeBlockQueue = FREE_ORDERS[free_order](range(1, num_blocks))
        self._events: dict[int, BlockEvent] = {}
        check_int("num_layers", num_layers, 1)
        self._kv: torch.Tensor | None = None  # [layers, blocks, 2, B, H, D] when owned
        if num_kv_heads is None and head_dim is None:
            return
        if num_kv_heads is None or head_dim is None:
            raise ValueError(
                f"give both num_kv_heads and head_dim to own K/V tensors, "
                f"got num_kv_heads={num_kv_heads!r}, head_dim={head_dim!r}"
            )
        import torch

        shape = (
            num_layers,
            self.num_blocks,
            2,
            self.block_size,
            check_int("num_kv_heads", num_kv_heads, 1),
            check_int("head_dim", head_dim, 1),
        )
        self._kv = torch.zeros(shape, dtype=dtype or torch.float16, device=device)

    # --- block ids and reference counts -------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks that ``allocate`` can hand out now."""
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence (the null block is neither free nor used)."""
        return self.num_blocks - 1 - len(self.free_queue)

    def free_blocks(self) -> tuple[int, ...]:
        """The free queue, front (next to be handed out) first."""
        return tuple(self.free_queue)

    def allocate(self) -> int:
        """Take the block at the front of the free queue, with reference count 1."""
        if not self.free_queue:
            raise OutOfBlocks(1, 0)
        block_id = self.free_queue.pop_front()
        self._ref[block_id] = 1
        self._events[block_id] = "allocated"
        return block_id

    def allocate_many(self, count: int) -> list[int]:
        """Take ``count`` blocks from the front of the free queue, as ``count`` calls of
        ``allocate`` would, or raise ``OutOfBlocks`` and take none (a prompt's blocks in
        one call)."""
        free = self.free_queue
        if check_int("count", count, 0) > len(free):
            raise OutOfBlocks(count, len(free))
        taken, ref, events = free.pop_front_many(count), self._ref, self._events
        for block_id in taken:
            ref[block_id] = 1
            events[block_id] = "allocated"
        return taken

    def free(self, block_id: int) -> None:
        """Drop one reference; at zero the block joins the free queue where its eviction
        order puts it (a batch of one)."""
        self._check_held(block_id)
        self._free_checked([block_id])

    def free_batch(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block of ``block_ids`` (all checked first, so a
        refused call frees nothing), as one batch: the blocks it frees without a hash go to
        the front of the queue together, in the order given, the cached ones to the back.

        vLLM frees a finished request's blocks this way, last block first, so its last
        block is handed out next and its first (cached) block is evicted last.
        """
        self._free_checked(self._checked_batch(block_ids))

    def _free_checked(self, block_ids: list[int]) -> None:
        """``free_batch`` of checked ids (a manager frees a block table here directly: its
        blocks are held and named once)."""
        ref, events, freed = self._ref, self._events, []
        for block_id in block_ids:
            ref[block_id] -= 1
            if not ref[block_id]:
                events[block_id] = "freed"
                freed.append(block_id)
        if freed:
            self.free_queue.release(freed, self._cached_ids())

    def _checked_batch(self, block_ids: Sequence[int]) -> list[int]:
        """``block_ids`` as a list, if each is held at least as often as it is named."""
        ids = check_list("block_ids", block_ids)
        ref, limit = self._ref, self.num_blocks
        if not all(type(b) is int and 0 < b < limit and ref[b] for b in ids):  # fast path
            for block_id in ids:
                self._check_held(block_id)  # names the first bad id
        if len(set(ids)) != len(ids):
            for block_id, count in Counter(ids).items():
                if count > self._ref[block_id]:
                    raise ValueError(f"block {block_id} is named {count} times but held "
                                     f"{self._ref[block_id]} times")
        return ids

    def _cached_ids(self) -> Container[int]:
        """The blocks that carry a hash a later request could find (none, here)."""
        return ()

    def _num_unheld(self, block_ids: Sequence[int]) -> int:
        """How many of ``block_ids`` (ids of this pool) nobody holds: the free blocks a
        cache hit revives."""
        return list(map(self._ref.__getitem__, block_ids)).count(0)

    def share(self, block_id: int) -> None:
        """Add a reference to a block some sequence already holds (fork)."""
        self._check_held(block_id)
        self._ref[block_id] += 1
        self._events[block_id] = "shared"

    def ref_count(self, block_id: int) -> int:
        """How many block-table entries point at ``block_id`` (0 for free and null blocks)."""
        self._check_id(block_id)
        return self._ref[block_id]

    def copy_on_write(self, block_id: int) -> int:
        """Give one sharer of ``block_id`` its own copy: new block, data copied, count lowered.

        Only for a block held by two or more; its last holder writes in place instead.
        """
        self._check_held(block_id)
        if self._ref[block_id] < 2:
            raise ValueError(f"block {block_id} is not shared; write it in place")
        new_id = self.allocate()
        if self._kv is not None:
            self._kv[:, new_id].copy_(self._kv[:, block_id])
        self._ref[block_id] -= 1
        self._events[new_id] = "cow-copy"
        return new_id

    def take_events(self) -> dict[int, BlockEvent]:
        """What happened to each block since the previous call (latest event wins)."""
        events, self._events = self._events, {}
        return events

    def _check_id(self, block_id: int) -> None:
        """Raise unless ``block_id`` is an id of this pool (the null block included)."""
        if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
            self._reject(block_id)

    def _check_held(self, block_id: int) -> None:
        """Raise unless ``block_id`` is a handed-out block (not free, not null); fast path first."""
        held = type(block_id) is int and 0 < block_id < self.num_blocks and self._ref[block_id]
        if not held:
            self._reject(block_id)

    def _reject(self, block_id: object) -> None:
        """Raise the ValueError that says what is wrong with ``block_id``."""
        if isinstance(block_id, bool) or not isinstance(block_id, int):
            raise ValueError(f"block id must be an int, got {block_id!r}")
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(
                f"block id {block_id} is not in this pool (ids 1..{self.num_blocks - 1})"
            )
        if block_id == NULL_BLOCK:
            raise ValueError(f"block {block_id} is the reserved null block")
        raise ValueError(f"block {block_id} is free (double free or stale id)")

    # --- the K/V tensors -----------------------------------------------------------------

    @property
    def owns_kv(self) -> bool:
        """Whether this pool holds real K/V tensors."""
        return self._kv is not None

    def kv_cache(self, layer: int = 0) -> torch.Tensor:
        """One layer's cache, ``[num_blocks, 2, block_size, num_kv_heads, head_dim]``."""
        if self._kv is None:
            raise ValueError("this pool owns no K/V tensors (pass num_kv_heads and head_dim)")
        check_int("layer", layer, 0)
        if layer >= self._kv.shape[0]:
            raise ValueError(f"layer {layer} is out of range (pool has {self._kv.shape[0]})")
        return self._kv[layer]

    def key_cache(self, layer: int = 0) -> torch.Tensor:
        """K of one layer, a view ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
        return self.kv_cache(layer)[:, 0]

    def value_cache(self, layer: int = 0) -> torch.Tensor:
        """V of one layer, a view ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
        return self.kv_cache(layer)[:, 1]


@dataclass
class _Sequence:
    """One sequence's block table, its length and (when tracked) its token ids."""

    table: list[int]
    length: int
    token_ids: list[int] | None


def _count_and_ids(
    num_tokens: int | None, token_ids: Iterable[int] | None, default: int
) -> tuple[int, list[int] | None]:
    """How many tokens an add or append brings (at least ``default``) and their ids, if given.

    Checks everything before the caller changes anything; ``token_ids`` may be a generator.
    """
    if num_tokens is not None:
        check_int("num_tokens", num_tokens, default)
    if token_ids is None:
        return default if num_tokens is None else num_tokens, None
    ids = check_list("token_ids", token_ids)
    # a range's ids are ints by construction, bounded by its ends
    ends = ids[:1] + ids[-1:] if type(token_ids) is range else ids
    if not _are_token_ids(ends):  # the fast path; the loop below names a bad id
        for token in ends:
            if check_int("token id", token, 0) >= TOKEN_ID_LIMIT:
                raise ValueError(f"token id must be below 2**64, got {token!r}")
    if num_tokens is not None and num_tokens != len(ids):
        raise ValueError(f"num_tokens={num_tokens!r} disagrees with {len(ids)} token ids")
    return check_int("num_tokens", len(ids), default), ids


def all_of_type(values: list, kind: type) -> bool:
    """Whether every item of ``values`` is of type ``kind`` exactly (no subclass, so no
    bool for an int), in C-speed passes: a prompt's ids are checked at every admission."""
    return list(map(type, values)).count(kind) == len(values)


def _are_token_ids(ids: list) -> bool:
    """Whether every item of ``ids`` is a token id: an int (not a bool) in [0, 2**64)."""
    if not all_of_type(ids, int):
        return False
    try:
        array("Q", ids)  # unsigned 64-bit: refuses a negative or too large int
    except (OverflowError, TypeError):
        return False
    return True


def _kv_rows(
    name: str, tensor: torch.Tensor, shape: tuple[int, int, int], kv: torch.Tensor
) -> torch.Tensor:
    """``tensor`` checked (a float tensor of ``shape``), converted to ``kv``'s device and dtype."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be floating point, got dtype {tensor.dtype}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
    return tensor.detach().to(device=kv.device, dtype=kv.dtype)


def _pool_snapshot(
    pool: BlockPool,
    tables: dict[str, tuple[list[int], int]],
    cached_hash: Callable[[int], str | None],
    label: str,
    free_cached_tokens: int,
) -> PoolSnapshot:
    """``pool`` now under ``tables`` (a name for each block table: the table and its tokens),
    with what happened to each block since the previous snapshot. A block carrying a hash
    (``cached_hash``: its hex, or None) that no table holds shows ``free_cached_tokens``."""
    fill = _block_fill(tables.values(), pool.block_size)
    owners: dict[int, list[str]] = {}
    for name, (table, _) in tables.items():
        for block_id in table:
            if block_id != NULL_BLOCK:
                owners.setdefault(block_id, []).append(name)
    events = pool.take_events()
    blocks = []
    for block_id in range(pool.num_blocks):
        cached = cached_hash(block_id)
        blocks.append(BlockView(
            block_id=block_id,
            tokens=fill.get(block_id, free_cached_tokens if cached else 0),
            owners=tuple(owners.get(block_id, ())),
            ref_count=pool.ref_count(block_id),
            cached_hash=cached,
            event=events.get(block_id),
            is_null=block_id == NULL_BLOCK,
        ))
    return PoolSnapshot(
        block_size=pool.block_size,
        blocks=tuple(blocks),
        tables={name: tuple(table) for name, (table, _) in tables.items()},
        seq_lens={name: length for name, (_, length) in tables.items()},
        label=label,
    )


def _block_fill(tables: Iterable[tuple[list[int], int]], size: int) -> dict[int, int]:
    """Token slots written in each block of ``tables`` (block tables and their tokens; null
    entries skipped), the most that any table holding the block has written."""
    fill: dict[int, int] = {}
    for table, length in tables:
        for index, block_id in enumerate(table):
            if block_id != NULL_BLOCK:
                fill[block_id] = max(fill.get(block_id, 0), min(size, length - index * size))
    return fill


class SequenceLookup:
    """Live sequences by id (``self._seqs``) over a pool (``self.pool``): the lookups and
    checks every KV-cache manager makes."""

    _seqs: dict[str, Any]
    pool: BlockPool

    @property
    def sequences(self) -> tuple[str, ...]:
        """Live sequence ids, oldest first."""
        return tuple(self._seqs)

    def holds(self, seq_id: str) -> bool:
        """Whether ``seq_id`` is a live sequence here."""
        return seq_id in self._seqs

    def seq_len(self, seq_id: str) -> int:
        """Tokens in ``seq_id``."""
        return self._get(seq_id).length

    def _get(self, seq_id: str) -> Any:
        """The state of a live sequence, else a ValueError naming the id."""
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown sequence {seq_id!r}") from None

    def _check_new_id(self, seq_id: str) -> None:
        """Raise unless ``seq_id`` is a string not in use."""
        if not isinstance(seq_id, str):
            raise ValueError(f"sequence id must be a str, got {seq_id!r}")
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")

    def _get_extension(
        self, seq_id: str, num_tokens: int | None, token_ids: Iterable[int] | None
    ) -> tuple[Any, int, list[int] | None]:
        """A live sequence and what an append to it brings (``_count_and_ids``), given the
        way it was added: with token ids if it tracks them, else without."""
        seq = self._get(seq_id)
        if (token_ids is None) != (seq.token_ids is None):
            tracked = "tracks" if seq.token_ids is not None else "does not track"
            raise ValueError(f"sequence {seq_id!r} {tracked} token ids; extend it the same way")
        count, ids = _count_and_ids(num_tokens, token_ids, default=1)
        return seq, count, ids

    def _require_free(self, needed: int) -> None:
        """Raise ``OutOfBlocks`` unless the pool can hand out ``needed`` blocks now."""
        if needed > self.pool.num_free:
            raise OutOfBlocks(needed, self.pool.num_free)


class PagedKVManager(SequenceLookup):
    """Block tables over a ``BlockPool``: add, append (allocate on demand), fork, free.

    Every operation is atomic: when the pool cannot supply the blocks it needs, it raises
    ``OutOfBlocks`` before changing anything. A sequence added with ``token_ids`` keeps
    them (prefix caching hashes them) and must be extended with ``token_ids`` too.
    """

    def __init__(self, pool: BlockPool) -> None:
        """Manage sequences whose blocks come from ``pool``."""
        if not isinstance(pool, BlockPool):
            raise ValueError(f"pool must be a BlockPool, got {pool!r}")
        self.pool = pool
        self._seqs: dict[str, _Sequence] = {}

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.pool.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks a sequence of ``num_tokens`` tokens holds in this pool."""
        return blocks_needed(num_tokens, self.block_size)

    def add_sequence(
        self, seq_id: str, num_tokens: int | None = None, *, token_ids: Iterable[int] | None = None
    ) -> int:
        """Start a sequence (a prefilled prompt) of ``num_tokens`` tokens or ``token_ids``.

        Returns how many of its tokens were found already cached (always 0 here; see
        ``course_lib.prefix_cache``).
        """
        length, ids = self._new_sequence_args(seq_id, num_tokens, token_ids)
        needed = self.blocks_needed(length)
        self._require_free(needed)
        self._install(seq_id, self.pool.allocate_many(needed), length, ids)
        return 0

    def append_tokens(
        self, seq_id: str, num_tokens: int | None = None, *, token_ids: Iterable[int] | None = None
    ) -> None:
        """Extend a sequence by ``num_tokens`` (default 1) or by ``token_ids``.

        A new block is taken only when the last one is full. If the last block is partly
        filled and shared, it is copied first (copy-on-write); its last holder writes in
        place.
        """
        seq, count, ids = self._get_extension(seq_id, num_tokens, token_ids)
        self._grow(seq, count, ids)

    def _append_positions(self, seq_id: str, token_ids: Sequence[int]) -> None:
        """``append_tokens`` of ids the caller made itself, which need no check: the lazy
        serving core's decodes, whose ids are their positions (``course_lib.lazy_serving``).
        With prefix caching, the blocks that fill are hashed later (as with ``cache=False``).
        """
        self._grow(self._seqs[seq_id], len(token_ids), token_ids)

    def _extend_positions(self, seq_id: str, end: int, blocks: list[int]) -> None:
        """Extend a sequence to ``end`` tokens into ``blocks``, which the caller just took
        from the pool for it: exactly the new blocks those tokens need. Their ids, if it
        tracks them, are their positions (the lazy serving core's decodes, which take a
        stretch of steps' blocks in one ``allocate_many``; see ``_append_positions``)."""
        seq = self._seqs[seq_id]
        if end < seq.length or -(-end // self.block_size) - len(seq.table) != len(blocks):
            raise ValueError(f"{len(blocks)} blocks do not extend sequence {seq_id!r} of "
                             f"{seq.length} tokens in {len(seq.table)} blocks to {end} tokens")
        seq.table += blocks
        if seq.token_ids is not None:
            seq.token_ids.extend(range(seq.length, end))
        seq.length = end

    def _grow(self, seq: _Sequence, count: int, ids: Sequence[int] | None) -> None:
        """Extend ``seq`` by ``count`` checked tokens (``ids``, if it tracks them)."""
        pool, table = self.pool, seq.table
        size = pool.block_size
        cow = seq.length % size != 0 and pool.ref_count(table[-1]) > 1
        new_blocks = -(-(seq.length + count) // size) - len(table)  # counts checked above
        self._require_free(new_blocks + int(cow))
        if cow:
            table[-1] = pool.copy_on_write(table[-1])
        if new_blocks == 1:  # a decode's new block
            table.append(pool.allocate())
        elif new_blocks:
            table += pool.allocate_many(new_blocks)
        seq.length += count
        if seq.token_ids is not None and ids is not None:
            seq.token_ids.extend(ids)

    def fork(self, parent: str, child: str) -> None:
        """Make ``child`` a copy of ``parent`` that shares every block (counts go up)."""
        seq = self._get(parent)
        self._check_new_id(child)
        for block_id in seq.table:
            self.pool.share(block_id)
        ids = None if seq.token_ids is None else list(seq.token_ids)
        self._install(child, list(seq.table), seq.length, ids)

    def free_sequence(self, seq_id: str) -> None:
        """Drop a sequence, releasing its blocks in one batch, last block first
        (``BlockPool.free_batch``: its last block is reused first, a cached prefix outlives
        it)."""
        seq = self._get(seq_id)
        del self._seqs[seq_id]
        self.pool._free_checked(seq.table[::-1])

    def block_table(self, seq_id: str) -> tuple[int, ...]:
        """Physical block of each logical block of ``seq_id``."""
        return tuple(self._get(seq_id).table)

    def last_block(self, seq_id: str) -> int:
        """The last block of ``seq_id``'s table (where its next token goes while that block
        has room), without copying the table; ValueError if the table is empty."""
        table = self._get(seq_id).table
        if not table:
            raise ValueError(f"sequence {seq_id!r} holds no block")
        return table[-1]

    def utilization(self) -> float:
        """U_paged over all sequences: token slots in use / (blocks in use x B); 0.0 if none.

        A shared block counts once, so sharing raises it instead of pushing it past 1.
        """
        fill = _block_fill([(seq.table, seq.length) for seq in self._seqs.values()],
                           self.block_size)
        return sum(fill.values()) / (len(fill) * self.block_size) if fill else 0.0

    def snapshot(self, label: str = "") -> PoolSnapshot:
        """The pool now, with what happened to each block since the previous snapshot."""
        if not isinstance(label, str):
            raise ValueError(f"label must be a str, got {label!r}")
        tables = {seq_id: (seq.table, seq.length) for seq_id, seq in self._seqs.items()}
        return _pool_snapshot(self.pool, tables, self._cached_hash, label, self.block_size)

    # --- K/V through the block table ----------------------------------------------------

    def slot_mapping(self, seq_id: str, positions: Iterable[int]) -> list[int]:
        """Flat slot ``block * B + offset`` of each token position of ``seq_id``."""
        seq = self._get(seq_id)
        slots = []
        for pos in check_list("positions", positions):
            if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < seq.length:
                raise ValueError(
                    f"position {pos!r} is outside sequence {seq_id!r} (length {seq.length})"
                )
            slots.append(seq.table[pos // self.block_size] * self.block_size
                         + pos % self.block_size)
        return slots

    def write_kv(
        self,
        seq_id: str,
        positions: Sequence[int],
        key: torch.Tensor,
        value: torch.Tensor,
        layer: int = 0,
    ) -> None:
        """Store K/V ``[len(positions), num_kv_heads, head_dim]`` at those token positions.

        Append the tokens first: writing into a block another sequence can read is refused,
        which is what copy-on-write exists to prevent. Every check and conversion comes
        before the first write, so a refused call leaves K and V untouched.
        """
        import torch

        kv = self.pool.kv_cache(layer)
        positions = check_list("positions", positions)
        expected = (len(positions), kv.shape[3], kv.shape[4])
        key_rows = _kv_rows("key", key, expected, kv)
        value_rows = _kv_rows("value", value, expected, kv)
        slots = self.slot_mapping(seq_id, positions)
        if len(set(slots)) != len(slots):
            raise ValueError(f"positions {positions!r} name a token more than once")
        for block_id in {slot // self.block_size for slot in slots}:
            if self.pool.ref_count(block_id) > 1:
                raise ValueError(
                    f"block {block_id} of {seq_id!r} is shared by "
                    f"{self.pool.ref_count(block_id)} sequences; it is read-only"
                )
        index = torch.tensor(slots, dtype=torch.long, device=kv.device)
        blocks, offsets = index // self.block_size, index % self.block_size
        kv[blocks, 0, offsets] = key_rows
        kv[blocks, 1, offsets] = value_rows

    def batch_tables(
        self, seq_ids: Sequence[str], device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 block tables ``[batch, max_blocks]`` padded with the null block, and lengths.

        The inputs an attention kernel takes for a batch of sequences.
        """
        import torch

        lengths = [self.seq_len(seq_id) for seq_id in seq_ids]
        return (self.table_tensor(seq_ids, device),
                torch.tensor(lengths, dtype=torch.int32, device=device))

    def table_tensor(
        self, seq_ids: Sequence[str], device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """The block tables of ``batch_tables`` alone (what the engine's step needs)."""
        import torch

        seqs = [self._get(seq_id) for seq_id in seq_ids]
        width = max((len(seq.table) for seq in seqs), default=0)
        padded = [seq.table + [NULL_BLOCK] * (width - len(seq.table)) for seq in seqs]
        return torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(seqs), width)

    def read_kv(self, seq_id: str, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather ``seq_id``'s K and V into ``[seq_len, num_kv_heads, head_dim]`` copies."""
        import torch

        kv = self.pool.kv_cache(layer)
        slots = self.slot_mapping(seq_id, range(self.seq_len(seq_id)))
        index = torch.tensor(slots, dtype=torch.long, device=kv.device)
        blocks, offsets = index // self.block_size, index % self.block_size
        return kv[blocks, 0, offsets], kv[blocks, 1, offsets]

    # --- helpers shared with the prefix-caching subclass -----------------------------------

    def _new_sequence_args(
        self, seq_id: str, num_tokens: int | None, token_ids: Iterable[int] | None
    ) -> tuple[int, list[int] | None]:
        """Validate ``add_sequence`` arguments: (length, token ids or None)."""
        self._check_new_id(seq_id)
        return _count_and_ids(num_tokens, token_ids, default=0)

    def _install(self, seq_id: str, table: list[int], length: int, ids: list[int] | None) -> None:
        """Record a new sequence whose blocks are already held."""
        self._seqs[seq_id] = _Sequence(table, length, ids)

    def _cached_hash(self, block_id: int) -> str | None:
        """Hex hash of a cached block, for snapshots; no block is cached without caching."""
        return None
