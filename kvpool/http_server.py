"""The server of kvpool's two APIs: a ``Router`` (``kvpool.http_api``) as a FastAPI app on uvicorn.

``ApiServer`` binds loopback TCP and, optionally, a Unix socket (mode 0660 by default) and
runs uvicorn on its own event loop in one thread. Handlers are plain functions of a
``Request``; they run in a bounded pool of daemon threads, so a handler that blocks (a
fetch waiting on a holder) holds one thread, never the event loop, and never the process's
exit. What a slow, stalled or hostile client can hold is bounded in three layers:

* ``_Protocol`` (uvicorn's h11 protocol, guarded): a request head must arrive within
  ``timeout_s`` of its first byte (else 408 ``timeout``); its request line is checked as
  soon as it is in (garbage, HTTP/0.9, an absolute URL, a lower-case method: 400
  ``bad_request_line``; HTTP/2.0: 505); a head over ``MAX_HEAD`` bytes is 414 or 431; a
  header line without a colon or over ``MAX_HEADERS`` lines is 400 ``bad_header``; a
  ``Transfer-Encoding`` is 411 ``no_length`` and a ``Content-Length`` that is not a decimal
  number 400 ``bad_length``. h11 only ever sees a head that passed, plus exactly its body; an
  idle keep-alive connection closes after ``idle_timeout_s``; past ``max_connections`` a new
  connection is answered 503 ``busy``.
* ``_Guard`` (ASGI, before the app): the route (404 ``unknown_path``, 405 ``bad_method``),
  then the token (401 ``unauthorized``), then the body policy from the headers alone (a
  ``POST``/``PUT`` without ``Content-Length`` is 411, one over ``max_body_bytes`` 413
  ``body_too_large``), all before a byte of the body is read. The body is then read
  asynchronously, each read within ``timeout_s`` (408 ``timeout``): a stalled body holds a
  coroutine, not a thread, so health and small requests are answered whatever the number
  of stalled uploads. A body that ends early is 400 ``bad_body``. A refused request whose
  body was not read closes its connection (its bytes cannot be told from a next request).
* The FastAPI app: one route per ``Router`` route (its OpenAPI schema is served at
  ``/openapi.json``); each runs its handler in the thread pool and writes the answer's
  buffers in order, without joining them, each write within ``timeout_s`` (megabyte answers
  straight from their buffers, ``_Protocol.write_direct``).

Every refusal is a one-line JSON ``ApiError`` and is counted by code (``counters``); an
exception a handler did not expect is 500 ``internal`` (logged with its traceback).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, ClassVar

import h11
import numpy as np
import uvicorn
from fastapi import FastAPI
from fastapi import Request as FastApiRequest
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response as StarletteResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvpool.auth import Token
from kvpool.http_api import (
    BODY_METHODS,
    MAX_HEAD,
    MAX_HEADERS,
    OCTETS,
    TEXT,
    ApiCounters,
    ApiError,
    Auth,
    Buffer,
    Doc,
    Request,
    Response,
    Route,
    Router,
    head_end,
    parse_request_line,
)
from kvpool.http_openapi import answers, operation_extra, summary_of

log = logging.getLogger("kvpool.http")


@dataclass(frozen=True)
class _Limits:
    """What one server allows, shared by its protocol, its guard and its app."""

    name: str
    router: Router
    token: Token
    counters: ApiCounters
    max_body_bytes: int
    timeout_s: float
    idle_timeout_s: float
    max_connections: int


def _raw_refusal(limits: _Limits, exc: ApiError) -> bytes:
    """A counted one-line JSON refusal that closes its connection, as bytes to write."""
    limits.counters.error(exc.code)
    resp = Response.error(exc)
    return resp.encode_head(limits.name, keep_alive=False) + b"".join(resp.parts)


def _checked_head(head: bytes) -> tuple[bytes, int | None]:
    """The head as h11 is to see it and the body length; ApiError if refused.

    h11 sees CRLF lines, a ``Host`` if none, and no ``Content-Length``: the body goes past it
    (``_Body``), and the guard finds the real length in the scope's headers.
    """
    lines = head.split(b"\n")
    method, target, version = parse_request_line(lines[0])
    fields = [line.rstrip(b"\r") for line in lines[1:]]
    fields = [f for f in fields if f]
    if len(fields) > MAX_HEADERS:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"bad header block: got more than {MAX_HEADERS} headers")
    has_host = False
    lengths: set[bytes] = set()
    kept: list[bytes] = []
    for f in fields:
        name, colon, value = f.partition(b":")
        if not colon or not name or name != name.strip():
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"bad header block: line {f[:40]!r} is no header")
        lname = name.lower()
        if lname == b"host":
            has_host = True
        elif lname == b"transfer-encoding":
            raise ApiError(HTTPStatus.LENGTH_REQUIRED, "no_length",
                           "send the body with a Content-Length (Transfer-Encoding is not accepted)")
        elif lname == b"content-length":
            lengths.add(value.strip())
            continue
        kept.append(f)
    length = None
    if lengths:
        text = lengths.pop()
        if lengths or not text.isdigit():
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_length",
                           f"Content-Length {text[:40].decode('latin-1')!r} is not a byte count")
        length = int(text)
    if not has_host:
        kept.append(b"Host: localhost")  # h11 insists on one; a local API has no use for it
    return b"\r\n".join([f"{method} {target} {version}".encode(), *kept]) + b"\r\n\r\n", length


READ_SIZE = 256 << 10
"""Largest read of a head (and of the early part of a body)."""
WRITE_BUFFER = 4 << 20
"""Bytes of an answer queued on a connection before its writer waits: megabyte parts flow without gaps."""
DIRECT_WRITE = 256 << 10
"""An answer body at least this long is written from its own buffers (``_Protocol.write_direct``)."""
EARLY_BODY = 64 << 10
"""Body bytes a connection takes before the guard has checked the request; then it stops reading."""


LARGE_BODY = 1 << 20
"""A body at least this long goes into a buffer from numpy (see ``_body_buffer``)."""


def _body_buffer(length: int) -> bytearray | memoryview:
    """A writable buffer of ``length`` bytes for a request body.

    ``bytearray(n)`` zeroes its memory in small pages, which costs as much as receiving the
    body; numpy's allocator leaves it unwritten (the body overwrites all of it) and asks
    for transparent huge pages on large arrays (64 MiB: about 15 ms instead of 55 ms here).
    """
    if length < LARGE_BODY:
        return bytearray(length)
    return np.empty(length, dtype=np.uint8).data  # a 1-D memoryview of format "B"


class _Body:
    """The body of the request in progress, written by the protocol straight into one buffer.

    Until the guard ``open``s it (route, token and length checked), at most ``EARLY_BODY``
    bytes are kept and the connection then stops reading; after, every byte is copied once,
    into a buffer of the announced length. Lives on the event loop's thread.
    """

    def __init__(self, protocol: _Protocol, length: int) -> None:
        self.protocol = protocol
        self.length = length
        self.got = 0
        self.ended = False  # the client closed its side (or the connection) before the end
        self.early: bytearray | None = bytearray()
        self.buf: bytearray | memoryview | None = None
        self.event = asyncio.Event()

    @property
    def done(self) -> bool:
        """Every announced byte is in, or no more will come."""
        return self.got >= self.length or self.ended

    def feed(self, data: bytes) -> None:
        """Body bytes from the connection (never more than announced)."""
        if self.buf is None:
            assert self.early is not None
            self.early += data
            self.got += len(data)
            if len(self.early) >= EARLY_BODY:
                self.protocol.flow.pause_reading()
        else:
            self.buf[self.got : self.got + len(data)] = data
            self.got += len(data)
        if self.done:
            self.event.set()

    def wrote(self, nbytes: int) -> None:
        """``nbytes`` were read straight into the buffer, past ``got``."""
        self.got += nbytes
        if self.done:
            self.event.set()

    def end(self) -> None:
        """No more bytes will come."""
        self.ended = True
        self.event.set()

    async def read(self, timeout_s: float) -> memoryview:
        """The whole body; 408 when ``timeout_s`` passes without a byte, 400 when it ends early.

        The timeout is per stretch of ``timeout_s``: a body that keeps arriving is never cut.
        """
        self.buf = _body_buffer(self.length)
        assert self.early is not None
        self.buf[: len(self.early)] = self.early
        self.early = None
        self.protocol.flow.resume_reading()
        while not self.done:  # woken at the end only; a wait that saw no byte arrive is a stall
            before = self.got
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), timeout_s)
            if not self.done and self.got == before:
                raise ApiError(HTTPStatus.REQUEST_TIMEOUT, "timeout", "the body stopped arriving")
        if self.got != self.length:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_body", f"body ended after {self.got} of {self.length} bytes")
        return memoryview(self.buf)


class _Protocol(H11Protocol, asyncio.BufferedProtocol):
    """uvicorn's h11 protocol behind a head reader that enforces the module docstring's first layer.

    A buffered protocol: once the guard opened a body, the socket reads straight into it.
    """

    limits: ClassVar[_Limits]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection; refuse it past ``max_connections``; start its idle clock."""
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # socket.create_server's listener has proto 0, so asyncio does not set TCP_NODELAY
            # on what it accepts, and an answer written as head then body waited out the
            # client's delayed ACK: 40 ms per request on Linux, whatever the handler took.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pending = bytearray()  # bytes of the next request h11 has not been given
        self._body: _Body | None = None  # the body of the request in progress, while it arrives
        self._scratch = bytearray(READ_SIZE)
        self._into_body = False
        transport.set_write_buffer_limits(high=WRITE_BUFFER)
        self._busy = False  # a head went to h11 and its answer is not complete
        self._eof = False
        self._head_clock = False
        self._clock: asyncio.TimerHandle | None = None
        if len(self.connections) > self.limits.max_connections:
            self._refuse(ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "busy",
                                  f"{self.limits.max_connections} connections open; try again later"))
            return
        self._arm(self.limits.idle_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the clock; a body still arriving never will."""
        self._disarm()
        if self._body is not None:
            self._body.end()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._clock = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._clock is not None:
            self._clock.cancel()
            self._clock = None

    def _expired(self) -> None:
        self._clock = None
        if self._busy or self.transport.is_closing():
            return  # a request in progress: the guard's and the app's own timeouts apply
        if self._pending:
            self._refuse(ApiError(HTTPStatus.REQUEST_TIMEOUT, "timeout",
                                  f"request head not complete within {self.limits.timeout_s:g} s"))
        else:  # an idle keep-alive connection just closes
            self.transport.close()

    def _refuse(self, exc: ApiError) -> None:
        self._disarm()
        self._pending.clear()
        if not self.transport.is_closing():
            self.transport.write(_raw_refusal(self.limits, exc))
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """What h11 itself refused (a header it cannot parse): the same one-line JSON as every refusal."""
        self._refuse(ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"bad header block: {msg}"))

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol allows True
        """A body that ends early is answered (400 ``bad_body``); otherwise the connection just closes."""
        self._eof = True
        if self._body is not None:
            self._body.end()
        if self._busy:
            return True  # keep the transport open for the answer
        return None

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: into an open body's own buffer, else a scratch buffer."""
        body = self._body
        self._into_body = body is not None and body.buf is not None and body.got < body.length
        if self._into_body:
            assert body is not None and body.buf is not None
            return memoryview(body.buf)[body.got : body.length]  # never past the body: a next request waits
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were read into the buffer ``get_buffer`` gave."""
        if self._into_body:
            assert self._body is not None
            self._body.wrote(nbytes)
            if self._body.done:
                self._body = None
        else:
            self.data_received(bytes(self._scratch[:nbytes]))

    def data_received(self, data: bytes) -> None:
        """Hand h11 one checked head, the body to ``_Body``; hold what follows until the answer is out."""
        body = self._body
        if body is not None:
            n = min(body.length - body.got, len(data))
            body.feed(data[:n] if n < len(data) else data)
            if body.got >= body.length:
                self._body = None
            data = data[n:]
        if not data:
            return
        self._pending += data
        if self._busy:
            if len(self._pending) > MAX_HEAD:
                self.flow.pause_reading()  # pipelined requests: wait for this answer first
            return
        self._next_head()

    def _next_head(self) -> None:
        buf = self._pending
        if not self._head_clock:  # a head's clock starts at its first byte
            self._head_clock = True
            self._arm(self.limits.timeout_s)
        try:
            first = buf.find(b"\n")
            if first >= 0:
                parse_request_line(bytes(buf[: first + 1]))  # garbage is refused now, not at the timeout
            elif len(buf) > MAX_HEAD:
                raise ApiError(HTTPStatus.REQUEST_URI_TOO_LONG, "bad_request_line",
                               f"request line over {MAX_HEAD} bytes")
            end = head_end(buf)
            if end < 0 and len(buf) <= MAX_HEAD:
                return
            if end < 0 or end > MAX_HEAD:
                raise ApiError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "bad_header",
                               f"request head over {MAX_HEAD} bytes")
            head, length = _checked_head(bytes(buf[:end]))
        except ApiError as exc:
            self._refuse(exc)
            return
        early = bytes(buf[end : end + (length or 0)])
        del buf[: end + len(early)]
        self._head_clock = False
        self._disarm()
        self._busy = True
        self.scope = None  # type: ignore[assignment]
        super().data_received(head)  # the request task is created, not yet run
        if self.scope is None or self.transport.is_closing():
            return
        self.scope["kvpool.protocol"] = self  # type: ignore[typeddict-unknown-key]  # for _Answer.write_direct
        if length is not None:
            self.headers.append((b"content-length", str(length).encode()))  # the scope's own list
        if length:
            body = _Body(self, length)
            self.scope["kvpool.body"] = body  # type: ignore[typeddict-unknown-key]
            body.feed(early)
            self._body = None if body.done else body

    async def write_direct(self, parts: Sequence[Buffer], timeout_s: float) -> bool:
        """Write the answer's body ``parts`` from their own buffers, counted by h11; False if written otherwise.

        uvicorn's ``send`` goes through the transport, which copies whatever the socket does not
        take at once into its buffer (and ``bytes`` slices once more); megabyte parts are here
        sent by ``loop.sock_sendall`` on a duplicate of the socket, no copy in between, each
        within ``timeout_s``. Only when the transport holds no bytes (the head has left). A
        client that stops reading or goes away is dropped (True: the answer is over).
        """
        transport = self.transport
        if transport.is_closing() or transport.get_write_buffer_size() or self.cycle is None:
            return False
        loop = self.loop
        sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        try:
            sock.setblocking(False)
            async with asyncio.timeout(None) as deadline:
                for part in parts:
                    # h11 counts the bytes and hands them back as they are (a view too, whatever its stub says).
                    for data in self.conn.send_with_data_passthrough(h11.Data(data=part)) or ():  # type: ignore[arg-type]
                        deadline.reschedule(loop.time() + timeout_s)
                        await loop.sock_sendall(sock, data)
        except (OSError, TimeoutError) as exc:  # TimeoutError: the client stopped reading
            log.debug("%s: answer to %s cut: %s", self.limits.name, self.client, exc or type(exc).__name__)
            self.cycle.disconnected = True  # what connection_lost says: no more sends, no error logged
            transport.close()
        finally:
            sock.close()
        return True

    def on_response_complete(self) -> None:
        """Back to reading heads: the idle clock, then any pipelined request."""
        self._busy = False
        super().on_response_complete()
        self._unset_keepalive_if_required()  # our own idle clock instead
        if self.transport.is_closing():
            return
        if self._eof:
            self.transport.close()
            return
        self._arm(self.limits.idle_timeout_s)
        if self._pending:
            self._next_head()


class _Threads:
    """At most ``size`` daemon threads running handlers; started as work arrives.

    Daemon threads, unlike ``concurrent.futures``' workers, never hold up the process's
    exit behind a handler that is still waiting (a fetch on a stopped transport, say).
    """

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self.threads: list[threading.Thread] = []
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._idle = 0
        self._queued = 0

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``fn`` on a pool thread; its future."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._queued += 1
            if self._queued > self._idle and len(self.threads) < self.size:
                t = threading.Thread(target=self._run, name=f"{self.name}-{len(self.threads)}", daemon=True)
                self.threads.append(t)
                t.start()
        self._queue.put((fut, fn))
        return fut

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
            fut, fn = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the awaiting coroutine
                fut.set_exception(exc)

    def stop(self) -> None:
        """Ask every thread to end after its current item (no wait: they are daemons)."""
        with self._lock:
            threads = list(self.threads)
        for _ in threads:
            self._queue.put(None)


def _authenticate(limits: _Limits, headers: Mapping[str, str]) -> None:
    scheme, _, presented = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not limits.token.matches(presented.strip()):
        what = "wrong" if scheme else "missing"
        raise ApiError(HTTPStatus.UNAUTHORIZED, "unauthorized",
                       f"{what} token: send 'Authorization: Bearer <token>' with the token in "
                       f"{limits.token.path} (the owner's kvpool token file)")


def _body_length(method: str, headers: Mapping[str, str], limit: int) -> int:
    """The body length the policy allows (the protocol already refused a malformed one)."""
    text = headers.get("content-length")
    if text is None:
        if method in BODY_METHODS:
            raise ApiError(HTTPStatus.LENGTH_REQUIRED, "no_length", "request needs a Content-Length header")
        return 0
    n = int(text.strip())
    if n > limit:
        raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body_too_large",
                       f"body of {n} bytes exceeds max_body_bytes {limit}")
    return n


class _Answer(StarletteResponse):
    """A kvpool ``Response`` as an ASGI answer: its buffers written in order, not joined."""

    def __init__(self, resp: Response, server: str, close: bool, timeout_s: float) -> None:
        self.status_code = int(resp.status)
        self.background = None
        self.resp = resp
        self.timeout_s = timeout_s
        size = sum(len(p) for p in resp.parts)
        headers = [(b"Server", server.encode()), (b"Content-Type", resp.content_type.encode()),
                   (b"Content-Length", str(size).encode())]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()]
        if close:
            headers.append((b"Connection", b"close"))
        self.raw_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Write the head, then each buffer within ``timeout_s`` (a client that stops reading is dropped)."""
        await asyncio.wait_for(send({"type": "http.response.start", "status": self.status_code,
                                     "headers": self.raw_headers}), self.timeout_s)
        parts = [p for p in self.resp.parts if len(p)] or [b""]
        protocol: _Protocol | None = scope.get("kvpool.protocol")
        if (protocol is not None and scope["method"] != "HEAD" and sum(len(p) for p in parts) >= DIRECT_WRITE
                and await protocol.write_direct(parts, self.timeout_s)):
            if not protocol.cycle.disconnected:
                await send({"type": "http.response.body", "body": b"", "more_body": False})  # h11's end of message
            return
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as deadline:  # one timer, moved per part (wait_for makes a task per part)
            for i, part in enumerate(parts):
                if isinstance(part, memoryview) and isinstance(part.obj, bytes) and part.nbytes == len(part.obj):
                    part = part.obj  # the whole bytes object: h11 passes it on without a copy
                deadline.reschedule(loop.time() + self.timeout_s)
                await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})


