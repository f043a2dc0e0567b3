"""The one client of kvpool's APIs (``JsonClient``), on httpx, over loopback TCP or a Unix socket.

Every client in the project (``kvpool-ctl``, an agent's registration with the controller,
``AgentClient``, the controller's fill requests and hints, the experiments) talks through
``JsonClient``. Addresses are ``http://HOST:PORT`` or ``unix:/PATH``; ``check_url`` validates
one without connecting. A refusal raises ``ApiError`` (the server's status, code and one-line
message); no answer at all (refused, timed out, connection lost) raises
``ApiUnreachableError``. Connections are kept alive between calls (httpx's pool, safe to
share between threads) and expire before the servers' idle timeout.

Megabyte bodies skip h11's buffers (it copies every byte into and out of its receive buffer,
and httpcore once more): each connection is a ``_Stream``, which reads a response head
exactly to its end (peeking for it), so that an ``application/octet-stream`` answer's body is
still all in the socket when its head is parsed. ``JsonClient.request_with`` hands such a
body to the caller as a ``BodyReader`` whose every ``take`` is one ``recv`` of exactly that
many bytes (one copy, from the kernel), and every ``take_into`` one ``recv_into`` of the
caller's memory (``AgentClient.fetch_chunks_into``); that connection is then closed (h11 did
not see the body). Request bodies go out with ``sendall``, ``bytes`` parts without a copy.
"""

from __future__ import annotations

import contextlib
import functools
import json
import select
import socket
import ssl
import struct
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpcore
import httpx

from kvpool.http_api import BODY_METHODS, ApiError, ApiUnreachableError, Buffer

KEEPALIVE_S = 20.0
"""How long an idle pooled connection is reused (servers close theirs after 60 s by default)."""
READ_BYTES = 1 << 20
"""httpcore's read size over HTTP/1.1 (64 KiB by default) for the answers h11 reads (JSON, octet streams
under ``DIRECT_BODY``): per read, h11 copies and parses, so fewer, larger reads cost less."""

DIRECT_BODY = 256 << 10
"""An octet-stream answer at least this long is read past h11, straight into its buffer."""
T = TypeVar("T")

PEEK_BYTES = 64 << 10
"""Most bytes looked at (``MSG_PEEK``) per read of a response head, to find where it ends."""

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


