"""The agent's local API: HTTP/1.1 + JSON on loopback, chunk bodies as application/octet-stream.

An inference engine on the same host talks to its agent through this API (or through
``hostagent.client.AgentClient``, which wraps it).  Keys are 64-bit chunk keys written
as hex strings (``"0x1f..."`` or bare hex): JSON numbers lose precision past 2**53.

The endpoints, their bodies and answers, the chunk bundle and the error codes:
docs/design/notes-agent-api.md; ``GET /metrics`` answers the same counters as ``/v1/stats`` in
Prometheus' text format (docs/reference/metrics.md). Every call but ``GET`` needs the operator's token
(``Authorization: Bearer``, ``kvpool.auth``); bodies are limited to one largest chunk
(``MAX_BODY``); the server and the body policy are ``kvpool.http_server``'s.

The API depends only on ``AgentService`` (below), the few operations it serves;
``hostagent.daemon.Agent`` implements it and starts the server.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from hostagent import api_models as m
from hostagent import metrics
from hostagent.chunking import chunk_keys
from hostagent.tiers import Blob
from hostagent.timing import FetchTiming, summarize
from hostagent.transport import Address, ChunkIntegrityError, parse_address
from kvpool import wire
from kvpool.auth import Token
from kvpool.hints import HintError, Hints
from kvpool.hints import parse as parse_hints
from kvpool.http_api import OCTETS, TEXT, ApiError, Doc, Request, Response, Router
from kvpool.http_client import BodyReader, PiecesReader
from kvpool.http_server import ApiServer
from kvpool.metrics import exposition, registry

BUNDLE_COUNT: Final = struct.Struct("<Q")
BUNDLE_ENTRY: Final = struct.Struct("<QQ")
MAX_BUNDLE_CHUNKS: Final = 1 << 20
MAX_LOOKUP_KEYS: Final = 1 << 16
"""Keys one ``/v1/lookup`` may name: a registered agent asks its directory about them."""
TITLE: Final = "kvpool agent API"
DESCRIPTION: Final = ("An inference engine's local API to its kvpool host agent: publish, fetch and look up "
                      "KV-cache chunks. Chunk bundles: u64 n, n x (u64 key, u64 length), then the chunks "
                      "(little-endian). Every call but GET needs the operator's token. docs/design/notes-agent-api.md")
CHUNK_ALIGN: Final = 64
"""``split_bundle_into`` starts each chunk at an address that is a multiple of this (a cache line, more
than any dtype needs): a blob's header is padded to 16 bytes, so its payload stays aligned too."""
MAX_BODY: Final = wire.MAX_CHUNK_LEN + BUNDLE_COUNT.size + BUNDLE_ENTRY.size
"""Default body limit: the largest chunk, alone in a bundle (larger publishes are split by the client)."""


class AgentService(Protocol):
    """What the API serves: the agent's operations (``hostagent.daemon.Agent`` implements them)."""

    @property
    def fetch_timeout_s(self) -> float:
        """Deadline of a fetch that names none."""

    def ready_info(self) -> dict[str, Any]:
        """Identity and addresses (``/v1/health``)."""

    def stats(self) -> dict[str, Any]:
        """Every counter (``/v1/stats``)."""

    def publish(self, key: int, data: bytes | memoryview, generation: int = 0) -> str:
        """Store a serialized chunk; the tier it landed in (``ValueError`` when refused)."""

    def chunk(self, key: int) -> Blob | None:
        """A chunk from the local tiers, None when not held."""

    def forget(self, key: int) -> bool:
        """Drop a chunk from the local tiers; True if it was held."""

    def fetch_prefix(self, keys: list[int], holder: Address | None, *, generation: int = 0,
                     timeout: float | None = None, local: bool = True,
                     timings: list[FetchTiming] | None = None) -> tuple[list[Blob], str | None]:
        """The longest prefix of ``keys`` available locally or from ``holder``, and why it stopped;
        each fetched chunk's ``FetchTiming`` appended to ``timings``."""

    def lookup(self, keys: list[int]) -> tuple[int, int]:
        """Lengths of the prefix of ``keys`` held locally, and held locally or known to the directory."""

    def push(self, keys: Sequence[int], to: Address) -> list[int]:
        """Send the held chunks of ``keys`` to ``to`` unasked; the keys that were held."""

    def set_hints(self, hints: Hints) -> int:
        """Replace the fabric's hints; the number of chunks named."""


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


