"""Asking holders to push chunks through the switches, so the switches fill on pass.

The controller never carries a chunk's bytes: it asks a holder agent (``POST /v1/push``) to
send the chunk to a switch's fill sink, and the switch on the way stores it. Best effort: a
failed request is logged and counted, and the next demand fetch fills instead.
"""

from __future__ import annotations

import logging
from typing import Protocol

from kvpool import wire
from kvpool.http_api import ApiError
from kvpool.http_client import JsonClient

log = logging.getLogger("kvpool.controller")


class FillRequester(Protocol):
    """Asks a holder to send chunks through the switches so they fill on pass."""

    def push(self, keys: list[int], sink: str | None = None) -> None:
        """Send every fragment of each chunk in ``keys`` to ``sink`` (an IPv4 address; None: the
        requester's own default), best effort; errors are logged."""


class HolderPushClient:
    """Asks a holder agent (``POST /v1/push`` of its API) to send chunks to a fill sink through the switches."""

    def __init__(self, api: str, sink: str, sink_port: int = wire.KVPOOL_UDP_PORT, timeout: float = 5.0,
                 token: str | None = None) -> None:
        self.http = JsonClient(api, timeout, "holder agent API", token)
        self.api = api
        self.sink = sink
        self.sink_port = sink_port
        self.failures = 0

    def push(self, keys: list[int], sink: str | None = None) -> None:
        """Request the push to ``sink`` (default: the one given at construction); a failure is
        logged and counted (the next demand fetch fills instead)."""
        to = f"{sink or self.sink}:{self.sink_port}"
        try:
            self.http.post("/v1/push", {"keys": [f"{k:#x}" for k in keys], "to": to})
        except ApiError as exc:  # ApiUnreachableError included
            self.failures += 1
            log.warning("holder %s did not accept the push of %d chunk(s): %s", self.api, len(keys), exc)
