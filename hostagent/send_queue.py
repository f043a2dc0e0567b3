"""The holder's send side: queued answers and pushes, sent paced and in turn.

A ``SendQueue`` holds the DATA a holder owes (``SendJob``: records of one chunk for one
address) and sends it on the holder socket, which ``hostagent.transport`` opens and
closes.  What is queued, and whether a GET is refused instead, is ``hostagent.serving``'s
decision; this module only keeps the order and the pace:

* a lone GET of fragment 0 (a length probe) goes before everything else;
* answers to single GETs that waited the queue bound (``max_queue_s``) go next, oldest first;
* then the requests with answers queued take turns of ``send_quantum`` DATA (``Lanes``,
  each request's answers in the order they were queued), skipping a request whose next
  answer waits for its gather (``SendJob.not_before``);
* pushes (fills asked for by the controller) go only when no answer can, without the
  fragments answers carried since the push was asked for (the fill watch).

Pacing is a token bucket of ``rate_bytes_per_s``, ``pace_depth_bytes`` deep when the
queue ran empty and ``pace_catchup_bytes`` while backlogged.  ``DrainMeter`` measures
the rate the queue really drains at, which bounds the queue in time.  Record arrays come
from a bounded pool (``RecordPool``) and go back when their job is done.  Everything
here runs on the transport's loop thread.
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from hostagent.holder import stamp
from hostagent.timing import AnswerWaits
from hostagent.transport_config import Address, Counters, TransportConfig
from kvpool import wire
from kvpool.sockets import UDP_MAX_GSO_BYTES, gso_cmsg, gso_path_refusal, gso_supported

log = logging.getLogger("kvpool.transport")

_L: Final = wire.DATA_DATAGRAM_LEN

_POOL_RECORDS: Final = 1 << 15
"""Most DATA records (about 47 MB) a holder keeps in its pool of free send arrays."""
_GSO_SEGMENTS: Final = min(44, UDP_MAX_GSO_BYTES // _L)
"""Most DATA datagrams in one segmented send: 44 x 1448 B, within one 64 KiB IPv4 send."""
_GSO_CMSG: Final = gso_cmsg(_L)
_GSO_REFUSED: Final = frozenset({errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EMSGSIZE})
"""Errors of a segmented send that mean the kernel or the path cannot take one (udp_send_skb):
EIO where the egress cannot checksum it, EINVAL where segments would exceed the path's MTU."""
_DRAIN_WINDOW_S: Final = 0.25
"""Seconds of backlogged sending over which a holder measures the rate its queue drains at."""


@dataclass(eq=False, slots=True)
class SendJob:
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
    """Monotonic time it was queued, for answers to single GETs (``SendQueue._send_aged``)."""
    carried: bool = False
    """It carries what joiners of its owner's answer missed (``Server._carrier``), not what the owner asked."""
    reaskers: set[Address] = field(default_factory=set)
    """Joiners of this answer that re-asked what they missed (``Server._carried``)."""
    stamp: tuple[int, int] | None = None
    """``(request id, flags)`` written into each quantum before it is sent, when ``records``
    are the holder's kept records (shared with other answers of the chunk); None: its own."""
    enqueued: float = 0.0
    """Monotonic time it was queued (``AnswerWaits``: how long an answer waited for its first DATA)."""
    not_before: float = 0.0
    """Monotonic time before which none of it is sent: a gather (``TransportConfig.gather_s``)."""

    @property
    def owner(self) -> tuple[Address, int] | None:
        """Whose request this answers, ``(requester, request id)``; None for a push."""
        return None if self.get is None else (self.addr, self.get.request_id)

    @property
    def ranged(self) -> bool:
        """Whether it answers a range GET (what plain forwarding asks with), not single ones or a push."""
        return self.get is not None and self.get.frag_count > 1


class Lanes:
    """Answers queued to send, by the request they answer: each request's in the order they were queued."""

    def __init__(self) -> None:
        self.by_owner: dict[tuple[Address, int] | None, collections.deque[SendJob]] = {}
        self.order: collections.deque[tuple[Address, int] | None] = collections.deque()
        """Requests with answers queued, in round-robin order (the next to send first)."""

    def append(self, job: SendJob, front: bool = False) -> None:
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

    def remove(self, job: SendJob) -> None:
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



