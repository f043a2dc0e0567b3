"""Which path a GET takes, and when a holder waits: what the fabric said, and what the holder sees.

A requester can ask a holder for a chunk three ways (docs/hostagent.md, "Paths"):

* **range** (the default, the cheap path): one GET per window of fragments, answered by
  the holder at once; a switch forwards it.  One request packet per window, no reply room,
  no wait: what a fetch costs without any help from the fabric.
* **single**: one GET per fragment, the only GET a switch can *coalesce* (absorb a
  duplicate while the first is pending and multicast the one answer).  Twice the packets
  through the switch, worth it only when another requester asks for the same fragment at
  about the same time.
* **servable**: single GETs that also carry reply room, the only GET a switch can *answer*
  from its pool (it rewrites the GET in place and cannot grow a packet by a fragment).
  Worth it only for a chunk the switch pool holds.

The fabric knows some of that: the controller sees the switches' hot-chunk reports and
places chunks in the switch pool, and sends agents the hot and pooled sets, and whether
the switches merge at all (``POST /v1/hints``, the document of ``kvpool.hints``).
``FabricHints`` keeps what it was told, for a bounded time (a controller that stops
sending cannot leave agents on the expensive path).

The holder knows the rest: who asks for what right now.  ``DuplicateTracker`` is its short
memory.  When the switches merge and a second requester asks for a chunk that another asked
for within the hold time (or whose answer is still queued), a duplicate is in progress:

* range GETs for it are *converted*: answered ``BUSY`` with a short retry hint (and what is
  left of other requesters' range answers is cancelled the same way), and requesters
  re-ask a chunk refused that way with single GETs, which the switch can merge;
* its single-GET answers are *held*: the holder stops sending the chunk for ``hold_s``, so
  every requester asking meanwhile joins the pending GETs in the switch and shares the
  answers; at most one hold per ``hold_s`` of sending, so a stream of late requesters
  cannot starve the chunk.

A lone request is never held or converted: the help costs nothing where nothing is shared.
The one exception is a chunk the hints call hot: the transport answers each new single GET
for it ``hold_s`` late (a duplicate is likely; on a slow switch it arrives after an answer
sent at once).

Pure and thread-safe where shared (``FabricHints``); ``DuplicateTracker`` belongs to the
transport's loop thread.  Every method takes ``now`` (``time.monotonic()`` when omitted)
so the rules can be tested without waiting.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any, Final

from kvpool.hints import GetPath, Hint, Hints

TRACKED_KEYS: Final = 1 << 14
"""Chunks a holder remembers the last asker of (least recently asked forgotten first)."""


class FabricHints:
    """The hot and pooled chunks, and whether the switches merge, as the fabric last said; until they expire."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hints: dict[int, Hint] = {}
        self._merge = False
        self._until = 0.0
        self.updates = 0

    def update(self, hints: Hints, now: float | None = None) -> None:
        """Replace everything with ``hints``, trusted for ``hints.ttl_s`` seconds from ``now``."""
        t = time.monotonic() if now is None else now
        with self._lock:
            self._hints = dict(hints.chunks)
            self._merge = hints.merge
            self._until = t + hints.ttl_s
            self.updates += 1

    def hint(self, key: int, now: float | None = None) -> Hint | None:
        """The fabric's hint for ``key``, None when there is none (or it expired)."""
        t = time.monotonic() if now is None else now
        with self._lock:
            if t >= self._until:
                return None
            return self._hints.get(key)

    def path(self, key: int, now: float | None = None) -> GetPath:
        """The path a requester takes for ``key``: range unless the fabric named it."""
        h = self.hint(key, now)
        return GetPath.RANGE if h is None else h.path

    def merging(self, now: float | None = None) -> bool:
        """True when the fabric said its switches merge duplicate single GETs (and that is still trusted)."""
        t = time.monotonic() if now is None else now
        with self._lock:
            return self._merge and t < self._until

    def keys(self, now: float | None = None) -> Iterable[int]:
        """Keys with a live hint."""
        t = time.monotonic() if now is None else now
        with self._lock:
            return [] if t >= self._until else list(self._hints)

    def stats(self, now: float | None = None) -> dict[str, Any]:
        """Live hints by path, whether merging, seconds they stay trusted, updates received."""
        t = time.monotonic() if now is None else now
        with self._lock:
            live = t < self._until
            by_path = {str(p): 0 for p in (GetPath.SINGLE, GetPath.SERVABLE)}
            if live:
                for h in self._hints.values():
                    by_path[str(h.path)] += 1
            return {"chunks": by_path, "merge": self._merge and live,
                    "ttl_left_s": round(self._until - t, 3) if live else 0.0, "updates": self.updates}


