"""kvpool against Mooncake Store alone, side by side on one Mininet star.

One star per requester count N: the storage host ``h0`` behind the shaped bottleneck
link runs a real Mooncake Store (``mooncake_master`` plus one store node lending DRAM,
``hostagent.mooncake_master``) and a ``kvpool-agent`` holder whose only tier is that
store (``--backend mooncake --dram-bytes 0``: every GET is answered from bytes read from
Mooncake). The hot prefix is published once into the store; then the same waves run
four ways:

* ``mooncake``: every inference node's Mooncake client gets the prefix's objects from
  the store over TCP (``bmv2_topologies.mooncake_reader``), the switch only forwarding;
* ``kvpool_plain``: kvpool agents fetch through the holder, the switch only forwarding;
* ``kvpool_multicast``: the switch coalesces duplicate GETs and multicasts the answer;
* ``kvpool_pool``: coalescing plus the switch pool filled with the hot chunks.

A wave is all N requesters asking for the whole prefix at the same instant; the next
wave starts after the last one has finished and the network has settled. Measured per
system: the time from a wave's start until every requester holds the whole prefix
(p50/p99 over waves), bytes on the storage host's link (both directions, from the
switch port's counters, every protocol), and both as ratios to Mooncake alone. Every
chunk every requester receives is checked against the published bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bmv2_topologies.demo import Demo, DemoConfig, ModeResult, Request, _link_bytes, build_workload, percentile
from bmv2_topologies.mooncake_reader import digest

log = logging.getLogger("kvpool.vs_mooncake")

SYSTEMS = ("mooncake", "kvpool_plain", "kvpool_multicast", "kvpool_pool")
REQUESTER_COUNTS = (2, 4, 8, 16)
STORAGE_PORT = "s1-eth1"
"""The switch port facing the storage host: its counters are the storage link's bytes."""


# ---------------------------------------------------------------------------------- config
@dataclass
class VsConfig:
    """One side-by-side run at one requester count (the flags of the script)."""

    # The network and the prefix are the demo's (its defaults, so the two stay alike).
    requesters: int = DemoConfig.requesters
    waves: int = 5
    hot_blocks: int = DemoConfig.hot_blocks
    holder_mbps: float = DemoConfig.holder_mbps
    target: str | None = None
    systems: tuple[str, ...] = SYSTEMS
    window: int = DemoConfig.window
    hold_ms: float = DemoConfig.hold_ms
    settle_s: float = 2.0
    """Pause between waves: pending GETs time out, and in pool mode the controller admits and fills."""
    segment_mib: int = 256
    out: Path = Path("results/vs_mooncake")
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first nonsensical option."""
        for s in self.systems:
            if s not in SYSTEMS:
                raise ValueError(f"--systems: unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
        if self.settle_s < 0:
            raise ValueError(f"--settle-s: invalid value {self.settle_s!r}")
        if self.segment_mib < 16:
            raise ValueError(f"--segment-mib: at least 16, got {self.segment_mib}")
        self.demo_config().validate()

    def demo_config(self) -> DemoConfig:
        """The demo's configuration for the same network and stream (waves of the hot prefix only)."""
        modes = tuple(s.removeprefix("kvpool_") for s in self.systems if s.startswith("kvpool_"))
        return DemoConfig(requesters=self.requesters, target=self.target, modes=modes, waves=self.waves,
                          hot_blocks=self.hot_blocks, tail_blocks=0, holder_mbps=self.holder_mbps,
                          window=self.window, hold_ms=self.hold_ms, out=self.out / f"n{self.requesters}",
                          seed=self.seed)


