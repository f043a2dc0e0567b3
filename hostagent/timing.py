"""Where a chunk transfer's time went: a few numbers per request (requester) and per answer (holder).

Requester side.  Every ``FetchResult`` carries a ``FetchTiming``, filled by the transport's
loop at the moments the request's state already changes (no per-packet object, a few floats
and ints per request).  Seconds, on the monotonic clock, from the ``fetch`` call that
submitted the request:

* ``queue_s``: until its first GET went out (waiting for a transfer slot or for budget:
  ``max_active_requests``, ``max_inflight_fragments``);
* ``first_byte_s``: from that GET until the first of its fragments was stored;
* ``stream_s``: from the first fragment stored to the last;
* ``total_s``: until it ended (``queue_s + first_byte_s + stream_s``, plus the final check);
* ``busy_s``: refused, from a ``BUSY`` NACK to the re-ask of what it refused (``busy``: NACKs);
* ``rto_s``: silence waited out before each retransmit round (``retransmit_rounds``): from
  the request's last progress (or its last re-ask) to the re-ask.

``busy_s`` and ``rto_s`` are not further phases: they lie inside ``first_byte_s`` and
``stream_s`` (a request may stream some fragments while others are refused).  ``fragments``
counts the fragments stored, ``coalesced`` those that came as a switch's replica of another
requester's answer (``Flag.COALESCED``), ``switch_served`` those a switch answered from its
pool (``Flag.SWITCH_SERVED``), ``duplicates`` the copies that stored nothing.  ``shared``:
the call took another call's transfer of the chunk (the times are that transfer's).

``summarize`` sums a call's timings into the JSON object the agent's API answers
(``hostagent.api``: ``timing`` in ``/v1/prefetch``, ``X-Kvpool-Timing`` on ``/v1/fetch``);
``merge`` adds two such objects (a request fetched from several holders).

Holder side.  ``AnswerWaits`` aggregates, per holder, how long each GET's answer waited in
the send queue before its first DATA went out, in a fixed log-spaced histogram (so two
snapshots subtract: ``waits_between``), and the part of it that was a hold (``hold_s``)
apart: ``queue`` excludes holds, ``hold`` counts the held answers and their held time.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from kvpool import wire

# ---------------------------------------------------------------------------------- requester


@dataclass(slots=True)
class FetchTiming:
    """Where one chunk transfer's time went, on the requester (see the module docstring)."""

    total_s: float = 0.0
    queue_s: float = 0.0
    first_byte_s: float = 0.0
    stream_s: float = 0.0
    busy_s: float = 0.0
    busy: int = 0
    rto_s: float = 0.0
    retransmit_rounds: int = 0
    fragments: int = 0
    coalesced: int = 0
    switch_served: int = 0
    duplicates: int = 0
    shared: bool = False
    # Marks (monotonic seconds) the transport's events set; 0.0: not yet.
    t_submit: float = field(default_factory=time.monotonic, repr=False)
    t_first_get: float = field(default=0.0, repr=False)
    t_first_data: float = field(default=0.0, repr=False)
    t_last_data: float = field(default=0.0, repr=False)
    t_refused: float = field(default=0.0, repr=False)
    t_re_ask: float = field(default=0.0, repr=False)

    def first_get(self, now: float) -> None:
        """The request's first GET went out."""
        if not self.t_first_get:
            self.t_first_get = now

    def arrived(self, now: float, stored: int, duplicates: int) -> None:
        """A run of its DATA arrived: ``stored`` fragments new, ``duplicates`` copies of stored ones."""
        self.duplicates += duplicates
        if stored:
            if not self.t_first_data:
                self.t_first_data = now
            self.t_last_data = now

    def refused(self, now: float) -> None:
        """A ``BUSY`` NACK came (the first of a refusal starts its wait)."""
        self.busy += 1
        if not self.t_refused:
            self.t_refused = now

    def re_asked_refused(self, now: float) -> None:
        """What the holder refused was asked again: the refusal's wait ends."""
        if self.t_refused:
            self.busy_s += now - self.t_refused
            self.t_refused = 0.0
        self.t_re_ask = now

    def re_asked_silent(self, now: float, last_progress: float) -> None:
        """A retransmit round: the silence since the last progress (or the last re-ask) was waited out."""
        self.rto_s += max(0.0, now - max(last_progress, self.t_re_ask, self.t_first_get))
        self.t_re_ask = now

    def finish(self, now: float, retransmit_rounds: int, received: npt.NDArray[np.bool_] | None = None,
               flags: npt.NDArray[np.uint16] | None = None) -> None:
        """The request ended: durations from the marks; fragments by how they came (``received``, ``flags``)."""
        if self.t_refused:  # ended while refused: the refusal's wait counts to the end
            self.busy_s += now - self.t_refused
            self.t_refused = 0.0
        self.total_s = max(0.0, now - self.t_submit)
        self.queue_s = (self.t_first_get - self.t_submit) if self.t_first_get else self.total_s
        if self.t_first_data:
            self.first_byte_s = self.t_first_data - (self.t_first_get or self.t_submit)
            self.stream_s = self.t_last_data - self.t_first_data
        self.retransmit_rounds = retransmit_rounds
        if received is not None and flags is not None:
            got = flags[: received.size][received]
            self.fragments = int(got.size)
            if int(np.bitwise_or.reduce(got, initial=0)) & _PATH_FLAGS:
                self.coalesced = int(np.count_nonzero(got & _COALESCED))
                self.switch_served = int(np.count_nonzero(got & _SWITCH_SERVED))
            else:  # every fragment from the holder: no pass per flag
                self.coalesced = self.switch_served = 0

    def as_json(self) -> dict[str, Any]:
        """The durations and counts (no marks), seconds rounded to microseconds."""
        return {name: (round(value, 6) if isinstance(value, float) else value)
                for name, value in ((n, getattr(self, n)) for n in TIMING_FIELDS)}


