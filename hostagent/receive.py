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
import sys
import time
from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from hostagent.transport_config import Address, Counters
from kvpool import wire
from kvpool.sockets import GRO_CMSG_SPACE, UDP_GRO, gro_segment

log = logging.getLogger("kvpool.transport")

_L: Final = wire.DATA_DATAGRAM_LEN
_MSG_TRUNC: Final = int(getattr(socket, "MSG_TRUNC", 0x20))
"""A plain int: ``socket.MSG_TRUNC`` is an enum, and ``flags & enum`` costs a microsecond per receive."""
_SOL_UDP: Final = int(socket.SOL_UDP)
_DATA_VO: Final = (wire.KVPOOL_VERSION << 8) | wire.Opcode.DATA
"""version and opcode bytes of a DATA header read as one big-endian u16."""

_GRO_SLACK: Final = -(-0x10000 // _L)
"""Records one coalesced receive may fill (64 KiB at most)."""
GRO_BATCH: Final = 1024
"""Records a coalesced batch takes at least (about 1.5 MB, some 24 receives): with a syscall per
64 KiB, what a batch costs in numpy calls and request bookkeeping is the per-record cost left,
so a batch of 256 (one recv per datagram's worth of them) spent a fifth of the loop on it."""
_CMSG_SPACE: Final = GRO_CMSG_SPACE

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
        self._n = n
        self._n_gro = max(n, GRO_BATCH)
        self.gro = False
        """Whether the requester socket delivers coalesced DATA (``Transport.start`` turns UDP GRO on)."""
        self.gets_gro = False
        """The same for the holder socket's GETs."""
        # Room for a coalesced buffer past the batch: one receive may end up to _GRO_SLACK
        # records past the n-th, so it never truncates.
        cap = self._n_gro + _GRO_SLACK
        self._ring = np.zeros(cap, dtype=wire.DATA_PACKET_DTYPE)
        # Strided view of each slot's (version, opcode) bytes as one big-endian u16 (no copy).
        self._ring_vo: npt.NDArray[np.uint16] = np.ndarray((cap,), dtype=">u2", buffer=self._ring.data,
                                                           strides=(_L,))
        raw = self._ring.view(np.uint8).data
        # One memoryview per slot, made once, so receiving creates no per-packet views; and,
        # for coalesced receives, one from each slot to the end of the ring.
        self._slots = [raw[i * _L : (i + 1) * _L] for i in range(cap)]
        self._tails = [raw[i * _L :] for i in range(self._n_gro)]
        self._lens = [_L] * cap
        self._odd = False
        """Whether the batch being filled has a datagram of another length than a DATA's (``_lens`` says which)."""

    def receive_data(self, sock: socket.socket) -> None:
        """Drain the requester socket in batches: fast path for DATA, slow path for the rest."""
        fill = self._fill_gro if self.gro else self._fill
        # Bounded (16 plain batches' worth of records), so a flood of incoming DATA cannot
        # starve this agent's own sending.
        left = 16 * self._n
        while left > 0:
            n, more = fill(sock)
            if n == 0:
                return
            self._c.datagrams_received += n
            self._c.recv_batches += 1
            self._process_batch(n)
            self._after_batch()
            if not more:
                return
            left -= n

    def _fill(self, sock: socket.socket) -> tuple[int, bool]:
        """Receive up to a batch of datagrams, one call each; (records received, the socket may hold more)."""
        recv = sock.recv_into
        slots, lens = self._slots, self._lens
        n = 0
        odd = False
        try:
            for slot in slots[: self._n]:
                got = lens[n] = recv(slot, _L, _MSG_TRUNC)
                odd = odd or got != _L
                n += 1
        except BlockingIOError:
            self._odd = odd
            return n, False
        except OSError as exc:  # e.g. an ICMP error queued on the socket
            self._odd = odd
            self._c.drop("socket_error")
            log.debug("recv failed: %s", exc)
            return n, False
        self._odd = odd
        return n, True

    def _fill_gro(self, sock: socket.socket) -> tuple[int, bool]:
        """Receive a batch of coalesced buffers straight into the ring; (records received, the socket may hold more).

        A buffer of 1448-byte segments (DATA) lies in the ring as consecutive records as it
        came, so it is split without a copy: each segment is one record, its length noted
        (a short last segment is a record the fast checks turn away).  A buffer of segments of
        another size (NACKs a sender sent back to back) goes segment by segment to the slow path.
        """
        recvmsg = sock.recvmsg_into
        tails, lens, n_max = self._tails, self._lens, self._n_gro
        # One list per receive is what the call needs; every lens entry is _L unless noted
        # (``_odd``): a batch of whole DATA records then needs no pass over the lengths.
        n = 0
        odd = False
        try:
            while n < n_max:
                got, anc, flags, _ = recvmsg([tails[n]], _CMSG_SPACE)
                if flags & _MSG_TRUNC:  # cannot happen with 64 KiB of room; never take a cut buffer
                    self._c.drop("oversize")
                    continue
                # The UDP_GRO cmsg (the segment size), read inline: this runs once per 64 KiB.
                if anc:
                    level, kind, data = anc[0]
                    seg = (int.from_bytes(data[:4], sys.byteorder) or got
                           if len(anc) == 1 and level == _SOL_UDP and kind == UDP_GRO and len(data) >= 4
                           else gro_segment(anc, got))
                else:
                    seg = got
                if seg == _L:  # DATA-sized segments (or one DATA): consecutive records already
                    k = -(-got // _L)
                    n += k
                    tail = got - (k - 1) * _L
                    if tail != _L:  # a short last segment: a record the fast checks turn away
                        lens[n - 1] = tail
                        odd = True
                elif seg == got:  # one datagram of another size (the slow path names it)
                    lens[n] = got
                    n += 1
                    odd = True
                else:
                    # Segments of another size: each a datagram on its own.  It leaves the
                    # ring's slots as they were (the next receive writes over its bytes).
                    self._slow_segments(tails[n][:got], seg)
        except BlockingIOError:
            self._odd = odd
            return n, False
        except OSError as exc:  # e.g. an ICMP error queued on the socket
            self._odd = odd
            self._c.drop("socket_error")
            log.debug("recvmsg failed: %s", exc)
            return n, False
        self._odd = odd
        return n, True

    def _slow_segments(self, buf: memoryview, seg: int) -> None:
        """Each ``seg``-byte datagram of a coalesced buffer on the slow path (counted as received)."""
        count = 0
        for off in range(0, len(buf), seg):
            part = buf[off : off + seg]
            count += 1
            hdr = self._parse(part, len(part), wire.Opcode.NACK)
            if hdr is not None:
                self._on_nack(hdr)
        self._c.datagrams_received += count

    def receive_gets(self, sock: socket.socket) -> list[tuple[wire.Header, Address]]:
        """The GETs waiting on the holder socket (at most 1024), in arrival order; the rest dropped by reason."""
        if self.gets_gro:
            return self._receive_gets_gro(sock)
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

    def _receive_gets_gro(self, sock: socket.socket) -> list[tuple[wire.Header, Address]]:
        """``receive_gets`` on a socket with UDP GRO: each buffer split into its datagrams by the cmsg's size."""
        buf = self._tails[0]  # the DATA ring was fully processed before this runs; room for 64 KiB
        gets: list[tuple[wire.Header, Address]] = []
        recvmsg = sock.recvmsg_into
        datagrams = 0
        while datagrams < 1024:
            try:
                got, anc, flags, addr = recvmsg([buf], _CMSG_SPACE)
            except BlockingIOError:
                break
            except OSError as exc:
                self._c.drop("socket_error")
                log.debug("recvmsg failed: %s", exc)
                break
            seg = (gro_segment(anc, got) if anc else got) or 1
            if flags & _MSG_TRUNC:
                self._c.drop("oversize")
                continue
            for off in range(0, got, seg):
                datagrams += 1
                n = min(seg, got - off)
                hdr = self._parse(buf[off : off + n], n, wire.Opcode.GET)
                if hdr is not None:
                    gets.append((hdr, addr))
            if got == 0:
                datagrams += 1
                self._parse(buf, 0, wire.Opcode.GET)  # counted as a drop by its reason
        self._c.datagrams_received += datagrams
        return gets

    def _process_batch(self, n: int) -> None:
        """Classify a received batch with array ops; hand each run of one request's DATA over as a view."""
        recs = self._ring[:n]
        hdr = recs["hdr"]
        # version and opcode as one big-endian 16-bit word: one compare instead of two.
        fast = self._ring_vo[:n] == _DATA_VO
        odd = self._odd
        if odd:
            fast &= np.fromiter(self._lens, dtype=np.int64, count=n) == _L
        all_fast = bool(fast.all())
        if not all_fast:
            for i in np.flatnonzero(~fast).tolist():
                self._slow_packet(i)
        if odd:
            self._odd = False
            self._lens[:n] = [_L] * n  # the lengths every receive assumes again (``_fill_gro``)
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
