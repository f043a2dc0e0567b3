"""The requester's front: ``fetch`` calls, shared transfers, and who gets a transfer slot.

``Fetcher.fetch`` runs on the caller's thread: it checks the keys, gives each chunk a
``Request`` with its own 32-bit request id (or, with ``share_transfers``, the one this
host already has in flight for the same chunk, holder and generation pin: ``Flights``),
submits the call and waits.  The loop thread starts waiting requests (``admit``), taking
one from each call in turn, so a huge or stuck call never holds a small one behind it: a
call with nothing transferring always gets one request started, past
``max_active_requests`` and the budget; others wait for a slot and for budget worth a
window.  What happens to a request once started is ``hostagent.transfer``'s.

A call sharing another's transfer gets a read-only view of its bytes; if the owner's
earlier deadline ended it, the sharer fetches again within its own.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from hostagent.request_state import Call, Flights, Request
from hostagent.transfer import Transfers
from hostagent.transport_config import Address, Counters, FetchResult, TransferError, TransportConfig
from kvpool import wire


class Fetcher:
    """Fetch calls in (any thread), requests admitted to ``Transfers`` (loop thread)."""

    def __init__(self, config: TransportConfig, counters: Counters, transfers: Transfers, flights: Flights,
                 running: Callable[[], bool], alive: Callable[[], bool], wake: Callable[[], None]) -> None:
        """``running``: whether fetches are taken; ``alive``: whether the loop thread lives; ``wake``: poke the loop."""
        self.config = config
        self._c = counters
        self._transfers = transfers
        self._flights = flights
        self._running = running
        self._alive = alive
        self._wake = wake
        self._submit: collections.deque[Call] = collections.deque()
        # Fetch calls with requests waiting for a transfer slot, in round-robin order.
        self._pending: collections.deque[Call] = collections.deque()
        # In-flight fragments and active requests when waiting calls were last admitted.
        self._admit_mark = (0, 0)
        self._next_rid = int.from_bytes(os.urandom(4), "big") or 1
        self._rid_lock = threading.Lock()

    def waiting(self) -> int:
        """Requests waiting for a transfer slot (any thread, approximate)."""
        return sum(len(c.waiting) for c in list(self._pending))

    def admit_now(self) -> bool:
        """Whether the loop must not sleep: calls were submitted, or budget or a slot came free for waiting ones.

        A transfer that ended freed them after the waiting calls were last looked at: start
        them now, not after the next DATA, which may be far away.
        """
        if self._submit:
            return True
        t = self._transfers
        return bool(self._pending) and (t.budget.counted() < self._admit_mark[0]
                                        or len(t.active) < self._admit_mark[1])

    def mark(self) -> None:
        """Note the budget and slots in use after an admission round (``admit_now``)."""
        self._admit_mark = (self._transfers.budget.counted(), len(self._transfers.active))

    def grant_all(self) -> None:
        """Hand budget freed by arrivals to windows cut short by the budget, then to waiting requests."""
        if not self._transfers.grant_starved():
            return
        if self._pending or self._submit:
            self.admit()

    def fail_all(self, why: str) -> None:
        """Finish every request, active or waiting, with ``why`` (the loop is ending)."""
        waiting = [r for call in [*self._pending, *self._submit] for r in call.waiting]
        for r in [*self._transfers.active.values(), *waiting]:
            self._transfers.finish(r, error=f"chunk {r.key:#018x}: {why}")
        self._pending.clear()
        self._submit.clear()

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
        if not self._running():
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
        call = Call(collections.deque())
        # Per key: our own request, or the one in flight we share (another call's transfer).
        reqs: list[tuple[Request, bool]] = []
        with self._flights.lock:
            for key, gen in zip(keys, gens, strict=True):
                flight = (key, holder, gen)
                lead = self._flights.by_key.get(flight) if self.config.share_transfers else None
                if lead is not None:
                    self._c.shared_transfers += 1
                    lead.shared = True
                    reqs.append((lead, False))
                    continue
                r = Request(self._new_rid(), key, holder, gen, FetchResult(key), threading.Event(), deadline,
                             call=call)
                if self.config.share_transfers:
                    self._flights.by_key[flight] = r
                call.waiting.append(r)
                reqs.append((r, True))
        if call.waiting:
            self._submit.append(call)
            self._wake()
        return [self._outcome(r, own, deadline) for r, own in reqs]

    def _outcome(self, r: Request, own: bool, deadline: float) -> FetchResult:
        """Wait for ``r`` and return what it means for this call (a shared transfer is this call's too)."""
        while not r.done.wait(0.5 if own else max(0.0, min(0.5, deadline - time.monotonic()))):
            # The loop enforces an own request's deadline; this wait only guards against a dead loop thread.
            if not self._alive():
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


    def admit(self) -> None:
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
                    self._transfers.finish(r, error=f"chunk {r.key:#018x}: timed out waiting for a transfer slot")
            if not call.waiting:
                self._pending.pop()  # the call just rotated to the end
                idle = 0
                continue
            starved = call.active == 0
            if len(self._transfers.active) >= cfg.max_active_requests and not starved:
                idle += 1
                continue
            # Length unknown yet: ask for a window (the holder clamps it to the chunk).  With
            # too little budget left, wait for transfers in flight rather than ask for crumbs.
            ask = min(cfg.window_fragments, self._transfers.budget.room())
            if ask < small and self._transfers.active:
                if not starved:
                    idle += 1
                    continue
                ask = small
            r = call.waiting.popleft()
            r.path = self._transfers.path(r)
            r.free = self._transfers.shared_path(r)
            ask = self._transfers.first_ask(r, min(ask, self._transfers.window(r)))
            self._c.requests_by_path[str(r.path)] += 1
            call.active += 1
            idle = 0
            self._transfers.begin(r, ask, now)

