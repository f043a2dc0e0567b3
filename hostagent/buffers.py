"""Reassembly buffers that go back to a free list, not to the kernel, once nobody holds them.

A fetched chunk lands in a buffer that outlives its transfer: the caller's result and the
DRAM tier keep a view of it (no copy).  A fresh buffer is fresh anonymous memory, and its
first write faults in every 4 KiB page, zeroed: on this project's 2-core VM, 0.6-1.1 ms per
MiB under load against 0.04 ms to copy a MiB from a warm ring, so a requester that
received into fresh buffers spent more on page faults than on every copy and check of its
data path together (a 256 MiB fetch: 0.25 s of faults, 0.05 s of copies).  glibc gives
such buffers back to the kernel when they are freed (a 1 MiB ``malloc`` is its own mapping,
or trimmed from the top of an arena), so every chunk fetched after a chunk was dropped
faulted its pages in again.

``BufferPool`` hands out buffers carved from large anonymous mappings (``MADV_HUGEPAGE``
asked for: a slab's first touch is then a fault per 2 MiB, 5-7x cheaper here) and takes a
buffer back when the last view of it is gone: each buffer is exported through its own small
ctypes object, every numpy array and memoryview made from it keeps that object alive, and a
weak reference to it returns the slot when it dies.  So a buffer is reused only once nothing can
read or write it any more.  Free slots past ``spare_bytes`` are given back to the kernel
(``MADV_DONTNEED``) before they are listed, so an idle agent holds at most that much it does
not use.  Thread-safe without a lock: finalizers run on whatever thread drops the last
view, and the free lists are deques (atomic append and pop).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import threading
import weakref
from typing import Final

import numpy as np
import numpy.typing as npt

PAGE: Final = mmap.PAGESIZE
SLAB_BYTES: Final = 64 << 20
"""A slab: many chunk buffers of one size class (32 THP huge pages), mapped at once."""
SPARE_BYTES: Final = 1 << 30
"""Free buffers kept mapped for reuse (the DRAM tier's default capacity: memory the tier refills)."""
_MADV_HUGEPAGE: Final = getattr(mmap, "MADV_HUGEPAGE", 14)
_MADV_DONTNEED: Final = getattr(mmap, "MADV_DONTNEED", 4)

Slot = tuple[mmap.mmap, int]
"""A buffer's place: its slab and its offset in it."""


class BufferPool:
    """Byte buffers of page-rounded size classes, recycled once the last view of one is gone."""

    def __init__(self, *, slab_bytes: int = SLAB_BYTES, spare_bytes: int = SPARE_BYTES) -> None:
        """``slab_bytes`` mapped per slab (at least one buffer each); ``spare_bytes`` of free buffers kept mapped."""
        if slab_bytes <= 0 or spare_bytes < 0:
            raise ValueError(f"slab_bytes must be positive and spare_bytes >= 0, got {slab_bytes}, {spare_bytes}")
        self._slab_bytes = slab_bytes
        self._spare = spare_bytes
        self._free: dict[int, collections.deque[Slot]] = {}
        self._types: dict[int, type[ctypes.Array[ctypes.c_ubyte]]] = {}
        # Buffers handed out: a weak reference to the object that exports each one, by its id.
        self._live: dict[int, tuple[weakref.ReferenceType[ctypes.Array[ctypes.c_ubyte]],
                                    collections.deque[Slot], Slot, int]] = {}
        self._grow = threading.Lock()  # only around mapping a new slab (never taken by a finalizer)
        self.mapped_bytes = 0
        """Bytes of slabs mapped so far (they stay mapped; past ``spare_bytes`` free ones hold no pages)."""
        self.reused = 0
        """Buffers handed out from the free list (no page faulted in)."""
        self.released = 0
        """Free buffers whose pages went back to the kernel (the free list was past ``spare_bytes``)."""

    @staticmethod
    def size_class(nbytes: int) -> int:
        """The buffer size ``nbytes`` is served from: whole pages."""
        return max(PAGE, -(-nbytes // PAGE) * PAGE)

    def take(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """A writable uint8 array of ``nbytes`` (contents undefined), back in the pool once nothing views it."""
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        size = self.size_class(nbytes)
        free = self._free.get(size)
        if free is None:
            free = self._free.setdefault(size, collections.deque())
        try:
            slot = free.pop()
            self.reused += 1
        except IndexError:
            slot = self._new_slab(size, free)
        slab, offset = slot
        kind = self._types.get(size)
        if kind is None:
            kind = self._types.setdefault(size, ctypes.c_ubyte * size)
        owner = kind.from_buffer(slab, offset)  # keeps the slab mapped while it lives
        # A weak reference with a callback, kept here until it fires: the fewest objects per
        # buffer (each one the garbage collector tracks brings its next full pass closer).
        ref = weakref.ref(owner, self._dead)
        self._live[id(ref)] = (ref, free, slot, size)
        # A ctypes array exports the buffer protocol (numpy's stubs do not list it).
        arr: npt.NDArray[np.uint8] = np.frombuffer(owner, dtype=np.uint8, count=nbytes)  # type: ignore[call-overload]
        return arr

    def _dead(self, ref: weakref.ReferenceType[ctypes.Array[ctypes.c_ubyte]]) -> None:
        """The last view of a buffer is gone (its exporting object died): give its slot back."""
        entry = self._live.pop(id(ref), None)
        if entry is not None:
            self._give_back(*entry[1:])

    def _new_slab(self, size: int, free: collections.deque[Slot]) -> Slot:
        """Map a slab of ``size``-byte slots; list all but the first, which is returned."""
        count = max(1, self._slab_bytes // size)
        with self._grow:
            slab = mmap.mmap(-1, count * size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if count * size >= 2 << 20:
                with contextlib.suppress(OSError, ValueError):  # no THP here: 4 KiB pages, still recycled
                    slab.madvise(_MADV_HUGEPAGE)
            self.mapped_bytes += count * size
        free.extend((slab, i * size) for i in range(count - 1, 0, -1))
        return slab, 0

    def _give_back(self, free: collections.deque[Slot], slot: Slot, size: int) -> None:
        """The last view of a buffer is gone: list its slot again, its pages dropped first if spare is full."""
        if (len(free) + 1) * size > self._spare:
            slab, offset = slot
            with contextlib.suppress(OSError, ValueError):
                slab.madvise(_MADV_DONTNEED, offset, size)
                self.released += 1
        free.append(slot)

    def stats(self) -> dict[str, int]:
        """Bytes mapped and listed free, buffers handed out now, reused and whose pages went back."""
        return {"mapped_bytes": self.mapped_bytes, "free_bytes": self.free_bytes(), "live": len(self._live),
                "reused": self.reused, "released": self.released}

    def free_bytes(self) -> int:
        """Bytes of buffers listed free (approximate while other threads take and give back)."""
        return sum(size * len(free) for size, free in list(self._free.items()))
