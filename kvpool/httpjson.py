"""HTTP/1.1 + JSON for kvpool's local APIs: one server, one error type, one body policy, one client.

The agent's API (``hostagent.api``) and the controller's (``controller.api``) are each a
``Router`` served by ``ApiServer`` on loopback TCP and, optionally, a Unix socket (a
Unix socket reaches a daemon inside a Mininet host: another network namespace, same
file system). Every client in the project (``kvpool-ctl``, an agent's registration with
the controller, ``AgentClient``, the controller's fill requests, the experiments) talks
through ``JsonClient``. Addresses are ``http://HOST:PORT`` or ``unix:/PATH``.

Authentication: every request whose method is not ``GET`` must carry the operator's token
(``kvpool.auth``) as ``Authorization: Bearer <token>``, unless its route says otherwise
(``Auth``: the controller lets an agent on another host register itself without it, and
checks its address instead); a missing or wrong one is 401 ``unauthorized``, decided from
the headers before a byte of the body is read. The Unix socket file keeps its mode (0660
by default) on top.

Body policy (the server enforces it before a handler runs):

* A body is sent with ``Content-Length`` and nothing else: ``POST`` and ``PUT`` without it,
  or any request with ``Transfer-Encoding``, are refused 411 ``no_length``; a length that is
  not a decimal number is 400 ``bad_length``.
* A body longer than the server's limit is refused 413 ``body_too_large`` from the header
  alone, before a byte of it is read; the connection is closed afterwards (the unread body
  cannot be told from a next request).
* A body that ends before its announced length is 400 ``bad_body``.
* An endpoint that takes JSON takes one JSON object nested at most ``MAX_JSON_DEPTH``
  deep: an empty body, bytes that are not UTF-8 JSON, another JSON type or deeper nesting
  are 400 ``bad_json``.
* A body the endpoint did not read is skipped (small) or the connection closed (large), so
  a keep-alive connection never reads body bytes as its next request.

Connections (what a slow, stalled or hostile client can hold): one I/O thread waits on
every connection with a selector and reads request heads; only a complete head goes to
one of a bounded pool of worker threads, which reads the body and runs the handler. A head
must arrive within ``timeout_s`` of its first byte (else 408 ``timeout``), each read of a
body and each write of an answer within ``timeout_s`` too; an idle keep-alive connection
is closed after ``idle_timeout_s``; past ``max_connections`` new connections are answered
503 and closed. A request line that is not ``METHOD /path HTTP/1.x`` (garbage, HTTP/0.9)
is 400 ``bad_request_line`` as soon as its first line is in, and a head over
``MAX_HEAD`` bytes is 431.

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
import enum
import http.client
import ipaddress
import json
import logging
import os
import queue
import selectors
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from kvpool.auth import Token

log = logging.getLogger("kvpool.http")

MAX_HEAD = 64 << 10
"""Longest request head (request line and headers) accepted."""
MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a JSON body may have (kvpool's bodies need 2)."""
DRAIN_LIMIT = 64 << 10
"""Unread bodies up to this size are skipped to keep a connection; larger ones close it."""
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_SMALL_ANSWER = 64 << 10

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


class _Reader:
    """Buffered reads from a connection's socket, starting with bytes the I/O thread already read."""

    def __init__(self, sock: socket.socket, data: bytes) -> None:
        self.sock = sock
        self.buf = bytearray(data)
        self.pos = 0

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        if self.pos:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += chunk
        return True

    def readline(self, limit: int = -1) -> bytes:
        """One line including its ``\\n`` (at most ``limit`` bytes; shorter at end of input)."""
        while True:
            end = self.buf.find(b"\n", self.pos)
            if end >= 0 or (0 <= limit <= len(self.buf) - self.pos) or not self._fill():
                break
        stop = len(self.buf) if end < 0 else end + 1
        if limit >= 0:
            stop = min(stop, self.pos + limit)
        line = bytes(self.buf[self.pos : stop])
        self.pos = stop
        return line

    def read_into(self, n: int) -> memoryview:
        """Up to ``n`` bytes (fewer only at end of input), in one buffer of their own."""
        out = bytearray(n)
        have = min(n, len(self.buf) - self.pos)
        out[:have] = self.buf[self.pos : self.pos + have]
        self.pos += have
        view = memoryview(out)
        while have < n:
            got = self.sock.recv_into(view[have:], n - have)
            if not got:
                return view[:have]
            have += got
        return view

    def rest(self) -> bytes:
        """What was read past the current request (a pipelined next request)."""
        return bytes(self.buf[self.pos :])


