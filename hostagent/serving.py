"""The holder's answer policy: each GET becomes DATA queued to send, or a NACK.

A ``Server`` answers the GETs the transport's loop reads from the holder socket, from a
``Holder`` (``hostagent.holder``), into a ``SendQueue`` (``hostagent.send_queue``).  Its
rules (why each, with measurements: docs/design/transport.md):

* Adjacent GETs of one request and kind are served as one run (``merge_gets``); a NACK
  answering a run of single GETs goes once per fragment, so a switch that coalesced them
  releases every pending slot.
* With a ``RequesterGate`` a source it cannot verify gets nothing, one over its budget gets
  ``BUSY`` for the part not granted (never silence).
* The queue is bounded: past ``max_queued_fragments``, or ``max_queue_s`` of sending at the
  rate it drains at, GETs are refused ``BUSY`` with a retry hint.  Where the switches merge
  (``FabricHints.merging``) the hint is a booking (every requester refused for a chunk
  comes back at one instant, chunks one after another at the drain rate), a chunk is
  admitted or refused whole (room kept for its rest, ``_reserve``), and a range GET is
  refused only when range answers alone fill the queue (never past twice the bound).
* A joiner's re-ask (``RETRANSMIT | COALESCED``) rides only an owner's answer to a range
  GET that was not a RETRANSMIT, for the same generation (``_carrier``), once for all
  joiners; a long one (past a quarter of the chunk) only once a second joiner re-asks.
* With a gather (``TransportConfig.gather_s``), where the switches merge, the answer to a
  range GET for the head of a chunk the hints call hot or pooled starts that much later, so
  the GETs of its wave join it at a switch before anything passed.
* Pushes (``push``, fills asked for by the controller) become send jobs on the loop thread
  and go only when no answer can.

Everything but ``push`` runs on the transport's loop thread.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

import numpy as np
import numpy.typing as npt

from hostagent.fragment import runs
from hostagent.gate import RequesterGate
from hostagent.hints import FabricHints
from hostagent.holder import Holder
from hostagent.send_queue import SendJob, SendQueue
from hostagent.transport_config import MAX_RETRY_HINT_US, Address, Counters, TransportConfig
from kvpool import wire
from kvpool.hints import GetPath

log = logging.getLogger("kvpool.transport")

_L: Final = wire.DATA_DATAGRAM_LEN
_BOOKING_EARLY_S: Final = 0.05
"""A booked GET may come back this early (or late) and still find its room kept."""
_RESERVE_SLACK_S: Final = 0.1
"""Beyond the queue bound, how long the room kept for a chunk's rest waits for its GETs."""
_CARRIED_SHARE: Final = 4
"""A joiner's re-ask reaching past this share of the chunk rides the answer it joined only when
another joiner of that answer re-asked too (``Server._carried``)."""
_BOOKED_CHUNKS: Final = 1 << 16
"""Chunks with a booking a holder remembers before it forgets the ones whose time has passed."""