def _bundle_index(src: BodyReader) -> list[tuple[int, int]]:
    """The ``(key, length)`` entries of a bundle read in order, checked against the body's length."""
    (n,) = BUNDLE_COUNT.unpack(src.take(BUNDLE_COUNT.size))
    if n > MAX_BUNDLE_CHUNKS or n * BUNDLE_ENTRY.size > src.left:
        raise ValueError(f"bundle claims {n} chunks, its {src.left + BUNDLE_COUNT.size} bytes cannot hold their index")
    index = src.take(n * BUNDLE_ENTRY.size)
    entries = [BUNDLE_ENTRY.unpack_from(index, i * BUNDLE_ENTRY.size) for i in range(n)]
    if sum(length for _, length in entries) != src.left:
        raise ValueError(f"bundle index lists {sum(length for _, length in entries)} chunk bytes, the body has "
                         f"{src.left}")
    return entries


def split_bundle(src: BodyReader | Sequence[bytes | memoryview]) -> tuple[list[int], list[bytes]]:
    """``unpack_bundle`` of a body read in order (``kvpool.http_client.BodyReader``) or still in the
    pieces it arrived in; each chunk copied once, as bytes."""
    if not isinstance(src, BodyReader):
        src = PiecesReader(src)
    entries = _bundle_index(src)
    return [key for key, _ in entries], [src.take(length) for _, length in entries]


class BufferTooSmallError(ValueError):
    """The caller's buffer cannot hold an answer's chunks; nothing was written into it."""

    def __init__(self, needed: int, size: int) -> None:
        super().__init__(f"the answer's chunks need a buffer of {needed} bytes here, this one holds {size} "
                         f"(hostagent.api.bundle_space gives enough wherever a buffer starts)")
        self.needed = needed
        """Bytes this buffer would have needed (where it starts decides the padding)."""
        self.size = size


