"""The Mininet testbed: a star or a leaf-spine, real agents in every host, the controller per mode, the replay.

A network in Mininet (switches of the chosen target; on the star one switch with the
holder ``h0`` behind a shaped bottleneck link and ``N`` inference hosts, on the leaf-spine
the holders on leaf ``s1`` behind shaped links and the requesters dealt over the other
leaves; or any topology file), a ``kvpool-agent`` in every host reached through a Unix
socket, and, per mode, a controller in this process that gives every switch a fresh
pipeline and programs it for that mode. The chunks are dealt over the holders by prefix
position; a request fetches each holder's share from it, all at once. ``run_demo`` is
``kvpool demo`` from a validated configuration to its table, JSON and plot.

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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from bmv2_topologies.experiment import load
from bmv2_topologies.experiment.backlog import BacklogSampler, backlog_warnings
from bmv2_topologies.experiment.capture import LinkCapture, fabric_links, holder_links, link_bytes, peak_gets
from bmv2_topologies.experiment.config import DemoConfig
from bmv2_topologies.experiment.observe import Observer
from bmv2_topologies.experiment.report import ModeResult, SwitchCounts, demo_plot, demo_table
from bmv2_topologies.experiment.why import TIMING_FILE, request_row, timing_document
from bmv2_topologies.experiment.workload import Request, Workload, build_workload
from bmv2_topologies.network import EmulatedNetwork, NetworkError, default_target, mininet_available
from controller.catalog import Catalog, ChunkInfo
from controller.daemon import Controller
from controller.fabric import FabricSettings, sink_addresses
from controller.hints import AgentHintClient
from controller.holder_push import HolderPushClient
from controller.policy.site import edge_switches
from controller.settings import ControllerSettings, Mode, SwitchEndpoint
from hostagent import timing as fetch_timing
from hostagent.client import AgentClient
from kvpool import auth, wire
from kvpool import contract as n
from kvpool.auth import Token
from kvpool.contract import CoalesceStat, PoolStat
from kvpool.dashboard import NO_PROMETHEUS
from kvpool.http_api import ApiError
from kvpool.report import run_info
from kvpool.topology import Host, Topology, TopologyError, leaf_spine, star
from kvpool.topology import load as load_topology

log = logging.getLogger("kvpool.demo")

SINK_ADDRESS = "10.0.0.254"
SINK_MAC = "02:00:00:00:00:fe"
"""The first switch's fill sink: pushed DATA is addressed to the holding switch's sink and dropped there
(``controller.fabric.sink_addresses``: one per switch, counting down from this one)."""


def fabric_sinks(topo: Topology) -> dict[str, str]:
    """Switch -> its fill sink address (``controller.fabric.sink_addresses`` from this testbed's first sink)."""
    return sink_addresses(topo, FabricSettings(fill_sink=SINK_ADDRESS, fill_sink_mac=SINK_MAC))


def fresh_network(run_dir: Path, topo: Topology, target: str | None, metrics: bool = False) -> EmulatedNetwork:
    """An emptied ``run_dir`` and a network (not started yet) on ``topo`` whose hosts know every switch's sink
    (``metrics``: model switches serve their own ``/metrics``)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    return EmulatedNetwork(topo, target, log_dir=run_dir,
                           extra_neighbours=dict.fromkeys(fabric_sinks(topo).values(), SINK_MAC), metrics=metrics)


def reap(procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait for ``procs`` (already asked to end) for up to 10 s each, kill any still running; empty the list."""
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    procs.clear()


#: Extra services on the holder hosts, started before their agents: a context manager that
#: yields each holder agent's extra flags (a backend it fronts, say) and stops them on exit.
HolderBackend = Callable[["Testbed"], AbstractContextManager[dict[str, list[str]]]]
#: What ``Testbed.run_mode`` runs instead of replaying the stream: (result, progress callback).
Replay = Callable[[ModeResult, Callable[[], None] | None], None]


def build_topology(cfg: DemoConfig) -> Topology:
    """The network ``cfg`` names: a generated star or leaf-spine, or a topology file (TopologyError if bad)."""
    path = cfg.topology_file
    if path is not None:
        return load_topology(path)
    if cfg.topology == "leaf-spine":
        return leaf_spine(cfg.leaves, cfg.spines, cfg.requesters, cfg.holder_count, holder_mbps=cfg.holder_mbps,
                          host_mbps=cfg.host_mbps, fabric_mbps=cfg.fabric_mbps)
    return star(cfg.requesters, holder_mbps=cfg.holder_mbps, host_mbps=cfg.host_mbps, holders=cfg.holder_count)


class StarHosts:
    """Where a network's agents are reached: the hosts of ``topo``, their API sockets under ``run_dir``."""

    topo: Topology
    run_dir: Path

    def api(self, host: str) -> str:
        """The agent API of ``host`` (a Unix socket: reachable from the root namespace)."""
        return f"unix:{(self.run_dir / f'{host}.sock').resolve()}"

    @property
    def holder(self) -> Host:
        """The first holder host (``h0``)."""
        return self.topo.holders()[0]

    def holder_of(self, position: int) -> Host:
        """The holder of a chunk at this position of its prefix: dealt round-robin over the holders."""
        holders = self.topo.holders()
        return holders[position % len(holders)]

    def requesters(self) -> list[Host]:
        """Inference hosts in requester order (h1, h2, ...)."""
        return sorted(self.topo.inference_hosts(), key=lambda h: int(h.name[1:]))


def wait_switches(ctl: Controller, net: EmulatedNetwork, timeout_s: float = 60.0) -> None:
    """Wait until ``ctl`` reaches every switch of ``net``; NetworkError naming one it cannot.

    A loaded machine can take a connect past the driver's own timeout; the driver then
    retries in the background, and this waits for that rather than failing the run.
    """
    deadline = time.monotonic() + timeout_s
    for name, sw in ctl.switches.items():
        if not sw.wait_connected(max(0.0, deadline - time.monotonic())):
            raise NetworkError(f"the controller cannot reach switch {name} at {sw.address} after {timeout_s:.0f} s "
                               f"({sw.health()['last_error']}); the switch is {net.switch_state(name)}")


class Testbed(StarHosts):
    """One network, agents in every host, the controller reprogrammed per mode."""

    def __init__(self, cfg: DemoConfig, workload: Workload, topo: Topology | None = None) -> None:
        """``topo``: the network, when the caller built it already (else ``build_topology(cfg)``)."""
        if cfg.target is None:
            # The network starts on the default target, and the knobs the agents get (windows)
            # must be that target's: left unresolved they were the model's, so a test on BMv2 ran
            # 600 fragments in flight into its 64-packet queues and stalled on the losses.
            cfg = replace(cfg, target=default_target())
        self.cfg = cfg
        self.workload = workload
        self.run_dir = cfg.out / "run"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.net: EmulatedNetwork | None = None
        self.topo: Topology = topo if topo is not None else build_topology(cfg)
        self.sinks = fabric_sinks(self.topo)
        self.holder_links = holder_links(self.topo)
        self.captures: dict[str, LinkCapture] = {}
        self.frames_lost: dict[str, int] = {}
        """Per model switch, frames its ports lost during the last run (``EmulatedNetwork.frames_lost``)."""
        self.token: Token | None = None
        """The operator's token (made if missing): the agents check it, the clients here send it."""
        self.observer: Observer | None = None
        """Prometheus beside the run (``kvpool demo --observe``): it watches ``running`` and each mode's controller."""
        chunk_len = {k: len(v) for k, v in workload.blobs.items()}
        capacity = cfg.holder_mbps * 1e6 / 8
        # Chunks are dealt over the holders: each holder's link carries its share of every request.
        parts = load.shares(workload.requests, lambda k: self.holder_of(workload.positions[k]).name)
        #: What the replay asks of each holder's link, against its capacity (printed before a run).
        self.offered_by_holder = [load.offered_load(part, chunk_len, capacity, holder=name)
                                  for name, part in sorted(parts.items())]
        #: The busiest holder's load (the one the run's pace depends on).
        self.offered = max(self.offered_by_holder, key=lambda o: o.total_bytes,
                           default=load.offered_load([], chunk_len, capacity, holder=self.holder.name))
        self.requested_bytes = sum(o.total_bytes for o in self.offered_by_holder)
        #: Each distinct chunk once per overlapping window on its holder's link (experiment/load.py defines it).
        self.ideal_bytes = sum(load.ideal_bytes(part, chunk_len, capacity) for part in parts.values())
        #: Each replayed request's deadline: the caller's, else far beyond what the busiest holder's work implies.
        self.deadline_s = cfg.deadline_s or max(
            (load.default_deadline_s(o.total_bytes, capacity, o.span_s) for o in self.offered_by_holder),
            default=load.MIN_DEADLINE_S)
        #: How long an accepted GET waits for its answer: the holder's full queue.
        self.answer_wait_s = cfg.max_queue_ms / 1000
        #: The longest: a booked return is admitted up to twice the queue bound (hostagent/serving.py).
        self.longest_answer_s = 2 * cfg.max_queue_ms / 1000

    # -------------------------------------------------------------- lifecycle
    @contextlib.contextmanager
    def running(self, holder_backend: HolderBackend | None = None) -> Iterator[Testbed]:
        """Build the network, start ``holder_backend`` and the agents; stop everything (by PID) on the way out."""
        self.token = auth.load_or_create()
        self.net = fresh_network(self.run_dir, self.topo, self.cfg.target, metrics=self.observer is not None)
        try:
            self.net.start()
            for sw in self.net.switches:
                self.net.set_impairment(sw, self.cfg.impair)
            # Routes before anything starts: hosts that talk to each other before the first
            # mode (a Mooncake pool spread over the holder hosts) need the switches to forward.
            with self.controller("plain"):
                pass
            with contextlib.ExitStack() as stack:  # unwinds in reverse: captures, agents, backend
                holder_args = stack.enter_context(holder_backend(self)) if holder_backend is not None else {}
                stack.enter_context(self._agents(holder_args))
                if self.observer is not None:
                    stack.enter_context(self.observer.watching(
                        {h.name: (self.api(h.name), h.role) for h in self.topo.hosts.values()},
                        {n: sw.metrics_addr for n, sw in self.net.switches.items() if sw.metrics_addr}, self.token))
                # One capture per holder link for the whole run; each mode reads its time window.
                for name, intf in self.holder_links.items():
                    pcap = self.run_dir / f"holder_link_{name}.pcap"
                    self.captures[name] = stack.enter_context(LinkCapture(pcap, intf))
                yield self
        finally:
            self.captures = {}
            self.net.stop()
            self.frames_lost = self.net.frames_lost()

    def popen(self, host: str, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``args`` inside ``host``'s namespace; the caller ends it by PID."""
        if self.net is None:
            raise RuntimeError("the testbed is not running")
        return self.net.popen(host, args, **kwargs)

    @contextlib.contextmanager
    def _agents(self, holder_args: dict[str, list[str]]) -> Iterator[None]:
        exe = [sys.executable, "-m", "hostagent.cli"]
        # The holder paces to its link (as a real holder paces to its NIC), with a shallow
        # bucket: an unpaced burst would overflow the shaped link's queue and turn into
        # retransmissions, and answers sent before the other requesters' GETs arrive could
        # not be coalesced.  Its queue is bounded (--max-queue): beyond it GETs are answered
        # BUSY with a retry hint, so overload waits at the requesters, not in a queue whose
        # delay outgrows the switch's pending timeout (an absorbed GET whose slot expired is
        # never answered) and every retransmit timeout.  Requesters take the range path for
        # every chunk but those the controller's hints name (hot or pooled).
        rate = self.cfg.holder_mbps * 1e6 / 8 * 0.9
        # Re-asking sooner than an accepted GET can take to be answered would only duplicate
        # it, so the retransmit timeout covers that wait twice.
        rto = max(1.0, 2 * self.answer_wait_s)
        assert self.token is not None  # running() loads it first
        try:
            for h in self.topo.hosts.values():
                args = [*exe, "--host", h.address, "--api-socket", str((self.run_dir / f"{h.name}.sock").resolve()),
                        "--token-file", str(self.token.path),
                        "--ready-file", str(self.run_dir / f"{h.name}.ready"),
                        "--log-file", str(self.run_dir / f"{h.name}.agent.log"),
                        "--window", str(self.cfg.chunk_fragments), "--max-inflight", str(self.cfg.in_flight),
                        "--servable-window", str(self.cfg.servable_fragments),
                        # A holder answers a source up to its whole budget, not one chunk's window.
                        "--serve-window", str(self.cfg.in_flight),
                        "--retransmit-timeout", f"{rto:.2f}", "--give-up", f"{max(20.0, 3 * rto):.2f}",
                        # The testbed's hosts are the requesters a holder answers (no directory here).
                        *(f"--allow={o.address}" for o in self.topo.hosts.values() if o.name != h.name)]
                if h.role == "holder":
                    args += ["--rate", str(int(rate)), "--burst", str(2 * wire.DATA_DATAGRAM_LEN),
                             "--max-queue", str(self.cfg.max_queue_ms / 1000),
                             "--gather", str(self.cfg.gather_ms / 1000),
                             *holder_args.get(h.name, [])]
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
    def controller(self, mode: str) -> Controller:
        """A controller for ``mode`` over every switch of the running network (not started)."""
        if self.net is None:
            raise RuntimeError("the testbed is not running")
        wl = self.workload
        catalog = Catalog(ChunkInfo(k, wl.parents[k], wl.positions[k], len(wl.blobs[k])) for k in wl.blobs)
        # Pending GETs must outlive the longest wait for an answer (a booked return at twice the
        # holder's queue bound), or the waiters absorbed before the slot expired are never
        # answered; twice that is far above it and still frees a lost answer's slot soon.  Twice
        # the queue and a 100 ms hold (2.2 s) was not: replayed agent traffic at 3x the holder
        # link, 200 requests, had 529 slots expire in multicast mode, 18 at 4.2 s.
        pending_s = max(2.0, 2 * self.longest_answer_s)
        # A switch counts the fetches of its own requesters: hot when half of its busiest
        # edge switch's requesters fetch a chunk.
        busiest = max(edge_switches(self.topo).values(), default=1)
        fabric = FabricSettings(popularity_threshold=max(2, busiest // 2), pending_timeout_us=int(pending_s * 1e6),
                                fill_sink=SINK_ADDRESS, fill_sink_mac=SINK_MAC)
        build = n.build_dir()  # KVPOOL_P4_BUILD names another build, as in the tests
        # adopt=False: each mode starts from an empty pool (a fresh pipeline), not the last mode's.
        settings = ControllerSettings(mode=Mode(mode), fabric=fabric, epoch_s=0.1, target=self.net.target,
                                      p4info=build / n.P4INFO_FILE, bmv2_json=build / n.BMV2_JSON_FILE,
                                      adopt=False, push_admitted=self.cfg.push_admitted)
        endpoints = [SwitchEndpoint(s.name, s.grpc_addr, s.device_id) for s in self.net.switches.values()]
        token = self.token.value if self.token is not None else None
        filler = HolderPushes({k: self.api(self.holder_of(wl.positions[k]).name) for k in wl.blobs},
                              SINK_ADDRESS, token)
        # Every agent hears which chunks are hot or pooled (the holders too: they hold only those).
        sinks = [AgentHintClient(self.api(h), token=token) for h in self.topo.hosts]
        return Controller(self.topo, endpoints, settings, catalog, filler if mode == "pool" else None,
                          hint_sinks=sinks)

    def run_mode(self, mode: str, progress: Callable[[], None] | None = None,
                 replay: Replay | None = None) -> ModeResult:
        """Program the switches for ``mode``, replay the stream (or run ``replay``), measure."""
        wl = self.workload
        for name, keys in self.shares(list(wl.blobs)).items():
            AgentClient(self.api(name), timeout=120).publish_chunks(keys, [wl.blobs[k] for k in keys])
        ctl = self.controller(mode)
        assert self.net is not None  # self.controller raised otherwise
        result = ModeResult(mode)
        stop = threading.Event()
        agents_before = self.agent_counters()
        waits_before = self.holder_waits()
        with ctl, (self.observer.controller(ctl) if self.observer else contextlib.nullcontext()):
            wait_switches(ctl, self.net)
            # A clean slate: registers and counters of the last mode are gone; the driver
            # replays this controller's intended entries onto the fresh pipeline.
            ctl.clean_slate()
            loop = threading.Thread(target=ctl.run, args=(stop,), name="controller-epochs", daemon=True)
            loop.start()
            links = list(self.holder_links.values())
            fabric_intfs = fabric_links(self.topo)
            before, fabric_before = link_bytes(*links), link_bytes(*fabric_intfs)
            t0, wall0 = time.monotonic(), time.time()
            backlog = BacklogSampler(self.switch_pids()).start()
            try:
                (replay or self._replay)(result, progress)
                time.sleep(0.3)  # stragglers (pushes, late replicas) belong to this mode
            finally:
                stop.set()
                loop.join(timeout=10)
                result.switch_backlog = backlog.stop()
            result.seconds = time.monotonic() - t0
            result.holder_bytes = link_bytes(*links) - before
            result.fabric_bytes = link_bytes(*fabric_intfs) - fabric_before
            result.window = (wall0, time.time())
            for name, capture in self.captures.items():
                if capture.path.exists():
                    result.pcaps[name] = capture.path
                    incast = peak_gets(capture.path, self.topo.hosts[name].address, result.window)
                    result.peak_incast = max(result.peak_incast, incast)
            result.admitted = sum(len(r.admitted) for r in ctl.reports)
            result.switches = switch_counters(ctl)
            result.switch_served = sum(c.served for c in result.switches.values())
            result.coalesced = sum(c.absorbed for c in result.switches.values())
            result.collisions = sum(c.collisions for c in result.switches.values())
            result.expired = sum(c.expired for c in result.switches.values())
        after = self.agent_counters()
        result.agents = {k: after[k] - agents_before.get(k, 0) for k in after}
        result.holder_wait = {name: fetch_timing.waits_between(waits_before.get(name), wait)
                              for name, wait in self.holder_waits().items()}
        result.holder_data_bytes = result.agents.get("holder_data_sent", 0) * load.DATA_FRAME_BYTES
        result.fragments = wl.fragments
        result.requested_bytes = self.requested_bytes
        result.ideal_bytes = load.ideal_for_mode(mode, self.requested_bytes, self.ideal_bytes)
        return result

    def switch_pids(self) -> dict[str, int]:
        """Switch name -> PID of its running process (the switches this testbed started)."""
        if self.net is None:
            return {}
        return {name: h.process.pid for name, h in self.net.switches.items()
                if h.process is not None and h.process.poll() is None}

    def shares(self, keys: list[int]) -> dict[str, list[int]]:
        """Holder name -> the keys of ``keys`` it holds, in their order (by prefix position)."""
        out: dict[str, list[int]] = {}
        for key in keys:
            out.setdefault(self.holder_of(self.workload.positions[key]).name, []).append(key)
        return out

    def fetch(self, requester: Host, keys: tuple[int, ...], timeout: float,
              timing: dict[str, Any] | None = None) -> str | None:
        """``requester`` fetches ``keys``, each holder's share from it, all shares at once; None or what went wrong.

        Every received chunk is compared with the holder's bytes.  ``timing`` (when given) gets
        where the chunks' transfer time went, summed over every share (``hostagent.timing.summarize``).
        """
        wl = self.workload
        errors: list[str] = []
        lock = threading.Lock()

        def share(holder: str, part: list[int]) -> None:
            client = AgentClient(self.api(requester.name), timeout=timeout + 5)
            try:
                # local=False: the requester neither answers from nor keeps a local copy, so
                # every request crosses the network, as on a node whose HBM has moved on.
                got, blobs, stopped, took = client.fetch_chunks_timed(
                    part, f"{self.topo.hosts[holder].address}:{wire.KVPOOL_UDP_PORT}", timeout=timeout, local=False)
            except ApiError as exc:
                errors.append(str(exc))
                return
            if timing is not None and took is not None:
                with lock:
                    merged = fetch_timing.merge(timing, took)
                    timing.clear()
                    timing.update(merged)
            errors.extend(f"chunk {k:#x} differs from the holder's bytes" for k, b in zip(got, blobs, strict=True)
                          if b != wl.blobs[k])
            if len(got) != len(part):
                errors.append(f"got {len(got)} of {len(part)} chunks from {holder} ({stopped})")

        threads = [threading.Thread(target=share, args=item, daemon=True) for item in self.shares(list(keys)).items()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return "; ".join(errors) if errors else None

    def holder_waits(self) -> dict[str, dict[str, Any]]:
        """Per holder, its transport's ``answer_wait`` so far (``hostagent.timing.AnswerWaits``; {} if it has none)."""
        return {h.name: AgentClient(self.api(h.name), timeout=30).stats()["transport"].get("answer_wait", {})
                for h in self.topo.holders()}

    def agent_counters(self) -> dict[str, int]:
        """Transport counters summed over every agent (what each mode changed is the difference)."""
        total: dict[str, int] = {}
        holders = {h.name for h in self.topo.holders()}
        for h in self.topo.hosts:
            st = AgentClient(self.api(h), timeout=30).stats()["transport"]
            for name in AGENT_COUNTERS:
                total[name] = total.get(name, 0) + int(st.get(name, 0))
            if h in holders:
                # Every DATA datagram a holder sends crosses its link (pushes included).
                total["holder_data_sent"] = total.get("holder_data_sent", 0) + int(st.get("datagrams_sent", 0))
            for path, n_req in st.get("requests_by_path", {}).items():
                total[f"requests_{path}"] = total.get(f"requests_{path}", 0) + int(n_req)
        return total

    def _replay(self, result: ModeResult, progress: Callable[[], None] | None) -> None:
        hosts = self.requesters()
        lock = threading.Lock()
        start = time.monotonic() + 0.5

        def one(req: Request) -> None:
            delay = start + req.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = time.monotonic()
            timing: dict[str, Any] = {}
            error = self.fetch(hosts[req.requester], req.keys, self.deadline_s, timing)
            elapsed = (time.monotonic() - t) * 1000 if error is None else float("nan")
            with lock:
                result.requests += 1
                result.timeline.append((req.at_s, req.requester, elapsed if error is None else float("nan")))
                result.request_timing.append(request_row(req.at_s, req.requester, len(req.keys), elapsed, timing))
                if error is None:
                    result.deliver_ms.append(elapsed)
                else:
                    result.failed += 1
                    log.error("%s: request for %d chunks failed: %s", hosts[req.requester].name, len(req.keys), error)
                if progress is not None:
                    progress()

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in self.workload.requests]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


AGENT_COUNTERS = ("gets_sent", "retransmit_gets", "stall_retransmits", "overtaken_retransmits", "gap_retransmits",
                  "busy_received",
                  "busy_retries", "nacks_sent", "reserved_chunks", "reserved_fragments",
                  "reserved_expired", "rebound_fragments", "shared_transfers",
                  "requests_failed")
"""Transport counters a mode's result reports, summed over the agents (``ModeResult.agents``)."""



class HolderPushes:
    """The controller's fill requester when chunks are dealt over several holders: each key goes to its holder."""

    def __init__(self, api_of: dict[int, str], sink: str, token: str | None) -> None:
        self.api_of = api_of
        self.clients = {api: HolderPushClient(api, sink, token=token) for api in set(api_of.values())}

    def push(self, keys: list[int], sink: str | None = None) -> None:
        """Ask each holder to push its keys among ``keys`` to ``sink``."""
        by_api: dict[str, list[int]] = {}
        for key in keys:
            by_api.setdefault(self.api_of[key], []).append(key)
        for api, part in by_api.items():
            self.clients[api].push(part, sink)


def switch_counters(ctl: Controller) -> dict[str, SwitchCounts]:
    """Per switch: GETs it absorbed, hits it served from memory, fragments it filled, pending-slot collisions."""
    out: dict[str, SwitchCounts] = {}
    for name in sorted(ctl.switches, key=lambda s: int(s[1:])):
        sw = ctl.switches[name]
        pool = sw.read_counter(n.POOL_STATS)
        coal = sw.read_counter(n.COALESCE_STATS)
        out[name] = SwitchCounts(absorbed=coal[CoalesceStat.ABSORBED].packets, served=pool[PoolStat.HIT].packets,
                                 fills=pool[PoolStat.FILL].packets, collisions=coal[CoalesceStat.COLLISION].packets,
                                 expired=coal[CoalesceStat.EXPIRED_REUSED].packets)
    return out


# ---------------------------------------------------------------------------------- kvpool demo
def run_demo(cfg: DemoConfig, print_json: bool = False) -> int:
    """``kvpool demo`` for a validated ``cfg``: every mode on one network; 0 when every chunk was bit-identical."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    reason = mininet_available()
    if not reason and cfg.observe and shutil.which("prometheus") is None:
        reason = f"--observe: {NO_PROMETHEUS}"
    if reason:
        print(f"kvpool demo: {reason}", file=sys.stderr)
        return 1
    try:
        topo = build_topology(cfg)
        if cfg.topology_file is not None:
            cfg.requesters = len(topo.inference_hosts())  # a file's requesters are its inference hosts
        workload = build_workload(cfg)
        bed = Testbed(cfg, workload, topo)
        if cfg.observe:
            bed.observer = Observer(cfg.out / "observe", ["kvpool", *sys.argv[1:]])
    except (TopologyError, ValueError, OSError) as exc:
        print(f"kvpool demo: {exc}", file=sys.stderr)
        return 1
    cfg = bed.cfg  # with the target resolved, and so the knobs the agents run
    cfg.out.mkdir(parents=True, exist_ok=True)
    chunk_kib = len(next(iter(workload.blobs.values()))) / 1024
    print(f"kvpool demo: target {cfg.target}, {describe(topo)}, holder links {cfg.holder_mbps:g} Mbit/s, "
          f"{len(workload.requests)} requests over {len(workload.blobs)} chunks of {chunk_kib:.0f} KiB, "
          f"window {cfg.in_flight} ({cfg.chunk_fragments} to a chunk"
          + (f", {cfg.servable_fragments} to a pooled one" if cfg.servable_fragments else "") + ")",
          file=sys.stderr)
    results: list[ModeResult] = []
    for off in bed.offered_by_holder:
        print(f"kvpool demo: {off.line()}", file=sys.stderr)
    print(f"kvpool demo: ideal (each chunk once per overlapping window): {bed.ideal_bytes / 1e6:.1f} MB, "
          f"{bed.ideal_bytes / max(1, bed.requested_bytes):.3f} of the bytes asked; each request's deadline "
          f"{bed.deadline_s:.0f} s{'' if cfg.deadline_s else ' (default: far beyond the work at line rate)'}",
          file=sys.stderr)
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
    for line in backlog_warnings({r.mode: r.switch_backlog for r in results}):
        print(f"kvpool demo: warning: {line}", file=sys.stderr)
    for name, lost in sorted(bed.frames_lost.items()):
        print(f"kvpool demo: warning: switch {name} lost {lost} frames at its ports (the model could not keep "
              f"up; see {bed.run_dir / (name + '.log')}): the latencies above measure the emulation", file=sys.stderr)
    summary = {r.mode: r.summary() for r in results}
    off = bed.offered
    doc = {"target": cfg.target, "topology": cfg.topology, "requesters": len(topo.inference_hosts()),
           "holders": len(topo.holders()), "switches": sorted(topo.switches, key=lambda s: int(s[1:])),
           "config": _jsonable(asdict(cfg)), "window": cfg.in_flight, "chunk_window": cfg.chunk_fragments,
           "servable_window": cfg.servable_fragments,
           "offered": {"holder": off.holder, "bytes": off.total_bytes, "span_s": round(off.span_s, 3),
                       "mean_bps": round(off.mean_bps), "peak_bps": round(off.peak_bps),
                       "capacity_bps": round(off.capacity_bps), "work_s": round(off.work_s, 2)},
           "offered_bytes_by_holder": {o.holder: o.total_bytes for o in bed.offered_by_holder},
           "requested_bytes": bed.requested_bytes, "ideal_bytes": bed.ideal_bytes, "deadline_s": bed.deadline_s,
           "switch_frames_lost": bed.frames_lost, "run": run_info(), **summary}
    (cfg.out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (cfg.out / TIMING_FILE).write_text(json.dumps(timing_document(results), indent=1) + "\n")
    (cfg.out / "results.txt").write_text(text + "\n")
    demo_plot(results, cfg.out / "demo.png")
    print(f"kvpool demo: results and plot in {cfg.out}/ (results.json, {TIMING_FILE}, results.txt, demo.png); "
          f"where the time went: kvpool why {cfg.out}", file=sys.stderr)
    if bed.observer is not None and bed.observer.dashboard is not None:
        print(f"kvpool demo: dashboard drawn from Prometheus in {bed.observer.dashboard}; draw it again with "
              f"python scripts/render_dashboard.py --tsdb {bed.observer.dir / 'tsdb'}", file=sys.stderr)
    if print_json:
        print(json.dumps(doc))
    return 0 if all(r.failed == 0 for r in results) else 1


def describe(topo: Topology) -> str:
    """One phrase for the banner: the shape of the network and where its hosts are."""
    tiers = [spec.get("tier") for spec in topo.switches.values()]
    hosts = f"{len(topo.holders())} holder(s), {len(topo.inference_hosts())} requesters"
    if len(topo.switches) == 1:
        return f"star ({hosts})"
    if tiers.count("spine"):
        return f"leaf-spine of {tiers.count('leaf')} leaves and {tiers.count('spine')} spines ({hosts})"
    return f"{len(topo.switches)} switches ({hosts})"


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
