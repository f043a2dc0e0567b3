"""Client library for an inference engine: publish and fetch prompt-prefix KV through the local agent.

``AgentClient(url)`` speaks the HTTP API of ``hostagent.api``.  It turns a prompt's KV
(a transformers ``DynamicCache``, a sequence of per-layer ``(k, v)`` pairs, or chunk
tensors ``[n, layers, 2, kv_heads, block, head_dim]``) into one serialized chunk per full
block of ``block_size`` tokens, keyed by the hash chain of ``hostagent.chunking``, and
back::

    client = AgentClient("http://127.0.0.1:7471")
    client.publish_prefix("llama-tiny", token_ids, past_key_values, block_size=16)
    # on another node, through its own agent:
    prefix = client.fetch_prefix("llama-tiny", token_ids, block_size=16, holder="10.0.0.1:7470")
    cache = prefix.to_cache()            # DynamicCache of prefix.num_tokens tokens

A refusal raises ``kvpool.http_api.ApiError`` (HTTP ``status``, ``code``, one-line
message); an agent that does not answer raises its subclass ``ApiUnreachableError``.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from hostagent.api import (
    BUNDLE_COUNT,
    BUNDLE_ENTRY,
    CHUNK_ALIGN,
    MAX_BODY,
    BufferTooSmallError,
    bundle_space,
    format_key,
    pack_bundle,
    split_bundle,
    split_bundle_into,
)
from hostagent.chunking import TokenIds, chunk_keys
from hostagent.layouts import chunks_from_hf, hf_cache_from_chunks
from hostagent.serialize import Quant, deserialize, serialize, tensor_bytes
from kvpool import auth
from kvpool.http_api import ApiError
from kvpool.http_client import DIRECT_BODY, BodyReader, JsonClient, Reply

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FetchedPrefix:
    """The longest prefix of a prompt's chunks that could be fetched."""

    keys: list[int]
    chunks: torch.Tensor | None
    """``[n, layers, 2, kv_heads, block, head_dim]``, or None when nothing was found."""
    block_size: int
    requested: int
    stopped: str | None
    """Why fewer than ``requested`` chunks came back (None when all did)."""

    @property
    def num_tokens(self) -> int:
        """Tokens of KV the prefix covers (the engine prefills only the rest)."""
        return len(self.keys) * self.block_size

    def to_cache(self, config: Any = None, device: torch.device | str | None = None) -> Any:
        """A transformers ``DynamicCache`` holding the fetched prefix."""
        if self.chunks is None:
            raise ValueError(f"no chunk of the prefix was found ({self.stopped})")
        return hf_cache_from_chunks(self.chunks, config=config, device=device)