class _Guard:
    """ASGI middleware: route, token and body policy from the headers, then the body, read asynchronously."""

    def __init__(self, app: Any, limits: _Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse or read; a request that passes goes to the app with its ``Request`` in the scope."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lim = self.limits
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]
        raw_path = scope["raw_path"].decode("latin-1")
        client = scope.get("client")
        peer = client[0] if client else None
        path = raw_path.rstrip("/") or "/"
        read = False
        try:
            route, params = lim.router.resolve(method, path)
            if route.needs_token(peer):
                _authenticate(lim, headers)
            length = _body_length(method, headers, lim.max_body_bytes)
            body = await scope["kvpool.body"].read(lim.timeout_s) if length else memoryview(b"")
            read = True
        except ApiError as exc:
            lim.counters.error(exc.code)
            unread = not read and headers.get("content-length", "0").strip() != "0"
            await _Answer(Response.error(exc), lim.name, unread, lim.timeout_s)(scope, receive, send)
            return
        query = scope.get("query_string", b"").decode("latin-1")
        target = raw_path + (f"?{query}" if query else "")
        scope["kvpool.route"] = route
        scope["kvpool.request"] = Request(method, target, headers, peer, body, params)
        scope["path"] = urllib.parse.unquote(path)
        await self.app(scope, receive, send)