class Request:
    """One parsed request; the body is read on demand, under the body policy."""

    def __init__(self, method: str, target: str, headers: email.message.Message, reader: _Reader,
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
        self._reader = reader
        self.body_read = content_length == 0

    def header(self, name: str, default: str = "") -> str:
        """A request header's value (``default`` when absent)."""
        value = self.headers.get(name)
        return default if value is None else str(value)

    def arg(self, name: str, default: str) -> str:
        """The last value of query parameter ``name``."""
        return self.query.get(name, [default])[-1]

    def body(self) -> memoryview:
        """The whole body (its length was checked against the limit before the handler ran)."""
        if self.body_read:
            return memoryview(b"")
        try:
            data = self._reader.read_into(self.content_length)
        except TimeoutError:
            raise ApiError(HTTPStatus.REQUEST_TIMEOUT, "timeout", "the body stopped arriving") from None
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

    def skip_body(self) -> bool:
        """Consume an unread body so the connection stays in step; False when it is too large to bother."""
        if self.body_read:
            return True
        if self.content_length > DRAIN_LIMIT:
            return False
        self.body_read = True
        return len(self._reader.read_into(self.content_length)) == self.content_length


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


@dataclass(frozen=True)
class Route:
    """``method`` on a path pattern: literal segments, or ``{name}`` capturing one segment."""

    method: str
    segments: tuple[str, ...]
    handler: Handler
    auth: Auth = Auth.TOKEN

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

    def add(self, method: str, pattern: str, handler: Handler, auth: Auth | None = None) -> None:
        """Serve ``method pattern`` (``"/v1/chunks/{key}"``) with ``handler``.

        ``auth`` defaults to none for ``GET`` and the token for every other (mutating) method.
        """
        if auth is None:
            auth = Auth.NONE if method == "GET" else Auth.TOKEN
        self.routes.append(Route(method, tuple(pattern.strip("/").split("/")), handler, auth))

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


def _request_line(line: bytes) -> tuple[str, str, str]:
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


def _head_end(buf: bytes | bytearray) -> int:
    """Index just past the blank line that ends a request head, -1 while it is incomplete."""
    crlf, lf = buf.find(b"\r\n\r\n"), buf.find(b"\n\n")
    ends = [i + n for i, n in ((crlf, 4), (lf, 2)) if i >= 0]
    return min(ends) if ends else -1


class _Workers:
    """At most ``size`` daemon threads running ``work`` on submitted items; started as work arrives.

    Daemon threads, unlike ``concurrent.futures``' workers, never hold up the process's
    exit behind a handler that is still waiting (a fetch on a stopped transport, say).
    """

    def __init__(self, size: int, name: str, work: Callable[[_Conn], None]) -> None:
        self.size = size
        self.name = name
        self.work = work
        self.threads: list[threading.Thread] = []
        self._queue: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._queued = 0

    def submit(self, item: _Conn) -> None:
        """Queue ``item``; start another thread when none is idle and the pool is not full."""
        with self._lock:
            self._queued += 1
            if self._queued > self._idle and len(self.threads) < self.size:
                t = threading.Thread(target=self._run, name=f"{self.name}-{len(self.threads)}", daemon=True)
                self.threads.append(t)
                t.start()
        self._queue.put(item)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if item is None:
                return
            self.work(item)

    def stop(self, wait_s: float) -> None:
        """Ask every thread to end after its current item; wait up to ``wait_s`` for them in all."""
        with self._lock:
            threads = list(self.threads)
        for _ in threads:
            self._queue.put(None)
        deadline = time.monotonic() + wait_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


@dataclass(eq=False)
class _Conn:
    """A connection between requests: its socket, what was read of the next head, and its deadline."""

    sock: socket.socket
    peer: str | None
    buf: bytearray = field(default_factory=bytearray)
    deadline: float = 0.0


class ApiServer:
    """A ``Router`` served on ``host:port`` (TCP) and, when ``unix_path`` is given, on a Unix socket too.

    See the module docstring for the connection model; ``workers`` bounds the threads that
    run handlers, whatever the number of connections.
    """

    def __init__(self, router: Router, host: str, port: int, *, token: Token, max_body_bytes: int, name: str,
                 unix_path: Path | None = None, unix_mode: int = 0o660, workers: int = 16,
                 timeout_s: float = 10.0, idle_timeout_s: float = 60.0, max_connections: int = 1024) -> None:
        if workers < 1 or timeout_s <= 0 or idle_timeout_s <= 0 or max_connections < 1:
            raise ValueError("workers and max_connections must be >= 1, the timeouts positive")
        self.router = router
        self.name = name
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.workers = workers
        self.timeout_s = timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.counters = ApiCounters()
        self.host = host
        self.unix_path = unix_path
        self._listeners: list[socket.socket] = []
        try:
            tcp = socket.create_server((host, port), backlog=128)
            self._listeners.append(tcp)
            if unix_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    unix_path.unlink()  # a socket left by a killed daemon would make bind fail
                unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._listeners.append(unix)
                unix.bind(str(unix_path))
                os.chmod(unix_path, unix_mode)
                unix.listen(128)
        except OSError:
            for s in self._listeners:
                s.close()
            raise
        self.port = int(tcp.getsockname()[1])
        """The TCP port actually bound (useful with port 0)."""
        self._returned: queue.SimpleQueue[_Conn] = queue.SimpleQueue()
        self._busy: set[socket.socket] = set()  # connections a worker holds
        self._open = 0  # connections open, waiting or busy (the I/O thread's count)
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = threading.Event()
        self._pool = _Workers(workers, f"{name}-worker", self._serve)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the TCP server."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServer:
        """Serve: one I/O thread, up to ``workers`` handler threads; returns self."""
        self._thread = threading.Thread(target=self._io_loop, name=f"{self.name}-io", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait_s: float = 1.0) -> None:
        """Stop serving: close the listeners and every connection, remove the socket file.

        Handlers still running after ``wait_s`` finish on their own (their answers go nowhere).
        """
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._lock:
            busy = list(self._busy)
        for sock in busy:  # a worker blocked on a slow client returns at once
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._pool.stop(wait_s)
        for s in self._listeners:
            s.close()
        self._listeners.clear()
        self._wake_r.close()
        self._wake_w.close()
        if self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.unix_path.unlink()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # ------------------------------------------------------------------ the I/O thread
    def _io_loop(self) -> None:
        sel = selectors.DefaultSelector()
        for s in self._listeners:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, "listen")
        self._wake_r.setblocking(False)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        waiting: dict[socket.socket, _Conn] = {}
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                nearest = min((c.deadline for c in waiting.values()), default=now + 1.0)
                for key, _ in sel.select(max(0.0, min(1.0, nearest - now))):
                    if key.data == "listen":
                        self._accept(key.fileobj, sel, waiting)  # type: ignore[arg-type]
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._readable(key.data, sel, waiting)
                while True:  # connections a worker finished a request on, for the next one
                    try:
                        conn = self._returned.get_nowait()
                    except queue.Empty:
                        break
                    conn.deadline = time.monotonic() + (self.timeout_s if conn.buf else self.idle_timeout_s)
                    waiting[conn.sock] = conn
                    sel.register(conn.sock, selectors.EVENT_READ, conn)
                    if conn.buf:
                        self._readable(conn, sel, waiting, read=False)
                now = time.monotonic()
                for conn in [c for c in waiting.values() if c.deadline <= now]:
                    self._forget(conn, sel, waiting)
                    if conn.buf:  # a head that stopped arriving; an idle keep-alive just closes
                        self._refuse(conn, ApiError(HTTPStatus.REQUEST_TIMEOUT, "timeout",
                                                    f"request head not complete within {self.timeout_s:g} s"))
                    else:
                        self._close(conn.sock)
        except Exception:  # a bug here would silently stop the API: say so
            log.exception("%s: I/O loop crashed", self.name)
            raise
        finally:
            for conn in list(waiting.values()):
                self._forget(conn, sel, waiting)
                self._close(conn.sock)
            sel.close()

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector,
                waiting: dict[socket.socket, _Conn]) -> None:
        while True:
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, say: keep serving the others
                log.warning("%s: accept failed: %s", self.name, exc)
                return
            with self._lock:
                self._open += 1
            peer = addr[0] if isinstance(addr, tuple) else None
            conn = _Conn(sock, peer, deadline=time.monotonic() + self.idle_timeout_s)
            if peer is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            if self._open > self.max_connections:
                self._refuse(conn, ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "busy",
                                            f"{self.max_connections} connections open; try again later"))
                continue
            waiting[sock] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _readable(self, conn: _Conn, sel: selectors.BaseSelector, waiting: dict[socket.socket, _Conn],
                  read: bool = True) -> None:
        if read:
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._forget(conn, sel, waiting)
                self._close(conn.sock)
                return
            if not conn.buf:
                conn.deadline = time.monotonic() + self.timeout_s  # the head's clock starts at its first byte
            conn.buf += data
        first = conn.buf.find(b"\n")
        if first >= 0:
            try:
                _request_line(bytes(conn.buf[: first + 1]))
            except ApiError as exc:  # garbage or HTTP/0.9: answer now, not after the head timeout
                self._forget(conn, sel, waiting)
                self._refuse(conn, exc)
                return
        elif len(conn.buf) > MAX_HEAD:
            self._forget(conn, sel, waiting)
            self._refuse(conn, ApiError(HTTPStatus.REQUEST_URI_TOO_LONG, "bad_request_line",
                                        f"request line over {MAX_HEAD} bytes"))
            return
        end = _head_end(conn.buf)
        if end < 0 and len(conn.buf) <= MAX_HEAD:
            return
        self._forget(conn, sel, waiting)
        if end < 0 or end > MAX_HEAD:
            self._refuse(conn, ApiError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "bad_header",
                                        f"request head over {MAX_HEAD} bytes"))
            return
        with self._lock:
            self._busy.add(conn.sock)
        self._pool.submit(conn)

    def _forget(self, conn: _Conn, sel: selectors.BaseSelector, waiting: dict[socket.socket, _Conn]) -> None:
        waiting.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)

    def _refuse(self, conn: _Conn, exc: ApiError) -> None:
        """Answer a refusal the I/O thread found (best effort: the socket is non-blocking) and close."""
        self.counters.error(exc.code)
        resp = Response.error(exc)
        with contextlib.suppress(OSError):
            conn.sock.send(resp.encode_head(self.name, keep_alive=False) + b"".join(resp.parts))
        self._close(conn.sock)

    def _close(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.close()
        with self._lock:
            self._open -= 1

    # ------------------------------------------------------------------ a worker thread
    def _serve(self, conn: _Conn) -> None:
        """Serve the one request whose head the I/O thread read; hand the connection back or close it."""
        sock = conn.sock
        keep = False
        reader = _Reader(sock, bytes(conn.buf))
        try:
            sock.settimeout(self.timeout_s)
            keep = self._one(reader, conn.peer)
        except Exception:  # never lose a worker to a bug
            log.exception("%s: serving a request failed", self.name)
        with self._lock:
            self._busy.discard(sock)
        if keep and not self._stop.is_set():
            try:
                sock.setblocking(False)
            except OSError:
                pass
            else:
                self._returned.put(_Conn(sock, conn.peer, bytearray(reader.rest())))
                self._wake()
                return
        self._close(sock)

    def _one(self, reader: _Reader, peer: str | None) -> bool:
        """Parse, authenticate, route and answer one request; whether the connection may serve another."""
        line = reader.readline(MAX_HEAD + 1)
        keep_alive = True
        request: Request | None = None
        try:
            method, target, version = _request_line(line)
            keep_alive = version == "HTTP/1.1"
            try:
                headers = http.client.parse_headers(reader)  # type: ignore[arg-type]  # reads lines only
            except (http.client.HTTPException, UnicodeDecodeError) as exc:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"bad header block: {exc}"[:200]) from None
            if headers.defects:  # a line without a colon, say: the email parser only notes it
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_header",
                               f"bad header block: {type(headers.defects[0]).__name__}")
            conn_hdr = str(headers.get("Connection", "")).lower()
            keep_alive = (keep_alive and conn_hdr != "close") or conn_hdr == "keep-alive"
            path = urllib.parse.urlsplit(target).path.rstrip("/") or "/"
            route, params = self.router.resolve(method, path)
            if route.needs_token(peer):
                self._authenticate(headers)
            try:
                length = _content_length(method, headers, self.max_body_bytes)
            except ApiError:
                keep_alive = False
                raise
            request = Request(method, target, headers, reader, peer, length)
            request.params = params
            response = route.handler(request)
            self.counters.ok()
        except ApiError as exc:
            self.counters.error(exc.code)
            if request is None:
                # Refused before the head was fully read or the body policy ran: what is left of
                # the head or an unread body must never be parsed as the next request.
                keep_alive = False
            response = Response.error(exc)
        except Exception as exc:  # a bug must answer 500, not drop the connection without a word
            log.exception("%s: %r failed", self.name, line[:200])
            self.counters.error("internal")
            response = Response.error(ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "internal",
                                               f"internal error: {exc}"[:400]))
        try:
            if request is not None and not request.skip_body():
                keep_alive = False
        except OSError:
            keep_alive = False
        log.debug("%s %s %r -> %d", self.name, peer or "unix", line[:200], response.status)
        try:
            self._write(reader.sock, response, keep_alive)
        except OSError:  # the client went away or stopped reading
            self.counters.error("client_gone")
            return False
        return keep_alive

    def _authenticate(self, headers: email.message.Message) -> None:
        scheme, _, presented = str(headers.get("Authorization", "")).partition(" ")
        if scheme.lower() != "bearer" or not self.token.matches(presented.strip()):
            what = "wrong" if scheme else "missing"
            raise ApiError(HTTPStatus.UNAUTHORIZED, "unauthorized",
                           f"{what} token: send 'Authorization: Bearer <token>' with the token in "
                           f"{self.token.path} (the owner's kvpool token file)")

    def _write(self, sock: socket.socket, response: Response, keep_alive: bool) -> None:
        head = response.encode_head(self.name, keep_alive)
        size = sum(len(p) for p in response.parts)
        if size <= _SMALL_ANSWER:  # one send: no small second segment left waiting on an ACK
            sock.sendall(head + b"".join(response.parts))
            return
        sock.sendall(head)
        for part in response.parts:
            sock.sendall(part)

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
