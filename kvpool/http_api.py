"""kvpool's two HTTP APIs, independent of the server: routes, requests, answers and refusals.

The agent's API (``hostagent.api``) and the controller's (``controller.api``) are each a
``Router`` of handler functions; ``kvpool.http_server`` serves one on uvicorn through a
FastAPI app, ``kvpool.http_client`` is the one client. Addresses are ``http://HOST:PORT`` or
``unix:/PATH`` (a Unix socket reaches a daemon inside a Mininet host: another network
namespace, same file system).

Authentication: every request whose method is not ``GET`` must carry the operator's token
(``kvpool.auth``) as ``Authorization: Bearer <token>``, unless its route says otherwise
(``Auth``: the controller lets an agent on another host register itself without it, and
checks its address instead); a missing or wrong one is 401 ``unauthorized``, decided from
the headers before a byte of the body is read.

Every refusal is an ``ApiError``: status 4xx/5xx and a one-line JSON body
``{"error": "...", "code": "..."}``. An unknown path is 404 ``unknown_path``, a known path
with another method 405 ``bad_method``. The client raises the same ``ApiError`` when a
server refuses, and ``ApiUnreachableError`` (a subclass, status 0) when nothing answers.
The body policy and the connection limits are the server's (``kvpool.http_server``).
"""

from __future__ import annotations

import enum
import ipaddress
import json
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

MAX_HEAD = 64 << 10
"""Longest request head (request line and headers) accepted."""
MAX_HEADERS = 100
"""Most header lines one request may have."""
MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a JSON body may have (kvpool's bodies need 2)."""
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
"""Methods that must announce a body length (``Content-Length``), even of 0."""

Buffer = bytes | bytearray | memoryview


class ApiError(Exception):
    """A refused request: HTTP ``status``, machine-readable ``code``, one-line ``message``.

    Handlers raise it to refuse; ``JsonClient`` raises it when a server refused.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = int(status)
        self.code = code
        self.message = message


class ApiUnreachableError(ApiError):
    """Nothing answered at the address (refused, timed out, connection lost); status 0."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "unreachable", message)


@dataclass
class Response:
    """What a handler answers: status, body buffers (written in order, not joined) and headers."""

    status: int = HTTPStatus.OK
    parts: Sequence[Buffer] = ()
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, doc: Mapping[str, Any], status: int = HTTPStatus.OK,
             headers: Mapping[str, str] | None = None) -> Response:
        """A JSON object on one line."""
        return cls(status, [(json.dumps(doc) + "\n").encode()], "application/json", dict(headers or {}))

    @classmethod
    def octets(cls, parts: Sequence[Buffer], headers: Mapping[str, str] | None = None) -> Response:
        """Binary data (``application/octet-stream``) from one or more buffers."""
        return cls(HTTPStatus.OK, parts, "application/octet-stream", dict(headers or {}))

    @classmethod
    def error(cls, exc: ApiError) -> Response:
        """The one-line JSON answer to a refusal."""
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == HTTPStatus.UNAUTHORIZED else {}
        return cls.json({"error": exc.message, "code": exc.code}, exc.status, headers)

    def encode_head(self, server: str, keep_alive: bool) -> bytes:
        """Status line and headers, ready to send."""
        status = HTTPStatus(self.status)
        head = [f"HTTP/1.1 {status.value} {status.phrase}", f"Server: {server}",
                f"Content-Type: {self.content_type}", f"Content-Length: {sum(len(p) for p in self.parts)}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        if not keep_alive:
            head.append("Connection: close")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")


class Request:
    """One request as a handler sees it: method, path, query, headers, peer and the whole body (already read)."""

    def __init__(self, method: str, target: str, headers: Mapping[str, str], peer: str | None,
                 body: Buffer = b"", params: Mapping[str, str] | None = None) -> None:
        url = urllib.parse.urlsplit(target)
        self.method = method
        self.target = target
        self.path = url.path.rstrip("/") or "/"
        self.query = urllib.parse.parse_qs(url.query)
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.peer = peer
        """TCP peer address; None over a Unix socket."""
        self.params: dict[str, str] = dict(params or {})
        """Path segments captured by the route's ``{name}`` parts."""
        self._body = memoryview(body)
        self.content_length = len(self._body)

    def header(self, name: str, default: str = "") -> str:
        """A request header's value (``default`` when absent)."""
        return self.headers.get(name.lower(), default)

    def arg(self, name: str, default: str) -> str:
        """The last value of query parameter ``name``."""
        return self.query.get(name, [default])[-1]

    def body(self) -> memoryview:
        """The whole body (read by the server, under its body policy, before the handler ran)."""
        return self._body

    def json(self) -> dict[str, Any]:
        """The body as a JSON object; ``ApiError`` 400 ``bad_json`` for anything else."""
        raw = self.body()
        if not raw:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", "body is empty: expected a JSON object")
        try:
            doc = json.loads(raw.tobytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", f"body is not JSON: {exc}") from None
        except RecursionError:  # the C parser counts its own depth: tens of thousands of "[" end here
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json",
                           f"body is nested deeper than {MAX_JSON_DEPTH} levels") from None
        if not isinstance(doc, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", "body must be a JSON object")
        if _depth_over(doc, MAX_JSON_DEPTH):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json",
                           f"body is nested deeper than {MAX_JSON_DEPTH} levels")
        return doc


def _depth_over(doc: object, limit: int) -> bool:
    """True when ``doc`` nests lists and dicts deeper than ``limit`` (iterative: no recursion to exhaust)."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


Handler = Callable[[Request], Response]


class Auth(enum.Enum):
    """What a route asks of its caller before the handler runs."""

    NONE = "none"
    """Anyone who can connect (reads)."""
    TOKEN = "token"
    """The operator's token (``Authorization: Bearer``)."""
    LOCAL_TOKEN = "local-token"
    """The token from a local caller (Unix socket, loopback); a caller on another host is let through for
    the handler to authenticate by its address (a node registering itself with the controller)."""


def is_remote(peer: str | None) -> bool:
    """True for a TCP peer on another host (not loopback); a Unix-socket peer (None) is local."""
    return peer is not None and not ipaddress.ip_address(peer).is_loopback


OCTETS = "octets"
"""``Doc.body`` / ``Doc.answer``: raw bytes (``application/octet-stream``)."""
TEXT = "text"
"""``Doc.answer``: plain text (Prometheus' exposition format)."""


@dataclass(frozen=True)
class Doc:
    """How a route appears in the OpenAPI schema; the server never reads it (handlers validate themselves).

    ``body`` and ``answer`` are pydantic models of the JSON (or ``OCTETS``, ``TEXT``); ``query``
    names each query parameter with its meaning; ``headers`` the request headers that matter.
    """

    summary: str = ""
    body: Any = None
    answer: Any = None
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    answer_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    """``method`` on a path pattern: literal segments, or ``{name}`` capturing one segment."""

    method: str
    segments: tuple[str, ...]
    handler: Handler
    auth: Auth = Auth.TOKEN
    doc: Doc = field(default_factory=Doc)

    def match(self, parts: Sequence[str]) -> dict[str, str] | None:
        """The captured segments when ``parts`` fits the pattern, else None."""
        if len(parts) != len(self.segments):
            return None
        params: dict[str, str] = {}
        for want, got in zip(self.segments, parts, strict=True):
            if want.startswith("{") and want.endswith("}"):
                params[want[1:-1]] = urllib.parse.unquote(got)
            elif want != got:
                return None
        return params

    def needs_token(self, peer: str | None) -> bool:
        """Whether a call from ``peer`` must carry the token."""
        return self.auth is Auth.TOKEN or (self.auth is Auth.LOCAL_TOKEN and not is_remote(peer))


class Router:
    """Routes in the order added; the first whose method and pattern fit handles the request."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, pattern: str, handler: Handler, auth: Auth | None = None,
            doc: Doc | None = None) -> None:
        """Serve ``method pattern`` (``"/v1/chunks/{key}"``) with ``handler``, described by ``doc``.

        ``auth`` defaults to none for ``GET`` and the token for every other (mutating) method.
        """
        if auth is None:
            auth = Auth.NONE if method == "GET" else Auth.TOKEN
        self.routes.append(Route(method, tuple(pattern.strip("/").split("/")), handler, auth, doc or Doc()))

    def resolve(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route for a request and its captured segments; ApiError 404 or 405 if none."""
        parts = path.strip("/").split("/")
        allowed: list[str] = []
        for route in self.routes:
            params = route.match(parts)
            if params is None:
                continue
            if route.method == method:
                return route, params
            allowed.append(route.method)
        if allowed:
            raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, "bad_method",
                           f"{method[:20]} not allowed on {path[:80]}; use {' or '.join(sorted(set(allowed)))}")
        raise ApiError(HTTPStatus.NOT_FOUND, "unknown_path", f"no endpoint {path[:80]!r}")


