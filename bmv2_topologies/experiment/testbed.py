"""The Mininet testbed: a star, real agents in every host, the controller per mode, the replay.

A star in Mininet (one switch of the chosen target, the holder ``h0`` behind a shaped
bottleneck link, ``N`` inference hosts), a ``kvpool-agent`` in every host reached through
a Unix socket, and, per mode, a controller in this process that gives the switch a fresh
pipeline and programs it for that mode. ``run_demo`` is ``kvpool demo`` from a validated
configuration to its table, JSON and plot.

Only what the testbed started is stopped, by PID; it never runs Mininet's global cleanup.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import Progress

from bmv2_topologies.experiment.capture import HOLDER_LINK, LinkCapture, link_bytes, peak_gets
from bmv2_topologies.experiment.config import DemoConfig
from bmv2_topologies.experiment.report import ModeResult, demo_plot, demo_table
from bmv2_topologies.experiment.workload import Request, Workload, build_workload
from bmv2_topologies.network import EmulatedNetwork, NetworkError, default_target, mininet_available
from controller.daemon import (
    Catalog,
    ChunkInfo,
    Controller,
    ControllerSettings,
    HolderPushClient,
    Mode,
    SwitchEndpoint,
)
from controller.fabric import FabricSettings
from hostagent.client import AgentClient
from kvpool import auth, wire
from kvpool import contract as n
from kvpool.auth import Token
from kvpool.contract import CoalesceStat, PoolStat
from kvpool.httpjson import ApiError
from kvpool.topology import Host, Topology, star

log = logging.getLogger("kvpool.demo")

SINK_ADDRESS = "10.0.0.254"
SINK_MAC = "02:00:00:00:00:fe"
"""The controller's fill sink: pushed DATA is addressed here and dropped past the switch."""


def fresh_network(run_dir: Path, topo: Topology, target: str | None) -> EmulatedNetwork:
    """An emptied ``run_dir`` and a network (not started yet) on ``topo`` whose hosts know the sink."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    return EmulatedNetwork(topo, target, log_dir=run_dir, extra_neighbours={SINK_ADDRESS: SINK_MAC})


def reap(procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait for ``procs`` (already asked to end) for up to 10 s each, kill any still running; empty the list."""
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    procs.clear()


#: Extra services on the holder host, started before its agent: a context manager that
#: yields the holder agent's extra flags (a backend it fronts, say) and stops them on exit.
HolderBackend = Callable[["Testbed"], AbstractContextManager[list[str]]]
#: What ``Testbed.run_mode`` runs instead of replaying the stream: (result, progress callback).
Replay = Callable[[ModeResult, Callable[[], None] | None], None]


class StarHosts:
    """Where a star's agents are reached: the hosts of ``topo``, their API sockets under ``run_dir``."""

    topo: Topology
    run_dir: Path

    def api(self, host: str) -> str:
        """The agent API of ``host`` (a Unix socket: reachable from the root namespace)."""
        return f"unix:{(self.run_dir / f'{host}.sock').resolve()}"

    @property
    def holder(self) -> Host:
        """The holder host (``h0``)."""
        return self.topo.holders()[0]

    def requesters(self) -> list[Host]:
        """Inference hosts in requester order (h1, h2, ...)."""
        return sorted(self.topo.inference_hosts(), key=lambda h: int(h.name[1:]))


