"""The host agent process: tiers + holder + UDP transport + local HTTP API, with one config.

``Agent`` wires the pieces together; ``hostagent.cli`` is the ``kvpool-agent`` command
that loads an ``AgentConfig`` (TOML file, flags override it) and runs an ``Agent`` until
SIGTERM/SIGINT.

Every agent is both roles at once: it serves the chunks in its tiers to peers (holder)
and fetches chunks from other agents for the local inference engine (requester); a
fetched chunk is stored in the local tiers, so the agent can serve it onwards.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from hostagent.api import MAX_BODY, make_server
from hostagent.backend import ChunkBackend, MemoryBackend
from hostagent.dirsync import DirectorySync
from hostagent.envelope import content_digest
from hostagent.gate import RequesterGate, parse_allow
from hostagent.hints import FabricHints
from hostagent.holder import RECORD_CACHE_BYTES, Holder
from hostagent.registration import ControllerClient, Registration
from hostagent.tiers import Blob, TieredStore, TierError, default_store
from hostagent.timing import FetchTiming
from hostagent.transport import Address, ChunkIntegrityError, FetchResult, Transport, TransportConfig
from kvpool import auth, config, logs, wire
from kvpool.config import ConfigError
from kvpool.hints import Hints
from kvpool.http_api import ApiError
from kvpool.http_server import ApiServer
from kvpool.metrics import LatencyHistogram

#: Fragments per second a holder sends one unpaced requester (about 145 MB/s of DATA).
DEFAULT_SOURCE_BUDGET = 100_000.0
#: A source's burst, in serve windows (see ``_make_gate``).
SOURCE_BURST_WINDOWS = 4
#: An unpaced holder's turn per request, in DATA datagrams: 16 full segmented sends (about 1 MB).
#: Paced, a turn is the transport's ``send_quantum`` (64), a share of a slow link; unpaced, the
#: holder sends as fast as its socket takes, and each turn arrives as one run the requester
#: checks and copies with a fixed cost in Python calls: turns of 64 made that cost 30% of
#: the requester's batch processing on loopback (docs/design/transport.md).
UNPACED_TURN = 16 * 44

log = logging.getLogger("kvpool.agent")

BACKENDS = ("none", "memory", "mooncake")
ROLES = ("holder", "inference")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything an agent can be told; TOML keys under ``[agent]`` have the same names."""

    host: str = "127.0.0.1"
    """Address of the UDP sockets (kvpool port and fetch port)."""
    udp_port: int = wire.KVPOOL_UDP_PORT
    """kvpool UDP port peers send GETs to; 0 picks a free one."""
    api_host: str = "127.0.0.1"
    """Address of the local HTTP API (keep it on loopback: only its mutating calls need the token)."""
    api_port: int = 7471
    """HTTP API port; 0 picks a free one (the controller's API defaults to 7480)."""
    api_socket: str = ""
    """Also serve the API on this Unix socket path: reachable from other network namespaces
    (Mininet hosts share the file system), e.g. by an experiment driver or the controller."""
    dram_bytes: int = 1 << 30
    """Host DRAM tier capacity."""
    record_cache_bytes: int = RECORD_CACHE_BYTES
    """DATA records a holder keeps to answer hot chunks from without copying them again (0: none)."""
    gpu_bytes: int = 0
    """GPU tier capacity (used only when CUDA is available)."""
    backend: str = "none"
    """Lowest tier: none, memory (in-process, unbounded) or mooncake (a Mooncake Store)."""
    mooncake_master: str = "127.0.0.1:50051"
    """Mooncake master RPC address (backend = mooncake)."""
    mooncake_metadata_url: str = "http://127.0.0.1:8080/metadata"
    """Mooncake HTTP metadata server (backend = mooncake)."""
    mooncake_segment: str = ""
    """Store node segment (``host:port``) this agent's publishes are allocated on (backend = mooncake;
    empty: Mooncake's choice)."""
    rate_bytes_per_s: float = 0.0
    """Holder pacing rate; 0 = unpaced."""
    burst_bytes: int = 256 << 10
    """Token bucket depth when pacing: how much may leave back to back before the rate applies."""
    max_queue_s: float = 1.0
    """A paced holder answers GETs BUSY (with a retry hint) once its send queue holds more than
    this many seconds of sending (0: bounded by fragments only)."""
    gather_s: float = 0.0
    """Where the switches merge, how long a holder waits before it answers the head of a hot chunk,
    so a wave's GETs meet at the switch (0: at once)."""
    window_fragments: int = 2048
    """Per-request window of fragments in flight."""
    servable_window: int = 0
    """The same for chunks the switches pool, which they answer in bursts (0: ``window_fragments``)."""
    max_inflight_fragments: int = 16384
    """Fragments in flight over all requests."""
    retransmit_timeout_s: float = 0.2
    """Silence before re-asking for missing fragments."""
    give_up_s: float = 3.0
    """Silence before a fetch fails."""
    integrity_retries: int = 3
    """Rounds of re-asking for a chunk that failed its integrity checks before the fetch fails."""
    sock_buf_bytes: int = 32 << 20
    """UDP socket buffer size asked for."""
    single_gets: bool = False
    """One GET per fragment for every chunk (so a switch can serve and coalesce them) instead of
    range GETs except for the chunks the controller's hints name."""
    share_transfers: bool = True
    """Concurrent fetches of one chunk on this node share one transfer (False: each its own)."""
    udp_offload: bool = True
    """Segmented sends (UDP GSO) and coalesced receives (UDP GRO) where the kernel and path take them."""
    fetch_timeout_s: float = 30.0
    """Default deadline of one API fetch."""
    max_body_bytes: int = MAX_BODY
    """Largest API request body accepted (refused from its Content-Length); the default fits the
    largest chunk a fragment index can address, in a one-chunk bundle."""
    api_workers: int = 64
    """Threads that serve API requests at once (connections beyond wait without a thread)."""
    api_timeout_s: float = 10.0
    """A request head, each read of a body and each write of an answer must progress within this."""
    token_file: str = ""
    """The token file mutating API calls must present (made at first start; default: kvpool.auth)."""
    log_level: str = "INFO"
    """Logging level name."""
    log_format: str = "text"
    """``text`` (people) or ``json`` (one object per line), ``kvpool.logs``."""
    controller: str = ""
    """Controller API (``http://HOST:PORT`` or ``unix:/PATH``) to register with; empty: none."""
    node_id: str = ""
    """This agent's node id in the directory (default: the host name)."""
    role: str = "holder"
    """Directory role: holder (serves chunks) or inference (fetches them)."""
    advertise: str = ""
    """Address registered in the directory (default: ``host``)."""
    pool_bytes: int = 1 << 40
    """Capacity declared to the directory for the tier below DRAM (the backend)."""
    verify_requesters: bool = True
    """Answer GETs only from sources the holder can verify: loopback, ``allow``, or nodes
    registered in the controller's directory (``hostagent.gate``). False answers any source."""
    allow: list[str] = dataclasses.field(default_factory=list)
    """Requesters answered besides loopback and registered nodes: addresses or CIDR prefixes."""
    source_budget: float = 0.0
    """Fragments per second a holder sends one requester (0: its pacing rate, else 100000)."""
    serve_window: int = 0
    """Most fragments one GET is answered with (0: ``window_fragments``, the fleet's window)."""

    def transport_config(self) -> TransportConfig:
        """The transport part of this configuration."""
        return TransportConfig(
            host=self.host, port=self.udp_port, sock_buf_bytes=self.sock_buf_bytes,
            rate_bytes_per_s=self.rate_bytes_per_s, burst_bytes=self.burst_bytes,
            max_queue_s=self.max_queue_s, gather_s=self.gather_s,
            window_fragments=self.window_fragments, servable_window_fragments=self.servable_window,
            max_inflight_fragments=self.max_inflight_fragments,
            retransmit_timeout_s=self.retransmit_timeout_s, give_up_s=self.give_up_s,
            single_fragment_gets=self.single_gets, share_transfers=self.share_transfers,
            integrity_retries=self.integrity_retries, gso=self.udp_offload, gro=self.udp_offload,
            **({} if self.rate_bytes_per_s > 0 else {"send_quantum": UNPACED_TURN}),
        )

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first bad value."""
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.role not in ROLES:
            raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.pool_bytes <= 0:
            raise ConfigError(f"pool_bytes must be positive, got {self.pool_bytes}")
        if self.source_budget < 0 or self.serve_window < 0:
            raise ConfigError(f"source_budget and serve_window must be >= 0, got {self.source_budget}, "
                              f"{self.serve_window}")
        try:
            parse_allow(self.allow)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.controller and not self.controller.startswith(("http://", "unix:")):
            raise ConfigError(f"controller must be http://HOST:PORT or unix:/PATH, got {self.controller!r}")
        for name in ("udp_port", "api_port"):
            if not 0 <= getattr(self, name) <= 0xFFFF:
                raise ConfigError(f"{name} must be 0..65535, got {getattr(self, name)}")
        if self.dram_bytes < 0 or self.gpu_bytes < 0 or self.max_body_bytes <= 0 or self.fetch_timeout_s <= 0:
            raise ConfigError("max_body_bytes and fetch_timeout_s must be positive, dram_bytes and gpu_bytes >= 0")
        if self.record_cache_bytes < 0:
            raise ConfigError(f"record_cache_bytes must be >= 0 (0: keep none), got {self.record_cache_bytes}")
        if not 1 <= self.api_workers <= 1024 or self.api_timeout_s <= 0:
            raise ConfigError(f"api_workers must be 1..1024 and api_timeout_s positive, got {self.api_workers} and "
                              f"{self.api_timeout_s}")
        if self.dram_bytes == 0 and self.backend == "none":
            # Without DRAM the backend is the only place a chunk can live.
            raise ConfigError("dram_bytes 0 needs a backend (--backend memory or mooncake)")
        if logging.getLevelName(self.log_level.upper()) not in (10, 20, 30, 40, 50):
            raise ConfigError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.log_level!r}")
        if self.log_format not in logs.FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(logs.FORMATS)}, got {self.log_format!r}")
        try:
            self.transport_config()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def replace(self, **changes: Any) -> AgentConfig:
        """A copy with ``changes`` applied (None values ignored, so unset CLI flags change nothing)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def load_config(path: Path | None) -> AgentConfig:
    """An ``AgentConfig`` from the ``[agent]`` table of a TOML file (defaults if ``path`` is None)."""
    cfg = AgentConfig() if path is None else config.load(path, "agent", AgentConfig)
    cfg.validate()
    return cfg


