"""Keep the controller's directory in step with what an agent's tiers hold.

The ``TieredStore`` reports every placement change (a chunk landing in a tier, leaving
one); ``DirectorySync`` coalesces them per chunk and, from a background thread, publishes
each chunk under the directory tier it now lives in and withdraws it from the one it
left, through ``hostagent.registration.Registration`` (which also re-registers and
republishes by itself when the controller forgot this node).  Agent tiers map onto the
directory's: ``gpu`` -> ``hbm``, ``dram`` -> ``dram``, anything below (Mooncake, the
in-memory backend) -> ``pool``.

Batching matters: a 64-chunk prefix published at once is one publish call, not 64, and a
chunk demoted and promoted back between two rounds costs nothing.  Each copy is published
with its generation (``generation_of``), so the directory offers only current copies and a
chunk republished in place (same tier, new generation) is published again.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from hostagent.registration import Registration
from kvpool.http_api import ApiError

log = logging.getLogger("kvpool.dirsync")

TIER_MAP = {"gpu": "hbm", "dram": "dram"}
"""Agent tier name -> directory tier name; any other tier is ``pool``."""


def directory_tier(tier: str) -> str:
    """The directory's name for an agent tier."""
    return TIER_MAP.get(tier, "pool")


class DirectorySync:
    """Publishes and withdraws an agent's chunks in the directory, batched, off the data path."""

    def __init__(self, registration: Registration, interval_s: float = 0.2,
                 generation_of: Callable[[int], int | None] | None = None) -> None:
        self.registration = registration
        self.interval_s = interval_s
        self.generation_of = generation_of
        """The generation of the copy held under a key (the store's), published with it."""
        self._pending: dict[int, tuple[str | None, int]] = {}
        self._published: dict[int, tuple[str, int | None]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.publishes = 0
        self.withdrawals = 0
        self.errors = 0

    def notify(self, key: int, tier: str | None, size: int) -> None:
        """A ``TieredStore`` listener: ``key`` now lives in ``tier`` (None: gone)."""
        with self._lock:
            self._pending[key] = (None if tier is None else directory_tier(tier), size)
        self._wake.set()

    def start(self) -> DirectorySync:
        """Register with the controller (raising if it refuses or is unreachable), then sync in the background."""
        self.registration.start()
        self._thread = threading.Thread(target=self._run, name="kvpool-dirsync", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Flush what is pending, stop, and leave the directory."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self.registration.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.flush()
        self.flush()

    def flush(self) -> None:
        """Send the changes recorded so far (retried next round if the controller fails)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        publish: dict[tuple[str, int], list[int]] = defaultdict(list)
        withdraw: dict[str, list[int]] = defaultdict(list)
        generations: dict[int, int] = {}
        for key, (tier, size) in pending.items():
            before = self._published.get(key)
            gen = self.generation_of(key) if self.generation_of is not None and tier is not None else None
            if gen is not None:
                generations[key] = gen
            if before is not None and (tier, gen) == before:
                continue
            if tier is not None:
                publish[(tier, size)].append(key)
            if before is not None and before[0] != tier:
                withdraw[before[0]].append(key)
        try:
            # Withdraw first: the directory checks each tier's declared capacity, and a chunk
            # demoted out of DRAM must leave it there before the chunk that displaced it is
            # published.  For that instant the moved chunk is listed nowhere, which only
            # makes a requester look again or recompute, never read a copy that is gone.
            for tier, keys in withdraw.items():
                self.registration.withdraw(keys, tier)
                self.withdrawals += len(keys)
                for k in keys:
                    if (self._published.get(k) or ("",))[0] == tier:
                        del self._published[k]
            for (tier, size), keys in publish.items():
                gens = {k: generations[k] for k in keys if k in generations}
                self.registration.publish(keys, tier, size, gens or None)
                self.publishes += len(keys)
                for k in keys:
                    self._published[k] = (tier, gens.get(k))
        except ApiError as exc:  # ApiUnreachableError included
            self.errors += 1
            log.warning("directory update failed (%s); retrying", exc)
            with self._lock:
                for key, value in pending.items():
                    self._pending.setdefault(key, value)  # a newer change wins over the retry

    def stats(self) -> dict[str, Any]:
        """What was sent to the directory and how it went."""
        with self._lock:
            pending = len(self._pending)
        return {
            "controller": self.registration.client.url,
            "node_id": self.registration.node_id,
            "published_chunks": len(self._published),
            "publishes": self.publishes,
            "withdrawals": self.withdrawals,
            "pending": pending,
            "errors": self.errors,
            "reregistrations": self.registration.reregistrations,
            "heartbeat_failures": self.registration.heartbeat_failures,
        }
