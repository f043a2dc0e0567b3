"""kvpool over UDP: receiver-driven, windowed, paced chunk transfer with selective retransmit.

One ``Transport`` owns two UDP sockets and one event-loop thread, and composes the parts
that hold the state (the rules and why: docs/design/transport.md):

* the **holder socket**, bound to the agent's kvpool port (``KVPOOL_UDP_PORT`` by default),
  receives GETs and sends DATA, so answers leave from the kvpool port as the wire format
  says: ``hostagent.serving`` decides each GET's answer (DATA queued, or a NACK) and
  ``hostagent.send_queue`` sends what is queued, paced and in turn;
* the **requester socket**, on an ephemeral port, sends GETs and receives DATA and NACKs:
  ``hostagent.fetcher`` takes ``fetch`` calls and admits their requests,
  ``hostagent.transfer`` runs each request (windows, budget, joining, integrity, timers),
  ``hostagent.receive`` drains DATA into a ring and classifies it with numpy;
* ``hostagent.transport_config`` holds the settings, results, errors and counters they share.

Invariants: only the loop thread touches sockets, queues and requests (callers' threads
touch the submit and push queues, ``Flights`` under its lock, and read counters); a
stopped transport fails every transfer in flight (``TransferError``, "transport stopped")
and never leaves a caller waiting.  The loop, each pass: admit submitted calls, turn
pushes into send jobs, drain DATA, answer GETs, send what pacing allows, run the timers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

from hostagent.fetcher import Fetcher
from hostagent.gate import RequesterGate
from hostagent.hints import FabricHints
from hostagent.holder import Holder
from hostagent.receive import DataRing
from hostagent.request_state import Flights
from hostagent.request_state import Request as _Request
from hostagent.send_queue import DrainMeter, SendQueue
from hostagent.serving import Server, merge_gets
from hostagent.transfer import Transfers
from hostagent.transport_config import (
    Address,
    ChunkIntegrityError,
    Counters,
    FetchResult,
    TransferError,
    TransportConfig,
    parse_address,
)
from kvpool.sockets import enable_gro, set_buffers

__all__ = ["Address", "ChunkIntegrityError", "DrainMeter", "FetchResult", "TransferError", "Transport",
           "TransportConfig", "_Request", "merge_gets", "parse_address"]

log = logging.getLogger("kvpool.transport")

_SKB_BYTES: Final = 2304
"""Kernel memory one queued 1440-byte datagram costs against SO_RCVBUF (measured on Linux loopback)."""


class Transport:
    """Both roles of a host agent on UDP: fetch chunks from holders, serve chunks to requesters."""

    def __init__(self, config: TransportConfig | None = None, holder: Holder | None = None,
                 gate: RequesterGate | None = None, hints: FabricHints | None = None) -> None:
        """``gate`` decides which GETs get DATA and how much (``hostagent.gate``); None answers every source."""
        self.config = config or TransportConfig()
        self.holder = holder
        self.gate = gate
        self.hints = hints if hints is not None else FabricHints()
        """What the fabric said of chunks (hot, pooled) and whether switches merge: paths, bookings."""
        self._c = Counters()
        self._queue = SendQueue(self.config, self._c)
        self._server = Server(self.config, self._c, self._queue, holder, gate, self.hints)
        flights = Flights(self.config.share_transfers)
        self._transfers = Transfers(self.config, self._c, self.hints, flights)
        self._fetcher = Fetcher(self.config, self._c, self._transfers, flights, self._running, self._alive,
                                self._wake)
        self._ring = DataRing(self.config.recv_batch, self._c, self._transfers.deliver, self._transfers.on_nack,
                              self._fetcher.grant_all)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hsock: socket.socket | None = None
        self._rsock: socket.socket | None = None
        self._wake_r, self._wake_w = -1, -1

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Bind both sockets and start the loop thread."""
        if self._thread is not None:
            raise RuntimeError("transport already started")
        cfg = self.config
        hsock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rsock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for s, port in ((hsock, cfg.port), (rsock, cfg.fetch_port)):
                set_buffers(s, cfg.sock_buf_bytes)
                s.bind((cfg.host, port))
                s.setblocking(False)
        except OSError:
            hsock.close()
            rsock.close()
            raise
        self._hsock, self._rsock = hsock, rsock
        self._queue.sock, self._transfers.sock = hsock, rsock
        # Segmented sends and coalesced receives: the same datagrams on the wire, a syscall per
        # run instead of per datagram.  Each falls back on its own where refused (logged once).
        if cfg.gso:
            self._queue.use_gso(hsock, cfg.host)
        if cfg.gro:
            self._ring.gro = enable_gro(rsock)
            self._ring.gets_gro = enable_gro(hsock)
            if not self._ring.gro:
                log.warning("UDP GRO refused by the kernel: one receive call per datagram")
        # Without root the kernel caps the buffer at net.core.rmem_max: shrink the in-flight
        # budget to what the buffer really holds, or a burst would overflow it.
        rcvbuf = rsock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        self._transfers.budget.limit = max(16, min(cfg.max_inflight_fragments, rcvbuf * 3 // 4 // _SKB_BYTES))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="kvpool-transport", daemon=True)
        self._thread.start()
        log.info("transport up: kvpool port %s:%d, fetch port %d", cfg.host, self.port, self.fetch_port)

    def stop(self) -> None:
        """Fail transfers in flight, join the loop thread and close the sockets."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for s in (self._hsock, self._rsock):
            if s is not None:
                s.close()
        self._hsock = self._rsock = None
        self._queue.sock = self._transfers.sock = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> Transport:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The holder (kvpool) port actually bound."""
        if self._hsock is None:
            raise RuntimeError("transport not started")
        return int(self._hsock.getsockname()[1])

    @property
    def fetch_port(self) -> int:
        """The requester socket's port (where DATA for our requests arrives)."""
        if self._rsock is None:
            raise RuntimeError("transport not started")
        return int(self._rsock.getsockname()[1])

    @property
    def address(self) -> Address:
        """``(host, port)`` peers send GETs to."""
        return (self.config.host, self.port)

    def _wake(self) -> None:
        if self._wake_w >= 0:
            with contextlib.suppress(BlockingIOError):  # pipe full: the loop is awake anyway
                os.write(self._wake_w, b"x")

    def _running(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ API

    def fetch(self, keys: Sequence[int], holder: Address, *, generation: int = 0,
              timeout: float | None = None, generations: Sequence[int] | None = None) -> list[FetchResult]:
        """Fetch chunks from ``holder``; one ``FetchResult`` per key, in order (never raises for a chunk).

        ``generation`` (0: whatever is current) pins every chunk; ``generations`` pins each
        key on its own (0 for "current"), e.g. to what the directory says is current.
        """
        return self._fetcher.fetch(keys, holder, generation=generation, timeout=timeout, generations=generations)

    def push(self, keys: Sequence[int], to: Address) -> None:
        """Send every fragment of each held chunk in ``keys`` to ``to``, unasked (request id 0).

        This is how a holder fills a switch pool: the DATA crosses the switches on its way
        to ``to`` (the controller's fill sink) and each switch that admitted the chunk
        writes it as it passes.  Chunks not held are skipped (logged).  A push goes only when
        no answer to a GET can, and without the fragments answers carried since it was asked
        for (they passed the switch after the admission and filled it).
        """
        if not self._running():
            raise TransferError("transport is not running")
        self._server.push(keys, to)
        self._wake()

    def fetch_one(self, key: int, holder: Address, *, generation: int = 0,
                  timeout: float | None = None) -> bytes:
        """Fetch one chunk's bytes or raise ``TransferError`` with the reason."""
        res = self.fetch([key], holder, generation=generation, timeout=timeout)[0]
        if res.data is None:
            raise TransferError(res.error or "failed")
        return bytes(res.data)

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        """Counters of both roles, drops by reason, queue and budget state."""
        c = self._c
        drops = c.drops_copy()
        out: dict[str, Any] = {
            "datagrams_received": c.datagrams_received,
            "pushed_fragments": self._server.pushed_fragments,
            "skipped_push_fragments": self._queue.skipped_push_fragments,
            "recv_batches": c.recv_batches,
            "data_received": c.data_received,
            "fragments_stored": c.fragments_stored,
            "duplicates": c.duplicates,
            "gets_sent": c.gets_sent,
            "retransmit_gets": c.retransmit_gets,
            "datagrams_sent": c.datagrams_sent,
            "send_calls": c.send_calls,
            "udp_offload": {"gso": self._queue.gso_segments > 1, "gso_fallback": self._queue.gso_fallback,
                            "gro": self._ring.gro},
            "bytes_sent": c.bytes_sent,
            "send_errors": c.send_errors,
            "nacks_sent": c.nacks_sent,
            "nacks_received": c.nacks_received,
            "busy_received": c.busy_received,
            "busy_retries": c.busy_retries,
            "stall_retransmits": c.stall_retransmits,
            "overtaken_retransmits": c.overtaken_retransmits,
            "gap_retransmits": c.gap_retransmits,
            "past_end_nacks": c.past_end_nacks,
            "reserved_chunks": c.reserved_chunks,
            "reserved_fragments": c.reserved_fragments,
            "reserved_expired": c.reserved_expired,
            "rebound_fragments": c.rebound_fragments,
            "joined_requests": c.joined_requests,
            "joined_fragments": c.joined_fragments,
            "join_reasks": c.join_reasks,
            "reasks_carried": c.reasks_carried,
            "shared_transfers": c.shared_transfers,
            "requests_by_path": dict(c.requests_by_path),
            "hints": self.hints.stats(),
            "requests_completed": c.requests_completed,
            "requests_failed": c.requests_failed,
            "requests_active": len(self._transfers.active),
            "requests_waiting": self._fetcher.waiting(),
            "goodput_bytes": c.goodput_bytes,
            "goodput_bytes_by_path": dict(c.bytes_by_path),
            "integrity": {
                "chunks_verified": c.chunks_verified,
                "generation_restarts": c.generation_restarts,
                "chunks_check_failed": c.chunks_check_failed,
                "fragments_check_failed": c.fragments_check_failed,
                "switch_fragments_check_failed": c.switch_fragments_check_failed,
                "integrity_failures": c.integrity_failures,
            },
            "drops": drops,
            "drops_total": sum(drops.values()),
            "send_queue": len(self._queue),
            "send_queue_fragments": self._queue.queued,
            "drain_rate_bps": round(self._queue.drain.rate),
            "answer_wait": self._queue.waits.summary(),
            "inflight_budget": self._transfers.budget.limit,
            "buffers": self._transfers.buffers.stats(),
        }
        if self.holder is not None:
            out["holder"] = self.holder.stats()
        if self.gate is not None:
            out["gate"] = self.gate.stats()
        return out

    def active_requests(self) -> list[tuple[int, int, int, int]]:
        """``(request_id, chunk_key, fragments received, fragment count or 0 if unknown)`` per transfer."""
        out = []
        for r in list(self._transfers.active.values()):
            reasm = r.reasm
            out.append((r.rid, r.key, 0 if reasm is None else reasm.received_count,
                        0 if reasm is None else reasm.frag_count))
        return out


    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        assert self._hsock is not None and self._rsock is not None
        hsock, rsock = self._hsock, self._rsock
        poller = select.poll()
        hfd, rfd = hsock.fileno(), rsock.fileno()
        poller.register(hfd, select.POLLIN)
        poller.register(rfd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        fetcher, transfers, queue, server, ring = self._fetcher, self._transfers, self._queue, self._server, self._ring
        want_out = False
        try:
            while not self._stop.is_set():
                timeout_ms = self._poll_timeout_ms()
                events = poller.poll(timeout_ms)
                for fd, _ in events:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                fetcher.admit()
                fetcher.mark()
                server.admit_pushes()
                ring.receive_data(rsock)
                server.serve_gets(ring.receive_gets(hsock))
                blocked = queue.send()
                queue.sample_drain(time.monotonic())
                if blocked != want_out:
                    poller.modify(hfd, select.POLLIN | (select.POLLOUT if blocked else 0))
                    want_out = blocked
                transfers.timers()
        except Exception:  # a bug here must not leave fetchers hanging: fail them loudly
            log.exception("transport loop crashed")
            raise
        finally:
            fetcher.fail_all("transport stopped")

    def _poll_timeout_ms(self) -> int:
        if self._fetcher.admit_now():
            return 0
        if self._queue.pending():
            return self._queue.pace_wait_ms()
        return self._transfers.timer_wait_ms()
