"""Contiguous KV slabs: every request gets one unbroken run of token slots in one arena.

This is how serving systems stored the KV cache before paging, and chapter 02 measures
what it costs. Two policies decide a slab's size:

* ``reserve-max``: every request reserves ``max_len`` slots, because its final length is
  unknown when it starts.
* ``exact-size``: an oracle that knows each request's final length and reserves exactly
  that (the best a contiguous allocator could ever do).

Slots are then in one of four states, which :meth:`SlabAllocator.usage` counts separately:
holding a token (``used``), reserved for a token not yet written (``reserved``), reserved
but never to be written because the request ends first (``internal`` fragmentation), and
``free``. Free slots split into gaps; :meth:`SlabAllocator.stranded` counts the free slots
in gaps too small for a given request (external fragmentation).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Literal

from course_lib.validate import check_int

SlabPolicy = Literal["reserve-max", "exact-size"]
Fit = Literal["first", "best"]

SLAB_POLICIES: tuple[SlabPolicy, ...] = ("reserve-max", "exact-size")
FITS: tuple[Fit, ...] = ("first", "best")


class OutOfSlots(RuntimeError):
    """No free gap is large enough for a slab; nothing was changed.

    ``free`` is the total free space: when it is at least ``needed``, the failure is
    external fragmentation (enough memory, but no single gap holds it).
    """

    def __init__(self, needed: int, largest_gap: int, free: int) -> None:
        why = ("enough free slots in total, but no single gap holds them"
               if free >= needed else "not enough free slots")
        super().__init__(f"no gap of {needed} slots (largest gap {largest_gap}, "
                         f"{free} free): {why}")
        self.needed = needed
        self.largest_gap = largest_gap
        self.free = free


@dataclass(frozen=True)
class Slab:
    """One request's reservation: slots ``start .. start + size - 1``.

    ``final_len`` is how many tokens the request will have written when it ends (the
    simulator knows it; a real server does not) and ``length`` how many it has written.
    """

    start: int
    size: int
    final_len: int
    length: int

    @property
    def end(self) -> int:
        """One past the last slot of the slab."""
        return self.start + self.size


@dataclass(frozen=True)
class SlabUsage:
    """The arena's slots by state; the four counts add up to ``arena_slots``."""

    used: int
    reserved: int
    internal: int
    free: int

    @property
    def arena_slots(self) -> int:
        """All slots of the arena."""
        return self.used + self.reserved + self.internal + self.free


