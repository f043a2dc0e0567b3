"""The requester's state: one chunk transfer (``Request``), one ``fetch`` call (``Call``),
the shared in-flight ``Budget`` and the transfers in ``Flights``.

Plain data and bookkeeping, shared by ``hostagent.fetcher`` (which creates requests on
callers' threads and admits them) and ``hostagent.transfer`` (which runs them on the loop
thread).  A ``Request`` and its ``Reassembler`` belong to the loop thread once submitted;
callers only wait on ``done`` and read ``result`` after it is set.  ``Flights.by_key`` is
the one structure both threads touch, under ``Flights.lock``.  ``Budget`` counts fragments
asked for and not yet received: every request's count against the limit except ``free``
ones (the shared path, joined requests), whose fragments come at another's pace.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hostagent.fragment import Reassembler
from hostagent.transport_config import Address, FetchResult
from kvpool.hints import GetPath


@dataclass(eq=False, slots=True)
class Request:
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
    call: Call | None = None
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
    answered and the holder keeps room for the rest of the chunk (``Transfers._burst``)."""
    free: bool = False
    """Started on the shared path (``Transfers.shared_path``): its fragments in flight are outside the
    shared budget, so they do not starve the range requests (``Budget.room``)."""
    refused_runs: list[tuple[int, int]] = field(default_factory=list)
    """``[start, end)`` runs of fragments the holder refused since the last re-ask of refused ones:
    what a ``BUSY`` retry asks for again (not the fragments of GETs it admitted, still on their way)."""
    joined: bool = False
    """A switch joined its GET to another requester's answer for the chunk (``Transfers._join``)."""
    reasked_hi: int = 0
    """Joined: the fragments below this that it lacked have been asked for again (``Transfers._join``)."""
    own_hi: int = 0
    """One past the highest fragment its holder's own answers delivered (not a switch's copy or pool)."""
    own_marks: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    """``(arrival, own_hi)`` each time ``own_hi`` moved on, oldest first (``Transfers.resend_gaps``)."""
    gap_at: npt.NDArray[np.float64] | None = None
    """When each fragment was last re-asked as a gap in the holder's answer (monotonic; 0: never)."""


@dataclass(eq=False, slots=True)
class Call:
    """One ``fetch`` call's requests that wait for a transfer slot, and how many of its requests transfer."""

    waiting: collections.deque[Request]
    active: int = 0


class Budget:
    """Fragments asked for and not yet received, over all requests, against the shared limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Most fragments in flight (the transport shrinks it to what its receive buffer holds)."""
        self.inflight = 0
        self.free_inflight = 0
        """Of ``inflight``: fragments of requests outside the budget (``Request.free``)."""
        self.starved = False
        """A window was cut short for lack of room: arrivals hand budget to it (``Transfers.grant_starved``)."""

    def counted(self) -> int:
        """Fragments in flight that count against the limit."""
        return self.inflight - self.free_inflight

    def room(self) -> int:
        """Fragments that may still be asked for under the shared in-flight budget."""
        return self.limit - (self.inflight - self.free_inflight)

    def account(self, r: Request, fragments: int) -> None:
        """``fragments`` more (or fewer) of ``r``'s asked for and not yet received."""
        self.inflight += fragments
        if r.free:
            self.free_inflight += fragments

    def free(self, r: Request) -> None:
        """Take a request that turned shared out of the budget, as a chunk on the shared path is from its start.

        Put on the servable path by new hints, or joined to another requester's answer
        (``Transfers._join``), its fragments come at another's pace: in a switch's pending slot
        for another requester's answer, or at a booked return.  Counted in the budget, such GETs
        left the requester's unshared chunks a crumb of it at a time (a replay of agent traffic
        at 3x the holder link, pool mode: chunks asked 2-7 fragments per second, 14-21 s each).
        """
        if r.free:
            return
        r.free = True
        self.free_inflight += r.asked_hi - (0 if r.reasm is None else r.reasm.received_count)


class Flights:
    """Transfers in flight by (chunk, holder, generation pin): a ``fetch`` of the same joins it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        """``TransportConfig.share_transfers``."""
        self.lock = threading.Lock()
        """Guards ``by_key``: ``fetch`` runs on callers' threads, ``land`` on the loop thread."""
        self.by_key: dict[tuple[int, Address, int], Request] = {}

    def land(self, r: Request) -> None:
        """``r`` ended: a later ``fetch`` of its chunk starts a transfer of its own."""
        if self.enabled:
            with self.lock:
                flight = (r.key, r.holder, r.generation)
                if self.by_key.get(flight) is r:
                    del self.by_key[flight]
