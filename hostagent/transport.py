"""kvpool over UDP: receiver-driven, windowed, paced chunk transfer with selective retransmit.

One ``Transport`` owns two UDP sockets and one event-loop thread:

* the **holder socket** bound to the agent's kvpool port (``KVPOOL_UDP_PORT`` by
  default) receives GETs and sends DATA (so responses leave from the kvpool port, as the
  wire format says);
* the **requester socket** on an ephemeral port sends GETs to holders and receives their
  DATA and NACKs.

Requester side.  ``fetch`` turns each chunk key into a request with its own 32-bit
``request_id``.  A request asks for a *window* of fragments with one range GET and asks
for the next half window whenever half of what it asked for has arrived, so at most
``window_fragments`` fragments per request are in flight.  On top, all requests share a
budget of ``max_inflight_fragments`` asked for and not yet received, sized to what the
receive buffer holds (about 2.3 KB of kernel memory per 1440-byte datagram: the
default 32 MiB, doubled by the kernel, holds about 29,000), so a burst
from every holder at once still fits and the receiver does not drop; requests beyond
``max_active_requests`` or the budget wait their turn, taken from the ``fetch`` calls in
round robin (a call with nothing transferring always gets one request started), so a huge
or stuck call never holds a small one behind it.  Windows are large because on a
busy host every round trip waits for both processes to be scheduled: the data in flight
must cover that, not just the wire's round trip.

DATA lands in a ``Reassembler`` keyed by the request id (the chunk key is checked too;
a switch's replica whose id is stale goes to this host's request for its chunk, ``_rebind``).
When neither the request nor anything else from its holder has made progress for a
retransmit timeout (doubling per silent round), it re-asks for exactly the runs
``Reassembler.missing_ranges`` reports, with the ``RETRANSMIT`` flag.  Silence is judged
per holder because a holder serves its queue in order: while it still streams other
requests' fragments, ours are queued, not lost, and re-asking would only add duplicates.
A request whose own fragments stop arriving for ``4 x retransmit_timeout_s`` re-asks even
while its holder streams to others: a switch may have absorbed its GETs into a pending
slot whose answer never came.  After ``give_up_s`` in which nothing at all came from the
holder (no DATA, no NACK) the request fails with a message that names the chunk, the
holder and how far it got; a holder that answers, even ``BUSY``, is reachable, and the
request waits for it until the caller's deadline.  A NACK fails the request with the
holder's ``Status``, except ``BUSY`` (push back: re-asked after the holder's retry hint,
jittered unless the switches merge, or the retransmit timeout) and a ``BAD_RANGE`` past
fragment 0 (a guessed length was too long: the real one comes with the first DATA).

Paths (``hostagent.hints``, ``kvpool.hints``).  Each chunk is asked for by range GETs, the
cheap path, which switches coalesce per chunk (a hot chunk, ``single`` in the hints, too),
unless the hints say the switch pool holds it (``servable``): then by single-fragment GETs
with reply room, which a switch can answer.  A hint with the chunk's length lets their first
window go out at once; without one the requester asks for fragment 0 first to learn the
length.  Where the switches merge, a servable chunk is asked for a whole window at a time,
past the shared budget, so its requesters ask for each fragment at about the same moment
(``_shared_path``); while its holder refuses, such a burst starts with one GET (``_burst``).
``single_fragment_gets`` forces every chunk onto the servable path.

Joining (p4/include/coalesce.p4). Where the switches merge, a range GET for a chunk whose
answer is already crossing a switch joins it there: the switch copies the rest of that
answer (``COALESCED``) to the joiner, which counts the whole chunk as asked, outside the
shared budget, and asks for what it lacks below the copies it has seen with ``RETRANSMIT |
COALESCED`` (``_join``; a short one: COALESCED only when it is at most a quarter of the
chunk). The holder sends such a re-ask inside the answer it joined, first in that answer's
lane and once for all joiners (``_carrier``), so the switches copy it to every joiner. A
joined request whose copies stop (the owner failed or waits for its own budget) asks for the
rest itself after ``_join_patience_s`` of its own silence.

Integrity.  A chunk is handed out only after it passed its checks (docs/design/correctness.md):
once every fragment is in, a serialized chunk is checked as a whole against the checksum
it carries (``hostagent.envelope``, one xxh3 pass, the common case), and where that fails,
or the bytes are not a serialized chunk, every fragment is checked against the ``check``
its writer put in its header.  Fragments that fail are dropped (counted, ``bad_check``),
and asked for again; with ``NO_CACHE`` (so the holder, not a switch, answers) when one of
them was served by a switch, and on every later round.  A chunk whose fragments all pass
but which fails as a whole (fragments of two contents under one identity, or a holder
whose copy is damaged) is fetched again from the holder with ``NO_CACHE``.  After
``integrity_retries`` such rounds the request fails with an error that names the chunk
(``FetchResult.integrity``), never with wrong bytes.

Holder side.  A GET is answered from a ``Holder`` (``hostagent.holder``): DATA records
built by ``fragment()`` in one numpy array (from a pool of arrays), queued as a send job;
the requests with jobs queued are served round robin in quanta (each request's jobs in
order; answers to single GETs that waited the queue bound first), paced by a token bucket
(bytes/s) when a rate is set.  Adjacent single-fragment GETs of one request are merged
into one range first (``merge_gets``).  The queue is bounded: past ``max_queued_fragments``,
or past ``max_queue_s`` of sending at the rate it drains at (the pacing rate, or less when
this host cannot keep it: ``DrainMeter``), GETs are answered ``BUSY`` with a retry hint (the
time the queue takes to drain to half the bound), so overload waits at the requesters
instead of in a queue whose delay outgrows every timeout.  Where the switches merge, the
hint is a booking (``_retry_hint_us``: every requester refused for a chunk comes back at one
instant, chunks one after another at the drain rate), and a chunk is admitted or refused
whole: once its first single GETs are admitted the queue keeps room for the rest
(``_reserve``).  Pushes (``push``) are sent only when no answer can go and do not count
against the bound.  A NACK answering a run of single-fragment GETs is sent once per
fragment, so a switch that coalesced them releases every pending slot.  Nothing waits to
gather duplicates (switches coalesce range GETs per chunk): an answer goes as soon as the
queue lets it, and a lone GET of fragment 0 (a requester learning a chunk's length) before
the other queued answers.  With a ``RequesterGate`` (``hostagent.gate``) a GET from a
source the holder cannot verify gets nothing (``drops["unverified_source"]``), one over its
source's budget gets ``BUSY``, and an answer never exceeds the requester's window.

Hot path.  No Python object per packet beyond what a socket call needs: DATA is received
with ``recv_into`` straight into slots of a preallocated ``DATA_PACKET_DTYPE`` ring
(``MSG_TRUNC`` reveals oversize datagrams), a batch is classified with numpy (length,
version, opcode), split into runs of one request (views) and handed to
``Reassembler.add_batch``; DATA is sent as
memoryview slices of the record array.  Only packets that fail the fast checks (garbage,
NACKs) take the per-packet slow path, where ``kvpool.wire.parse`` names the reason and it
is counted in ``stats()["drops"]``.  A bad packet is dropped on its own: it can never
mark a fragment of another transfer as received (``Reassembler`` validates every record).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import select
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from hostagent import envelope
from hostagent.fragment import Reassembler, runs
from hostagent.gate import RequesterGate
from hostagent.hints import FabricHints
from hostagent.holder import Holder, stamp
from hostagent.timing import AnswerWaits, FetchTiming
from kvpool import wire
from kvpool.hints import GetPath
from kvpool.sockets import set_buffers

log = logging.getLogger("kvpool.transport")

_L: Final = wire.DATA_DATAGRAM_LEN
_MSG_TRUNC: Final = getattr(socket, "MSG_TRUNC", 0x20)
_RECENT_REQUESTS: Final = 4096
_POOL_RECORDS: Final = 1 << 15
"""Most DATA records (about 47 MB) a holder keeps in its pool of free send arrays."""
_DATA_VO: Final = (wire.KVPOOL_VERSION << 8) | wire.Opcode.DATA
"""version and opcode bytes of a DATA header read as one big-endian u16."""
_SKB_BYTES: Final = 2304
"""Kernel memory one queued 1440-byte datagram costs against SO_RCVBUF (measured on Linux loopback)."""
_MAX_GENERATION_CHANGES: Final = 3
"""Times a transfer follows its holder to a newer generation before it fails (a republish storm)."""
_MIN_GRANT: Final = 32
"""Fewest fragments a request asks for in one more window while some of its fragments are in flight."""
_SLOW_TRANSFER_RTOS: Final = 4
"""A transfer that took this many retransmit timeouts is logged (INFO) with how it spent its time."""
_DRAIN_WINDOW_S: Final = 0.25
"""Seconds of backlogged sending over which a holder measures the rate its queue drains at."""
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
_STALL_RTOS: Final = 4
"""Retransmit timeouts of a request's own silence after which it re-asks even while its holder streams."""
_REORDER_RTOS: Final = 0.5
_CARRIED_SHARE: Final = 4
"""A joiner asks for what it missed to ride the answer it joined only when that is at most this
share of the chunk (``Transport._join``); longer, the holder answers it alone."""
_JOIN_PATIENCE_RTOS: Final = 1.0
"""Retransmit timeouts of a joined request's own silence after which it asks the holder itself (not
``_STALL_RTOS``): the answer it joined is another requester's, paced by its windows, and may stop."""
"""Retransmit timeouts after which a fragment overtaken by a later-asked one counts as lost (``_resend_overtaken``)."""
_MAX_RETRY_HINT_US: Final = 10_000_000
"""Longest retry hint a holder sends in a BUSY NACK (and a requester believes)."""
_BOOKING_EARLY_S: Final = 0.05
"""A booked GET may come back this early (or late) and still find its room kept."""
_RESERVE_SLACK_S: Final = 0.1
"""Beyond the queue bound, how long the room kept for a chunk's rest waits for its GETs."""
_BOOKED_CHUNKS: Final = 1 << 16
"""Chunks with a booking a holder remembers before it forgets the ones whose time has passed."""

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
    """DATA datagrams a request's answers send before the next request's turn (``Transport._send_lanes``)."""
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
    integrity_retries: int = 3
    """Rounds of re-asking for a chunk (or its fragments) that failed its checks before the fetch fails."""

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


@dataclass(eq=False, slots=True)
class _Request:
    """Requester state of one chunk transfer (owned by the loop thread)."""

    rid: int
    key: int
    holder: Address
    generation: int
    result: FetchResult
    done: threading.Event
    deadline: float
    reasm: Reassembler | None = None
    asked_hi: int = 0
    last_progress: float = 0.0
    next_retx: float = 0.0
    rto: float = 0.0
    refused: bool = False
    """The holder answered BUSY: re-ask when ``next_retx`` comes even while it streams to others."""
    path: GetPath = GetPath.RANGE
    """How the request asks for its fragments (the hints, re-read at every GET)."""
    busy: int = 0
    """BUSY answers it got (the holder is there and pushes back)."""
    started: float = 0.0
    """When its first GET went out (monotonic)."""
    check_rounds: int = 0
    """Times the chunk failed its checks and was (partly) asked for again."""
    generation_changes: int = 0
    """Times the chunk moved to a newer generation while it was being fetched."""
    no_cache: bool = False
    """Ask with NO_CACHE from now on: a switch's copy failed, or a retry must reach the holder."""
    call: _Call | None = None
    """The ``fetch`` call this request belongs to (its turn in the admission round robin)."""
    expired: bool = False
    """It ended because its caller's deadline passed (calls sharing it with later deadlines go on)."""
    shared: bool = False
    """Another ``fetch`` call joined it: every call, its own included, gets a read-only view."""
    asked_at: npt.NDArray[np.float64] | None = None
    """When each fragment was last asked for by a single GET (monotonic; 0: not asked singly)."""
    answered_ask: float = 0.0
    """The latest ask among the fragments that have arrived."""
    overtaken: collections.deque[tuple[float, float]] = field(default_factory=collections.deque)
    """``(arrival, answered_ask)`` each time ``answered_ask`` moved on, oldest first."""
    settled_ask: float = 0.0
    """``answered_ask`` as of a reorder window ago: a fragment asked before it and still missing is lost."""
    probe: int = 0
    """0, or 1 while the one GET a burst starts with is out (its holder refused lately), 2 once it was
    answered and the holder keeps room for the rest of the chunk (``Transport._burst``)."""
    free: bool = False
    """Started on the shared path (``Transport._shared_path``): its fragments in flight are outside the
    shared budget, so they do not starve the range requests (``Transport._room``)."""
    refused_runs: list[tuple[int, int]] = field(default_factory=list)
    """``[start, end)`` runs of fragments the holder refused since the last re-ask of refused ones:
    what a ``BUSY`` retry asks for again (not the fragments of GETs it admitted, still on their way)."""
    joined: bool = False
    """A switch joined its GET to another requester's answer for the chunk (``Transport._join``)."""
    reasked_hi: int = 0
    """Joined: the fragments below this that it lacked have been asked for again (``Transport._join``)."""


