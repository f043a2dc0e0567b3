"""Results of experiment runs: per-mode (demo) and per-system (side-by-side), as tables, JSON and plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmv2_topologies.experiment.backlog import Backlog
from bmv2_topologies.experiment.config import SYSTEMS, VsConfig
from kvpool.report import saved_of_ideal


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile of ``values``, nearest rank (NaN when empty)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


@dataclass(frozen=True)
class SwitchCounts:
    """What one switch did in one mode (its counters): where GETs were absorbed, hits served, slots filled."""

    absorbed: int = 0
    served: int = 0
    fills: int = 0
    collisions: int = 0
    expired: int = 0
    """GETs that found their pending slot expired (the earlier waiters' answer no longer multicast to them)."""

    def summary(self) -> dict[str, int]:
        """The per-switch JSON object."""
        return {"absorbed_gets": self.absorbed, "served_hits": self.served, "fills": self.fills,
                "pending_collisions": self.collisions, "pending_expired": self.expired}


@dataclass
class ModeResult:
    """What one mode measured."""

    mode: str
    requests: int = 0
    failed: int = 0
    deliver_ms: list[float] = field(default_factory=list)
    holder_bytes: int = 0
    """Both directions, every holder's link, summed."""
    holder_data_bytes: int = 0
    """DATA the holders sent (wire bytes): what the ideal counts, so what ``saved of ideal`` compares."""
    fabric_bytes: int = 0
    """Both directions, every link between two switches, summed (0 on a star)."""
    fragments: int = 0
    switch_served: int = 0
    coalesced: int = 0
    collisions: int = 0
    expired: int = 0
    """GETs that found their fragment's pending slot expired and took it over."""
    admitted: int = 0
    peak_incast: int = 0
    seconds: float = 0.0
    switches: dict[str, SwitchCounts] = field(default_factory=dict)
    switch_backlog: dict[str, Backlog] = field(default_factory=dict)
    """Per switch, bytes waiting in its ports' receive buffers while the mode ran (``experiment.backlog``)."""
    pcaps: dict[str, Path] = field(default_factory=dict)
    """Capture of each holder's link (kvpool headers), by holder; this mode's packets are those in ``window``."""
    window: tuple[float, float] = (0.0, 0.0)
    requested_bytes: int = 0
    """Wire bytes of every request's chunks (``experiment.load``)."""
    ideal_bytes: int = 0
    """This mode's ideal: everything asked in plain, each chunk once per overlapping window otherwise."""
    agents: dict[str, int] = field(default_factory=dict)
    """Transport counters the mode changed, summed over the agents (GETs, BUSY, retransmits, paths)."""
    timeline: list[tuple[float, int, float]] = field(default_factory=list)
    """Per request: when it started (s into the replay), which requester, its delivery time (ms; NaN: failed;
    None in the JSON)."""
    request_timing: list[dict[str, Any]] = field(default_factory=list)
    """Per replayed request, where its time went (``experiment.why``: its row in ``request_timing.json``)."""
    holder_wait: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per holder, how long its answers waited in its send queue this mode (``hostagent.timing.waits_between``)."""

    def percentile(self, q: float) -> float:
        """The q-th percentile of delivery times (ms), nearest rank."""
        return percentile(self.deliver_ms, q)

    def summary(self) -> dict[str, Any]:
        """The per-mode JSON object (``kvpool demo --json``)."""
        return {
            "holder_bytes": self.holder_bytes,
            "holder_data_bytes": self.holder_data_bytes,
            "deliver_p50_ms": round(self.percentile(50), 2),
            "deliver_p99_ms": round(self.percentile(99), 2),
            "switch_served_fraction": round(self.switch_served / self.fragments, 4) if self.fragments else 0.0,
            "peak_concurrent_gets_at_holder": self.peak_incast,
            "requests": self.requests,
            "failed": self.failed,
            "coalesced_gets": self.coalesced,
            "pending_collisions": self.collisions,
            "pending_expired": self.expired,
            "chunks_admitted": self.admitted,
            "seconds": round(self.seconds, 2),
            "fabric_bytes": self.fabric_bytes,
            "switches": {name: c.summary() for name, c in self.switches.items()},
            "switch_backlog": {name: b.summary() for name, b in self.switch_backlog.items()},
            "requested_bytes": self.requested_bytes,
            "ideal_bytes": self.ideal_bytes,
            "agents": dict(self.agents),
            "timeline": [[round(at, 3), who, None if math.isnan(ms) else round(ms, 1)]
                         for at, who, ms in sorted(self.timeline)],
        }



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


def _aligned(rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Rows as text columns: the first ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                    strict=True)))
                     for row in rows)


def demo_table(results: list[ModeResult]) -> str:
    """The demo's results as plain-text tables: one row per mode, then (several switches) one per mode and switch.

    "ideal MB" is the mode's ideal (``experiment.load``); "saved of ideal" the DATA bytes it
    saved against plain's as a fraction of what its ideal saves ("-" when the ideal saves under
    1%).  DATA, not "holder MB": the ideal counts chunks crossing, not the GETs that ask for them.
    """
    fabric = any(len(r.switches) > 1 for r in results)
    head = ("mode", "deliver p50 ms", "deliver p99 ms", "holder MB", "vs plain", *(("fabric MB",) if fabric else ()),
            "ideal MB", "saved of ideal", "switch-served", "peak incast", "failed")
    rows = [head]
    plain = next((r for r in results if r.mode == "plain"), None)
    for r in results:
        s = r.summary()
        ratio = f"{r.holder_bytes / plain.holder_bytes:.3f}" if plain and plain.holder_bytes else "-"
        saved = (saved_of_ideal(r.holder_data_bytes, plain.holder_data_bytes, r.ideal_bytes)
                 if plain is not None and r is not plain and plain.holder_data_bytes else None)
        rows.append((r.mode, f"{s['deliver_p50_ms']:.1f}", f"{s['deliver_p99_ms']:.1f}",
                     f"{r.holder_bytes / 1e6:.2f}", ratio, *((f"{r.fabric_bytes / 1e6:.2f}",) if fabric else ()),
                     f"{r.ideal_bytes / 1e6:.2f}", "-" if saved is None else f"{saved:.2f}",
                     f"{s['switch_served_fraction']:.1%}", str(r.peak_incast), str(r.failed)))
    text = _aligned(rows)
    if not fabric:
        return text
    per = [("mode", "switch", "absorbed GETs", "served hits", "fills", "collisions")]
    for r in results:
        for name, c in r.switches.items():
            per.append((r.mode, name, str(c.absorbed), str(c.served), str(c.fills), str(c.collisions)))
    return text + "\n\nwhere the switches helped (counters per switch)\n" + _aligned(per, left=2)


def demo_plot(results: list[ModeResult], path: Path) -> None:
    """Delivery time and holder-link bytes per mode, side by side."""
    import matplotlib  # heavy (about 1 s) and needed only once, at the end of a run

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



def summaries(results: dict[str, SystemResult]) -> dict[str, dict[str, Any]]:
    """Per-system JSON objects at one N, with ratios to Mooncake alone when it ran."""
    base = results.get("mooncake")
    return {s: r.summary(base) for s, r in results.items()}


def vs_table(by_n: dict[int, dict[str, SystemResult]]) -> str:
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


def vs_plot(by_n: dict[int, dict[str, SystemResult]], path: Path) -> None:
    """Time until all requesters have the prefix, and storage-link bytes, against N (log scales)."""
    import matplotlib  # heavy (about 1 s) and needed only once, at the end of a run

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


def vs_document(cfg: VsConfig, by_n: dict[int, dict[str, SystemResult]], prefix_bytes: int) -> dict[str, Any]:
    """The JSON document: per N, per system; with one N the systems are also top-level keys."""
    doc: dict[str, Any] = {
        "target": cfg.target,
        "topology": cfg.topology,
        "holder_mbps": cfg.holder_mbps,
        "prefix_bytes": prefix_bytes,
        "waves": cfg.waves,
        "requesters": sorted(by_n),
        "by_requesters": {str(n): summaries(r) for n, r in by_n.items()},
    }
    if len(by_n) == 1:
        doc.update(next(iter(doc["by_requesters"].values())))
    return doc
