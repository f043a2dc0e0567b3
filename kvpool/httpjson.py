"""HTTP/1.1 + JSON for kvpool's local APIs: one server, one error type, one body policy, one client.

The agent's API (``hostagent.api``) and the controller's (``controller.api``) are each a
``Router`` served by ``ApiServer`` on loopback TCP and, optionally, a Unix socket (a
Unix socket reaches a daemon inside a Mininet host: another network namespace, same
file system). Every client in the project (``kvpool-ctl``, an agent's registration with
the controller, ``AgentClient``, the controller's fill requests, the experiments) talks
through ``JsonClient``. Addresses are ``http://HOST:PORT`` or ``unix:/PATH``.

Body policy (the server enforces it before a handler runs):

* A body is sent with ``Content-Length`` and nothing else: ``POST`` and ``PUT`` without it,
  or any request with ``Transfer-Encoding``, are refused 411 ``no_length``; a length that is
  not a decimal number is 400 ``bad_length``.
* A body longer than the server's limit is refused 413 ``body_too_large`` from the header
  alone, before a byte of it is read; the connection is closed afterwards (the unread body
  cannot be told from a next request).
* A body that ends before its announced length is 400 ``bad_body``.
* An endpoint that takes JSON takes one JSON object: an empty body, bytes that are not
  UTF-8 JSON, or another JSON type are 400 ``bad_json``.
* A body the endpoint did not read is skipped (small) or the connection closed (large), so
  a keep-alive connection never reads body bytes as its next request.

Every refusal is an ``ApiError``: status 4xx/5xx and a one-line JSON body
``{"error": "...", "code": "..."}``; the server counts refusals by code. An unknown path is
404 ``unknown_path``, a known path with another method 405 ``bad_method``, and an
exception a handler did not expect is 500 ``internal`` (logged with its traceback).
The client raises the same ``ApiError`` when a server refuses, and
``ApiUnreachableError`` (a subclass, status 0) when nothing answers.
"""

from __future__ import annotations

import contextlib
import email.message
import http.client
import json
import logging
import os
import socket
import socketserver
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

log = logging.getLogger("kvpool.http")

#: Longest request line or header line accepted (as http.server's limit).
MAX_LINE = 65536
#: Unread bodies up to this size are skipped to keep a connection; larger ones close it.
DRAIN_LIMIT = 64 << 10
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

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


# ---------------------------------------------------------------------------------- server side
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


class Request:
    """One parsed request; the body is read on demand, under the body policy."""

    def __init__(self, method: str, target: str, headers: email.message.Message, read: Callable[[int], bytes],
                 peer: str | None, content_length: int) -> None:
        url = urllib.parse.urlsplit(target)
        self.method = method
        self.target = target
        self.path = url.path.rstrip("/") or "/"
        self.query = urllib.parse.parse_qs(url.query)
        self.headers = headers
        self.peer = peer
        """TCP peer address; None over a Unix socket."""
        self.params: dict[str, str] = {}
        """Path segments captured by the route's ``{name}`` parts."""
        self.content_length = content_length
        self._read = read
        self.body_read = content_length == 0

    def header(self, name: str, default: str = "") -> str:
        """A request header's value (``default`` when absent)."""
        value = self.headers.get(name)
        return default if value is None else str(value)

    def arg(self, name: str, default: str) -> str:
        """The last value of query parameter ``name``."""
        return self.query.get(name, [default])[-1]

    def body(self) -> bytes:
        """The whole body (its length was checked against the limit before the handler ran)."""
        if self.body_read:
            return b""
        data = self._read(self.content_length)
        self.body_read = True
        if len(data) != self.content_length:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_body",
                           f"body ended after {len(data)} of {self.content_length} bytes")
        return data

    def json(self) -> dict[str, Any]:
        """The body as a JSON object; ``ApiError`` 400 ``bad_json`` for anything else."""
        raw = self.body()
        if not raw:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", "body is empty: expected a JSON object")
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", f"body is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", "body must be a JSON object")
        return doc

    def skip_body(self) -> bool:
        """Consume an unread body so the connection stays in step; False when it is too large to bother."""
        if self.body_read:
            return True
        if self.content_length > DRAIN_LIMIT:
            return False
        self._read(self.content_length)
        self.body_read = True
        return True


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    """``method`` on a path pattern: literal segments, or ``{name}`` capturing one segment."""

    method: str
    segments: tuple[str, ...]
    handler: Handler

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