def merge_gets(gets: Sequence[tuple[wire.Header, Address]], cap: int) -> list[tuple[wire.Header, int, int, Address]]:
    """Runs of GETs to serve as ``(first GET, first fragment, count, address)``, each at most ``cap`` long.

    Consecutive GETs of one request for adjacent fragments (what a requester on the
    servable path sends) become one range, so the holder makes one ``fragment()``
    call and one send job instead of one per fragment; the requester gets the same DATA.
    A single GET never joins a range GET (nor a range a run of singles): a run of single
    GETs is answered as they were asked, first once it waited the queue bound
    (``SendQueue._send_aged``) and refused one NACK per fragment (``Server._nack_run``),
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


class Server:
    """A holder's GETs in, answers queued or refused out (loop thread only, but ``push``)."""

    def __init__(self, config: TransportConfig, counters: Counters, queue: SendQueue, holder: Holder | None,
                 gate: RequesterGate | None, hints: FabricHints) -> None:
        self.config = config
        self._c = counters
        self._queue = queue
        self.holder = holder
        self.gate = gate
        self.hints = hints
        # Chunks to push unasked (fill on pass), as (key, address); the loop turns them into send jobs.
        self._pushes: collections.deque[tuple[int, Address]] = collections.deque()
        self.pushed_fragments = 0
        # Where the switches merge, refused GETs are told to come back at booked times: the
        # next free time of the holder's calendar, and each chunk's refused GETs all at one.
        self._booked_until = 0.0
        self._rendezvous: dict[int, tuple[float, int, int]] = {}  # chunk -> (when, fragments booked: span)
        # Where the switches merge, a chunk whose length probe was answered keeps room in the
        # queue for the rest of it (``_reserve``): chunk -> (until, fragments), oldest first.
        self._reserved: collections.OrderedDict[int, tuple[float, int]] = collections.OrderedDict()
        self._reserved_total = 0

    def push(self, keys: Sequence[int], to: Address) -> None:
        """Queue pushes of ``keys`` to ``to`` (any thread); the loop turns them into send jobs (``admit_pushes``)."""
        self._pushes.extend((k, to) for k in keys)

    def serve_gets(self, gets: Sequence[tuple[wire.Header, Address]]) -> None:
        """Answer a batch of GETs read from the holder socket, merging runs of single-fragment GETs."""
        for hdr, first, count, addr in merge_gets(gets, self.config.max_fragments_per_get):
            self.serve_get(hdr, first, count, addr)

    def admit_pushes(self) -> None:
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
                self._queue.watch_fills(key, to, int(out[0]["hdr"]["frag_count"]))
            self._queue.add_job(self._job(out, to, key, None, first, 0, 0))
            self.pushed_fragments += int(out.size)
            first += int(out.size)
            if first >= int(out[0]["hdr"]["frag_count"]):
                return

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
        burst), its requesters ask for the rest at once (``Transfers.shared_path``), one GET per
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
        rate = self._queue.drain_rate()
        ahead = self._queue.answers_queued() * _L / rate if rate > 0 else 0.0
        until = now + ahead + self.config.max_queue_s + _RESERVE_SLACK_S
        self._reserved[key] = (until, rest)
        self._reserved_total += rest - kept
        self._c.reserved_chunks += not kept

    def serve_get(self, hdr: wire.Header, first: int, count: int, addr: Address) -> None:
        """Queue the DATA for fragments ``first .. first+count-1`` of ``hdr``'s chunk, or NACK."""
        if self.holder is None:
            self._nack_run(hdr, first, count, wire.Status.UNKNOWN_CHUNK, addr)
            return
        if self.gate is not None:
            allowed = self.gate.admit(addr[0], count)
            if allowed is None:
                self._c.drop("unverified_source")  # no DATA, no NACK: the source may be forged
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
                hint_us = int(min(MAX_RETRY_HINT_US, max(1000.0, self.gate.book_retry_s(addr[0], rest) * 1e6)))
                self._nack_run(hdr, first + allowed, rest, wire.Status.BUSY, addr, hint_us)
                if allowed == 0:
                    return
            count = allowed
        limit = self.queue_limit()
        now = time.monotonic()
        merging = self.hints.merging(now)
        reserved = self._reservation(hdr.chunk_key, now) if merging else 0
        if reserved:
            # The rest of a chunk whose probe was admitted: its room was kept.
            self._take_reserved(hdr.chunk_key, count)
        elif (self._queue.answers_queued() + self._reserved_total >= limit
              and not (merging and self._queue.answers_queued() + self._reserved_total < 2 * limit
                       and (self._booked(hdr.chunk_key) or (hdr.frag_count > 1 and self._queue.range_queued < limit)))):
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
        carrier = self._carried(hdr, first, count, addr) if merging else None
        if carrier is not None and carrier.get is not None:
            # What a requester missed before it joined another's answer: sent once, inside that
            # answer (to its owner, first in its lane), so the switches copy it to every requester
            # that joined, instead of once to each of them.  What another joiner's re-ask already
            # queued there and has not sent yet is not queued twice.
            want = np.zeros(first + count, np.bool_)
            want[first:] = True
            for j in self._queue.jobs_of(hdr.chunk_key):
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
                self._queue.add_job(job, front=True)
            return
        out = self._serve(hdr.chunk_key, first, count, request_id=hdr.request_id, generation=hdr.generation,
                          flags=flags)
        if isinstance(out, wire.Status):
            self._nack_run(hdr, first, count, out, addr)
            return
        job = self._job(out, addr, hdr.chunk_key, hdr, first, hdr.request_id, flags)
        if (merging and self.config.gather_s > 0 and first == 0 and hdr.frag_count > 1
                and not hdr.flags & wire.Flag.RETRANSMIT and self.hints.path(hdr.chunk_key, now) is not GetPath.RANGE):
            # The head of a hot chunk reaching a holder that was idle moments ago: the other
            # requesters of its wave ask within moments, and a switch joins their GETs to this
            # answer only while it is pending; what passed before a GET joined is asked for
            # again and sent a second time.  A busy holder does not wait: its round already
            # delays each new answer, and a gather on top delayed every hot chunk of a replayed
            # tool trace (model, 100 Mbit/s: multicast p50 1.98 s against 1.53 s without).
            job.not_before = self._queue.answering_since(now) + self.config.gather_s
        if merging and count == 1 and hdr.frag_count == 1 and not reserved and not hdr.flags & wire.Flag.RETRANSMIT:
            # A lone single GET: a length probe or the GET a burst starts with; the rest follows.
            self._reserve(hdr.chunk_key, int(out[0]["hdr"]["frag_count"]) - first - 1, now)
        self._queue.add_job(job)

    def _carried(self, hdr: wire.Header, first: int, count: int, addr: Address) -> SendJob | None:
        """The answer a joiner's re-ask of ``first..first+count`` rides (``_carrier``), if it should ride one.

        A copy of what rides goes to every requester that joined the answer, its owner too:
        worth it when others miss it too, switch work for fragments the others have when one
        joiner came alone mid-answer (9% duplicates on a sysprompt replay when every re-ask
        rode).  A short one (a head, at most ``1/_CARRIED_SHARE`` of the chunk: the requesters
        of a wave join within moments of each other and miss the same few fragments) rides
        always; a longer one once another joiner of the answer re-asked too (five late joiners
        of one leaf-spine wave re-asked 53 to 102 first fragments each, alone: 429 sent where
        102 would do).
        """
        carrier = self._carrier(hdr, addr)
        if carrier is None:
            return None
        others = any(j.reaskers - {addr} for j in self._queue.jobs_of(hdr.chunk_key) if j.owner == carrier.owner)
        carrier.reaskers.add(addr)
        assert self.holder is not None
        total = self.holder.known_fragments(hdr.chunk_key) or 0
        return carrier if others or _CARRIED_SHARE * (first + count) <= total else None

    def _carrier(self, hdr: wire.Header, addr: Address) -> SendJob | None:
        """The answer in progress that a joiner's re-ask of what it missed can ride, if any.

        Only a GET that says it is one (``RETRANSMIT | COALESCED``, ``Transfers._join``), from a
        requester with no answer of its own for the chunk queued, riding an answer to a range GET
        that was not a RETRANSMIT (switches coalesce only those, and a RETRANSMIT opens no slot)
        for the generation the other answer's GET asked for: then the requester waits in a
        switch's pending slot of that answer's owner, and the oldest such answer still sending is
        the one whose GET opened it.  (Riding another joiner's re-ask instead, the fragments went
        to that joiner alone and the rest waited ``Transfers.join_patience_s`` for them.)
        """
        want = wire.Flag.RETRANSMIT | wire.Flag.COALESCED
        if hdr.flags & want != want:
            return None
        jobs = self._queue.jobs_of(hdr.chunk_key)
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
        self._queue.pool.last = None
        return self.holder.serve(key, first, count, request_id=request_id, generation=generation, flags=flags,
                                 alloc=self._queue.pool.alloc)

    def _job(self, out: npt.NDArray[np.void], to: Address, key: int, get: wire.Header | None, first: int,
             request_id: int, flags: int) -> SendJob:
        """A send job for what ``_serve`` returned: its own pooled array, or a view of the holder's kept records."""
        own = self._queue.pool.last is not None and out.base is self._queue.pool.last
        base = self._queue.pool.last if own else None
        self._queue.pool.last = None
        return SendJob(out, out.view(np.uint8).data, to, 0, int(out.size), base, key, get, first,
                        stamp=None if own else (request_id, flags))

    def queue_limit(self) -> int:
        """Fragments the send queue may hold before GETs are answered BUSY."""
        cfg = self.config
        limit = cfg.max_queued_fragments
        rate = self._queue.drain_rate()
        if cfg.max_queue_s > 0 and rate > 0:
            limit = min(limit, max(cfg.send_quantum, int(cfg.max_queue_s * rate / _L)))
        return limit

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
        rate = self._queue.drain_rate()
        if rate <= 0:
            return 0
        now = time.monotonic()
        start = now + max(0, self._queue.answers_queued() - limit // 2) * _L / rate
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
        return int(min(MAX_RETRY_HINT_US, max(1000.0, (start - now) * 1e6)))

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
        assert self._queue.sock is not None
        pkt = wire.nack_packet(hdr.chunk_key, status, hdr.request_id, hdr.frag_index, hdr.frag_count,
                               hdr.generation, retry_us=retry_us)
        try:
            self._queue.sock.sendto(pkt, addr)
            self._c.nacks_sent += 1
        except OSError:
            self._c.send_errors += 1

