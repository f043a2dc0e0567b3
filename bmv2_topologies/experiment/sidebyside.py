"""kvpool against Mooncake Store alone, side by side on one Mininet network (a star or a leaf-spine).

One network per requester count N. Every storage host (the holders: ``h0`` on the star;
``h0`` and ``h101`` on leaf ``s1`` of the leaf-spine) sits behind a shaped bottleneck
link and runs one Mooncake store node lending DRAM (the first also runs
``mooncake_master``; the others join its pool, ``hostagent.mooncake_master --join``) and a
``kvpool-agent`` holder whose only tier is that store (``--backend mooncake --dram-bytes
0``: every GET is answered from bytes read from Mooncake). The hot prefix is dealt over
the holders by position and each holder publishes its share into its own host's store
node (``--mooncake-segment``), so Mooncake alone and kvpool read every chunk from the
same node. Then the same waves run four ways:

* ``mooncake``: every inference node's Mooncake client gets the prefix's objects from
  the store over TCP (``bmv2_topologies.mooncake_reader``), the switch only forwarding;
* ``kvpool_plain``: kvpool agents fetch through the holder, the switch only forwarding;
* ``kvpool_multicast``: the switch coalesces duplicate GETs and multicasts the answer;
* ``kvpool_pool``: coalescing plus the switch pool filled with the hot chunks.

A wave is all N requesters asking for the whole prefix at the same instant; the next
wave starts after the last one has finished and the network has settled. Measured per
system: the time from a wave's start until every requester holds the whole prefix
(p50/p99 over waves), bytes on the storage hosts' links (both directions, from the
switch ports' counters, every protocol, summed over the storage hosts), and both as
ratios to Mooncake alone. Every chunk every requester receives is checked against the
published bytes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from rich.progress import Progress

from bmv2_topologies.experiment.capture import link_bytes
from bmv2_topologies.experiment.config import VsConfig
from bmv2_topologies.experiment.report import ModeResult, SystemResult, vs_document, vs_plot, vs_table
from bmv2_topologies.experiment.testbed import Testbed, build_topology
from bmv2_topologies.experiment.workload import Request, build_workload
from bmv2_topologies.mooncake_reader import digest
from bmv2_topologies.network import NetworkError, mininet_available
from hostagent.mooncake_master import MooncakeProcessError, find_binary
from kvpool.report import run_info
from kvpool.topology import Host

log = logging.getLogger("kvpool.vs_mooncake")


class SideBySide:
    """The demo's testbed with a Mooncake store node on every holder host, which its holder agent fronts."""

    def __init__(self, cfg: VsConfig) -> None:
        demo_cfg = cfg.demo_config()
        self.vs = cfg
        topo = build_topology(demo_cfg)
        if demo_cfg.topology_file is not None:
            demo_cfg.requesters = len(topo.inference_hosts())  # a file's requesters are its inference hosts
        self.bed = Testbed(demo_cfg, build_workload(demo_cfg), topo)
        self.master = self.metadata = ""
        prefixes = {r.keys for r in self.bed.workload.requests}
        if len(prefixes) != 1:
            raise ValueError("the side-by-side needs one shared prefix (no tail blocks)")
        self.prefix: tuple[int, ...] = prefixes.pop()
        self.digests = [digest(self.bed.workload.blobs[k]) for k in self.prefix]

    @property
    def prefix_bytes(self) -> int:
        """Serialized bytes of the hot prefix (one copy)."""
        return sum(len(self.bed.workload.blobs[k]) for k in self.prefix)

    # -------------------------------------------------------------- lifecycle
    def running(self) -> contextlib.AbstractContextManager[Testbed]:
        """The testbed up, with the Mooncake Store started on the holder hosts before the holder agents."""
        return self.bed.running(self._mooncake_store)

    @contextlib.contextmanager
    def _mooncake_store(self, bed: Testbed) -> Iterator[dict[str, list[str]]]:
        """Start the pool (master and a store node on the first holder, a store node on each other one);
        yield each holder agent's flags to use it, with its own node preferred; stop it all by PID."""
        procs: list[subprocess.Popen[bytes]] = []
        flags: dict[str, list[str]] = {}
        master_ready = bed.run_dir / "mooncake.ready"
        try:
            for i, holder in enumerate(bed.topo.holders()):
                ready = master_ready if i == 0 else bed.run_dir / f"mooncake_{holder.name}.ready"
                join = [] if i == 0 else ["--join", str(master_ready.resolve())]
                with (bed.run_dir / f"mooncake_{holder.name}.stderr").open("wb") as err:
                    procs.append(bed.popen(holder.name, [
                        sys.executable, "-m", "hostagent.mooncake_master", "--host", holder.address, *join,
                        "--segment-mib", str(self.vs.segment_mib), "--log-dir", str(bed.run_dir.resolve()),
                        "--ready-file", str(ready.resolve())], stdout=subprocess.DEVNULL, stderr=err))
                deadline = time.monotonic() + 60
                while not ready.exists():
                    if procs[-1].poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"Mooncake store on {holder.name} did not start; see "
                                           f"{bed.run_dir}/mooncake_{holder.name}.stderr and its logs there")
                    time.sleep(0.1)
                info = json.loads(ready.read_text())
                self.master, self.metadata = info["rpc_address"], info["metadata_url"]
                flags[holder.name] = ["--backend", "mooncake", "--mooncake-master", self.master,
                                      "--mooncake-metadata-url", self.metadata, "--dram-bytes", "0",
                                      "--mooncake-segment", info["store_nodes"][0]["segment"]]
            yield flags
        finally:
            for proc in reversed(procs):  # store nodes that joined first, the master's last
                if proc.poll() is None:
                    proc.terminate()  # each stops the master or store node it started
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=5)

    # -------------------------------------------------------------- the systems
    def _each_wave(self, result: SystemResult, run_wave: Callable[[list[Request]], tuple[float, dict[int, float]]],
                   progress: Callable[[], None] | None) -> None:
        """Run the waves one after the other; ``run_wave`` returns its start and each good requester's end."""
        for i, wave in enumerate(self.bed.workload.waves()):
            if i:
                time.sleep(self.vs.settle_s)
            start, ends = run_wave(wave)
            result.failed += len(wave) - len(ends)
            result.deliver_ms.extend((end - start) * 1e3 for end in ends.values())
            if ends and len(ends) == len(wave):
                result.all_done_ms.append((max(ends.values()) - start) * 1e3)
            if progress is not None:
                progress()

    def run_mooncake(self, progress: Callable[[], None] | None = None) -> SystemResult:
        """Every requester's Mooncake client reads the prefix from the store, wave by wave.

        The switch is programmed as for ``kvpool_plain`` (routes only): Mooncake's TCP
        crosses it as ordinary IPv4 traffic.
        """
        result = SystemResult("mooncake", self.vs.requesters)
        keys = ",".join(f"{k:x}" for k in self.prefix)

        def waves(_mode: ModeResult, _progress: object) -> None:
            links = list(self.bed.holder_links.values())
            with contextlib.ExitStack() as stack:
                readers = [stack.enter_context(self._reader(h, keys)) for h in self.bed.requesters()]
                before = link_bytes(*links)  # after the clients connected, as for kvpool's agents
                self._each_wave(result, lambda wave: self._mooncake_wave(readers, wave), progress)
                result.storage_link_bytes = link_bytes(*links) - before

        self.bed.run_mode("plain", None, waves)
        return result

    def _mooncake_wave(self, readers: list[subprocess.Popen[bytes]],
                       wave: list[Request]) -> tuple[float, dict[int, float]]:
        """Tell each reader when to start, then collect their end times (wall clock)."""
        go = time.time() + 0.3
        for r in wave:
            pipe = readers[r.requester].stdin
            assert pipe is not None
            pipe.write((json.dumps({"go": go}) + "\n").encode())
            pipe.flush()
        ends: dict[int, float] = {}
        for r in wave:
            out = readers[r.requester].stdout
            assert out is not None
            answer = json.loads(out.readline() or b'{"error": "the reader exited"}')
            if "error" in answer or answer["digests"] != self.digests:
                log.error("h%d: mooncake read failed: %s", r.requester + 1,
                          answer.get("error", "bytes differ from the published prefix"))
            else:
                ends[r.requester] = answer["end"]
        return go, ends

    @contextlib.contextmanager
    def _reader(self, host: Host, keys: str) -> Iterator[subprocess.Popen[bytes]]:
        """A ``mooncake_reader`` in ``host``, connected and ready; ended by PID on the way out."""
        with (self.bed.run_dir / f"{host.name}.mooncake_reader.log").open("wb") as err:
            proc = self.bed.popen(host.name, [
                sys.executable, "-m", "bmv2_topologies.mooncake_reader", "--master", self.master, "--metadata",
                self.metadata, "--local-hostname", host.address, "--keys", keys],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            line = proc.stdout.readline()
            if b"ready" not in line:
                raise RuntimeError(f"Mooncake client on {host.name} did not connect; see {err.name}")
            yield proc
        finally:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    assert proc.stdin is not None
                    proc.stdin.write(b'{"quit": true}\n')
                    proc.stdin.close()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)

    def run_kvpool(self, system: str, progress: Callable[[], None] | None = None) -> SystemResult:
        """kvpool agents fetch the prefix through the holder, the switch programmed for ``system``."""
        result = SystemResult(system, self.vs.requesters)
        res = self.bed.run_mode(system.removeprefix("kvpool_"), None,
                                lambda _mode, _p: self._each_wave(result, self._kvpool_wave, progress))
        result.storage_link_bytes = res.holder_bytes
        result.switch_served_fraction = res.switch_served / res.fragments if res.fragments else 0.0
        return result

    def _kvpool_wave(self, wave: list[Request]) -> tuple[float, dict[int, float]]:
        """All requesters' agents fetch the prefix at the same instant; their end times (monotonic).

        Each holder's share comes from that holder; every chunk is compared with the published bytes.
        """
        hosts = self.bed.requesters()
        timeout = self.bed.deadline_s
        start = time.monotonic() + 0.3
        ends: dict[int, float] = {}

        def one(req: Request) -> None:
            time.sleep(max(0.0, start - time.monotonic()))
            error = self.bed.fetch(hosts[req.requester], req.keys, timeout)
            if error is None:
                ends[req.requester] = time.monotonic()  # one writer per key: no lock needed
                return
            log.error("%s: fetch failed: %s", hosts[req.requester].name, error)

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in wave]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return start, ends


