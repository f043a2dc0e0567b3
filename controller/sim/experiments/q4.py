"""q4 cost and benefit at scale: where the pool starts paying for itself and where it stops.

One dimension at a time around a base point (the conversation trace, 64 nodes, 4 holders, one
switch, 100 Gbit/s links, the trace's own load, Llama-3-8B), then a load x link-speed map.
Every point runs six configurations on the same requests:

- ``none``: no sharing (each node reuses only its own HBM and DRAM);
- ``holder``: the holders' DRAM pool (Mooncake Store) without any switch help;
- ``coalesce``: plus a switch that coalesces identical in-flight fetches and multicasts the
  answer, with no pool memory: the part of the switch that needs only per-fragment pending state
  (the P4 program's 65536 pending slots, 1.5 MiB, and their reply records) and works for any model size;
- ``tofino1``: coalescing as one Tofino 1 pipe can hold it (the TNA program, p4/tna/): 2,048
  pending slots per switch, direct-mapped, and waiter ids for 32 hosts per switch; no pool memory
  (its pool serves only fragments of at most 32 bytes, none of a KV chunk's);
- ``sram``: plus a 16 MiB switch pool (a Tofino's SRAM: two 6 MiB Qwen chunks, no Llama chunk);
- ``pool``: plus a 24 GiB switch-attached pool (value policy).

Load and scale add sessions, not speed: x load at N nodes plays ``load x N / 64`` copies of the
trace at once (fresh ids, each copy at its own phase; :func:`kvpool.trace.overlay`), so think
times stay real (compressing time instead would bring a conversation's next turn before its
previous one finished); below one copy the trace is slowed down instead. Leaf-spine: one leaf
per 32 nodes, each leaf with its own pool and its own coalescing, holders behind the spine (two
more switch traversals, 2 us, on a holder fetch).

Two maps: where the holders' pool pays at all (conversation trace, load x link speed), and where
the switch adds to it (bursty tool traffic against a single holder, nodes x link speed).

Coalescing in the simulator: a holder fetch of chunk k behind switch s is outstanding from when
it may start (the request's arrival, or the end of the prefill that produced k) until its last
byte lands (queueing on the holder's FIFO link + transfer + the holder round trip); another
fetch of k behind s that starts before then joins it, and no holder bytes move for it.
Requests overlap only within one transfer time of each other unless the holder link queues.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.sim.config import MODELS, SWITCH_PRESETS, ClusterConfig
from controller.sim.experiments.common import Context, head, md_table, pyplot
from controller.sim.locality import plan
from controller.sim.simulator import run_policy
from kvpool.trace import Trace, overlay, speed_up

BASE: dict[str, Any] = {
    "family": "conversation",
    "nodes": 64,
    "holders": 4,
    "topology": "1 switch",
    "gbps": 100.0,
    "load": 1.0,
    "model": "llama3-8b",
}
SWEEPS: dict[str, list[Any]] = {
    "nodes": [8, 32, 64, 256, 1024],
    "holders": [1, 4, 16],
    "topology": ["1 switch", "leaf-spine"],
    "gbps": [10.0, 25.0, 100.0, 400.0],
    "load": [1.0, 10.0, 30.0, 100.0],
    "model": ["qwen2.5-0.5b", "llama3-8b", "llama3-70b"],
    "family": ["conversation", "tool"],
}
QUICK_SWEEPS: dict[str, list[Any]] = {"nodes": [16, 64], "load": [1.0, 30.0], "family": ["conversation", "tool"]}
MAP_LOADS = (1.0, 3.0, 10.0, 30.0)
MAP_GBPS = (10.0, 25.0, 100.0, 400.0)
SWITCH_MAP_NODES = (64, 256, 1024)
#: base requests of every trace (the conversation trace's first 800 span about four minutes)
BASE_REQUESTS = 800
CONFIGS = ("none", "holder", "coalesce", "tofino1", "sram", "pool")
#: the configurations of the switch map (tool traffic against one holder: where coalescing matters)
SWITCH_MAP_CONFIGS = ("none", "holder", "coalesce", "tofino1", "pool")
POOL_MIB = 24576.0
SRAM_MIB = 16.0
#: the controller CPU the simulator charges per control message (table write, directory update)
CTRL_MSG_US = 50.0
#: a leaf-spine holder fetch crosses two more switches than a one-switch star
SPINE_EXTRA_US = 2.0


def _trace(base: Trace, nodes: int, load: float, seed: int = 0) -> Trace:
    """``base`` at ``load`` x its rate per node, for ``nodes`` nodes (the base trace is for 64)."""
    factor = load * nodes / 64.0
    if factor < 1.0:
        return speed_up(base, factor)
    copies = int(factor)
    return speed_up(overlay(base, copies, seed=seed), factor / copies)


def point(ctx: Context, traces: dict[str, Trace], pt: dict[str, Any], configs: tuple[str, ...] = CONFIGS
          ) -> dict[str, Any]:
    """Run every configuration at one point; returns benefit and cost metrics per configuration."""
    trace = _trace(traces[pt["family"]], pt["nodes"], pt["load"], ctx.seed)
    leaf = pt["topology"] == "leaf-spine"
    cfg0 = ClusterConfig(
        nodes=pt["nodes"],
        holders=pt["holders"],
        switches=max(1, pt["nodes"] // 32) if leaf else 1,
        node_gbps=pt["gbps"],
        holder_gbps=pt["gbps"],
        holder_rtt_us=25.0 + (SPINE_EXTRA_US if leaf else 0.0),
        model=MODELS[pt["model"]],
        switch_mib=0.0,
        ctrl_msg_us=CTRL_MSG_US,
        seed=ctx.seed,
    )
    p = plan(trace, cfg0)
    out: dict[str, Any] = dict(pt)
    out["requests"] = len(trace)
    out["requests_per_s"] = len(trace) / max(trace.duration_ms / 1e3, 1e-3)
    for name in configs:
        if name in ("none", "holder"):
            cfg, pol = cfg0, name
        elif name == "tofino1":
            cfg, pol = SWITCH_PRESETS["tofino1"].apply(cfg0), "value"
        else:
            mib = {"coalesce": 0.0, "sram": SRAM_MIB, "pool": POOL_MIB}[name]
            cfg, pol = replace(cfg0, switch_mib=mib), "value"
        r = run_policy(trace, p, cfg, pol, belady_ratio=0.0)
        out[name] = {
            "ttft_p50_ms": r.ttft_p50_ms,
            "ttft_p99_ms": r.ttft_p99_ms,
            "prefill_tokens_saved": r.prefill_tokens_saved,
            "holder_gib": r.holder_bytes / 2**30,
            "holder_link_load": r.holder_bytes / r.duration_s / (cfg.holders * cfg.holder_gbps * 1e9 / 8),
            "peak_incast": r.peak_incast,
            "coalesced": r.coalesced_fetches,
            "fetches": r.fetches,
            "switch_hit_ratio": r.switch_hit_ratio,
            "switch_chunks": r.switch_chunks,
            "control_msgs_per_s": r.control_msgs_per_s,
            "controller_load": r.controller_load,
            "policy_s": r.runtime_s,
        }
    # What the controller's engine costs: the pool run's replay time beyond the timing alone,
    # per observed fetch and as a share of one core over the trace's duration.
    if "pool" in out and "holder" in out and out["pool"]["fetches"]:
        engine_s = max(out["pool"]["policy_s"] - out["holder"]["policy_s"], 0.0)
        out["engine_us_per_fetch"] = engine_s / out["pool"]["fetches"] * 1e6
        out["engine_cpu_share"] = engine_s / max(trace.duration_ms / 1e3, 1e-3)
    out["extra_hops"] = 2 if leaf else 0
    out["switch_mib"] = {"coalesce": 0.0, "tofino1": SWITCH_PRESETS["tofino1"].switch_mib, "sram": SRAM_MIB,
                         "pool": POOL_MIB}
    return out


def run(ctx: Context) -> dict[str, Any]:
    """The one-at-a-time sweeps and the load x link-speed map."""
    reqs = 300 if ctx.quick else BASE_REQUESTS
    traces: dict[str, Trace] = {}
    sweeps = QUICK_SWEEPS if ctx.quick else SWEEPS
    fams = {*sweeps.get("family", []), BASE["family"], "tool"}
    for fam in fams:
        if fam == "conversation" and ctx.trace_path is None:
            continue
        traces[fam] = head(ctx.load(fam), reqs)
    base = dict(BASE)
    if base["family"] not in traces:  # no shared trace here: chat stands in for it
        base["family"] = "chat"
        traces["chat"] = head(ctx.load("chat"), reqs)
    points: list[dict[str, Any]] = []
    done: dict[tuple[Any, ...], dict[str, Any]] = {}
    for dim, values in sweeps.items():
        for v in values:
            pt = dict(base, **{dim: v})
            if pt["family"] not in traces:
                continue
            if dim == "holders" or dim == "topology":
                pt["nodes"] = 256 if not ctx.quick else 64
            key = tuple(sorted(pt.items()))
            if key not in done:
                done[key] = point(ctx, traces, pt)
                ctx.log(f"q4: {dim}={v} done")
            points.append(dict(done[key], sweep=dim))
    grid: list[dict[str, Any]] = []
    map_loads = (1.0, 10.0) if ctx.quick else MAP_LOADS
    map_gbps = (10.0, 100.0) if ctx.quick else MAP_GBPS
    for load in map_loads:
        for g in map_gbps:
            pt = dict(base, load=load, gbps=g)
            key = tuple(sorted(pt.items()))
            res = done.get(key) or point(ctx, traces, pt, ("none", "holder", "coalesce", "pool"))
            grid.append(res)
        ctx.log(f"q4: pool map at {load:g}x done")
    smap: list[dict[str, Any]] = []
    for n in (16, 64) if ctx.quick else SWITCH_MAP_NODES:
        for g in map_gbps:
            pt = dict(base, family="tool", holders=1, nodes=n, gbps=g)
            smap.append(point(ctx, traces, pt, SWITCH_MAP_CONFIGS))
        ctx.log(f"q4: switch map at {n} nodes done")
    return {"question": "q4", "base": base, "points": points, "map": grid, "switch_map": smap}


def _fmt_ms(v: float) -> str:
    return f"{v / 1000:.1f}s" if v >= 10_000 else f"{v:.0f}"


def table(res: dict[str, Any]) -> str:
    """Benefit and cost per sweep point; then the map."""
    b = res["base"]
    head = (
        f"q4: base point {b['family']} trace, {b['nodes']} nodes, {b['holders']} holders, {b['topology']}, "
        f"{b['gbps']:g} Gbit/s, {b['load']:g}x load, {b['model']}; one dimension varied per block. TTFT in ms "
        "(none / holder / coalesce / tofino1 / sram / pool); holder link load = mean over holder links; incast = most "
        "requests outstanding at one holder; coalesced = fetches that joined an in-flight one (coalesce-only / "
        "tofino1 / pool); ctrl = control messages/s and the controller CPU they cost at 50 us each.\n\n"
    )
    rows = []
    for p in res["points"]:
        cf = [c for c in CONFIGS if c in p]
        rows.append(
            [
                p["sweep"],
                str(p[p["sweep"]]),
                f"{p['requests_per_s']:.0f}",
                " / ".join(_fmt_ms(p[c]["ttft_p50_ms"]) for c in cf),
                " / ".join(_fmt_ms(p[c]["ttft_p99_ms"]) for c in cf),
                f"{p['holder']['prefill_tokens_saved'] / 1e6:.1f}",
                f"{100 * p['holder']['holder_link_load']:.0f}% / {100 * p['pool']['holder_link_load']:.0f}%",
                f"{p['holder']['peak_incast']} / {p['coalesce']['peak_incast']} / {p['pool']['peak_incast']}",
                f"{p['coalesce']['coalesced']} / {p['tofino1']['coalesced']} / {p['pool']['coalesced']}",
                f"{p['sram']['switch_hit_ratio']:.3f} / {p['pool']['switch_hit_ratio']:.3f}",
                f"{p['pool']['control_msgs_per_s']:.0f} ({100 * p['pool']['controller_load']:.1f}%)",
            ]
        )
    t = md_table(
        ["sweep", "value", "req/s", "TTFT p50", "TTFT p99", "Mtokens saved by pool", "holder link (holder/pool)",
         "peak incast (holder/coalesce/pool)", "coalesced", "switch hit (sram/pool)", "ctrl msg/s (CPU)"],
        rows,
    )
    mrows = []
    for g in res["map"]:
        mrows.append(
            [
                f"{g['load']:g}x",
                f"{g['gbps']:g}",
                _fmt_ms(g["none"]["ttft_p50_ms"]),
                _fmt_ms(g["holder"]["ttft_p50_ms"]),
                _fmt_ms(g["coalesce"]["ttft_p50_ms"]),
                _fmt_ms(g["pool"]["ttft_p50_ms"]),
                f"{_gain(g, 'holder', 'none'):.2f}",
                f"{_gain(g, 'coalesce', 'holder'):.2f}",
                f"{_gain(g, 'pool', 'coalesce'):.2f}",
                str(g["coalesce"]["coalesced"]),
            ]
        )
    m = md_table(
        ["load", "Gbit/s", "TTFT p50 none", "holder", "coalesce", "pool", "x holder vs none", "x coalesce vs holder",
         "x pool vs coalesce", "coalesced"],
        mrows,
    )
    srows = []
    for g in res["switch_map"]:
        srows.append(
            [
                str(g["nodes"]),
                f"{g['gbps']:g}",
                " / ".join(_fmt_ms(g[c]["ttft_p50_ms"]) for c in SWITCH_MAP_CONFIGS),
                " / ".join(_fmt_ms(g[c]["ttft_p99_ms"]) for c in SWITCH_MAP_CONFIGS),
                f"{100 * g['holder']['holder_link_load']:.0f}% / {100 * g['coalesce']['holder_link_load']:.0f}% / "
                f"{100 * g['pool']['holder_link_load']:.0f}%",
                f"{g['holder']['peak_incast']} / {g['coalesce']['peak_incast']} / {g['pool']['peak_incast']}",
                " / ".join(f"{g[c]['coalesced']} ({100 * g[c]['coalesced'] / max(g[c]['fetches'], 1):.0f}%)"
                           for c in ("coalesce", "tofino1")),
                f"{_gain(g, 'coalesce', 'holder'):.2f} / {_gain(g, 'pool', 'holder'):.2f}",
            ]
        )
    sm = md_table(
        ["nodes", "Gbit/s", "TTFT p50 none/holder/coalesce/tofino1/pool", "TTFT p99",
         "holder link (holder/coalesce/pool)", "peak incast", "coalesced (share of fetches): coalesce / tofino1",
         "x p50 coalesce, pool vs holder"],
        srows,
    )
    return (
        head + t + "\n\nWhere the pool pays (conversation trace, 64 nodes; TTFT p50 speed-up factors, > 1 = faster):"
        "\n\n" + m + "\n\nWhere the switch adds (tool traffic, 1 holder):\n\n" + sm
    )


def _gain(g: dict[str, Any], better: str, than: str) -> float:
    """How many times lower TTFT p50 is with ``better`` than with ``than``."""
    a, b = g[better]["ttft_p50_ms"], g[than]["ttft_p50_ms"]
    return b / a if a > 0 else math.inf


def plot(res: dict[str, Any], path: Path) -> None:
    """Left: where sharing pays (TTFT p50 none / holder) and where the switch adds to it, over load x link speed.

    Right: TTFT p50 per configuration along the nodes sweep.
    """
    plt = pyplot()
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    panels = (
        (res["map"], "load", "holder", "none", "pool pays (conversation): TTFT p50 none / holder"),
        (res["switch_map"], "nodes", "pool", "holder", "switch adds (tool, 1 holder): TTFT p50 holder / switch"),
    )
    for ax, (grid, xkey, better, than, title) in zip(axes[:2], panels, strict=True):
        xs = sorted({g[xkey] for g in grid})
        gbps = sorted({g["gbps"] for g in grid})
        at = {(g[xkey], g["gbps"]): g for g in grid}
        z = np.array([[_gain(at[x, g], better, than) for x in xs] for g in gbps])
        im = ax.imshow(np.log2(z), origin="lower", cmap="RdYlGn", vmin=-3, vmax=3, aspect="auto")
        for i in range(len(gbps)):
            for j in range(len(xs)):
                ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(xs)), [f"{v:g}x" if xkey == "load" else str(v) for v in xs])
        ax.set_yticks(range(len(gbps)), [f"{v:g}" for v in gbps])
        ax.set_xlabel(xkey)
        ax.set_ylabel("link Gbit/s")
        ax.set_title(title, fontsize=8)
        fig.colorbar(im, ax=ax, label="log2 factor")
    ax = axes[2]
    pts = sorted((p for p in res["points"] if p["sweep"] == "nodes"), key=lambda p: p["nodes"])
    for c in CONFIGS:
        if pts and c in pts[0]:
            ax.plot([p["nodes"] for p in pts], [p[c]["ttft_p50_ms"] for p in pts], marker="o", label=c)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes (load per node constant)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_title("nodes sweep", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
