"""An agent's link to the controller's directory: register, heartbeat, publish and withdraw chunks.

Talks to the controller API (``controller.api``) over HTTP/JSON, on TCP
(``http://HOST:PORT``) or a Unix socket (``unix:/PATH``): an agent inside a Mininet host
lives in another network namespace but shares the filesystem, so the socket file is how it
reaches the controller in the root namespace. Through ``kvpool.http_client`` (httpx, which
the agent's API stack needs anyway), so it adds nothing to an agent's start-up. Errors: ``ApiError`` when
the controller refuses, its subclass ``ApiUnreachableError`` when it does not answer.

Typical use::

    reg = Registration(ControllerClient("unix:/tmp/kvpool/ctl.sock"), "h0", "10.0.0.1",
                       role="holder", tiers={"dram": 1 << 30}).start()
    reg.publish([key1, key2], "dram", nbytes=5632)
    ...
    reg.stop()   # deregisters

``start`` heartbeats in a background thread. When the controller has marked the node down
(it missed heartbeats) or forgot it (controller restart), the next heartbeat re-registers
and republishes everything this agent still holds, so the directory comes back exact.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from kvpool import auth
from kvpool.http_api import ApiError
from kvpool.http_client import JsonClient

log = logging.getLogger("kvpool.registration")


class ControllerClient(JsonClient):
    """The controller API's client (``kvpool.http_client.JsonClient``) plus the directory lookup requesters need.

    ``token`` defaults to the operator's token file (``kvpool.auth``; none if it does not exist yet).
    """

    def __init__(self, url: str, timeout: float = 10.0, token: str | None = None) -> None:
        super().__init__(url, timeout, "controller API", auth.secret() if token is None else token)

    def generations(self, keys: Iterable[int]) -> dict[int, int]:
        """The directory's current generation of each of ``keys`` it knows (``GET /v1/generations``)."""
        keys = list(keys)
        out: dict[int, int] = {}
        for i in range(0, len(keys), 256):  # short enough query strings
            text = ",".join(f"{k:#x}" for k in keys[i : i + 256])
            answer = self.get(f"/v1/generations?keys={text}")["generations"]
            out.update({int(k, 16): int(g) for k, g in answer.items()})
        return out

    def nodes(self) -> list[dict[str, Any]]:
        """Every node the directory has registered (``GET /v1/nodes``): node_id, address, role, up, ..."""
        return list(self.get("/v1/nodes")["nodes"])

    def holders(self, key: int) -> list[dict[str, Any]]:
        """Live copies of chunk ``key`` (node_id, address, tier, nbytes, role), fastest tier first.

        What a requester addresses its GETs to; empty when no live node offers the chunk.
        """
        try:
            return list(self.get(f"/v1/chunks/{key:#x}")["holders"])
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise


