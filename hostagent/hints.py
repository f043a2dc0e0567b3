"""Which path a GET takes: what the fabric said of each chunk, kept for a bounded time.

A requester can ask a holder for a chunk two ways (docs/design/transport.md, "Paths"):

* **range** (the default, the cheap path): one GET per window of fragments, answered by
  the holder at once.  A switch that merges coalesces range GETs per chunk: a requester
  that asks for a chunk while another's answer to it is in flight joins that answer.  A
  chunk the hints call hot (``single``, what older controllers ask singly) takes it too.
* **servable**: single-fragment GETs with reply room, the only GET a switch can *answer*
  from its pool (it rewrites the GET in place and cannot grow a packet by a fragment).
  One request packet per fragment, worth it only for a chunk the switch pool holds.

The fabric knows which: the controller sees the switches' hot-chunk reports and places
chunks in the switch pool, and sends agents the hot and pooled sets, and whether the
switches merge at all (``POST /v1/hints``, the document of ``kvpool.hints``).
``FabricHints`` keeps what it was told, for a bounded time (a controller that stops
sending cannot leave agents on the expensive path).

Thread-safe; every method takes ``now`` (``time.monotonic()`` when omitted) so the rules
can be tested without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from kvpool.hints import GetPath, Hint, Hints


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
        """The path the fabric named for ``key``, range when none (a requester asks ``single`` by range too)."""
        h = self.hint(key, now)
        return GetPath.RANGE if h is None else h.path

    def merging(self, now: float | None = None) -> bool:
        """True when the fabric said its switches merge duplicate GETs (and that is still trusted)."""
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