# ---------------------------------------------------------------------------------- results
@dataclass
class SystemResult:
    """What one system measured at one requester count."""

    system: str
    requesters: int
    all_done_ms: list[float] = field(default_factory=list)
    deliver_ms: list[float] = field(default_factory=list)
    storage_link_bytes: int = 0
    failed: int = 0
    switch_served_fraction: float = 0.0

    def summary(self, baseline: SystemResult | None = None) -> dict[str, Any]:
        """The per-system JSON object; ratios are to ``baseline`` (Mooncake alone) when given."""
        p50, p99 = percentile(self.all_done_ms, 50), percentile(self.all_done_ms, 99)
        out: dict[str, Any] = {
            "all_done_p50_ms": round(p50, 1),
            "all_done_p99_ms": round(p99, 1),
            "storage_link_bytes": self.storage_link_bytes,
            "deliver_p50_ms": round(percentile(self.deliver_ms, 50), 1),
            "waves": len(self.all_done_ms),
            "all_done_ms": [round(x, 1) for x in self.all_done_ms],
            "failed": self.failed,
            "switch_served_fraction": round(self.switch_served_fraction, 4),
        }
        if baseline is not None and baseline.all_done_ms and self.all_done_ms:
            out["speedup_vs_mooncake"] = round(percentile(baseline.all_done_ms, 50) / p50, 2)
            out["bytes_vs_mooncake"] = round(self.storage_link_bytes / max(1, baseline.storage_link_bytes), 4)
        return out


