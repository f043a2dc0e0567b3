"""The simulator's older tables (markdown on stdout), now superseded by ``kvpool experiment``.

docs/research/README.md answers the questions these tables were for (q1 admission, q4 scale) with one
command each; this script keeps the older layout, computed with the current code.

Parts:
  policies   policies x switch-pool sizes on the Mooncake trace (64 nodes, Qwen2.5-0.5B)
  synthetic  the same comparison on synthetic traces with other seeds and skews
  scale      8 to 1024 nodes at a constant per-node request rate: what the pool saves
             against what it costs (holder traffic, incast, control messages)

    python scripts/sim_tables.py --part all
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from controller.sim.config import MODELS, ClusterConfig
from controller.sim.simulator import SimResult, sweep
from kvpool.trace import SyntheticSpec, generate, read_jsonl, shared_trace_path

#: the shared trace next to (or above) the checkout, or where KVPOOL_MOONCAKE_TRACE points
MOONCAKE = shared_trace_path()
ONLINE = ["value", "lru", "lfu", "gdsf", "s3fifo"]


def _md(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _verdict(rows: list[SimResult]) -> list[str]:
    """Per size: does value beat or tie (0.5 points) every online baseline on hit ratio and TTFT p99?"""
    lines = []
    for mib in sorted({r.switch_mib for r in rows if r.policy == "value"}):
        at = {r.policy: r for r in rows if r.switch_mib == mib}
        v = at["value"]
        worst_hit = max(at[p].switch_hit_ratio - v.switch_hit_ratio for p in ONLINE[1:])
        worst_p99 = max((v.ttft_p99_ms - at[p].ttft_p99_ms) / at[p].ttft_p99_ms for p in ONLINE[1:])
        ok = worst_hit <= 0.005 and worst_p99 <= 0.005
        lines.append(
            f"- {mib:g} MiB: value {'wins or ties' if ok else 'LOSES'} "
            f"(largest baseline lead in hit ratio {100 * worst_hit:+.2f} points, in TTFT p99 {100 * worst_p99:+.2f}%)"
        )
    return lines


def policies(trace_path: Path, mibs: list[float], model: str) -> None:
    """Policies x sizes on the Mooncake trace."""
    trace = read_jsonl(trace_path)
    base = ClusterConfig(nodes=64, model=MODELS[model])
    t0 = time.perf_counter()
    rows = sweep(trace, base, policies=[*ONLINE, "belady"], switch_mibs=mibs, nodes=[64])
    base_rows = sweep(trace, base, policies=["none", "holder"], switch_mibs=[mibs[0]], nodes=[64])
    dt = time.perf_counter() - t0
    c = replace(base, switch_mib=mibs[0])
    print(
        f"\nMooncake trace ({len(trace)} requests), 64 nodes, 4 holders, {model} "
        f"({c.chunk_bytes / 2**20:g} MiB per 512-token chunk), random routing; {dt:.0f} s to run.\n"
    )
    table = []
    for r in base_rows + rows:
        table.append(
            [
                "-" if r.policy in ("none", "holder") else f"{r.switch_mib:g} ({r.switch_chunks})",
                r.policy,
                f"{r.switch_hit_ratio:.4f}",
                f"{r.of_belady:.3f}" if r.policy not in ("none", "holder") else "-",
                f"{r.prefill_tokens_saved / 1e6:.2f}",
                f"{r.holder_bytes_saved / 2**30:.1f}",
                f"{r.holder_bytes / 2**30:.1f}",
                f"{r.ttft_p50_ms:.1f}",
                f"{r.ttft_p99_ms:.1f}",
                f"{r.control_msgs_per_s:.1f}",
            ]
        )
    print(
        _md(
            [
                "switch MiB (chunks)",
                "policy",
                "switch hit ratio",
                "of Belady",
                "Mtokens saved",
                "GiB off holders",
                "holder GiB",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "ctrl msg/s",
            ],
            table,
        )
    )
    print()
    print("\n".join(_verdict(rows)))


def synthetic(mibs: list[float], n: int) -> None:
    """Value against the best online baseline on synthetic traces."""
    print(f"\nSynthetic traces ({n} requests, 10 req/s), 64 nodes, qwen2.5-0.5b.\n")
    table = []
    for zipf in (0.8, 1.2):
        for seed in (1, 2):
            trace = generate(SyntheticSpec(n_requests=n, rate_per_s=10.0, zipf_s=zipf, seed=seed))
            rows = sweep(trace, ClusterConfig(seed=seed), policies=[*ONLINE, "belady"], switch_mibs=mibs, nodes=[64])
            for mib in mibs:
                at = {r.policy: r for r in rows if r.switch_mib == mib}
                v = at["value"]
                best = max(ONLINE[1:], key=lambda p: at[p].switch_hit_ratio)
                table.append(
                    [
                        f"{zipf:g}",
                        str(seed),
                        f"{mib:g}",
                        f"{v.switch_hit_ratio:.4f}",
                        f"{v.of_belady:.3f}",
                        f"{best} {at[best].switch_hit_ratio:.4f}",
                        f"{100 * (v.switch_hit_ratio - at[best].switch_hit_ratio):+.2f}",
                        f"{v.ttft_p99_ms:.1f} / {min(at[p].ttft_p99_ms for p in ONLINE[1:]):.1f}",
                    ]
                )
    print(
        _md(
            [
                "zipf",
                "seed",
                "switch MiB",
                "value hit",
                "of Belady",
                "best online",
                "value lead (points)",
                "TTFT p99 value / best",
            ],
            table,
        )
    )


def scale(nodes: list[int], rate_per_node: float, duration_s: float, mib: float, model: str, holders: int) -> None:
    """Nodes 8..1024 at a constant per-node request rate."""
    print(
        f"\nScale: synthetic trace at {rate_per_node:g} req/s per node for {duration_s:g} s, {holders} holders at "
        f"100 Gbit/s, switch pool {mib:g} MiB, {model}; controller cost 50 us per control message.\n"
    )
    table = []
    for n in nodes:
        trace = generate(SyntheticSpec(n_requests=int(n * rate_per_node * duration_s), rate_per_s=n * rate_per_node))
        cfg = ClusterConfig(model=MODELS[model], holders=holders)
        rows = sweep(trace, cfg, policies=["none", "holder", "value"], switch_mibs=[mib], nodes=[n])
        by = {r.policy: r for r in rows}
        none, hold, val = by["none"], by["holder"], by["value"]
        dur = val.duration_s
        gpu_saved = val.gpu_s_saved / dur  # GPU-seconds of prefill saved per second
        link_util = hold.holder_bytes / dur / (holders * 100e9 / 8)
        link_util_v = val.holder_bytes / dur / (holders * 100e9 / 8)
        table.append(
            [
                str(n),
                f"{len(trace) / dur:.0f}",
                f"{gpu_saved:.2f}",
                f"{val.transfer_s / dur:.2f}",
                f"{100 * link_util:.0f}% / {100 * link_util_v:.0f}%",
                f"{hold.peak_incast} / {val.peak_incast}",
                f"{none.ttft_p50_ms:.0f} / {hold.ttft_p50_ms:.0f} / {val.ttft_p50_ms:.0f}",
                f"{none.ttft_p99_ms:.0f} / {hold.ttft_p99_ms:.0f} / {val.ttft_p99_ms:.0f}",
                f"{val.control_msgs_per_s:.0f}",
                f"{100 * val.controller_load:.1f}%",
                "yes" if val.ttft_p50_ms < none.ttft_p50_ms and val.controller_load < 1.0 else "no",
            ]
        )
        print(f"  nodes={n} done", file=sys.stderr)
    print(
        _md(
            [
                "nodes",
                "req/s",
                "GPU-s saved /s",
                "transfer-s /s",
                "holder link load (holder / switch)",
                "peak incast (holder / switch)",
                "TTFT p50 ms (none / holder / switch)",
                "TTFT p99 ms (none / holder / switch)",
                "ctrl msg/s",
                "controller CPU",
                "pays",
            ],
            table,
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Print the requested tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("policies", "synthetic", "scale", "all"), default="all")
    ap.add_argument("--trace", type=Path, default=MOONCAKE)
    ap.add_argument("--switch-mib", default="384,1536,6144,24576", help="sizes for the policy tables")
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(MODELS))
    ap.add_argument("--synthetic-requests", type=int, default=20_000)
    ap.add_argument("--nodes", default="8,16,32,64,128,256,512,1024")
    ap.add_argument("--rate-per-node", type=float, default=0.5)
    ap.add_argument("--duration-s", type=float, default=300.0)
    ap.add_argument("--scale-mib", type=float, default=16384.0)
    ap.add_argument("--scale-model", default="llama3-8b", choices=sorted(MODELS))
    ap.add_argument("--holders", type=int, default=4)
    args = ap.parse_args(argv)
    mibs = [float(x) for x in args.switch_mib.split(",")]
    if args.part in ("policies", "all"):
        if args.trace.exists():
            policies(args.trace, mibs, args.model)
        else:
            print(f"policies part skipped: {args.trace} not found", file=sys.stderr)
    if args.part in ("synthetic", "all"):
        synthetic(mibs, args.synthetic_requests)
    if args.part in ("scale", "all"):
        scale(
            [int(x) for x in args.nodes.split(",")],
            args.rate_per_node,
            args.duration_s,
            args.scale_mib,
            args.scale_model,
            args.holders,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
