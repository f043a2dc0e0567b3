"""``KvpoolConnector``: vLLM (v1 engine, ``KVConnectorBase_V1``) takes prompt-prefix KV from kvpool.

Needs the ``kvpool[vllm]`` extra; nothing else in kvpool imports this module.  One flag
turns it on (docs/guide/vllm.md)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvpoolConnector",
        "kv_connector_module_path": "hostagent.vllm_connector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"agent_url": "http://127.0.0.1:7471"}}'

Both halves talk to the host's ``kvpool-agent`` through its local API (``AgentClient``):

* **Scheduler**: a prompt's chunk keys are the key chain of ``hostagent.chunking`` over its
  full chunks (a chunk is ``chunk_blocks`` vLLM blocks), rooted in the request's
  ``cache_salt`` and scoped by the model id, so tenants with different salts never share a
  chunk.  ``get_num_new_matched_tokens`` asks the agent how many leading chunks it could
  answer (``POST /v1/lookup``: its tiers' index and its directory, no bytes move) and offers
  them, never the prompt's last token (the engine must compute at least one).
* **Worker**: ``start_load_kv`` fetches the matched chunks through the agent (so the switches
  coalesce, multicast and serve them) straight into a staging buffer it keeps
  (``AgentClient.fetch_chunks_into``: no bytes object, no join, deserialized as views) and
  writes them from there into the paged cache of every layer before the forward pass reads
  it; ``wait_for_save`` copies the chunks a step completed out of the paged cache and
  publishes them to the agent from a background thread.

Failure is a recompute, never wrong KV and never a hung engine: every call to the agent is
bounded by a timeout; a fetch that fails, stops short, times out or fails its integrity
check reports those blocks through ``get_block_ids_with_load_errors`` and vLLM recomputes
them (``kv_load_failure_policy: "recompute"``, which the connector asks for).  An agent
that did not answer is left alone for ``retry_after_s`` (lookups answer 0 meanwhile), so a
dead agent costs the scheduler nothing per request.

Limits: vLLM's CPU attention layout (``[blocks, kv_heads, block_size, 2 * head_dim]`` per
layer) is the one written; one worker (no tensor or pipeline parallelism); prompt tokens
only (no multimodal inputs, no prompt embeddings).  A salt separates tenants that do not
know each other's salt; anyone who knows a chunk's key can still ask an agent for it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from hostagent.api import MAX_LOOKUP_KEYS
from hostagent.chunking import chunk_keys
from hostagent.client import AgentClient, bundle_space, staging_buffer
from hostagent.layouts import chunks_from_paged, write_chunks_to_paged
from hostagent.serialize import ChunkFormatError, blob_size, deserialize, serialize
from kvpool import auth
from kvpool.http_api import ApiError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("kvpool.vllm")


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    """``kv_connector_extra_config``: every key optional, unknown keys refused."""

    agent_url: str = "http://127.0.0.1:7471"
    """The local ``kvpool-agent``'s API."""
    holder: str | None = None
    """A holder's kvpool UDP address (``host:port``) to fetch from; None: the agent's directory."""
    lookup_url: str | None = None
    """The agent whose ``/v1/lookup`` answers the scheduler; None: ``agent_url``.  Where no controller
    runs, the holder's API stands in for the directory (what it holds, the local agent fetches)."""
    keep: bool = True
    """Keep fetched chunks in the local agent's tiers (False: every load crosses the network)."""
    model_id: str | None = None
    """Scopes the key chain; default: model, revision, dtype and KV-cache dtype of the engine."""
    chunk_blocks: int = 1
    """vLLM blocks per chunk."""
    lookup_timeout_s: float = 1.0
    """Bound on the scheduler's question to the agent."""
    fetch_timeout_s: float = 5.0
    """Bound on one step's fetch through the agent (the forward pass waits for it)."""
    save_timeout_s: float = 10.0
    """Bound on one publish to the agent (a background thread waits for it)."""
    retry_after_s: float = 5.0
    """After the agent failed to answer, how long to leave it alone."""
    max_pending_saves: int = 16
    """Steps' saves queued at most; more are dropped (a dropped save is a later miss)."""
    load: bool = True
    """Take prefixes from kvpool."""
    save: bool = True
    """Publish computed chunks to kvpool."""
    token: str | None = None
    """The agent's API token itself; default: read from ``token_file``.  vLLM logs its whole
    ``kv_transfer_config``, this value with it: prefer ``token_file``."""
    token_file: str | None = None
    """The file the agent's API token is read from (afresh for every client); default: the
    operator's token file (``kvpool.auth``)."""

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> ConnectorSettings:
        """Settings from ``kv_connector_extra_config``; ``ValueError`` on unknown keys or bad values."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"KvpoolConnector: unknown kv_connector_extra_config keys {unknown}; "
                             f"known: {sorted(known)}")
        settings = cls(**dict(extra))
        if settings.token is not None and settings.token_file is not None:
            raise ValueError("KvpoolConnector: give token or token_file, not both")
        if isinstance(settings.chunk_blocks, bool) or not isinstance(settings.chunk_blocks, int) \
                or settings.chunk_blocks < 1:
            raise ValueError(f"KvpoolConnector: chunk_blocks must be a positive integer, got {settings.chunk_blocks!r}")
        for name in ("lookup_timeout_s", "fetch_timeout_s", "save_timeout_s"):
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
                raise ValueError(f"KvpoolConnector: {name} must be a number of seconds in (0, 3600], got {value!r}")
        return settings


def default_model_id(vllm_config: VllmConfig) -> str:
    """Names what changes the KV of a token: model, revision, dtype, KV-cache dtype."""
    model = vllm_config.model_config
    return (f"vllm:{model.model}@{model.revision or ''}:{str(model.dtype).removeprefix('torch.')}"
            f":{vllm_config.cache_config.cache_dtype}")


# ------------------------------------------------------------------------------ metadata


@dataclass(slots=True)
class LoadSpec:
    """Chunks ``keys`` go to vLLM blocks ``block_ids`` (``chunk_blocks`` per chunk); the first
    ``skip`` blocks are already computed and left alone."""

    req_id: str
    keys: list[int]
    block_ids: list[int]
    skip: int = 0


@dataclass(slots=True)
class SaveSpec:
    """The KV in vLLM blocks ``block_ids`` (``chunk_blocks`` per chunk) is published as ``keys``."""

    req_id: str
    keys: list[int]
    block_ids: list[int]


@dataclass
class KvpoolConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's loads and saves, from the scheduler's half to the worker's."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


@dataclass(slots=True)
class _ReqState:
    """What the scheduler's half remembers of one request."""

    keys: list[int]
    """Keys of every full chunk of the prompt."""
    prompt_len: int
    computed: int = 0
    """Tokens vLLM had computed locally when it asked."""
    hit: int = 0
    """Leading chunks the agent could answer."""
    load_tokens: int = 0
    """Tokens to load, once allocated (0: none)."""
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0
    """Chunks before this one are in kvpool or on their way there."""


