"""Replay a prefix-reuse trace over a modelled cluster and compare switch-pool policies.

``kvpool sim`` reads a Mooncake-format JSONL trace (``--trace``) or generates a synthetic one,
then runs every combination of ``--nodes`` x ``--model`` x ``--switch-mib`` x ``--policy``
(each accepts a comma-separated list). It prints a results table, or with ``--json`` one JSON
object (a single configuration) or a JSON list (a sweep); ``--out DIR`` also writes
results.csv, results.json and plots.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

POLICY_CHOICES = ("value", "lru", "lfu", "gdsf", "s3fifo", "belady", "none", "holder")


def _list_of(conv: Callable[[str], T], what: str, check: Callable[[T], bool], need: str) -> Callable[[str], list[T]]:
    def parse(text: str) -> list[T]:
        """Split a comma-separated list and check each value."""
        out: list[T] = []
        for part in text.split(","):
            part = part.strip()
            try:
                v = conv(part)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{what}: {part!r} is not a valid number") from None
            if not check(v):
                raise argparse.ArgumentTypeError(f"{what}: {part!r} must be {need}")
            out.append(v)
        if not out:
            raise argparse.ArgumentTypeError(f"{what}: empty list")
        return out

    return parse


def _policies(text: str) -> list[str]:
    out = [p.strip().lower() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in POLICY_CHOICES]
    if bad or not out:
        choices = ", ".join(POLICY_CHOICES)
        raise argparse.ArgumentTypeError(f"unknown policy {', '.join(bad) or text!r} (choose from {choices})")
    return out


def _models(text: str) -> list[str]:
    from controller.sim.config import MODELS

    out = [m.strip().lower() for m in text.split(",") if m.strip()]
    bad = [m for m in out if m not in MODELS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unknown model {', '.join(bad) or text!r} (choose from {', '.join(MODELS)})")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``kvpool sim`` options."""
    g = parser.add_argument_group("trace")
    g.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace (default: a synthetic trace)")
    g.add_argument("--requests", type=int, default=20_000, help="synthetic trace: number of requests (default 20000)")
    g.add_argument("--rate", type=float, default=10.0, help="synthetic trace: arrivals per second (default 10)")
    g.add_argument("--zipf", type=float, default=1.1, help="synthetic trace: Zipf exponent of shared prefixes")
    g.add_argument("--prefixes", type=int, default=200, help="synthetic trace: number of shared prefixes")
    g.add_argument("--turns", type=float, default=3.0, help="synthetic trace: mean turns per session")
    g.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace and the routing (default 0)")
    g.add_argument(
        "--workload",
        choices=("tool", "docqa", "chat", "synthetic", "sysprompt"),
        help="no --trace: generate this family (kvpool workload) with --requests and --seed instead",
    )
    g.add_argument("--speedup", type=float, default=1.0, help="play the trace this many times faster (load x X)")
    g.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="tile the trace K times in time with fresh block ids (with --speedup K: K x the load, same duration)",
    )
    g.add_argument("--repeat-shared", action="store_true", help="with --repeat: copies keep their block ids")
    g.add_argument(
        "--overlay",
        type=int,
        default=1,
        help="play K copies at once, fresh ids, random phases: K x the load, think times kept (default 1)",
    )
    g = parser.add_argument_group("cluster (lists sweep)")
    g.add_argument(
        "--nodes",
        type=_list_of(int, "--nodes", lambda v: v > 0, "positive"),
        default=[64],
        help="inference nodes, e.g. 8,64,1024 (default 64)",
    )
    g.add_argument(
        "--switch-mib",
        type=_list_of(float, "--switch-mib", lambda v: v >= 0, "non-negative"),
        default=[1536.0],
        help="switch pool MiB per switch (default 1536)",
    )
    g.add_argument("--policy", type=_policies, default=["value"], help=f"one or more of {', '.join(POLICY_CHOICES)}")
    g.add_argument("--model", type=_models, default=["qwen2.5-0.5b"], help="qwen2.5-0.5b, llama3-8b, llama3-70b")
    g.add_argument("--holders", type=int, default=4, help="holder nodes of the DRAM pool (default 4)")
    g.add_argument("--switches", type=int, default=1, help="switches, each with its own pool (default 1)")
    g.add_argument("--hbm-gib", type=float, default=8.0, help="KV cache GiB in GPU memory per node (default 8)")
    g.add_argument("--dram-gib", type=float, default=32.0, help="KV cache GiB in host memory per node (default 32)")
    g.add_argument("--pool-gib", type=float, default=0.0, help="holders' pool GiB, 0 = unbounded (default 0)")
    g.add_argument("--node-gbps", type=float, default=100.0, help="node link Gbit/s (default 100)")
    g.add_argument("--holder-gbps", type=float, default=100.0, help="holder link Gbit/s (default 100)")
    g.add_argument(
        "--routing",
        choices=("random", "round_robin", "affinity"),
        default="random",
        help="affinity: to the node that last used the prompt's deepest block, unless busy (default random)",
    )
    g.add_argument(
        "--demote",
        choices=("all", "reused", "none"),
        default="all",
        help="what HBM evictions do: demote to DRAM, demote only chunks used twice, drop (default all)",
    )
    g.add_argument(
        "--promote-after",
        type=int,
        choices=(1, 2),
        default=1,
        help="keep a fetched chunk in HBM from its first or only its second use at a node (default 1)",
    )
    g.add_argument(
        "--fill-on-write",
        action="store_true",
        help="the switch may admit chunks as they pass on their way to the holders (prefetch the next turn)",
    )
    g.add_argument("--no-coalesce", action="store_true", help="switch does not coalesce identical fetches")
    g.add_argument(
        "--switch-preset",
        choices=("tofino1",),
        help="a switch that exists: tofino1 = the TNA program on one Tofino 1 pipe (2048 pending slots, "
        "32 waiters, no pool memory for KV chunks; overrides --switch-mib)",
    )
    g = parser.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print one JSON object (a list for sweeps) instead of a table")
    g.add_argument("--out", type=Path, help="write results.csv, results.json and plots into this folder")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _load_trace(args: argparse.Namespace) -> Any:
    from kvpool.trace import overlay, repeat, speed_up

    trace = overlay(_base_trace(args), args.overlay, seed=args.seed)
    return repeat(speed_up(trace, args.speedup), args.repeat, shared_ids=args.repeat_shared)


