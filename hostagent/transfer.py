"""The requester side of one chunk transfer: windows, budget, joining, integrity, timers.

A ``Transfers`` runs every active request (``Request``, one per chunk being fetched) on
the transport's loop thread; ``hostagent.fetcher`` decides which waiting request starts
(``begin``) and ``hostagent.receive`` hands it each run of its DATA (``deliver``) and each
NACK (``on_nack``).  Its invariants (the reasons, measured: docs/design/transport.md):

* A request asks for a window with one range GET (single GETs with reply room on the
  servable path) and for the next half window once half has arrived; at most
  ``window_fragments`` are in flight per request.  All requests share the in-flight
  ``Budget``, sized to the receive buffer, except ``free`` ones (the shared path, joined
  requests), whose fragments come at another's pace.
* DATA lands in a ``Reassembler`` keyed by request id; a switch's replica with a stale id
  goes to this host's request for the chunk (``_rebind``).  A chunk is handed out only after
  its checks passed (``_verified``); otherwise what failed is asked for again, with
  ``NO_CACHE`` where a switch's copy failed, up to ``integrity_retries`` rounds.
* Silence is judged per holder (a holder serves its queue in order): a request re-asks
  what ``missing_ranges`` reports after a retransmit timeout (doubling) of silence from its
  holder, after ``_STALL_RTOS`` of its own silence even while the holder streams, and
  re-asks single GETs overtaken by later ones (``resend_overtaken``) and what its holder's
  own answer passed over (``resend_gaps``), each after a reorder window.  It fails after
  ``give_up_s`` of silence from its holder, or at its caller's deadline.
* ``BUSY`` is push back, not failure: only the refused runs are re-asked, when the hint
  says (jittered unless the switches merge); a burst on the shared path starts with one GET
  while its holder refuses (``_burst``).
* A request whose GET a switch joined to another's answer (``COALESCED`` copies) counts the
  whole chunk as asked, outside the budget, and re-asks what passed before it joined
  (``_join``, with ``COALESCED``: the holder may send it inside that answer).
* ``finish`` is the one way out: it returns the budget, lands the flight (``Flights``) and
  wakes the caller.
"""

from __future__ import annotations

import collections
import logging
import random
import socket
import time
from typing import Final

import numpy as np
import numpy.typing as npt

from hostagent import envelope, loss
from hostagent.buffers import BufferPool
from hostagent.fragment import Reassembler, runs
from hostagent.hints import FabricHints
from hostagent.request_state import Budget, Flights, Request
from hostagent.timing import PATHS, bytes_by_path
from hostagent.transport_config import MAX_RETRY_HINT_US, Address, Counters, TransportConfig
from kvpool import wire
from kvpool.hints import GetPath

log = logging.getLogger("kvpool.transport")

_RECENT_REQUESTS: Final = 4096
"""Finished request ids remembered, so their late DATA is counted ``late_duplicate``, not ``unknown_request``."""
_MAX_GENERATION_CHANGES: Final = 3
"""Times a transfer follows its holder to a newer generation before it fails (a republish storm)."""
_MIN_GRANT: Final = 32
"""Fewest fragments a request asks for in one more window while some of its fragments are in flight."""
_SLOW_TRANSFER_RTOS: Final = 4
"""A transfer that took this many retransmit timeouts is logged (INFO) with how it spent its time."""
_STALL_RTOS: Final = 4
"""Retransmit timeouts of a request's own silence after which it re-asks even while its holder streams."""
_COALESCED: Final = int(wire.Flag.COALESCED)
_JOIN_PATIENCE_RTOS: Final = 1.0
"""Retransmit timeouts of a joined request's own silence after which it asks the holder itself (not
``_STALL_RTOS``): the answer it joined is another requester's, paced by its windows, and may stop."""


