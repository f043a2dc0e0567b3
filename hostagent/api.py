"""The agent's local API: HTTP/1.1 + JSON on loopback, chunk bodies as application/octet-stream.

An inference engine on the same host talks to its agent through this API (or through
``hostagent.client.AgentClient``, which wraps it).  Keys are 64-bit chunk keys written
as hex strings (``"0x1f..."`` or bare hex): JSON numbers lose precision past 2**53.

Endpoints:

``GET /v1/health``
    ``{"ok": true, "pid", "udp": [host, port], "api_url", "tiers"}``.
``GET /v1/stats``
    Agent, tier, transport (drops by reason) and API (errors by reason) counters.
``PUT /v1/chunks/<key>?generation=N``
    Body: one serialized chunk.  Stores it in the local tiers (publish one chunk).
``GET /v1/chunks/<key>``
    The chunk's bytes from the local tiers, or 404.
``DELETE /v1/chunks/<key>``
    Forget a chunk: ``{"deleted": bool}``.
``POST /v1/publish``
    Body: a *chunk bundle* (below).  Publishes every chunk (a prefix): ``{"published": n,
    "bytes": total}``.  Header ``X-Kvpool-Generation`` sets their generation.
``POST /v1/fetch``
    JSON ``{"keys": [hex, ...]}`` or ``{"model_id", "token_ids", "block_size"}`` (the
    agent computes the keys of every full block), plus optional ``"holder": "host:port"``
    (the peer agent's kvpool UDP address), ``"timeout"`` (s) and ``"generation"``.
    Answers a chunk bundle with the longest prefix found locally or at the holder;
    ``X-Kvpool-Found`` / ``X-Kvpool-Requested`` count chunks and ``X-Kvpool-Stopped``
    says why it stopped early.
    ``"local": false`` bypasses the local tiers: nothing is answered from them and
    nothing fetched is kept (for experiments that measure every transfer).
``POST /v1/push``
    JSON ``{"keys": [hex, ...], "to": "ip:port"}``: send every fragment of each chunk held
    here to ``to``, unasked.  A holder fills switch pools this way (the controller names
    its fill sink as ``to``).  Answers ``{"pushed": n, "missing": [hex, ...]}``.
``POST /v1/prefetch``
    Same arguments; fetches into the local tiers and answers JSON ``{"found",
    "requested", "bytes", "seconds", "stopped"}`` (no chunk bytes cross the API).

Chunk bundle (``application/octet-stream``, little-endian): ``u64 n``, then ``n`` pairs
``u64 key, u64 length``, then the ``n`` chunks back to back.

Bad arguments get ``400`` (``404`` unknown path, ``405`` wrong method, ``413`` body too
large) with a one-line JSON body ``{"error": "..."}`` and are counted in
``stats()["api"]["errors"]`` by reason.  Bind it to loopback: it has no authentication.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, cast

from hostagent.chunking import chunk_keys
from hostagent.daemon import parse_address
from kvpool import wire

if TYPE_CHECKING:
    from hostagent.daemon import Agent

log = logging.getLogger("kvpool.api")

BUNDLE_COUNT: Final = struct.Struct("<Q")
BUNDLE_ENTRY: Final = struct.Struct("<QQ")
MAX_BUNDLE_CHUNKS: Final = 1 << 20


class ApiError(Exception):
    """A request the API refuses: HTTP status, counter reason and one-line message."""

    def __init__(self, status: HTTPStatus, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def pack_bundle(keys: Sequence[int], blobs: Sequence[bytes | bytearray | memoryview]) -> list[bytes | memoryview]:
    """A chunk bundle as a list of buffers (header first), ready to write without joining."""
    if len(keys) != len(blobs):
        raise ValueError(f"{len(keys)} keys but {len(blobs)} chunks")
    head = bytearray(BUNDLE_COUNT.pack(len(keys)))
    for key, blob in zip(keys, blobs, strict=True):
        head += BUNDLE_ENTRY.pack(key, len(blob))
    return [bytes(head), *(memoryview(b) for b in blobs)]


def unpack_bundle(body: bytes | memoryview) -> tuple[list[int], list[memoryview]]:
    """Keys and chunk views of a bundle; ``ValueError`` with a one-line reason if malformed."""
    view = memoryview(body)
    if len(view) < BUNDLE_COUNT.size:
        raise ValueError(f"bundle of {len(view)} bytes has no chunk count")
    (n,) = BUNDLE_COUNT.unpack_from(view)
    off = BUNDLE_COUNT.size
    if n > MAX_BUNDLE_CHUNKS or off + n * BUNDLE_ENTRY.size > len(view):
        raise ValueError(f"bundle claims {n} chunks, its {len(view)} bytes cannot hold their index")
    keys: list[int] = []
    lengths: list[int] = []
    for _ in range(n):
        key, length = BUNDLE_ENTRY.unpack_from(view, off)
        keys.append(key)
        lengths.append(length)
        off += BUNDLE_ENTRY.size
    if off + sum(lengths) != len(view):
        raise ValueError(f"bundle index lists {sum(lengths)} chunk bytes, the body has {len(view) - off}")
    blobs: list[memoryview] = []
    for length in lengths:
        blobs.append(view[off : off + length])
        off += length
    return keys, blobs


def parse_key(text: str) -> int:
    """A chunk key from hex text (``0x`` optional); ``ValueError`` if not a 64-bit hex number."""
    digits = text[2:] if text.lower().startswith("0x") else text
    if not 0 < len(digits) <= 16 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise ValueError(f"chunk key must be 1-16 hex digits, got {text[:40]!r}")
    return int(digits, 16)


def format_key(key: int) -> str:
    """The canonical hex text of a chunk key."""
    return f"{key:#018x}"


class ApiCounters:
    """Requests served and errors by reason (thread-safe: the server is threaded)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.errors: dict[str, int] = {}

    def ok(self) -> None:
        """Count one request."""
        with self._lock:
            self.requests += 1

    def error(self, reason: str) -> None:
        """Count one refused request under ``reason``."""
        with self._lock:
            self.requests += 1
            self.errors[reason] = self.errors.get(reason, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """A copy of the counters."""
        with self._lock:
            return {"requests": self.requests, "errors": dict(self.errors), "errors_total": sum(self.errors.values())}


class AgentHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server that knows its agent and counts requests."""

    daemon_threads = True
    # Python's default of 5 refuses connections when many engine threads call at once.
    request_queue_size = 64

    def __init__(self, agent: Agent, address: tuple[str, int]) -> None:
        self.agent = agent
        self.counters = ApiCounters()
        super().__init__(address, _Handler)


def make_server(agent: Agent, host: str, port: int) -> AgentHTTPServer:
    """Bind the API server (not yet serving: call ``serve_forever``)."""
    return AgentHTTPServer(agent, (host, port))


class AgentUnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The same API on a Unix socket, for callers in other network namespaces."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, agent: Agent, path: str) -> None:
        self.agent = agent
        self.counters = ApiCounters()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket file left by a killed agent would make bind fail
        super().__init__(path, _UnixHandler)


def make_unix_server(agent: Agent, path: str) -> AgentHTTPServer:
    """Bind the API on a Unix socket (not yet serving: call ``serve_forever``)."""
    return cast(AgentHTTPServer, AgentUnixHTTPServer(agent, path))


class _Handler(BaseHTTPRequestHandler):
    server: AgentHTTPServer
    _body_read = False
    protocol_version = "HTTP/1.1"
    server_version = "kvpool-agent/0.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Access log to the ``kvpool.api`` logger at DEBUG instead of stderr."""
        log.debug("%s " + format, self.address_string(), *args)

    # ------------------------------------------------------------------ plumbing

    def _dispatch(self, method: str) -> None:
        counters = self.server.counters
        self._body_read = False
        try:
            url = urllib.parse.urlsplit(self.path)
            self._route(method, url.path, urllib.parse.parse_qs(url.query))
            counters.ok()
        except ApiError as err:
            counters.error(err.reason)
            self._drain_body()
            self._send_json({"error": err.message}, err.status)
        except (BrokenPipeError, ConnectionResetError):
            counters.error("client_gone")

    def do_GET(self) -> None:
        """GET endpoints."""
        self._dispatch("GET")

    def do_PUT(self) -> None:
        """PUT endpoints."""
        self._dispatch("PUT")

    def do_POST(self) -> None:
        """POST endpoints."""
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        """DELETE endpoints."""
        self._dispatch("DELETE")

    def _drain_body(self) -> None:
        # Unread body bytes would be parsed as the next request on this keep-alive connection.
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= self.server.agent.config.max_body_bytes:
            if not self._body_read:
                self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise ApiError(HTTPStatus.LENGTH_REQUIRED, "no_length", "request needs a Content-Length header")
        n = int(length)
        if n > self.server.agent.config.max_body_bytes:
            raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body_too_large",
                           f"body of {n} bytes exceeds max_body_bytes {self.server.agent.config.max_body_bytes}")
        body = self.rfile.read(n)
        self._body_read = True
        if len(body) != n:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_body", f"body ended after {len(body)} of {n} bytes")
        return body

    def _json_body(self) -> dict[str, Any]:
        try:
            doc = json.loads(self._body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", f"body is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_json", "body must be a JSON object")
        return doc

    def _send_json(self, doc: dict[str, Any], status: HTTPStatus = HTTPStatus.OK) -> None:
        body = (json.dumps(doc) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:  # e.g. an unread oversize body: tell the client not to reuse us
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _send_bundle(self, keys: Sequence[int], blobs: Sequence[bytes | memoryview], headers: dict[str, str]) -> None:
        parts = pack_bundle(keys, blobs)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(sum(len(p) for p in parts)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        for p in parts:
            self.wfile.write(p)

    # ------------------------------------------------------------------ routes

    def _route(self, method: str, path: str, query: dict[str, list[str]]) -> None:
        agent = self.server.agent
        if path.startswith("/v1/chunks/"):
            self._chunk(method, path[len("/v1/chunks/"):], query)
            return
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", "/v1/health"): lambda: self._send_json({"ok": True, **agent.ready_info()}),
            ("GET", "/v1/stats"): lambda: self._send_json(agent.stats()),
            ("POST", "/v1/publish"): self._publish,
            ("POST", "/v1/fetch"): lambda: self._fetch(bundle=True),
            ("POST", "/v1/prefetch"): lambda: self._fetch(bundle=False),
            ("POST", "/v1/push"): self._push,
        }
        handler = routes.get((method, path))
        if handler is None:
            if any(p == path for _, p in routes):
                raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, "bad_method", f"{method} not allowed on {path}")
            raise ApiError(HTTPStatus.NOT_FOUND, "unknown_path", f"no endpoint {path[:80]!r}; see hostagent/api.py")
        handler()

    def _chunk(self, method: str, key_text: str, query: dict[str, list[str]]) -> None:
        agent = self.server.agent
        key = _key_arg(key_text)
        if method == "PUT":
            generation = _int_arg(query.get("generation", ["0"])[-1], "generation", 0xFFFF_FFFF)
            body = self._body()
            try:
                tier = agent.publish(key, body, generation)
            except ValueError as exc:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_chunk", str(exc)) from None
            self._send_json({"key": format_key(key), "bytes": len(body), "tier": tier})
        elif method == "GET":
            blob = agent.store.get(key)
            if blob is None:
                raise ApiError(HTTPStatus.NOT_FOUND, "chunk_not_found", f"chunk {format_key(key)} is not held here")
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(blob)))
            self.end_headers()
            self.wfile.write(blob)
        elif method == "DELETE":
            self._send_json({"deleted": agent.store.delete(key)})
        else:
            raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, "bad_method", f"{method} not allowed on /v1/chunks/<key>")

    def _publish(self) -> None:
        agent = self.server.agent
        generation = _int_arg(self.headers.get("X-Kvpool-Generation", "0"), "X-Kvpool-Generation", 0xFFFF_FFFF)
        try:
            keys, blobs = unpack_bundle(self._body())
        except ValueError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_bundle", str(exc)) from None
        for i, blob in enumerate(blobs):
            if not 0 < len(blob) <= wire.MAX_CHUNK_LEN:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_chunk",
                               f"chunk {i} ({format_key(keys[i])}) has {len(blob)} bytes, "
                               f"allowed 1..{wire.MAX_CHUNK_LEN}")
        for key, blob in zip(keys, blobs, strict=True):
            try:
                agent.publish(key, blob, generation)
            except ValueError as exc:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_chunk", str(exc)) from None
        self._send_json({"published": len(keys), "bytes": sum(len(b) for b in blobs)})

    def _fetch(self, *, bundle: bool) -> None:
        agent = self.server.agent
        doc = self._json_body()
        keys = _keys_from(doc)
        holder = None
        if doc.get("holder") is not None:
            if not isinstance(doc["holder"], str):
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_holder", "holder must be a \"host:port\" string")
            try:
                host, port = parse_address(doc["holder"])
                # Resolve once here: a name that does not resolve is the caller's error, not a
                # transfer that times out seconds later.
                holder = (str(socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]), port)
            except ValueError as exc:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_holder", str(exc)) from None
            except OSError as exc:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_holder",
                               f"cannot resolve holder host {host[:80]!r}: {exc}") from None
        timeout = doc.get("timeout", agent.config.fetch_timeout_s)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field", f"timeout must be a number of seconds in (0, 3600], "
                                                                f"got {timeout!r}")
        generation = doc.get("generation", 0)
        if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation <= 0xFFFF_FFFF:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field",
                           f"generation must be a 32-bit integer, got {generation!r}")
        local = doc.get("local", True)
        if not isinstance(local, bool):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field", f"local must be true or false, got {local!r}")
        t0 = time.perf_counter()
        blobs, stopped = agent.fetch_prefix(keys, holder, generation=generation, timeout=float(timeout), local=local)
        seconds = time.perf_counter() - t0
        if bundle:
            headers = {"X-Kvpool-Found": str(len(blobs)), "X-Kvpool-Requested": str(len(keys)),
                       "X-Kvpool-Seconds": f"{seconds:.6f}"}
            if stopped:
                headers["X-Kvpool-Stopped"] = " ".join(stopped.split())[:400]
            self._send_bundle(keys[: len(blobs)], blobs, headers)
        else:
            self._send_json({"found": len(blobs), "requested": len(keys), "bytes": sum(len(b) for b in blobs),
                             "seconds": seconds, "stopped": stopped})

    def _push(self) -> None:
        agent = self.server.agent
        doc = self._json_body()
        keys = _keys_from(doc)
        to = doc.get("to")
        if not isinstance(to, str):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field", "to must be a \"host:port\" string")
        try:
            host, port = parse_address(to)
            socket.inet_aton(host)
        except (ValueError, OSError):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field",
                           f"to must be an IPv4 host:port, got {to[:80]!r}") from None
        held = [k for k in keys if agent.store.get(k) is not None]
        agent.transport.push(held, (host, port))
        self._send_json({"pushed": len(held), "missing": [format_key(k) for k in keys if k not in set(held)]})


