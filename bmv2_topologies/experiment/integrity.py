"""Right bytes or a clear error, on the Mininet star: faults, republishes, moves and restarts.

``scripts/bench_integrity.py`` (and ``tests/test_e2e_integrity.py``, smaller) runs it: one
star (holder ``h0``, ``N`` requesters), a ``kvpool-agent`` in every host registered with
the controller's directory (the holder takes its generations from it), and per mode
(``plain``, ``multicast``, ``pool``) a controller in this process.  Every chunk a
requester receives is compared with the holder's current bytes.

Cases, each in every mode:

* **loss10, reorder25, dup5, corrupt1**: the model switch impairs every port in both
  directions (``switchmodel.impair``: 10 % loss, 25 % reordering held 5 ms, 5 %
  duplication, 1 % single-bit corruption).  In pool mode the chunks are admitted (and so
  filled) while the impairment is on.  Requesters fetch through the network and into their
  tiers; the impairment stops; one round more (the receivers ask again, with NO_CACHE, for
  any fragment a switch holds wrong, which repairs it), then a last round in which no
  switch-served fragment may fail its check any more (``poisoned_after``).
* **republish_same**: the holder publishes the same bytes again (the same generation).
* **republish_new**: the holder publishes other bytes under the same keys: no requester may
  get the old ones, from a switch or from its own tier.
* **readmit_moved** (pool mode): every chunk is evicted and admitted again in another
  order, so it lands at another base slot.
* **holder_restart**: the holder's agent is restarted and publishes its bytes again.

One line per case, then ``wrong_bytes_returned=<n> stale_served=<n> poisoned_after=<n>``:
chunks returned as success with bytes that are no version the holder ever published,
chunks returned with an older version's bytes or switch-served fragments that failed their
check in a case where none may (a stale or misplaced slot), and requesters that still got
a failing switch-served fragment after an impairment stopped.  All three must be 0.
Fetches may fail with a clear error (an HTTP error naming the chunk and why); how many did
is in each line.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bmv2_topologies.experiment.config import MODES
from bmv2_topologies.experiment.testbed import StarHosts, fresh_network, wait_switches
from bmv2_topologies.network import EmulatedNetwork, default_target
from controller.api import ControllerAPI
from controller.catalog import Catalog, ChunkInfo
from controller.daemon import Controller
from controller.directory import Directory, Role
from controller.fabric import FabricSettings
from controller.holder_push import HolderPushClient
from controller.overrides import Override
from controller.settings import ControllerSettings, Mode, SwitchEndpoint
from hostagent.client import AgentClient
from hostagent.serialize import serialize
from kvpool import auth, contract, wire
from kvpool import contract as n
from kvpool.auth import Token
from kvpool.contract import PoolStat
from kvpool.http_api import ApiError
from kvpool.topology import Host, star

log = logging.getLogger("kvpool.integrity")


IMPAIRMENTS: dict[str, str] = {
    "loss10": "loss=0.1",
    "reorder25": "reorder=0.25,delay_ms=5",
    "dup5": "dup=0.05",
    "corrupt1": "corrupt=0.01",
}
"""Impairment cases: ``switchmodel.impair`` parameters applied to every port, both directions."""
COHERENCE: tuple[str, ...] = ("republish_same", "republish_new", "readmit_moved", "holder_restart")
CASES: tuple[str, ...] = (*IMPAIRMENTS, *COHERENCE)
STALL_S = 5.0
"""A fetch slower than this counts as a stall (the give-up time is twice it)."""


@dataclass
class IntegrityConfig:
    """What one run is told (the script's flags)."""

    requesters: int = 3
    target: str | None = None
    modes: tuple[str, ...] = MODES
    cases: tuple[str, ...] = CASES
    chunks: int = 4
    """Chunks of the prefix every requester fetches."""
    chunk_kib: int = 64
    """Size of each chunk's tensor."""
    rounds: int = 2
    """Fetch rounds (every requester at once) under each impairment."""
    holder_mbps: float = 200.0
    fetch_timeout_s: float = 30.0
    out: Path = Path("results/integrity")
    seed: int = 1

    def validate(self) -> None:
        """Raise ValueError naming the first nonsensical option."""
        if not 1 <= self.requesters <= 16 or self.chunks < 1 or self.chunk_kib < 1 or self.rounds < 1:
            raise ValueError("--requesters 1..16, --chunks, --chunk-kib and --rounds >= 1")
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
        for c in self.cases:
            if c not in CASES:
                raise ValueError(f"--cases: unknown case {c!r}; choose from {', '.join(CASES)}")
        if self.target == "bmv2" and any(c in IMPAIRMENTS for c in self.cases):
            raise ValueError("impairment cases need the model target (BMv2 has no impairment, this kernel no "
                             f"sch_netem): --cases {','.join(COHERENCE)} with --target bmv2")


@dataclass
class CaseResult:
    """What one case in one mode saw."""

    mode: str
    case: str
    fetches: int = 0
    exact: int = 0
    errors: int = 0
    wrong_bytes: int = 0
    stale: int = 0
    corrupt_in_tier: int = 0
    poisoned_after: int = 0
    switch_served: int = 0
    caught: int = 0
    """Fragments (and whole chunks) the requesters caught failing their checks and asked for again."""
    check_failures: int = 0
    stalls: int = 0
    max_fetch_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for the report."""
        text = (f"{self.mode:9s} {self.case:15s} fetches={self.fetches} exact={self.exact} errors={self.errors} "
                f"wrong={self.wrong_bytes} stale={self.stale} tier_corrupt={self.corrupt_in_tier} "
                f"poisoned_after={self.poisoned_after} switch_served={self.switch_served} caught={self.caught} "
                f"stalls={self.stalls} max_fetch_s={self.max_fetch_s:.2f}")
        return text + (f"  ({'; '.join(self.notes)})" if self.notes else "")


def _blob(seed: int, nbytes: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    return bytes(serialize(torch.randn(nbytes // 2, generator=gen).to(torch.float16)))


class IntegrityBed(StarHosts):
    """The star, its agents (registered with the directory) and one controller per mode."""

    def __init__(self, cfg: IntegrityConfig) -> None:
        self.cfg = cfg
        self.topo = star(cfg.requesters, holder_mbps=cfg.holder_mbps)
        self.run_dir = cfg.out / "run"
        self.socket = (self.run_dir / "ctl.sock").resolve()
        self.token: Token | None = None
        self.net: EmulatedNetwork | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # The directory outlives each mode's controller, so agents stay registered.
        self.directory = Directory({h.address: Role(h.role) for h in self.topo.hosts.values()}, 3.0)
        self.ctl: Controller | None = None
        self._api: ControllerAPI | None = None
        self._loop: threading.Thread | None = None
        self._stop = threading.Event()
        self.keys = [0x1D_0000_0000_0000 + cfg.seed * 0x100 + i for i in range(cfg.chunks)]
        self.versions: list[list[bytes]] = []
        """Every content published, oldest first (the last is current)."""

    # ------------------------------------------------------------------ lifecycle
    @contextlib.contextmanager
    def running(self) -> Iterator[IntegrityBed]:
        """Network, first controller, agents; everything stopped (by PID) on the way out."""
        self.token = auth.load_or_create()
        self.net = fresh_network(self.run_dir, self.topo, self.cfg.target)
        try:
            self.net.start()
            self.program(self.cfg.modes[0])
            for h in self.topo.hosts.values():
                self.start_agent(h)
            yield self
        finally:
            for name in list(self.procs):
                self.stop_agent(name)
            self._stop_controller()
            self.net.stop()

    def _stop_controller(self) -> None:
        if self._api is not None:
            self._api.stop()
            self._api = None
        self._stop.set()
        if self._loop is not None:
            self._loop.join(timeout=10)
            self._loop = None
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None

    def program(self, mode: str) -> Controller:
        """A fresh pipeline and a controller for ``mode``, its API on the same socket, the same directory."""
        assert self.net is not None and self.token is not None
        self._stop_controller()
        self._stop = threading.Event()
        nbytes = len(_blob(0, self.cfg.chunk_kib * 1024))  # every version of every chunk has this size
        catalog = Catalog(ChunkInfo(k, self.keys[i - 1] if i else None, i, nbytes) for i, k in enumerate(self.keys))
        # Nothing is admitted on its own: the cases admit and evict explicitly.
        fabric = FabricSettings(popularity_threshold=1 << 30, pending_timeout_us=2_000_000)
        build = contract.build_dir()  # KVPOOL_P4_BUILD names another build, as in the tests
        settings = ControllerSettings(mode=Mode(mode), fabric=fabric, epoch_s=0.1, target=self.net.target,
                                      p4info=build / contract.P4INFO_FILE, bmv2_json=build / contract.BMV2_JSON_FILE,
                                      adopt=False)  # a clean slate per mode (the push below)
        endpoints = [SwitchEndpoint(s.name, s.grpc_addr, s.device_id) for s in self.net.switches.values()]
        filler = HolderPushClient(self.api(self.holder.name), fabric.fill_sink, token=self.token.value)
        ctl = Controller(self.topo, endpoints, settings, catalog, filler if mode == "pool" else None,
                         directory=self.directory)
        ctl.start()
        wait_switches(ctl, self.net)
        ctl.clean_slate()  # no register or counter of the last mode
        self.ctl = ctl
        self._api = ControllerAPI(ctl, "127.0.0.1", 0, self.socket, token=self.token).start()
        self._loop = threading.Thread(target=ctl.run, args=(self._stop,), name="controller-epochs", daemon=True)
        self._loop.start()
        return ctl

    def start_agent(self, h: Host) -> None:
        """Start ``h``'s agent, registered with the controller; wait until it is ready."""
        assert self.net is not None and self.token is not None
        ready = self.run_dir / f"{h.name}.ready"
        ready.unlink(missing_ok=True)
        args = [sys.executable, "-m", "hostagent.cli", "--host", h.address,
                "--api-socket", str((self.run_dir / f"{h.name}.sock").resolve()), "--token-file", str(self.token.path),
                "--ready-file", str(ready), "--log-file", str(self.run_dir / f"{h.name}.agent.log"),
                "--single-gets", "--window", "64", "--max-inflight", "256", "--retransmit-timeout", "0.3",
                "--give-up", "10", "--controller", f"unix:{self.socket}", "--node-id", h.name,
                "--advertise", h.address, "--role", h.role]
        if h.role == "holder":
            args += ["--rate", str(int(self.cfg.holder_mbps * 1e6 / 8 * 0.9)), "--burst",
                     str(4 * wire.DATA_DATAGRAM_LEN)]
        self.procs[h.name] = self.net.popen(h.name, args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().strip()):
            if self.procs[h.name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent on {h.name} did not start (log: {self.run_dir / h.name}.agent.log)")
            time.sleep(0.1)

    def stop_agent(self, name: str) -> None:
        """SIGTERM ``name``'s agent (it leaves the directory), by its PID."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def client(self, host: str, timeout: float = 120.0) -> AgentClient:
        """An API client of ``host``'s agent."""
        assert self.token is not None
        return AgentClient(self.api(host), timeout=timeout, token=self.token.value)

    # ------------------------------------------------------------------ actions
    def publish(self, seed: int) -> None:
        """The holder publishes a new content (or an earlier one again) for every key."""
        size = self.cfg.chunk_kib * 1024
        blobs = [_blob(seed * 1000 + i, size) for i in range(len(self.keys))]
        self.client(self.holder.name).publish_chunks(self.keys, blobs)
        if not self.versions or blobs != self.versions[-1]:
            self.versions.append(blobs)

    def override(self, op: str, key: int) -> dict[str, Any]:
        """An operator override through the epoch loop, waited for."""
        assert self.ctl is not None
        result: dict[str, Any] = self.ctl.submit(Override(op, key, demote=False)).result(30)
        return result

    def admit_all(self, reverse: bool = False) -> list[int]:
        """Admit every chunk (pool mode); their base slots.  The controller has the holder push them."""
        assert self.ctl is not None
        for key in (reversed(self.keys) if reverse else self.keys):
            self.override("admit", key)
        time.sleep(1.0)  # the holder's push crosses the switch (fill on pass)
        return [self.ctl.residents[k].base_slot for k in self.keys if k in self.ctl.residents]

    def evict_all(self) -> None:
        """Evict every resident chunk (children before parents)."""
        assert self.ctl is not None
        for key in reversed(self.keys):
            if key in self.ctl.residents:
                self.override("evict", key)

    def forget_local(self) -> None:
        """Requesters drop their copies, so the next fetch crosses the network."""
        for h in self.requesters():
            c = self.client(h.name)
            for k in self.keys:
                c.delete_chunk(k)

    def switch_hits(self) -> int:
        """Fragments the switches served from memory so far (this mode)."""
        assert self.ctl is not None
        return sum(sw.read_counter(n.POOL_STATS, PoolStat.HIT)[PoolStat.HIT].packets
                   for sw in self.ctl.switches.values())

    def integrity_counts(self) -> tuple[int, int]:
        """Over the requesters so far: (fragments and chunks caught failing a check, switch-served ones among them)."""
        caught = switch = 0
        for h in self.requesters():
            st = self.client(h.name).stats()["transport"]["integrity"]
            caught += int(st["fragments_check_failed"]) + int(st["chunks_check_failed"])
            switch += int(st["switch_fragments_check_failed"])
        return caught, switch

    def fetch_round(self, res: CaseResult, local: bool) -> int:
        """Every requester fetches the prefix at once; counts into ``res``; returns requesters not exact."""
        current, older = self.versions[-1], [b for v in self.versions[:-1] for b in v]
        holder = f"{self.holder.address}:{wire.KVPOOL_UDP_PORT}"
        lock = threading.Lock()
        not_exact = [0]

        def one(h: Host) -> None:
            t = time.monotonic()
            try:
                keys, blobs, stopped = self.client(h.name).fetch_chunks(self.keys, holder, local=local,
                                                                          timeout=self.cfg.fetch_timeout_s)
                error = None if len(keys) == len(self.keys) else f"{h.name}: {len(keys)} chunks ({stopped})"
            except ApiError as exc:
                keys, blobs, error = [], [], f"{h.name}: {exc}"
            took = time.monotonic() - t
            wrong = sum(1 for i, b in enumerate(blobs) if b != current[i] and b not in older)
            stale = sum(1 for i, b in enumerate(blobs) if b != current[i] and b in older)
            with lock:
                res.fetches += 1
                res.max_fetch_s = max(res.max_fetch_s, took)
                res.stalls += took > STALL_S
                res.wrong_bytes += wrong
                res.stale += stale
                if error is not None:
                    res.errors += 1
                    if len(res.notes) < 3:
                        res.notes.append(error[:160])
                if wrong or stale or error is not None:
                    not_exact[0] += 1
                else:
                    res.exact += 1

        threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in self.requesters()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return not_exact[0]

    def check_tiers(self, res: CaseResult) -> None:
        """Requesters' tiers hold only the current bytes (or nothing) for every key."""
        current, older = self.versions[-1], [b for v in self.versions[:-1] for b in v]
        for h in self.requesters():
            c = self.client(h.name)
            for i, k in enumerate(self.keys):
                try:
                    blob = c.get_chunk(k)
                except ApiError:
                    continue  # not held
                if blob in older:
                    res.stale += 1
                elif blob != current[i]:
                    res.corrupt_in_tier += 1


# ---------------------------------------------------------------------------------- cases
def impairment_case(bed: IntegrityBed, mode: str, case: str) -> CaseResult:
    """Fetches under one impairment, then after it stops (see the module docstring)."""
    assert bed.net is not None
    res = CaseResult(mode, case)
    bed.forget_local()
    if mode == "pool":
        bed.evict_all()
    spec = f"*:both:{IMPAIRMENTS[case]},seed={bed.cfg.seed}"
    bed.net.set_impairment("s1", [spec])
    time.sleep(0.3)  # the switch reads its impairment file within 0.1 s
    hits = bed.switch_hits()
    caught = bed.integrity_counts()[0]
    try:
        if mode == "pool":
            bed.admit_all()  # filled while the links are impaired
        for _ in range(bed.cfg.rounds):
            bed.fetch_round(res, local=False)
        bed.fetch_round(res, local=True)
        bed.check_tiers(res)
    finally:
        bed.net.set_impairment("s1", [])
        time.sleep(0.3)
    bed.forget_local()
    bed.fetch_round(res, local=False)  # damaged slots are found and repaired (NO_CACHE answers)
    failures = bed.integrity_counts()[1]
    res.poisoned_after += bed.fetch_round(res, local=False)
    res.poisoned_after += min(bed.cfg.requesters, bed.integrity_counts()[1] - failures)
    res.switch_served = bed.switch_hits() - hits
    res.caught = bed.integrity_counts()[0] - caught
    return res


def coherence_case(bed: IntegrityBed, mode: str, case: str) -> CaseResult:
    """Republish (same or new bytes), re-admission at another base slot, holder restart."""
    res = CaseResult(mode, case)
    hits, (caught, failures) = bed.switch_hits(), bed.integrity_counts()
    if mode == "pool" and bed.ctl is not None and not bed.ctl.residents:
        bed.admit_all()
    bed.fetch_round(res, local=True)  # every requester holds a copy; the pool (if any) is filled
    if case == "republish_same":
        bed.publish(len(bed.versions))
    elif case == "republish_new":
        bed.publish(len(bed.versions) + 1)
    elif case == "readmit_moved":
        if mode != "pool":
            res.notes.append("no switch pool in this mode")
        else:
            assert bed.ctl is not None
            before = {k: bed.ctl.residents[k].base_slot for k in bed.keys if k in bed.ctl.residents}
            bed.evict_all()
            bed.admit_all(reverse=True)
            after = {k: bed.ctl.residents[k].base_slot for k in bed.keys if k in bed.ctl.residents}
            moved = sum(1 for k in after if before.get(k) is not None and before[k] != after[k])
            res.notes.append(f"{moved} of {len(after)} chunks at another base slot")
    elif case == "holder_restart":
        bed.stop_agent(bed.holder.name)
        bed.start_agent(bed.holder)
        seed = len(bed.versions)  # the bytes it held: the current version's seed
        bed.publish(seed)
    for _ in range(2):
        bed.fetch_round(res, local=True)
        bed.fetch_round(res, local=False)
    bed.check_tiers(res)
    res.switch_served = bed.switch_hits() - hits
    # A switch-served fragment that fails its check here is a stale or misplaced slot.
    caught_now, failures_now = bed.integrity_counts()
    res.caught = caught_now - caught
    res.check_failures = failures_now - failures
    res.stale += res.check_failures
    return res


def run_integrity(cfg: IntegrityConfig, print_lines: bool = True) -> tuple[list[CaseResult], str]:
    """Every case in every mode; the results and the last line."""
    cfg.target = cfg.target or default_target()
    cfg.validate()
    cfg.out.mkdir(parents=True, exist_ok=True)
    bed = IntegrityBed(cfg)
    results: list[CaseResult] = []
    with bed.running():
        bed.publish(1)
        for i, mode in enumerate(cfg.modes):
            if i:
                bed.program(mode)
            for case in cfg.cases:
                res = (impairment_case if case in IMPAIRMENTS else coherence_case)(bed, mode, case)
                results.append(res)
                if print_lines:
                    print(res.line(), flush=True)
    last = (f"wrong_bytes_returned={sum(r.wrong_bytes for r in results)} "
            f"stale_served={sum(r.stale for r in results)} "
            f"poisoned_after={sum(r.poisoned_after for r in results)}")
    (cfg.out / "results.txt").write_text("\n".join([*(r.line() for r in results), last]) + "\n")
    return results, last

