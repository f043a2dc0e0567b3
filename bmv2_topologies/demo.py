"""``kvpool demo``: the end-to-end experiment a new user runs first.

A star in Mininet (one switch of the chosen target, the holder ``h0`` behind a shaped
bottleneck link, ``N`` inference hosts), real ``kvpool-agent`` daemons in every host, the
controller in this process, and one request stream replayed three ways on the same
network:

* ``plain``: the switch only forwards (routes, no waiter ids): every requester's GETs
  reach the holder, which sends every fragment once per requester;
* ``multicast``: coalescing on: duplicate GETs are absorbed in the switch and the one
  answer is replicated to every waiter;
* ``pool``: coalescing plus the switch pool: the controller admits chunks the switch
  reports hot, the holder pushes them through the switch (fill on pass), and later GETs
  are answered by the switch itself.

The stream is the project's synthetic generator by default: waves in which every
requester asks at the same moment for a shared hot prefix (a system prompt), followed by
``--tail-blocks`` blocks of its own (none by default); ``--trace`` replays a
Mooncake-format file instead. Each requester
checks every chunk it receives against the holder's bytes (bit-identical or the run
fails). Between modes the switch gets a fresh pipeline (empty tables and registers).

Measured per mode: time to deliver each request's prefix (p50/p99), bytes on the
holder's link (both directions, from the switch port's counters), the fraction of
fragments the switch served, and the incast degree at the holder: the most GETs for one
fragment that reached it within 100 ms (from a capture of the holder link).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("kvpool.demo")

MODES = ("plain", "multicast", "pool")
MODEL_ID = "kvpool-demo/qwen2.5-0.5b-geometry"
SINK_MAC = "02:00:00:00:00:fe"
INCAST_WINDOW_S = 0.1
"""Seconds within which GETs for the same fragment count as concurrent (the pending timeout)."""


# ---------------------------------------------------------------------------------- config
@dataclass
class DemoConfig:
    """Everything one demo run needs (the CLI flags)."""

    requesters: int = 8
    target: str | None = None
    modes: tuple[str, ...] = MODES
    trace: Path | None = None
    max_requests: int = 64
    time_scale: float = 1.0
    waves: int = 4
    hot_blocks: int = 4
    tail_blocks: int = 0
    wave_gap_ms: float = 6000.0
    block_tokens: int = 16
    layers: int = 24
    kv_heads: int = 2
    head_dim: int = 64
    holder_mbps: float = 10.0
    host_mbps: float = 1000.0
    out: Path = Path("results/demo")
    seed: int = 0
    fetch_timeout_s: float = 60.0
    window: int = 600
    """Fragments each requester keeps in flight (single-fragment GETs): enough for the whole
    hot prefix, so every requester asks for all of it at once, as an engine fetching a prefix does."""
    hold_ms: float = 100.0
    """How long the holder waits before answering a GET (``kvpool-agent --hold``)."""

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """One chunk: [layers, 2 (K and V), kv_heads, block_tokens, head_dim], fp16."""
        return (self.layers, 2, self.kv_heads, self.block_tokens, self.head_dim)

    def validate(self) -> None:
        """Raise ValueError naming the first nonsensical option."""
        checks = {
            "requesters": 1 <= self.requesters <= 16,
            "waves": self.waves >= 1,
            "hot_blocks": self.hot_blocks >= 1,
            "tail_blocks": self.tail_blocks >= 0,
            "wave_gap_ms": self.wave_gap_ms > 0,
            "block_tokens": self.block_tokens >= 1,
            "holder_mbps": self.holder_mbps > 0,
            "host_mbps": self.host_mbps > 0,
            "max_requests": self.max_requests >= 1,
            "time_scale": self.time_scale > 0,
            "window": 1 <= self.window <= 4096,
            "hold_ms": 0 <= self.hold_ms <= 1000,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')}: invalid value {getattr(self, name)!r}")
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")


# ---------------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class Request:
    """One replayed request: when (s after start), which requester, which chunks (prefix order)."""

    at_s: float
    requester: int
    keys: tuple[int, ...]


@dataclass
class Workload:
    """The stream, the chunks the holder serves, and what the controller's catalog says of them."""

    requests: list[Request]
    blobs: dict[int, bytes]
    parents: dict[int, int | None]
    positions: dict[int, int]

    @property
    def fragments(self) -> int:
        """Fragments all requests fetch together."""
        from kvpool import wire

        return sum(wire.fragment_count(len(self.blobs[k])) for r in self.requests for k in r.keys)