def build_app(limits: _Limits, threads: _Threads, title: str, description: str = "") -> FastAPI:
    """The FastAPI app serving ``limits.router`` (behind ``_Guard``, which fills in each request)."""
    app = FastAPI(title=title, version="1", description=description, openapi_url=None, docs_url=None,
                  redoc_url=None)

    async def dispatch(request: FastApiRequest) -> StarletteResponse:
        route: Route = request.scope["kvpool.route"]
        req: Request = request.scope["kvpool.request"]
        try:
            resp = await asyncio.wrap_future(threads.submit(lambda: route.handler(req)))
            served = True
        except ApiError as exc:
            limits.counters.error(exc.code)
            resp = Response.error(exc)
            served = False
        except Exception as exc:  # a bug must answer 500, not drop the connection without a word
            log.exception("%s: %s %s failed", limits.name, req.method, req.target[:200])
            limits.counters.error("internal")
            resp = Response.error(ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "internal",
                                           f"internal error: {exc}"[:400]))
            served = False
        if served:
            limits.counters.ok()
        log.debug("%s %s %s %s -> %d", limits.name, req.peer or "unix", req.method, req.target[:200], resp.status)
        return _Answer(resp, limits.name, False, limits.timeout_s)

    for route in limits.router.routes:
        pattern = "/" + "/".join(route.segments)
        model = route.doc.answer if isinstance(route.doc.answer, type) else None
        summary = route.doc.summary or summary_of(route.handler.__doc__ or "")
        op_id = "_".join([route.method.lower(), *(seg.strip("{}").replace(".", "_") for seg in route.segments)])
        app.add_api_route(pattern, dispatch, methods=[route.method], name=f"{route.method} {pattern}",
                          operation_id=op_id,
                          summary=summary, response_model=model, responses=answers(route.doc),
                          openapi_extra=operation_extra(route),
                          response_class=StarletteResponse if route.doc.answer in (OCTETS, TEXT) else JSONResponse)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=title, version=app.version, description=description, routes=app.routes)
        components = schema.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        for route in limits.router.routes:
            body = route.doc.body
            if isinstance(body, type) and issubclass(body, BaseModel):
                js = body.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(js.pop("$defs", {}))
                schemas[body.__name__] = js
        components["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "the operator's token (kvpool.auth): every call but GET, unless the route says otherwise"}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(StarletteHTTPException)
    async def refused(request: FastApiRequest, exc: StarletteHTTPException) -> StarletteResponse:
        # Only a path the guard resolved but FastAPI did not (an escaped "/" in a segment) ends here.
        err = ApiError(exc.status_code, "unknown_path" if exc.status_code == 404 else "bad_request", str(exc.detail))
        limits.counters.error(err.code)
        return _Answer(Response.error(err), limits.name, False, limits.timeout_s)

    return app


def with_openapi(router: Router, schema: Callable[[], dict[str, Any]]) -> Router:
    """``router`` plus ``GET /openapi.json`` answering ``schema()``."""
    served = Router()
    served.routes = [*router.routes, Route("GET", ("openapi.json",), lambda _req: Response.json(schema()), Auth.NONE,
                                           Doc(summary="This API's OpenAPI schema"))]
    return served


def openapi_schema(router: Router, title: str, description: str = "") -> dict[str, Any]:
    """The OpenAPI schema that a server of ``router`` answers at ``/openapi.json`` (no server needed)."""
    limits = _Limits(title, with_openapi(router, dict), Token("", Path("/dev/null")), ApiCounters(), 0, 1.0, 1.0, 1)
    return build_app(limits, _Threads(1, "openapi"), title, description).openapi()


class ApiServer:
    """A ``Router`` served on ``host:port`` (TCP) and, when ``unix_path`` is given, on a Unix socket too.

    See the module docstring for the connection model; ``workers`` bounds the threads that
    run handlers, whatever the number of connections.
    """

    def __init__(self, router: Router, host: str, port: int, *, token: Token, max_body_bytes: int, name: str,
                 unix_path: Path | None = None, unix_mode: int = 0o660, workers: int = 16,
                 timeout_s: float = 10.0, idle_timeout_s: float = 60.0, max_connections: int = 1024,
                 title: str | None = None, description: str = "") -> None:
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
        served = with_openapi(router, lambda: self.app.openapi())
        self.limits = _Limits(name, served, token, self.counters, max_body_bytes, timeout_s, idle_timeout_s,
                              max_connections)
        self._threads = _Threads(workers, f"{name}-worker")
        self.app = build_app(self.limits, self._threads, title or name, description)
        """The FastAPI app (its ``openapi()`` is what ``GET /openapi.json`` answers)."""
        protocol = type("KvpoolH11Protocol", (_Protocol,), {"limits": self.limits})
        config = uvicorn.Config(_Guard(self.app, self.limits), http=protocol, lifespan="off", log_config=None,
                                access_log=False, proxy_headers=False, server_header=False, date_header=False,
                                h11_max_incomplete_event_size=2 * MAX_HEAD, timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the TCP server."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServer:
        """Serve: uvicorn's event loop in one thread, up to ``workers`` handler threads; returns self."""
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-io", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not self._server.started:
            raise RuntimeError(f"{self.name}: the HTTP server did not start")
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=self._listeners))
        except Exception:  # a bug here would silently stop the API: say so
            log.exception("%s: the HTTP server crashed", self.name)

    def stop(self, wait_s: float = 1.0) -> None:
        """Stop serving: close the listeners and every connection, remove the socket file.

        Handlers still running after ``wait_s`` finish on their own (their answers go nowhere).
        """
        self._server.config.timeout_graceful_shutdown = max(0.1, wait_s)  # type: ignore[assignment]
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10 + wait_s)
            self._thread = None
        self._threads.stop()
        for s in self._listeners:
            s.close()
        self._listeners.clear()
        if self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.unix_path.unlink()
