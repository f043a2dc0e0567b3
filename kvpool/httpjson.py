"""The HTTP/JSON client of kvpool's APIs (``JsonClient``); the server is ``kvpool.http_server``.

Addresses are ``http://HOST:PORT`` or ``unix:/PATH``. The types every side shares
(``ApiError``, ``Router``, ...) live in ``kvpool.http_api`` and are re-exported here.
"""

from __future__ import annotations

import contextlib
import email.message
import http.client
import json
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.http_api import (
    BODY_METHODS,
    MAX_HEAD,
    MAX_JSON_DEPTH,
    ApiCounters,
    ApiError,
    ApiUnreachableError,
    Auth,
    Buffer,
    Request,
    Response,
    Route,
    Router,
    is_remote,
)
from kvpool.http_server import ApiServer

__all__ = ["MAX_HEAD", "MAX_JSON_DEPTH", "ApiCounters", "ApiError", "ApiServer", "ApiUnreachableError", "Auth",
           "JsonClient", "Reply", "Request", "Response", "Route", "Router", "connection", "is_remote"]
_BODY_METHODS = BODY_METHODS


# ---------------------------------------------------------------------------------- client side
class _UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        """Connect to the socket file instead of a TCP port."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def connection(url: str, timeout: float | None, what: str = "API") -> http.client.HTTPConnection:
    """An unconnected HTTP connection for ``http://HOST:PORT`` or ``unix:/PATH``; ValueError for anything else."""
    if url.startswith("unix:"):
        path = url.removeprefix("unix:").removeprefix("//")
        if not path:
            raise ValueError(f"{what} {url!r}: a unix: address needs a socket path")
        return _UnixHTTPConnection(path, timeout)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{what} {url!r}: expected http://HOST:PORT or unix:/PATH")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{what} {url!r}: the port is not a number in 0..65535") from None
    return http.client.HTTPConnection(parts.hostname, port or 80, timeout=timeout)


@dataclass(frozen=True)
class Reply:
    """A successful answer: status, headers and the whole body."""

    status: int
    headers: email.message.Message
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
        connection(self.url, timeout, what)  # validate the address now, not at the first request

    def request(self, method: str, path: str, body: Buffer | Sequence[Buffer] | None = None,
                headers: Mapping[str, str] | None = None) -> Reply:
        """One request; ``body`` may be several buffers, sent in order without joining them."""
        conn = connection(self.url, self.timeout, self.what)
        parts: Sequence[Buffer] = [] if body is None else [body] if isinstance(body, Buffer) else body
        hdrs = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        if body is not None or method in _BODY_METHODS:
            hdrs["Content-Length"] = str(sum(len(p) for p in parts))
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders()
            for p in parts:
                conn.send(p)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ApiUnreachableError(f"{self.what} at {self.url} is unreachable: {exc}") from None
        finally:
            conn.close()
        if resp.status >= 400:
            code, message = "error", data[:200].decode(errors="replace").strip() or f"HTTP {resp.status}"
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                doc = json.loads(data)
                code, message = str(doc.get("code", code)), str(doc["error"])
            raise ApiError(resp.status, code, message)
        return Reply(resp.status, resp.headers, data)

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