class DuplicateTracker:
    """A holder's short memory of who asked for which chunk, and the holds and conversions it decided.

    An *owner* is whatever tells requests apart (the transport uses ``(address, request id)``).
    """

    def __init__(self, hold_s: float, max_keys: int = TRACKED_KEYS) -> None:
        if hold_s <= 0 or max_keys < 1:
            raise ValueError(f"hold_s and max_keys must be positive, got {hold_s} and {max_keys}")
        self.hold_s = hold_s
        self._max = max_keys
        self._asked: OrderedDict[int, tuple[float, Hashable]] = OrderedDict()
        self._converting: dict[int, float] = {}
        self._sharing: dict[Hashable, float] = {}
        self._holds: dict[int, float] = {}
        self.holds = 0
        self.conversions = 0

    def asked(self, key: int, owner: Hashable, now: float) -> bool:
        """``owner`` asks for ``key`` at ``now``: True when another owner asked for it within ``hold_s``."""
        last = self._asked.pop(key, None)
        self._asked[key] = (now, owner)
        if len(self._asked) > self._max:
            self._asked.popitem(last=False)
        return last is not None and last[1] != owner and now - last[0] < self.hold_s

    def convert(self, key: int, now: float, requesters: Iterable[Hashable] = ()) -> None:
        """Range GETs for ``key`` are turned into single GETs from ``now`` for two hold times.

        ``requesters`` (the ones whose requests met on ``key``) are *sharing* as long: they
        are fetching the same prefix, so they will meet on its other chunks too.
        """
        until = now + 2 * self.hold_s
        self._converting[key] = until
        for who in requesters:
            self._sharing[who] = until
        self.conversions += 1
        self._forget_expired(now)

    def sharing(self, requester: Hashable, now: float) -> bool:
        """True while ``requester`` is fetching chunks another requester fetches at the same time."""
        return self._sharing.get(requester, 0.0) > now

    def converting(self, key: int, now: float) -> bool:
        """True while range GETs for ``key`` are being turned into single GETs."""
        return self._converting.get(key, 0.0) > now

    def hold(self, key: int, now: float) -> bool:
        """Hold ``key``'s answers for ``hold_s`` from ``now``; False when one is on or ended under ``hold_s`` ago."""
        until = self._holds.get(key, 0.0)
        if until > now or (until > 0 and now - until < self.hold_s):
            return False
        self._holds[key] = now + self.hold_s
        self.holds += 1
        self._forget_expired(now)
        return True

    def held_until(self, key: int) -> float:
        """When ``key``'s hold ends (0.0: never held, or long over)."""
        return self._holds.get(key, 0.0)

    def next_release(self, now: float) -> float | None:
        """The earliest end of a hold still on at ``now``, None when none is."""
        ends = [until for until in self._holds.values() if until > now]
        return min(ends) if ends else None

    def _forget_expired(self, now: float) -> None:
        if len(self._converting) > self._max:
            self._converting = {k: t for k, t in self._converting.items() if t > now}
        if len(self._sharing) > self._max:
            self._sharing = {k: t for k, t in self._sharing.items() if t > now}
        if len(self._holds) > self._max:
            self._holds = {k: t for k, t in self._holds.items() if now - t < self.hold_s}
