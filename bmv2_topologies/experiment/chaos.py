"""Chaos on the Mininet star: the switch and the controller killed and restarted while requesters fetch.

The demo's star in pool mode (holder ``h0``, ``N`` requesters, a ``kvpool-agent`` in every
host; the controller tells the agents which chunks are pooled, and they ask for those with
single-fragment GETs the switch can serve), with the controller as its own
``kvpool-controller`` process. Requesters fetch the hot chunks in a loop and compare every
chunk they get with the holder's bytes, while the schedule kills (SIGKILL) and restarts
the switch process and the controller process in turn. After each restart the switch's
pool-hit counter, read by a read-only P4Runtime client, tells when the pool serves again.

:func:`run_chaos` returns what happened: transfers bit-exact, failed with a clear error,
wrong (must be 0: nothing stale or corrupt is ever returned as success); per restart the
seconds until the pool served again; whether each restarted controller adopted the warm
switch (read from its first status file, before the next restart), and whether the last
controller process is alive. ``tests/bmv2_topologies/test_e2e_chaos.py`` runs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmv2_topologies.experiment.config import DemoConfig
from bmv2_topologies.experiment.testbed import Testbed
from bmv2_topologies.experiment.workload import Workload, build_workload
from controller.catalog import Catalog, ChunkInfo
from controller.p4runtime import NotMasterError, P4RuntimeError, P4RuntimeSwitch
from hostagent.client import AgentClient
from kvpool import contract as n
from kvpool import wire
from kvpool.contract import PoolStat
from kvpool.http_api import ApiError

log = logging.getLogger("kvpool.chaos")

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Restart:
    """One restart: of what, when (monotonic), and how long until the pool served again (None: never)."""

    what: str
    at: float
    served_after_s: float | None = None


@dataclass
class ChaosResult:
    """What the requesters got and how the pool came back after each restart."""

    ok: int = 0
    failed: int = 0
    wrong: int = 0
    errors: list[str] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    controller_alive: bool = False
    adoptions: list[bool] = field(default_factory=list)
    """Per controller restart: whether the new process adopted the warm switch."""
    controller_exits: list[int | None] = field(default_factory=list)

    def summary(self) -> str:
        """One line per restart, then the totals."""
        lines = [f"{r.what}: pool served again after "
                 + (f"{r.served_after_s:.1f} s" if r.served_after_s is not None else "NEVER") for r in self.restarts]
        lines.append(f"transfers bit-exact={self.ok} failed_clearly={self.failed} wrong={self.wrong}; "
                     f"controller alive at the end={self.controller_alive}, adopted the warm switch={self.adoptions}")
        return "\n".join(lines)


class Chaos:
    """The star, the requesters' loop, the controller process and the read-only probe (see the module docstring)."""

    def __init__(self, out: Path, requesters: int = 3, chunks: int = 4) -> None:
        cfg = DemoConfig(requesters=requesters, waves=1, hot_blocks=chunks, tail_blocks=0, layers=4,
                         holder_mbps=100, out=out, modes=("pool",), target="model", deadline_s=30.0,
                         window=64)
        self.cfg = cfg
        self.workload: Workload = build_workload(cfg)
        self.bed = Testbed(cfg, self.workload)
        self.result = ChaosResult()
        self.controller: subprocess.Popen[bytes] | None = None
        self._controllers = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.probe: P4RuntimeSwitch | None = None

    # -------------------------------------------------------------- the controller process
    def _files(self) -> tuple[Path, Path]:
        run = self.bed.run_dir
        catalog, topo = run / "catalog.json", run / "topology.json"
        if not catalog.exists():
            wl = self.workload
            Catalog(ChunkInfo(k, wl.parents[k], wl.positions[k], len(wl.blobs[k])) for k in wl.blobs).save(catalog)
            topo.write_text(json.dumps(self.bed.topo.to_dict()))
        return catalog, topo

    def start_controller(self) -> None:
        """A ``kvpool-controller`` process in pool mode, its log and status file under the run dir."""
        assert self.bed.net is not None and self.bed.token is not None
        catalog, topo = self._files()
        self._controllers += 1
        run = self.bed.run_dir
        switches = [f"{s.name}={s.grpc_addr}@{s.device_id}" for s in self.bed.net.switches.values()]
        argv = [sys.executable, "-m", "controller.cli", "--topology", str(topo), "--catalog", str(catalog),
                "--holder-api", self.bed.api(self.bed.holder.name), "--mode", "pool", "--epoch", "0.1",
                "--threshold", "2", "--pending-timeout-us", "2000000", "--target", "model",
                "--status-file", str(run / "controller.status.json"), "--token-file", str(self.bed.token.path)]
        for s in switches:
            argv += ["--switch", s]
        # Every agent hears which chunks are pooled: only those it asks for with GETs the switch can serve.
        for h in self.bed.topo.hosts:
            argv += ["--agent-api", self.bed.api(h)]
        out = (run / f"controller-{self._controllers}.log").open("wb")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.controller = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                           start_new_session=True)
        out.close()

    def kill_controller(self) -> None:
        """SIGKILL the controller process (a crash: nothing is closed cleanly)."""
        if self.controller is not None and self.controller.poll() is None:
            self.controller.send_signal(signal.SIGKILL)
            self.result.controller_exits.append(self.controller.wait(timeout=10))

    def status(self) -> dict[str, Any]:
        """The controller's last status file (empty before the first epoch)."""
        try:
            doc: dict[str, Any] = json.loads((self.bed.run_dir / "controller.status.json").read_text())
        except (OSError, ValueError):
            return {}
        return doc

    def _first_status(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The status the controller just started writes first (empty if it writes none in ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while not (doc := self.status()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return doc

    # -------------------------------------------------------------- observing the pool
    def pool_hits(self) -> int | None:
        """Fragments the switch served from its pool, per its counter (None: not readable now)."""
        if self.probe is None:
            return None
        try:
            return self.probe.read_counter(n.POOL_STATS, PoolStat.HIT)[PoolStat.HIT].packets
        except P4RuntimeError:
            return None

    def _open_probe(self) -> None:
        assert self.bed.net is not None
        sw = next(iter(self.bed.net.switches.values()))
        # Election id 0: a backup beside the controller's (0, 1), never writing; wait_ready_s=0
        # so a read while the switch restarts fails at once instead of waiting.
        self.probe = P4RuntimeSwitch(sw.grpc_addr, n.P4INFO_PATH, None, device_id=sw.device_id, election_id=(0, 0),
                                     timeout_s=2, wait_ready_s=0, max_backoff_s=0.5)
        with contextlib.suppress(NotMasterError):  # the expected case: a backup may read
            self.probe.connect(push_pipeline=False, retry_in_background=True)

    def wait_served(self, since: float, baseline: int, within: float = 60.0) -> float | None:
        """Seconds from ``since`` until the pool-hit counter passes ``baseline`` (None if not within ``within``)."""
        deadline = since + within
        while time.monotonic() < deadline:
            hits = self.pool_hits()
            if hits is not None and hits > baseline:
                return time.monotonic() - since
            time.sleep(0.1)
        return None

    # -------------------------------------------------------------- the requesters
    def _requester(self, host: str, seed: int) -> None:
        rng = random.Random(seed)
        keys = list(self.workload.blobs)
        client = AgentClient(self.bed.api(host), timeout=self.bed.deadline_s + 10)
        holder = f"{self.bed.holder.address}:{wire.KVPOOL_UDP_PORT}"
        while not self._stop.is_set():
            key = rng.choice(keys)
            try:
                got_keys, blobs, stopped = client.fetch_chunks([key], holder, timeout=self.bed.deadline_s,
                                                               local=False)
            except ApiError as exc:  # a clear error: the request failed and said why
                self._note(False, f"{host} {key:#x}: {exc}")
                continue
            if got_keys != [key]:
                self._note(False, f"{host} {key:#x}: not fetched ({stopped})")
            elif blobs[0] != self.workload.blobs[key]:
                with self._lock:
                    self.result.wrong += 1
                    self.result.errors.append(f"{host} {key:#x}: WRONG BYTES returned as success")
            else:
                self._note(True, "")

    def _note(self, ok: bool, error: str) -> None:
        with self._lock:
            if ok:
                self.result.ok += 1
            else:
                self.result.failed += 1
                if len(self.result.errors) < 20:
                    self.result.errors.append(error)

    # -------------------------------------------------------------- the run
    def run(self, switch_restarts: int = 3, controller_restarts: int = 2, settle_s: float = 3.0) -> ChaosResult:
        """Start everything, alternate switch and controller restarts, stop; the result."""
        with self.bed.running():
            assert self.bed.net is not None
            hc = AgentClient(self.bed.api(self.bed.holder.name), timeout=120)
            keys = list(self.workload.blobs)
            hc.publish_chunks(keys, [self.workload.blobs[k] for k in keys])
            self.start_controller()
            self._open_probe()
            threads = [threading.Thread(target=self._requester, args=(h.name, i), daemon=True)
                       for i, h in enumerate(self.bed.requesters())]
            for th in threads:
                th.start()
            try:
                start = time.monotonic()
                self.result.restarts.append(Restart("first admission", start, self.wait_served(start, 0, 120)))
                for what in _alternate(switch_restarts, controller_restarts):
                    time.sleep(settle_s)
                    self._restart(what)
                time.sleep(settle_s)
            finally:
                self._stop.set()
                for th in threads:
                    th.join(timeout=self.bed.deadline_s + 30)
                ctl = self.controller
                self.result.controller_alive = ctl is not None and ctl.poll() is None
                if self.probe is not None:
                    self.probe.close()
                if ctl is not None and ctl.poll() is None:
                    ctl.send_signal(signal.SIGTERM)
                    try:
                        self.result.controller_exits.append(ctl.wait(timeout=30))
                    except subprocess.TimeoutExpired:
                        ctl.kill()
                        self.result.controller_exits.append(ctl.wait(timeout=10))
        return self.result

    def _restart(self, what: str) -> None:
        assert self.bed.net is not None
        if what == "switch":
            self.bed.net.restart_switch("s1")  # returns once the new, empty process listens
            at = time.monotonic()
            restart = Restart(f"switch restart {sum(r.what.startswith('switch') for r in self.result.restarts) + 1}",
                              at)
            restart.served_after_s = self.wait_served(at, 0)  # a new instance counts from zero
        else:
            baseline = self.pool_hits() or 0
            self.kill_controller()
            (self.bed.run_dir / "controller.status.json").unlink(missing_ok=True)
            self.start_controller()
            at = time.monotonic()
            restart = Restart(f"controller restart "
                              f"{sum(r.what.startswith('controller') for r in self.result.restarts) + 1}", at)
            restart.served_after_s = self.wait_served(at, baseline)
            # The new process's first status, before anything else restarts: a slow start (a loaded
            # machine) must not meet the next switch restart and count as "did not adopt".
            self.result.adoptions.append(bool(self._first_status().get("switches", {}).get("s1", {}).get("adopted")))
        self.result.restarts.append(restart)
        log.info("%s: pool served again after %s", restart.what, restart.served_after_s)


def _alternate(switches: int, controllers: int) -> list[str]:
    """Switch and controller restarts taking turns, switches first: s, c, s, c, s for (3, 2)."""
    out: list[str] = []
    for i in range(max(switches, controllers)):
        if i < switches:
            out.append("switch")
        if i < controllers:
            out.append("controller")
    return out


def run_chaos(out: Path, requesters: int = 3, switch_restarts: int = 3, controller_restarts: int = 2) -> ChaosResult:
    """The whole chaos run on a fresh star under ``out`` (needs root and Mininet)."""
    return Chaos(out, requesters).run(switch_restarts, controller_restarts)