class Transfers:
    """The active requests and the protocol each follows (loop thread only)."""

    def __init__(self, config: TransportConfig, counters: Counters, hints: FabricHints, flights: Flights) -> None:
        self.config = config
        self._c = counters
        self.hints = hints
        self.flights = flights
        self.budget = Budget(config.max_inflight_fragments)
        self.buffers = BufferPool()
        """Where reassembled chunks land: recycled once the caller and the tiers dropped them (no page faults)."""
        self.sock: socket.socket | None = None
        """The requester socket (set by the transport while it runs)."""
        self.active: dict[int, Request] = {}
        self._recent: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._holder_progress: dict[Address, float] = {}
        # Until when each holder counts as full (it answered BUSY): bursts start with one GET.
        self._refusing_until: dict[Address, float] = {}

    def begin(self, r: Request, ask: int, now: float) -> None:
        """Start ``r`` (its path set, admitted by the fetcher) with a first GET for ``ask`` fragments."""
        self.active[r.rid] = r
        r.rto = self.config.retransmit_timeout_s
        r.last_progress = r.started = now
        r.next_retx = now + r.rto
        self.send_get(r, 0, ask, 0)
        r.result.timing.first_get(now)
        r.asked_hi = ask
        self.budget.account(r, ask)

    def timer_wait_ms(self) -> int:
        """Milliseconds the loop may sleep before the next retransmit timer or deadline (200 when idle)."""
        if self.active:
            now = time.monotonic()
            cfg = self.config
            nxt = min(min(r.next_retx, r.deadline, loss.next_gap_check(r, cfg) or r.deadline)
                      for r in self.active.values())
            return max(1, min(100, int((nxt - now) * 1000) + 1))
        return 200

    def grant_starved(self) -> bool:
        """Hand budget freed by arrivals to windows cut short by it; False if it ran out again."""
        budget = self.budget
        if budget.starved:
            budget.starved = False
            for r in self.active.values():
                if budget.room() <= 0:
                    budget.starved = True
                    return False
                self._grant(r)
        return True

    def window(self, r: Request) -> int:
        """Most fragments ``r`` keeps in flight on its current path (``servable_window_fragments``)."""
        cfg = self.config
        if r.path is GetPath.SERVABLE and cfg.servable_window_fragments:
            return min(cfg.window_fragments, cfg.servable_window_fragments)
        return cfg.window_fragments

    def path(self, r: Request) -> GetPath:
        """How to ask for ``r``'s chunk now: servable when pooled (or forced), else by range GETs.

        A hot chunk (``single`` in the hints) is asked for by range GETs like any other: switches
        coalesce range GETs per chunk (p4/include/coalesce.p4), so sharing it costs no request
        packet that plain forwarding would not send.

        A request that has asked by range keeps asking by range, even once its chunk is pooled:
        another requester's GET may have joined its answer at a switch (a pending slot it owns),
        and that answer ends only when the holder sends the chunk's last fragment; single GETs
        for the rest, answered by a pool, would leave the joiners waiting for copies that never
        come until the slot expires (replayed sysprompt trace, BMv2, pool mode: 27 to 90 slots
        expired and a third of the time spent waiting for retransmit timers).
        """
        if self.config.single_fragment_gets:
            return GetPath.SERVABLE
        if r.path is GetPath.RANGE and r.asked_hi > 0:
            return GetPath.RANGE
        path = self.hints.path(r.key)
        return GetPath.RANGE if path is GetPath.SINGLE else path

    def first_ask(self, r: Request, ask: int) -> int:
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


    def send_get(self, r: Request, first: int, count: int, flags: int) -> None:
        """Ask for fragments ``first .. first+count-1``: one range GET, or one GET each on the servable path."""
        assert self.sock is not None
        count = min(count, wire.MAX_FRAGMENTS - first)
        if r.no_cache:
            flags |= wire.Flag.NO_CACHE
        r.path = self.path(r)  # a chunk may have been pooled (or dropped) since the last window
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
                self.sock.sendto(pkt, r.holder)
                sent += 1
        except OSError as exc:
            self._c.send_errors += 1
            log.debug("GET to %s failed: %s", r.holder, exc)
        self._c.gets_sent += sent
        if flags & wire.Flag.RETRANSMIT:
            self._c.retransmit_gets += sent

    def deliver(self, rid: int, recs: npt.NDArray[np.void], now: float) -> None:
        """A run of DATA records that came with request id ``rid`` (``hostagent.receive``): store them, ask on."""
        r = self.active.get(rid)
        if r is not None and r.reasm is not None and self._take_run(r, r.reasm, recs, now):
            return
        if r is None:
            r = self._rebind(recs)
            if r is None:
                self._c.drop("late_duplicate" if rid in self._recent else "unknown_request", int(recs.size))
                return
        keys = recs["hdr"]["chunk_key"]
        wrong = keys != r.key
        if wrong.any():
            self._c.drop("wrong_key", int(wrong.sum()))
            recs = recs[~wrong]
            if recs.size == 0:
                return
        if r.reasm is None:
            r.reasm = self._open_reassembler(r, recs)
            if r.reasm is None:
                return
            if self._take_run(r, r.reasm, recs, now):
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
        if r.asked_at is not None:
            idx = np.minimum(recs["hdr"]["frag_index"], wire.MAX_FRAGMENTS - 1)
            newest = float(r.asked_at[idx].max())
            if newest > r.answered_ask:
                r.answered_ask = newest
                r.overtaken.append((now, newest))
        flags = recs["hdr"]["flags"]
        own = (flags & loss.OWN_ANSWER_FLAGS) == 0
        if own.any():
            loss.own_answer_reached(r, int(recs["hdr"]["frag_index"][own].max()) + 1, now)
        copies = (flags & _COALESCED) != 0
        coalesced = int(np.count_nonzero(copies))
        seen = int(recs["hdr"]["frag_index"][copies].max()) + 1 if coalesced else 0
        self._progress(r, reasm, stored, coalesced, seen, now)

    def _take_run(self, r: Request, reasm: Reassembler, recs: npt.NDArray[np.void], now: float) -> bool:
        """Take the common case with no pass over the run beyond its reassembly; False (nothing stored) otherwise.

        The common case: an in-order run of valid fragments not stored yet, all with the same
        flags (``Reassembler.add_run`` checks exactly what ``add_batch`` checks), of a request
        that does not note when it asked for each fragment (the servable path).  Anything else
        is sorted out record by record in ``deliver``.
        """
        if r.asked_at is not None:
            return False
        flags = reasm.add_run(recs)
        if flags < 0:
            return False
        n = int(recs.shape[0])
        r.result.timing.arrived(now, n, 0)
        end = int(recs["hdr"]["frag_index"][-1]) + 1
        if not flags & loss.OWN_ANSWER_FLAGS:
            loss.own_answer_reached(r, end, now)
        self._progress(r, reasm, n, n if flags & _COALESCED else 0, end, now)
        return True

    def _progress(self, r: Request, reasm: Reassembler, stored: int, coalesced: int, seen: int, now: float) -> None:
        """``stored`` (> 0) new fragments of ``r`` landed, ``coalesced`` of the run switch copies up to ``seen``.

        Counts them, hands their budget back, follows a switch's join (``_join``), restarts
        the timers, and either finishes a complete chunk that passed its checks or asks on.
        """
        self._c.fragments_stored += stored
        self.budget.account(r, -(stored))
        if coalesced:
            self._c.joined_fragments += coalesced
            if r.path is GetPath.RANGE:
                # After the accounting above: copies of fragments it had not asked for yet left
                # what it counts in flight below zero, which ``_join`` makes whole again.
                self._join(r, seen)
        if r.probe == 1:
            r.probe = 2
        r.last_progress = now
        self._holder_progress[r.holder] = now
        r.rto = self.config.retransmit_timeout_s
        if not r.refused:  # a refusal's re-ask stays when the holder's hint said, DATA or not
            r.next_retx = now + (min(r.rto, self.join_patience_s) if r.joined else r.rto)
        if reasm.complete and self._verified(r, reasm, now):
            self._c.goodput_bytes += reasm.chunk_len
            for path, nbytes in zip(PATHS, bytes_by_path(reasm.flags, reasm.chunk_len), strict=True):
                self._c.bytes_by_path[path] += nbytes
            self._c.requests_completed += 1
            r.result.generation = reasm.generation
            self.finish(r, data=reasm.data)
            return
        self._grant(r)

    @property
    def join_patience_s(self) -> float:
        """How long a joined request waits for its own fragments before it asks the holder for them.

        A retransmit timeout, and never less than the holder's queue bound (this agent's
        ``max_queue_s``, a deployment's holders taking the same): the answer it joined may wait
        that long in the holder's queue, and re-asked sooner it is sent twice.
        """
        cfg = self.config
        return max(_JOIN_PATIENCE_RTOS * cfg.retransmit_timeout_s, cfg.max_queue_s)

    def _join(self, r: Request, seen: int) -> None:
        """Copies of another requester's answer reached ``r`` (its GET joined that answer in a switch), up to ``seen``.

        The switch copies the rest of that answer to ``r`` (p4/include/coalesce.p4), which
        its owner asks for to the chunk's end: ``r`` counts every fragment as asked (its own
        window GETs would only be absorbed) and, outside the shared budget like any transfer
        whose pace another sets, asks now for what it lacks below ``seen`` (the answer is
        in order: that passed before it joined), once per fragment, with RETRANSMIT so a
        switch sends it to the holder.  Copies of other joiners' re-asks come too, low
        fragments out of the answer's order, so it looks again at every copy, not only the
        first.  Whatever else goes missing (the owner gives up or
        waits, a copy is lost) it asks for after ``join_patience_s`` of its own silence, not
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
            self.budget.free(r)
        total = r.reasm.frag_count
        if r.asked_hi < total:
            self.budget.account(r, total - r.asked_hi)
            r.asked_hi = total
        seen = min(seen, total)
        if seen <= r.reasked_hi:
            return
        want = np.zeros(total, np.bool_)
        want[r.reasked_hi:seen] = True
        r.reasked_hi = seen
        missed = runs(want & ~r.reasm.received, 64)
        # COALESCED on a GET: a joiner's re-ask, which the holder may send inside the answer it
        # joined, once for every requester that joined it (``Server._carrier`` decides).
        flags = wire.Flag.RETRANSMIT | wire.Flag.COALESCED
        for start, count in missed:
            self.send_get(r, start, count, flags)
            self._c.join_reasks += count

    def _rebind(self, recs: npt.NDArray[np.void]) -> Request | None:
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
        for r in self.active.values():
            if r.key == key and r.generation in (0, gen):
                self._c.rebound_fragments += int(recs.size)
                return r
        return None

    def _verified(self, r: Request, reasm: Reassembler, now: float) -> bool:
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
            self._c.drop("bad_check", int(bad.size))
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
            self.finish(r, error=f"chunk {r.key:#018x} from {r.holder[0]}:{r.holder[1]}: content check failed "
                                  f"{r.check_rounds} times ({why}); no bytes returned")
            return False
        # Later tries, and any after a switch's copy failed, must reach the holder.
        if from_switch or r.check_rounds >= 2 or not bad.size:
            r.no_cache = True
        if bad.size:
            reasm.forget(bad)
            runs = np.split(bad, np.flatnonzero(np.diff(bad) != 1) + 1)
            for run in runs:
                self.send_get(r, int(run[0]), int(run.size), wire.Flag.RETRANSMIT)
            self.budget.account(r, int(bad.size))
        else:
            # Which fragments are wrong is unknowable: fetch the whole chunk again.
            reasm.reset()
            r.asked_hi = 0
            loss.forget(r)
        r.last_progress = now
        r.rto = self.config.retransmit_timeout_s
        r.next_retx = now + r.rto
        return False

    def _restart_at_newer_generation(self, r: Request, recs: npt.NDArray[np.void], now: float) -> None:
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
                self._c.drop(err.reason)
                continue
            newest = max(newest, hdr.generation)
        if newest == 0:
            return
        self._c.drop("generation_changed", int(recs.size))
        r.generation_changes += 1
        self._c.generation_restarts += 1
        if r.generation_changes > _MAX_GENERATION_CHANGES:
            self._c.requests_failed += 1
            self.finish(r, error=f"chunk {r.key:#018x} from {r.holder[0]}:{r.holder[1]}: its generation changed "
                                  f"{r.generation_changes} times during the fetch; ask again")
            return
        log.info("chunk %#018x: generation %d -> %d during the fetch, starting over", r.key, r.reasm.generation,
                 newest)
        self.budget.account(r, -(r.asked_hi - r.reasm.received_count))
        r.generation = newest
        r.reasm = None
        r.asked_at, r.answered_ask, r.settled_ask = None, 0.0, 0.0  # the old generation's asks say nothing
        r.overtaken.clear()
        r.refused_runs.clear()
        loss.forget(r)
        ask = self.first_ask(r, min(self.config.window_fragments, self.budget.room()))
        self.send_get(r, 0, ask, 0)
        r.asked_hi = ask
        self.budget.account(r, ask)
        r.last_progress = now
        r.rto = self.config.retransmit_timeout_s
        r.next_retx = now + r.rto

    def _open_reassembler(self, r: Request, recs: npt.NDArray[np.void]) -> Reassembler | None:
        """Size the reassembly buffer from the first valid DATA record of the request."""
        for i in range(recs.size):
            raw = recs[i : i + 1].view(np.uint8)
            try:
                hdr = wire.parse(raw.data)
            except wire.WireError as err:
                self._c.drop(err.reason)
                continue
            if r.generation not in (0, hdr.generation):
                self._c.drop("wrong_generation")
                continue
            reasm = Reassembler(r.key, hdr.chunk_len, hdr.generation, alloc=self.buffers.take)
            # The holder clamped our first window to the chunk: forget the part past its end.
            if r.asked_hi > reasm.frag_count:
                self.budget.account(r, -(r.asked_hi - reasm.frag_count))
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
                self._c.drop(err.reason)

    def _grant(self, r: Request) -> None:
        """Ask for the next half window once half of what was asked for has arrived."""
        if r.reasm is None:
            return
        total = r.reasm.frag_count
        if r.asked_hi >= total:
            return  # the whole chunk is asked for (what arrives unasked, _skip_arrived counts below it)
        window = self.window(r)
        half = window // 2
        floor = min(window, 16)
        self._skip_arrived(r)
        while r.asked_hi < total and r.asked_hi - r.reasm.received_count <= half:
            want = min(half, total - r.asked_hi)
            if self.shared_path(r):
                self.budget.free(r)  # the hints pooled its chunk since it started
                count = self._burst(r, want)
                if count == 0:
                    return
            else:
                count = min(want, self.budget.room())
            if 0 < count < min(want, _MIN_GRANT) and r.asked_hi > r.reasm.received_count:
                # Crumbs of budget while our own fragments still arrive: wait for a worthwhile
                # window rather than send a range GET per freed fragment (as many GETs as DATA).
                self.budget.starved = True
                return
            if count <= 0 and r.call is not None and r.call.active == 1:
                # A call's only transfer keeps a few fragments in flight even when other calls
                # (a stuck one, say) hold the whole budget: it must not wait for them to fail.
                count = min(floor - (r.asked_hi - r.reasm.received_count), total - r.asked_hi)
            if count <= 0:
                self.budget.starved = True  # grant_starved resumes it once arrivals free budget
                return
            if count == 1 and want > 1 and r.path is GetPath.RANGE:
                # A GET of one fragment looks like a length probe or a single GET to the holder,
                # which then keeps room for the rest of the chunk (``Server._reserve``): one over budget
                # keeps a range a range.
                count = 2
            self.send_get(r, r.asked_hi, count, 0)
            r.asked_hi += count
            self.budget.account(r, count)

    def _skip_arrived(self, r: Request) -> None:
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
        self.budget.account(r, skip)

    def _burst(self, r: Request, want: int) -> int:
        """How many of ``want`` single GETs a shared chunk asks for now: all, or one while its holder refuses.

        A full holder refuses a burst one NACK per fragment (each GET cost a NACK back, and
        under overload most of the holder link's control bytes were these), so while it
        refuses (its last ``BUSY`` hint has not passed) a burst starts with one GET: once
        that one is answered the holder keeps room for the rest (``Server._reserve``); refused, one
        NACK says so and the holder books the chunk's return.
        """
        if r.probe == 1:
            return 0  # the first GET is out: the rest waits for its answer
        if r.probe == 0 and want > 1 and time.monotonic() < self._refusing_until.get(r.holder, 0.0):
            r.probe = 1
            return 1
        return want

    def shared_path(self, r: Request) -> bool:
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


    def on_nack(self, hdr: wire.Header) -> None:
        """A NACK for one of our requests: push back (``BUSY``), a guessed length too long, or failure."""
        r = self.active.get(hdr.request_id)
        if r is None or r.key != hdr.chunk_key:
            self._c.drop("unknown_request")
            return
        self._c.nacks_received += 1
        status = wire.Status(hdr.status)
        if hdr.generation != r.generation or (status == wire.Status.BAD_RANGE and r.reasm is not None
                                              and hdr.frag_index < r.reasm.frag_count):
            # The NACK answers a GET we did not send as such (a bit flipped on the way: another
            # generation, a range inside the chunk): not an answer to ours, which is re-asked.
            self._c.drop("nack_for_other_get")
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
            hint_us = min(hdr.chunk_len, MAX_RETRY_HINT_US)
            jitter = 1.0 if self.hints.merging(now) else 1.0 + 0.5 * random.random()
            wait = hint_us / 1e6 * jitter if hint_us else r.rto
            r.next_retx = now + wait
            self._refusing_until[r.holder] = max(self._refusing_until.get(r.holder, 0.0), now + wait)
            return
        self._c.requests_failed += 1
        self.finish(r, error=f"chunk {r.key:#018x}: holder {r.holder[0]}:{r.holder[1]} answered "
                              f"NACK {status.name}", status=status)

    def timers(self) -> None:
        if not self.active:
            return
        now = time.monotonic()
        cfg = self.config
        stall = _STALL_RTOS * cfg.retransmit_timeout_s
        for r in list(self.active.values()):
            quiet = now - max(r.last_progress, self._holder_progress.get(r.holder, 0.0))
            if now >= r.deadline or quiet >= cfg.give_up_s:
                got = 0 if r.reasm is None else r.reasm.received_count
                total = "?" if r.reasm is None else str(r.reasm.frag_count)
                where = f"chunk {r.key:#018x} from {r.holder[0]}:{r.holder[1]}"
                how = f"{got}/{total} fragments, {r.result.retransmit_rounds} retransmit rounds, {r.busy} BUSY"
                self._c.requests_failed += 1
                if now >= r.deadline:  # the holder answers, slowly: the caller's deadline ended it
                    r.expired = True
                    self.finish(r, error=f"{where}: timed out, the caller's deadline passed ({how})")
                else:
                    self.finish(r, error=f"{where}: no progress for {quiet:.1f} s ({how}); is the holder running "
                                          "and reachable?")
                continue
            if r.overtaken and not r.refused:
                self.resend_overtaken(r, now)
            if r.own_marks and not r.refused:
                self.resend_gaps(r, now)
            if now < r.next_retx:
                continue
            # A joined request waits for its own fragments less: they come at the pace of another
            # requester's windows, which may stop (it failed, or waits for budget of its own).
            stall_at = r.last_progress + (self.join_patience_s if r.joined else stall)
            if quiet < r.rto and now < stall_at and not r.refused:
                # The holder streams: ours are most likely queued behind, not lost.  Unless our
                # own fragments stay away for long (a switch absorbed our GETs into a pending slot
                # whose answer was lost), re-asking would only add duplicates to its queue.
                r.next_retx = min(now + r.rto - quiet, stall_at)
                continue
            busy_retry, r.refused = r.refused, False
            r.path = self.path(r)
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
                ask = self.first_ask(r, r.asked_hi)
                self.budget.account(r, -(r.asked_hi - ask))
                r.asked_hi = ask
                self.send_get(r, 0, r.asked_hi, flags)
            else:
                again = self._refused_missing(r) if busy_retry else r.reasm.missing_ranges(max_ranges=64)
                for start, count in again:
                    if start >= r.asked_hi:
                        break
                    self.send_get(r, start, min(count, r.asked_hi - start), flags)
            r.refused_runs.clear()
            if not busy_retry:
                r.rto = min(r.rto * 2, max(1.0, 8 * cfg.retransmit_timeout_s))
            r.next_retx = now + r.rto

    @staticmethod
    def _refused_missing(r: Request) -> list[tuple[int, int]]:
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

    def resend_overtaken(self, r: Request, now: float) -> None:
        """Re-ask the single GETs answers to later ones overtook (``hostagent.loss.overtaken``)."""
        for start, count in loss.overtaken(r, now, self.config):
            self._c.overtaken_retransmits += count
            self.send_get(r, start, count, wire.Flag.RETRANSMIT)

    def resend_gaps(self, r: Request, now: float) -> None:
        """Re-ask what the holder's own answer passed over (``hostagent.loss.gaps``)."""
        found = loss.gaps(r, now, self.config)
        for start, count in found:
            self._c.gap_retransmits += count
            self.send_get(r, start, count, wire.Flag.RETRANSMIT)
        if found:
            r.next_retx = max(r.next_retx, now + r.rto)  # the timer's round would ask for them again

    def finish(self, r: Request, *, data: memoryview | None = None, error: str | None = None,
                status: wire.Status | None = None) -> None:
        if self.active.pop(r.rid, None) is not None:
            got = 0 if r.reasm is None else r.reasm.received_count
            self.budget.account(r, -(r.asked_hi - got))
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
        self.flights.land(r)
        r.done.set()