def run_one(sbs: SideBySide, bar: Progress | None = None) -> dict[str, SystemResult]:
    """Build the network for ``sbs``'s N, run every system on it, tear it down (by PID)."""
    out: dict[str, SystemResult] = {}
    cfg = sbs.vs
    with sbs.running():
        for system in cfg.systems:
            advance = None
            if bar is not None:
                advance = functools.partial(bar.advance, bar.add_task(f"N={cfg.requesters:<3d}{system:17s}",
                                                                      total=cfg.waves))
            out[system] = sbs.run_mooncake(advance) if system == "mooncake" else sbs.run_kvpool(system, advance)
    return out


def run_side_by_side(configs: list[VsConfig], print_json: bool = False, prog: str = "bench_vs_mooncake") -> int:
    """Run every validated config (one N each), print the table (and JSON), write results under their ``out``.

    0 when every read was bit-identical; 1 when the run could not happen or something failed.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    reason = mininet_available()
    if reason:
        print(f"{prog}: {reason}", file=sys.stderr)
        return 1
    try:
        find_binary("mooncake_master")
    except MooncakeProcessError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    base = configs[0]
    out = base.out
    out.mkdir(parents=True, exist_ok=True)
    by_n: dict[int, dict[str, SystemResult]] = {}
    prefix_bytes = 0
    print(f"{prog}: target {base.target}, {base.topology}, storage links {base.holder_mbps:g} Mbit/s, N = "
          f"{' '.join(str(c.requesters) for c in configs)}, {base.waves} waves of a {base.hot_blocks}-chunk "
          "prefix per system", file=sys.stderr)
    try:
        with Progress(transient=True) as bar:
            for cfg in configs:
                sbs = SideBySide(cfg)
                prefix_bytes = sbs.prefix_bytes
                by_n[cfg.requesters] = run_one(sbs, bar)
                bar.console.print(vs_table({cfg.requesters: by_n[cfg.requesters]}), soft_wrap=True, highlight=False)
    except (NetworkError, RuntimeError, OSError, ValueError) as exc:  # TopologyError is a ValueError
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    text = vs_table(by_n)
    print(text)
    doc = {**vs_document(base, by_n, prefix_bytes), "run": run_info()}
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "results.txt").write_text(text + "\n")
    vs_plot(by_n, out / "vs_mooncake.png")
    print(f"{prog}: results and plot in {out}/ (results.json, results.txt, vs_mooncake.png)", file=sys.stderr)
    if print_json:
        print(json.dumps(doc))
    return 0 if all(r.failed == 0 for rs in by_n.values() for r in rs.values()) else 1