class _Stream(httpcore.NetworkStream):
    """One connection: a response head is read exactly to its end; writes are ``sendall`` (no copies).

    ``at_body`` is True while the bytes after the last head read are all still in the socket:
    then ``read_body`` may take the body past h11.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.in_head = True  # the next bytes read belong to a response head
        self.at_body = False
        self._tail = b""  # the last bytes of the head read so far (its end may span two reads)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Bytes for h11; while in a head, never past its end."""
        self.at_body = False
        try:
            self.sock.settimeout(timeout)
            if not self.in_head:
                return self.sock.recv(max_bytes)
            peek = self.sock.recv(min(max_bytes, PEEK_BYTES), socket.MSG_PEEK)
            seen = self._tail + peek
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                data = self.sock.recv(len(peek))
                self._tail = (self._tail + data)[-3:]
                return data
            want = end + 4 - len(self._tail)
            data = self.sock.recv(want)  # peeked, so in the socket: one recv takes them all
            if len(data) == want:
                self.in_head, self.at_body, self._tail = False, True, b""
            else:
                self._tail = (self._tail + data)[-3:]
            return data
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Send it all; the next read starts a response head."""
        self.in_head, self.at_body, self._tail = True, False, b""
        if not buffer:
            return
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def get_extra_info(self, info: str) -> Any:
        """What httpcore asks of a connection: its socket, addresses, and whether it is readable (closed)."""
        if info == "socket":
            return self.sock
        if info == "client_addr":
            return self.sock.getsockname()
        if info == "server_addr":
            return self.sock.getpeername()
        if info == "is_readable":  # an idle pooled connection that is readable was closed by the server
            if self.sock.fileno() < 0:
                return True
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        return None


class BodyReader:
    """An answer's body, taken in order: ``take(n)`` is its next ``n`` bytes, each copied once;
    ``take_into(view)`` writes them into the caller's memory instead."""

    def __init__(self, length: int) -> None:
        self.left = length
        """Bytes not taken yet."""

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes; ``ValueError`` if fewer are left."""
        if not 0 <= n <= self.left:
            raise ValueError(f"the body has {self.left} more bytes, not {n}")
        self.left -= n
        return self._take(n)

    def take_into(self, out: memoryview) -> None:
        """The next ``len(out)`` bytes, written into ``out`` (a writable byte view) and nowhere else;
        ``ValueError`` if fewer are left. Past a failure, what ``out`` holds is undefined."""
        n = out.nbytes
        if not 0 <= n <= self.left:
            raise ValueError(f"the body has {self.left} more bytes, not {n}")
        self.left -= n
        self._take_into(out)

    def _take(self, n: int) -> bytes:
        raise NotImplementedError

    def _take_into(self, out: memoryview) -> None:
        out[:] = self._take(out.nbytes)


class PiecesReader(BodyReader):
    """A body that arrived in pieces (httpx's reads)."""

    def __init__(self, pieces: Sequence[Buffer]) -> None:
        self.pieces = [memoryview(p).cast("B") for p in pieces]
        super().__init__(sum(len(p) for p in self.pieces))
        self._i = 0
        self._off = 0

    def _take(self, n: int) -> bytes:
        out: list[memoryview] = []
        while n:
            piece = self.pieces[self._i]
            part = piece[self._off : self._off + n]
            out.append(part)
            n -= len(part)
            self._off += len(part)
            if self._off == len(piece):
                self._i += 1
                self._off = 0
        if len(out) == 1 and isinstance(out[0].obj, bytes) and out[0].nbytes == len(out[0].obj):
            return out[0].obj  # a whole piece, as it came
        return out[0].tobytes() if len(out) == 1 else b"".join(out)

    def _take_into(self, out: memoryview) -> None:
        at = 0
        while at < out.nbytes:  # each piece's part copied once, straight into out
            piece = self.pieces[self._i]
            part = piece[self._off : self._off + out.nbytes - at]
            out[at : at + len(part)] = part
            at += len(part)
            self._off += len(part)
            if self._off == len(piece):
                self._i += 1
                self._off = 0


class _SocketReader(BodyReader):
    """A body still in the socket: each take is a blocking ``recv(n, MSG_WAITALL)``, bounded by ``SO_RCVTIMEO``.

    The ``bytes`` that ``recv`` allocates are filled by the kernel and returned as they are: no
    buffer to zero or fault in first, no copy after (a 1 MiB take reuses the memory of freed ones).
    """

    def __init__(self, sock: socket.socket, length: int, timeout: float | None) -> None:
        super().__init__(length)
        self.sock = sock
        sock.settimeout(None)  # blocking: MSG_WAITALL waits for all n bytes (the connection closes after)
        if timeout is not None:
            sec = int(timeout)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                            struct.pack("@ll", sec, int((timeout - sec) * 1e6)))

    def _take(self, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            try:
                data = self.sock.recv(n - got, socket.MSG_WAITALL)
            except BlockingIOError:  # SO_RCVTIMEO passed without a byte
                raise TimeoutError("the answer's body stopped arriving") from None
            if not data:
                raise ConnectionError("the answer's body ended early")
            parts.append(data)
            got += len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _take_into(self, out: memoryview) -> None:
        got, n = 0, out.nbytes
        while got < n:  # the kernel writes into out[got:n] and no further
            try:
                step = self.sock.recv_into(out[got:], n - got, socket.MSG_WAITALL)
            except BlockingIOError:
                raise TimeoutError("the answer's body stopped arriving") from None
            if not step:
                raise ConnectionError("the answer's body ended early")
            got += step


class _Backend(httpcore.SyncBackend):
    """httpcore's own connects, each socket wrapped in a ``_Stream``."""

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        """A TCP connection (``TCP_NODELAY``, as httpcore sets)."""
        stream = super().connect_tcp(host, port, timeout, local_address, socket_options)
        return _Stream(stream.get_extra_info("socket"))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        """A Unix socket connection."""
        stream = super().connect_unix_socket(path, timeout, socket_options)
        return _Stream(stream.get_extra_info("socket"))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """A TLS context (the system's CAs, certificates checked), made once per process: no kvpool address uses TLS."""
    return ssl.create_default_context()


def _transport(uds: str | None) -> httpx.HTTPTransport:
    """httpx's transport over ``_Backend``'s connections (httpx has no argument for a backend: its pool is replaced)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=8, keepalive_expiry=KEEPALIVE_S)
    # Our addresses are plain HTTP (check_url), but a transport builds a TLS context all the same,
    # loading the CA bundle: about 30 ms per client here. One context, made once, serves them all.
    transport = httpx.HTTPTransport(uds=uds, retries=0, limits=limits, verify=_tls_context())
    if not isinstance(getattr(transport, "_pool", None), httpcore.ConnectionPool):
        return transport  # another httpx: its own connections (correct, only slower on megabyte answers)
    transport._pool = httpcore.ConnectionPool(
        max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry, uds=uds, retries=0, network_backend=_Backend())
    return transport


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
        self._http = httpx.Client(base_url=base, transport=_transport(uds), timeout=timeout, trust_env=False,
                                  headers={"Accept-Encoding": "identity"})

    def close(self) -> None:
        """Close the pooled connections; the client takes no requests after."""
        self._http.close()

    def request(self, method: str, path: str, body: Buffer | Sequence[Buffer] | None = None,
                headers: Mapping[str, str] | None = None) -> Reply:
        """One request; ``body`` may be several buffers, sent in order without joining them."""
        reply, data = self.request_with(method, path, lambda src: src.take(src.left), body, headers)
        return Reply(reply.status, reply.headers, data)

    def request_with(self, method: str, path: str, consume: Callable[[BodyReader], T],
                     body: Buffer | Sequence[Buffer] | None = None,
                     headers: Mapping[str, str] | None = None, *, direct: int = DIRECT_BODY) -> tuple[Reply, T]:
        """``request``, the successful answer's body handed to ``consume`` as a ``BodyReader``
        (``Reply.body`` empty): what ``consume`` returns.

        For megabyte answers that the caller splits anyway (a chunk bundle): each part is
        copied once, from the socket when the answer is an octet stream of at least ``direct``
        bytes, instead of through h11's buffers and one joined body (``BodyReader.take_into``
        writes it where the caller says). ``consume`` need not take every byte.
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
                stream = resp.extensions.get("network_stream")
                length = _direct_length(resp, direct)
                if length and isinstance(stream, _Stream) and stream.at_body:
                    # Straight from the socket; h11 never sees these bytes, so the connection closes after.
                    stream.at_body = False
                    result = consume(_SocketReader(stream.sock, length, self.timeout))
                else:
                    pieces = [p for p in resp.iter_raw() if p]
                    if resp.status_code < 400:
                        result = consume(PiecesReader(pieces))
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
        return Reply(resp.status_code, resp.headers, b""), result

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


def _direct_length(resp: httpx.Response, least: int = DIRECT_BODY) -> int:
    """The body length of a successful octet-stream answer of at least ``least`` bytes (read past h11), else 0."""
    if resp.status_code >= 400 or resp.headers.get("content-type") != "application/octet-stream":
        return 0
    text = resp.headers.get("content-length", "")
    return int(text) if text.isdigit() and int(text) >= max(1, least) else 0


def _stream(parts: Sequence[Buffer]) -> Iterator[bytes]:
    """The body's buffers as ``bytes`` (with the Content-Length set, httpx sends each as it is).

    A ``bytes`` object, or a view of a whole one, goes as it is; h11 passes a lone ``bytes``
    through and ``_Stream.write`` sends it with no copy. Other buffers are copied once.
    """
    for p in parts:
        if isinstance(p, memoryview) and isinstance(p.obj, bytes) and p.nbytes == len(p.obj):
            p = p.obj
        yield p if isinstance(p, bytes) else memoryview(p).cast("B").tobytes()