TIMING_FIELDS: Final = ("total_s", "queue_s", "first_byte_s", "stream_s", "busy_s", "busy", "rto_s",
                        "retransmit_rounds", "fragments", "coalesced", "switch_served", "duplicates", "shared")
"""``FetchTiming``'s reported fields, in order (what ``as_json`` writes)."""

_SUMMED: Final = tuple(n for n in TIMING_FIELDS if n != "shared")


def summarize(timings: Iterable[FetchTiming]) -> dict[str, Any]:
    """One call's chunks summed: ``chunks``, each field of ``TIMING_FIELDS`` summed (``shared``: how many
    were), and ``slowest_s``, the longest ``total_s`` (chunks transfer at once: sums are chunk-seconds)."""
    out: dict[str, Any] = {"chunks": 0, **dict.fromkeys(_SUMMED, 0), "shared": 0, "slowest_s": 0.0}
    for t in timings:
        out["chunks"] += 1
        for name in _SUMMED:
            out[name] += getattr(t, name)
        out["shared"] += int(t.shared)
        out["slowest_s"] = max(out["slowest_s"], t.total_s)
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two ``summarize`` objects added (``slowest_s``: the larger); fields only one has are kept."""
    out = dict(a)
    for name, value in b.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if name == "slowest_s":
            out[name] = max(float(out.get(name, 0.0)), float(value))
        else:
            total = out.get(name, 0) + value
            out[name] = round(total, 6) if isinstance(total, float) else total
    return out


_COALESCED: Final = int(wire.Flag.COALESCED)
_SWITCH_SERVED: Final = int(wire.Flag.SWITCH_SERVED)
_PATH_FLAGS: Final = _COALESCED | _SWITCH_SERVED

PATHS: Final = ("holder", "coalesced", "switch")
"""How a fragment reached a requester: from the holder, as a switch's replica of another requester's
answer (``Flag.COALESCED``), or from a switch's pool (``Flag.SWITCH_SERVED``)."""


def bytes_by_path(flags: npt.NDArray[np.uint16], chunk_len: int) -> tuple[int, int, int]:
    """A complete chunk's payload bytes by ``PATHS`` (``flags``: each fragment's, as stored)."""
    n = wire.fragment_count(chunk_len)
    got = flags[:n]
    if not int(np.bitwise_or.reduce(got, initial=0)) & _PATH_FLAGS:
        return chunk_len, 0, 0  # every fragment from the holder (the usual case: no pass per path)
    size = np.full(n, wire.FRAG_PAYLOAD, dtype=np.int64)
    size[-1] = chunk_len - (n - 1) * wire.FRAG_PAYLOAD
    switch = (got & _SWITCH_SERVED) != 0
    coalesced = ((got & _COALESCED) != 0) & ~switch
    s, c = int(size[switch].sum()), int(size[coalesced].sum())
    return chunk_len - s - c, c, s


