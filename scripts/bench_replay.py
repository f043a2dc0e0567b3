"""Trace replay grid: does the switch's help ever cost latency, fail a request, or miss the bytes it could save?

Runs ``kvpool demo --trace`` (all three modes on one Mininet star) for every cell of a grid:

* traces: ``conversation`` (the shared Mooncake conversation trace), ``tool`` (``kvpool
  workload tool``: agent sessions re-sending long prompts) and ``sysprompt`` (``kvpool
  workload sysprompt``: a few long system prompts, each plus a short question);
* ``--requests`` 48 and 200; ``--requesters`` 4 and 8; ``--time-scales`` 0.25 and 1;
  ``--mbps`` (holder link) 10 and 100; ``--target`` model.

Each flag takes a comma-separated subset, so one cell or a slice of the grid runs alone;
``--resume`` skips cells whose result is already in ``--out`` (``--resume-since COMMIT``: only
results measured on that commit or a descendant of it, so a grid spread over several sittings
ends on one data path); ``--lock PATH`` runs each cell under ``flock PATH`` (a machine shared
with other network-namespace users).  Ratios are measured within a cell (the three modes run
back to back on the same network).

``--repeats K`` replays each cell K times and judges the K runs together: each mode's p50
and p99 are taken over the delivery times of all K replays, its bytes and failures summed.
A 48-request p50 is one request, and where a trace's delivery times have a gap it moves
with whichever request lands on either side (docs/design/notes-bench_replay.md).  Each
run's own slowdowns are kept in the cell's JSON (``runs``).

One row per cell, then a last line::

    worst_slowdown_vs_plain=<x> failed=<n> bytes_saved_of_ideal=<f>

The columns (``code``, ``pair``, ``sw MB``): docs/design/notes-bench_replay.md.

``worst_slowdown_vs_plain``: the largest p50 or p99 delivery time of multicast or pool over
plain's in the same cell; ``failed``: requests failed in any mode of any cell;
``bytes_saved_of_ideal``: the smallest, over cells and the two modes, of the DATA bytes saved
against plain as a fraction of what the ideal saves against plain (each chunk once per
overlapping window, ``bmv2_topologies/experiment/load.py``; DATA because the ideal counts no
GETs), among cells where the ideal saves at least 1% of plain's DATA bytes (``nan`` when none
does).  Done when the first is at most 1.05, the second 0 and the third at least 0.5.

    sudo .venv/bin/python scripts/bench_replay.py --lock /tmp/kvpool-netns.lock            # the grid
    sudo .venv/bin/python scripts/bench_replay.py --traces tool --requests 48 --requesters 4 \\
        --time-scales 1 --mbps 100                                                          # one cell
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmv2_topologies.experiment.report import percentile
from kvpool import workloads
from kvpool.report import saved_of_ideal
from kvpool.trace import shared_trace_path, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
TRACES = ("conversation", "tool", "sysprompt")
#: traces the bench generates (``kvpool workload FAMILY``), written to ``--out``/FAMILY_trace.jsonl
GENERATED = ("tool", "sysprompt")
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


def make_trace(family: str, path: Path, n_requests: int, seed: int) -> None:
    """Write ``kvpool workload FAMILY``'s trace of ``n_requests`` requests (its default family knobs) to ``path``."""
    write_jsonl(workloads.build(family, n_requests=n_requests, seed=seed), path)


def make_tool_trace(path: Path, n_requests: int, seed: int) -> None:
    """Write ``kvpool workload tool``'s trace of ``n_requests`` requests (its default family knobs) to ``path``."""
    make_trace("tool", path, n_requests, seed)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    """``git -C root ARGS``, its output captured; None where git cannot run."""
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def code_version(root: Path) -> str | None:
    """The commit ``root`` is checked out at, ``-dirty`` with uncommitted changes; None outside git."""
    proc = _git(root, "describe", "--always", "--dirty", "--abbrev=7")
    return (proc.stdout.strip() or None) if proc and proc.returncode == 0 else None


def measured_since(code: str | None, commit: str, root: Path) -> bool:
    """Whether a result measured on ``code`` ran on ``commit``'s data path or later (a clean descendant of it)."""
    if not code or code.endswith("-dirty"):
        return False
    proc = _git(root, "merge-base", "--is-ancestor", commit, code)
    return proc is not None and proc.returncode == 0


def run_name(cell: Cell, k: int) -> str:
    """The files of ``cell``'s ``k``-th replay (the first keeps the cell's own name)."""
    return cell.name if k == 0 else f"{cell.name}-k{k}"


