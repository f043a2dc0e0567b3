"""The transport's receive hot path: DATA into a preallocated ring, classified with numpy.

No Python object per packet beyond what a socket call needs.  DATA is received with
``recv_into`` straight into slots of a ``DATA_PACKET_DTYPE`` ring (``MSG_TRUNC`` reveals
oversize datagrams); a batch is classified with array ops (length, then version and
opcode read as one big-endian u16), split into runs of one request id (views, no copy:
a holder sends each request's fragments in runs) and handed to the requester
(``Transfers.deliver``), which passes them to ``Reassembler.add_batch``.  Only datagrams
that fail the fast checks take the per-packet slow path, where ``kvpool.wire.parse`` names
the reason (counted in ``stats()["drops"]``) and a NACK goes to ``Transfers.on_nack``.  A
bad packet is dropped on its own: it can never mark a fragment of another transfer as
received (``Reassembler`` validates every record).

GETs on the holder socket are few and parsed one by one (``receive_gets``), into the ring's
first slot: the loop processes the DATA ring fully before it reads GETs.  Everything here
runs on the transport's loop thread.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from hostagent.transport_config import Address, Counters
from kvpool import wire

log = logging.getLogger("kvpool.transport")

_L: Final = wire.DATA_DATAGRAM_LEN
_MSG_TRUNC: Final = getattr(socket, "MSG_TRUNC", 0x20)
_DATA_VO: Final = (wire.KVPOOL_VERSION << 8) | wire.Opcode.DATA
"""version and opcode bytes of a DATA header read as one big-endian u16."""

Deliver = Callable[[int, npt.NDArray[np.void], float], None]
"""``(request id, its run of DATA records, now)``: the requester takes a run of one request's DATA."""


class DataRing:
    """A ring of ``n`` DATA slots the requester socket is drained into, batch by batch."""

    def __init__(self, n: int, counters: Counters, deliver: Deliver, on_nack: Callable[[wire.Header], None],
                 after_batch: Callable[[], None]) -> None:
        """``deliver`` takes each run of one request's DATA, ``on_nack`` each NACK, ``after_batch`` runs per batch."""
        self._c = counters
        self._deliver = deliver
        self._on_nack = on_nack
        self._after_batch = after_batch
        self._ring = np.zeros(n, dtype=wire.DATA_PACKET_DTYPE)
        # Strided view of each slot's (version, opcode) bytes as one big-endian u16 (no copy).
        self._ring_vo: npt.NDArray[np.uint16] = np.ndarray((n,), dtype=">u2", buffer=self._ring.data, strides=(_L,))
        raw = self._ring.view(np.uint8).data
        # One memoryview per slot, made once, so receiving creates no per-packet views.
        self._slots = [raw[i * _L : (i + 1) * _L] for i in range(n)]
        self._lens = [0] * n

    def receive_data(self, sock: socket.socket) -> None:
        """Drain the requester socket in batches: fast path for DATA, slow path for the rest."""
        recv = sock.recv_into
        slots, lens = self._slots, self._lens
        # Bounded, so a flood of incoming DATA cannot starve this agent's own sending.
        for _ in range(16):
            n = 0
            try:
                for slot in slots:
                    lens[n] = recv(slot, _L, _MSG_TRUNC)
                    n += 1
            except BlockingIOError:
                pass
            except OSError as exc:  # e.g. an ICMP error queued on the socket
                self._c.drop("socket_error")
                log.debug("recv failed: %s", exc)
            if n == 0:
                return
            self._c.datagrams_received += n
            self._c.recv_batches += 1
            self._process_batch(n)
            self._after_batch()
            if n < len(slots):
                return

    def receive_gets(self, sock: socket.socket) -> list[tuple[wire.Header, Address]]:
        """The GETs waiting on the holder socket (at most 1024), in arrival order; the rest dropped by reason."""
        buf = self._slots[0]  # the DATA ring was fully processed before this runs
        gets: list[tuple[wire.Header, Address]] = []
        for _ in range(1024):
            try:
                n, addr = sock.recvfrom_into(buf, _L, _MSG_TRUNC)
            except BlockingIOError:
                break
            except OSError as exc:
                self._c.drop("socket_error")
                log.debug("recvfrom failed: %s", exc)
                break
            self._c.datagrams_received += 1
            hdr = self._parse(buf, n, wire.Opcode.GET)
            if hdr is not None:
                gets.append((hdr, addr))
        return gets

    def _process_batch(self, n: int) -> None:
        """Classify a received batch with array ops; hand each run of one request's DATA over as a view."""
        recs = self._ring[:n]
        hdr = recs["hdr"]
        lens = self._lens[:n]
        # version and opcode as one big-endian 16-bit word: one compare instead of two.
        fast = self._ring_vo[:n] == _DATA_VO
        if not (min(lens) == _L == max(lens)):
            fast &= np.fromiter(lens, dtype=np.int64, count=n) == _L
        all_fast = bool(fast.all())
        if not all_fast:
            for i in np.flatnonzero(~fast).tolist():
                self._slow_packet(i)
        rid = hdr["request_id"]
        # A holder sends each request's fragments in runs, so the batch is a few contiguous
        # runs of one request id: slice them (views, no copy) instead of gathering by id.
        change = rid[1:] != rid[:-1]
        if not all_fast:
            change |= fast[1:] != fast[:-1]
        bounds = (np.flatnonzero(change) + 1).tolist()
        now = time.monotonic()
        start = 0
        delivered = 0
        for end in (*bounds, n):
            if all_fast or fast[start]:
                self._deliver(int(rid[start]), recs[start:end], now)
                delivered += end - start
            start = end
        self._c.data_received += delivered

    def _slow_packet(self, i: int) -> None:
        """One datagram that is not a plain DATA of the right size: name the reason and drop it, or hand a NACK over."""
        hdr = self._parse(self._slots[i], self._lens[i], wire.Opcode.NACK)
        if hdr is not None:
            self._on_nack(hdr)

    def _parse(self, buf: memoryview, n: int, opcode: wire.Opcode) -> wire.Header | None:
        """The header of ``buf[:n]`` if it is a well-formed ``opcode`` datagram; else None, its drop counted."""
        if n > _L:
            self._c.drop("oversize")
            return None
        try:
            hdr = wire.parse(buf[:n])
        except wire.WireError as err:
            self._c.drop(err.reason)
            return None
        if hdr.opcode != opcode:
            self._c.drop("unexpected_opcode")
            return None
        return hdr