# ---------------------------------------------------------------------------------- the run
class SideBySide(Demo):
    """The demo's network and agents, plus a Mooncake Store on the holder that the holder fronts."""

    def __init__(self, cfg: VsConfig) -> None:
        demo_cfg = cfg.demo_config()
        super().__init__(demo_cfg, build_workload(demo_cfg))
        self.vs = cfg
        self.pool: subprocess.Popen[bytes] | None = None
        self.master = self.metadata = ""
        prefixes = {r.keys for r in self.workload.requests}
        if len(prefixes) != 1:
            raise ValueError("the side-by-side needs one shared prefix (no tail blocks)")
        self.prefix: tuple[int, ...] = prefixes.pop()
        self.digests = [digest(self.workload.blobs[k]) for k in self.prefix]

    @property
    def prefix_bytes(self) -> int:
        """Serialized bytes of the hot prefix (one copy)."""
        return sum(len(self.workload.blobs[k]) for k in self.prefix)

    # -------------------------------------------------------------- lifecycle
    def _start_agents(self) -> None:
        """Start the Mooncake pool on the holder first: the holder agent connects to it."""
        holder = self.topo.holders()[0]
        ready = self.run_dir / "mooncake.ready"
        self.pool = self.net.popen(holder.name, [
            sys.executable, "-m", "hostagent.mooncake_master", "--host", holder.address,
            "--segment-mib", str(self.vs.segment_mib), "--log-dir", str(self.run_dir.resolve()),
            "--ready-file", str(ready.resolve())], stdout=subprocess.DEVNULL,
            stderr=(self.run_dir / "mooncake.stderr").open("wb"))
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.pool.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Mooncake pool on {holder.name} did not start; see {self.run_dir}/mooncake.stderr "
                                   "and mooncake_master.log")
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        self.master, self.metadata = info["rpc_address"], info["metadata_url"]
        self.holder_args = ["--backend", "mooncake", "--mooncake-master", self.master,
                            "--mooncake-metadata-url", self.metadata, "--dram-bytes", "0"]
        super()._start_agents()

    def _stop_agents(self) -> None:
        super()._stop_agents()  # the holder agent first: it is a client of the pool
        if self.pool is not None and self.pool.poll() is None:
            self.pool.terminate()  # it stops the master and store node it started
            try:
                self.pool.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.pool.kill()
                self.pool.wait(timeout=5)
        self.pool = None

    # -------------------------------------------------------------- the systems
    def requesters(self) -> list[Any]:
        """Inference hosts in requester order (h1, h2, ...)."""
        return sorted(self.topo.inference_hosts(), key=lambda h: int(h.name[1:]))

    def waves(self) -> list[list[Request]]:
        """The stream's requests grouped by wave (same start time)."""
        by_time: dict[float, list[Request]] = {}
        for r in self.workload.requests:
            by_time.setdefault(r.at_s, []).append(r)
        return [by_time[t] for t in sorted(by_time)]

    def _each_wave(self, result: SystemResult, run_wave: Callable[[list[Request]], tuple[float, dict[int, float]]],
                   progress: Callable[[], None] | None) -> None:
        """Run the waves one after the other; ``run_wave`` returns its start and each good requester's end."""
        for i, wave in enumerate(self.waves()):
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
            with contextlib.ExitStack() as stack:
                readers = [stack.enter_context(self._reader(h, keys)) for h in self.requesters()]
                before = _link_bytes(STORAGE_PORT)  # after the clients connected, as for kvpool's agents
                self._each_wave(result, lambda wave: self._mooncake_wave(readers, wave), progress)
                result.storage_link_bytes = _link_bytes(STORAGE_PORT) - before

        self.run_mode("plain", None, waves)
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
    def _reader(self, host: Any, keys: str) -> Iterator[subprocess.Popen[bytes]]:
        """A ``mooncake_reader`` in ``host``, connected and ready; ended by PID on the way out."""
        err = (self.run_dir / f"{host.name}.mooncake_reader.log").open("wb")
        proc = self.net.popen(host.name, [
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
            err.close()

    def run_kvpool(self, system: str, progress: Callable[[], None] | None = None) -> SystemResult:
        """kvpool agents fetch the prefix through the holder, the switch programmed for ``system``."""
        result = SystemResult(system, self.vs.requesters)
        res = self.run_mode(system.removeprefix("kvpool_"), None,
                            lambda _mode, _p: self._each_wave(result, self._kvpool_wave, progress))
        result.storage_link_bytes = res.holder_bytes
        result.switch_served_fraction = res.switch_served / res.fragments if res.fragments else 0.0
        return result

    def _kvpool_wave(self, wave: list[Request]) -> tuple[float, dict[int, float]]:
        """All requesters' agents fetch the prefix at the same instant; their end times (monotonic)."""
        from hostagent.client import AgentClient
        from kvpool.httpjson import ApiError

        hosts = self.requesters()
        holder = f"{self.topo.holders()[0].address}:7470"
        timeout = self.cfg.fetch_timeout_s
        start = time.monotonic() + 0.3
        ends: dict[int, float] = {}

        def one(req: Request) -> None:
            client = AgentClient(self.api(hosts[req.requester].name), timeout=timeout + 5)
            time.sleep(max(0.0, start - time.monotonic()))
            try:
                keys, blobs, stopped = client.fetch_chunks(list(req.keys), holder, timeout=timeout, local=False)
                end = time.monotonic()
                if len(keys) != len(req.keys):
                    error = f"got {len(keys)} of {len(req.keys)} chunks ({stopped})"
                elif [digest(b) for b in blobs] != self.digests:
                    error = "bytes differ from the published prefix"
                else:
                    ends[req.requester] = end  # one writer per key: no lock needed
                    return
            except ApiError as exc:
                error = str(exc)
            log.error("%s: fetch failed: %s", hosts[req.requester].name, error)

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in wave]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return start, ends


def run_one(demo: SideBySide, bar: Any = None) -> dict[str, SystemResult]:
    """Build the star for ``demo``'s N, run every system on it, tear it down (by PID)."""
    out: dict[str, SystemResult] = {}
    cfg = demo.vs
    with demo.running():
        for system in cfg.systems:
            task = None if bar is None else bar.add_task(f"N={cfg.requesters:<3d}{system:17s}", total=cfg.waves)
            advance = None if bar is None else (lambda t=task: bar.advance(t))
            out[system] = demo.run_mooncake(advance) if system == "mooncake" else demo.run_kvpool(system, advance)
    return out


# ---------------------------------------------------------------------------------- output
def summaries(results: dict[str, SystemResult]) -> dict[str, dict[str, Any]]:
    """Per-system JSON objects at one N, with ratios to Mooncake alone when it ran."""
    base = results.get("mooncake")
    return {s: r.summary(base) for s, r in results.items()}


def table(by_n: dict[int, dict[str, SystemResult]]) -> str:
    """One row per (N, system): all-done p50/p99, storage-link bytes, and both against Mooncake alone."""
    rows = [("N", "system", "all-done p50 ms", "p99 ms", "storage MB", "faster than mooncake",
             "bytes vs mooncake", "switch-served", "failed")]
    for n, results in by_n.items():
        for system, s in summaries(results).items():
            rows.append((str(n), system, f"{s['all_done_p50_ms']:.0f}", f"{s['all_done_p99_ms']:.0f}",
                         f"{s['storage_link_bytes'] / 1e6:.2f}", f"{s.get('speedup_vs_mooncake', float('nan')):.2f}x",
                         f"{s.get('bytes_vs_mooncake', float('nan')):.3f}", f"{s['switch_served_fraction']:.0%}",
                         str(s["failed"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                  strict=True)))
                     for row in rows)


def plot(by_n: dict[int, dict[str, SystemResult]], path: Path) -> None:
    """Time until all requesters have the prefix, and storage-link bytes, against N (log scales)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain_numbers = FuncFormatter(lambda v, _: f"{v:g}")
    ns = sorted(by_n)
    systems = [s for s in SYSTEMS if any(s in by_n[n] for n in ns)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for s in systems:
        have = [n for n in ns if s in by_n[n] and by_n[n][s].all_done_ms]
        p50 = [percentile(by_n[n][s].all_done_ms, 50) for n in have]
        p99 = [percentile(by_n[n][s].all_done_ms, 99) for n in have]
        line = a.plot(have, p50, marker="o", label=s)[0]
        a.fill_between(have, p50, p99, color=line.get_color(), alpha=0.15)
        b.plot([n for n in ns if s in by_n[n]], [by_n[n][s].storage_link_bytes / 1e6 for n in ns if s in by_n[n]],
               marker="o", label=s)
    for ax, label in ((a, "time until all have the prefix (ms)\np50, band to p99"), (b, "bytes on storage link (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("simultaneous requesters N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(plain_numbers)
        ax.yaxis.set_minor_formatter(NullFormatter())
    a.legend(fontsize=8)
    fig.suptitle("hot prefix to N requesters: Mooncake Store alone vs kvpool in front of it")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def document(cfg: VsConfig, by_n: dict[int, dict[str, SystemResult]], prefix_bytes: int) -> dict[str, Any]:
    """The JSON document: per N, per system; with one N the systems are also top-level keys."""
    doc: dict[str, Any] = {
        "target": cfg.target,
        "holder_mbps": cfg.holder_mbps,
        "prefix_bytes": prefix_bytes,
        "waves": cfg.waves,
        "requesters": sorted(by_n),
        "by_requesters": {str(n): summaries(r) for n, r in by_n.items()},
    }
    if len(by_n) == 1:
        doc.update(next(iter(doc["by_requesters"].values())))
    return doc


# ---------------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser, *, many: bool = True) -> None:
    """Flags of ``scripts/bench_vs_mooncake.py`` (``many``) and of ``kvpool demo --vs-mooncake``."""
    d = VsConfig()
    if many:
        p.add_argument("--requesters", type=int, nargs="+", default=list(REQUESTER_COUNTS),
                       help="requester counts N, one star each (default 2 4 8 16)")
        p.add_argument("--target", choices=["model", "bmv2"], help="switch target (default bmv2 if "
                       "simple_switch_grpc is on PATH, else model)")
        p.add_argument("--waves", type=int, default=d.waves, help=f"waves per system (default {d.waves})")
        p.add_argument("--hot-blocks", type=int, default=d.hot_blocks, help="chunks of the hot prefix (default 4)")
        p.add_argument("--holder-mbps", type=float, default=d.holder_mbps,
                       help="storage link bandwidth, the bottleneck (default 10)")
        p.add_argument("--window", type=int, default=d.window, help="fragments in flight per requester (default 600)")
        p.add_argument("--out", type=Path, default=d.out, help="where the table, JSON, plot and logs go")
        p.add_argument("--json", action="store_true", help="print one JSON object last")
    p.add_argument("--systems", default=",".join(d.systems), help="comma-separated subset of " + ",".join(SYSTEMS))
    p.add_argument("--settle-s", type=float, default=d.settle_s, help="pause between waves (default 2)")
    p.add_argument("--segment-mib", type=int, default=d.segment_mib, help="DRAM the store node lends (default 256)")


def run(args: argparse.Namespace, counts: list[int], prog: str = "bench_vs_mooncake") -> int:
    """Run every N, print the table (and JSON), write results; 0 when every read was bit-identical."""
    from rich.progress import Progress

    from bmv2_topologies.network import NetworkError, default_target, mininet_available

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    target = args.target or default_target()
    base = VsConfig(target=target, waves=args.waves, hot_blocks=args.hot_blocks, holder_mbps=args.holder_mbps,
                    window=args.window, systems=tuple(args.systems.split(",")), settle_s=args.settle_s,
                    segment_mib=args.segment_mib, out=args.out)
    configs = []
    try:
        for n in counts:
            cfg = replace(base, requesters=n)
            cfg.validate()
            configs.append(cfg)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    reason = mininet_available()
    if reason:
        print(f"{prog}: {reason}", file=sys.stderr)
        return 1
    from hostagent.mooncake_master import MooncakeProcessError, find_binary

    try:
        find_binary("mooncake_master")
    except MooncakeProcessError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    base.out.mkdir(parents=True, exist_ok=True)
    by_n: dict[int, dict[str, SystemResult]] = {}
    prefix_bytes = 0
    print(f"{prog}: target {target}, storage link {base.holder_mbps:g} Mbit/s, N = "
          f"{' '.join(map(str, counts))}, {base.waves} waves of a {base.hot_blocks}-chunk prefix per system",
          file=sys.stderr)
    try:
        with Progress(transient=True) as bar:
            for cfg in configs:
                demo = SideBySide(cfg)
                prefix_bytes = demo.prefix_bytes
                by_n[cfg.requesters] = run_one(demo, bar)
                bar.console.print(table({cfg.requesters: by_n[cfg.requesters]}), soft_wrap=True, highlight=False)
    except (NetworkError, RuntimeError, OSError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    text = table(by_n)
    print(text)
    doc = document(base, by_n, prefix_bytes)
    (base.out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (base.out / "results.txt").write_text(text + "\n")
    plot(by_n, base.out / "vs_mooncake.png")
    print(f"{prog}: results and plot in {base.out}/ (results.json, results.txt, vs_mooncake.png)",
          file=sys.stderr)
    if args.json:
        print(json.dumps(doc))
    return 0 if all(r.failed == 0 for rs in by_n.values() for r in rs.values()) else 1


def main(argv: list[str] | None = None) -> int:
    """``scripts/bench_vs_mooncake.py``."""
    ap = argparse.ArgumentParser(prog="bench_vs_mooncake.py", description=(__doc__ or "").splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    if any(not 1 <= n <= 16 for n in args.requesters):
        ap.error("--requesters: each N must be 1..16 (one star port per requester)")
    return run(args, args.requesters)


def run_from_demo(args: argparse.Namespace) -> int:
    """``kvpool demo --vs-mooncake``: the side-by-side at the demo's ``--requesters`` and stream flags."""
    d = VsConfig()
    ns = argparse.Namespace(target=args.target, waves=args.waves, hot_blocks=args.hot_blocks,
                            holder_mbps=args.holder_mbps, window=args.window, out=args.out / "vs_mooncake",
                            json=args.json, systems=",".join(d.systems), settle_s=d.settle_s,
                            segment_mib=d.segment_mib)
    return run(ns, [args.requesters], prog="kvpool demo")
