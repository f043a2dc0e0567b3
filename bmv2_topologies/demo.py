"""``kvpool demo``: the end-to-end experiment a new user runs first.

A network in Mininet: by default a star (one switch of the chosen target, the holder
``h0`` behind a shaped bottleneck link, ``N`` inference hosts); ``--topology leaf-spine``
a two-tier fabric (4 leaves, 2 spines; the holders on leaf ``s1`` behind shaped links,
the requesters dealt over the other leaves); or a topology JSON file. Real
``kvpool-agent`` daemons run in every host, the controller in this process, and one
request stream is replayed three ways on the same network:

* ``plain``: the switch only forwards (routes, no waiter ids): every requester's GETs
  reach the holder, which sends every fragment once per requester;
* ``multicast``: coalescing on: duplicate GETs are absorbed in the switch and the one
  answer is replicated to every waiter;
* ``pool``: coalescing plus the switch pool: the controller admits chunks the switches
  report hot and gives each to one switch (on the fabric, where its requesters' paths
  meet), the holder pushes them to it (fill on pass), and later GETs are answered by
  that switch.

The stream is the project's synthetic generator by default: waves in which every
requester asks at the same moment for a shared hot prefix (a system prompt), followed by
``--tail-blocks`` blocks of its own (none by default); ``--trace`` replays a
Mooncake-format file instead. Each requester
checks every chunk it receives against the holder's bytes (bit-identical or the run
fails). Between modes the switch gets a fresh pipeline (empty tables and registers).

Measured per mode: time to deliver each request's prefix (p50/p99), bytes on the
holders' links (both directions, from the switch ports' counters) and, on a fabric, on
the links between switches, the fraction of fragments the switches served, the incast
degree at the holders (the most GETs for one fragment that reached one within 100 ms,
from captures of the holder links), and per switch the GETs it absorbed, the hits it
served and the slots it filled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bmv2_topologies.experiment.config import TOPOLOGIES, DemoConfig, VsConfig, knobs_help
from bmv2_topologies.network import default_target


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``kvpool demo``."""
    d = DemoConfig()
    p.add_argument("--requesters", type=int, default=d.requesters,
                   help="inference hosts (1..16 on the star, 1..32 on the leaf-spine; default 8)")
    p.add_argument("--target", choices=["model", "bmv2"], help="switch target (default bmv2 if simple_switch_grpc "
                   "is on PATH, else model)")
    p.add_argument("--topology", default=d.topology, metavar="|".join(TOPOLOGIES) + "|FILE.json",
                   help="the network: a star (default), a leaf-spine, or a topology JSON file (its inference hosts "
                   "are the requesters)")
    p.add_argument("--leaves", type=int, default=d.leaves, help="leaves of the leaf-spine (default 4)")
    p.add_argument("--spines", type=int, default=d.spines, help="spines of the leaf-spine (default 2)")
    p.add_argument("--holders", type=int, help="holder hosts, chunks dealt over them (default 1 on the star, "
                   "2 on the leaf-spine)")
    p.add_argument("--fabric-mbps", type=float, default=d.fabric_mbps,
                   help="bandwidth of the links between switches (default 1000)")
    p.add_argument("--modes", default=",".join(d.modes), help="comma-separated subset of plain,multicast,pool")
    p.add_argument("--trace", type=Path, help="replay this Mooncake-format JSONL trace instead of the waves")
    p.add_argument("--max-requests", type=int, default=d.max_requests, help="requests taken from --trace")
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="speed-up of --trace timestamps")
    p.add_argument("--waves", type=int, default=d.waves, help="waves of the synthetic stream (default 4)")
    p.add_argument("--hot-blocks", type=int, default=d.hot_blocks, help="blocks of the shared hot prefix")
    p.add_argument("--tail-blocks", type=int, default=d.tail_blocks, help="blocks of each request's own")
    p.add_argument("--wave-gap-ms", type=float, default=d.wave_gap_ms, help="time between waves (default 6000)")
    p.add_argument("--block-tokens", type=int, default=d.block_tokens, help="tokens per chunk (default 16)")
    p.add_argument("--holder-mbps", type=float, default=d.holder_mbps,
                   help="bandwidth of each holder's link (the bottleneck, default 10)")
    p.add_argument("--window", type=int, default=d.window, help="fragments in flight per requester "
                   f"(default: the target's, {knobs_help('in_flight')})")
    p.add_argument("--chunk-window", type=int, default=d.chunk_window, help="most of them for one chunk "
                   f"(default: the target's, {knobs_help('chunk_window')}, within --window)")
    p.add_argument("--servable-window", type=int, default=d.servable_window, help="most of them for one chunk the "
                   "switches pool, whose answers come from a switch at once, in bursts its queues must hold "
                   f"(default: the target's, {knobs_help('servable_window')}; 0 = --chunk-window)")
    p.add_argument("--push-admitted", action="store_true",
                   help="pool mode: the holder pushes each chunk the controller admits, so its next fetch is a hit "
                   "(default: the answers that cross the switch fill it, which costs the holder no extra copy)")
    p.add_argument("--gather-ms", type=float, default=d.gather_ms,
                   help="how long a holder waits before it answers the head of a chunk the controller calls hot, "
                   f"so the GETs of a wave meet at a switch (default {d.gather_ms:g})")
    p.add_argument("--max-queue-ms", type=float, default=d.max_queue_ms,
                   help="sending time the holder queues before it answers GETs BUSY with a retry hint (default 1000)")
    p.add_argument("--deadline-s", type=float, default=d.deadline_s,
                   help="deadline of each replayed request (default: 10x the replay's bytes at line rate, 60-3600 s, "
                   "so only an unreachable holder fails a request)")
    p.add_argument("--out", type=Path, default=d.out, help="where the table, JSON, plot and logs go")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", action="store_true", help="print one JSON object last (per mode: holder_bytes, ...)")
    p.add_argument("--impair", action="append", default=[], metavar="PORT:DIR:K=V,...",
                   help="impair the model switch's links (repeatable; switchmodel/impair.py), e.g. "
                   "--impair '*:both:corrupt=0.01,seed=1' (model target only)")
    p.add_argument("--observe", action="store_true",
                   help="run Prometheus (from PATH; Debian: apt-get install -y prometheus) scraping every agent, "
                   "the controller and the model switches, and draw deploy/grafana/kvpool.json from it into "
                   "OUT/observe/dashboard.png")
    p.add_argument("--vs-mooncake", action="store_true",
                   help="instead: Mooncake Store alone vs kvpool plain/multicast/pool fronting it, in waves "
                   "(scripts/bench_vs_mooncake.py runs it for several N); results in OUT/vs_mooncake/")


