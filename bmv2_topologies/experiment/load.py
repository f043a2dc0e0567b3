"""What a replay asks of a holder's link, and the least it could cost: offered load, ideal bytes, deadline.

Pure arithmetic over the request stream (``workload.Request``: arrival time, chunk keys)
and the chunks' serialized lengths; the testbed prints it before a run and reports the
ideal beside what each mode measured.

*Wire bytes* of a chunk are its DATA frames on the link: ``fragment_count(nbytes)`` frames
of ``DATA_FRAME_BYTES`` (Ethernet + IPv4 + UDP + kvpool header + 1408 payload bytes).
Request packets (GETs, a few percent at most) are not counted, so what a mode measured is
held against the ideal by the DATA its holders sent (``ModeResult.holder_data_bytes``).

**Offered load** of a holder: the wire bytes of every chunk the replay asks of it, per
second of the replay's span (first to last arrival, after ``--time-scale``), and the same
over the busiest ``window_s``; both against the capacity of the holder's link (its
bandwidth in bytes/s).  Above 1 the link cannot keep up and requests queue.

**Overlapping window** (docs/guide/experiments.md, "Replaying a trace", says the same).  Request *i*, arriving at
``a_i`` and asking for ``b_i`` wire bytes, has the window ``[a_i, a_i + b_i / C]``, ``C``
the link capacity: the time it would take with the link to itself.  For one chunk, take
the requests that ask for it in arrival order; a request joins the current group when it
arrives before every request of the group has ended (``a_j <= max(a_i + b_i / C)`` over
the group), else it opens a new group.  Each group is one overlapping window of that
chunk: a switch that merges requests in flight at the same time can carry the chunk once
per window.

**Ideal bytes** per mode: ``plain`` (the switch only forwards) carries every request's
bytes; ``multicast`` and ``pool`` carry each distinct chunk once per overlapping window.
``kvpool.report.saved_of_ideal`` compares what a mode saved against plain with what the ideal saves against
plain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvpool import wire

DATA_FRAME_BYTES = wire.ETHERNET_HEADER_LEN + wire.IPV4_HEADER_LEN + wire.UDP_HEADER_LEN + wire.DATA_DATAGRAM_LEN
"""One DATA packet on the link (1490 bytes)."""
MIN_DEADLINE_S = 60.0
MAX_DEADLINE_S = 3600.0
"""The agent API's longest fetch deadline."""
DEADLINE_FACTOR = 10.0
"""Default deadline: this many times the replay's bytes at line rate (the emulated switch and
the agents run well below line rate on a small machine: the deadline must not be what fails)."""


class Timed(Protocol):
    """A request as the arithmetic needs it (``workload.Request`` is one)."""

    @property
    def at_s(self) -> float:
        """Arrival, seconds after the replay starts."""

    @property
    def keys(self) -> tuple[int, ...]:
        """The chunks it asks for."""


def wire_bytes(nbytes: int) -> int:
    """DATA bytes on the link for one chunk of ``nbytes`` serialized bytes."""
    return wire.fragment_count(nbytes) * DATA_FRAME_BYTES


def request_bytes(req: Timed, chunk_len: Mapping[int, int]) -> int:
    """Wire bytes one request asks for."""
    return sum(wire_bytes(chunk_len[k]) for k in req.keys)


@dataclass(frozen=True)
class OfferedLoad:
    """Bytes/s a replay asks of one holder against its link's capacity."""

    holder: str
    total_bytes: int
    span_s: float
    capacity_bps: float
    """Link capacity, bytes/s."""
    peak_bytes: int
    """Most bytes asked by requests arriving within one ``window_s``."""
    window_s: float

    @property
    def mean_bps(self) -> float:
        """Bytes/s over the span (over one window when every request arrives at once)."""
        return self.total_bytes / max(self.span_s, self.window_s)

    @property
    def peak_bps(self) -> float:
        """Bytes/s over the busiest window."""
        return self.peak_bytes / self.window_s

    @property
    def work_s(self) -> float:
        """Seconds the link needs for everything at line rate."""
        return self.total_bytes / self.capacity_bps

    def line(self) -> str:
        """One line for the run's preamble."""
        return (f"offered load on {self.holder}: {self.total_bytes / 1e6:.1f} MB asked over {self.span_s:.1f} s, "
                f"{self.mean_bps / 1e6:.2f} MB/s on average ({self.mean_bps / self.capacity_bps:.2f}x the link's "
                f"{self.capacity_bps / 1e6:.2f} MB/s), {self.peak_bps / 1e6:.2f} MB/s in the busiest "
                f"{self.window_s:g} s ({self.peak_bps / self.capacity_bps:.2f}x); {self.work_s:.1f} s of work "
                f"at line rate")