class Router:
    """Routes in the order added; the first whose method and pattern fit handles the request."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        """Serve ``method pattern`` (``"/v1/chunks/{key}"``) with ``handler``."""
        self.routes.append(Route(method, tuple(pattern.strip("/").split("/")), handler))

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
                           f"{method} not allowed on {path[:80]}; use {' or '.join(sorted(set(allowed)))}")
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


def _content_length(method: str, headers: email.message.Message, limit: int) -> int:
    """The body length the policy allows for this request (see the module docstring)."""
    if headers.get("Transfer-Encoding") is not None:
        raise ApiError(HTTPStatus.LENGTH_REQUIRED, "no_length",
                       "send the body with a Content-Length (Transfer-Encoding is not accepted)")
    text = headers.get("Content-Length")
    if text is None:
        if method in _BODY_METHODS:
            raise ApiError(HTTPStatus.LENGTH_REQUIRED, "no_length", "request needs a Content-Length header")
        return 0
    text = str(text).strip()
    if not text.isdigit():
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_length", f"Content-Length {text[:40]!r} is not a byte count")
    n = int(text)
    if n > limit:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body_too_large",
                       f"body of {n} bytes exceeds max_body_bytes {limit}")
    return n


class _Connection(socketserver.StreamRequestHandler):
    """Serves the requests of one connection (keep-alive) through the server's router."""

    server: _TCPServer | _UnixServer
    # Unbuffered writes: response buffers go to the socket as they are, without a copy.
    wbufsize = 0

    def handle(self) -> None:
        while self._one():
            pass

    def _peer(self) -> str | None:
        return self.client_address[0] if isinstance(self.client_address, tuple) else None

    def _one(self) -> bool:
        """Serve one request; False when the connection is done."""
        api = self.server.api
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            return False
        keep_alive = True
        request: Request | None = None
        try:
            method, target, version = _request_line(line)
            keep_alive = version == "HTTP/1.1"
            try:
                headers = http.client.parse_headers(self.rfile)
            except (http.client.HTTPException, UnicodeDecodeError) as exc:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"bad header block: {exc}") from None
            conn_hdr = str(headers.get("Connection", "")).lower()
            keep_alive = (keep_alive and conn_hdr != "close") or conn_hdr == "keep-alive"
            try:
                length = _content_length(method, headers, api.max_body_bytes)
            except ApiError as exc:
                keep_alive = keep_alive and exc.code not in ("body_too_large", "no_length", "bad_length")
                raise
            request = Request(method, target, headers, self.rfile.read, self._peer(), length)
            route, request.params = api.router.resolve(method, request.path)
            response = route.handler(request)
            api.counters.ok()
        except ApiError as exc:
            api.counters.error(exc.code)
            response = Response.json({"error": exc.message, "code": exc.code}, exc.status)
        except Exception as exc:  # a bug must answer 500, not drop the connection without a word
            log.exception("%s: %r failed", api.name, line[:200])
            api.counters.error("internal")
            response = Response.json({"error": f"internal error: {exc}"[:400], "code": "internal"},
                                     HTTPStatus.INTERNAL_SERVER_ERROR)
        if request is not None and not request.skip_body():
            keep_alive = False
        log.debug("%s %s %r -> %d", api.name, self._peer() or "unix", line[:200], response.status)
        try:
            self._write(response, keep_alive)
        except OSError:  # the client went away
            api.counters.error("client_gone")
            return False
        return keep_alive

    def _write(self, response: Response, keep_alive: bool) -> None:
        status = HTTPStatus(response.status)
        head = [f"HTTP/1.1 {status.value} {status.phrase}", f"Server: {self.server.api.name}",
                f"Content-Type: {response.content_type}",
                f"Content-Length: {sum(len(p) for p in response.parts)}"]
        head += [f"{k}: {v}" for k, v in response.headers.items()]
        if not keep_alive:
            head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        for part in response.parts:
            self.wfile.write(part)