class AgentClient:
    """Talks to one agent's local HTTP API (through ``kvpool.http_client.JsonClient``).

    ``token`` defaults to the operator's token file (``kvpool.auth``): what the agent checks
    every call but ``GET`` against.
    """

    def __init__(self, url: str, timeout: float = 60.0, token: str | None = None) -> None:
        if not url.startswith("unix:") and urllib.parse.urlsplit(url).port is None:
            raise ValueError(f"agent url must look like http://127.0.0.1:7471 or unix:/path, got {url!r}")
        self.http = JsonClient(url, timeout, "agent API", auth.secret() if token is None else token)
        self.url = self.http.url
        self.timeout = timeout

    # ------------------------------------------------------------------ plain calls

    def health(self) -> dict[str, Any]:
        """The agent's identity and addresses."""
        return self.http.get("/v1/health")

    def stats(self) -> dict[str, Any]:
        """All of the agent's counters."""
        return self.http.get("/v1/stats")

    def put_chunk(self, key: int, blob: bytes, generation: int = 0) -> dict[str, Any]:
        """Publish one serialized chunk."""
        reply = self.http.request("PUT", f"/v1/chunks/{format_key(key)}?generation={generation}", blob,
                                  {"Content-Type": "application/octet-stream"})
        out: dict[str, Any] = json.loads(reply.body)
        return out

    def get_chunk(self, key: int) -> bytes:
        """A serialized chunk held by the agent (``ApiError`` 404 if not)."""
        return self.http.request("GET", f"/v1/chunks/{format_key(key)}").body

    def delete_chunk(self, key: int) -> bool:
        """Make the agent forget a chunk; True if it held it."""
        return bool(self.http.delete(f"/v1/chunks/{format_key(key)}")["deleted"])

    def publish_chunks(self, keys: Sequence[int], blobs: Sequence[bytes | bytearray | memoryview],
                       generation: int = 0) -> dict[str, Any]:
        """Publish many serialized chunks: ``{"published": n, "bytes": total}``.

        Sent as few bundles as the agent's default body limit (``hostagent.api.MAX_BODY``,
        one largest chunk) allows.
        """
        if len(keys) != len(blobs):
            raise ValueError(f"{len(keys)} keys but {len(blobs)} chunks")
        published = nbytes = 0
        start = 0
        while start < len(keys):
            end, size = start + 1, BUNDLE_COUNT.size + BUNDLE_ENTRY.size + len(blobs[start])
            while end < len(keys) and size + BUNDLE_ENTRY.size + len(blobs[end]) <= MAX_BODY:
                size += BUNDLE_ENTRY.size + len(blobs[end])
                end += 1
            reply = self.http.request("POST", "/v1/publish", pack_bundle(keys[start:end], blobs[start:end]),
                                      {"Content-Type": "application/octet-stream",
                                       "X-Kvpool-Generation": str(generation)})
            answer = json.loads(reply.body)
            published += int(answer["published"])
            nbytes += int(answer["bytes"])
            start = end
        return {"published": published, "bytes": nbytes}

    def fetch_chunks(self, keys: Sequence[int], holder: str | None = None, *, timeout: float | None = None,
                     generation: int = 0, local: bool = True) -> tuple[list[int], list[bytes], str | None]:
        """The longest prefix of ``keys`` the agent has or gets from ``holder``: keys, blobs, stop reason.

        ``local=False`` makes every chunk cross the network and keeps nothing locally.
        """
        got, blobs, stopped, _timing = self.fetch_chunks_timed(keys, holder, timeout=timeout, generation=generation,
                                                              local=local)
        return got, blobs, stopped

    def fetch_chunks_timed(self, keys: Sequence[int], holder: str | None = None, *, timeout: float | None = None,
                           generation: int = 0, local: bool = True,
                           ) -> tuple[list[int], list[bytes], str | None, dict[str, Any] | None]:
        """``fetch_chunks``, and where the fetched chunks' transfer time went, summed over them
        (``hostagent.timing.summarize``; None from an agent that does not say)."""
        # megabytes: each chunk copied once, from the socket (or from httpx's pieces)
        reply, got_keys, blobs = self._fetch(keys, holder, split_bundle, timeout=timeout, generation=generation,
                                             local=local)
        return got_keys, blobs, reply.header("X-Kvpool-Stopped"), _timing(reply)

    def fetch_chunks_into(self, keys: Sequence[int], buffer: torch.Tensor | npt.NDArray[Any] | bytearray | memoryview,
                          holder: str | None = None, *, timeout: float | None = None, generation: int = 0,
                          local: bool = True) -> tuple[list[int], list[memoryview], str | None]:
        """``fetch_chunks``, each chunk received straight into ``buffer``: keys, a view of ``buffer`` per
        chunk, stop reason.

        ``buffer`` is the caller's memory, reused across fetches: a contiguous CPU tensor (pinned
        for a later device copy: ``staging_buffer``), a numpy array, a ``bytearray`` or a writable
        ``memoryview``; ``bundle_space`` says how much the chunks need. Every chunk starts at a
        ``CHUNK_ALIGN`` boundary, so ``deserialize(view)`` is a tensor on the same memory (no copy,
        the checksum verified). Nothing is written past ``buffer``: chunks that do not fit raise
        ``BufferTooSmallError`` (``.needed`` bytes) before a byte is written. A failed or short
        answer raises as ``fetch_chunks`` does (``ApiError``, ``ApiUnreachableError``), never a
        partial result; ``buffer`` then holds undefined bytes. The views are valid until the
        buffer is reused.

        The answer's body, of any length, is read past h11 (that connection closes after): the
        kernel writes each chunk into ``buffer`` (``recv_into``), no bytes object, no join.
        """
        out = _byte_buffer(buffer)
        reply, got_keys, views = self._fetch(keys, holder, lambda src: split_bundle_into(src, out), direct=1,
                                             timeout=timeout, generation=generation, local=local)
        return got_keys, views, reply.header("X-Kvpool-Stopped")

    def _fetch(self, keys: Sequence[int], holder: str | None, split: Callable[[BodyReader], tuple[list[int], list[T]]],
               *, direct: int = DIRECT_BODY, timeout: float | None, generation: int, local: bool,
               ) -> tuple[Reply, list[int], list[T]]:
        """``POST /v1/fetch``, its bundle taken apart by ``split``; the keys checked against ``keys``."""
        doc: dict[str, Any] = {"keys": [format_key(k) for k in keys], "generation": generation, "local": local}
        if holder is not None:
            doc["holder"] = holder
        if timeout is not None:
            doc["timeout"] = timeout
        try:
            reply, (got_keys, blobs) = self.http.request_with("POST", "/v1/fetch", split, json.dumps(doc).encode(),
                                                              {"Content-Type": "application/json"}, direct=direct)
        except BufferTooSmallError:
            raise
        except ValueError as exc:
            raise ApiError(200, "bad_answer", f"agent answered a malformed bundle: {exc}") from None
        if got_keys != list(keys[: len(got_keys)]):
            raise ApiError(reply.status, "bad_answer", "agent answered chunks for other keys than asked")
        return reply, got_keys, blobs

    def lookup(self, keys: Sequence[int]) -> dict[str, Any]:
        """How long a prefix of ``keys`` the agent could answer, no bytes moved:
        ``{"requested", "local", "available"}`` (``hostagent.api``, ``POST /v1/lookup``)."""
        return self.http.post("/v1/lookup", {"keys": [format_key(k) for k in keys]})

    def push(self, keys: Sequence[int], to: str) -> dict[str, Any]:
        """Have a holder send the chunks to ``to`` unasked (fills switch pools on the way)."""
        return self.http.post("/v1/push", {"keys": [format_key(k) for k in keys], "to": to})

    def prefetch(self, keys: Sequence[int], holder: str | None = None, *,
                 timeout: float | None = None) -> dict[str, Any]:
        """Have the agent fetch chunks into its tiers without returning them (JSON summary)."""
        doc: dict[str, Any] = {"keys": [format_key(k) for k in keys]}
        if holder is not None:
            doc["holder"] = holder
        if timeout is not None:
            doc["timeout"] = timeout
        return self.http.post("/v1/prefetch", doc)

    # ------------------------------------------------------------------ prefixes

    def publish_prefix(self, model_id: str, token_ids: TokenIds, kv: Any, *, block_size: int,
                       quant: Quant = Quant.NONE, generation: int = 0) -> list[int]:
        """Publish the KV of every full block of ``token_ids``; return the chunk keys published.

        ``kv`` is a transformers cache, a sequence of per-layer ``(k, v)`` pairs, or chunk
        tensors already cut (one ``[layers, 2, kv_heads, block, head_dim]`` per block, or
        stacked with a leading block axis).
        """
        keys = chunk_keys(model_id, token_ids, block_size)
        chunks = self._as_chunks(kv, block_size, len(keys))
        blobs = [serialize(chunks[i], quant) for i in range(len(keys))]
        if keys:
            self.publish_chunks(keys, blobs, generation)
        return keys

    @staticmethod
    def _as_chunks(kv: Any, block_size: int, n: int) -> torch.Tensor | Sequence[torch.Tensor]:
        if isinstance(kv, torch.Tensor) and kv.dim() == 6:
            chunks: torch.Tensor | Sequence[torch.Tensor] = kv
        elif isinstance(kv, Sequence) and kv and isinstance(kv[0], torch.Tensor) and kv[0].dim() == 5:
            chunks = kv
        else:
            return chunks_from_hf(kv, block_size, num_blocks=n)
        if len(chunks) < n:
            raise ValueError(f"{len(chunks)} chunk tensors given, the prompt has {n} full blocks")
        for i in range(n):
            if chunks[i].shape[3] != block_size:
                raise ValueError(f"chunk {i} holds {chunks[i].shape[3]} tokens, block_size is {block_size}")
        return chunks

    def fetch_prefix(self, model_id: str, token_ids: TokenIds, *, block_size: int, holder: str | None = None,
                     timeout: float | None = None, generation: int = 0) -> FetchedPrefix:
        """Fetch the KV of the longest available prefix of ``token_ids`` (checksums verified)."""
        keys = chunk_keys(model_id, token_ids, block_size)
        if not keys:
            return FetchedPrefix([], None, block_size, 0, f"prompt has fewer than {block_size} tokens")
        got, blobs, stopped = self.fetch_chunks(keys, holder, timeout=timeout, generation=generation)
        tensors = [deserialize(bytearray(b)) for b in blobs]
        chunks = torch.stack(tensors) if tensors else None
        return FetchedPrefix(got, chunks, block_size, len(keys), stopped)