@dataclass(eq=False, slots=True)
class _Call:
    """One ``fetch`` call's requests that wait for a transfer slot, and how many of its requests transfer."""

    waiting: collections.deque[_Request]
    active: int = 0


@dataclass(eq=False, slots=True)
class _SendJob:
    """DATA records waiting to go to one address."""

    records: npt.NDArray[np.void]
    view: memoryview
    addr: Address
    pos: int = 0
    count: int = 0
    base: npt.NDArray[np.void] | None = None
    """The pooled array ``records`` is a slice of, returned to the pool when the job is done."""
    key: int = 0
    get: wire.Header | None = None
    """The GET it answers (the first of a merged run), None for a push."""
    first: int = 0
    """Fragment index of ``records[0]``."""
    queued_at: float = 0.0
    """Monotonic time it was queued, for answers to single GETs (``Transport._send_aged``)."""
    carried: bool = False
    """It carries what joiners of its owner's answer missed (``Transport._carrier``), not what the owner asked."""
    stamp: tuple[int, int] | None = None
    """``(request id, flags)`` written into each quantum before it is sent, when ``records``
    are the holder's kept records (shared with other answers of the chunk); None: its own."""
    enqueued: float = 0.0
    """Monotonic time it was queued (``AnswerWaits``: how long an answer waited for its first DATA)."""

    @property
    def owner(self) -> tuple[Address, int] | None:
        """Whose request this answers, ``(requester, request id)``; None for a push."""
        return None if self.get is None else (self.addr, self.get.request_id)

    @property
    def ranged(self) -> bool:
        """Whether it answers a range GET (what plain forwarding asks with), not single ones or a push."""
        return self.get is not None and self.get.frag_count > 1


class _Lanes:
    """Answers queued to send, by the request they answer: each request's in the order they were queued."""

    def __init__(self) -> None:
        self.by_owner: dict[tuple[Address, int] | None, collections.deque[_SendJob]] = {}
        self.order: collections.deque[tuple[Address, int] | None] = collections.deque()
        """Requests with answers queued, in round-robin order (the next to send first)."""

    def append(self, job: _SendJob, front: bool = False) -> None:
        """Queue ``job`` last in its request's lane (``front``: first, before what the lane holds)."""
        owner = job.owner
        lane = self.by_owner.get(owner)
        if lane is None:
            lane = self.by_owner[owner] = collections.deque()
            self.order.append(owner)
        if front:
            lane.appendleft(job)
        else:
            lane.append(job)

    def remove(self, job: _SendJob) -> None:
        """Take a finished job out; its request leaves the round once it has nothing left."""
        owner = job.owner
        lane = self.by_owner[owner]
        lane.remove(job)
        if not lane:
            del self.by_owner[owner]
            if self.order[0] == owner:
                self.order.popleft()  # the usual case: it finished in its own turn
            else:
                self.order.remove(owner)

    def __len__(self) -> int:
        return sum(len(lane) for lane in self.by_owner.values())

    def __bool__(self) -> bool:
        return bool(self.order)


@dataclass(slots=True)
class _Counters:
    """Transport counters, bumped by the loop thread (per batch on the hot path)."""

    datagrams_received: int = 0
    recv_batches: int = 0
    data_received: int = 0
    fragments_stored: int = 0
    duplicates: int = 0
    gets_sent: int = 0
    retransmit_gets: int = 0
    datagrams_sent: int = 0
    bytes_sent: int = 0
    send_errors: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    busy_received: int = 0
    busy_retries: int = 0
    stall_retransmits: int = 0
    overtaken_retransmits: int = 0
    """Fragments re-asked because fragments asked after them arrived a reorder window ago."""
    past_end_nacks: int = 0
    reserved_chunks: int = 0
    """Chunks whose length probe was admitted with room kept for their rest (``_reserve``)."""
    reserved_fragments: int = 0
    """Fragments admitted into room kept for them (never refused)."""
    reserved_expired: int = 0
    """Fragments of kept room whose GETs did not come in time."""
    rebound_fragments: int = 0
    """Coalesced DATA with another request's id, taken by this host's request for the chunk (``_rebind``)."""
    joined_requests: int = 0
    """Requests a switch joined to another requester's answer in progress (``_join``)."""
    joined_fragments: int = 0
    """Fragments stored from switches' copies of other requesters' answers (``COALESCED``)."""
    join_reasks: int = 0
    """Fragments a joined request asked for again because they passed before it joined."""
    reasks_carried: int = 0
    """Holder: fragments a joiner missed, sent inside the answer it joined (``_carrier``)."""
    shared_transfers: int = 0
    """Chunks a ``fetch`` took from another call's transfer in flight (bumped under ``_flight_lock``)."""
    requests_by_path: dict[str, int] = field(default_factory=lambda: {str(p): 0 for p in GetPath})
    requests_completed: int = 0
    requests_failed: int = 0
    goodput_bytes: int = 0
    chunks_verified: int = 0
    generation_restarts: int = 0
    chunks_check_failed: int = 0
    fragments_check_failed: int = 0
    switch_fragments_check_failed: int = 0
    integrity_failures: int = 0
    drops: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class DrainMeter:
    """The rate a send queue drains at (bytes/s), measured only while it stays backlogged.

    Over windows of ``window_s`` seconds in which the queue never ran empty, the bytes sent
    per second, smoothed (EWMA, 0.3 for the newest window).
    """

    window_s: float = _DRAIN_WINDOW_S
    rate: float = 0.0
    """The smoothed rate; 0 until one window was measured."""
    _t0: float = 0.0
    _sent0: int = 0

    def sample(self, now: float, backlogged: bool, sent_bytes: int) -> None:
        """Note the queue's state at ``now`` and the bytes sent so far (a counter)."""
        if not backlogged:
            self._t0 = 0.0
            return
        if self._t0 == 0.0:
            self._t0, self._sent0 = now, sent_bytes
            return
        dt = now - self._t0
        if dt >= self.window_s:
            rate = (sent_bytes - self._sent0) / dt
            self.rate = rate if self.rate <= 0 else 0.7 * self.rate + 0.3 * rate
            self._t0, self._sent0 = now, sent_bytes