def _base_trace(args: argparse.Namespace) -> Any:
    from kvpool.trace import SyntheticSpec, TraceError, generate, read_jsonl

    if args.trace is not None:
        return read_jsonl(args.trace)
    if args.workload is not None:
        from kvpool.workloads import build

        return build(args.workload, n_requests=args.requests, seed=args.seed)
    spec = SyntheticSpec(
        n_requests=args.requests,
        rate_per_s=args.rate,
        n_prefixes=args.prefixes,
        zipf_s=args.zipf,
        mean_turns=args.turns,
        seed=args.seed,
    )
    options = {"n_requests": "--requests", "rate_per_s": "--rate", "n_prefixes": "--prefixes", "zipf_s": "--zipf"}
    options["mean_turns"] = "--turns"
    try:
        spec.validate()
    except TraceError as exc:
        msg = str(exc)
        for field, opt in options.items():
            msg = msg.replace(f"invalid {field}=", f"invalid {opt} ")
        raise TraceError(msg) from None
    return generate(spec)


COLUMNS = (
    ("nodes", "nodes", "{:d}"),
    ("model", "model", "{}"),
    ("switch_mib", "MiB", "{:g}"),
    ("policy", "policy", "{}"),
    ("switch_hit_ratio", "hit", "{:.4f}"),
    ("of_belady", "of Belady", "{:.3f}"),
    ("prefill_tokens_saved", "tokens saved", "{:d}"),
    ("holder_bytes_saved", "GiB off holders", "gib"),
    ("coalesced_fetches", "coalesced", "{:d}"),
    ("peak_incast", "incast", "{:d}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.1f}"),
    ("control_msgs_per_s", "ctrl msg/s", "{:.1f}"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text results table (one line per run)."""
    cells = [[h for _, h, _ in COLUMNS]]
    for r in rows:
        line = []
        for key, _, fmt in COLUMNS:
            v = r[key]
            line.append(f"{v / 2**30:.1f}" if fmt == "gib" else fmt.format(v))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    out = []
    for j, c in enumerate(cells):
        out.append("  ".join(s.rjust(w) for s, w in zip(c, widths, strict=True)))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Run the simulation(s); 2 on bad input, 0 otherwise."""
    from dataclasses import replace

    from controller.sim.config import MODELS, SWITCH_PRESETS, ClusterConfig, ConfigError
    from controller.sim.simulator import sweep, sweep_steps
    from kvpool.trace import TraceError

    preset = SWITCH_PRESETS[args.switch_preset] if args.switch_preset else None
    if preset is not None:
        args.switch_mib = [preset.switch_mib]
    try:
        trace = _load_trace(args)
        base = ClusterConfig(
            nodes=args.nodes[0],
            holders=args.holders,
            switches=args.switches,
            switch_mib=args.switch_mib[0],
            hbm_gib=args.hbm_gib,
            dram_gib=args.dram_gib,
            pool_gib=args.pool_gib,
            node_gbps=args.node_gbps,
            holder_gbps=args.holder_gbps,
            model=MODELS[args.model[0]],
            routing=args.routing,
            demote=args.demote,
            promote_after=args.promote_after,
            fill_on_write=args.fill_on_write,
            coalesce=not args.no_coalesce,
            seed=args.seed,
        )
        if preset is not None:
            base = preset.apply(base)
        base.validate()
        for n in args.nodes:
            for m in args.model:
                replace(base, nodes=n, model=MODELS[m], switches=min(base.switches, n)).validate()
    except (TraceError, ConfigError) as exc:
        print(f"kvpool sim: error: {exc}", file=sys.stderr)
        return 2
    total = sweep_steps(len(args.nodes), len(args.model), len(args.switch_mib), len(args.policy))
    show = not args.no_progress and sys.stderr.isatty()
    results: list[Any]
    if show:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("simulating", total=total)

            def tick(label: str, steps: float) -> None:
                """Move the bar to ``steps`` done, showing what runs now."""
                bar.update(task, completed=steps, description=label)

            results = sweep(
                trace,
                base,
                policies=args.policy,
                switch_mibs=args.switch_mib,
                nodes=args.nodes,
                models=args.model,
                progress=tick,
            )
    else:
        results = sweep(
            trace, base, policies=args.policy, switch_mibs=args.switch_mib, nodes=args.nodes, models=args.model
        )
    rows = [r.as_dict() for r in results]
    if args.out is not None:
        from controller.sim.report import write_outputs

        try:
            write_outputs(rows, args.out)
        except OSError as exc:
            print(f"kvpool sim: error: cannot write results to {args.out}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows, indent=None))
    else:
        name = args.workload or "synthetic"
        src = str(args.trace) if args.trace else f"{name} ({len(trace)} requests, seed {args.seed})"
        if args.speedup != 1.0 or args.repeat != 1 or args.overlay != 1:
            src += f", x{args.speedup:g} speed, {args.repeat} in time, {args.overlay} at once"
        print(f"trace: {src}; {len(trace)} requests, {trace.n_blocks} block refs")
        print(format_table(rows))
    return 0
