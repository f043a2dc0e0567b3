"""Trace replay grid: does the switch's help ever cost latency, fail a request, or miss the bytes it could save?

Runs ``kvpool demo --trace`` (all three modes on one Mininet star) for every cell of a grid:

* traces: ``conversation`` (the shared Mooncake conversation trace) and ``tool`` (agent and
  tool traffic: bursts of sessions re-sending long system prompts);
* ``--requests`` 48 and 200; ``--requesters`` 4 and 8; ``--time-scales`` 0.25 and 1;
  ``--mbps`` (holder link) 10 and 100; ``--target`` model.

Each flag takes a comma-separated subset, so one cell or a slice of the grid runs alone;
``--resume`` skips cells whose result is already in ``--out``; ``--lock PATH`` runs each
cell under ``flock PATH`` (a machine shared with other network-namespace users).  Ratios are
measured within a cell (the three modes run back to back on the same network).

One row per cell, then a last line::

    worst_slowdown_vs_plain=<x> failed=<n> bytes_saved_of_ideal=<f>

``worst_slowdown_vs_plain``: the largest p50 or p99 delivery time of multicast or pool over
plain's in the same cell; ``failed``: requests failed in any mode of any cell;
``bytes_saved_of_ideal``: the smallest, over cells and the two modes, of the bytes saved
against plain as a fraction of what the ideal saves (each chunk once per overlapping window,
``bmv2_topologies/experiment/load.py``), among cells where the ideal saves at least 1%.
Done when the first is at most 1.05, the second 0 and the third at least 0.5.

The tool trace comes from ``kvpool.workloads`` (``kvpool workload tool``) when that module
is installed, else from the small seeded generator below; the row says which.

    sudo .venv/bin/python scripts/bench_replay.py --lock /tmp/kvpool-netns.lock            # the grid
    sudo .venv/bin/python scripts/bench_replay.py --traces tool --requests 48 --requesters 4 \\
        --time-scales 1 --mbps 100                                                          # one cell
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.trace import Trace, TraceRequest, write_jsonl

CONVERSATION = Path("/work/shared/data/mooncake/conversation_trace_first_half.jsonl")
TRACES = ("conversation", "tool")
MODES = ("plain", "multicast", "pool")


@dataclass(frozen=True)
class Cell:
    """One replay: which trace, how many requests and requesters, how fast, over which link."""

    trace: str
    requests: int
    requesters: int
    time_scale: float
    mbps: float

    @property
    def name(self) -> str:
        """A file-system-safe name."""
        return f"{self.trace}-r{self.requests}-n{self.requesters}-t{self.time_scale:g}-m{self.mbps:g}"


def tool_trace(n_requests: int, seed: int = 0) -> Trace:
    """Agent and tool traffic, Mooncake format (the bench's own generator, used without ``kvpool.workloads``).

    Eight system prompts (tool schemas) of 4-16 blocks with Zipf(1) popularity; bursts of
    sessions (exponential gaps, 2 s mean) on one prompt, a geometric number of sessions
    (mean 6) starting within 1 s; each session takes a geometric number of agent steps (mean
    3) about 3 s apart, each step re-sending the previous prompt plus a tool result of 1-2
    new blocks.  The first ``n_requests`` requests by arrival time.
    """
    rng = random.Random(seed)
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    prompts = [fresh(rng.randint(4, 16)) for _ in range(8)]
    weights = [1 / (i + 1) for i in range(len(prompts))]
    reqs: list[tuple[float, list[int]]] = []
    t = 0.0

    def geometric(mean: float) -> int:
        return 1 + int(math.log(1 - rng.random()) / math.log(1 - 1 / mean)) if mean > 1 else 1

    while len(reqs) < 4 * n_requests:  # whole sessions, then keep the first n by arrival
        t += rng.expovariate(1 / 2.0)
        prompt = rng.choices(prompts, weights)[0]
        for _ in range(geometric(6.0)):
            at = t + rng.random()
            ids = list(prompt)
            for _ in range(geometric(3.0)):
                ids = ids + fresh(rng.randint(1, 2))
                reqs.append((at, ids))
                at += rng.expovariate(1 / 3.0)
    reqs.sort(key=lambda r: r[0])
    return Trace.from_requests([TraceRequest(round(at * 1000, 3), len(ids) * 512, 200, tuple(ids))
                                for at, ids in reqs[:n_requests]])


def make_tool_trace(path: Path, n_requests: int, seed: int) -> str:
    """Write the tool trace to ``path``; which generator made it."""
    try:  # by name: the module lands with the research work and may not be here yet
        workloads = importlib.import_module("kvpool.workloads")
    except ImportError:
        write_jsonl(tool_trace(n_requests, seed), path)
        return "bench_replay.tool_trace"
    write_jsonl(workloads.build("tool", n_requests=n_requests, seed=seed), path)
    return "kvpool.workloads tool"


def run_cell(cell: Cell, args: argparse.Namespace, trace: Path) -> dict[str, Any]:
    """One ``kvpool demo`` run (three modes); its JSON document, or ``{"error": ...}``."""
    out = args.out / cell.name
    cmd = [sys.executable, "-m", "kvpool.cli", "demo", "--trace", str(trace), "--max-requests", str(cell.requests),
           "--requesters", str(cell.requesters), "--time-scale", f"{cell.time_scale:g}",
           "--holder-mbps", f"{cell.mbps:g}", "--target", args.target, "--block-tokens", str(args.block_tokens),
           "--out", str(out), "--json"]
    if args.lock:
        cmd = ["flock", str(args.lock), *cmd]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (args.out / f"{cell.name}.log").write_text(proc.stderr + proc.stdout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"error": f"kvpool demo exited {proc.returncode} without results: {tail}"}
    doc: dict[str, Any] = json.loads(lines[-1])
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    return doc


def judge(doc: dict[str, Any]) -> dict[str, Any]:
    """Per cell: slowdowns against plain, failures, bytes saved of the ideal, per mode."""
    plain = doc["plain"]
    out: dict[str, Any] = {"failed": sum(int(doc[m]["failed"]) for m in MODES if m in doc)}
    for m in ("multicast", "pool"):
        if m not in doc:
            continue
        r = doc[m]
        slow = max(r["deliver_p50_ms"] / plain["deliver_p50_ms"], r["deliver_p99_ms"] / plain["deliver_p99_ms"])
        requested, ideal = r["requested_bytes"], r["ideal_bytes"]
        ideal_saving = 1 - ideal / requested if requested else 0.0
        saved = ((1 - r["holder_bytes"] / plain["holder_bytes"]) / ideal_saving
                 if ideal_saving >= 0.01 and plain["holder_bytes"] else None)
        out[m] = {"slowdown": slow, "bytes_vs_plain": r["holder_bytes"] / plain["holder_bytes"],
                  "ideal_vs_asked": ideal / requested if requested else 1.0, "saved_of_ideal": saved}
    return out


def row(cell: Cell, doc: dict[str, Any], source: str) -> str:
    """One printed line per cell."""
    head = (f"{cell.trace:12s} {cell.requests:4d} {cell.requesters:2d} {cell.time_scale:5g} {cell.mbps:5g}")
    if "error" in doc:
        return f"{head}  ERROR {doc['error']}"
    j = judge(doc)
    load = doc["offered"]["mean_bps"] / doc["offered"]["capacity_bps"]
    parts = [head, f"{load:6.2f}x"]
    for m in MODES:
        r = doc[m]
        parts.append(f"{r['deliver_p50_ms'] / 1e3:7.2f}/{r['deliver_p99_ms'] / 1e3:7.2f}")
    for m in ("multicast", "pool"):
        jm = j[m]
        saved = "-" if jm["saved_of_ideal"] is None else f"{jm['saved_of_ideal']:.2f}"
        parts.append(f"{jm['slowdown']:5.2f} {jm['bytes_vs_plain']:5.3f} {saved:>5s}")
    parts.append(f"{doc['multicast']['ideal_bytes'] / doc['multicast']['requested_bytes']:5.3f}")
    parts.append(f"{j['failed']:3d}")
    if cell.trace == "tool":
        parts.append(f"({source})")
    return "  ".join(parts)


HEADER = ("trace        reqs  N scale  Mbps    load  plain p50/p99 s    mcast p50/p99 s     pool p50/p99 s  "
          "mc slow bytes saved  pl slow bytes saved  ideal  failed")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen cells; 0 when every cell met the criteria, 1 otherwise (2: bad arguments)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--traces", default=",".join(TRACES), help="comma-separated subset of conversation,tool")
    ap.add_argument("--requests", default="48,200", help="requests replayed from each trace")
    ap.add_argument("--requesters", default="4,8", help="inference hosts")
    ap.add_argument("--time-scales", default="0.25,1", help="trace speed-ups (0.25: a quarter of the load)")
    ap.add_argument("--mbps", default="10,100", help="holder link bandwidths")
    ap.add_argument("--target", default="model", choices=["model", "bmv2"])
    ap.add_argument("--block-tokens", type=int, default=16, help="tokens of KV per trace block (demo --block-tokens)")
    ap.add_argument("--conversation", type=Path, default=CONVERSATION, help="the conversation trace (JSONL)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tool trace")
    ap.add_argument("--out", type=Path, default=Path("results/bench_replay"))
    ap.add_argument("--lock", type=Path, help="run each cell under flock on this file")
    ap.add_argument("--resume", action="store_true", help="reuse the results of cells already in --out")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    args = ap.parse_args(argv)
    try:
        traces = [t for t in args.traces.split(",") if t]
        bad = [t for t in traces if t not in TRACES]
        if bad:
            raise ValueError(f"--traces: unknown {bad[0]!r}; choose from {', '.join(TRACES)}")
        cells = [Cell(t, r, n, ts, m) for t, r, n, ts, m in itertools.product(
            traces, [int(x) for x in args.requests.split(",")], [int(x) for x in args.requesters.split(",")],
            [float(x) for x in args.time_scales.split(",")], [float(x) for x in args.mbps.split(",")])]
    except ValueError as exc:
        print(f"bench_replay: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for c in cells:
            print(c.name)
        return 0
    if "conversation" in traces and not args.conversation.exists():
        print(f"bench_replay: {args.conversation} not found (--conversation PATH)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    source = ""
    tool_path = args.out / "tool_trace.jsonl"
    if "tool" in traces:
        source = make_tool_trace(tool_path, max(c.requests for c in cells), args.seed)
    print(HEADER, flush=True)
    worst, failed, saved_min = 0.0, 0, math.inf
    ok = True
    for cell in cells:
        result_path = args.out / f"{cell.name}.json"
        if args.resume and result_path.exists():
            doc = json.loads(result_path.read_text())
        else:
            doc = run_cell(cell, args, args.conversation if cell.trace == "conversation" else tool_path)
            if "error" not in doc:
                doc["tool_source"] = source
                result_path.write_text(json.dumps(doc, indent=1) + "\n")
        print(row(cell, doc, doc.get("tool_source", source)), flush=True)
        if "error" in doc:
            ok = False
            continue
        j = judge(doc)
        failed += j["failed"]
        for m in ("multicast", "pool"):
            worst = max(worst, j[m]["slowdown"])
            if j[m]["saved_of_ideal"] is not None:
                saved_min = min(saved_min, j[m]["saved_of_ideal"])
    saved_text = "nan" if saved_min == math.inf else f"{saved_min:.3f}"
    print(f"worst_slowdown_vs_plain={worst:.3f} failed={failed} bytes_saved_of_ideal={saved_text}")
    met = ok and worst <= 1.05 and failed == 0 and (saved_min == math.inf or saved_min >= 0.5)
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