def run_to_end(cmd: list[str], grace_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end, its output captured; interrupted (Ctrl-C, SIGTERM), end it cleanly first.

    A cell's ``kvpool demo`` stops its network, switch and agents (by PID) when it gets
    SIGTERM or SIGINT.  ``subprocess.run`` answers an interrupt with SIGKILL, which left a
    cell's nine agents running and its Mininet links in place. Here the cell runs in its
    own process group (``flock`` and the demo both get the signal) and is sent SIGTERM, given
    ``grace_s`` to clean up, and killed only after that.
    """
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_cell(cell: Cell, args: argparse.Namespace, trace: Path, k: int = 0) -> dict[str, Any]:
    """One ``kvpool demo`` run (three modes); its JSON document, or ``{"error": ...}``."""
    out = args.out / run_name(cell, k)
    cmd = [sys.executable, "-m", "kvpool.cli", "demo", "--trace", str(trace), "--max-requests", str(cell.requests),
           "--requesters", str(cell.requesters), "--time-scale", f"{cell.time_scale:g}",
           "--holder-mbps", f"{cell.mbps:g}", "--target", args.target, "--block-tokens", str(args.block_tokens),
           "--out", str(out), "--json"]
    if args.lock:
        cmd = ["flock", str(args.lock), *cmd]
    code = code_version(ROOT)  # before the run: the code its agents and switch start from
    t0 = time.monotonic()
    proc = run_to_end(cmd)
    (args.out / f"{run_name(cell, k)}.log").write_text(proc.stderr + proc.stdout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"error": f"kvpool demo exited {proc.returncode} without results: {tail}"}
    doc: dict[str, Any] = json.loads(lines[-1])
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    doc["code"] = code
    return doc


def paired_ratios(doc: dict[str, Any], mode: str) -> list[float]:
    """Per request, ``mode``'s delivery time over plain's, from one run's timelines (both delivered only).

    A timeline is ``[arrival s, requester, ms or None]`` per request, sorted; the two modes
    replay the same requests, so they pair by position.  Empty when either timeline is
    missing or they do not list the same requests.
    """
    mine, plain = doc.get(mode, {}).get("timeline"), doc.get("plain", {}).get("timeline")
    if not mine or not plain or len(mine) != len(plain):
        return []
    if any(a[:2] != b[:2] for a, b in zip(mine, plain, strict=True)):
        return []
    return [float(a[2]) / float(b[2]) for a, b in zip(mine, plain, strict=True)
            if a[2] is not None and b[2] is not None and float(b[2]) > 0]


_SUMMED = ("holder_bytes", "holder_data_bytes", "requested_bytes", "ideal_bytes", "failed", "requests")


def pool_runs(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """K replays of one cell as one: per mode, p50/p99 over every replay's delivery times, bytes and failures summed.

    One run is returned as it is.  The first run's ``offered`` stands for all (the same
    trace, link and scale); ``runs`` keeps each run's own judgement.
    """
    if len(docs) == 1:
        return docs[0]
    codes = sorted({str(d.get("code") or "-") for d in docs})
    out: dict[str, Any] = {"offered": docs[0]["offered"], "repeats": len(docs), "runs": [judge(d) for d in docs],
                           "code": codes[0] if len(codes) == 1 else "+".join(codes)}
    for m in MODES:
        if not all(m in d for d in docs):
            continue
        times = [float(t[2]) for d in docs for t in d[m]["timeline"] if t[2] is not None]
        merged: dict[str, Any] = {k: sum(int(d[m].get(k) or 0) for d in docs) for k in _SUMMED}
        worst: dict[str, int] = {}  # per switch, the worst run's median backlog
        for d in docs:
            for name, b in d[m].get("switch_backlog", {}).items():
                worst[name] = max(worst.get(name, 0), b["p50_bytes"])
        if worst:
            merged["switch_backlog"] = {name: {"p50_bytes": v} for name, v in worst.items()}
        if m != "plain":
            pairs = [paired_ratios(d, m) for d in docs]
            if all(pairs):
                merged["paired_ratios"] = [x for p in pairs for x in p]
        merged["deliver_p50_ms"] = percentile(times, 50)
        merged["deliver_p99_ms"] = percentile(times, 99)
        out[m] = merged
    return out


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
        # DATA bytes, as the ideal counts (``kvpool.report.saved_of_ideal``); cells run before the demo
        # reported them have only the link's bytes, GETs included.
        key = "holder_data_bytes" if r.get("holder_data_bytes") and plain.get("holder_data_bytes") else "holder_bytes"
        saved = saved_of_ideal(r[key], plain[key], ideal)
        pairs = r.get("paired_ratios") or paired_ratios(doc, m)
        out[m] = {"slowdown": slow, "bytes_vs_plain": r["holder_bytes"] / plain["holder_bytes"],
                  "ideal_vs_asked": ideal / requested if requested else 1.0, "saved_of_ideal": saved,
                  "paired_median": percentile(pairs, 50) if pairs else None}
    return out


def backlog_mb(mode_doc: dict[str, Any]) -> float | None:
    """The largest median port backlog (MB) of any switch in one mode's run; None for runs that did not sample it.

    Over about a megabyte the switch's CPU, not the links, set that mode's pace
    (``experiment.backlog``): its latencies measure the emulation.
    """
    backlog = mode_doc.get("switch_backlog")
    if backlog is None:
        return None
    return max((b["p50_bytes"] for b in backlog.values()), default=0) / 1e6


COLUMNS = ("trace", "reqs", "N", "scale", "Mbit/s", "load", "plain p50/p99 s", "mcast p50/p99 s", "pool p50/p99 s",
           "mc slow", "mc pair", "mc bytes", "mc saved", "pool slow", "pool pair", "pool bytes", "pool saved",
           "ideal", "switch MB", "failed", "runs", "code")
"""The columns of a cell's row (``row_values``), as printed and as ``--save`` keeps them."""
_WIDTHS = tuple(max(len(c), w) for c, w in zip(COLUMNS, (12, 4, 2, 5, 5, 7, 15, 15, 15, 5, 4, 5, 5, 5, 4, 5, 5, 5, 6,
                                                          3, 3, 0), strict=True))