def wave_trace(cfg: DemoConfig) -> Any:
    """The default stream (Mooncake format): waves where every requester wants the hot prefix at once.

    Hot prefix blocks are ids 0..hot_blocks-1; each request then has ``tail_blocks`` ids
    of its own (0 by default), so only the prefix is shared, as with a common system prompt.
    """
    from kvpool.trace import Trace, TraceRequest

    reqs: list[TraceRequest] = []
    next_id = cfg.hot_blocks
    for w in range(cfg.waves):
        for _ in range(cfg.requesters):
            tail = tuple(range(next_id, next_id + cfg.tail_blocks))
            next_id += cfg.tail_blocks
            n_blocks = cfg.hot_blocks + cfg.tail_blocks
            reqs.append(TraceRequest(w * cfg.wave_gap_ms, n_blocks * cfg.block_tokens, 16,
                                     tuple(range(cfg.hot_blocks)) + tail))
    return Trace.from_requests(reqs)


def build_workload(cfg: DemoConfig) -> Workload:
    """Chunk keys, KV bytes and replay schedule for the stream (synthetic or ``--trace``)."""
    import torch

    from hostagent.chunking import ROOT_KEY, block_key
    from hostagent.serialize import serialize
    from kvpool.trace import read_jsonl

    trace = read_jsonl(cfg.trace) if cfg.trace is not None else wave_trace(cfg)
    n = min(len(trace), cfg.max_requests) if cfg.trace is not None else len(trace)
    if n == 0:
        raise ValueError("the trace has no requests")
    t0 = float(trace.timestamps[0])
    keys_of: dict[tuple[int, ...], int] = {}
    blobs: dict[int, bytes] = {}
    parents: dict[int, int | None] = {}
    positions: dict[int, int] = {}
    requests: list[Request] = []
    gen = torch.Generator().manual_seed(cfg.seed)
    for i in range(n):
        req = trace[i]
        keys: list[int] = []
        parent = ROOT_KEY
        for pos in range(len(req.hash_ids)):
            path = req.hash_ids[: pos + 1]
            key = keys_of.get(path)
            if key is None:
                # Token ids stand in for the block's text: the key chain is the real one.
                hid = path[-1]
                tokens = [(hid * cfg.block_tokens + j) % 151_936 for j in range(cfg.block_tokens)]
                key = block_key(MODEL_ID, parent, tokens)
                keys_of[path] = key
                kv = torch.randn(cfg.chunk_shape, generator=gen, dtype=torch.float32).to(torch.float16)
                blobs[key] = bytes(serialize(kv))
                parents[key] = None if pos == 0 else parent
                positions[key] = pos
            keys.append(key)
            parent = key
        at = (float(trace.timestamps[i]) - t0) / 1000.0 / cfg.time_scale
        requests.append(Request(at, i % cfg.requesters, tuple(keys)))
    return Workload(requests, blobs, parents, positions)


# ---------------------------------------------------------------------------------- results
def percentile(values: list[float], q: float) -> float:
    """The q-th percentile of ``values``, nearest rank (NaN when empty)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


@dataclass
class ModeResult:
    """What one mode measured."""

    mode: str
    requests: int = 0
    failed: int = 0
    deliver_ms: list[float] = field(default_factory=list)
    holder_bytes: int = 0
    fragments: int = 0
    switch_served: int = 0
    coalesced: int = 0
    collisions: int = 0
    admitted: int = 0
    peak_incast: int = 0
    seconds: float = 0.0
    pcap: Path | None = None
    """Capture of the holder link (kvpool headers); this mode's packets are those in ``window``."""
    window: tuple[float, float] = (0.0, 0.0)

    def percentile(self, q: float) -> float:
        """The q-th percentile of delivery times (ms), nearest rank."""
        return percentile(self.deliver_ms, q)

    def summary(self) -> dict[str, Any]:
        """The per-mode JSON object (``kvpool demo --json``)."""
        return {
            "holder_bytes": self.holder_bytes,
            "deliver_p50_ms": round(self.percentile(50), 2),
            "deliver_p99_ms": round(self.percentile(99), 2),
            "switch_served_fraction": round(self.switch_served / self.fragments, 4) if self.fragments else 0.0,
            "peak_concurrent_gets_at_holder": self.peak_incast,
            "requests": self.requests,
            "failed": self.failed,
            "coalesced_gets": self.coalesced,
            "pending_collisions": self.collisions,
            "chunks_admitted": self.admitted,
            "seconds": round(self.seconds, 2),
        }


