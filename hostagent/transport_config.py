"""The transport's shared vocabulary: its settings, results, errors and counters.

Every part of the transport (``hostagent.transfer``, ``hostagent.fetcher``,
``hostagent.receive``, ``hostagent.send_queue``, ``hostagent.serving``) and every caller
(``hostagent.transport`` re-exports the public names) reads these; nothing here does I/O.
``Counters`` are bumped by the loop thread only, per batch on the hot path, except
``drops`` (under ``Counters.lock``, read by ``stats`` from other threads) and
``shared_transfers`` (under the flight lock, ``hostagent.transfer.Flights``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Final

from hostagent.timing import PATHS, FetchTiming
from kvpool import wire
from kvpool.hints import GetPath

_L: Final = wire.DATA_DATAGRAM_LEN
_PACE_TICK_S: Final = 0.002
"""Seconds of sending a pacing bucket holds at least: the loop sleeps in whole milliseconds (poll), and
wakes a little late.  A shallower bucket caps the rate below the one asked for: the demo's holders
paced to 11.25 MB/s with a two-datagram bucket sent 2.9 MB/s (two datagrams per ~1 ms wake-up).  It
stays shallow otherwise: an idle holder's first answer goes out at most this much at once, before
the loop has read the GETs that came with the one it answers (which may make it a duplicate)."""
_PACE_CATCHUP_S: Final = 0.010
"""Seconds of sending a backlogged holder makes up when its loop comes back late: on a busy machine it
does, and receiving between sends takes time, and with only the bucket's 2 ms a holder taking a
replay's single GETs on a 2-core machine sent 0.89 of its rate (its backlogged loop came back 2-20 ms
later some 1,800 times in 25 s); plain's few range GETs left it the full rate.  With 10 ms, the full
rate in both."""
MAX_RETRY_HINT_US: Final = 10_000_000
"""Longest retry hint a holder sends in a BUSY NACK (and a requester believes)."""

Address = tuple[str, int]


def parse_address(text: str) -> Address:
    """``host:port`` to an address tuple; ``ValueError`` with a one-line reason otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 0xFFFF:
        raise ValueError(f"holder address must be host:port, got {text!r}")
    return host, int(port)


class TransferError(RuntimeError):
    """A chunk could not be fetched (NACK, no progress, timeout, transport stopped)."""


