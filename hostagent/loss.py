"""Loss told by the order answers arrive in: which fragments a request re-asks before its timers.

Pure decisions over one ``Request`` (``hostagent.request_state``): each function takes the
request and the time and returns the runs to re-ask as ``(start, count)``; ``hostagent.transfer``
sends them (RETRANSMIT, so they reach the holder past any switch's pending slot) and counts
them.  Two orders are trusted:

* single GETs (the servable path) are answered by a pool at once or by the holder within its
  queue, so a fragment asked before one that has arrived and still missing a reorder window
  later was lost (``overtaken``);
* a holder sends each request's answers in the order it queued them (``SendQueue``: a lane per
  request), so a fragment below one the holder's own answer delivered and still missing a
  reorder window later was lost (``gaps``).  A switch's copy or pool answer comes from
  elsewhere, in another order, and says nothing.

Without these a loss waited for the retransmit timer, which fires only once the holder goes
quiet for this requester, or after ``hostagent.transfer._STALL_RTOS`` timeouts while it streams
to others.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from hostagent.fragment import runs
from hostagent.request_state import Request
from hostagent.transport_config import TransportConfig
from kvpool import wire

REORDER_RTOS: Final = 0.5
"""Retransmit timeouts after which a fragment overtaken by a later-asked one counts as lost (``overtaken``)."""
GAP_RTOS: Final = 0.25
"""Retransmit timeouts after which a fragment its holder's answer passed over counts as lost (``gaps``)."""
OWN_ANSWER_FLAGS: Final = int(wire.Flag.COALESCED | wire.Flag.SWITCH_SERVED)
"""DATA with any of these came from a switch (a copy of another's answer, a pool), not the holder's answer."""
_MAX_RUNS: Final = 64


def own_answer_reached(r: Request, hi: int, now: float) -> None:
    """The holder's own answer to ``r`` delivered fragments up to ``hi`` (exclusive): note when."""
    if hi > r.own_hi:
        r.own_hi = hi
        r.own_marks.append((now, hi))


def next_gap_check(r: Request, cfg: TransportConfig) -> float | None:
    """When ``gaps`` next has something to settle for ``r`` (monotonic), None if nothing."""
    return r.own_marks[0][0] + GAP_RTOS * cfg.retransmit_timeout_s if r.own_marks else None


def overtaken(r: Request, now: float, cfg: TransportConfig) -> list[tuple[int, int]]:
    """Single GETs overtaken for a reorder window by answers to GETs asked after them: lost.

    One lost GET stalls more than its sender: a switch merged the others' GETs for the
    fragment into its pending slot, and they all wait for the answer that never comes (the
    retransmit timer took 2.2 s in the demo, and never fired while the holder streamed to
    others).  An answer may trail one asked after it by at most the holder's queue, which the
    retransmit timeout covers twice: after half of it, a fragment asked before one that has
    arrived and still missing was lost.  Never sooner than that queue itself (this agent's
    ``max_queue_s``, a deployment's holders taking the same).
    """
    cut = now - max(REORDER_RTOS * cfg.retransmit_timeout_s, cfg.max_queue_s)
    settled = r.settled_ask
    while r.overtaken and r.overtaken[0][0] <= cut:
        settled = r.overtaken.popleft()[1]
    if settled <= r.settled_ask or r.reasm is None or r.asked_at is None:
        return []
    r.settled_ask = settled
    hi = min(r.asked_hi, r.reasm.frag_count)
    at = r.asked_at[:hi]
    return runs((at > 0) & (at < settled) & ~r.reasm.received[:hi], _MAX_RUNS)


def gaps(r: Request, now: float, cfg: TransportConfig) -> list[tuple[int, int]]:
    """What the holder's own answer passed over a reorder window ago (``GAP_RTOS``): lost on the way.

    Not fragments a ``BUSY`` refused (their retry is booked), nor single GETs (``overtaken``);
    a fragment found this way is not found again within the request's retransmit timeout.  A
    software switch that drops under load (BMv2 on two cores, a replayed tool trace in pool mode)
    left half of each request's time waiting for timers before.
    """
    cut = now - GAP_RTOS * cfg.retransmit_timeout_s
    settled = 0
    while r.own_marks and r.own_marks[0][0] <= cut:
        settled = r.own_marks.popleft()[1]
    reasm = r.reasm
    if settled == 0 or reasm is None:
        return []
    hi = min(settled, reasm.frag_count)
    lost = ~reasm.received[:hi]
    if not lost.any():
        return []
    if r.asked_at is not None:
        lost &= r.asked_at[:hi] == 0  # asked by a range, not singly
    for start, end in r.refused_runs:
        lost[min(start, hi):min(end, hi)] = False
    if r.gap_at is None:
        r.gap_at = np.zeros(reasm.frag_count, np.float64)
    lost &= r.gap_at[:hi] <= now - r.rto
    found = runs(lost, _MAX_RUNS)
    for start, count in found:
        r.gap_at[start:start + count] = now
    return found


def forget(r: Request) -> None:
    """``r`` starts over (another generation, or the whole chunk again): its marks say nothing now."""
    r.own_hi, r.gap_at = 0, None
    r.own_marks.clear()