class Testbed(StarHosts):
    """One network, agents in every host, the controller reprogrammed per mode."""

    def __init__(self, cfg: DemoConfig, workload: Workload) -> None:
        self.cfg = cfg
        self.workload = workload
        self.run_dir = cfg.out / "run"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.net: EmulatedNetwork | None = None
        self.topo: Topology = star(cfg.requesters, holder_mbps=cfg.holder_mbps, host_mbps=cfg.host_mbps)
        self.capture: LinkCapture | None = None
        self.token: Token | None = None
        """The operator's token (made if missing): the agents check it, the clients here send it."""

    # -------------------------------------------------------------- lifecycle
    @contextlib.contextmanager
    def running(self, holder_backend: HolderBackend | None = None) -> Iterator[Testbed]:
        """Build the network, start ``holder_backend`` and the agents; stop everything (by PID) on the way out."""
        self.token = auth.load_or_create()
        self.net = fresh_network(self.run_dir, self.topo, self.cfg.target)
        try:
            self.net.start()
            for sw in self.net.switches:
                self.net.set_impairment(sw, self.cfg.impair)
            with contextlib.ExitStack() as stack:  # unwinds in reverse: capture, agents, backend
                holder_args = stack.enter_context(holder_backend(self)) if holder_backend is not None else []
                stack.enter_context(self._agents(holder_args))
                # One capture of the holder link for the whole run; each mode reads its time window.
                self.capture = stack.enter_context(LinkCapture(self.run_dir / "holder_link.pcap", HOLDER_LINK))
                yield self
        finally:
            self.capture = None
            self.net.stop()

    def popen(self, host: str, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``args`` inside ``host``'s namespace; the caller ends it by PID."""
        if self.net is None:
            raise RuntimeError("the testbed is not running")
        return self.net.popen(host, args, **kwargs)

    @contextlib.contextmanager
    def _agents(self, holder_args: list[str]) -> Iterator[None]:
        exe = [sys.executable, "-m", "hostagent.cli"]
        # The holder paces to its link (as a real holder paces to its NIC), with a shallow
        # bucket: an unpaced burst would overflow the shaped link's queue and turn into
        # retransmissions, and answers sent before the other requesters' GETs arrive could
        # not be coalesced. Requesters keep
        # few fragments in flight so the holder's queue, and so the time a GET waits for its
        # answer, stays well under the retransmit timeout and the switch's pending timeout.
        rate = self.cfg.holder_mbps * 1e6 / 8 * 0.9
        # Everything every requester may have asked for can sit in the holder's queue at
        # once (plain forwarding, all asking at the same moment): re-asking before that
        # queue drains would only duplicate it, so the retransmit timeout covers it twice.
        queue_s = self.cfg.requesters * self.cfg.window * wire.DATA_DATAGRAM_LEN / rate
        rto = max(1.0, 2 * queue_s)
        assert self.token is not None  # running() loads it first
        try:
            for h in self.topo.hosts.values():
                args = [*exe, "--host", h.address, "--api-socket", str((self.run_dir / f"{h.name}.sock").resolve()),
                        "--token-file", str(self.token.path),
                        "--ready-file", str(self.run_dir / f"{h.name}.ready"),
                        "--log-file", str(self.run_dir / f"{h.name}.agent.log"),
                        "--single-gets", "--window", str(self.cfg.window), "--max-inflight", str(self.cfg.window),
                        "--retransmit-timeout", f"{rto:.2f}", "--give-up", f"{max(20.0, 3 * rto):.2f}",
                        # The star's hosts are the requesters a holder answers (no directory here).
                        *(f"--allow={o.address}" for o in self.topo.hosts.values() if o.name != h.name)]
                if h.role == "holder":
                    args += ["--rate", str(int(rate)), "--burst", str(2 * wire.DATA_DATAGRAM_LEN),
                             "--hold", str(self.cfg.hold_ms / 1000), *holder_args]
                self.procs.append(self.popen(h.name, args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 60
            for h in self.topo.hosts.values():
                ready = self.run_dir / f"{h.name}.ready"
                while not (ready.exists() and ready.read_text().strip()):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"agent on {h.name} did not start (log: {self.run_dir / h.name}.agent.log)")
                    time.sleep(0.1)
            yield
        finally:
            self._stop_agents()

    def _stop_agents(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        reap(self.procs)

    # -------------------------------------------------------------- one mode
    def run_mode(self, mode: str, progress: Callable[[], None] | None = None,
                 replay: Replay | None = None) -> ModeResult:
        """Program the switch for ``mode``, replay the stream (or run ``replay``), measure."""
        if self.net is None:
            raise RuntimeError("the testbed is not running")
        wl, cfg = self.workload, self.cfg
        holder = self.holder
        hc = AgentClient(self.api(holder.name), timeout=120)
        keys = list(wl.blobs)
        hc.publish_chunks(keys, [wl.blobs[k] for k in keys])
        catalog = Catalog(ChunkInfo(k, wl.parents[k], wl.positions[k], len(wl.blobs[k])) for k in keys)
        # Pending GETs must outlive the holder's queueing delay, or duplicates arriving after
        # the timeout go upstream again; 2 s is far above it and still frees a lost answer's slot.
        fabric = FabricSettings(popularity_threshold=max(2, cfg.requesters // 2), pending_timeout_us=2_000_000)
        # adopt=False: each mode starts from an empty pool (a fresh pipeline below), not the last mode's.
        settings = ControllerSettings(mode=Mode(mode), fabric=fabric, epoch_s=0.1, adopt=False)
        endpoints = [SwitchEndpoint(s.name, s.grpc_addr, s.device_id) for s in self.net.switches.values()]
        filler = HolderPushClient(self.api(holder.name), fabric.fill_sink,
                                  token=self.token.value if self.token is not None else None)
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
            before = link_bytes(HOLDER_LINK)
            t0, wall0 = time.monotonic(), time.time()
            try:
                (replay or self._replay)(result, progress)
                time.sleep(0.3)  # stragglers (pushes, late replicas) belong to this mode
            finally:
                stop.set()
                loop.join(timeout=10)
            result.seconds = time.monotonic() - t0
            result.holder_bytes = link_bytes(HOLDER_LINK) - before
            result.window = (wall0, time.time())
            if self.capture is not None and self.capture.path.exists():
                result.pcap = self.capture.path
                result.peak_incast = peak_gets(result.pcap, holder.address, result.window)
            result.admitted = sum(len(r.admitted) for r in ctl.reports)
            result.switch_served, result.coalesced, result.collisions = switch_counters(ctl)
        result.fragments = wl.fragments
        return result

    def _replay(self, result: ModeResult, progress: Callable[[], None] | None) -> None:
        wl, cfg = self.workload, self.cfg
        holder = self.holder
        hosts = self.requesters()
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
                keys, blobs, stopped = client.fetch_chunks(list(req.keys), f"{holder.address}:{wire.KVPOOL_UDP_PORT}",
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


def switch_counters(ctl: Controller) -> tuple[int, int, int]:
    """Fragments the switches served from memory, GETs they absorbed, and pending-slot collisions."""
    served = coalesced = collisions = 0
    for sw in ctl.switches.values():
        served += sw.read_counter(n.POOL_STATS, PoolStat.HIT)[PoolStat.HIT].packets
        coal = sw.read_counter(n.COALESCE_STATS)
        coalesced += coal[CoalesceStat.ABSORBED].packets
        collisions += coal[CoalesceStat.COLLISION].packets
    return served, coalesced, collisions


# ---------------------------------------------------------------------------------- kvpool demo
def run_demo(cfg: DemoConfig, print_json: bool = False) -> int:
    """``kvpool demo`` for a validated ``cfg``: every mode on one network; 0 when every chunk was bit-identical."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
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
    bed = Testbed(cfg, workload)
    try:
        with bed.running(), Progress(transient=True) as bar:
            for mode in cfg.modes:
                task = bar.add_task(f"{mode:9s}", total=len(workload.requests))
                results.append(bed.run_mode(mode, functools.partial(bar.advance, task)))
    except (NetworkError, RuntimeError, OSError) as exc:
        print(f"kvpool demo: {exc}", file=sys.stderr)
        return 1
    text = demo_table(results)
    print(text)
    summary = {r.mode: r.summary() for r in results}
    doc = {"target": cfg.target, "requesters": cfg.requesters, "config": _jsonable(asdict(cfg)), **summary}
    (cfg.out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (cfg.out / "results.txt").write_text(text + "\n")
    demo_plot(results, cfg.out / "demo.png")
    print(f"kvpool demo: results and plot in {cfg.out}/ (results.json, results.txt, demo.png)", file=sys.stderr)
    if print_json:
        print(json.dumps(doc))
    return 0 if all(r.failed == 0 for r in results) else 1


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