class ChunkIntegrityError(TransferError):
    """A chunk failed its integrity checks on every try: nothing is returned for it.

    ``key`` is the chunk; the message names it, the holder and what failed.  The agent
    raises it for the first such chunk of a prefix; its API answers 502.
    """

    def __init__(self, key: int, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """Knobs of a ``Transport``; the defaults suit loopback and a 1500-byte MTU LAN."""

    host: str = "127.0.0.1"
    """Address both sockets bind to."""
    port: int = wire.KVPOOL_UDP_PORT
    """Holder (kvpool) port; 0 picks a free one."""
    fetch_port: int = 0
    """Requester socket port; 0 picks a free one."""
    sock_buf_bytes: int = 32 << 20
    """SO_RCVBUF / SO_SNDBUF asked for (forced past rmem_max when running as root)."""
    rate_bytes_per_s: float = 0.0
    """Holder pacing rate in datagram bytes per second; 0 means unpaced."""
    burst_bytes: int = 256 << 10
    """Token bucket depth when pacing; never less than ``_PACE_TICK_S`` of sending (``pace_depth_bytes``)."""
    window_fragments: int = 2048
    """Most fragments one request has asked for and not yet received."""
    servable_window_fragments: int = 0
    """The same for a chunk the switches pool (0: ``window_fragments``).  A switch answers such
    GETs at once, a window's answers in one burst through each egress queue on the way; a
    software switch's are short (BMv2's hold 64 packets), so a window that fits the holder's
    round trip can overflow them and every lost answer waits a retransmit timeout."""
    max_inflight_fragments: int = 16384
    """Fragments asked for and not yet received, over all requests (keep under the receive buffer)."""
    max_active_requests: int = 64
    """Requests transferring at once; the others wait their turn."""
    retransmit_timeout_s: float = 0.2
    """Silence before a request re-asks for its missing fragments (doubles per silent round)."""
    give_up_s: float = 3.0
    """Silence after which a request fails."""
    recv_batch: int = 256
    """Datagrams received per batch before they are processed together."""
    send_quantum: int = 64
    """DATA datagrams a request's answers send before the next request's turn (``SendQueue._send_lanes``)."""
    max_fragments_per_get: int = 4096
    """Largest range one GET is served for (longer ones are clamped)."""
    single_fragment_gets: bool = False
    """Ask for every chunk with one GET per fragment carrying reply room (what a switch can serve
    or coalesce) instead of taking each chunk's path from the hints."""
    share_transfers: bool = True
    """A ``fetch`` of a chunk this host is already fetching from the same holder (same generation
    pin) waits for that transfer instead of starting another: requests that share a prompt
    prefix on one node fetch it once (False: every call transfers its own copy)."""
    max_queued_fragments: int = 65536
    """DATA a holder queues for sending (about 94 MB) before it answers GETs with NACK BUSY."""
    max_queue_s: float = 1.0
    """A paced holder answers GETs BUSY once its queue holds more than this many seconds of
    sending at ``rate_bytes_per_s`` (0: only ``max_queued_fragments`` bounds the queue)."""
    gather_s: float = 0.0
    """Where the switches merge, a holder whose queue was empty starts its answer to a range GET for
    the head of a chunk the hints call hot this long after its queue began to fill (``Server.serve_get``,
    ``SendJob.not_before``), so the GETs of the other requesters of its wave reach the switch while
    the answer is pending and miss nothing (0: at once)."""
    integrity_retries: int = 3
    """Rounds of re-asking for a chunk (or its fragments) that failed its checks before the fetch fails."""
    gso: bool = True
    """Holder: send runs of DATA as segmented sends (UDP GSO) where the kernel and the path take
    them, one call per datagram otherwise (``SendQueue.use_gso``; the wire sees the same datagrams)."""
    gro: bool = True
    """Receive coalesced datagrams (UDP GRO) on both sockets where the kernel offers it (``hostagent.receive``)."""

    def __post_init__(self) -> None:
        checks = {
            "port": 0 <= self.port <= 0xFFFF,
            "fetch_port": 0 <= self.fetch_port <= 0xFFFF,
            "sock_buf_bytes": self.sock_buf_bytes > 0,
            "rate_bytes_per_s": self.rate_bytes_per_s >= 0,
            "burst_bytes": self.burst_bytes >= _L,
            "window_fragments": 2 <= self.window_fragments <= wire.MAX_FRAGMENTS,
            "servable_window_fragments": self.servable_window_fragments == 0
            or 2 <= self.servable_window_fragments <= wire.MAX_FRAGMENTS,
            "max_active_requests": self.max_active_requests >= 1,
            "max_inflight_fragments": self.max_inflight_fragments >= 1,
            "retransmit_timeout_s": self.retransmit_timeout_s > 0,
            "give_up_s": self.give_up_s > 0,
            "recv_batch": self.recv_batch >= 1,
            "send_quantum": self.send_quantum >= 1,
            "max_fragments_per_get": self.max_fragments_per_get >= 1,
            "max_queued_fragments": self.max_queued_fragments >= 1,
            "max_queue_s": 0 <= self.max_queue_s <= 60,
            "gather_s": 0 <= self.gather_s <= 1,
            "integrity_retries": self.integrity_retries >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid transport setting {bad[0]}={getattr(self, bad[0])!r}")

    @property
    def pace_depth_bytes(self) -> float:
        """The pacing bucket's depth: ``burst_bytes``, or ``_PACE_TICK_S`` of sending at the rate if more."""
        return max(float(self.burst_bytes), self.rate_bytes_per_s * _PACE_TICK_S)

    @property
    def pace_catchup_bytes(self) -> float:
        """What a backlogged holder's bucket may hold: the depth, or ``_PACE_CATCHUP_S`` of sending if more."""
        return max(self.pace_depth_bytes, self.rate_bytes_per_s * _PACE_CATCHUP_S)


@dataclass(slots=True)
class FetchResult:
    """Outcome of fetching one chunk: its bytes, or the error that stopped it."""

    key: int
    data: memoryview | None = None
    generation: int = 0
    error: str | None = None
    status: wire.Status | None = None
    retransmit_rounds: int = 0
    integrity: bool = False
    """The chunk failed its integrity checks on every try (``error`` says how)."""
    timing: FetchTiming = field(default_factory=FetchTiming)
    """Where the transfer's time went (``hostagent.timing``): set as its state changes, complete once it ended."""

    @property
    def ok(self) -> bool:
        """True when the chunk arrived complete."""
        return self.data is not None



@dataclass(slots=True)
class Counters:
    """Transport counters, bumped by the loop thread (per batch on the hot path)."""

    datagrams_received: int = 0
    recv_batches: int = 0
    data_received: int = 0
    fragments_stored: int = 0
    duplicates: int = 0
    gets_sent: int = 0
    retransmit_gets: int = 0
    datagrams_sent: int = 0
    send_calls: int = 0
    """Send calls DATA took (fewer than ``datagrams_sent`` with GSO: one per segmented run)."""
    bytes_sent: int = 0
    send_errors: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    busy_received: int = 0
    busy_retries: int = 0
    stall_retransmits: int = 0
    overtaken_retransmits: int = 0
    """Fragments re-asked because fragments asked after them arrived a reorder window ago."""
    gap_retransmits: int = 0
    """Fragments re-asked because the holder's answer passed over them a reorder window ago."""
    past_end_nacks: int = 0
    reserved_chunks: int = 0
    """Chunks whose length probe was admitted with room kept for their rest (``Server._reserve``)."""
    reserved_fragments: int = 0
    """Fragments admitted into room kept for them (never refused)."""
    reserved_expired: int = 0
    """Fragments of kept room whose GETs did not come in time."""
    rebound_fragments: int = 0
    """Coalesced DATA with another request's id, taken by this host's request for the chunk (``Transfers._rebind``)."""
    joined_requests: int = 0
    """Requests a switch joined to another requester's answer in progress (``Transfers._join``)."""
    joined_fragments: int = 0
    """Fragments stored from switches' copies of other requesters' answers (``COALESCED``)."""
    join_reasks: int = 0
    """Fragments a joined request asked for again because they passed before it joined."""
    reasks_carried: int = 0
    """Holder: fragments a joiner missed, sent inside the answer it joined (``Server._carrier``)."""
    shared_transfers: int = 0
    """Chunks a ``fetch`` took from another call's transfer in flight (bumped under ``Flights.lock``)."""
    requests_by_path: dict[str, int] = field(default_factory=lambda: {str(p): 0 for p in GetPath})
    requests_completed: int = 0
    requests_failed: int = 0
    goodput_bytes: int = 0
    bytes_by_path: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    """Goodput by how its fragments came (``hostagent.timing.PATHS``): holder, coalesced, switch."""
    chunks_verified: int = 0
    generation_restarts: int = 0
    chunks_check_failed: int = 0
    fragments_check_failed: int = 0
    switch_fragments_check_failed: int = 0
    integrity_failures: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Guards ``drops``, which ``stats`` copies from another thread."""

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` datagrams (or records) dropped for ``reason``."""
        with self.lock:
            self.drops[reason] = self.drops.get(reason, 0) + n

    def drops_copy(self) -> dict[str, int]:
        """A snapshot of the drops by reason (any thread)."""
        with self.lock:
            return dict(self.drops)