class RecordPool:
    """Free DATA record arrays by size class, so serving a GET reuses pages instead of faulting in new ones."""

    def __init__(self) -> None:
        self._free: dict[int, list[npt.NDArray[np.void]]] = {}
        self._pooled = 0
        self.last: npt.NDArray[np.void] | None = None
        """The last array ``alloc`` gave out (``hostagent.serving`` tells its own arrays from kept records)."""

    def alloc(self, n: int) -> npt.NDArray[np.void]:
        """A record array of at least ``n`` records, reused when one of its size class is free."""
        size = 1 << max(0, n - 1).bit_length()  # power-of-two size classes
        for cls in (size, size * 2, size * 4):  # a somewhat larger free array beats fresh pages
            free = self._free.get(cls)
            if free:
                self._pooled -= cls
                self.last = free.pop()
                return self.last
        self.last = np.empty(size, dtype=wire.DATA_PACKET_DTYPE)
        return self.last

    def release(self, job: SendJob) -> None:
        """Give a finished job's array back to the pool (bounded, so an idle holder holds little)."""
        base = job.base
        if base is None or self._pooled + base.size > _POOL_RECORDS:
            return
        # The job's views must go first: the array is refilled by the next GET.
        job.view.release()
        job.base = None
        self._free.setdefault(int(base.size), []).append(base)
        self._pooled += int(base.size)