def row_values(cell: Cell, doc: dict[str, Any]) -> list[str]:
    """One cell's row: its values as text, one per ``COLUMNS`` entry (fewer for a cell that failed to run)."""
    head = [cell.trace, str(cell.requests), str(cell.requesters), f"{cell.time_scale:g}", f"{cell.mbps:g}"]
    if "error" in doc:
        return [*head, f"ERROR {doc['error']}"]
    j = judge(doc)
    load = doc["offered"]["mean_bps"] / doc["offered"]["capacity_bps"]
    out = [*head, f"{load:.2f}x"]
    for m in MODES:
        r = doc[m]
        out.append(f"{r['deliver_p50_ms'] / 1e3:.2f}/{r['deliver_p99_ms'] / 1e3:.2f}")
    for m in ("multicast", "pool"):
        jm = j[m]
        out += [f"{jm['slowdown']:.2f}", "-" if jm["paired_median"] is None else f"{jm['paired_median']:.2f}",
                f"{jm['bytes_vs_plain']:.3f}", "-" if jm["saved_of_ideal"] is None else f"{jm['saved_of_ideal']:.2f}"]
    out.append(f"{doc['multicast']['ideal_bytes'] / doc['multicast']['requested_bytes']:.3f}")
    queued = [q for q in (backlog_mb(doc[m]) for m in MODES) if q is not None]
    out.append(f"{max(queued):.1f}" if queued else "-")
    out += [str(j["failed"]), str(doc.get("repeats", 1)), str(doc.get("code") or "-")]
    return out


def _line(values: Sequence[str]) -> str:
    """``values`` in the columns' widths (the first left-aligned); a cell that failed to run has fewer."""
    widths = zip(values, _WIDTHS, strict=False)
    return "  ".join(v.ljust(w) if k == 0 else v.rjust(w) for k, (v, w) in enumerate(widths))


def row(cell: Cell, doc: dict[str, Any]) -> str:
    """One printed line per cell."""
    return _line(row_values(cell, doc))


HEADER = _line(COLUMNS)