class ApiCounters:
    """Requests served and refusals by code (thread-safe: requests are served in parallel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.errors: dict[str, int] = {}

    def ok(self) -> None:
        """Count one request served."""
        with self._lock:
            self.requests += 1

    def error(self, code: str) -> None:
        """Count one refused request under ``code``."""
        with self._lock:
            self.requests += 1
            self.errors[code] = self.errors.get(code, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """A copy of the counters."""
        with self._lock:
            return {"requests": self.requests, "errors": dict(self.errors), "errors_total": sum(self.errors.values())}


def parse_request_line(line: bytes) -> tuple[str, str, str]:
    """Method, target and version of an HTTP/1.x request line; ApiError 400 (or 505) otherwise."""
    try:
        text = line.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line", "request line is not ASCII") from None
    words = text.split()
    if len(words) != 3:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line",
                       f"expected 'METHOD /path HTTP/1.1', got {text[:80]!r}")
    method, target, version = words
    if not method.isalpha() or not method.isupper():
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line", f"bad method {method[:20]!r}")
    if not version.startswith("HTTP/"):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line", f"bad HTTP version {version[:20]!r}")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise ApiError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "bad_request_line",
                       f"{version[:20]} is not supported: use HTTP/1.1")
    if not target.startswith("/"):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line", f"target {target[:80]!r} must be a path")
    return method, target, version


def head_end(buf: bytes | bytearray) -> int:
    """Index just past the blank line that ends a request head, -1 while it is incomplete."""
    crlf, lf = buf.find(b"\r\n\r\n"), buf.find(b"\n\n")
    ends = [i + n for i, n in ((crlf, 4), (lf, 2)) if i >= 0]
    return min(ends) if ends else -1