# ---------------------------------------------------------------------------------- holder

WAIT_EDGES_S: Final = tuple(1e-4 * 2 ** (i / 4) for i in range(81))
"""Upper edges of the answer-wait histogram's buckets: 0.1 ms to about 105 s, four per doubling
(bucket i holds waits in ``(edge[i-1], edge[i]]``; one more bucket past the last edge)."""


@dataclass(slots=True)
class AnswerWaits:
    """A holder's answers: how long each waited in the queue before its first DATA went out, holds apart."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_EDGES_S) + 1))
    """Answers per bucket of queueing (hold excluded), ``WAIT_EDGES_S``."""
    queue_sum_s: float = 0.0
    queue_max_s: float = 0.0
    held: int = 0
    """Answers that waited out a hold (their own, or their chunk's)."""
    hold_sum_s: float = 0.0

    def add(self, wait_s: float, hold_s: float = 0.0) -> None:
        """One answer's first DATA went out ``wait_s`` after its GET was queued, ``hold_s`` of it held."""
        hold_s = min(max(0.0, hold_s), wait_s)
        queue = max(0.0, wait_s - hold_s)
        self.counts[bisect.bisect_left(WAIT_EDGES_S, queue)] += 1
        self.queue_sum_s += queue
        self.queue_max_s = max(self.queue_max_s, queue)
        if hold_s > 0:
            self.held += 1
            self.hold_sum_s += hold_s

    def summary(self) -> dict[str, Any]:
        """The JSON object of ``stats()["answer_wait"]``: count, sum, p50/p99/max (s), holds, bucket counts."""
        return wait_summary(list(self.counts), self.queue_sum_s, self.queue_max_s, self.held, self.hold_sum_s)


def bucket_quantile(counts: list[int], q: float, cap: float = math.inf) -> float:
    """The ``q``-th percentile (nearest rank) of a ``WAIT_EDGES_S`` histogram: its bucket's upper edge, capped."""
    n = sum(counts)
    if n == 0:
        return 0.0
    rank = min(n, max(1, math.ceil(q / 100 * n)))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            edge = WAIT_EDGES_S[i] if i < len(WAIT_EDGES_S) else math.inf
            return min(edge, cap)
    return cap


def wait_summary(counts: list[int], queue_sum_s: float, queue_max_s: float, held: int,
                 hold_sum_s: float) -> dict[str, Any]:
    """The answer-wait JSON object from its parts (percentiles are bucket edges: within 19% above)."""
    return {"answers": sum(counts), "queue_sum_s": round(queue_sum_s, 6),
            "queue_p50_s": round(bucket_quantile(counts, 50, queue_max_s), 6),
            "queue_p99_s": round(bucket_quantile(counts, 99, queue_max_s), 6),
            "queue_max_s": round(queue_max_s, 6), "held": held, "hold_sum_s": round(hold_sum_s, 6),
            "buckets": counts}


def waits_between(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, Any]:
    """What a holder's ``answer_wait`` gained from ``before`` to ``after`` (two ``summary`` snapshots).

    The maximum is ``after``'s (a snapshot keeps no history of it): at most the window's.
    """
    a = list(after.get("buckets", []))
    b = list((before or {}).get("buckets", [])) or [0] * len(a)
    if len(a) != len(b):
        b = [0] * len(a)
    counts = [x - y for x, y in zip(a, b, strict=True)]
    get = (before or {}).get
    return wait_summary(counts, float(after.get("queue_sum_s", 0.0)) - float(get("queue_sum_s", 0.0)),
                        float(after.get("queue_max_s", 0.0)), int(after.get("held", 0)) - int(get("held", 0)),
                        float(after.get("hold_sum_s", 0.0)) - float(get("hold_sum_s", 0.0)))