# ------------------------------------------------------------------------------ the connector


class KvpoolConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM's KV connector for kvpool (see the module docstring)."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = self._kv_transfer_config
        self.settings = ConnectorSettings.from_extra(transfer.kv_connector_extra_config or {})
        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
            raise ValueError("KvpoolConnector supports one worker (tensor_parallel_size = pipeline_parallel_size = 1)")
        if getattr(transfer, "kv_load_failure_policy", "recompute") != "recompute":
            log.warning("kv_load_failure_policy is %r: a failed kvpool fetch fails the request; "
                        "set it to \"recompute\" to recompute those blocks instead",
                        transfer.kv_load_failure_policy)
        self.block_size: int = vllm_config.cache_config.block_size
        self.chunk_tokens = self.block_size * self.settings.chunk_blocks
        self.model_id = self.settings.model_id or default_model_id(vllm_config)
        self._lock = threading.Lock()
        self._quiet_until = 0.0
        self.counters: dict[str, int] = {
            "lookups": 0, "lookup_hits": 0, "lookup_errors": 0, "loaded_chunks": 0, "load_failed_chunks": 0,
            "saved_chunks": 0, "save_errors": 0, "saves_dropped": 0,
        }
        self.load_seconds = 0.0
        """Wall time of every load so far (fetch, check and copy into the paged cache; worker half)."""
        # Scheduler half.
        self._reqs: dict[str, _ReqState] = {}
        # Worker half.
        self._layers: list[torch.Tensor] = []
        self._staging: torch.Tensor | None = None
        """Where fetched chunks land (``AgentClient.fetch_chunks_into``), kept across loads, grown on demand."""
        self._failed_blocks: set[int] = set()
        self._load_failed = False
        self._saver: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        log.info("KvpoolConnector (%s) for %s: agent %s, chunks of %d tokens", role.name, self.model_id,
                 self.settings.agent_url, self.chunk_tokens)

    # ------------------------------------------------------------------ the agent

    def _agent(self, timeout: float, url: str | None = None) -> AgentClient | None:
        """A client whose every socket operation is bounded by ``timeout``; None while the agent is
        left alone.  A new one per call: threads share no connection, and the token is read afresh
        (an agent started after the engine creates it)."""
        with self._lock:
            if time.monotonic() < self._quiet_until:
                return None
        try:
            token = self.settings.token
            if token is None and self.settings.token_file is not None:
                token = auth.secret(Path(self.settings.token_file))
            return AgentClient(url or self.settings.agent_url, timeout, token)
        except (ValueError, OSError) as exc:
            self._agent_failed("connect", exc)
            return None

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def _agent_failed(self, what: str, exc: Exception) -> None:
        """Note a failed call; leave the agent alone a while (and read its token afresh next time)."""
        log.warning("kvpool %s failed (%s): recomputing; next try in %.1f s", what, exc, self.settings.retry_after_s)
        with self._lock:
            self._quiet_until = time.monotonic() + self.settings.retry_after_s

    # ------------------------------------------------------------------ scheduler half

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond ``num_computed_tokens`` whose KV kvpool holds, in whole chunks, never the last."""
        state = self._state(request)
        if state is None:
            return 0, False
        state.computed = num_computed_tokens
        # Chunks vLLM's own prefix cache answered were computed, hence saved, by an earlier request.
        state.saved = max(state.saved, min(num_computed_tokens // self.chunk_tokens, len(state.keys)))
        if not self.settings.load:
            return 0, False
        # At least one token left to compute; no more keys than one lookup may name.
        usable = state.keys[: min((state.prompt_len - 1) // self.chunk_tokens, MAX_LOOKUP_KEYS)]
        if len(usable) * self.chunk_tokens <= num_computed_tokens:
            return 0, False
        client = self._agent(self.settings.lookup_timeout_s, self.settings.lookup_url)
        if client is None:
            return 0, False
        self._count("lookups")
        try:
            state.hit = int(client.lookup(usable)["available"])
        except (ApiError, OSError, KeyError, ValueError, TypeError) as exc:
            self._count("lookup_errors")
            self._agent_failed("lookup", exc)
            return 0, False
        state.saved = max(state.saved, state.hit)
        matched = min(state.hit, len(usable)) * self.chunk_tokens
        if matched <= num_computed_tokens:
            return 0, False
        self._count("lookup_hits")
        return matched - num_computed_tokens, False

    def _state(self, request: Request) -> _ReqState | None:
        """The request's state, made at first sight; None for prompts kvpool cannot key."""
        state = self._reqs.get(request.request_id)
        if state is not None:
            return state
        tokens = request.prompt_token_ids
        if tokens is None or getattr(request, "mm_features", None):
            return None  # prompt embeddings or multimodal inputs: tokens do not name the KV
        keys = chunk_keys(self.model_id, tokens, self.chunk_tokens, salt=request.cache_salt)
        state = _ReqState(keys, len(tokens))
        self._reqs[request.request_id] = state
        return state

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """Remember how many tokens the next step must load for this request."""
        state = self._reqs.get(request.request_id)
        if state is not None:
            state.load_tokens = num_external_tokens

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvpoolConnectorMetadata:
        """This step's loads (requests just allocated) and saves (chunks this step completes)."""
        meta = KvpoolConnectorMetadata()
        steps: list[tuple[_ReqState, str, int, int]] = []  # state, req_id, computed before, scheduled
        for new in scheduler_output.scheduled_new_reqs:
            state = self._reqs.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            steps.append((state, new.req_id, new.num_computed_tokens, scheduler_output.num_scheduled_tokens.get(
                new.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                state.block_ids = list(new_ids[0]) if new_ids is not None else []
            elif new_ids is not None:
                state.block_ids.extend(new_ids[0])
            steps.append((state, req_id, cached.num_computed_tokens[i],
                          scheduler_output.num_scheduled_tokens.get(req_id, 0)))
        cb = self.settings.chunk_blocks
        for state, req_id, before, scheduled in steps:
            if state.load_tokens:
                first = state.computed // self.chunk_tokens
                last = (state.computed + state.load_tokens) // self.chunk_tokens
                state.load_tokens = 0
                if last > first:  # too few blocks (never expected) fails in the worker: a recompute
                    meta.loads.append(LoadSpec(req_id, state.keys[first:last], state.block_ids[first * cb : last * cb],
                                               skip=state.computed // self.block_size - first * cb))
            if self.settings.save:
                done = min((before + scheduled) // self.chunk_tokens, len(state.keys))
                if done > state.saved and len(state.block_ids) >= done * cb:
                    meta.saves.append(SaveSpec(req_id, state.keys[state.saved : done],
                                               state.block_ids[state.saved * cb : done * cb]))
                    state.saved = done
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; its blocks are free at once (saves copy out within the step)."""
        self._reqs.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------ worker half

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Keep each layer's paged cache as ``[blocks, 2, block_size, kv_heads, head_dim]`` (a view)."""
        names = sorted(kv_caches, key=_natural)
        head = self._vllm_config.model_config.get_head_size()
        views = []
        for name in names:
            t = kv_caches[name]
            # vLLM's CPU attention: [blocks, kv_heads, block_size, 2 * head_dim], each (block, head)
            # holding K [block_size, head_dim] then V (cpu_attn.py views it as [.., 2 * block_size, head_dim]).
            if t.device.type != "cpu" or t.dim() != 4 or t.shape[2] != self.block_size or t.shape[3] != 2 * head:
                raise NotImplementedError(
                    f"KvpoolConnector knows vLLM's CPU paged layout [blocks, kv_heads, {self.block_size}, "
                    f"{2 * head}]; layer {name} is {tuple(t.shape)} on {t.device}")
            blocks, heads = t.shape[0], t.shape[1]
            views.append(t.view(blocks, heads, 2, self.block_size, head).permute(0, 2, 3, 1, 4))
        self._layers = views
        log.info("KvpoolConnector: %d layers of paged KV registered", len(views))

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Fetch this step's matched chunks through the agent and write them into every layer."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvpoolConnectorMetadata)
        results = [self._load(load) for load in meta.loads]
        self._load_failed = not all(results)

    def _load(self, load: LoadSpec) -> bool:
        """One request's chunks; the blocks of every chunk not written go to the load errors.
        True when every chunk was written."""
        cb = self.settings.chunk_blocks
        written = 0
        t0 = time.perf_counter()
        # The agent answers within fetch_timeout_s; the socket waits a little longer for that answer.
        client = self._agent(self.settings.fetch_timeout_s + 2.0)
        try:
            if client is None:
                raise _QuietError
            # The agent's answer goes from the socket straight into the staging buffer; each chunk is
            # checked there and copied from there into the paged blocks (docs/design/notes-http.md).
            _, blobs, stopped = client.fetch_chunks_into(load.keys, self._staging_for(len(load.keys)),
                                                         self.settings.holder, timeout=self.settings.fetch_timeout_s,
                                                         local=self.settings.keep)
            for i, blob in enumerate(blobs):
                chunk = deserialize(blob)  # a view of the staging buffer, its checksum verified
                blocks = self._blocks_of(chunk, cb)
                lo = load.skip if i == 0 else 0
                write_chunks_to_paged(self._layers, load.block_ids[i * cb + lo : (i + 1) * cb], blocks[lo:])
                written = i + 1
            if written < len(load.keys):
                log.info("kvpool had %d of %d chunks for %s (%s): recomputing the rest", written, len(load.keys),
                         load.req_id, stopped)
        except _QuietError:
            pass
        except (ApiError, OSError) as exc:
            self._agent_failed("fetch", exc)
        except (ChunkFormatError, ValueError, RuntimeError) as exc:
            log.warning("kvpool chunk for %s unusable (%s): recomputing", load.req_id, exc)
        self._count("loaded_chunks", written)
        with self._lock:
            self.load_seconds += time.perf_counter() - t0
        if written < len(load.keys):
            self._count("load_failed_chunks", len(load.keys) - written)
            self._failed_blocks.update(load.block_ids[max(written * cb, load.skip) :])
            return False
        return True

    def _staging_for(self, n: int) -> torch.Tensor:
        """A staging buffer with room for ``n`` chunks of this cache's shape and dtype (kept, grown when short).

        Pinned when the paged cache is on a device, so that the copy into it is one DMA. A chunk
        of another shape or dtype either fits (and ``_blocks_of`` refuses it) or raises
        ``BufferTooSmallError``: both are recomputes.
        """
        if not self._layers:
            raise ValueError("no paged cache registered")
        _, two, block, heads, dim = self._layers[0].shape
        shape = (len(self._layers), two, heads, self.settings.chunk_blocks * block, dim)
        size = blob_size(self._layers[0].dtype, shape)
        need = bundle_space([size] * n)
        if self._staging is None or self._staging.numel() < need:
            self._staging = None  # the old one goes first: only one staging buffer at a time
            self._staging = staging_buffer(need, pin=self._layers[0].device.type == "cuda")
        return self._staging

    def _blocks_of(self, chunk: torch.Tensor, cb: int) -> torch.Tensor:
        """A chunk ``[L, 2, H, cb * B, D]`` as ``cb`` per-block chunks ``[cb, L, 2, H, B, D]``."""
        layers, two, heads, tokens, dim = chunk.shape
        if (layers, two, tokens) != (len(self._layers), 2, cb * self.block_size):
            raise ValueError(f"chunk {tuple(chunk.shape)} does not fit {len(self._layers)} layers of "
                             f"{cb} x {self.block_size}-token blocks")
        return chunk.view(layers, 2, heads, cb, self.block_size, dim).permute(3, 0, 1, 2, 4, 5)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Every layer is written in ``start_load_kv``: nothing to wait for."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        """Chunks span every layer: they are copied out once, in ``wait_for_save``."""

    def wait_for_save(self) -> None:
        """Copy the chunks this step completed out of the paged cache; publish them in the background."""
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvpoolConnectorMetadata) or not meta.saves or not self._layers:
            return
        self._pending = [f for f in self._pending if not f.done()]
        cb = self.settings.chunk_blocks
        if self._load_failed:
            # This step attended over blocks that failed to load (vLLM recomputes the requests that
            # hold them, and any request sharing them): none of its KV is published.
            self._load_failed = False
            self._count("saves_dropped", sum(len(save.keys) for save in meta.saves))
            return
        for save in meta.saves:
            if len(self._pending) >= self.settings.max_pending_saves:
                self._count("saves_dropped", len(save.keys))
                continue
            # The copy is made now: the blocks may be reused once this step ends.
            blocks = chunks_from_paged(self._layers, save.block_ids)  # [n * cb, L, 2, H, B, D]
            n = len(save.keys)
            _, layers, _, heads, block, dim = blocks.shape
            chunks = (blocks.view(n, cb, layers, 2, heads, block, dim).permute(0, 2, 3, 4, 1, 5, 6)
                      .reshape(n, layers, 2, heads, cb * block, dim))
            if self._saver is None:
                self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpool-save")
            self._pending.append(self._saver.submit(self._publish, save.keys, chunks))

    def _publish(self, keys: list[int], chunks: torch.Tensor) -> None:
        """Serialize and publish chunks (background thread); failures only cost later misses."""
        client = self._agent(self.settings.save_timeout_s)
        if client is None:
            self._count("saves_dropped", len(keys))
            return
        try:
            client.publish_chunks(keys, [serialize(chunks[i]) for i in range(len(keys))])
            self._count("saved_chunks", len(keys))
        except (ApiError, OSError, ValueError) as exc:
            self._count("save_errors", len(keys))
            self._agent_failed("save", exc)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait (at most ``timeout``) for the saves handed to the background thread."""
        deadline = time.monotonic() + timeout
        for fut in list(self._pending):
            fut.exception(timeout=max(0.0, deadline - time.monotonic()))

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks of chunks that could not be loaded this step: vLLM recomputes them."""
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def shutdown(self) -> None:
        """Let queued saves finish (bounded), then stop the saver."""
        try:
            self.flush(self.settings.save_timeout_s)
        except Exception as exc:  # a save still running: dropped, not waited for
            log.warning("kvpool saves left behind at shutdown: %s", exc)
        if self._saver is not None:
            self._saver.shutdown(wait=False, cancel_futures=True)


class _QuietError(Exception):
    """The agent is being left alone after a failure."""


def _natural(name: str) -> list[int | str]:
    """Sort key that puts layers.2 before layers.10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


__all__: Sequence[str] = ["ConnectorSettings", "KvpoolConnector", "KvpoolConnectorMetadata", "LoadSpec", "SaveSpec"]