class Registration:
    """One agent's membership in the directory (see the module docstring)."""

    def __init__(self, client: ControllerClient, node_id: str, address: str, role: str = "holder",
                 tiers: Mapping[str, int] | None = None, heartbeat_s: float | None = None,
                 live_wait_s: float = 15.0) -> None:
        self.client = client
        self.node_id = node_id
        self.address = address
        self.role = role
        self.tiers = dict(tiers or {})
        self.heartbeat_s = heartbeat_s
        self.live_wait_s = live_wait_s
        """How long ``register`` waits for a previous registration of this node (a crashed agent) to expire."""
        self.credential = ""
        """The per-node credential the controller answered the registration with (sent with every node call)."""
        #: (tier, nbytes) -> keys published: what a re-registration republishes
        self.published: dict[tuple[str, int], set[int]] = {}
        #: key -> generation of the copy published (republished with it)
        self.generations: dict[int, int] = {}
        self.reregistrations = 0
        self.heartbeat_failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def _path(self) -> str:
        return f"/v1/nodes/{urllib.parse.quote(self.node_id, safe='')}"

    def _auth(self) -> dict[str, str]:
        return {auth.NODE_CREDENTIAL_HEADER: self.credential} if self.credential else {}

    def register(self) -> None:
        """Register with the controller and republish what this agent holds (refused: ApiError 403).

        The controller starts a (re-)registered node from an empty chunk list, so everything
        published through this object so far is published again. It answers with a credential
        only this node knows, which every later call for the node carries; a node id that is
        registered and live is not handed to anyone without it (409 ``node_live``), so an agent
        restarted after a crash waits here, up to ``live_wait_s``, until its old registration
        is marked down.
        """
        doc = {"node_id": self.node_id, "address": self.address, "role": self.role, "tiers": self.tiers}
        deadline = time.monotonic() + self.live_wait_s
        while True:
            try:
                answer = self.client.post("/v1/nodes/register", doc, self._auth())
                break
            except ApiError as exc:
                if exc.code != "node_live" or time.monotonic() >= deadline:
                    raise
                log.info("node %s is still registered (%s); waiting for that registration to expire", self.node_id,
                         exc)
                time.sleep(0.5)
        self.credential = str(answer.get("node_credential", ""))
        if self.heartbeat_s is None:
            self.heartbeat_s = float(answer.get("heartbeat_s", 1.0))
        with self._lock:
            items = [(t, nb, sorted(keys)) for (t, nb), keys in self.published.items() if keys]
            gens = dict(self.generations)
        for tier, nbytes, keys in items:
            self._publish(keys, tier, nbytes, {k: gens[k] for k in keys if k in gens} or None)

    def heartbeat(self) -> None:
        """One heartbeat; re-registers and republishes when the controller marked this node down or forgot it."""
        try:
            self.client.post(f"{self._path}/heartbeat", None, self._auth())
        except ApiError as exc:
            if exc.status not in (404, 410):  # ApiUnreachableError (status 0) included
                raise
            log.warning("controller %s (%s): registering %s again", exc.code, exc, self.node_id)
            self.register()
            self.reregistrations += 1

    def _publish(self, keys: list[int], tier: str, nbytes: int, generations: Mapping[int, int] | None = None) -> int:
        doc: dict[str, Any] = {"keys": [f"{k:#x}" for k in keys], "tier": tier, "nbytes": nbytes}
        if generations:
            doc["generations"] = {f"{k:#x}": g for k, g in generations.items()}
        return int(self.client.post(f"{self._path}/publish", doc, self._auth())["new"])

    def publish(self, keys: Iterable[int], tier: str, nbytes: int, generations: Mapping[int, int] | None = None) -> int:
        """This agent holds ``keys`` (``nbytes`` each) in ``tier``, at ``generations``; returns how many were new."""
        keys = list(keys)
        new = self._publish(keys, tier, nbytes, generations)
        with self._lock:
            self.generations.update(generations or {})
            for k in keys:  # one size per key and tier: a republish under another size moves it
                for (t, _nb), ks in self.published.items():
                    if t == tier:
                        ks.discard(k)
            self.published.setdefault((tier, nbytes), set()).update(keys)
        return new

    def versions(self, chunks: Iterable[tuple[int, int, int]]) -> dict[int, int]:
        """Generations the directory issues for ``(key, content digest, nbytes)`` this holder publishes.

        The same content keeps its generation, new content gets the next; the controller
        has moved every switch off a replaced content before this returns.
        """
        doc = {"chunks": [{"key": f"{k:#x}", "digest": f"{d:#x}", "nbytes": n} for k, d, n in chunks]}
        answer = self.client.post(f"{self._path}/versions", doc, self._auth())["generations"]
        return {int(k, 16): int(g) for k, g in answer.items()}

    def withdraw(self, keys: Iterable[int], tier: str | None = None) -> int:
        """This agent no longer holds ``keys`` (in ``tier``, or anywhere); returns copies removed."""
        keys = list(keys)
        removed = int(self.client.post(f"{self._path}/withdraw", {"keys": [f"{k:#x}" for k in keys],
                                                                   "tier": tier}, self._auth())["removed"])
        with self._lock:
            for (t, _nb), ks in self.published.items():
                if tier is None or t == tier:
                    ks.difference_update(keys)
        return removed

    def start(self) -> Registration:
        """Register, then heartbeat every ``heartbeat_s`` in a background thread; returns self."""
        self.register()
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"kvpool-heartbeat-{self.node_id}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s or 1.0):
            try:
                self.heartbeat()
            except ApiError as exc:  # ApiUnreachableError included
                # Keep trying: the controller may be restarting; it marks us down meanwhile.
                self.heartbeat_failures += 1
                log.warning("heartbeat of %s failed: %s", self.node_id, exc)

    def stop(self, deregister: bool = True) -> None:
        """Stop heartbeating and (by default) leave the directory."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if deregister:
            try:
                self.client.delete(self._path, self._auth())
            except ApiError as exc:
                log.warning("could not deregister %s: %s", self.node_id, exc)