class SlabAllocator:
    """One arena of ``num_slots`` token slots handing out contiguous slabs.

    A free list of gaps (sorted by address, neighbours merged on free) answers first-fit
    (lowest address that fits) or best-fit (smallest gap that fits, lowest address on ties).
    """

    def __init__(self, num_slots: int, *, policy: SlabPolicy = "reserve-max",
                 max_len: int = 8192, fit: Fit = "first") -> None:
        """An empty arena; ``max_len`` is the longest request it accepts (and, under
        ``reserve-max``, the size of every slab)."""
        self.num_slots = check_int("num_slots", num_slots, 1)
        self.max_len = check_int("max_len", max_len, 1)
        if policy not in SLAB_POLICIES:
            raise ValueError(f"unknown slab policy {policy!r}; expected one of "
                             f"{', '.join(SLAB_POLICIES)}")
        if fit not in FITS:
            raise ValueError(f"unknown fit {fit!r}; expected one of {', '.join(FITS)}")
        self.policy: SlabPolicy = policy
        self.fit: Fit = fit
        self._gap_starts: list[int] = [0]
        self._gap_sizes: list[int] = [num_slots]
        self._slabs: dict[int, Slab] = {}

    # --- sizes -----------------------------------------------------------------------------

    def slab_size(self, final_len: int) -> int:
        """Slots a request that ends at ``final_len`` tokens reserves under this policy."""
        check_int("final_len", final_len, 1)
        if final_len > self.max_len:
            raise ValueError(f"final_len={final_len} exceeds max_len={self.max_len}")
        return self.max_len if self.policy == "reserve-max" else final_len

    @property
    def num_free(self) -> int:
        """Free slots in all gaps together."""
        return sum(self._gap_sizes)

    @property
    def largest_gap(self) -> int:
        """Size of the largest free gap (0 when the arena is full)."""
        return max(self._gap_sizes, default=0)

    def gaps(self) -> list[tuple[int, int]]:
        """Free gaps as ``(start, size)``, by address."""
        return list(zip(self._gap_starts, self._gap_sizes, strict=True))

    @property
    def slabs(self) -> dict[int, Slab]:
        """Live slabs by request id (a copy)."""
        return dict(self._slabs)

    def fits(self, final_len: int) -> bool:
        """Whether some gap holds the slab of a request ending at ``final_len``."""
        return self._find_gap(self.slab_size(final_len)) is not None

    def stranded(self, final_len: int) -> int:
        """Free slots in gaps too small for the slab of a request ending at ``final_len``."""
        need = self.slab_size(final_len)
        return sum(size for size in self._gap_sizes if size < need)

    def usage(self) -> SlabUsage:
        """Slots holding tokens, reserved for later tokens, never to be written, and free."""
        used = sum(s.length for s in self._slabs.values())
        final = sum(s.final_len for s in self._slabs.values())
        free = self.num_free
        return SlabUsage(used=used, reserved=final - used,
                         internal=self.num_slots - free - final, free=free)

    # --- admit, append, free ---------------------------------------------------------------

    def admit(self, request_id: int, final_len: int, length: int = 0) -> Slab:
        """Reserve a slab for a request that has ``length`` tokens now and ``final_len`` at the
        end; raise :class:`OutOfSlots` when no gap fits (the arena is then unchanged)."""
        check_int("request_id", request_id, 0)
        if request_id in self._slabs:
            raise ValueError(f"request {request_id} already holds a slab")
        size = self.slab_size(final_len)
        check_int("length", length, 0)
        if length > final_len:
            raise ValueError(f"length={length} exceeds final_len={final_len}")
        index = self._find_gap(size)
        if index is None:
            raise OutOfSlots(size, self.largest_gap, self.num_free)
        start = self._gap_starts[index]
        if self._gap_sizes[index] == size:
            del self._gap_starts[index], self._gap_sizes[index]
        else:
            self._gap_starts[index] += size
            self._gap_sizes[index] -= size
        slab = Slab(start=start, size=size, final_len=final_len, length=length)
        self._slabs[request_id] = slab
        return slab

    def append(self, request_id: int, num_tokens: int = 1) -> Slab:
        """Write ``num_tokens`` more tokens into the request's slab (never past its end)."""
        slab = self._get(request_id)
        check_int("num_tokens", num_tokens, 1)
        if slab.length + num_tokens > slab.final_len:
            raise ValueError(f"request {request_id}: {slab.length} + {num_tokens} tokens "
                             f"exceeds its final length {slab.final_len}")
        slab = Slab(slab.start, slab.size, slab.final_len, slab.length + num_tokens)
        self._slabs[request_id] = slab
        return slab

    def free(self, request_id: int) -> None:
        """Release the request's slab, merging it with free neighbours."""
        slab = self._get(request_id)
        del self._slabs[request_id]
        index = bisect_left(self._gap_starts, slab.start)
        start, size = slab.start, slab.size
        if index < len(self._gap_starts) and self._gap_starts[index] == slab.end:
            size += self._gap_sizes[index]  # merge with the gap after
            del self._gap_starts[index], self._gap_sizes[index]
        if index > 0 and self._gap_starts[index - 1] + self._gap_sizes[index - 1] == start:
            self._gap_sizes[index - 1] += size  # merge into the gap before
        else:
            self._gap_starts.insert(index, start)
            self._gap_sizes.insert(index, size)

    # --- helpers ---------------------------------------------------------------------------

    def _get(self, request_id: int) -> Slab:
        """The live slab of ``request_id``, else a ValueError naming the id."""
        try:
            return self._slabs[request_id]
        except (KeyError, TypeError):
            raise ValueError(f"request {request_id!r} holds no slab") from None

    def _find_gap(self, size: int) -> int | None:
        """Index of the gap this allocator's fit picks for ``size`` slots, or None."""
        fitting = (i for i, gap in enumerate(self._gap_sizes) if gap >= size)
        if self.fit == "first":
            return next(fitting, None)
        return min(fitting, key=self._gap_sizes.__getitem__, default=None)  # lowest on ties
