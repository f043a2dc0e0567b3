"""The holder role: answer a GET for a range of a chunk's fragments from local chunks.

A holder looks the chunk up in a ``ChunkSource`` (the agent's ``TieredStore``, which
promotes on access and may front a remote store as its lowest tier) and either returns
the DATA records to send or the ``Status`` of the NACK to send instead.  Sockets belong
to ``hostagent.transport``, admission to ``hostagent.serving``, pacing and queueing to
``hostagent.send_queue``; this module is pure so it can be tested without a network.

Range rule: a GET whose range *starts* inside the chunk but runs past its end is served
up to the chunk's last fragment, so a requester that does not know a chunk's length yet
can ask for its first window in one packet; a range that starts at or past the end is
``BAD_RANGE``.

Checks: the holder is the *writer* of every DATA it sends, so it computes each
fragment's ``check`` (``hostagent.fragment.fragment_checks``).  It does so once per chunk
content and generation and keeps the result (bounded, least recently used first out):
the content is told apart by the checksum a serialized chunk carries (O(1)), or by an
xxh3 of the whole chunk for bytes that are not a serialized chunk.

Kept records: a hot prefix is asked for again and again (by every requester in plain
mode, by every wave), and building its DATA records copies the whole chunk each time.
So the holder also keeps the records of the chunks it answered last (all fragments,
request id and flags zero; bounded by bytes, least recently used first out, told apart
like the checks) and answers from them: an answer is then a view of the kept records
with the GET's request id and flags written in, no payload copied.  Kept records live in
recycled buffers (``hostagent.buffers``), so rebuilding an evicted chunk's records costs a
copy, not a page fault per 4 KiB.  Those two fields
are the only ones that differ between answers, and the only ones anyone writes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from hostagent import envelope
from hostagent.backend import BackendError
from hostagent.buffers import BufferPool
from hostagent.fragment import empty_records, fragment_checks, fragment_into
from kvpool import wire

CHECK_CACHE_FRAGMENTS: Final = 1 << 22
"""Fragment checks a holder keeps (8 bytes each: 32 MiB, the checks of about 5.9 GB of chunks)."""

RECORD_CACHE_BYTES: Final = 256 << 20
"""DATA records a holder keeps to answer from (1.03x the chunks' bytes: about 248 MiB of chunks)."""


def stamp(records: npt.NDArray[np.void], request_id: int, flags: int) -> None:
    """Write the fields that differ between answers of one chunk (request id, flags) into ``records``."""
    hdr = records["hdr"]
    hdr["request_id"] = request_id
    hdr["flags"] = flags


class ChunkSource(Protocol):
    """Where a holder reads serialized chunks from."""

    def lookup(self, key: int) -> tuple[bytes | memoryview, int] | None:
        """``(bytes, generation)`` of the chunk or None when it is not held."""


class Holder:
    """Turns GETs into DATA records (or a NACK status) and counts what it served."""

    def __init__(self, source: ChunkSource, *, max_fragments_per_get: int = 4096,
                 check_cache_fragments: int = CHECK_CACHE_FRAGMENTS,
                 record_cache_bytes: int = RECORD_CACHE_BYTES) -> None:
        if max_fragments_per_get <= 0:
            raise ValueError(f"max_fragments_per_get must be positive, got {max_fragments_per_get}")
        self._source = source
        self._max = max_fragments_per_get
        self._lock = threading.Lock()
        self.gets = 0
        self.fragments_served = 0
        self.bytes_served = 0
        self.nacks: dict[str, int] = {}
        # key -> (generation, chunk_len, content tag, checks); LRU order.
        self._checks: OrderedDict[int, tuple[int, int, int, npt.NDArray[np.uint64]]] = OrderedDict()
        self._checks_held = 0
        self._checks_max = check_cache_fragments
        self.checks_computed = 0
        """Chunks whose fragment checks were computed (a cache miss)."""
        # key -> (generation, chunk_len, content tag, records of every fragment); LRU order.
        self._records: OrderedDict[int, tuple[int, int, int, npt.NDArray[np.void]]] = OrderedDict()
        self._records_held = 0
        self._records_max = max(0, record_cache_bytes)
        self._buffers = BufferPool(spare_bytes=self._records_max)
        self.records_built = 0
        """Chunks whose records were built to be kept (a cache miss)."""

    def serve(self, chunk_key: int, first: int, count: int, *, request_id: int = 0, generation: int = 0,
              flags: int = 0,
              alloc: Callable[[int], npt.NDArray[np.void]] = empty_records) -> npt.NDArray[np.void] | wire.Status:
        """DATA records for fragments ``first .. first+count-1`` (clamped), or the NACK status.

        ``generation`` 0 accepts whatever generation is held; any other value must match
        it, else ``STALE_GENERATION``.  A store failure is ``STORE_ERROR``, not a miss.
        ``flags`` go into every record (the transport passes a GET's ``NO_CACHE`` on).
        ``alloc(n)`` gives a record array of at least ``n`` records to fill (a sender's
        pool, so a busy holder does not fault in fresh pages for every window) when the
        chunk's records are not kept.

        The records may be a view of the holder's kept records (``_kept``): they hold this
        answer's request id and flags until the chunk is served again.  A sender that keeps
        them across another ``serve`` writes the two fields again before sending
        (``stamp``); nothing else in them may be written.
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
        kept = self._kept(chunk_key, data, held_generation, total)
        if kept is not None:
            records = kept[first : first + n]
            stamp(records, request_id, flags)
        else:
            checks = self.checks(chunk_key, data, held_generation)
            records = fragment_into(alloc(n), data, chunk_key, generation=held_generation, request_id=request_id,
                                    flags=flags, first=first, count=n, checks=checks)
        with self._lock:
            self.fragments_served += n
            self.bytes_served += int(records["hdr"]["payload_len"].sum())
        return records

    def known_fragments(self, chunk_key: int) -> int | None:
        """The chunk's fragment count if it was served lately (from the caches, no store read), else None."""
        with self._lock:
            entry = self._records.get(chunk_key) or self._checks.get(chunk_key)
        return None if entry is None else wire.fragment_count(entry[1])

    def checks(self, chunk_key: int, data: bytes | memoryview, generation: int,
               tag: int | None = None) -> npt.NDArray[np.uint64]:
        """Every fragment's ``check`` of ``data`` as chunk ``chunk_key`` at ``generation`` (kept for reuse).

        ``tag`` is ``data``'s ``envelope.content_digest`` when the caller has it already.
        """
        if tag is None:
            tag = envelope.content_digest(data)  # O(1) for a serialized chunk, a hash of all of it otherwise
        size = len(data)
        with self._lock:
            hit = self._checks.get(chunk_key)
            if hit is not None and hit[:3] == (generation, size, tag):
                self._checks.move_to_end(chunk_key)
                return hit[3]
        checks = fragment_checks(data, chunk_key, generation=generation)
        with self._lock:
            self.checks_computed += 1
            old = self._checks.pop(chunk_key, None)
            if old is not None:
                self._checks_held -= old[3].size
            if checks.size <= self._checks_max:
                self._checks[chunk_key] = (generation, size, tag, checks)
                self._checks_held += checks.size
            while self._checks_held > self._checks_max:
                _, (_, _, _, gone) = self._checks.popitem(last=False)
                self._checks_held -= gone.size
        return checks

    def _kept(self, chunk_key: int, data: bytes | memoryview, generation: int,
              total: int) -> npt.NDArray[np.void] | None:
        """The kept records of every fragment of ``data`` (built and kept on a miss); None when they do not fit."""
        size = len(data)
        nbytes = total * wire.DATA_DATAGRAM_LEN
        if nbytes > self._records_max:
            return None
        tag = envelope.content_digest(data)
        with self._lock:
            hit = self._records.get(chunk_key)
            if hit is not None and hit[:3] == (generation, size, tag):
                self._records.move_to_end(chunk_key)
                return hit[3]
        checks = self.checks(chunk_key, data, generation, tag)
        # Into a recycled buffer: the records of a chunk evicted a moment ago (once no send
        # still holds a view of them), not fresh pages faulted in one by one.
        out = self._buffers.take(nbytes).view(wire.DATA_PACKET_DTYPE)
        records = fragment_into(out, data, chunk_key, generation=generation, checks=checks)
        with self._lock:
            self.records_built += 1
            old = self._records.pop(chunk_key, None)
            if old is not None:
                self._records_held -= old[3].nbytes
            self._records[chunk_key] = (generation, size, tag, records)
            self._records_held += nbytes
            while self._records_held > self._records_max:
                _, (_, _, _, gone) = self._records.popitem(last=False)
                self._records_held -= gone.nbytes
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
                "checks_computed": self.checks_computed,
                "records_built": self.records_built,
                "records_kept_bytes": self._records_held,
            }