class Agent:
    """One host agent: tiered store, holder, transport and (started by ``start``) the HTTP API."""

    def __init__(self, config: AgentConfig, backend: ChunkBackend | None = None) -> None:
        config.validate()
        self.config = config
        #: The secret mutating API calls must present (and this agent presents to the controller).
        self.token = auth.load_or_create(Path(config.token_file) if config.token_file else None)
        self._backend = backend if backend is not None else self._make_backend()
        self.store: TieredStore = default_store(config.dram_bytes, config.gpu_bytes, self._backend)
        self.holder = Holder(self.store, record_cache_bytes=config.record_cache_bytes)
        self.gate = self._make_gate() if config.verify_requesters else None
        #: What the controller said of chunks (hot, pooled): each fetch's path, the holder's bookings.
        self.hints = FabricHints()
        self.transport = Transport(config.transport_config(), self.holder, self.gate, hints=self.hints)
        self._gate_stop = threading.Event()
        self._gate_thread: threading.Thread | None = None
        self._api: ApiServer | None = None
        self._lock = threading.Lock()
        self.started_at = 0.0
        self.published_chunks = 0
        self.fetch_local_hits = 0
        self.fetch_remote = 0
        self.fetch_failed = 0
        self.fetch_seconds = LatencyHistogram()
        """Calls of ``fetch_prefix`` that asked a holder, by how long they took."""
        self.stale_dropped = 0
        self.directory: DirectorySync | None = None

    def _make_gate(self) -> RequesterGate:
        """The holder's requester gate from the configuration (``hostagent.gate``)."""
        cfg = self.config
        window = cfg.serve_window or cfg.window_fragments
        rate = cfg.source_budget or (cfg.rate_bytes_per_s / wire.DATA_DATAGRAM_LEN if cfg.rate_bytes_per_s > 0
                                     else DEFAULT_SOURCE_BUDGET)
        # The burst is several windows, not one: a coalescing switch sends one GET per
        # fragment under the first waiter's source, so on a fabric one source stands for the
        # windows of requesters behind other leaves too (two leaves' windows of 64 under a
        # spine, plus their retransmissions, overran a burst of 2 windows on a frozen holder).
        return RequesterGate(cfg.allow, window_fragments=window, rate_fragments_per_s=rate,
                             burst_fragments=SOURCE_BURST_WINDOWS * window)

    def _refresh_gate(self, client: ControllerClient, every_s: float = 1.0, soonest_s: float = 0.2) -> None:
        """Keep the gate's registered addresses in step with the directory (the last set while it is away).

        Every ``every_s``, and at once (at most every ``soonest_s``) after a GET from a source
        the gate did not know: a requester that registered a moment ago is answered soon.
        """
        gate = self.gate
        assert gate is not None
        warned = False
        while not self._gate_stop.is_set():
            gate.missed.clear()
            try:
                gate.set_registered(n["address"] for n in client.nodes() if n.get("up"))
                warned = False
            except (ApiError, OSError, KeyError, TypeError) as exc:
                if not warned:
                    log.warning("requester gate: directory not read (%s); answering the last known nodes", exc)
                    warned = True
            if self._gate_stop.wait(soonest_s):
                return
            gate.missed.wait(max(0.0, every_s - soonest_s))

    def _make_backend(self) -> ChunkBackend | None:
        if self.config.backend == "memory":
            return MemoryBackend()
        if self.config.backend == "mooncake":
            from hostagent.mooncake_backend import MooncakeBackend  # needs the mooncake package

            return MooncakeBackend(self.config.mooncake_master, self.config.mooncake_metadata_url,
                                   local_hostname=self.config.host,
                                   preferred_segment=self.config.mooncake_segment or None)
        return None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Bind the UDP sockets and the HTTP API and start serving."""
        self.transport.start()
        try:
            cfg = self.config
            self._api = make_server(self, cfg.api_host, cfg.api_port, Path(cfg.api_socket) if cfg.api_socket else None,
                                    self.token, max_body_bytes=cfg.max_body_bytes, workers=cfg.api_workers,
                                    timeout_s=cfg.api_timeout_s).start()
        except OSError:
            self.transport.stop()
            raise
        if self.config.controller:
            try:
                self._join_directory()
            except (ApiError, ValueError) as exc:
                self.stop()
                raise RuntimeError(f"controller {self.config.controller}: {exc}") from None
        if self.gate is not None:
            if self.config.controller:
                client = ControllerClient(self.config.controller, token=self.token.value)
                self._gate_thread = threading.Thread(target=self._refresh_gate, args=(client,),
                                                     name="kvpool-gate", daemon=True)
                self._gate_thread.start()
            elif not self.gate.allow:
                log.warning("holder: no --controller and no --allow: only loopback requesters are answered")
        self.started_at = time.time()
        log.info("agent up: kvpool udp %s:%d, api http://%s:%d, tiers %s", self.config.host, self.transport.port,
                 self.config.api_host, self.api_port, "/".join(self.store.tier_names))

    def _join_directory(self) -> None:
        """Register with the controller and mirror every tier change into its directory."""
        cfg = self.config
        caps = {"dram": cfg.dram_bytes} if "dram" in self.store.tier_names else {}
        if "gpu" in self.store.tier_names:
            caps["hbm"] = cfg.gpu_bytes
        if self._backend is not None:
            caps["pool"] = cfg.pool_bytes
        reg = Registration(ControllerClient(cfg.controller, token=self.token.value),
                           cfg.node_id or socket.gethostname(), cfg.advertise or cfg.host, role=cfg.role, tiers=caps)
        sync = DirectorySync(reg, generation_of=self.store.generation)
        self.store.set_listener(sync.notify)  # replays the chunks stored before registering
        try:
            sync.start()
        except BaseException:
            self.store.set_listener(None)
            raise
        self.directory = sync

    def stop(self) -> None:
        """Leave the directory, stop the API (waiting for requests in progress), the transport and the backend."""
        self._gate_stop.set()
        if self._gate_thread is not None:
            self._gate_thread.join(timeout=5)
            self._gate_thread = None
        if self.directory is not None:
            self.store.set_listener(None)
            self.directory.stop()
            self.directory = None
        if self._api is not None:
            self._api.stop()
            self._api = None
        self.transport.stop()
        if self._backend is not None:
            self._backend.close()
        log.info("agent stopped")

    @property
    def api_port(self) -> int:
        """The HTTP API port actually bound."""
        if self._api is None:
            raise RuntimeError("agent not started")
        return self._api.port

    @property
    def api_url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://{self.config.api_host}:{self.api_port}"

    def ready_info(self) -> dict[str, Any]:
        """What a launcher needs to talk to this agent (written to --ready-file)."""
        info = {"pid": os.getpid(), "udp": [self.config.host, self.transport.port], "api_url": self.api_url,
                "tiers": self.store.tier_names}
        if self.config.api_socket:
            info["api_socket"] = f"unix:{self.config.api_socket}"
        return info

    # ------------------------------------------------------------------ operations (hostagent.api.AgentService)

    @property
    def fetch_timeout_s(self) -> float:
        """Deadline of a fetch that names none."""
        return self.config.fetch_timeout_s

    def chunk(self, key: int) -> Blob | None:
        """A chunk from the local tiers, None when not held."""
        return self.store.get(key)

    def forget(self, key: int) -> bool:
        """Drop a chunk from the local tiers; True if it was held."""
        return self.store.delete(key)

    def lookup(self, keys: list[int]) -> tuple[int, int]:
        """How long a prefix of ``keys`` is held here, and held here or known to the directory.

        Reads only the tiers' index and (registered agents) one directory query: no chunk
        bytes move, so an engine's scheduler can ask at every step.  A directory that does
        not answer counts as knowing nothing.
        """
        local = 0
        while local < len(keys) and keys[local] in self.store:
            local += 1
        available = local
        if available < len(keys) and self.directory is not None:
            try:
                known = self.directory.registration.client.generations(keys[local:])
            except ApiError as exc:
                log.warning("directory lookup of %d chunks failed: %s", len(keys) - local, exc)
                return local, local
            while available < len(keys) and keys[available] in known:
                available += 1
        return local, available

    def push(self, keys: Sequence[int], to: Address) -> list[int]:
        """Send every fragment of the held chunks of ``keys`` to ``to`` unasked; the keys that were held."""
        held = [k for k in keys if self.store.get(k) is not None]
        self.transport.push(held, to)
        return held

    def set_hints(self, hints: Hints) -> int:
        """Replace what the fabric said (``POST /v1/hints``); the number of chunks named."""
        self.hints.update(hints)
        return len(hints.chunks)

    def publish(self, key: int, data: bytes | memoryview, generation: int = 0) -> str:
        """Store a serialized chunk in the local tiers; return the tier it landed in.

        A holder registered with a controller takes the chunk's generation from the
        directory, per content (``generation`` is then ignored): the same bytes keep their
        generation, new bytes get the next one, and the controller has moved every switch
        off the old bytes before this returns (docs/design/correctness.md).
        """
        if not 0 <= key < 1 << 64:
            raise ValueError(f"chunk key {key} does not fit 64 bits")
        if not 0 < len(data) <= wire.MAX_CHUNK_LEN:
            raise ValueError(f"chunk of {len(data)} bytes, allowed 1..{wire.MAX_CHUNK_LEN}")
        if not 0 <= generation <= 0xFFFF_FFFF:
            raise ValueError(f"generation {generation} does not fit 32 bits")
        if self.directory is not None and self.config.role == "holder":
            try:
                generation = self.directory.registration.versions([(key, content_digest(data), len(data))])[key]
            except ApiError as exc:
                raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "directory",
                               f"chunk {key:#018x}: the controller did not issue its generation ({exc})") from None
        try:
            self.store.put(key, data, generation)
        except TierError as exc:
            raise ValueError(str(exc)) from None
        with self._lock:
            self.published_chunks += 1
        return self.store.tier_of(key) or "?"

    def fetch_prefix(self, keys: list[int], holder: Address | None, *, generation: int = 0,
                     timeout: float | None = None, local: bool = True,
                     timings: list[FetchTiming] | None = None) -> tuple[list[Blob], str | None]:
        """The longest prefix of ``keys`` available locally or from ``holder``, and why it stopped.

        Chunks held locally are served from the tiers; the rest are fetched over UDP
        from ``holder`` in one batch and stored locally.  Without a ``holder``, an agent
        registered with a controller asks its directory who holds the first missing
        chunk.  A key implies its whole prefix, so the answer stops at the first chunk
        that could not be had.

        With ``local=False`` the tiers are neither read nor written: every chunk crosses
        the network (experiments that measure transfers use this).  Either way, a chunk
        another call of this node is fetching from the same holder (same generation pin)
        is taken from that transfer, not fetched twice (``share_transfers``).

        Fetched chunks passed the transport's integrity checks before they are stored or
        returned.  A chunk of the prefix that failed them on every try raises
        ``ChunkIntegrityError`` (the API answers 502): an answer never ends quietly short
        where bytes were wrong.

        ``timings`` (when given) gets each fetched chunk's ``FetchTiming``, in key order.
        """
        t0 = time.perf_counter()
        found: list[Blob | None] = [self.store.get(k) if local else None for k in keys]
        current = self._current_generations(keys, found)
        missing = [i for i, blob in enumerate(found) if blob is None]
        if missing and holder is None and self.directory is not None:
            holder = self.holder_from_directory(keys[missing[0]])
        reason: str | None = None
        results: dict[int, FetchResult] = {}
        if missing and holder is not None:
            # Pinned to what the directory says is current: a holder with an older copy NACKs.
            pins = [generation or current.get(keys[i], 0) for i in missing]
            fetched = self.transport.fetch([keys[i] for i in missing], holder, generations=pins,
                                           timeout=timeout or self.config.fetch_timeout_s)
            if timings is not None:
                timings.extend(res.timing for res in fetched)
            for i, res in zip(missing, fetched, strict=True):
                results[i] = res
                if res.data is not None:
                    found[i] = res.data
                    if not local:
                        continue
                    try:  # the reassembly buffer is handed to the tier: no copy of the chunk
                        self.store.put(keys[i], res.data, res.generation, copy=False)
                    except TierError:
                        log.warning("fetched chunk %#x does not fit any tier; not kept", keys[i])
        out: list[Blob] = []
        broken: FetchResult | None = None
        for i, held in enumerate(found):
            if held is None:
                failed = results.get(i)
                reason = (failed.error if failed is not None and failed.error
                          else f"chunk {keys[i]:#018x} not held locally")
                broken = failed if failed is not None and failed.integrity else None
                break
            out.append(held)
        remote = sum(1 for i in results if i < len(out))  # fetched chunks that are part of the answer
        with self._lock:
            self.fetch_remote += remote
            self.fetch_local_hits += len(out) - remote
            self.fetch_failed += sum(1 for r in results.values() if r.data is None)
        if results:  # a call that went to a holder (all-local answers would only hide the network's tail)
            self.fetch_seconds.observe(time.perf_counter() - t0)
        if broken is not None:
            raise ChunkIntegrityError(broken.key, reason or "integrity check failed")
        return out, reason

    def _current_generations(self, keys: list[int], found: list[Blob | None]) -> dict[int, int]:
        """The directory's current generations of ``keys``; drops (in place) found copies that are not current.

        Without a directory every copy counts as current.  When the controller cannot
        answer, no copy can be checked, so none is used: the chunks are fetched again (or
        the prefix stops there), never served stale.
        """
        if self.directory is None:
            return {}
        try:
            current = self.directory.registration.client.generations(keys)
        except ApiError as exc:
            log.warning("cannot check cached chunks against the directory (%s): fetching them again", exc)
            for i in range(len(found)):
                found[i] = None
            return {}
        for i, key in enumerate(keys):
            want = current.get(key)
            if found[i] is not None and want is not None and self.store.generation(key) != want:
                log.info("chunk %#018x: cached generation %s, the directory's is %d: dropped", key,
                         self.store.generation(key), want)
                self.store.delete(key)
                found[i] = None
                with self._lock:
                    self.stale_dropped += 1
        return current

    def holder_from_directory(self, key: int) -> Address | None:
        """The kvpool address of the fastest live copy of ``key`` on another node, per the directory.

        Peers listen on the kvpool port (``KVPOOL_UDP_PORT``) of the address they
        registered.  None when no other node holds it or the controller cannot answer.
        """
        if self.directory is None:
            return None
        me = self.directory.registration.node_id
        try:
            holders = self.directory.registration.client.holders(key)
        except ApiError as exc:
            log.warning("directory lookup of %#x failed: %s", key, exc)
            return None
        for h in holders:  # fastest tier first, as the directory lists them
            if h.get("node_id") != me and h.get("address"):
                return str(h["address"]), wire.KVPOOL_UDP_PORT
        return None

    def stats(self) -> dict[str, Any]:
        """Agent, tier, transport and API counters."""
        with self._lock:
            agent: dict[str, Any] = {
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started_at, 3) if self.started_at else 0.0,
                "published_chunks": self.published_chunks,
                "fetch_local_hits": self.fetch_local_hits,
                "fetch_remote": self.fetch_remote,
                "fetch_failed": self.fetch_failed,
                "stale_dropped": self.stale_dropped,
            }
        agent["fetch_seconds"] = self.fetch_seconds.snapshot()
        out: dict[str, Any] = {"agent": agent, "tiers": self.store.stats(), "transport": self.transport.stats()}
        if self._api is not None:
            out["api"] = self._api.counters.snapshot()
        if self.directory is not None:
            out["directory"] = self.directory.stats()
        return out


@dataclass
class AgentProcess:
    """A ``kvpool-agent`` running as a child process (tests, benchmarks, demos)."""

    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    log_path: Path

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @property
    def api_url(self) -> str:
        """Base URL of its HTTP API."""
        return str(self.info["api_url"])

    @property
    def udp_address(self) -> str:
        """``host:port`` of its kvpool UDP port (what peers pass as ``holder``)."""
        host, port = self.info["udp"]
        return f"{host}:{port}"

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM the agent (by its PID) and wait; SIGKILL if it does not exit in time. Returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def log(self) -> str:
        """What the agent logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def spawn_agent(workdir: Path, *args: str, ready_timeout: float = 30.0) -> AgentProcess:
    """Start ``python -m hostagent.cli`` with ``args`` (ports 0 unless given) and wait until it is ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"agent-{time.monotonic_ns()}.ready"
    log_path = ready.with_suffix(".log")
    argv = [sys.executable, "-m", "hostagent.cli", "--ready-file", str(ready), "--log-file", str(log_path)]
    if "--udp-port" not in args:
        argv += ["--udp-port", "0"]
    if "--api-port" not in args:
        argv += ["--api-port", "0"]
    proc = subprocess.Popen([*argv, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=log_path.with_suffix(".err").open("wb"))
    deadline = time.monotonic() + ready_timeout
    while not ready.exists():
        if proc.poll() is not None:
            err = log_path.with_suffix(".err").read_text(errors="replace").strip()
            raise RuntimeError(f"kvpool-agent exited with {proc.returncode} before it was ready: {err[-500:]}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"kvpool-agent not ready after {ready_timeout} s")
        time.sleep(0.05)
    return AgentProcess(proc, json.loads(ready.read_text()), log_path)
