"""``scripts/bench_vs_mooncake.py``: Mooncake Store alone vs kvpool in front of it, on a Mininet network per N.

The experiment itself (what runs, what is measured) is ``bmv2_topologies.experiment.sidebyside``;
this module is its command line. ``kvpool demo --vs-mooncake`` runs the same at one N.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bmv2_topologies.experiment.config import REQUESTER_COUNTS, SYSTEMS, TOPOLOGIES, VsConfig, knobs_help
from bmv2_topologies.network import default_target


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``scripts/bench_vs_mooncake.py``."""
    d = VsConfig()
    p.add_argument("--requesters", type=int, nargs="+", default=list(REQUESTER_COUNTS),
                   help="requester counts N, one network each (default 2 4 8 16)")
    p.add_argument("--topology", default=d.topology, metavar="|".join(TOPOLOGIES) + "|FILE.json",
                   help="the network: a star (default; one storage host), a leaf-spine (storage hosts h0 and h101 "
                   "on leaf s1, one store node each; requesters on the other leaves), or a topology JSON file")
    p.add_argument("--holders", type=int, help="storage hosts (default 1 on the star, 2 on the leaf-spine)")
    p.add_argument("--target", choices=["model", "bmv2"], help="switch target (default bmv2 if "
                   "simple_switch_grpc is on PATH, else model)")
    p.add_argument("--waves", type=int, default=d.waves, help=f"waves per system (default {d.waves})")
    p.add_argument("--hot-blocks", type=int, default=d.hot_blocks, help="chunks of the hot prefix (default 4)")
    p.add_argument("--holder-mbps", type=float, default=d.holder_mbps,
                   help="storage link bandwidth, the bottleneck (default 10)")
    p.add_argument("--window", type=int, default=d.window, help="fragments in flight per requester "
                   f"(default: the target's, {knobs_help('in_flight')})")
    p.add_argument("--out", type=Path, default=d.out, help="where the table, JSON, plot and logs go")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    p.add_argument("--systems", default=",".join(d.systems), help="comma-separated subset of " + ",".join(SYSTEMS))
    p.add_argument("--settle-s", type=float, default=d.settle_s, help="pause between waves (default 2)")
    p.add_argument("--segment-mib", type=int, default=d.segment_mib, help="DRAM the store node lends (default 256)")


def main(argv: list[str] | None = None) -> int:
    """``scripts/bench_vs_mooncake.py``: 0 when every read was bit-identical, 2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="bench_vs_mooncake.py", description=(__doc__ or "").splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    if any(not 1 <= n <= 16 for n in args.requesters):
        ap.error("--requesters: each N must be 1..16")
    base = VsConfig(target=args.target or default_target(), topology=args.topology, holders=args.holders,
                    waves=args.waves, hot_blocks=args.hot_blocks,
                    holder_mbps=args.holder_mbps, window=args.window, systems=tuple(args.systems.split(",")),
                    settle_s=args.settle_s, segment_mib=args.segment_mib, out=args.out)
    try:
        configs = base.for_counts(args.requesters)
    except ValueError as exc:
        print(f"bench_vs_mooncake: {exc}", file=sys.stderr)
        return 2
    # The harness loads torch, gRPC, Mooncake and the controller: only once the arguments are good.
    from bmv2_topologies.experiment.sidebyside import run_side_by_side

    return run_side_by_side(configs, args.json)
