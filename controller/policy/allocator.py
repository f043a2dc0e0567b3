"""Slot allocator for the paged switch pool: each chunk gets a run of consecutive slots.

Like PagedAttention for the switch: the pool is an array of fragment-sized slots, a table
maps a chunk key to its base slot, and a chunk's fragments sit in consecutive slots so the
data plane computes slot = base + fragment index. Freed runs merge with their neighbours,
so equal-size chunks never fragment the pool.
"""

from __future__ import annotations

import bisect


class AllocatorError(ValueError):
    """A free of slots that were not allocated (double free or wrong length)."""


class SlotAllocator:
    """First-fit allocator of consecutive slot runs over ``[0, n_slots)``."""

    def __init__(self, n_slots: int) -> None:
        if n_slots <= 0:
            raise ValueError(f"slot allocator needs a positive number of slots, got {n_slots}")
        self.n_slots = n_slots
        self._starts: list[int] = [0]  # sorted starts of free runs
        self._length: dict[int, int] = {0: n_slots}  # free run start -> length
        self._allocated: dict[int, int] = {}  # allocated base -> length
        self._free = n_slots

    @property
    def free_slots(self) -> int:
        """Slots not allocated."""
        return self._free

    @property
    def used_slots(self) -> int:
        """Slots allocated."""
        return self.n_slots - self._free

    @property
    def largest_free_run(self) -> int:
        """Length of the longest run of free slots."""
        return max(self._length.values(), default=0)

    def allocations(self) -> dict[int, int]:
        """A copy of the live allocations, base slot -> length."""
        return dict(self._allocated)

    def alloc(self, n: int) -> int | None:
        """Base of ``n`` free consecutive slots, now allocated; None when no run is long enough."""
        if n <= 0:
            raise ValueError(f"allocation size must be positive, got {n}")
        if n > self._free:
            return None
        for idx, start in enumerate(self._starts):
            length = self._length[start]
            if length >= n:
                del self._length[start]
                if length == n:
                    del self._starts[idx]
                else:
                    self._starts[idx] = start + n  # stays sorted: the run only shrinks from the left
                    self._length[start + n] = length - n
                self._allocated[start] = n
                self._free -= n
                return start
        return None

    def _free_run_of(self, base: int, n: int) -> int:
        """Index in ``_starts`` of the free run holding all of ``[base, base + n)``; -1 if none does."""
        idx = bisect.bisect_right(self._starts, base) - 1
        if idx < 0 or self._starts[idx] + self._length[self._starts[idx]] < base + n:
            return -1
        return idx

    def is_free(self, base: int, n: int) -> bool:
        """Whether ``[base, base + n)`` is free (inside the slots, overlapping no allocation)."""
        return n > 0 and self._free_run_of(base, n) >= 0

    def reserve(self, base: int, n: int) -> None:
        """Allocate exactly ``[base, base + n)`` (a run another controller placed); AllocatorError unless free."""
        if n <= 0:
            raise ValueError(f"allocation size must be positive, got {n}")
        idx = self._free_run_of(base, n)
        if idx < 0:
            raise AllocatorError(f"slots [{base}, {base + n}) are not free")
        start = self._starts[idx]
        length = self._length.pop(start)
        del self._starts[idx]
        left, right = base - start, start + length - (base + n)
        if left:
            self._starts.insert(idx, start)
            self._length[start] = left
            idx += 1
        if right:
            self._starts.insert(idx, base + n)
            self._length[base + n] = right
        self._allocated[base] = n
        self._free -= n

    def free(self, base: int, n: int) -> None:
        """Return the run ``[base, base + n)`` obtained from :meth:`alloc`."""
        if self._allocated.get(base) != n:
            raise AllocatorError(f"free of slots [{base}, {base + n}) that are not an allocated run")
        del self._allocated[base]
        self._free += n
        idx = bisect.bisect_left(self._starts, base)
        start, length = base, n
        # merge with the free run on the right
        if idx < len(self._starts) and self._starts[idx] == base + n:
            length += self._length.pop(self._starts[idx])
            del self._starts[idx]
        # merge with the free run on the left
        if idx > 0:
            left = self._starts[idx - 1]
            if left + self._length[left] == base:
                self._length[left] += length
                return
        self._starts.insert(idx, start)
        self._length[start] = length