class SendQueue:
    """What a holder owes, sent paced on the holder socket (loop thread only)."""

    def __init__(self, config: TransportConfig, counters: Counters) -> None:
        self.config = config
        self._c = counters
        self.sock: socket.socket | None = None
        """The holder socket (set by the transport while it runs)."""
        self.pool = RecordPool()
        self.lanes = Lanes()
        # Answers to single GETs in the order they were queued: a switch waits for them (``_send_aged``).
        self._aged: collections.deque[SendJob] = collections.deque()
        # Pushes (a fill asked for by the controller): sent only when no answer can go (``add_job``).
        self._background: collections.deque[SendJob] = collections.deque()
        self._background_queued = 0
        # Chunks with a push queued, per fill sink: which of their fragments an answer carried
        # since that push was asked for (they filled the switch on pass, ``_skip_redundant_pushes``).
        self._fill_watch: dict[int, dict[Address, npt.NDArray[np.bool_]]] = {}
        # Answers to a lone GET of fragment 0, sent before the other jobs (``add_job``).
        self._probes: collections.deque[SendJob] = collections.deque()
        # Queued answers and pushes by chunk (a push's fill watch ends with its last push, ``_job_done``).
        self._jobs_by_key: dict[int, list[SendJob]] = {}
        self.queued = 0
        """Fragments queued, answers and pushes."""
        self.range_queued = 0
        """Of ``queued``: answers to range GETs (``SendJob.ranged``)."""
        self.drain = DrainMeter()
        self.waits = AnswerWaits()  # how long answers waited in the queue (``_note_first_answer``)
        self.skipped_push_fragments = 0
        self.gso_segments = 1
        """Most DATA datagrams per send: 1 until ``use_gso`` turned segmented sends on, and after a refusal."""
        self.gso_fallback = ""
        """Why segmented sends are off ("" while on, or never asked for)."""
        self._tokens = config.pace_depth_bytes
        self._backlogged = False  # whether the last send pass left answers only the tokens held back
        self._gathering_until = 0.0
        """When the first gather ends, while every answer the last pass left waits for one (else 0)."""
        self._answering_since = 0.0
        """When the queue last went from no answers to some (``answering_since``)."""
        self._last_refill = time.monotonic()

    def __len__(self) -> int:
        """Send jobs queued (answers, probes and pushes)."""
        return len(self.lanes) + len(self._probes) + len(self._background)

    def pending(self) -> bool:
        """Whether anything is queued to send."""
        return bool(self.lanes or self._probes or self._background)

    def pace_wait_ms(self) -> int:
        """Milliseconds until the bucket holds a datagram's tokens (0: send now); only while ``pending``.

        While every answer queued waits for its gather, until the first gather ends.
        """
        rate = self.config.rate_bytes_per_s
        wait = 0 if rate <= 0 or self._tokens >= _L else max(1, int((_L - self._tokens) / rate * 1000))
        if self._gathering_until and not self._probes:
            wait = max(wait, 1 + int((self._gathering_until - time.monotonic()) * 1000))
        return wait

    def answering_since(self, now: float) -> float:
        """When the answers queued now started to queue after the queue last had none (``now`` if none)."""
        return now if not self.lanes and not self._probes else self._answering_since

    def jobs_of(self, key: int) -> list[SendJob] | tuple[()]:
        """The jobs queued for chunk ``key``, in the order they were queued (answers and pushes)."""
        return self._jobs_by_key.get(key, ())

    def watch_fills(self, key: int, to: Address, frag_count: int) -> None:
        """A placement's own push of ``key`` to ``to`` was queued: note what answers carry from now on."""
        self._fill_watch.setdefault(key, {})[to] = np.zeros(frag_count, np.bool_)

    def answers_queued(self) -> int:
        """Fragments queued to answer GETs (pushes wait for idle time and do not count)."""
        return self.queued - self._background_queued

    def drain_rate(self) -> float:
        """Bytes/s the send queue drains at: the pacing rate, or what this host manages when that is less.

        A holder whose CPU cannot keep its pacing rate (a small, busy machine) drains more
        slowly than it paces: the time bound of its queue must use the rate it achieves, or
        the answers wait longer than every timeout downstream.  Unpaced: 0 (no time bound).
        """
        rate = self.config.rate_bytes_per_s
        if rate <= 0 or self.drain.rate <= 0:
            return rate
        return min(rate, max(self.drain.rate, rate / 20))

    def sample_drain(self, now: float) -> None:
        """Feed the drain meter after a send pass (idle is no drain: the meter starts a new window after it)."""
        self.drain.sample(now, self.queued > 0, self._c.bytes_sent)

    def add_job(self, job: SendJob, front: bool = False) -> None:
        """Queue a send job (and index it by chunk: a push's fill watch looks its chunk's jobs up).

        A lone GET of fragment 0 is how a requester that does not know a chunk's length asks
        for it (the servable path without a hinted length): its whole chunk waits on
        this one datagram, and where the switches merge, the rest of its GETs must reach the
        switch while another requester's are still pending there.  So it goes before every
        other job instead of waiting for each of them to take a turn (64 queued answers are
        70 ms at 10 Mbit/s); a probe is one datagram, so the others barely notice.
        """
        now = time.monotonic()
        if job.get is not None and not self.lanes and not self._probes:
            self._answering_since = now
        if job.get is None:
            self._background.append(job)
            self._background_queued += job.count
        elif job.first == 0 and job.count == 1:
            self._probes.append(job)
        else:
            self.lanes.append(job, front)
            if job.get is not None and not job.ranged and self.config.max_queue_s > 0:
                job.queued_at = now
                self._aged.append(job)
        self._jobs_by_key.setdefault(job.key, []).append(job)
        self._dequeued(job, -job.count)
        job.enqueued = now

    def _dequeued(self, job: SendJob, n: int) -> None:
        """``n`` of ``job``'s fragments left the send queue (sent, cancelled, abandoned; negative: queued)."""
        self.queued -= n
        if job.ranged:
            self.range_queued -= n

    def _job_done(self, job: SendJob) -> None:
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
        self.pool.release(job)

    def send(self) -> bool:
        """Send queued DATA, paced: length probes first, then round robin.

        True if the socket buffer is full.
        """
        self._gathering_until = 0.0
        if not self.lanes and not self._probes and not self._background:
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
            more, blocked = self._send_lanes(self.lanes, budget - sent, now)
            sent += more
        # Answers left that could go but for the tokens: the link stays busy until the next pass.
        # Answers that wait for their gather keep it idle, as an empty queue does.
        self._backlogged = bool(self._probes) or (bool(self.lanes) and not self._gathering_until)
        if not blocked and sent < budget and self._background and not self._backlogged:
            # Nothing else can go: a push takes the idle time (a fill, never ahead of an answer).
            self._skip_redundant_pushes()
            before = self.queued
            more, blocked = self._send_from(self._background, budget - sent)
            sent += more
            self._background_queued -= before - self.queued
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
            self.queued -= skipped
            self._background_queued -= skipped
            self.skipped_push_fragments += skipped

    def _send_from(self, jobs: collections.deque[SendJob], budget: int) -> tuple[int, bool]:
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

    def _send_lanes(self, lanes: Lanes, budget: int, now: float) -> tuple[int, bool]:
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
        waiting = 0  # requests in a row whose next answer waits for its gather
        gather_ends = float("inf")
        while order and sent < budget:
            owner = order[0]
            lane = lanes.by_owner[owner]
            if lane[0].not_before > now:
                gather_ends = min(gather_ends, lane[0].not_before)
                waiting += 1
                if waiting >= len(order):
                    self._gathering_until = gather_ends  # nothing else can go until then
                    break
                order.rotate(-1)
                continue
            waiting = 0
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

    def _send_aged(self, lanes: Lanes, budget: int, now: float) -> tuple[int, bool]:
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

    def _note_first_answer(self, job: SendJob) -> None:
        """An answer's first DATA went out: note how long it waited since it was queued."""
        self.waits.add(time.monotonic() - job.enqueued)

    def use_gso(self, sock: socket.socket, host: str = "127.0.0.1") -> None:
        """Send runs of DATA as segmented sends on ``sock`` (the holder socket, bound to ``host``) where they are safe.

        Off where the kernel refuses the option, or where the egress would pass segmented
        frames whole to a virtual link (``kvpool.sockets.gso_path_refusal``); a send the path
        refuses later turns it off too (``_send_quantum``).  Each logged once.
        """
        if not gso_supported(sock, _L):
            self._gso_refused("the kernel refused UDP_SEGMENT on the socket")
            return
        why = gso_path_refusal(host)
        if why:
            self._gso_refused(why)
            return
        self.gso_segments = _GSO_SEGMENTS

    def _gso_refused(self, why: str) -> None:
        """Segmented sends are off for good on this socket: one call per datagram from now on (logged once)."""
        self.gso_segments = 1
        self.gso_fallback = why
        log.warning("UDP GSO off, one send per DATA datagram: %s", why)

    def _send_quantum(self, job: SendJob, budget: int) -> tuple[int, bool]:
        """Send ``job``'s next quantum (at most ``budget`` DATA); (datagrams sent, socket buffer full).

        With GSO a run of k records goes in one send of k x 1448 bytes, which the kernel
        splits into k ordinary datagrams (all DATA datagrams have one size, so every segment is
        whole): one syscall per run instead of one per datagram.  The run is at most what the
        quantum and the pacing budget allow, so a segmented send is one burst the pacer sized.
        """
        assert self.sock is not None
        sendto, sendmsg = self.sock.sendto, self.sock.sendmsg
        blocked = False
        end = min(job.count, job.pos + self.config.send_quantum, job.pos + budget)
        view, addr = job.view, job.addr
        pos = job.pos
        if job.stamp is not None and end > pos:
            # Kept records are shared by every answer of the chunk: this answer's request
            # id and flags go in right before its datagrams are sent.
            stamp(job.records[pos:end], *job.stamp)
        calls = 0
        try:
            while pos < end:
                segs = self.gso_segments
                if segs > 1:
                    # Even runs: a 64-record quantum goes as 32 + 32, not 44 + 20.
                    left = end - pos
                    k = -(-left // -(-left // segs))
                    try:
                        if k > 1:
                            sendmsg([view[pos * _L : (pos + k) * _L]], _GSO_CMSG, 0, addr)
                        else:
                            sendto(view[pos * _L : (pos + 1) * _L], addr)
                    except OSError as exc:
                        if k == 1 or exc.errno not in _GSO_REFUSED:
                            raise
                        # Nothing of a refused segmented send left.  If one datagram goes where
                        # the run did not, the segmenting was refused: one by one from now on.
                        # If it fails as well, the peer is at fault (the except below).
                        sendto(view[pos * _L : (pos + 1) * _L], addr)
                        pos += 1
                        calls += 1
                        self._gso_refused(f"segmented send to {addr} failed: {exc}")
                        continue
                    pos += k
                    calls += 1
                    continue
                # The tightest loop Python offers: one slice and one syscall per datagram.
                for off in range(pos * _L, end * _L, _L):
                    sendto(view[off : off + _L], addr)
                    pos += 1
                    calls += 1
        except BlockingIOError:
            blocked = True
        except OSError as exc:
            self._c.send_errors += 1
            log.debug("DATA to %s failed: %s", addr, exc)
            # An unreachable peer: abandon the rest of the job; a live requester re-asks.
            self._dequeued(job, job.count - pos)
            job.count = pos
        self._c.send_calls += calls
        sent = pos - job.pos
        if job.pos == 0 and sent and job.get is not None:
            self._note_first_answer(job)
        self._dequeued(job, sent)
        if job.get is not None and (watches := self._fill_watch.get(job.key)) is not None:
            for watch in watches.values():
                watch[job.first + job.pos : job.first + pos] = True
        job.pos = pos
        return sent, blocked