def merge_gets(gets: Sequence[tuple[wire.Header, Address]], cap: int) -> list[tuple[wire.Header, int, int, Address]]:
    """Runs of GETs to serve as ``(first GET, first fragment, count, address)``, each at most ``cap`` long.

    Consecutive GETs of one request for adjacent fragments (what a requester on the
    servable path sends) become one range, so the holder makes one ``fragment()``
    call and one send job instead of one per fragment; the requester gets the same DATA.
    A single GET never joins a range GET (nor a range a run of singles): a run of single
    GETs is answered as they were asked, first once it waited the queue bound
    (``Transport._send_aged``) and refused one NACK per fragment (``Transport._nack_run``),
    since a switch may hold a pending slot for it, other requesters' GETs absorbed into it.
    """
    out: list[tuple[wire.Header, int, int, Address]] = []
    i = 0
    while i < len(gets):
        hdr, addr = gets[i]
        first, count = hdr.frag_index, min(hdr.frag_count, cap)
        single = hdr.frag_count == 1
        j = i + 1
        while j < len(gets) and count < cap:
            nxt, naddr = gets[j]
            if (naddr != addr or nxt.chunk_key != hdr.chunk_key or nxt.request_id != hdr.request_id
                    or nxt.generation != hdr.generation or nxt.frag_index != first + count
                    or (nxt.frag_count == 1) != single or (nxt.flags ^ hdr.flags) & wire.Flag.NO_CACHE):
                break
            count += min(nxt.frag_count, cap - count)
            j += 1
        out.append((hdr, first, count, addr))
        i = j
    return out


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
        self._c = _Counters()
        self._stats_lock = threading.Lock()
        self._submit: collections.deque[_Call] = collections.deque()
        # Chunks to push unasked (fill on pass), as (key, address); the loop turns them into send jobs.
        self._pushes: collections.deque[tuple[int, Address]] = collections.deque()
        # Holder: queued answers and pushes by chunk (a push's fill watch ends with its last push, ``_job_done``).
        self._jobs_by_key: dict[int, list[_SendJob]] = {}
        self._drain = DrainMeter()
        self._waits = AnswerWaits()  # how long answers waited in the queue (``_note_first_answer``)
        self.pushed_fragments = 0
        self.skipped_push_fragments = 0
        # Fetch calls with requests waiting for a transfer slot, in round-robin order.
        self._pending: collections.deque[_Call] = collections.deque()
        self._active: dict[int, _Request] = {}
        # Transfers in flight by (chunk, holder, generation pin): a fetch of the same joins it.
        self._flights: dict[tuple[int, Address, int], _Request] = {}
        self._flight_lock = threading.Lock()
        self._recent: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._jobs = _Lanes()
        # Answers to single GETs in the order they were queued: a switch waits for them (``_send_aged``).
        self._aged: collections.deque[_SendJob] = collections.deque()
        # Pushes (a fill asked for by the controller): sent only when no answer can go (``_add_job``).
        self._background: collections.deque[_SendJob] = collections.deque()
        self._background_queued = 0
        # Chunks with a push queued, per fill sink: which of their fragments an answer carried
        # since that push was asked for (they filled the switch on pass, ``_skip_redundant_pushes``).
        self._fill_watch: dict[int, dict[Address, npt.NDArray[np.bool_]]] = {}
        # Answers to a lone GET of fragment 0, sent before the other jobs (``_add_job``).
        self._probes: collections.deque[_SendJob] = collections.deque()
        self._inflight = 0
        self._free_inflight = 0  # of ``_inflight``: fragments of requests outside the budget (``_Request.free``)
        # In-flight fragments and active requests when waiting calls were last admitted.
        self._admit_mark = (0, 0)
        self._queued = 0
        self._range_queued = 0  # of ``_queued``: answers to range GETs (``_SendJob.ranged``)
        self._starved = False
        self._record_pool: dict[int, list[npt.NDArray[np.void]]] = {}
        self._allocated: npt.NDArray[np.void] | None = None  # the last array _alloc_records gave out
        self._pooled_records = 0
        self._budget = self.config.max_inflight_fragments
        self._holder_progress: dict[Address, float] = {}
        # Until when each holder counts as full (it answered BUSY): bursts start with one GET.
        self._refusing_until: dict[Address, float] = {}
        # Where the switches merge, refused GETs are told to come back at booked times: the
        # next free time of the holder's calendar, and each chunk's refused GETs all at one.
        self._booked_until = 0.0
        self._rendezvous: dict[int, tuple[float, int, int]] = {}  # chunk -> (when, fragments booked: span)
        # Where the switches merge, a chunk whose length probe was answered keeps room in the
        # queue for the rest of it (``_reserve``): chunk -> (until, fragments), oldest first.
        self._reserved: collections.OrderedDict[int, tuple[float, int]] = collections.OrderedDict()
        self._reserved_total = 0
        self._next_rid = int.from_bytes(os.urandom(4), "big") or 1
        self._rid_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tokens = self.config.pace_depth_bytes
        self._backlogged = False  # whether the last send pass left answers only the tokens held back
        self._last_refill = time.monotonic()
        n = self.config.recv_batch
        self._ring = np.zeros(n, dtype=wire.DATA_PACKET_DTYPE)
        # Strided view of each slot's (version, opcode) bytes as one big-endian u16 (no copy).
        self._ring_vo: npt.NDArray[np.uint16] = np.ndarray((n,), dtype=">u2", buffer=self._ring.data, strides=(_L,))
        raw = self._ring.view(np.uint8).data
        # One memoryview per slot, made once, so receiving creates no per-packet views.
        self._slots = [raw[i * _L : (i + 1) * _L] for i in range(n)]
        self._lens = [0] * n
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
        # Without root the kernel caps the buffer at net.core.rmem_max: shrink the in-flight
        # budget to what the buffer really holds, or a burst would overflow it.
        rcvbuf = rsock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        self._budget = max(16, min(cfg.max_inflight_fragments, rcvbuf * 3 // 4 // _SKB_BYTES))
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

    # ------------------------------------------------------------------ requester API

    def _new_rid(self) -> int:
        with self._rid_lock:
            rid = self._next_rid
            self._next_rid = (rid % 0xFFFF_FFFF) + 1  # never 0, wraps within u32
            return rid

    def fetch(self, keys: Sequence[int], holder: Address, *, generation: int = 0,
              timeout: float | None = None, generations: Sequence[int] | None = None) -> list[FetchResult]:
        """Fetch chunks from ``holder``; one ``FetchResult`` per key, in order (never raises for a chunk).

        ``generation`` (0: whatever is current) pins every chunk; ``generations`` pins each
        key on its own (0 for "current"), e.g. to what the directory says is current.
        """
        if self._thread is None or self._stop.is_set():
            raise TransferError("transport is not running")
        for key in keys:
            if not 0 <= key <= wire.FIELD_BY_NAME["chunk_key"].max:
                raise ValueError(f"chunk key {key} does not fit 64 bits")
        gens = [generation] * len(keys) if generations is None else list(generations)
        if len(gens) != len(keys):
            raise ValueError(f"{len(gens)} generations for {len(keys)} keys")
        for g in gens:
            if not 0 <= g <= wire.FIELD_BY_NAME["generation"].max:
                raise ValueError(f"generation {g} does not fit 32 bits")
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        call = _Call(collections.deque())
        # Per key: our own request, or the one in flight we share (another call's transfer).
        reqs: list[tuple[_Request, bool]] = []
        with self._flight_lock:
            for key, gen in zip(keys, gens, strict=True):
                flight = (key, holder, gen)
                lead = self._flights.get(flight) if self.config.share_transfers else None
                if lead is not None:
                    self._c.shared_transfers += 1
                    lead.shared = True
                    reqs.append((lead, False))
                    continue
                r = _Request(self._new_rid(), key, holder, gen, FetchResult(key), threading.Event(), deadline,
                             call=call)
                if self.config.share_transfers:
                    self._flights[flight] = r
                call.waiting.append(r)
                reqs.append((r, True))
        if call.waiting:
            self._submit.append(call)
            self._wake()
        return [self._outcome(r, own, deadline) for r, own in reqs]

    def _outcome(self, r: _Request, own: bool, deadline: float) -> FetchResult:
        """Wait for ``r`` and return what it means for this call (a shared transfer is this call's too)."""
        while not r.done.wait(0.5 if own else max(0.0, min(0.5, deadline - time.monotonic()))):
            # The loop enforces an own request's deadline; this wait only guards against a dead loop thread.
            if self._thread is None or not self._thread.is_alive():
                return replace(r.result, data=None, error="transport stopped")
            if not own and time.monotonic() >= deadline:
                return FetchResult(r.key, error=f"chunk {r.key:#018x}: timed out, the caller's deadline passed "
                                                "(waiting for this host's transfer of the same chunk)")
        if own:
            if r.shared and r.result.data is not None:
                r.result.data = r.result.data.toreadonly()
            return r.result
        res = r.result
        if res.data is None and r.expired and time.monotonic() < deadline:
            # The call that owned the transfer gave up at its own, earlier deadline: ours goes on.
            try:
                return self.fetch([r.key], r.holder, generation=r.generation, timeout=deadline - time.monotonic())[0]
            except TransferError as exc:  # stopped meanwhile
                return FetchResult(r.key, error=str(exc))
        # The bytes passed the transfer's checks; every call gets a read-only view of them.
        return replace(res, data=None if res.data is None else res.data.toreadonly(),
                       timing=replace(res.timing, shared=True))

    def push(self, keys: Sequence[int], to: Address) -> None:
        """Send every fragment of each held chunk in ``keys`` to ``to``, unasked (request id 0).

        This is how a holder fills a switch pool: the DATA crosses the switches on its way
        to ``to`` (the controller's fill sink) and each switch that admitted the chunk
        writes it as it passes.  Chunks not held are skipped (logged).  A push goes only when
        no answer to a GET can, and without the fragments answers carried since it was asked
        for (they passed the switch after the admission and filled it).
        """
        if self._thread is None or self._stop.is_set():
            raise TransferError("transport is not running")
        self._pushes.extend((k, to) for k in keys)
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
        with self._stats_lock:
            drops = dict(c.drops)
        out: dict[str, Any] = {
            "datagrams_received": c.datagrams_received,
            "pushed_fragments": self.pushed_fragments,
            "skipped_push_fragments": self.skipped_push_fragments,
            "recv_batches": c.recv_batches,
            "data_received": c.data_received,
            "fragments_stored": c.fragments_stored,
            "duplicates": c.duplicates,
            "gets_sent": c.gets_sent,
            "retransmit_gets": c.retransmit_gets,
            "datagrams_sent": c.datagrams_sent,
            "bytes_sent": c.bytes_sent,
            "send_errors": c.send_errors,
            "nacks_sent": c.nacks_sent,
            "nacks_received": c.nacks_received,
            "busy_received": c.busy_received,
            "busy_retries": c.busy_retries,
            "stall_retransmits": c.stall_retransmits,
            "overtaken_retransmits": c.overtaken_retransmits,
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
            "requests_active": len(self._active),
            "requests_waiting": sum(len(c.waiting) for c in list(self._pending)),
            "goodput_bytes": c.goodput_bytes,
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
            "send_queue": len(self._jobs) + len(self._probes) + len(self._background),
            "send_queue_fragments": self._queued,
            "drain_rate_bps": round(self._drain.rate),
            "answer_wait": self._waits.summary(),
            "inflight_budget": self._budget,
        }
        if self.holder is not None:
            out["holder"] = self.holder.stats()
        if self.gate is not None:
            out["gate"] = self.gate.stats()
        return out

    def active_requests(self) -> list[tuple[int, int, int, int]]:
        """``(request_id, chunk_key, fragments received, fragment count or 0 if unknown)`` per transfer."""
        out = []
        for r in list(self._active.values()):
            reasm = r.reasm
            out.append((r.rid, r.key, 0 if reasm is None else reasm.received_count,
                        0 if reasm is None else reasm.frag_count))
        return out

    def _drop(self, reason: str, n: int = 1) -> None:
        with self._stats_lock:
            self._c.drops[reason] = self._c.drops.get(reason, 0) + n

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        assert self._hsock is not None and self._rsock is not None
        poller = select.poll()
        hfd, rfd = self._hsock.fileno(), self._rsock.fileno()
        poller.register(hfd, select.POLLIN)
        poller.register(rfd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        want_out = False
        try:
            while not self._stop.is_set():
                timeout_ms = self._poll_timeout_ms()
                events = poller.poll(timeout_ms)
                for fd, _ in events:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                self._admit_submitted()
                self._admit_mark = (self._inflight - self._free_inflight, len(self._active))
                self._admit_pushes()
                self._receive_data()
                self._receive_gets()
                blocked = self._send_jobs()
                # Idle is no drain: the meter starts a new window after it.
                self._drain.sample(time.monotonic(), self._queued > 0, self._c.bytes_sent)
                if blocked != want_out:
                    poller.modify(hfd, select.POLLIN | (select.POLLOUT if blocked else 0))
                    want_out = blocked
                self._timers()
        except Exception:  # a bug here must not leave fetchers hanging: fail them loudly
            log.exception("transport loop crashed")
            raise
        finally:
            self._fail_all("transport stopped")

    def _poll_timeout_ms(self) -> int:
        if self._submit:
            return 0
        counted = self._inflight - self._free_inflight
        if self._pending and (counted < self._admit_mark[0] or len(self._active) < self._admit_mark[1]):
            # Budget or a transfer slot came free after the waiting calls were last looked at (a
            # transfer ended): start them now, not after the next DATA, which may be far away.
            return 0
        if self._jobs or self._probes or self._background:
            if self.config.rate_bytes_per_s <= 0 or self._tokens >= _L:
                return 0
            return max(1, int((_L - self._tokens) / self.config.rate_bytes_per_s * 1000))
        if self._active:
            now = time.monotonic()
            nxt = min(min(r.next_retx, r.deadline) for r in self._active.values())
            return max(1, min(100, int((nxt - now) * 1000) + 1))
        return 200

    # ------------------------------------------------------------------ requester internals

    def _room(self) -> int:
        """Fragments that may still be asked for under the shared in-flight budget."""
        return self._budget - (self._inflight - self._free_inflight)

    def _account(self, r: _Request, fragments: int) -> None:
        """``fragments`` more (or fewer) of ``r``'s asked for and not yet received."""
        self._inflight += fragments
        if r.free:
            self._free_inflight += fragments

    def _admit_submitted(self) -> None:
        """Start waiting requests, taking one from each ``fetch`` call in turn (round robin).

        So one huge or stuck call (thousands of chunks from a dead holder) cannot hold a
        small one behind it: a call with no request transferring gets its next one started
        even past ``max_active_requests`` or the in-flight budget (one request each, a
        window of at most 16 fragments), and every call then shares the slots evenly.
        """
        while self._submit:
            self._pending.append(self._submit.popleft())
        now = time.monotonic()
        cfg = self.config
        small = min(cfg.window_fragments, 16)
        idle = 0  # calls looked at since the last start: a full round without one ends the loop
        while self._pending and idle < len(self._pending):
            call = self._pending[0]
            self._pending.rotate(-1)
            if call.waiting and now >= call.waiting[0].deadline:  # one deadline per call: all of it expired
                while call.waiting:
                    r = call.waiting.popleft()
                    r.expired = True
                    self._finish(r, error=f"chunk {r.key:#018x}: timed out waiting for a transfer slot")
            if not call.waiting:
                self._pending.pop()  # the call just rotated to the end
                idle = 0
                continue
            starved = call.active == 0
            if len(self._active) >= cfg.max_active_requests and not starved:
                idle += 1
                continue
            # Length unknown yet: ask for a window (the holder clamps it to the chunk).  With
            # too little budget left, wait for transfers in flight rather than ask for crumbs.
            ask = min(cfg.window_fragments, self._room())
            if ask < small and self._active:
                if not starved:
                    idle += 1
                    continue
                ask = small
            r = call.waiting.popleft()
            r.path = self._path(r)
            r.free = self._shared_path(r)
            ask = self._first_ask(r, min(ask, self._window(r)))
            self._c.requests_by_path[str(r.path)] += 1
            call.active += 1
            idle = 0
            self._active[r.rid] = r
            r.rto = cfg.retransmit_timeout_s
            r.last_progress = r.started = now
            r.next_retx = now + r.rto
            self._send_get(r, 0, ask, 0)
            r.result.timing.first_get(now)
            r.asked_hi = ask
            self._account(r, ask)

    def _window(self, r: _Request) -> int:
        """Most fragments ``r`` keeps in flight on its current path (``servable_window_fragments``)."""
        cfg = self.config
        if r.path is GetPath.SERVABLE and cfg.servable_window_fragments:
            return min(cfg.window_fragments, cfg.servable_window_fragments)
        return cfg.window_fragments

    def _path(self, r: _Request) -> GetPath:
        """How to ask for ``r``'s chunk now: servable when pooled (or forced), else by range GETs.

        A hot chunk (``single`` in the hints) is asked for by range GETs like any other: switches
        coalesce range GETs per chunk (p4/include/coalesce.p4), so sharing it costs no request
        packet that plain forwarding would not send.
        """
        if self.config.single_fragment_gets:
            return GetPath.SERVABLE
        path = self.hints.path(r.key)
        return GetPath.RANGE if path is GetPath.SINGLE else path

    def _first_ask(self, r: _Request, ask: int) -> int:
        """Fragments to ask for before the chunk's length is known (``ask``: what budget and window allow).

        A range GET is clamped by the holder to the chunk.  Single GETs cannot be: for a
        pooled chunk with a length from the hints the whole first window goes out at once,
        else only fragment 0, whose DATA tells the length.
        """
        if r.path is GetPath.RANGE:
            return max(ask, 1)
        hint = self.hints.hint(r.key)
        if hint is not None and 0 < hint.nbytes <= wire.MAX_CHUNK_LEN:
            return max(1, min(ask, wire.fragment_count(hint.nbytes)))
        return 1

    def _admit_pushes(self) -> None:
        """Turn pushes asked for by ``push`` into send jobs (loop thread only)."""
        while self._pushes:
            key, to = self._pushes.popleft()
            self._queue_push(key, to)

    def _queue_push(self, key: int, to: Address) -> None:
        if self.holder is None:
            return
        first = 0
        while True:
            out = self._serve(key, first, wire.MAX_FRAGMENTS)
            if isinstance(out, wire.Status):
                if first == 0:
                    log.warning("push of chunk %#x to %s:%d skipped: %s", key, to[0], to[1], out.name)
                return
            if first == 0:  # a placement's own push: what answered before it filled another one
                self._fill_watch.setdefault(key, {})[to] = np.zeros(int(out[0]["hdr"]["frag_count"]), np.bool_)
            self._add_job(self._job(out, to, key, None, first, 0, 0))
            self.pushed_fragments += int(out.size)
            first += int(out.size)
            if first >= int(out[0]["hdr"]["frag_count"]):
                return

    def _send_get(self, r: _Request, first: int, count: int, flags: int) -> None:
        """Ask for fragments ``first .. first+count-1``: one range GET, or one GET each on the servable path."""
        assert self._rsock is not None
        count = min(count, wire.MAX_FRAGMENTS - first)
        if r.no_cache:
            flags |= wire.Flag.NO_CACHE
        r.path = self._path(r)  # a chunk may have been pooled (or dropped) since the last window
        if r.path is GetPath.SERVABLE:
            # Only single-fragment GETs can be served from switch memory (p4/README.md), at the
            # price of one request packet per fragment, each with reply room: the bytes a switch
            # overwrites with the fragment when it answers (it cannot grow a packet by a fragment).
            pack = wire.HEADER_STRUCT.pack
            room = bytes(wire.FRAG_PAYLOAD)
            pkts = [pack(wire.KVPOOL_VERSION, wire.Opcode.GET, flags, r.key, i, 1, r.rid, r.generation, 0, 0, 0, 0)
                    + room for i in range(first, first + count)]
            if r.asked_at is None:
                r.asked_at = np.zeros(wire.MAX_FRAGMENTS, np.float64)
            r.asked_at[first:first + count] = time.monotonic()
        else:
            pkts = [wire.get_packet(r.key, first, count, r.rid, r.generation, flags)]
            if r.asked_at is not None:
                r.asked_at[first:first + count] = 0  # asked by a range now, not singly
        sent = 0
        try:
            for pkt in pkts:
                self._rsock.sendto(pkt, r.holder)
                sent += 1
        except OSError as exc:
            self._c.send_errors += 1
            log.debug("GET to %s failed: %s", r.holder, exc)
        self._c.gets_sent += sent
        if flags & wire.Flag.RETRANSMIT:
            self._c.retransmit_gets += sent

    def _receive_data(self) -> None:
        """Drain the requester socket in batches: fast path for DATA, slow path for the rest."""
        assert self._rsock is not None
        recv = self._rsock.recv_into
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
                self._drop("socket_error")
                log.debug("recv failed: %s", exc)
            if n == 0:
                return
            self._c.datagrams_received += n
            self._c.recv_batches += 1
            self._process_batch(n)
            self._grant_all()
            if n < len(slots):
                return

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

    def _deliver(self, rid: int, recs: npt.NDArray[np.void], now: float) -> None:
        r = self._active.get(rid)
        if r is None:
            r = self._rebind(recs)
            if r is None:
                self._drop("late_duplicate" if rid in self._recent else "unknown_request", int(recs.size))
                return
        keys = recs["hdr"]["chunk_key"]
        wrong = keys != r.key
        if wrong.any():
            self._drop("wrong_key", int(wrong.sum()))
            recs = recs[~wrong]
            if recs.size == 0:
                return
        if r.reasm is None:
            r.reasm = self._open_reassembler(r, recs)
            if r.reasm is None:
                return
        elif r.generation == 0 and bool((recs["hdr"]["generation"] > r.reasm.generation).any()):
            self._restart_at_newer_generation(r, recs, now)
            return
        reasm = r.reasm
        before_rejected = reasm.rejected
        stored = reasm.add_batch(recs, strict=False)
        rejected = reasm.rejected - before_rejected
        if rejected:
            self._classify_rejects(reasm, recs)
        self._c.duplicates += int(recs.size) - stored - rejected
        r.result.timing.arrived(now, stored, int(recs.size) - stored - rejected)
        if stored == 0:
            return
        self._c.fragments_stored += stored
        self._account(r, -(stored))
        copies = (recs["hdr"]["flags"] & wire.Flag.COALESCED) != 0
        if copies.any():
            self._c.joined_fragments += int(copies.sum())
            if r.path is GetPath.RANGE:
                # After the accounting above: copies of fragments it had not asked for yet left
                # what it counts in flight below zero, which ``_join`` makes whole again.
                self._join(r, int(recs["hdr"]["frag_index"][copies].max()) + 1)
        if r.probe == 1:
            r.probe = 2
        if r.asked_at is not None:
            idx = np.minimum(recs["hdr"]["frag_index"], wire.MAX_FRAGMENTS - 1)
            newest = float(r.asked_at[idx].max())
            if newest > r.answered_ask:
                r.answered_ask = newest
                r.overtaken.append((now, newest))
        r.last_progress = now
        self._holder_progress[r.holder] = now
        r.rto = self.config.retransmit_timeout_s
        if not r.refused:  # a refusal's re-ask stays when the holder's hint said, DATA or not
            r.next_retx = now + (min(r.rto, self._join_patience_s) if r.joined else r.rto)
        if reasm.complete and self._verified(r, reasm, now):
            self._c.goodput_bytes += reasm.chunk_len
            self._c.requests_completed += 1
            r.result.generation = reasm.generation
            self._finish(r, data=reasm.data)
            return
        self._grant(r)

    @property
    def _join_patience_s(self) -> float:
        """How long a joined request waits for its own fragments before it asks the holder for them.

        A retransmit timeout, and never less than the holder's queue bound (this agent's
        ``max_queue_s``, a deployment's holders taking the same): the answer it joined may wait
        that long in the holder's queue, and re-asked sooner it is sent twice.
        """
        cfg = self.config
        return max(_JOIN_PATIENCE_RTOS * cfg.retransmit_timeout_s, cfg.max_queue_s)

    def _join(self, r: _Request, seen: int) -> None:
        """Copies of another requester's answer reached ``r`` (its GET joined that answer in a switch), up to ``seen``.

        The switch copies the rest of that answer to ``r`` (p4/include/coalesce.p4), which
        its owner asks for to the chunk's end: ``r`` counts every fragment as asked (its own
        window GETs would only be absorbed) and, outside the shared budget like any transfer
        whose pace another sets, asks now for what it lacks below ``seen`` (the answer is
        in order: that passed before it joined), once per fragment, with RETRANSMIT so a
        switch sends it to the holder.  Copies of other joiners' re-asks come too, low
        fragments out of the answer's order, so it looks again at every copy, not only the
        first.  Whatever else goes missing (the owner gives up or
        waits, a copy is lost) it asks for after ``_join_patience_s`` of its own silence, not
        the ``_STALL_RTOS`` a request whose holder streams to others waits.
        """
        assert r.reasm is not None
        if not r.joined:
            r.joined = True
            r.reasked_hi = 0
            self._c.joined_requests += 1
            # What it counts in flight (asked minus received; below zero when copies came past
            # what it asked) leaves the shared budget, then the rest of the chunk is counted as
            # asked: afterwards it counts exactly the fragments still to come, all outside it.
            self._free(r)
        total = r.reasm.frag_count
        if r.asked_hi < total:
            self._account(r, total - r.asked_hi)
            r.asked_hi = total
        seen = min(seen, total)
        if seen <= r.reasked_hi:
            return
        want = np.zeros(total, np.bool_)
        want[r.reasked_hi:seen] = True
        r.reasked_hi = seen
        missed = runs(want & ~r.reasm.received, 64)
        # COALESCED on a GET: a joiner's re-ask, which the holder may send inside the answer it
        # joined, for every requester that joined it (``_carrier``).  Only a short one: the
        # requesters of a wave join within moments of each other and miss the same few first
        # fragments, while one that joins mid-answer misses much that the others already have,
        # and a copy for each of them is work for every switch on the way.
        short = sum(count for _, count in missed) <= total // _CARRIED_SHARE
        flags = wire.Flag.RETRANSMIT | (wire.Flag.COALESCED if short else 0)
        for start, count in missed:
            self._send_get(r, start, count, flags)
            self._c.join_reasks += count

    def _rebind(self, recs: npt.NDArray[np.void]) -> _Request | None:
        """The active request a switch's coalesced replica with a stale request id answers, if any.

        A switch gives each replica the request id of its waiter's latest GET from a reply
        record it writes in egress, after the GET's ingress already set the waiter's bit.
        On BMv2, where ingress and egress are separate threads with queues between them, an
        absorbed GET can be lost on its way to egress or not be recorded yet, and the
        replica then carries an older request's id (34 fragments in one BMv2 leaf-spine pool
        run): without this the fragment would be dropped and the request would wait a
        retransmit timeout for it (2.2 s in the demo).
        Only replicas (``COALESCED``; switches are trusted and drop non-writer DATA from
        hosts, ``p4/README.md``) of one chunk are taken, by the request fetching that chunk
        at a generation they may answer; each fragment's check still binds its bytes to the
        key, generation and index.
        """
        flags = recs["hdr"]["flags"]
        keys = recs["hdr"]["chunk_key"]
        if not bool((flags & wire.Flag.COALESCED).all()) or bool((keys != keys[0]).any()):
            return None
        key, gen = int(keys[0]), int(recs["hdr"]["generation"][0])
        for r in self._active.values():
            if r.key == key and r.generation in (0, gen):
                self._c.rebound_fragments += int(recs.size)
                return r
        return None

    def _verified(self, r: _Request, reasm: Reassembler, now: float) -> bool:
        """Check a complete chunk; if it fails, drop what failed and ask again (or fail the request).

        True when the chunk may be handed out.  Otherwise its bad fragments (or all of
        them) are forgotten and asked for again, or, past ``integrity_retries``, the
        request is finished with an error.
        """
        whole = envelope.verify(reasm.buffer)
        if whole:
            self._c.chunks_verified += 1
            return True
        bad = reasm.bad_fragments()
        if whole is None and bad.size == 0:
            self._c.chunks_verified += 1  # not a serialized chunk: each fragment passed its own check
            return True
        from_switch = int(np.count_nonzero(reasm.flags[bad] & wire.Flag.SWITCH_SERVED))
        if bad.size:
            self._drop("bad_check", int(bad.size))
            self._c.fragments_check_failed += int(bad.size)
            self._c.switch_fragments_check_failed += from_switch
            why = (f"{bad.size} fragment(s) failed their check, {from_switch} of them served by a switch "
                   f"(first: fragment {int(bad[0])})")
        else:
            self._c.chunks_check_failed += 1
            why = "every fragment passed its check but the chunk failed its own checksum"
        r.check_rounds += 1
        log.warning("chunk %#018x from %s:%d, try %d: %s", r.key, r.holder[0], r.holder[1], r.check_rounds, why)
        if r.check_rounds > self.config.integrity_retries:
            self._c.integrity_failures += 1
            self._c.requests_failed += 1
            r.result.integrity = True
            self._finish(r, error=f"chunk {r.key:#018x} from {r.holder[0]}:{r.holder[1]}: content check failed "
                                  f"{r.check_rounds} times ({why}); no bytes returned")
            return False
        # Later tries, and any after a switch's copy failed, must reach the holder.
        if from_switch or r.check_rounds >= 2 or not bad.size:
            r.no_cache = True
        if bad.size:
            reasm.forget(bad)
            runs = np.split(bad, np.flatnonzero(np.diff(bad) != 1) + 1)
            for run in runs:
                self._send_get(r, int(run[0]), int(run.size), wire.Flag.RETRANSMIT)
            self._account(r, int(bad.size))
        else:
            # Which fragments are wrong is unknowable: fetch the whole chunk again.
            reasm.reset()
            r.asked_hi = 0
        r.last_progress = now
        r.rto = self.config.retransmit_timeout_s
        r.next_retx = now + r.rto
        return False

    def _restart_at_newer_generation(self, r: _Request, recs: npt.NDArray[np.void], now: float) -> None:
        """The chunk was republished while we fetched it: start over, pinned to the newer generation.

        Only a valid DATA of this chunk counts; its bytes are dropped (``generation_changed``)
        and the transfer asks again from fragment 0 for that generation, so a switch still
        holding the old one sends us to the holder instead of answering.
        """
        assert r.reasm is not None
        newest = 0
        for i in np.flatnonzero(recs["hdr"]["generation"] > r.reasm.generation).tolist():
            try:
                hdr = wire.parse(recs[i : i + 1].view(np.uint8).data)
            except wire.WireError as err:
                self._drop(err.reason)
                continue
            newest = max(newest, hdr.generation)
        if newest == 0:
            return
        self._drop("generation_changed", int(recs.size))
        r.generation_changes += 1
        self._c.generation_restarts += 1
        if r.generation_changes > _MAX_GENERATION_CHANGES:
            self._c.requests_failed += 1
            self._finish(r, error=f"chunk {r.key:#018x} from {r.holder[0]}:{r.holder[1]}: its generation changed "
                                  f"{r.generation_changes} times during the fetch; ask again")
            return
        log.info("chunk %#018x: generation %d -> %d during the fetch, starting over", r.key, r.reasm.generation,
                 newest)
        self._account(r, -(r.asked_hi - r.reasm.received_count))
        r.generation = newest
        r.reasm = None
        r.asked_at, r.answered_ask, r.settled_ask = None, 0.0, 0.0  # the old generation's asks say nothing
        r.overtaken.clear()
        r.refused_runs.clear()
        ask = self._first_ask(r, min(self.config.window_fragments, self._room()))
        self._send_get(r, 0, ask, 0)
        r.asked_hi = ask
        self._account(r, ask)
        r.last_progress = now
        r.rto = self.config.retransmit_timeout_s
        r.next_retx = now + r.rto

    def _open_reassembler(self, r: _Request, recs: npt.NDArray[np.void]) -> Reassembler | None:
        """Size the reassembly buffer from the first valid DATA record of the request."""
        for i in range(recs.size):
            raw = recs[i : i + 1].view(np.uint8)
            try:
                hdr = wire.parse(raw.data)
            except wire.WireError as err:
                self._drop(err.reason)
                continue
            if r.generation not in (0, hdr.generation):
                self._drop("wrong_generation")
                continue
            reasm = Reassembler(r.key, hdr.chunk_len, hdr.generation)
            # The holder clamped our first window to the chunk: forget the part past its end.
            if r.asked_hi > reasm.frag_count:
                self._account(r, -(r.asked_hi - reasm.frag_count))
                r.asked_hi = reasm.frag_count
            return reasm
        return None

    def _classify_rejects(self, reasm: Reassembler, recs: npt.NDArray[np.void]) -> None:
        """Count records ``add_batch`` rejected by the reason the per-packet check gives (slow, rare)."""
        for i in range(recs.size):
            raw = recs[i : i + 1].view(np.uint8)
            try:
                Reassembler(reasm.chunk_key, reasm.chunk_len, reasm.generation,
                            buffer=np.empty(reasm.chunk_len, np.uint8)).add(raw)
            except wire.WireError as err:
                self._drop(err.reason)

    def _grant(self, r: _Request) -> None:
        """Ask for the next half window once half of what was asked for has arrived."""
        if r.reasm is None:
            return
        total = r.reasm.frag_count
        window = self._window(r)
        half = window // 2
        floor = min(window, 16)
        self._skip_arrived(r)
        while r.asked_hi < total and r.asked_hi - r.reasm.received_count <= half:
            want = min(half, total - r.asked_hi)
            if self._shared_path(r):
                self._free(r)  # the hints pooled its chunk since it started
                count = self._burst(r, want)
                if count == 0:
                    return
            else:
                count = min(want, self._room())
            if 0 < count < min(want, _MIN_GRANT) and r.asked_hi > r.reasm.received_count:
                # Crumbs of budget while our own fragments still arrive: wait for a worthwhile
                # window rather than send a range GET per freed fragment (as many GETs as DATA).
                self._starved = True
                return
            if count <= 0 and r.call is not None and r.call.active == 1:
                # A call's only transfer keeps a few fragments in flight even when other calls
                # (a stuck one, say) hold the whole budget: it must not wait for them to fail.
                count = min(floor - (r.asked_hi - r.reasm.received_count), total - r.asked_hi)
            if count <= 0:
                self._starved = True  # _grant_all resumes it once arrivals free budget
                return
            if count == 1 and want > 1 and r.path is GetPath.RANGE:
                # A GET of one fragment looks like a length probe or a single GET to the holder,
                # which then keeps room for the rest of the chunk (``_reserve``): one over budget
                # keeps a range a range.
                count = 2
            self._send_get(r, r.asked_hi, count, 0)
            r.asked_hi += count
            self._account(r, count)

    def _skip_arrived(self, r: _Request) -> None:
        """Move ``r.asked_hi`` past fragments that arrived before they were asked for.

        Where the switches merge, the switch's copies of other requesters' answers reach every
        GET that joined theirs, and a chunk's later fragments can come before this requester
        asks for them.  Asked for again, they cost the holder a send each; and a burst's first
        GET aimed at one of them (``_burst``) was answered by a duplicate that stores nothing,
        so the burst waited for it until the request gave up (a replay of agent traffic, pool
        mode: 16 of 140 fragments, no progress for 20 s).  They count as asked and received.
        """
        assert r.reasm is not None
        got = r.reasm.received[r.asked_hi:]
        if got.size == 0 or not got[0]:
            return
        skip = int(got.size) if got.all() else int(np.argmin(got))
        r.asked_hi += skip
        self._account(r, skip)

    def _burst(self, r: _Request, want: int) -> int:
        """How many of ``want`` single GETs a shared chunk asks for now: all, or one while its holder refuses.

        A full holder refuses a burst one NACK per fragment (each GET cost a NACK back, and
        under overload most of the holder link's control bytes were these), so while it
        refuses (its last ``BUSY`` hint has not passed) a burst starts with one GET: once
        that one is answered the holder keeps room for the rest (``_reserve``); refused, one
        NACK says so and the holder books the chunk's return.
        """
        if r.probe == 1:
            return 0  # the first GET is out: the rest waits for its answer
        if r.probe == 0 and want > 1 and time.monotonic() < self._refusing_until.get(r.holder, 0.0):
            r.probe = 1
            return 1
        return want

    def _shared_path(self, r: _Request) -> bool:
        """Whether ``r`` asks for its whole window at once, past the shared in-flight budget.

        Where the switches merge, a servable chunk is a hot one the switch pool holds: other
        requesters fetch it at the same time, and a switch merges only GETs that meet while
        one is pending.  Held to the budget, each requester asks for such a chunk a few
        fragments per round trip as its other transfers free budget, so the requesters ask for
        each fragment at different times and the holder sends it once per requester (replayed
        agent traffic: 70% of the holder's duplicate DATA went to a node that had asked for the
        chunk before its first copy left).  Its answers still come at the holder's pace.
        """
        return r.path is not GetPath.RANGE and self.hints.merging()

    def _free(self, r: _Request) -> None:
        """Take a request that turned shared out of the budget, as a chunk on the shared path is from its start.

        Put on the servable path by new hints, or joined to another requester's answer
        (``_join``), its fragments come at another's pace: in a switch's pending slot for
        another requester's answer, or at a booked return.  Counted in the budget, such GETs
        left the requester's unshared chunks a crumb of it at a time (a replay of agent traffic
        at 3x the holder link, pool mode: chunks asked 2-7 fragments per second, 14-21 s each).
        """
        if r.free:
            return
        r.free = True
        self._free_inflight += r.asked_hi - (0 if r.reasm is None else r.reasm.received_count)

    def _grant_all(self) -> None:
        """Hand budget freed by arrivals to windows cut short by the budget, then to waiting requests."""
        if self._starved:
            self._starved = False
            for r in self._active.values():
                if self._room() <= 0:
                    self._starved = True
                    return
                self._grant(r)
        if self._pending or self._submit:
            self._admit_submitted()

    def _slow_packet(self, i: int) -> None:
        """One datagram that is not a plain DATA of the right size: name the reason, act or drop."""
        n = self._lens[i]
        view = self._slots[i][: min(n, _L)]
        if n > _L:
            self._drop("oversize")
            return
        try:
            hdr = wire.parse(view)
        except wire.WireError as err:
            self._drop(err.reason)
            return
        if hdr.opcode != wire.Opcode.NACK:
            self._drop("unexpected_opcode")
            return
        r = self._active.get(hdr.request_id)
        if r is None or r.key != hdr.chunk_key:
            self._drop("unknown_request")
            return
        self._c.nacks_received += 1
        status = wire.Status(hdr.status)
        if hdr.generation != r.generation or (status == wire.Status.BAD_RANGE and r.reasm is not None
                                              and hdr.frag_index < r.reasm.frag_count):
            # The NACK answers a GET we did not send as such (a bit flipped on the way: another
            # generation, a range inside the chunk): not an answer to ours, which is re-asked.
            self._drop("nack_for_other_get")
            return
        now = time.monotonic()
        if status == wire.Status.BAD_RANGE and hdr.frag_index > 0:
            # Past the end of a chunk whose fragment 0 exists: single GETs sent for a length the
            # hints guessed too long.  The first DATA tells the real length; nothing is lost.
            self._c.past_end_nacks += 1
            return
        if status == wire.Status.BUSY:
            # Push back, not an answer: the holder is there and the request waits (until its
            # deadline), re-asking when the holder's hint says its queue has room again.  The
            # hint is jittered so the requesters a switch told at once do not come back at once,
            # but never early: a holder books its refusals one after another (its queue where the
            # switches merge, a source's budget always), and a GET back before its turn is only
            # refused again.
            self._c.busy_received += 1
            r.busy += 1
            r.result.timing.refused(now)
            r.refused = True
            r.joined = False  # the answer it may have joined is over: a switch ends it at a NACK
            r.last_progress = now
            self._holder_progress[r.holder] = now
            # What was refused, and only that, is asked again when the hint says: the run the NACK
            # names (a one-fragment BUSY refuses that fragment alone).
            r.refused_runs.append((hdr.frag_index, hdr.frag_index + hdr.frag_count))
            hint_us = min(hdr.chunk_len, _MAX_RETRY_HINT_US)
            jitter = 1.0 if self.hints.merging(now) else 1.0 + 0.5 * random.random()
            wait = hint_us / 1e6 * jitter if hint_us else r.rto
            r.next_retx = now + wait
            self._refusing_until[r.holder] = max(self._refusing_until.get(r.holder, 0.0), now + wait)
            return
        self._c.requests_failed += 1
        self._finish(r, error=f"chunk {r.key:#018x}: holder {r.holder[0]}:{r.holder[1]} answered "
                              f"NACK {status.name}", status=status)

    def _timers(self) -> None:
        if not self._active:
            return
        now = time.monotonic()
        cfg = self.config
        stall = _STALL_RTOS * cfg.retransmit_timeout_s
        for r in list(self._active.values()):
            quiet = now - max(r.last_progress, self._holder_progress.get(r.holder, 0.0))
            if now >= r.deadline or quiet >= cfg.give_up_s:
                got = 0 if r.reasm is None else r.reasm.received_count
                total = "?" if r.reasm is None else str(r.reasm.frag_count)
                where = f"chunk {r.key:#018x} from {r.holder[0]}:{r.holder[1]}"
                how = f"{got}/{total} fragments, {r.result.retransmit_rounds} retransmit rounds, {r.busy} BUSY"
                self._c.requests_failed += 1
                if now >= r.deadline:  # the holder answers, slowly: the caller's deadline ended it
                    r.expired = True
                    self._finish(r, error=f"{where}: timed out, the caller's deadline passed ({how})")
                else:
                    self._finish(r, error=f"{where}: no progress for {quiet:.1f} s ({how}); is the holder running "
                                          "and reachable?")
                continue
            if r.overtaken and not r.refused:
                self._resend_overtaken(r, now)
            if now < r.next_retx:
                continue
            # A joined request waits for its own fragments less: they come at the pace of another
            # requester's windows, which may stop (it failed, or waits for budget of its own).
            stall_at = r.last_progress + (self._join_patience_s if r.joined else stall)
            if quiet < r.rto and now < stall_at and not r.refused:
                # The holder streams: ours are most likely queued behind, not lost.  Unless our
                # own fragments stay away for long (a switch absorbed our GETs into a pending slot
                # whose answer was lost), re-asking would only add duplicates to its queue.
                r.next_retx = min(now + r.rto - quiet, stall_at)
                continue
            busy_retry, r.refused = r.refused, False
            r.path = self._path(r)
            if busy_retry:
                # Not lost, refused: ask again as fresh GETs, so a switch may serve them or merge
                # them again (the holder booked every requester it refused for the chunk at one
                # instant, and a RETRANSMIT would go past the switch to the holder, once per
                # requester).  Where nothing merges, a range GET says RETRANSMIT so a switch's
                # popularity count does not take a retry for another fetch.
                self._c.busy_retries += 1
                r.result.timing.re_asked_refused(now)
                fresh = r.path is not GetPath.RANGE or self.hints.merging(now)
                flags = 0 if fresh else wire.Flag.RETRANSMIT
            else:
                r.result.retransmit_rounds += 1
                r.result.timing.re_asked_silent(now, r.last_progress)
                if quiet < r.rto:
                    self._c.stall_retransmits += 1
                flags = wire.Flag.RETRANSMIT
            if r.reasm is None:
                # Length still unknown: single GETs cannot be clamped by the holder, so ask for
                # fragment 0 alone (or the hinted length) and the rest once its DATA tells.
                ask = self._first_ask(r, r.asked_hi)
                self._account(r, -(r.asked_hi - ask))
                r.asked_hi = ask
                self._send_get(r, 0, r.asked_hi, flags)
            else:
                again = self._refused_missing(r) if busy_retry else r.reasm.missing_ranges(max_ranges=64)
                for start, count in again:
                    if start >= r.asked_hi:
                        break
                    self._send_get(r, start, min(count, r.asked_hi - start), flags)
            r.refused_runs.clear()
            if not busy_retry:
                r.rto = min(r.rto * 2, max(1.0, 8 * cfg.retransmit_timeout_s))
            r.next_retx = now + r.rto

    @staticmethod
    def _refused_missing(r: _Request) -> list[tuple[int, int]]:
        """The runs of fragments a ``BUSY`` refused that have not arrived since, as ``(start, count)``.

        Only those: re-asking every missing fragment asked the holder again for the answers
        to GETs it had admitted and was still sending, and it sent them twice (replayed agent
        traffic at 17 times the holder link: 4% of plain's DATA frames went twice to the same
        node within 50 ms).  A refused fragment that arrives meanwhile (a switch merged its GET
        into another requester's) is not asked again; a lost answer is the retransmit timer's.
        """
        assert r.reasm is not None
        n = r.reasm.frag_count
        want = np.zeros(n, bool)
        for start, end in r.refused_runs:
            want[min(start, n):min(end, n)] = True
        return runs(want & ~r.reasm.received, 64)

    def _resend_overtaken(self, r: _Request, now: float) -> None:
        """Re-ask single GETs overtaken for a reorder window by answers to GETs asked after them: lost.

        One lost GET stalls more than its sender: a switch merged the others' GETs for the
        fragment into its pending slot, and they all wait for the answer that never comes.
        The retransmit timeout would find it only once the whole request has gone quiet (2.2 s
        in the demo, and never while the holder streams to others).  An answer may trail one
        asked after it by at most the holder's queue, which the retransmit timeout covers
        twice: after half of it, a fragment asked before one that has arrived and still missing
        was lost on the way.  Never sooner than that queue itself (this agent's
        ``max_queue_s``, a deployment's holders taking the same): with the agent's default
        timeout, 0.2 s, half of it is well under a 1 s queue.  Re-asked with RETRANSMIT, so it
        goes to the holder even through a switch holding a pending slot for it.
        """
        cfg = self.config
        cut = now - max(_REORDER_RTOS * cfg.retransmit_timeout_s, cfg.max_queue_s)
        settled = r.settled_ask
        while r.overtaken and r.overtaken[0][0] <= cut:
            settled = r.overtaken.popleft()[1]
        if settled <= r.settled_ask or r.reasm is None or r.asked_at is None:
            return
        r.settled_ask = settled
        hi = min(r.asked_hi, r.reasm.frag_count)
        at = r.asked_at[:hi]
        lost = np.flatnonzero((at > 0) & (at < settled) & ~r.reasm.received[:hi])
        if lost.size == 0:
            return
        self._c.overtaken_retransmits += int(lost.size)
        breaks = np.flatnonzero(np.diff(lost) != 1) + 1
        for run in np.split(lost, breaks)[:64]:
            self._send_get(r, int(run[0]), int(run.size), wire.Flag.RETRANSMIT)

    def _finish(self, r: _Request, *, data: memoryview | None = None, error: str | None = None,
                status: wire.Status | None = None) -> None:
        if self._active.pop(r.rid, None) is not None:
            got = 0 if r.reasm is None else r.reasm.received_count
            self._account(r, -(r.asked_hi - got))
            if r.call is not None:
                r.call.active -= 1
            took = time.monotonic() - r.started
            if took >= _SLOW_TRANSFER_RTOS * self.config.retransmit_timeout_s:
                # Rare and worth a line: how a transfer that took this long spent its time.
                log.info("chunk %#018x from %s:%d took %.1f s (%s path; %s fragments; %d BUSY, %d retransmit "
                         "rounds)%s", r.key, r.holder[0], r.holder[1], took, r.path,
                         "?" if r.reasm is None else f"{r.reasm.received_count}/{r.reasm.frag_count}", r.busy,
                         r.result.retransmit_rounds, "" if error is None else f": {error}")
        self._recent[r.rid] = None
        if len(self._recent) > _RECENT_REQUESTS:
            self._recent.popitem(last=False)
        r.result.data = data
        r.result.error = error
        r.result.status = status
        reasm = r.reasm
        r.result.timing.finish(time.monotonic(), r.result.retransmit_rounds, None if reasm is None else reasm.received,
                               None if reasm is None else reasm.flags)
        if self.config.share_transfers:
            with self._flight_lock:
                flight = (r.key, r.holder, r.generation)
                if self._flights.get(flight) is r:
                    del self._flights[flight]
        r.done.set()

    def _fail_all(self, why: str) -> None:
        waiting = [r for call in [*self._pending, *self._submit] for r in call.waiting]
        for r in [*self._active.values(), *waiting]:
            self._finish(r, error=f"chunk {r.key:#018x}: {why}")
        self._pending.clear()
        self._submit.clear()

    # ------------------------------------------------------------------ holder internals

    def _receive_gets(self) -> None:
        """Answer the GETs waiting on the holder socket, merging runs of single-fragment GETs."""
        assert self._hsock is not None
        buf = self._slots[0]  # the DATA ring was fully processed before this runs
        gets: list[tuple[wire.Header, Address]] = []
        for _ in range(1024):
            try:
                n, addr = self._hsock.recvfrom_into(buf, _L, _MSG_TRUNC)
            except BlockingIOError:
                break
            except OSError as exc:
                self._drop("socket_error")
                log.debug("recvfrom failed: %s", exc)
                break
            self._c.datagrams_received += 1
            if n > _L:
                self._drop("oversize")
                continue
            try:
                hdr = wire.parse(buf[:n])
            except wire.WireError as err:
                self._drop(err.reason)
                continue
            if hdr.opcode != wire.Opcode.GET:
                self._drop("unexpected_opcode")
                continue
            gets.append((hdr, addr))
        for hdr, first, count, addr in merge_gets(gets, self.config.max_fragments_per_get):
            self._serve_get(hdr, first, count, addr)

    def _booked(self, key: int) -> bool:
        """Whether GETs for ``key`` come back at the time a BUSY booked for them (``_retry_hint_us``)."""
        at = self._rendezvous.get(key, (0.0, 0, 0))[0]
        now = time.monotonic()
        return at - _BOOKING_EARLY_S <= now <= at + _BOOKING_EARLY_S

    def _reservation(self, key: int, now: float) -> int:
        """Fragments of the queue kept for the rest of ``key`` (0: none), expired reservations dropped."""
        while self._reserved:
            first, (until, n) = next(iter(self._reserved.items()))
            if until > now:
                break
            del self._reserved[first]
            self._reserved_total -= n
            self._c.reserved_expired += n
        entry = self._reserved.get(key)
        return 0 if entry is None else entry[1]

    def _take_reserved(self, key: int, count: int) -> None:
        """``count`` GETs of ``key`` came for the room kept for them."""
        until, n = self._reserved[key]
        used = min(n, count)
        self._reserved_total -= used
        self._c.reserved_fragments += used
        if used == n:
            del self._reserved[key]
        else:
            self._reserved[key] = (until, n - used)

    def _reserve(self, key: int, rest: int, now: float) -> None:
        """Keep room in the queue for ``rest`` more fragments of ``key``, whose single GETs are on their way.

        After a chunk's first single GETs were admitted (a length probe, or the first GET of a
        burst), its requesters ask for the rest at once (``_shared_path``), one GET per
        fragment.  Admitted or refused as they came, those GETs found the queue taken by
        others' meanwhile and were refused one NACK per fragment (replayed agent
        traffic at 69 times the holder link: a NACK for every DATA sent).  So a chunk is
        admitted or refused whole, at its first GET: its rest is never refused.
        """
        kept = self._reserved.pop(key, (0.0, 0))[1]
        rest = max(rest, kept)
        if rest <= 0:
            return
        # The rest comes once the answer to what was admitted reached its requesters: after
        # the queue ahead of it, the way back and the queue again.
        rate = self._drain_rate()
        ahead = self._answers_queued() * _L / rate if rate > 0 else 0.0
        until = now + ahead + self.config.max_queue_s + _RESERVE_SLACK_S
        self._reserved[key] = (until, rest)
        self._reserved_total += rest - kept
        self._c.reserved_chunks += not kept

    def _serve_get(self, hdr: wire.Header, first: int, count: int, addr: Address) -> None:
        """Queue the DATA for fragments ``first .. first+count-1`` of ``hdr``'s chunk, or NACK."""
        if self.holder is None:
            self._nack_run(hdr, first, count, wire.Status.UNKNOWN_CHUNK, addr)
            return
        if self.gate is not None:
            allowed = self.gate.admit(addr[0], count)
            if allowed is None:
                self._drop("unverified_source")  # no DATA, no NACK: the source may be forged
                return
            if allowed < count:
                # Over its budget: come back when the budget holds the refused GETs again.  What is
                # not granted is refused, never left unanswered.  A run of single GETs may be a
                # switch's pending slots that other requesters' GETs joined (left unanswered, the
                # slots waited out their timeout and every waiter its stall timer: 9-11 s on
                # replayed agent traffic at 10 Mbit/s); a range's requester waited for its own stall
                # timer (9 s on the same traffic at 100 Mbit/s, 200 requests: p99 3.6x plain's).
                if hdr.frag_count > 1 and count - allowed == 1 and allowed > 0:
                    allowed -= 1  # a range's refused part is two fragments or more (kvpool.wire)
                    self.gate.give_back(addr[0], 1)
                rest = count - allowed
                hint_us = int(min(_MAX_RETRY_HINT_US, max(1000.0, self.gate.book_retry_s(addr[0], rest) * 1e6)))
                self._nack_run(hdr, first + allowed, rest, wire.Status.BUSY, addr, hint_us)
                if allowed == 0:
                    return
            count = allowed
        limit = self._queue_limit()
        now = time.monotonic()
        merging = self.hints.merging(now)
        reserved = self._reservation(hdr.chunk_key, now) if merging else 0
        if reserved:
            # The rest of a chunk whose probe was admitted: its room was kept.
            self._take_reserved(hdr.chunk_key, count)
        elif (self._answers_queued() + self._reserved_total >= limit
              and not (merging and self._answers_queued() + self._reserved_total < 2 * limit
                       and (self._booked(hdr.chunk_key) or (hdr.frag_count > 1 and self._range_queued < limit)))):
            # Bounded queue, bounded wait: the requester comes back when the hint says.  A refused
            # probe books room for its whole chunk (the rest is asked for right after it).  A range
            # GET, what plain forwarding asks with, is refused only when range answers alone fill
            # the queue, as they would there: refused for the room shared chunks took (answers,
            # kept room, bookings; 14,000 refusals in a replay of agent traffic at 3x the holder
            # link), unshared chunks came a crumb of the requester's budget per refusal and took
            # 10-13 s each against plain's 2-6 s.  Like a booked return, never past twice the
            # bound: the longest wait for an answer, which switches' pending timeouts must cover,
            # stays twice the bound.
            probe = first == 0 and count == 1 and hdr.frag_count == 1
            booked = (self.holder.known_fragments(hdr.chunk_key) or count) if probe else count
            hint_us = self._retry_hint_us(limit, hdr.chunk_key, first, booked)
            self._nack_run(hdr, first, count, wire.Status.BUSY, addr, hint_us)
            return
        # NO_CACHE goes on in the DATA: a switch holding the fragment rewrites it (repair).
        flags = hdr.flags & wire.Flag.NO_CACHE
        carrier = self._carrier(hdr, addr) if merging else None
        if carrier is not None and carrier.get is not None:
            # What a requester missed before it joined another's answer: sent once, inside that
            # answer (to its owner, first in its lane), so the switches copy it to every requester
            # that joined, instead of once to each of them.  What another joiner's re-ask already
            # queued there and has not sent yet is not queued twice.
            want = np.zeros(first + count, np.bool_)
            want[first:] = True
            for j in self._jobs_by_key.get(hdr.chunk_key, ()):
                if j.carried and j.owner == carrier.owner:
                    want[j.first + j.pos:j.first + j.count] = False
            for start, n in runs(want):
                out = self._serve(hdr.chunk_key, start, n, request_id=carrier.get.request_id,
                                  generation=hdr.generation, flags=flags)
                if isinstance(out, wire.Status):
                    break
                self._c.reasks_carried += int(out.size)
                job = self._job(out, carrier.addr, hdr.chunk_key, carrier.get, start, carrier.get.request_id, flags)
                job.carried = True
                self._add_job(job, front=True)
            return
        out = self._serve(hdr.chunk_key, first, count, request_id=hdr.request_id, generation=hdr.generation,
                          flags=flags)
        if isinstance(out, wire.Status):
            self._nack_run(hdr, first, count, out, addr)
            return
        job = self._job(out, addr, hdr.chunk_key, hdr, first, hdr.request_id, flags)
        if merging and count == 1 and hdr.frag_count == 1 and not reserved and not hdr.flags & wire.Flag.RETRANSMIT:
            # A lone single GET: a length probe or the GET a burst starts with; the rest follows.
            self._reserve(hdr.chunk_key, int(out[0]["hdr"]["frag_count"]) - first - 1, now)
        self._add_job(job)

    def _carrier(self, hdr: wire.Header, addr: Address) -> _SendJob | None:
        """The answer in progress that a joiner's re-ask of what it missed can ride, if any.

        Only a GET that says it is one (``RETRANSMIT | COALESCED``, ``Transport._join``), from a
        requester with no answer of its own for the chunk queued, riding an answer to a range GET
        that was not a RETRANSMIT (switches coalesce only those, and a RETRANSMIT opens no slot)
        for the generation the other answer's GET asked for: then the requester waits in a
        switch's pending slot of that answer's owner, and the oldest such answer still sending is
        the one whose GET opened it.  (Riding another joiner's re-ask instead, the fragments went
        to that joiner alone and the rest waited ``_join_patience_s`` for them.)
        """
        want = wire.Flag.RETRANSMIT | wire.Flag.COALESCED
        if hdr.flags & want != want:
            return None
        jobs = self._jobs_by_key.get(hdr.chunk_key, ())
        mine = (addr, hdr.request_id)
        if any(j.owner == mine and j.pos < j.count for j in jobs):
            return None
        for j in jobs:
            if (j.get is not None and j.ranged and j.owner != mine and j.pos < j.count
                    and not j.get.flags & wire.Flag.RETRANSMIT and j.get.generation == hdr.generation):
                return j
        return None

    def _serve(self, key: int, first: int, count: int, *, request_id: int = 0, generation: int = 0,
               flags: int = 0) -> npt.NDArray[np.void] | wire.Status:
        """``Holder.serve`` with this sender's record pool (what it allocated is noted for ``_job``)."""
        assert self.holder is not None
        self._allocated = None
        return self.holder.serve(key, first, count, request_id=request_id, generation=generation, flags=flags,
                                 alloc=self._alloc_records)

    def _job(self, out: npt.NDArray[np.void], to: Address, key: int, get: wire.Header | None, first: int,
             request_id: int, flags: int) -> _SendJob:
        """A send job for what ``_serve`` returned: its own pooled array, or a view of the holder's kept records."""
        own = self._allocated is not None and out.base is self._allocated
        base = self._allocated if own else None
        self._allocated = None
        return _SendJob(out, out.view(np.uint8).data, to, 0, int(out.size), base, key, get, first,
                        stamp=None if own else (request_id, flags))

    def _add_job(self, job: _SendJob, front: bool = False) -> None:
        """Queue a send job (and index it by chunk: a push's fill watch looks its chunk's jobs up).

        A lone GET of fragment 0 is how a requester that does not know a chunk's length asks
        for it (the servable path without a hinted length): its whole chunk waits on
        this one datagram, and where the switches merge, the rest of its GETs must reach the
        switch while another requester's are still pending there.  So it goes before every
        other job instead of waiting for each of them to take a turn (64 queued answers are
        70 ms at 10 Mbit/s); a probe is one datagram, so the others barely notice.
        """
        if job.get is None:
            self._background.append(job)
            self._background_queued += job.count
        elif job.first == 0 and job.count == 1:
            self._probes.append(job)
        else:
            self._jobs.append(job, front)
            if job.get is not None and not job.ranged and self.config.max_queue_s > 0:
                job.queued_at = time.monotonic()
                self._aged.append(job)
        self._jobs_by_key.setdefault(job.key, []).append(job)
        self._dequeued(job, -job.count)
        job.enqueued = time.monotonic()

    def _dequeued(self, job: _SendJob, n: int) -> None:
        """``n`` of ``job``'s fragments left the send queue (sent, cancelled, abandoned; negative: queued)."""
        self._queued -= n
        if job.ranged:
            self._range_queued -= n

    def _job_done(self, job: _SendJob) -> None:
        same = self._jobs_by_key.get(job.key)
        if same is not None:
            same.remove(job)
            if not same:
                del self._jobs_by_key[job.key]
        if job.get is None and not any(j.get is None and j.addr == job.addr for j in same or ()):
            watches = self._fill_watch.get(job.key, {})
            watches.pop(job.addr, None)
            if not watches:
                self._fill_watch.pop(job.key, None)
        self._release_records(job)

    def _alloc_records(self, n: int) -> npt.NDArray[np.void]:
        """A record array of at least ``n`` records, reused when one of its size class is free."""
        size = 1 << max(0, n - 1).bit_length()  # power-of-two size classes
        for cls in (size, size * 2, size * 4):  # a somewhat larger free array beats fresh pages
            free = self._record_pool.get(cls)
            if free:
                self._pooled_records -= cls
                self._allocated = free.pop()
                return self._allocated
        self._allocated = np.empty(size, dtype=wire.DATA_PACKET_DTYPE)
        return self._allocated

    def _release_records(self, job: _SendJob) -> None:
        """Give a finished job's array back to the pool (bounded, so an idle holder holds little)."""
        base = job.base
        if base is None or self._pooled_records + base.size > _POOL_RECORDS:
            return
        # The job's views must go first: the array is refilled by the next GET.
        job.view.release()
        job.base = None
        self._record_pool.setdefault(int(base.size), []).append(base)
        self._pooled_records += int(base.size)

    def _answers_queued(self) -> int:
        """Fragments queued to answer GETs (pushes wait for idle time and do not count)."""
        return self._queued - self._background_queued

    def _queue_limit(self) -> int:
        """Fragments the send queue may hold before GETs are answered BUSY."""
        cfg = self.config
        limit = cfg.max_queued_fragments
        rate = self._drain_rate()
        if cfg.max_queue_s > 0 and rate > 0:
            limit = min(limit, max(cfg.send_quantum, int(cfg.max_queue_s * rate / _L)))
        return limit

    def _drain_rate(self) -> float:
        """Bytes/s the send queue drains at: the pacing rate, or what this host manages when that is less.

        A holder whose CPU cannot keep its pacing rate (a small, busy machine) drains more
        slowly than it paces: the time bound of its queue must use the rate it achieves, or
        the answers wait longer than every timeout downstream.  Unpaced: 0 (no time bound).
        """
        rate = self.config.rate_bytes_per_s
        if rate <= 0 or self._drain.rate <= 0:
            return rate
        return min(rate, max(self._drain.rate, rate / 20))

    def _retry_hint_us(self, limit: int, key: int | None = None, first: int = 0, count: int = 0) -> int:
        """A BUSY NACK's retry hint: microseconds until the paced queue has room (0: unpaced).

        Plain: until the queue has drained to half ``limit``.  Where the switches merge, a
        booking for fragments ``first`` to ``first + count`` of chunk ``key``: every requester
        refused for the chunk comes back at one instant, so the switch merges their GETs again,
        and chunks refused one after another come back one after another at the rate the queue
        drains.  Told only to drain to half, every refused requester came back at once, found the
        queue full again and was refused again (replayed agent traffic, 69 times the holder link:
        each refused fragment up to ten times, a NACK for every DATA sent).
        """
        rate = self._drain_rate()
        if rate <= 0:
            return 0
        now = time.monotonic()
        start = now + max(0, self._answers_queued() - limit // 2) * _L / rate
        if key is not None and self.hints.merging(now):
            at, lo, hi = self._rendezvous.get(key, (0.0, 0, 0))
            if at <= now:
                at, lo, hi = max(start, self._booked_until), first, first
                if len(self._rendezvous) >= _BOOKED_CHUNKS:
                    self._rendezvous = {k: v for k, v in self._rendezvous.items() if v[0] > now}
            # Other requesters refused for the chunk come back with it: book only fragments not
            # yet booked.  A span, not a count: a requester's GETs refused in two receive batches
            # (0-1, then 2-3) were booked as the larger run alone, and the chunk refused next came
            # back while the first chunk's other half was still going out (requesters ask a
            # chunk's fragments in order, so what they ask for is a span).
            new_lo, new_hi = min(lo, first), max(hi, first + count)
            more = (new_hi - new_lo) - (hi - lo)
            self._rendezvous[key] = (at, new_lo, new_hi)
            self._booked_until = max(self._booked_until, at) + more * _L / rate
            start = at
        return int(min(_MAX_RETRY_HINT_US, max(1000.0, (start - now) * 1e6)))

    def _nack_run(self, hdr: wire.Header, first: int, count: int, status: wire.Status, addr: Address,
                  retry_us: int = 0) -> None:
        """NACK the GETs of a run: once per fragment when they were single-fragment GETs, else once for the run.

        A switch that coalesced single GETs keeps one pending slot per fragment and releases
        each only on an answer for that fragment: one NACK for the merged run would leave the
        others' waiters waiting for an answer that never comes.
        """
        if hdr.frag_count == 1 and count > 1:
            for i in range(first, first + count):
                self._send_nack(replace(hdr, frag_index=i), status, addr, retry_us)
        elif hdr.frag_count > 1 and count > 1:
            # The whole run: adjacent range GETs of a request are served (or refused) as one, and
            # a NACK naming only the first left the others neither answered nor refused (the
            # requester re-asks what a BUSY names: it waited for its stall timer, 17 s).
            self._send_nack(replace(hdr, frag_index=first, frag_count=count), status, addr, retry_us)
        else:
            self._send_nack(replace(hdr, frag_index=first), status, addr, retry_us)

    def _send_nack(self, hdr: wire.Header, status: wire.Status, addr: Address, retry_us: int = 0) -> None:
        assert self._hsock is not None
        pkt = wire.nack_packet(hdr.chunk_key, status, hdr.request_id, hdr.frag_index, hdr.frag_count,
                               hdr.generation, retry_us=retry_us)
        try:
            self._hsock.sendto(pkt, addr)
            self._c.nacks_sent += 1
        except OSError:
            self._c.send_errors += 1

    def _send_jobs(self) -> bool:
        """Send queued DATA, paced: length probes first, then round robin.

        True if the socket buffer is full.
        """
        if not self._jobs and not self._probes and not self._background:
            self._backlogged = False
            return False
        cfg = self.config
        now = time.monotonic()
        budget = 4 * cfg.recv_batch  # then go back to receiving, so our own fetches are not starved
        if cfg.rate_bytes_per_s > 0:
            # Time the last pass left answers waiting for tokens is made up (up to the catch-up
            # depth); time it had nothing to send fills only the shallow bucket.
            depth = cfg.pace_catchup_bytes if self._backlogged else cfg.pace_depth_bytes
            self._tokens = min(depth, self._tokens + (now - self._last_refill) * cfg.rate_bytes_per_s)
            self._last_refill = now
            budget = min(budget, int(self._tokens // _L))
        sent, blocked = self._send_from(self._probes, budget)
        if not blocked:
            more, blocked = self._send_lanes(self._jobs, budget - sent, now)
            sent += more
        # Answers left that could go but for the tokens: the link stays busy until the next pass.
        self._backlogged = bool(self._probes or self._jobs)
        if not blocked and sent < budget and self._background and not self._backlogged:
            # Nothing else can go: a push takes the idle time (a fill, never ahead of an answer).
            self._skip_redundant_pushes()
            before = self._queued
            more, blocked = self._send_from(self._background, budget - sent)
            sent += more
            self._background_queued -= before - self._queued
        self._c.datagrams_sent += sent
        self._c.bytes_sent += sent * _L
        if cfg.rate_bytes_per_s > 0:
            self._tokens -= sent * _L
        return blocked

    def _skip_redundant_pushes(self) -> None:
        """Trim pushes of the fragments an answer carried since the push was asked for: those filled the switch.

        A push costs the holder's link a copy of the chunk; the controller asks for one when
        it admits a chunk its switches saw asked for, often while the holder still answers
        it, and every answer that passes the switch after the admission fills it
        (replayed agent traffic: pushes were a third of the pool's duplicate DATA).  A push
        loses the filled fragments at its ends, or goes whole when any is left between them.
        """
        for job in self._background:
            watch = self._fill_watch.get(job.key, {}).get(job.addr)
            if watch is None:
                continue
            lo, hi = job.first + job.pos, job.first + job.count
            filled = watch[lo:hi]
            if not filled.any():
                continue
            head = int(np.argmin(filled)) if not filled.all() else hi - lo
            tail = int(np.argmin(filled[::-1])) if head < hi - lo else 0
            job.pos += head
            skipped = head + tail
            job.count -= tail
            self._queued -= skipped
            self._background_queued -= skipped
            self.skipped_push_fragments += skipped

    def _send_from(self, jobs: collections.deque[_SendJob], budget: int) -> tuple[int, bool]:
        """Send up to ``budget`` DATA from ``jobs``, round robin in quanta; (datagrams sent, socket buffer full)."""
        sent = 0
        blocked = False
        while jobs and sent < budget:
            job = jobs[0]
            more, blocked = self._send_quantum(job, budget - sent)
            sent += more
            if job.pos >= job.count:
                jobs.popleft()
                self._job_done(job)
            else:
                jobs.rotate(-1)
            if blocked:
                break
        return sent, blocked

    def _send_lanes(self, lanes: _Lanes, budget: int, now: float) -> tuple[int, bool]:
        """Send up to ``budget`` answers: a quantum per request in turn, each request's answers in order.

        Round robin per job gave a request a share of the link per job it had queued.  Where
        the switches merge, a chunk's single GETs reach the holder spread over time and become
        many small jobs (500-900 queued in a replay of agent traffic at 3x the holder link,
        100 Mbit/s, against 250 in plain forwarding), so every round took longer and the range
        answers of the chunks nobody shares came a few fragments per round: their p90 transfer
        time was 10 s against plain's 5 s, and the replay's p50 1.46x plain's.  A turn per
        request is what plain forwarding's requests get.

        Returns (datagrams sent, socket buffer full).
        """
        quantum = self.config.send_quantum
        sent, blocked = self._send_aged(lanes, budget, now)
        if blocked:
            return sent, blocked
        order = lanes.order
        while order and sent < budget:
            owner = order[0]
            lane = lanes.by_owner[owner]
            turn = 0  # this request's turn: a quantum, over as many of its answers as it takes
            while turn < quantum and sent < budget and not blocked:
                job = lane[0]
                more, blocked = self._send_quantum(job, min(quantum - turn, budget - sent))
                sent += more
                turn += more
                if job.pos >= job.count:
                    lanes.remove(job)
                    self._job_done(job)
                    if owner not in lanes.by_owner:
                        break  # its last answer went: the round goes on with the next request
            if owner in lanes.by_owner:
                order.rotate(-1)
            if blocked:
                break
        return sent, blocked

    def _send_aged(self, lanes: _Lanes, budget: int, now: float) -> tuple[int, bool]:
        """Send the answers to single GETs queued longer than the queue bound first, oldest first.

        A switch keeps a GET it merged pending for a bounded time (the controller's pending
        timeout, which must cover the longest wait for an answer: twice the queue bound), and
        every GET merged into a slot that expired waits for its requester's timers.  A turn
        per request bounds a request's share of the link, not how long its last answer waits:
        later requests join the round meanwhile.  In a replay of agent traffic at 3x the
        holder link (8 requesters, 100 Mbit/s) single GETs waited up to 4.1 s at the holder
        and 32 pending slots expired.  So an answer a switch waits on and that has waited the
        queue bound goes before the round, as it would have in a FIFO queue.

        Returns (datagrams sent, socket buffer full).
        """
        aged = self._aged  # empty when the queue has no time bound (``_add_job``)
        sent = 0
        blocked = False
        oldest = now - self.config.max_queue_s
        while aged and sent < budget and not blocked:
            job = aged[0]
            if job.pos >= job.count:
                aged.popleft()  # done in its turn of the round, which retired it
                continue
            if job.queued_at > oldest:
                break
            more, blocked = self._send_quantum(job, budget - sent)
            sent += more
            if job.pos >= job.count:
                aged.popleft()
                lanes.remove(job)
                self._job_done(job)
        return sent, blocked

    def _note_first_answer(self, job: _SendJob) -> None:
        """An answer's first DATA went out: note how long it waited since it was queued."""
        self._waits.add(time.monotonic() - job.enqueued)

    def _send_quantum(self, job: _SendJob, budget: int) -> tuple[int, bool]:
        """Send ``job``'s next quantum (at most ``budget`` DATA); (datagrams sent, socket buffer full)."""
        assert self._hsock is not None
        sendto = self._hsock.sendto
        blocked = False
        end = min(job.count, job.pos + self.config.send_quantum, job.pos + budget)
        view, addr = job.view, job.addr
        pos = job.pos
        if job.stamp is not None and end > pos:
            # Kept records are shared by every answer of the chunk: this answer's request
            # id and flags go in right before its datagrams are sent.
            stamp(job.records[pos:end], *job.stamp)
        try:
            # The tightest loop Python offers: one slice and one syscall per datagram.
            for off in range(pos * _L, end * _L, _L):
                sendto(view[off : off + _L], addr)
                pos += 1
        except BlockingIOError:
            blocked = True
        except OSError as exc:
            self._c.send_errors += 1
            log.debug("DATA to %s failed: %s", addr, exc)
            # An unreachable peer: abandon the rest of the job; a live requester re-asks.
            self._dequeued(job, job.count - pos)
            job.count = pos
        sent = pos - job.pos
        if job.pos == 0 and sent and job.get is not None:
            self._note_first_answer(job)
        self._dequeued(job, sent)
        if job.get is not None and (watches := self._fill_watch.get(job.key)) is not None:
            for watch in watches.values():
                watch[job.first + job.pos : job.first + pos] = True
        job.pos = pos
        return sent, blocked