def _measuring_args(argv: Sequence[str]) -> list[str]:
    """``argv`` without the options that say where results go or come from (what the table records)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--save", "--out", "--resume-since", "--lock"):
            skip = True
        elif a != "--resume" and not a.startswith(("--save=", "--out=", "--resume-since=", "--lock=")):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the chosen cells; 0 when every cell met the criteria, 1 otherwise (2: bad arguments)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--traces", default=",".join(TRACES), help="comma-separated subset of conversation,tool,sysprompt")
    ap.add_argument("--requests", default="48,200", help="requests replayed from each trace")
    ap.add_argument("--requesters", default="4,8", help="inference hosts")
    ap.add_argument("--time-scales", default="0.25,1", help="trace speed-ups (0.25: a quarter of the load)")
    ap.add_argument("--mbps", default="10,100", help="holder link bandwidths")
    ap.add_argument("--target", default="model", choices=["model", "bmv2"])
    ap.add_argument("--block-tokens", type=int, default=16, help="tokens of KV per trace block (demo --block-tokens)")
    ap.add_argument("--conversation", type=Path, default=shared_trace_path(),
                    help="the conversation trace (JSONL; default: the shared Mooncake trace)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated traces (tool, sysprompt)")
    ap.add_argument("--out", type=Path, default=Path("results/bench_replay"))
    ap.add_argument("--lock", type=Path, help="run each cell under flock on this file")
    ap.add_argument("--repeats", type=int, default=1,
                    help="replays per cell, judged together (p50/p99 over all their requests)")
    ap.add_argument("--resume", action="store_true", help="reuse the results of cells already in --out")
    ap.add_argument("--resume-since", metavar="COMMIT",
                    help="with --resume, reuse only results measured on COMMIT or a later commit (clean checkout)")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    ap.add_argument("--save", metavar="NAME",
                    help="keep the table as results/NAME.json (kvpool report renders it in the docs)")
    ap.add_argument("--machine", help="with --save, a few words on the machine it ran on")
    args = ap.parse_args(argv)
    try:
        traces = [t for t in args.traces.split(",") if t]
        bad = [t for t in traces if t not in TRACES]
        if bad:
            raise ValueError(f"--traces: unknown {bad[0]!r}; choose from {', '.join(TRACES)}")
        cells = [Cell(t, r, n, ts, m) for t, r, n, ts, m in itertools.product(
            traces, [int(x) for x in args.requests.split(",")], [int(x) for x in args.requesters.split(",")],
            [float(x) for x in args.time_scales.split(",")], [float(x) for x in args.mbps.split(",")])]
        if args.repeats < 1:
            raise ValueError(f"--repeats: {args.repeats}; at least 1")
        if args.resume_since:
            if not args.resume:
                raise ValueError("--resume-since needs --resume")
            proc = _git(ROOT, "rev-parse", "--verify", "--quiet", f"{args.resume_since}^{{commit}}")
            if proc is None or proc.returncode != 0:
                raise ValueError(f"--resume-since: {args.resume_since!r} is not a commit of {ROOT}")
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
    for fam in GENERATED:
        if fam in traces:
            make_trace(fam, args.out / f"{fam}_trace.jsonl", max(c.requests for c in cells), args.seed)
    print(HEADER, flush=True)
    worst, failed, saved_min = 0.0, 0, math.inf
    table: list[list[str]] = []
    ok = True
    for cell in cells:
        runs = []
        for k in range(args.repeats):
            result_path = args.out / f"{run_name(cell, k)}.json"
            doc = json.loads(result_path.read_text()) if args.resume and result_path.exists() else {}
            if doc and args.resume_since and not measured_since(doc.get("code"), args.resume_since, ROOT):
                print(f"bench_replay: {result_path.name} ran on {doc.get('code') or 'an unrecorded commit'}, "
                      f"not on {args.resume_since} or later: running it again", file=sys.stderr, flush=True)
                doc = {}
            if not doc:
                generated = args.out / f"{cell.trace}_trace.jsonl"
                doc = run_cell(cell, args, args.conversation if cell.trace == "conversation" else generated, k)
                if "error" not in doc:
                    result_path.write_text(json.dumps(doc, indent=1) + "\n")
            runs.append(doc)
            if "error" in doc:
                break
        doc = runs[-1] if "error" in runs[-1] else pool_runs(runs)
        if len(runs) > 1 and "error" not in doc:
            (args.out / f"{cell.name}-pooled.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(row(cell, doc), flush=True)
        table.append(row_values(cell, doc))
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
    if args.save:
        from kvpool.report import save_table

        summary = {"worst_slowdown_vs_plain": worst, "failed": failed}
        if saved_min != math.inf:
            summary["bytes_saved_of_ideal"] = saved_min
        measured = _measuring_args(sys.argv[1:] if argv is None else argv)
        path = save_table(ROOT, args.save, "scripts/bench_replay.py", measured,
                          f"Trace replay grid on {args.target}", COLUMNS, table,
                          ["One row per cell; slow: the worse of p50 and p99 against plain's in the same run."],
                          machine=args.machine, summary=summary)
        print(f"bench_replay: kept as {path}")
    met = ok and worst <= 1.05 and failed == 0 and (saved_min == math.inf or saved_min >= 0.5)
    return 0 if met else 1


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C: the running cell is ended cleanly (``run_to_end``)."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    raise SystemExit(main())
