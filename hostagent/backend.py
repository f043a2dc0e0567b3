"""Where a holder keeps the serialized chunks it serves: a small pluggable interface.

The holder agent reads chunk bytes from a backend and sends them as kvpool DATA; the
backend decides nothing about placement. ``MemoryBackend`` is for unit tests and small
runs; ``hostagent.mooncake_backend.MooncakeBackend`` fronts a real Mooncake Store.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable


class BackendError(RuntimeError):
    """The store failed (unreachable, refused, internal error): not the same as a miss."""


@runtime_checkable
class ChunkBackend(Protocol):
    """Storage of serialized chunks by 64-bit chunk key."""

    name: str

    def put(self, key: int, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key``, replacing any previous value."""

    def get(self, key: int) -> bytes | None:
        """The bytes stored under ``key``, or None when missing or evicted."""

    def delete(self, key: int) -> None:
        """Forget ``key``; a missing key is not an error."""

    def close(self) -> None:
        """Release connections and resources."""


class MemoryBackend:
    """A dict in this process, optionally bounded in bytes (oldest entries evicted first)."""

    name = "memory"

    def __init__(self, capacity_bytes: int | None = None) -> None:
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self._capacity = capacity_bytes
        self._data: dict[int, bytes] = {}
        self._used = 0
        self._lock = threading.Lock()

    def put(self, key: int, data: bytes | memoryview) -> None:
        """Store a copy of ``data``; evicts the oldest entries when over capacity."""
        blob = bytes(data)
        if self._capacity is not None and len(blob) > self._capacity:
            raise BackendError(f"chunk {key:#x} of {len(blob)} bytes exceeds capacity {self._capacity}")
        with self._lock:
            self._used -= len(self._data.pop(key, b""))
            self._data[key] = blob
            self._used += len(blob)
            while self._capacity is not None and self._used > self._capacity:
                oldest = next(iter(self._data))
                self._used -= len(self._data.pop(oldest))

    def get(self, key: int) -> bytes | None:
        """The stored bytes or None."""
        with self._lock:
            return self._data.get(key)

    def delete(self, key: int) -> None:
        """Forget ``key``."""
        with self._lock:
            self._used -= len(self._data.pop(key, b""))

    def close(self) -> None:
        """Drop everything."""
        with self._lock:
            self._data.clear()
            self._used = 0

    @property
    def used_bytes(self) -> int:
        """Bytes currently stored."""
        return self._used