def offered_load(requests: Sequence[Timed], chunk_len: Mapping[int, int], capacity_bps: float, *,
                 holder: str = "holder", window_s: float = 1.0) -> OfferedLoad:
    """The load ``requests`` put on one holder whose link carries ``capacity_bps`` bytes/s."""
    if capacity_bps <= 0 or window_s <= 0:
        raise ValueError(f"capacity and window must be positive, got {capacity_bps} and {window_s}")
    timed = sorted((r.at_s, request_bytes(r, chunk_len)) for r in requests)
    total = sum(b for _, b in timed)
    span = timed[-1][0] - timed[0][0] if timed else 0.0
    peak = lo = inside = 0
    for at, b in timed:  # sliding window over arrivals: [at - window_s, at]
        inside += b
        while timed[lo][0] <= at - window_s:
            inside -= timed[lo][1]
            lo += 1
        peak = max(peak, inside)
    return OfferedLoad(holder, total, span, capacity_bps, peak, window_s)


@dataclass(frozen=True)
class Share:
    """The part of one request a single holder serves: its arrival and the keys that holder holds."""

    at_s: float
    keys: tuple[int, ...]


def shares(requests: Sequence[Timed], holder_of: Callable[[int], str]) -> dict[str, list[Share]]:
    """Holder -> its share of every request that asks it for something (keys in request order).

    Chunks dealt over several holders load several links, each with its own capacity: the
    offered load, the overlapping windows and the ideal are each holder's, from its share.
    """
    out: dict[str, list[Share]] = {}
    for r in requests:
        by: dict[str, list[int]] = {}
        for k in r.keys:
            by.setdefault(holder_of(k), []).append(k)
        for holder, keys in by.items():
            out.setdefault(holder, []).append(Share(r.at_s, tuple(keys)))
    return out


def windows(requests: Sequence[Timed], chunk_len: Mapping[int, int], capacity_bps: float) -> list[tuple[float, float]]:
    """Each request's window ``[a_i, a_i + b_i / C]`` (see the module docstring), in request order."""
    return [(r.at_s, r.at_s + request_bytes(r, chunk_len) / capacity_bps) for r in requests]


def overlapping_windows(spans: Iterable[tuple[float, float]]) -> int:
    """How many overlapping windows (groups chained by overlap, in arrival order) ``spans`` form."""
    groups = 0
    end = float("-inf")
    for start, stop in sorted(spans):
        if start > end:
            groups += 1
            end = stop
        else:
            end = max(end, stop)
    return groups


def ideal_bytes(requests: Sequence[Timed], chunk_len: Mapping[int, int], capacity_bps: float) -> int:
    """Wire bytes if each distinct chunk crossed the link once per overlapping window."""
    spans = windows(requests, chunk_len, capacity_bps)
    by_chunk: dict[int, list[tuple[float, float]]] = {}
    for r, span in zip(requests, spans, strict=True):
        for k in set(r.keys):
            by_chunk.setdefault(k, []).append(span)
    return sum(overlapping_windows(s) * wire_bytes(chunk_len[k]) for k, s in by_chunk.items())


def requested_bytes(requests: Sequence[Timed], chunk_len: Mapping[int, int]) -> int:
    """Wire bytes of every request's chunks (what plain forwarding carries)."""
    return sum(request_bytes(r, chunk_len) for r in requests)


def ideal_for_mode(mode: str, requested: int, ideal: int) -> int:
    """The ideal of ``mode``: plain carries everything asked; the modes that merge, ``ideal``."""
    return requested if mode == "plain" else ideal


def default_deadline_s(total_bytes: int, capacity_bps: float, span_s: float) -> float:
    """The replay's fetch deadline when the caller names none: far beyond what the work implies.

    ``DEADLINE_FACTOR`` times the replay's bytes at line rate plus its span, at least
    ``MIN_DEADLINE_S`` and at most ``MAX_DEADLINE_S`` (the agent API's limit).
    """
    return min(MAX_DEADLINE_S, max(MIN_DEADLINE_S, DEADLINE_FACTOR * total_bytes / capacity_bps + span_s))