def _request_line(line: bytes) -> tuple[str, str, str]:
    """Method, target and version of an HTTP/1.x request line; ApiError 400 (or 505) otherwise."""
    if len(line) > MAX_LINE:
        raise ApiError(HTTPStatus.REQUEST_URI_TOO_LONG, "bad_request_line", f"request line over {MAX_LINE} bytes")
    try:
        text = line.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line", "request line is not ASCII") from None
    words = text.split()
    if len(words) != 3:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line",
                       f"expected 'METHOD TARGET HTTP/1.1', got {text[:80]!r}")
    method, target, version = words
    if not version.startswith("HTTP/"):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line", f"bad HTTP version {version[:20]!r}")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise ApiError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "bad_request_line",
                       f"{version[:20]} is not supported: use HTTP/1.1")
    if not target.startswith("/"):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line", f"target {target[:80]!r} must be a path")
    return method, target, version


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Python's default of 5 refuses connections when many engine threads call at once.
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], api: ApiServer) -> None:
        self.api = api
        super().__init__(address, _Connection)


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, path: str, api: ApiServer) -> None:
        self.api = api
        super().__init__(path, _Connection)


class ApiServer:
    """A ``Router`` served on ``host:port`` (TCP) and, when ``unix_path`` is given, on a Unix socket too."""

    def __init__(self, router: Router, host: str, port: int, *, unix_path: Path | None = None,
                 max_body_bytes: int, name: str, unix_mode: int = 0o660) -> None:
        self.router = router
        self.name = name
        self.max_body_bytes = max_body_bytes
        self.counters = ApiCounters()
        self.host = host
        self.tcp = _TCPServer((host, port), self)
        self.unix: _UnixServer | None = None
        self.unix_path = unix_path
        if unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                unix_path.unlink()  # a socket left by a killed daemon would make bind fail
            try:
                self.unix = _UnixServer(str(unix_path), self)
                os.chmod(unix_path, unix_mode)
            except OSError:
                self.tcp.server_close()
                raise
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        """The TCP port actually bound (useful with port 0)."""
        return int(self.tcp.server_address[1])

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the TCP server."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServer:
        """Serve in background threads; returns self."""
        for srv in self._servers():
            # A short poll interval: stop() (shutdown) waits up to one interval per server.
            t = threading.Thread(target=srv.serve_forever, args=(0.05,), name=f"{self.name}-http", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _servers(self) -> list[socketserver.BaseServer]:
        return [self.tcp] + ([self.unix] if self.unix is not None else [])

    def stop(self) -> None:
        """Stop serving, close the sockets and remove the Unix socket file."""
        for srv in self._servers():
            if self._threads:
                srv.shutdown()
            srv.server_close()
        if self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.unix_path.unlink()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()


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
    """Requests to one kvpool API; refusals raise ``ApiError``, silence ``ApiUnreachableError``."""

    def __init__(self, url: str, timeout: float = 10.0, what: str = "API") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.what = what
        connection(self.url, timeout, what)  # validate the address now, not at the first request

    def request(self, method: str, path: str, body: Buffer | Sequence[Buffer] | None = None,
                headers: Mapping[str, str] | None = None) -> Reply:
        """One request; ``body`` may be several buffers, sent in order without joining them."""
        conn = connection(self.url, self.timeout, self.what)
        parts: Sequence[Buffer] = [] if body is None else [body] if isinstance(body, Buffer) else body
        hdrs = dict(headers or {})
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
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                doc = json.loads(data)
                code, message = str(doc.get("code", code)), str(doc["error"])
            raise ApiError(resp.status, code, message)
        return Reply(resp.status, resp.headers, data)

    def call(self, method: str, path: str, doc: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A JSON request (``doc``, when given) answered by a JSON object."""
        body = None if doc is None else json.dumps(doc).encode()
        headers = {} if doc is None else {"Content-Type": "application/json"}
        reply = self.request(method, path, body, headers)
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

    def post(self, path: str, doc: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """POST ``doc`` (``{}`` when None) to ``path``."""
        return self.call("POST", path, doc if doc is not None else {})

    def delete(self, path: str) -> dict[str, Any]:
        """DELETE ``path``."""
        return self.call("DELETE", path)