# ---------------------------------------------------------------------------------- the run
class Demo:
    """One network, agents in every host, the controller reprogrammed per mode."""

    def __init__(self, cfg: DemoConfig, workload: Workload) -> None:
        self.cfg = cfg
        self.workload = workload
        self.run_dir = cfg.out / "run"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.net: Any = None
        self.topo: Any = None
        self.capture: LinkCapture | None = None
        self.holder_args: list[str] = []
        """Extra ``kvpool-agent`` flags for the holder (a backend, say)."""

    # -------------------------------------------------------------- lifecycle
    @contextlib.contextmanager
    def running(self) -> Iterator[Demo]:
        """Build the network and start the agents; stop everything (by PID) on the way out."""
        from bmv2_topologies.network import EmulatedNetwork
        from kvpool.topology import star

        cfg = self.cfg
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True)
        self.topo = star(cfg.requesters, holder_mbps=cfg.holder_mbps, host_mbps=cfg.host_mbps)
        self.net = EmulatedNetwork(self.topo, cfg.target, log_dir=self.run_dir,
                                   extra_neighbours={"10.0.0.254": SINK_MAC})
        try:
            self.net.start()
            self._start_agents()
            # One capture of the holder link for the whole run; each mode reads its time window.
            with LinkCapture(self.run_dir / "holder_link.pcap", "s1-eth1") as capture:
                self.capture = capture
                yield self
        finally:
            self._stop_agents()
            self.net.stop()

    def api(self, host: str) -> str:
        """The agent API of ``host`` (a Unix socket: reachable from the root namespace)."""
        return f"unix:{(self.run_dir / f'{host}.sock').resolve()}"

    def _start_agents(self) -> None:
        exe = [sys.executable, "-m", "hostagent.cli"]
        # The holder paces to its link (as a real holder paces to its NIC), with a shallow
        # bucket: an unpaced burst would overflow the shaped link's queue and turn into
        # retransmissions, and answers sent before the other requesters' GETs arrive could
        # not be coalesced. Requesters keep
        # few fragments in flight so the holder's queue, and so the time a GET waits for its
        # answer, stays well under the retransmit timeout and the switch's pending timeout.
        from kvpool import wire

        rate = self.cfg.holder_mbps * 1e6 / 8 * 0.9
        holder_rate = str(int(rate))
        # Everything every requester may have asked for can sit in the holder's queue at
        # once (plain forwarding, all asking at the same moment): re-asking before that
        # queue drains would only duplicate it, so the retransmit timeout covers it twice.
        queue_s = self.cfg.requesters * self.cfg.window * wire.DATA_DATAGRAM_LEN / rate
        rto = max(1.0, 2 * queue_s)
        for h in self.topo.hosts.values():
            args = [*exe, "--host", h.address, "--api-socket", str((self.run_dir / f"{h.name}.sock").resolve()),
                    "--ready-file", str(self.run_dir / f"{h.name}.ready"),
                    "--log-file", str(self.run_dir / f"{h.name}.agent.log"),
                    "--single-gets", "--window", str(self.cfg.window), "--max-inflight", str(self.cfg.window),
                    "--retransmit-timeout", f"{rto:.2f}", "--give-up", f"{max(20.0, 3 * rto):.2f}"]
            if h.role == "holder":
                args += ["--rate", holder_rate, "--burst", str(2 * wire.DATA_DATAGRAM_LEN),
                         "--hold", str(self.cfg.hold_ms / 1000), *self.holder_args]
            self.procs.append(self.net.popen(h.name, args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        for h in self.topo.hosts.values():
            ready = self.run_dir / f"{h.name}.ready"
            while not (ready.exists() and ready.read_text().strip()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agent on {h.name} did not start (log: {self.run_dir / h.name}.agent.log)")
                time.sleep(0.1)

    def _stop_agents(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()

    # -------------------------------------------------------------- one mode
    def run_mode(self, mode: str, progress: Any = None,
                 replay: Callable[[ModeResult, Any], None] | None = None) -> ModeResult:
        """Program the switch for ``mode``, replay the stream (or run ``replay``), measure."""
        from controller.daemon import Catalog, ChunkInfo, Controller, ControllerSettings, HolderPushClient, Mode
        from controller.daemon import SwitchEndpoint as Endpoint
        from controller.fabric import FabricSettings
        from hostagent.client import AgentClient

        wl, cfg = self.workload, self.cfg
        holder = self.topo.holders()[0]
        hc = AgentClient(self.api(holder.name), timeout=120)
        keys = list(wl.blobs)
        hc.publish_chunks(keys, [wl.blobs[k] for k in keys])
        catalog = Catalog(ChunkInfo(k, wl.parents[k], wl.positions[k], len(wl.blobs[k])) for k in keys)
        # Pending GETs must outlive the holder's queueing delay, or duplicates arriving after
        # the timeout go upstream again; 2 s is far above it and still frees a lost answer's slot.
        fabric = FabricSettings(popularity_threshold=max(2, cfg.requesters // 2), pending_timeout_us=2_000_000)
        settings = ControllerSettings(mode=Mode(mode), fabric=fabric, epoch_s=0.1)
        endpoints = [Endpoint(s.name, s.grpc_addr, s.device_id) for s in self.net.switches.values()]
        filler = HolderPushClient(self.api(holder.name), fabric.fill_sink)
        ctl = Controller(self.topo, endpoints, settings, catalog, filler if mode == "pool" else None)
        result = ModeResult(mode)
        stop = threading.Event()
        with ctl:
            for sw in ctl.switches.values():
                # A clean slate: registers and counters of the last mode are gone; the driver
                # replays this controller's intended entries onto the fresh pipeline.
                sw.push_pipeline()
            loop = threading.Thread(target=ctl.run, args=(stop,), name="controller-epochs", daemon=True)
            loop.start()
            before = _link_bytes("s1-eth1")
            t0, wall0 = time.monotonic(), time.time()
            try:
                (replay or self._replay)(result, progress)
                time.sleep(0.3)  # stragglers (pushes, late replicas) belong to this mode
            finally:
                stop.set()
                loop.join(timeout=10)
            result.seconds = time.monotonic() - t0
            result.holder_bytes = _link_bytes("s1-eth1") - before
            result.window = (wall0, time.time())
            if self.capture is not None and self.capture.path.exists():
                result.pcap = self.capture.path
                result.peak_incast = peak_gets(result.pcap, holder.address, result.window)
            result.admitted = sum(len(r.admitted) for r in ctl.reports)
            result.switch_served, result.coalesced, result.collisions = _switch_counters(ctl)
        result.fragments = wl.fragments
        return result

    def _replay(self, result: ModeResult, progress: Any) -> None:
        from hostagent.client import AgentClient
        from kvpool.httpjson import ApiError

        wl, cfg = self.workload, self.cfg
        holder = self.topo.holders()[0]
        hosts = [h for h in self.topo.inference_hosts()]
        hosts.sort(key=lambda h: int(h.name[1:]))
        lock = threading.Lock()
        start = time.monotonic() + 0.5

        def one(req: Request) -> None:
            client = AgentClient(self.api(hosts[req.requester].name), timeout=cfg.fetch_timeout_s + 5)
            delay = start + req.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = time.monotonic()
            error = None
            try:
                # local=False: the requester neither answers from nor keeps a local copy, so
                # every request crosses the network, as on a node whose HBM has moved on.
                keys, blobs, stopped = client.fetch_chunks(list(req.keys), f"{holder.address}:7470",
                                                           timeout=cfg.fetch_timeout_s, local=False)
                elapsed = (time.monotonic() - t) * 1000
                for key, blob in zip(keys, blobs, strict=True):
                    if blob != wl.blobs[key]:
                        error = f"chunk {key:#x} differs from the holder's bytes"
                if len(keys) != len(req.keys):
                    error = f"got {len(keys)} of {len(req.keys)} chunks ({stopped})"
            except ApiError as exc:
                error, elapsed = str(exc), float("nan")
            with lock:
                result.requests += 1
                if error is None:
                    result.deliver_ms.append(elapsed)
                else:
                    result.failed += 1
                    log.error("%s: request for %d chunks failed: %s", hosts[req.requester].name, len(req.keys), error)
                if progress is not None:
                    progress()

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in wl.requests]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


# ---------------------------------------------------------------------------------- measurement helpers
def _link_bytes(intf: str) -> int:
    base = Path("/sys/class/net") / intf / "statistics"
    return int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())


def _switch_counters(ctl: Any) -> tuple[int, int, int]:
    """Fragments the switches served from memory, GETs they absorbed, and pending-slot collisions."""
    from kvpool import contract as n
    from kvpool.contract import CoalesceStat, PoolStat

    served = coalesced = collisions = 0
    for sw in ctl.switches.values():
        served += sw.read_counter(n.POOL_STATS, PoolStat.HIT)[PoolStat.HIT].packets
        coal = sw.read_counter(n.COALESCE_STATS)
        coalesced += coal[CoalesceStat.ABSORBED].packets
        collisions += coal[CoalesceStat.COLLISION].packets
    return served, coalesced, collisions


class LinkCapture:
    """tcpdump on the holder's link (headers only, every packet flushed) while the demo runs."""

    def __init__(self, path: Path, intf: str) -> None:
        self.path = path
        self.intf = intf
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LinkCapture:
        if shutil.which("tcpdump"):
            # --immediate-mode: otherwise libpcap hands packets over in blocks, up to a second
            # late, and a mode read right after it ends would miss its last packets. The parser
            # below picks the kvpool frames out of the headers-only capture.
            self.proc = subprocess.Popen(["tcpdump", "--immediate-mode", "-i", self.intf, "-s", "96", "-U", "-w",
                                          str(self.path)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # tcpdump says "listening on ..." once it captures; nothing before that is seen.
            assert self.proc.stderr is not None
            line = self.proc.stderr.readline()
            if b"listening on" not in line:
                raise RuntimeError(f"tcpdump on {self.intf} did not start: {line.decode(errors='replace').strip()}")
            threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # never block tcpdump
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            time.sleep(0.2)
            self.proc.terminate()
            self.proc.wait(timeout=10)


def peak_gets(pcap: Path, holder_ip: str, window: tuple[float, float]) -> int:
    """Incast degree: most GETs for one fragment that reached the holder within one pending window.

    Without coalescing every requester's GET for a hot fragment reaches the holder (N of
    them); with it, the switch lets one through per outstanding fragment.
    """
    holder = bytes(int(x) for x in holder_ip.split("."))
    first_seen: dict[bytes, tuple[float, int]] = {}
    peak = 0
    for ts, frame in _pcap_frames(pcap):
        if not window[0] <= ts <= window[1]:
            continue
        if len(frame) < 14 + 20 + 8 + 16 or frame[12:14] != b"\x08\x00" or frame[30:34] != holder:
            continue
        kv = 14 + (frame[14] & 0x0F) * 4 + 8
        if len(frame) < kv + 16 or frame[kv + 1] != 1:  # opcode GET
            continue
        fragment = frame[kv + 4:kv + 14]  # chunk key and fragment index
        start, count = first_seen.get(fragment, (ts, 0))
        if ts - start > INCAST_WINDOW_S:
            start, count = ts, 0
        first_seen[fragment] = (start, count + 1)
        peak = max(peak, count + 1)
    return peak


@dataclass
class HolderTraffic:
    """kvpool packets on the holder link: GETs it received, DATA it sent (per fragment and destination)."""

    gets_in: int = 0
    data_out: dict[tuple[int, int, str], int] = field(default_factory=dict)


def holder_traffic(pcap: Path, holder_ip: str, window: tuple[float, float]) -> HolderTraffic:
    """Count the GETs that reached the holder and the DATA it sent within ``window`` (wall clock)."""
    from kvpool import wire

    holder = bytes(int(x) for x in holder_ip.split("."))
    out = HolderTraffic()
    for ts, frame in _pcap_frames(pcap):
        if not window[0] <= ts <= window[1]:
            continue
        if len(frame) < 14 + 20 + 8 + wire.HEADER_LEN or frame[12:14] != b"\x08\x00":
            continue
        kv = 14 + (frame[14] & 0x0F) * 4 + 8
        hdr = wire.unpack_header(frame[kv:kv + wire.HEADER_LEN])
        if hdr.opcode == wire.Opcode.GET and frame[30:34] == holder:
            out.gets_in += 1
        elif hdr.opcode == wire.Opcode.DATA and frame[26:30] == holder:
            dst = ".".join(str(b) for b in frame[30:34])
            k = (hdr.chunk_key, hdr.frag_index, dst)
            out.data_out[k] = out.data_out.get(k, 0) + 1
    return out


def _pcap_frames(path: Path) -> Iterator[tuple[float, bytes]]:
    data = path.read_bytes()
    if len(data) < 24:
        return
    magic = struct.unpack_from("<I", data)[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    nano = magic in (0xA1B23C4D, 0x4D3CB2A1)
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack_from(endian + "IIII", data, off)
        off += 16
        yield sec + frac / (1e9 if nano else 1e6), data[off:off + incl]
        off += incl


# ---------------------------------------------------------------------------------- output
def table(results: list[ModeResult]) -> str:
    """The results as a plain-text table."""
    rows = [("mode", "deliver p50 ms", "deliver p99 ms", "holder MB", "vs plain", "switch-served", "peak incast",
             "failed")]
    plain = next((r for r in results if r.mode == "plain"), None)
    for r in results:
        s = r.summary()
        ratio = f"{r.holder_bytes / plain.holder_bytes:.3f}" if plain and plain.holder_bytes else "-"
        rows.append((r.mode, f"{s['deliver_p50_ms']:.1f}", f"{s['deliver_p99_ms']:.1f}",
                     f"{r.holder_bytes / 1e6:.2f}", ratio, f"{s['switch_served_fraction']:.1%}",
                     str(r.peak_incast), str(r.failed)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                               strict=True)))
                     for row in rows)


def plot(results: list[ModeResult], path: Path) -> None:
    """Delivery time and holder-link bytes per mode, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [r.mode for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    x = range(len(modes))
    a.bar([i - 0.2 for i in x], [r.percentile(50) for r in results], 0.4, label="p50")
    a.bar([i + 0.2 for i in x], [r.percentile(99) for r in results], 0.4, label="p99")
    a.set_xticks(list(x), modes)
    a.set_ylabel("time to deliver a prefix (ms)")
    a.legend()
    b.bar(list(x), [r.holder_bytes / 1e6 for r in results], 0.5, color="tab:green")
    b.set_xticks(list(x), modes)
    b.set_ylabel("bytes on the holder link (MB)")
    fig.suptitle("kvpool demo: the same stream, three ways")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``kvpool demo``."""
    d = DemoConfig()
    p.add_argument("--requesters", type=int, default=d.requesters, help="inference hosts (1..16, default 8)")
    p.add_argument("--target", choices=["model", "bmv2"], help="switch target (default bmv2 if simple_switch_grpc "
                   "is on PATH, else model)")
    p.add_argument("--modes", default=",".join(d.modes), help="comma-separated subset of plain,multicast,pool")
    p.add_argument("--trace", type=Path, help="replay this Mooncake-format JSONL trace instead of the waves")
    p.add_argument("--max-requests", type=int, default=d.max_requests, help="requests taken from --trace")
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="speed-up of --trace timestamps")
    p.add_argument("--waves", type=int, default=d.waves, help="waves of the synthetic stream (default 4)")
    p.add_argument("--hot-blocks", type=int, default=d.hot_blocks, help="blocks of the shared hot prefix")
    p.add_argument("--tail-blocks", type=int, default=d.tail_blocks, help="blocks of each request's own")
    p.add_argument("--wave-gap-ms", type=float, default=d.wave_gap_ms, help="time between waves (default 6000)")
    p.add_argument("--block-tokens", type=int, default=d.block_tokens, help="tokens per chunk (default 16)")
    p.add_argument("--holder-mbps", type=float, default=d.holder_mbps, help="holder link bandwidth (bottleneck)")
    p.add_argument("--window", type=int, default=d.window, help="fragments in flight per requester (default 600)")
    p.add_argument("--hold-ms", type=float, default=d.hold_ms,
                   help="holder waits this long before answering a GET, so GETs of requesters that start a little late "
                   "are coalesced too (default 100)")
    p.add_argument("--out", type=Path, default=d.out, help="where the table, JSON, plot and logs go")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", action="store_true", help="print one JSON object last (per mode: holder_bytes, ...)")
    p.add_argument("--vs-mooncake", action="store_true",
                   help="instead: Mooncake Store alone vs kvpool plain/multicast/pool fronting it, in waves "
                   "(scripts/bench_vs_mooncake.py runs it for several N); results in OUT/vs_mooncake/")


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when every request got bit-identical chunks."""
    from rich.progress import Progress

    from bmv2_topologies.network import NetworkError, default_target, mininet_available

    if getattr(args, "vs_mooncake", False):
        from bmv2_topologies.vs_mooncake import run_from_demo

        return run_from_demo(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = DemoConfig(requesters=args.requesters, target=args.target, modes=tuple(args.modes.split(",")),
                     trace=args.trace, max_requests=args.max_requests, time_scale=args.time_scale, waves=args.waves,
                     hot_blocks=args.hot_blocks, tail_blocks=args.tail_blocks, block_tokens=args.block_tokens,
                     wave_gap_ms=args.wave_gap_ms, window=args.window, hold_ms=args.hold_ms,
                     holder_mbps=args.holder_mbps, out=args.out, seed=args.seed)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"kvpool demo: {exc}", file=sys.stderr)
        return 2
    reason = mininet_available()
    if reason:
        print(f"kvpool demo: {reason}", file=sys.stderr)
        return 1
    cfg.target = cfg.target or default_target()
    try:
        workload = build_workload(cfg)
    except (ValueError, OSError) as exc:
        print(f"kvpool demo: {exc}", file=sys.stderr)
        return 1
    cfg.out.mkdir(parents=True, exist_ok=True)
    chunk_kib = len(next(iter(workload.blobs.values()))) / 1024
    print(f"kvpool demo: target {cfg.target}, star of {cfg.requesters} requesters, holder link "
          f"{cfg.holder_mbps:g} Mbit/s, {len(workload.requests)} requests over {len(workload.blobs)} chunks of "
          f"{chunk_kib:.0f} KiB", file=sys.stderr)
    results: list[ModeResult] = []
    demo = Demo(cfg, workload)
    try:
        with demo.running(), Progress(transient=True) as bar:
            for mode in cfg.modes:
                task = bar.add_task(f"{mode:9s}", total=len(workload.requests))
                results.append(demo.run_mode(mode, lambda t=task: bar.advance(t)))
    except (NetworkError, RuntimeError, OSError) as exc:
        print(f"kvpool demo: {exc}", file=sys.stderr)
        return 1
    text = table(results)
    print(text)
    summary = {r.mode: r.summary() for r in results}
    doc = {"target": cfg.target, "requesters": cfg.requesters, "config": _jsonable(asdict(cfg)), **summary}
    (cfg.out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (cfg.out / "results.txt").write_text(text + "\n")
    plot(results, cfg.out / "demo.png")
    print(f"kvpool demo: results and plot in {cfg.out}/ (results.json, results.txt, demo.png)", file=sys.stderr)
    if args.json:
        print(json.dumps(doc))
    return 0 if all(r.failed == 0 for r in results) else 1


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}

