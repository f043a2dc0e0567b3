"""``kvpool demo``: the end-to-end experiment a new user runs first.

A star in Mininet (one switch of the chosen target, the holder ``h0`` behind a shaped
bottleneck link, ``N`` inference hosts), real ``kvpool-agent`` daemons in every host, the
controller in this process, and one request stream replayed three ways on the same
network:

* ``plain``: the switch only forwards (routes, no waiter ids): every requester's GETs
  reach the holder, which sends every fragment once per requester;
* ``multicast``: coalescing on: duplicate GETs are absorbed in the switch and the one
  answer is replicated to every waiter;
* ``pool``: coalescing plus the switch pool: the controller admits chunks the switch
  reports hot, the holder pushes them through the switch (fill on pass), and later GETs
  are answered by the switch itself.

The stream is the project's synthetic generator by default: waves in which every
requester asks at the same moment for a shared hot prefix (a system prompt), followed by
``--tail-blocks`` blocks of its own (none by default); ``--trace`` replays a
Mooncake-format file instead. Each requester
checks every chunk it receives against the holder's bytes (bit-identical or the run
fails). Between modes the switch gets a fresh pipeline (empty tables and registers).

Measured per mode: time to deliver each request's prefix (p50/p99), bytes on the
holder's link (both directions, from the switch port's counters), the fraction of
fragments the switch served, and the incast degree at the holder: the most GETs for one
fragment that reached it within 100 ms (from a capture of the holder link).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bmv2_topologies.experiment.config import DemoConfig, VsConfig
from bmv2_topologies.network import default_target


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``kvpool demo``."""
    d = DemoConfig()
    p.add_argument("--requesters", type=int, default=d.requesters, help="inference hosts (1..16, default 8)")
    p.add_argument("--target", choices=["model", "bmv2"], help="switch target (default bmv2 if simple_switch_grpc "
                   "is on PATH, else model)")
    p.add_argument("--modes", default=",".join(d.modes), help="comma-separated subset of plain,multicast,pool")
    p.add_argument("--trace", type=Path, help="replay this Mooncake-format JSONL trace instead of the waves")
    p.add_argument("--max-requests", type=int, default=d.max_requests, help="requests taken from --trace")
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="speed-up of --trace timestamps")
    p.add_argument("--waves", type=int, default=d.waves, help="waves of the synthetic stream (default 4)")
    p.add_argument("--hot-blocks", type=int, default=d.hot_blocks, help="blocks of the shared hot prefix")
    p.add_argument("--tail-blocks", type=int, default=d.tail_blocks, help="blocks of each request's own")
    p.add_argument("--wave-gap-ms", type=float, default=d.wave_gap_ms, help="time between waves (default 6000)")
    p.add_argument("--block-tokens", type=int, default=d.block_tokens, help="tokens per chunk (default 16)")
    p.add_argument("--holder-mbps", type=float, default=d.holder_mbps, help="holder link bandwidth (bottleneck)")
    p.add_argument("--window", type=int, default=d.window, help="fragments in flight per requester (default 600)")
    p.add_argument("--hold-ms", type=float, default=d.hold_ms,
                   help="holder waits this long before answering a GET, so GETs of requesters that start a little late "
                   "are coalesced too (default 100)")
    p.add_argument("--out", type=Path, default=d.out, help="where the table, JSON, plot and logs go")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", action="store_true", help="print one JSON object last (per mode: holder_bytes, ...)")
    p.add_argument("--impair", action="append", default=[], metavar="PORT:DIR:K=V,...",
                   help="impair the model switch's links (repeatable; switchmodel/impair.py), e.g. "
                   "--impair '*:both:corrupt=0.01,seed=1' (model target only)")
    p.add_argument("--vs-mooncake", action="store_true",
                   help="instead: Mooncake Store alone vs kvpool plain/multicast/pool fronting it, in waves "
                   "(scripts/bench_vs_mooncake.py runs it for several N); results in OUT/vs_mooncake/")


def run(args: argparse.Namespace) -> int:
    """Run the demo (or, with ``--vs-mooncake``, the side-by-side); 0 when every request got bit-identical chunks."""
    if args.vs_mooncake:
        d = VsConfig()
        base = VsConfig(target=args.target or default_target(), waves=args.waves, hot_blocks=args.hot_blocks,
                        holder_mbps=args.holder_mbps, window=args.window, out=args.out / "vs_mooncake",
                        systems=d.systems, settle_s=d.settle_s, segment_mib=d.segment_mib)
        try:
            configs = base.for_counts([args.requesters])
        except ValueError as exc:
            print(f"kvpool demo: {exc}", file=sys.stderr)
            return 2
        # The harness loads torch, gRPC and the controller: not for `kvpool --help`.
        from bmv2_topologies.experiment.sidebyside import run_side_by_side

        return run_side_by_side(configs, args.json, prog="kvpool demo")
    cfg = DemoConfig(requesters=args.requesters, target=args.target, modes=tuple(args.modes.split(",")),
                     trace=args.trace, max_requests=args.max_requests, time_scale=args.time_scale, waves=args.waves,
                     hot_blocks=args.hot_blocks, tail_blocks=args.tail_blocks, block_tokens=args.block_tokens,
                     wave_gap_ms=args.wave_gap_ms, window=args.window, hold_ms=args.hold_ms,
                     holder_mbps=args.holder_mbps, out=args.out, seed=args.seed, impair=tuple(args.impair))
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"kvpool demo: {exc}", file=sys.stderr)
        return 2
    # The harness loads torch, gRPC and the controller: not for `kvpool --help`.
    from bmv2_topologies.experiment.testbed import run_demo

    return run_demo(cfg, args.json)
