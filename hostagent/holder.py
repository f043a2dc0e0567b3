"""The holder role: answer a GET for a range of a chunk's fragments from local chunks.

A holder looks the chunk up in a ``ChunkSource`` (the agent's ``TieredStore``, which
promotes on access and may front a remote store as its lowest tier) and either returns
the DATA records to send or the ``Status`` of the NACK to send instead.  Sockets,
pacing and queueing belong to ``hostagent.transport``; this module is pure so it can be
tested without a network.

Range rule: a GET whose range *starts* inside the chunk but runs past its end is served
up to the chunk's last fragment, so a requester that does not know a chunk's length yet
can ask for its first window in one packet; a range that starts at or past the end is
``BAD_RANGE``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from hostagent.backend import BackendError
from hostagent.fragment import empty_records, fragment_into
from kvpool import wire


class ChunkSource(Protocol):
    """Where a holder reads serialized chunks from."""

    def lookup(self, key: int) -> tuple[bytes | memoryview, int] | None:
        """``(bytes, generation)`` of the chunk or None when it is not held."""


class Holder:
    """Turns GETs into DATA records (or a NACK status) and counts what it served."""

    def __init__(self, source: ChunkSource, *, max_fragments_per_get: int = 4096) -> None:
        if max_fragments_per_get <= 0:
            raise ValueError(f"max_fragments_per_get must be positive, got {max_fragments_per_get}")
        self._source = source
        self._max = max_fragments_per_get
        self._lock = threading.Lock()
        self.gets = 0
        self.fragments_served = 0
        self.bytes_served = 0
        self.nacks: dict[str, int] = {}

    def serve(self, chunk_key: int, first: int, count: int, *, request_id: int = 0, generation: int = 0,
              alloc: Callable[[int], npt.NDArray[np.void]] = empty_records) -> npt.NDArray[np.void] | wire.Status:
        """DATA records for fragments ``first .. first+count-1`` (clamped), or the NACK status.

        ``generation`` 0 accepts whatever generation is held; any other value must match
        it, else ``STALE_GENERATION``.  A store failure is ``STORE_ERROR``, not a miss.
        ``alloc(n)`` gives a record array of at least ``n`` records to fill (a sender's
        pool, so a busy holder does not fault in fresh pages for every window).
        """
        with self._lock:
            self.gets += 1
        try:
            found = self._source.lookup(chunk_key)
        except BackendError:
            return self._nack(wire.Status.STORE_ERROR)
        if found is None:
            return self._nack(wire.Status.UNKNOWN_CHUNK)
        data, held_generation = found
        if generation not in (0, held_generation):
            return self._nack(wire.Status.STALE_GENERATION)
        try:
            total = wire.fragment_count(len(data))
        except wire.WireError:  # an empty or oversize blob cannot be sent as fragments
            return self._nack(wire.Status.STORE_ERROR)
        if first >= total or count <= 0:
            return self._nack(wire.Status.BAD_RANGE)
        n = min(count, total - first, self._max)
        records = fragment_into(alloc(n), data, chunk_key, generation=held_generation, request_id=request_id,
                                first=first, count=n)
        with self._lock:
            self.fragments_served += n
            self.bytes_served += int(records["hdr"]["payload_len"].sum())
        return records

    def _nack(self, status: wire.Status) -> wire.Status:
        with self._lock:
            self.nacks[status.name] = self.nacks.get(status.name, 0) + 1
        return status

    def stats(self) -> dict[str, Any]:
        """GETs answered, fragments and payload bytes served, NACKs by status."""
        with self._lock:
            return {
                "gets": self.gets,
                "fragments_served": self.fragments_served,
                "bytes_served": self.bytes_served,
                "nacks": dict(self.nacks),
            }
