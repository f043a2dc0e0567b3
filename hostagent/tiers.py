"""Local chunk tiers with LRU demotion: GPU memory, host DRAM and an optional store below.

A ``TieredStore`` is an ordered list of tiers, fastest first.  Each tier has a capacity
in bytes.  A new or accessed chunk goes to the top tier; when a tier overflows, its
least-recently-used chunks are *demoted* to the next tier down instead of being dropped
("value recovery"), and only the lowest tier drops, which ``stats()`` reports as
``dropped``.  Reading a chunk from a lower tier promotes it back to the top.

The GPU tier exists only when ``torch.cuda.is_available()``; the host DRAM tier always
does; a ``ChunkBackend`` (e.g. a Mooncake Store client) may sit below both as the last
tier.  All values are serialized chunk bytes: the holder serves them as DATA fragments
and the inference engine deserializes them, so tiers never need to know tensor shapes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hostagent.backend import ChunkBackend

Blob = bytes | memoryview
"""A stored chunk: immutable ``bytes`` or a read-only view of a buffer nobody writes any more."""


class TierError(RuntimeError):
    """A chunk cannot be stored in any tier (e.g. larger than every capacity)."""


class Tier(Protocol):
    """Storage for one tier: bytes by chunk key; the ``TieredStore`` decides placement."""

    name: str
    capacity_bytes: int | None

    def store(self, key: int, data: Blob) -> None:
        """Keep ``data`` under ``key``."""

    def load(self, key: int) -> Blob | None:
        """The bytes under ``key`` (None if the tier lost them)."""

    def remove(self, key: int) -> None:
        """Forget ``key``."""


class HostTier:
    """Host DRAM: a dict of immutable blobs (no copy in or out)."""

    def __init__(self, capacity_bytes: int, name: str = "dram") -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"{name} capacity must be positive, got {capacity_bytes}")
        self.name = name
        self.capacity_bytes: int | None = capacity_bytes
        self._data: dict[int, Blob] = {}

    def store(self, key: int, data: Blob) -> None:
        """Keep ``data``."""
        self._data[key] = data

    def load(self, key: int) -> Blob | None:
        """The bytes or None."""
        return self._data.get(key)

    def remove(self, key: int) -> None:
        """Forget ``key``."""
        self._data.pop(key, None)


class GpuTier:
    """GPU memory: each chunk is a ``torch.uint8`` tensor on a CUDA device."""

    def __init__(self, capacity_bytes: int, device: str = "cuda", name: str = "gpu") -> None:
        import torch

        if not torch.cuda.is_available():
            raise TierError("GPU tier requested but torch.cuda.is_available() is False")
        if capacity_bytes <= 0:
            raise ValueError(f"{name} capacity must be positive, got {capacity_bytes}")
        self.name = name
        self.capacity_bytes: int | None = capacity_bytes
        self._device = device
        self._data: dict[int, Any] = {}

    def store(self, key: int, data: Blob) -> None:
        """Copy ``data`` to the device."""
        import torch

        self._data[key] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self._device)

    def load(self, key: int) -> bytes | None:
        """Copy the chunk back to host bytes."""
        t = self._data.get(key)
        return None if t is None else bytes(t.cpu().numpy().tobytes())

    def remove(self, key: int) -> None:
        """Free the device copy."""
        self._data.pop(key, None)


class BackendTier:
    """A ``ChunkBackend`` as the lowest tier (remote DRAM pool); unbounded unless given a capacity."""

    def __init__(self, backend: ChunkBackend, capacity_bytes: int | None = None) -> None:
        self.name = backend.name
        self.capacity_bytes = capacity_bytes
        self._backend = backend

    def store(self, key: int, data: Blob) -> None:
        """Write through to the backend."""
        self._backend.put(key, data)

    def load(self, key: int) -> Blob | None:
        """Read from the backend (it may have evicted the key on its own)."""
        return self._backend.get(key)

    def remove(self, key: int) -> None:
        """Delete from the backend."""
        self._backend.delete(key)


@dataclass(slots=True)
class _Entry:
    size: int
    generation: int


@dataclass(slots=True)
class _TierState:
    tier: Tier
    lru: OrderedDict[int, _Entry]
    used: int = 0
    hits: int = 0
    demoted_in: int = 0
    demoted_out: int = 0
    promoted_out: int = 0


class TieredStore:
    """Chunks across tiers, fastest first, with LRU demotion and promotion on access."""

    def __init__(self, tiers: list[Tier]) -> None:
        if not tiers:
            raise ValueError("a TieredStore needs at least one tier")
        self._tiers = [_TierState(t, OrderedDict()) for t in tiers]
        self._where: dict[int, int] = {}
        self._lock = threading.RLock()
        self._listener: Callable[[int, str | None, int], None] | None = None
        self.misses = 0
        self.dropped = 0
        self.dropped_bytes = 0

    def set_listener(self, listener: Callable[[int, str | None, int], None] | None) -> None:
        """Call ``listener(key, tier name or None when gone, size)`` on every placement change.

        The chunks already stored are reported first, under the same lock, so the listener
        sees a consistent history.  It runs under the store's lock, so it must be quick
        (record and return); a move shows up as the chunk leaving one tier, then landing
        in another.
        """
        with self._lock:
            self._listener = listener
            if listener is not None:
                for key, tier, size in self.placements():
                    listener(key, tier, size)

    @property
    def tier_names(self) -> list[str]:
        """Tier names, fastest first."""
        return [s.tier.name for s in self._tiers]

    def put(self, key: int, data: bytes | bytearray | memoryview, generation: int = 0, *, copy: bool = True) -> None:
        """Store ``data`` in the fastest tier that can hold it, demoting LRU chunks as needed.

        ``bytes`` are kept as they are.  Other buffers are copied unless ``copy`` is False,
        which hands the buffer over (a read-only view is kept): the caller must not write
        it again.  The agent hands over reassembly buffers so a fetched chunk is not copied.
        """
        blob: Blob
        if isinstance(data, bytes):
            blob = data
        elif copy or isinstance(data, bytearray):
            blob = bytes(data)
        else:
            blob = data.toreadonly()
        with self._lock:
            self._remove(key)
            self._insert(key, blob, _Entry(len(blob), generation), 0)

    def get(self, key: int) -> Blob | None:
        """The chunk's bytes (promoted to the top tier), or None."""
        found = self.lookup(key)
        return None if found is None else found[0]

    def lookup(self, key: int) -> tuple[Blob, int] | None:
        """``(bytes, generation)`` of the chunk, promoting it to the top tier; None on a miss."""
        with self._lock:
            level = self._where.get(key)
            if level is None:
                self.misses += 1
                return None
            state = self._tiers[level]
            data = state.tier.load(key)
            entry = state.lru[key]
            if data is None:
                # The lowest tier may be an external store that evicted on its own.
                self._remove(key)
                self.misses += 1
                return None
            state.hits += 1
            if level == 0 or not any(self._fits(up, entry.size) for up in range(level)):
                # No faster tier can hold it: moving it would rewrite it where it already is.
                state.lru.move_to_end(key)
            else:
                self._remove(key)
                state.promoted_out += 1
                self._insert(key, data, entry, 0)
            return data, entry.generation

    def generation(self, key: int) -> int | None:
        """The stored generation of ``key`` without touching LRU order; None if absent."""
        with self._lock:
            level = self._where.get(key)
            return None if level is None else self._tiers[level].lru[key].generation

    def tier_of(self, key: int) -> str | None:
        """Name of the tier that holds ``key`` now (no LRU update)."""
        with self._lock:
            level = self._where.get(key)
            return None if level is None else self._tiers[level].tier.name

    def delete(self, key: int) -> bool:
        """Forget ``key``; True if it was stored."""
        with self._lock:
            return self._remove(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._where

    def __len__(self) -> int:
        with self._lock:
            return len(self._where)

    def placements(self) -> list[tuple[int, str, int]]:
        """``(key, tier name, size)`` of every stored chunk, without touching LRU order."""
        with self._lock:
            return [(k, s.tier.name, e.size) for s in self._tiers for k, e in s.lru.items()]

    def keys(self) -> list[int]:
        """All stored keys (any tier)."""
        with self._lock:
            return list(self._where)

    def stats(self) -> dict[str, Any]:
        """Per-tier occupancy and movement counters plus misses and drops."""
        with self._lock:
            return {
                "tiers": [
                    {
                        "name": s.tier.name,
                        "capacity_bytes": s.tier.capacity_bytes,
                        "used_bytes": s.used,
                        "chunks": len(s.lru),
                        "hits": s.hits,
                        "demoted_in": s.demoted_in,
                        "demoted_out": s.demoted_out,
                        "promoted_out": s.promoted_out,
                    }
                    for s in self._tiers
                ],
                "chunks": len(self._where),
                "misses": self.misses,
                "dropped": self.dropped,
                "dropped_bytes": self.dropped_bytes,
                "drop_tier": self._tiers[-1].tier.name,
            }

    # -- internals (lock held) ---------------------------------------------------------

    def _fits(self, level: int, size: int) -> bool:
        cap = self._tiers[level].tier.capacity_bytes
        return cap is None or size <= cap

    def _insert(self, key: int, data: Blob, entry: _Entry, level: int) -> None:
        # A chunk bigger than a whole tier skips it rather than flushing everything out.
        while level < len(self._tiers) and not self._fits(level, entry.size):
            level += 1
        if level == len(self._tiers):
            raise TierError(f"chunk {key:#x} of {entry.size} bytes is larger than every tier")
        state = self._tiers[level]
        state.tier.store(key, data)
        state.lru[key] = entry
        state.used += entry.size
        self._where[key] = level
        if self._listener is not None:
            self._listener(key, state.tier.name, entry.size)
        cap = state.tier.capacity_bytes
        while cap is not None and state.used > cap:
            victim, ventry = next(iter(state.lru.items()))
            vdata = state.tier.load(victim)
            self._drop_from(level, victim)
            if level + 1 < len(self._tiers) and vdata is not None:
                state.demoted_out += 1
                self._tiers[level + 1].demoted_in += 1
                self._insert(victim, vdata, ventry, level + 1)
            else:
                self.dropped += 1
                self.dropped_bytes += ventry.size

    def _drop_from(self, level: int, key: int) -> None:
        state = self._tiers[level]
        entry = state.lru.pop(key)
        state.used -= entry.size
        state.tier.remove(key)
        del self._where[key]
        if self._listener is not None:
            self._listener(key, None, entry.size)

    def _remove(self, key: int) -> bool:
        level = self._where.get(key)
        if level is None:
            return False
        self._drop_from(level, key)
        return True


def default_store(dram_bytes: int, gpu_bytes: int = 0, backend: ChunkBackend | None = None) -> TieredStore:
    """GPU tier (when ``gpu_bytes`` > 0 and CUDA is available), DRAM tier, optional backend tier.

    ``dram_bytes`` 0 leaves the DRAM tier out, so a holder fronting a remote store reads
    every chunk from it (the store, not a copy in this process, says what is held).
    """
    tiers: list[Tier] = []
    if gpu_bytes > 0:
        import torch

        if torch.cuda.is_available():
            tiers.append(GpuTier(gpu_bytes))
    if dram_bytes > 0:
        tiers.append(HostTier(dram_bytes))
    if backend is not None:
        tiers.append(BackendTier(backend))
    return TieredStore(tiers)