def _align_up(addr: int) -> int:
    return -(-addr // CHUNK_ALIGN) * CHUNK_ALIGN


def bundle_space(lengths: Sequence[int]) -> int:
    """Bytes a buffer needs so that ``split_bundle_into`` can place chunks of these lengths in it,
    wherever the buffer starts (each chunk at a ``CHUNK_ALIGN`` boundary)."""
    if not lengths:
        return 0
    return CHUNK_ALIGN - 1 + sum(_align_up(n) for n in lengths[:-1]) + lengths[-1]


def split_bundle_into(src: BodyReader, out: memoryview) -> tuple[list[int], list[memoryview]]:
    """A bundle read in order, each chunk written once straight into ``out`` (a writable byte view):
    its keys and a view of ``out`` per chunk, each starting at an address that is a multiple of
    ``CHUNK_ALIGN``.

    The index is read and checked first: a bundle that does not fit raises
    ``BufferTooSmallError`` before a byte is written, and no write ever goes past ``out``. Other
    failures (``ValueError`` for a malformed bundle, ``OSError`` for a body cut short) leave
    ``out``'s content undefined and return nothing.
    """
    if out.readonly or out.ndim != 1 or out.itemsize != 1:
        raise ValueError("the buffer must be a writable, flat byte view")
    entries = _bundle_index(src)
    base = int(np.frombuffer(out, dtype=np.uint8).ctypes.data)
    offsets: list[int] = []
    end = 0
    for _, length in entries:
        offsets.append(_align_up(base + end) - base)
        end = offsets[-1] + length
    if end > out.nbytes:
        raise BufferTooSmallError(end, out.nbytes)
    views = [out[off : off + length] for off, (_, length) in zip(offsets, entries, strict=True)]
    for view in views:
        src.take_into(view)
    return [key for key, _ in entries], views


def parse_key(text: str) -> int:
    """A chunk key from hex text (``0x`` optional); ``ValueError`` if not a 64-bit hex number."""
    digits = text[2:] if text.lower().startswith("0x") else text
    if not 0 < len(digits) <= 16 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise ValueError(f"chunk key must be 1-16 hex digits, got {text[:40]!r}")
    return int(digits, 16)


def format_key(key: int) -> str:
    """The canonical hex text of a chunk key."""
    return f"{key:#018x}"


def make_server(agent: AgentService, host: str, port: int, unix_path: Path | None, token: Token, *,
                max_body_bytes: int = MAX_BODY, workers: int = 64, timeout_s: float = 10.0) -> ApiServer:
    """The agent's API bound on ``host:port`` (and ``unix_path``), not yet serving: call ``start``."""
    return ApiServer(AgentApi(agent).router(), host, port, token=token, unix_path=unix_path,
                     max_body_bytes=max_body_bytes, workers=workers, timeout_s=timeout_s, name="kvpool-agent",
                     title=TITLE, description=DESCRIPTION)


class AgentApi:
    """The endpoints (see the module docstring) over one ``AgentService``."""

    def __init__(self, agent: AgentService) -> None:
        self.agent = agent
        #: this agent's own Prometheus registry: its stats, read at scrape time (``hostagent.metrics``)
        self.registry = registry(metrics.collector(agent.stats))

    def router(self) -> Router:
        """Every endpoint, routed."""
        r = Router()
        r.add("GET", "/v1/health", lambda _req: Response.json({"ok": True, **self.agent.ready_info()}),
              doc=Doc("Alive, and where it listens", answer=m.Health))
        r.add("GET", "/v1/stats", lambda _req: Response.json(self.agent.stats()),
              doc=Doc("Every counter", answer=m.Stats))
        r.add("GET", "/metrics", self.metrics, doc=Doc(answer=TEXT))  # a read, open as /v1/stats is
        generation = {"generation": "the chunk's generation (0..2**32-1, default 0)"}
        r.add("PUT", "/v1/chunks/{key}", self.put_chunk, doc=Doc(body=OCTETS, answer=m.PutAnswer, query=generation))
        r.add("GET", "/v1/chunks/{key}", self.get_chunk, doc=Doc(answer=OCTETS))
        r.add("DELETE", "/v1/chunks/{key}", self.delete_chunk, doc=Doc(answer=m.DeleteAnswer))
        r.add("POST", "/v1/publish", self.publish, doc=Doc(
            body=OCTETS, answer=m.PublishAnswer, headers={"X-Kvpool-Generation": "the chunks' generation (default 0)"}))
        r.add("POST", "/v1/fetch", lambda req: self.fetch(req, bundle=True), doc=Doc(
            "The longest available prefix of the chunks, as a chunk bundle", body=m.FetchRequest, answer=OCTETS,
            answer_headers={"X-Kvpool-Found": "chunks in the bundle", "X-Kvpool-Requested": "chunks asked for",
                            "X-Kvpool-Seconds": "the fetch's time", "X-Kvpool-Timing": "where it went (JSON)",
                            "X-Kvpool-Stopped": "why the prefix stopped short (absent when every chunk came)"}))
        r.add("POST", "/v1/prefetch", lambda req: self.fetch(req, bundle=False), doc=Doc(
            "Fetch the longest available prefix into the local tiers; a summary back", body=m.FetchRequest,
            answer=m.PrefetchAnswer))
        r.add("POST", "/v1/lookup", self.lookup, doc=Doc(body=m.KeySpec, answer=m.LookupAnswer))
        r.add("POST", "/v1/push", self.push, doc=Doc(body=m.PushRequest, answer=m.PushAnswer))
        r.add("POST", "/v1/hints", self.hints, doc=Doc(body=m.HintsRequest, answer=m.HintsAnswer))
        return r

    def metrics(self, req: Request) -> Response:
        """``GET /metrics``: the stats in Prometheus' text format (``hostagent.metrics``)."""
        body, content_type = exposition(self.registry, req.header("Accept"))
        return Response(HTTPStatus.OK, [body], content_type)

    def put_chunk(self, req: Request) -> Response:
        """``PUT /v1/chunks/<key>``: publish one chunk."""
        key = _key_arg(req.params["key"])
        generation = _int_arg(req.arg("generation", "0"), "generation", 0xFFFF_FFFF)
        body = req.body()
        try:
            tier = self.agent.publish(key, body, generation)
        except ValueError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_chunk", str(exc)) from None
        return Response.json({"key": format_key(key), "bytes": len(body), "tier": tier})

    def get_chunk(self, req: Request) -> Response:
        """``GET /v1/chunks/<key>``: the chunk's bytes."""
        key = _key_arg(req.params["key"])
        blob = self.agent.chunk(key)
        if blob is None:
            raise ApiError(HTTPStatus.NOT_FOUND, "chunk_not_found", f"chunk {format_key(key)} is not held here")
        return Response.octets([blob])

    def delete_chunk(self, req: Request) -> Response:
        """``DELETE /v1/chunks/<key>``: forget it."""
        return Response.json({"deleted": self.agent.forget(_key_arg(req.params["key"]))})

    def publish(self, req: Request) -> Response:
        """``POST /v1/publish``: a bundle of chunks."""
        generation = _int_arg(req.header("X-Kvpool-Generation", "0"), "X-Kvpool-Generation", 0xFFFF_FFFF)
        try:
            keys, blobs = unpack_bundle(req.body())
        except ValueError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_bundle", str(exc)) from None
        for i, blob in enumerate(blobs):
            if not 0 < len(blob) <= wire.MAX_CHUNK_LEN:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_chunk",
                               f"chunk {i} ({format_key(keys[i])}) has {len(blob)} bytes, "
                               f"allowed 1..{wire.MAX_CHUNK_LEN}")
        for key, blob in zip(keys, blobs, strict=True):
            try:
                self.agent.publish(key, blob, generation)
            except ValueError as exc:
                raise ApiError(HTTPStatus.BAD_REQUEST, "bad_chunk", str(exc)) from None
        return Response.json({"published": len(keys), "bytes": sum(len(b) for b in blobs)})

    def fetch(self, req: Request, *, bundle: bool) -> Response:
        """``POST /v1/fetch`` (a bundle back) and ``/v1/prefetch`` (a JSON summary back)."""
        doc = req.json()
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
        timeout = doc.get("timeout", self.agent.fetch_timeout_s)
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
        timings: list[FetchTiming] = []
        try:
            blobs, stopped = self.agent.fetch_prefix(keys, holder, generation=generation, timeout=float(timeout),
                                                     local=local, timings=timings)
        except ChunkIntegrityError as exc:
            raise ApiError(HTTPStatus.BAD_GATEWAY, "integrity", str(exc)) from None
        seconds = time.perf_counter() - t0
        timing = summarize(timings)
        if not bundle:
            return Response.json({"found": len(blobs), "requested": len(keys), "bytes": sum(len(b) for b in blobs),
                                  "seconds": seconds, "stopped": stopped, "timing": timing})
        headers = {"X-Kvpool-Found": str(len(blobs)), "X-Kvpool-Requested": str(len(keys)),
                   "X-Kvpool-Seconds": f"{seconds:.6f}", "X-Kvpool-Timing": json.dumps(timing, separators=(",", ":"))}
        if stopped:
            headers["X-Kvpool-Stopped"] = " ".join(stopped.split())[:400]
        return Response.octets(pack_bundle(keys[: len(blobs)], blobs), headers)

    def lookup(self, req: Request) -> Response:
        """``POST /v1/lookup``: how many leading chunks could be had, no bytes moved."""
        keys = _keys_from(req.json())
        if len(keys) > MAX_LOOKUP_KEYS:
            raise ApiError(HTTPStatus.BAD_REQUEST, "too_many_keys",
                           f"a lookup names at most {MAX_LOOKUP_KEYS} keys, got {len(keys)}")
        local, available = self.agent.lookup(keys)
        return Response.json({"requested": len(keys), "local": local, "available": available})

    def push(self, req: Request) -> Response:
        """``POST /v1/push``: send held chunks to an address unasked."""
        doc = req.json()
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
        held = set(self.agent.push(keys, (host, port)))
        return Response.json({"pushed": len(held), "missing": [format_key(k) for k in keys if k not in held]})


    def hints(self, req: Request) -> Response:
        """``POST /v1/hints``: replace the fabric's hints."""
        try:
            hints = parse_hints(req.json())
        except HintError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_hints", str(exc)) from None
        return Response.json({"chunks": self.agent.set_hints(hints)})


def _key_arg(text: str) -> int:
    try:
        return parse_key(text)
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
