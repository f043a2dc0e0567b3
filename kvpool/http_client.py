"""The one client of kvpool's APIs (``JsonClient``), on httpx, over loopback TCP or a Unix socket.

Every client in the project (``kvpool-ctl``, an agent's registration with the controller,
``AgentClient``, the controller's fill requests and hints, the experiments) talks through
``JsonClient``. Addresses are ``http://HOST:PORT`` or ``unix:/PATH``; ``check_url`` validates
one without connecting. A refusal raises ``ApiError`` (the server's status, code and one-line
message); no answer at all (refused, timed out, connection lost) raises
``ApiUnreachableError``. Connections are kept alive between calls (httpx's pool, safe to
share between threads) and expire before the servers' idle timeout.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from kvpool.http_api import BODY_METHODS, ApiError, ApiUnreachableError, Buffer

KEEPALIVE_S = 20.0
"""How long an idle pooled connection is reused (servers close theirs after 60 s by default)."""
READ_BYTES = 1 << 20
"""httpcore's read size over HTTP/1.1 (64 KiB by default): kvpool's answers are megabytes of KV chunks,
and per read, h11 copies and parses; 1 MiB reads double the fetch goodput (docs/design/notes-http.md)."""

SEND_BYTES = 256 << 10
"""Largest piece of a request body handed to httpx (see ``_stream``)."""

if getattr(httpcore.HTTP11Connection, "READ_NUM_BYTES", READ_BYTES) < READ_BYTES:
    httpcore.HTTP11Connection.READ_NUM_BYTES = READ_BYTES  # a class constant httpcore reads per connection


def check_url(url: str, what: str = "API") -> tuple[str, str | None]:
    """The httpx base URL and Unix socket path (None over TCP) of ``http://HOST:PORT`` or ``unix:/PATH``.

    ``ValueError`` for anything else.
    """
    if url.startswith("unix:"):
        path = url.removeprefix("unix:").removeprefix("//")
        if not path:
            raise ValueError(f"{what} {url!r}: a unix: address needs a socket path")
        return "http://localhost", path
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{what} {url!r}: expected http://HOST:PORT or unix:/PATH")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{what} {url!r}: the port is not a number in 0..65535") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port or 80}", None


@dataclass(frozen=True)
class Reply:
    """A successful answer: status, headers and the whole body."""

    status: int
    headers: httpx.Headers
    body: bytes

    def header(self, name: str) -> str | None:
        """A response header's value, None when absent."""
        value = self.headers.get(name)
        return None if value is None else str(value)


class JsonClient:
    """Requests to one kvpool API; refusals raise ``ApiError``, silence ``ApiUnreachableError``.

    ``token`` (the operator's secret, ``kvpool.auth``) goes with every request as
    ``Authorization: Bearer``; without one, only ``GET`` calls are answered.
    """

    def __init__(self, url: str, timeout: float = 10.0, what: str = "API", token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.what = what
        self.token = token
        base, uds = check_url(self.url, what)  # validate the address now, not at the first request
        transport = httpx.HTTPTransport(uds=uds, retries=0, limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=8, keepalive_expiry=KEEPALIVE_S))
        self._http = httpx.Client(base_url=base, transport=transport, timeout=timeout, trust_env=False,
                                  headers={"Accept-Encoding": "identity"})

    def close(self) -> None:
        """Close the pooled connections; the client takes no requests after."""
        self._http.close()

    def request(self, method: str, path: str, body: Buffer | Sequence[Buffer] | None = None,
                headers: Mapping[str, str] | None = None) -> Reply:
        """One request; ``body`` may be several buffers, sent in order without joining them."""
        reply, pieces = self.request_pieces(method, path, body, headers)
        return Reply(reply.status, reply.headers, pieces[0] if len(pieces) == 1 else b"".join(pieces))

    def request_pieces(self, method: str, path: str, body: Buffer | Sequence[Buffer] | None = None,
                       headers: Mapping[str, str] | None = None) -> tuple[Reply, list[bytes]]:
        """``request``, the answer's body left in the pieces it arrived in (``Reply.body`` empty).

        For megabyte answers that the caller splits anyway (a chunk bundle): each part is then
        copied once, from the pieces, instead of once more through one joined body.
        """
        parts: Sequence[Buffer] = [] if body is None else [body] if isinstance(body, Buffer) else body
        hdrs = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        content: bytes | Iterator[bytes] | None = None
        if body is not None or method in BODY_METHODS:
            hdrs["Content-Length"] = str(sum(len(p) for p in parts))
            content = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else _stream(parts)
        try:
            with self._http.stream(method, path, content=content, headers=hdrs) as resp:
                pieces = [p for p in resp.iter_raw() if p]
        except (httpx.TransportError, httpx.StreamError, OSError) as exc:
            raise ApiUnreachableError(f"{self.what} at {self.url} is unreachable: {exc or type(exc).__name__}") \
                from None
        if resp.status_code >= 400:
            data = b"".join(pieces)
            code, message = "error", data[:200].decode(errors="replace").strip() or f"HTTP {resp.status_code}"
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                doc = json.loads(data)
                code, message = str(doc.get("code", code)), str(doc["error"])
            raise ApiError(resp.status_code, code, message)
        return Reply(resp.status_code, resp.headers, b""), pieces or [b""]

    def call(self, method: str, path: str, doc: Mapping[str, Any] | None = None,
             headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A JSON request (``doc``, when given) answered by a JSON object."""
        body = None if doc is None else json.dumps(doc).encode()
        hdrs = dict(headers or {})
        if doc is not None:
            hdrs["Content-Type"] = "application/json"
        reply = self.request(method, path, body, hdrs)
        try:
            answer = json.loads(reply.body) if reply.body else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = None
        if not isinstance(answer, dict):
            raise ApiError(reply.status, "bad_answer", f"{self.what} answered {reply.body[:200]!r}, not a JSON object")
        return answer

    def get(self, path: str) -> dict[str, Any]:
        """GET ``path``."""
        return self.call("GET", path)

    def post(self, path: str, doc: Mapping[str, Any] | None = None,
             headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """POST ``doc`` (``{}`` when None) to ``path``."""
        return self.call("POST", path, doc if doc is not None else {}, headers)

    def delete(self, path: str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """DELETE ``path``."""
        return self.call("DELETE", path, None, headers)


def _stream(parts: Sequence[Buffer]) -> Iterator[bytes]:
    """The body's buffers in slices of ``SEND_BYTES`` (with the Content-Length set, httpx sends them as they are).

    httpcore sends a piece with ``send`` in a loop and copies what is left after each call: a
    megabyte piece that goes in several sends is copied several times, a slice about once.
    """
    for p in parts:
        view = memoryview(p).cast("B")
        for i in range(0, len(view), SEND_BYTES):
            yield view[i : i + SEND_BYTES].tobytes()
