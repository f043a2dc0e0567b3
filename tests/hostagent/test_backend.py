"""The in-memory chunk backend: stores, replaces, evicts oldest first, rejects oversize."""

from __future__ import annotations

import pytest

from hostagent.backend import BackendError, ChunkBackend, MemoryBackend


def test_memory_backend_is_a_chunk_backend() -> None:
    assert isinstance(MemoryBackend(), ChunkBackend)


def test_put_get_replace_delete() -> None:
    b = MemoryBackend()
    b.put(1, b"abc")
    b.put(1, memoryview(b"xy"))
    assert b.get(1) == b"xy" and b.used_bytes == 2
    b.delete(1)
    b.delete(1)
    assert b.get(1) is None and b.used_bytes == 0


def test_capacity_evicts_oldest_first() -> None:
    b = MemoryBackend(capacity_bytes=10)
    for k in range(4):
        b.put(k, bytes(4))
    assert [k for k in range(4) if b.get(k) is not None] == [2, 3]
    assert b.used_bytes == 8
    with pytest.raises(BackendError, match="exceeds capacity"):
        b.put(9, bytes(11))