def run(args: argparse.Namespace) -> int:
    """Run the demo (or, with ``--vs-mooncake``, the side-by-side); 0 when every request got bit-identical chunks."""
    if args.vs_mooncake:
        d = VsConfig()
        base = VsConfig(target=args.target or default_target(), topology=args.topology, holders=args.holders,
                        waves=args.waves, hot_blocks=args.hot_blocks,
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
    cfg = DemoConfig(requesters=args.requesters, target=args.target, topology=args.topology, leaves=args.leaves,
                     spines=args.spines, holders=args.holders, fabric_mbps=args.fabric_mbps,
                     modes=tuple(args.modes.split(",")),
                     trace=args.trace, max_requests=args.max_requests, time_scale=args.time_scale, waves=args.waves,
                     hot_blocks=args.hot_blocks, tail_blocks=args.tail_blocks, block_tokens=args.block_tokens,
                     wave_gap_ms=args.wave_gap_ms, window=args.window, chunk_window=args.chunk_window,
                     servable_window=args.servable_window,
                     max_queue_ms=args.max_queue_ms, gather_ms=args.gather_ms, push_admitted=args.push_admitted,
                     deadline_s=args.deadline_s,
                     holder_mbps=args.holder_mbps, out=args.out, seed=args.seed, impair=tuple(args.impair),
                     observe=args.observe)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"kvpool demo: {exc}", file=sys.stderr)
        return 2
    # The harness loads torch, gRPC and the controller: not for `kvpool --help`.
    from bmv2_topologies.experiment.testbed import run_demo

    return run_demo(cfg, args.json)