def _timing(reply: Reply) -> dict[str, Any] | None:
    """The answer's ``X-Kvpool-Timing`` object, None when absent or not one."""
    raw = reply.header("X-Kvpool-Timing")
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def staging_buffer(nbytes: int, *, pin: bool | None = None) -> torch.Tensor:
    """A uint8 CPU tensor of ``nbytes`` for ``AgentClient.fetch_chunks_into``, to keep and reuse.

    ``pin`` (default: when CUDA is there) page-locks it, so that a copy from it to a device is
    one DMA that can run ``non_blocking``. Its pages are not touched here: the first fetch
    faults them in, later ones reuse them.
    """
    if pin is None:
        pin = torch.cuda.is_available()
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)


def _byte_buffer(buffer: torch.Tensor | npt.NDArray[Any] | bytearray | memoryview) -> memoryview:
    """A flat, writable byte view of the caller's memory (no copy); ``ValueError`` for anything else."""
    if isinstance(buffer, torch.Tensor):
        if buffer.device.type != "cpu" or not buffer.is_contiguous():
            raise ValueError(f"the buffer must be a contiguous CPU tensor, got one on {buffer.device}"
                             f"{'' if buffer.is_contiguous() else ', not contiguous'}")
        view = tensor_bytes(buffer) if buffer.numel() else memoryview(bytearray())
    elif isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise ValueError("the buffer must be a C-contiguous array")
        view = buffer.reshape(-1).view(np.uint8).data
    else:
        try:
            view = memoryview(buffer).cast("B")
        except TypeError as exc:
            raise ValueError(f"the buffer must be contiguous bytes: {exc}") from None
    if view.readonly:
        raise ValueError("the buffer must be writable")
    return view


__all__ = ["CHUNK_ALIGN", "AgentClient", "BufferTooSmallError", "FetchedPrefix", "bundle_space", "staging_buffer"]