class _UnixHandler(_Handler):
    """``_Handler`` for a Unix socket, whose peers have no address."""

    def address_string(self) -> str:
        """Unix socket peers have no address: name the transport in the access log."""
        return "unix"


def _key_arg(text: str) -> int:
    try:
        return parse_key(urllib.parse.unquote(text))
    except ValueError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_key", str(exc)) from None


def _int_arg(text: str, name: str, maximum: int) -> int:
    if not text.isdigit() or int(text) > maximum:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field",
                       f"{name} must be an integer in 0..{maximum}, got {text[:40]!r}")
    return int(text)


def _keys_from(doc: dict[str, Any]) -> list[int]:
    """The chunk keys a fetch asks for: listed, or computed from the prompt's tokens."""
    if "keys" in doc:
        raw = doc["keys"]
        if not isinstance(raw, list) or not all(isinstance(k, str) for k in raw):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_key",
                           "keys must be a list of hex strings (64-bit keys do not survive JSON numbers)")
        return [_key_arg(k) for k in raw]
    missing = [f for f in ("model_id", "token_ids", "block_size") if f not in doc]
    if missing:
        raise ApiError(HTTPStatus.BAD_REQUEST, "missing_field",
                       f"give either keys or model_id, token_ids and block_size (missing {', '.join(missing)})")
    model_id, tokens, block = doc["model_id"], doc["token_ids"], doc["block_size"]
    if not isinstance(model_id, str) or not model_id:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field", "model_id must be a non-empty string")
    if isinstance(block, bool) or not isinstance(block, int) or not 0 < block <= 1 << 20:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field", f"block_size must be a positive integer, got {block!r}")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field", "token_ids must be a list of integers")
    try:
        return chunk_keys(model_id, tokens, block)
    except (ValueError, OverflowError) as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_field", f"token_ids: {exc}") from None
