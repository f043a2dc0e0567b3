"""Which chunks are hot or pooled, as hints to agents.

The controller knows which chunks the switches see asked for by many requesters (hot) and
which the switch pool holds (pooled); agents do not.  Only a pooled chunk is worth asking
for differently: a switch answers only single-fragment GETs that carry reply room, at the
price of a request packet per fragment.  Every other chunk, hot ones included, is asked
for with range GETs, which switches coalesce per chunk (p4/include/coalesce.p4).  Each
epoch the controller turns both sets into hints (``kvpool.hints``):

* a chunk the pool holds and has filled (its last slot written since its admission,
  ``controller.fills``): ``servable``; before that, single GETs would all miss;
* a chunk reported hot within the last ``hot_ttl_s``: ``single`` (hot: agents ask for it
  by range, as for any chunk not named, and may read it as a sign that it is shared);
* anything else: no hint, the range path.

and sends them to every agent it knows (``POST /v1/hints``) when they change, and at least
every ``refresh_s`` so an agent can trust them ``ttl_s`` and no longer (a controller that
stops cannot leave agents on the expensive path).

Policy is pure (``HotChunks``, ``hints_for``, ``HintSchedule``: no I/O, explicit ``now``);
``HintPublisher`` ships the documents from a thread of its own so a slow agent never
delays an epoch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvpool import hints as kh
from kvpool.hints import GetPath, Hint, Hints
from kvpool.http_api import ApiError
from kvpool.http_client import JsonClient

log = logging.getLogger("kvpool.controller.hints")


@dataclass(frozen=True)
class HintSettings:
    """How long a chunk stays hot, and how often agents hear about it."""

    hot_ttl_s: float = 30.0
    """A chunk reported hot stays hot this long after the last report (the switch reports a chunk
    at most once per sketch epoch, so this spans many of them)."""
    refresh_s: float = 5.0
    """Hints are sent at least this often, even unchanged."""
    ttl_factor: float = 3.0
    """Agents trust a document ``ttl_factor x refresh_s`` seconds: two lost refreshes are survived."""

    def __post_init__(self) -> None:
        if not (self.hot_ttl_s > 0 and self.refresh_s > 0 and self.ttl_factor >= 1):
            raise ValueError(f"hint settings must be positive (ttl_factor >= 1), got {self}")

    @property
    def ttl_s(self) -> float:
        """Seconds an agent trusts one document."""
        return min(kh.MAX_TTL_S, self.ttl_factor * self.refresh_s)


class HotChunks:
    """Chunks the switches reported hot, each until ``ttl_s`` after its last report."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._until: dict[int, float] = {}

    def report(self, key: int, now: float) -> None:
        """A switch reported ``key`` hot at ``now``."""
        self._until[key] = now + self.ttl_s

    def live(self, now: float) -> set[int]:
        """The chunks hot at ``now`` (expired ones are forgotten)."""
        for key in [k for k, t in self._until.items() if t <= now]:
            del self._until[key]
        return set(self._until)


def hints_for(hot: Iterable[int], pooled: Iterable[int], nbytes: Callable[[int], int]) -> dict[int, Hint]:
    """The hints for ``hot`` and ``pooled`` chunks: pooled ones servable, the other hot ones ``single`` (hot).

    ``nbytes(key)`` is the chunk's serialized length (0 when unknown), which lets a
    requester ask for every fragment of a pooled chunk at once.
    """
    out = {k: Hint(GetPath.SINGLE, nbytes(k)) for k in hot}
    out.update({k: Hint(GetPath.SERVABLE, nbytes(k)) for k in pooled})
    return out


class HintSchedule:
    """When to send hints: whenever they change, else every ``refresh_s``."""

    def __init__(self, refresh_s: float) -> None:
        self.refresh_s = refresh_s
        self._last: dict[int, Hint] | None = None
        self._sent_at = 0.0

    def due(self, hints: Mapping[int, Hint], now: float) -> bool:
        """True when ``hints`` should be sent at ``now`` (and records them as sent)."""
        if self._last is not None and dict(hints) == self._last and now - self._sent_at < self.refresh_s:
            return False
        self._last = dict(hints)
        self._sent_at = now
        return True


class HintSink(Protocol):
    """Somewhere hints go: an agent's API."""

    def send(self, doc: Mapping[str, Any]) -> None:
        """Deliver one hints document (raise ``ApiError`` when the agent refuses or is unreachable)."""


class AgentHintClient:
    """An agent's ``POST /v1/hints``."""

    def __init__(self, api: str, token: str | None = None, timeout: float = 2.0) -> None:
        self.api = api
        self.http = JsonClient(api, timeout, "agent API", token)

    def send(self, doc: Mapping[str, Any]) -> None:
        """POST the document."""
        self.http.post("/v1/hints", dict(doc))


class HintPublisher:
    """Sends the latest hints document to every sink from its own thread (latest wins)."""

    def __init__(self, sinks: Sequence[HintSink]) -> None:
        self.sinks = list(sinks)
        self.sent = 0
        self.failures = 0
        self._cv = threading.Condition()
        self._doc: dict[str, Any] | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        if self.sinks:
            self._thread = threading.Thread(target=self._run, name="hint-publisher", daemon=True)
            self._thread.start()

    def publish(self, hints: Hints) -> None:
        """Queue ``hints`` for every sink, replacing a document not sent yet."""
        with self._cv:
            self._doc = kh.document(hints)
            self._cv.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the queued document went out (True) or ``timeout`` passed (False)."""
        with self._cv:
            return self._cv.wait_for(lambda: self._doc is None or self._stop, timeout)

    def close(self) -> None:
        """Stop the thread (a document not sent yet is dropped)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._doc is not None or self._stop)
                if self._stop:
                    return
                doc = self._doc
            assert doc is not None
            for sink in self.sinks:
                try:
                    sink.send(doc)
                    self.sent += 1
                except ApiError as exc:  # an agent down or refusing: it falls back to ranges when they expire
                    self.failures += 1
                    log.warning("hints not delivered to %s: %s", getattr(sink, "api", sink), exc)
            with self._cv:
                if self._doc is doc:
                    self._doc = None
                self._cv.notify_all()
