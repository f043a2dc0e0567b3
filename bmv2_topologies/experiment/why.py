"""Where a replayed request's time went: per-request rows written beside ``results.json``, and their table.

``kvpool demo`` writes ``request_timing.json`` into its ``--out`` directory: per mode, one
row per replayed request (``request_row``: when it started, which requester, its delivery
time, and the transport's ``FetchTiming`` of its chunks summed over them, from every holder,
``hostagent.timing.summarize``), and per holder how long its answers waited in its send
queue during the mode (``holder_wait``).  ``render`` turns a results directory into the
table ``kvpool why`` prints: per mode, the request latency (p50/p99), the mean and p99 per
request of each component, what share of the fragments came coalesced or switch-served,
the holders' queueing, the switches' port backlog (from ``results.json``), and which
component dominates.

The components of a request are chunk-seconds: its chunks transfer at once, so their sums
may exceed its latency; what they say is how the chunks spent their time.  ``queue``,
``first byte`` and ``streaming`` follow each other (they add up to a chunk's time but for
its final check); ``BUSY`` and ``RTO`` waits lie inside the two after ``queue``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from bmv2_topologies.experiment.report import ModeResult, percentile

TIMING_FILE: Final = "request_timing.json"
"""The per-request rows, beside ``results.json``."""
RESULTS_FILE: Final = "results.json"
FORMAT: Final = 1

#: (row field, label) of the components that follow each other in a chunk's time.
PHASES: Final = (("queue_s", "queue at requester"), ("first_byte_s", "wait for first byte"),
                 ("stream_s", "streaming"))
#: (row field, label) of the waits inside those phases.
WAITS: Final = (("busy_s", "BUSY waits"), ("rto_s", "RTO waits"))


class WhyError(ValueError):
    """A results directory that cannot be read (one line, for the CLI)."""


def request_row(at_s: float, requester: int, chunks: int, elapsed_ms: float,
                timing: Mapping[str, Any]) -> dict[str, Any]:
    """One replayed request's row: start (s into the replay), requester, chunks asked, latency (ms; None:
    failed), and its chunks' ``hostagent.timing.summarize`` fields (summed over its holders)."""
    failed = math.isnan(elapsed_ms)
    row: dict[str, Any] = {"at_s": round(at_s, 3), "requester": requester, "chunks_asked": chunks,
                           "ms": None if failed else round(elapsed_ms, 2), "failed": failed}
    row.update(timing)
    return row


def timing_document(results: Sequence[ModeResult]) -> dict[str, Any]:
    """``request_timing.json``: per mode, its request rows (in start order) and its holders' answer waits."""
    return {"format": FORMAT,
            "modes": {r.mode: {"requests": sorted(r.request_timing, key=lambda row: (row["at_s"], row["requester"])),
                               "holder_wait": r.holder_wait} for r in results}}


# ---------------------------------------------------------------------------------- reading


def load(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A results directory's ``request_timing.json`` (checked) and ``results.json`` (None when absent).

    ``run_dir`` may also name one of those files.  ``WhyError`` with one line when unreadable.
    """
    if run_dir.is_file() and run_dir.name in (TIMING_FILE, RESULTS_FILE):
        run_dir = run_dir.parent
    if not run_dir.exists():
        raise WhyError(f"no such directory: {run_dir}")
    if not run_dir.is_dir():
        raise WhyError(f"{run_dir} is not a directory (give a replay's results directory, kvpool demo --out)")
    path = run_dir / TIMING_FILE
    if not path.is_file():
        raise WhyError(f"{run_dir} has no {TIMING_FILE}: not a replay's results directory, or written before "
                       "kvpool demo recorded per-request timing (run the replay again)")
    doc = _read_json(path)
    modes = doc.get("modes") if isinstance(doc, dict) else None
    if not isinstance(modes, dict) or not modes:
        raise WhyError(f"{path} is not valid: no modes")
    for mode, body in modes.items():
        rows = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise WhyError(f"{path} is not valid: mode {mode!r} has no list of request rows")
        if not isinstance(body.get("holder_wait", {}), dict):
            raise WhyError(f"{path} is not valid: mode {mode!r} has a holder_wait that is not an object")
    results = None
    if (run_dir / RESULTS_FILE).is_file():
        results = _read_json(run_dir / RESULTS_FILE)
        if not isinstance(results, dict):
            raise WhyError(f"{run_dir / RESULTS_FILE} is not valid: not a JSON object")
    return doc, results


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise WhyError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise WhyError(f"{path} is not valid JSON: {str(exc).splitlines()[0]}") from None


# ---------------------------------------------------------------------------------- the table


def _num(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name, 0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.1f}"


def _aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows as indented text columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows)
    return "\n".join(("  " + line).rstrip() for line in lines)


def shares(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each phase's and wait's share of the chunk time (the phases summed) over ``rows``; {} when none."""
    whole = sum(_num(r, name) for r in rows for name, _ in PHASES)
    if whole <= 0:
        return {}
    return {name: sum(_num(r, name) for r in rows) / whole for name, _ in (*PHASES, *WAITS)}


def dominant_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """Which component dominates: the largest phase's share of chunk time, and how much BUSY and RTO waits took."""
    share = shares(rows)
    if not share:
        return "dominant: nothing to say (no request with timing)"
    labels = dict((*PHASES, *WAITS))
    ranked = sorted((name for name, _ in PHASES), key=lambda n: -share[n])
    top = ranked[0]
    others = ", ".join(f"{labels[n]} {share[n]:.0%}" for n in ranked[1:])
    waits = ", ".join(f"{labels[n]} {share[n]:.0%}" for n, _ in WAITS)
    line = f"dominant: {labels[top]}, {share[top]:.0%} of the chunk time ({others}); inside them {waits}"
    big_wait = max((n for n, _ in WAITS), key=lambda n: share[n])
    if share[big_wait] >= 0.5 * share[top]:
        line += f": mostly {labels[big_wait]}"
    return line


def _holder_lines(waits: Mapping[str, Any]) -> list[str]:
    out = []
    for name in sorted(waits):
        w = waits[name]
        if not isinstance(w, dict) or not w.get("answers"):
            out.append(f"  holder queue {name}: no answers")
            continue
        n = int(w["answers"])
        line = (f"  holder queue {name}: {n} answers waited p50 {_ms(float(w.get('queue_p50_s', 0)))} ms, "
                f"p99 {_ms(float(w.get('queue_p99_s', 0)))} ms, mean {_ms(float(w.get('queue_sum_s', 0)) / n)} ms "
                "for their first DATA")
        held = int(w.get("held", 0))
        if held:
            line += f"; {held} held, {_ms(float(w.get('hold_sum_s', 0)) / held)} ms on average"
        out.append(line)
    return out


def _backlog_lines(mode_results: Mapping[str, Any] | None) -> list[str]:
    backlog = (mode_results or {}).get("switch_backlog") or {}
    if not isinstance(backlog, dict):
        return []
    out = []
    for name in sorted(backlog):
        b = backlog[name]
        if isinstance(b, dict) and b.get("samples"):
            out.append(f"  switch backlog {name}: p50 {int(b.get('p50_bytes', 0)) / 1e6:.1f} MB, "
                       f"max {int(b.get('max_bytes', 0)) / 1e6:.1f} MB at its ports")
    return out


def render_mode(mode: str, body: Mapping[str, Any], mode_results: Mapping[str, Any] | None = None) -> str:
    """One mode's table: latency, components (mean/p99 per request), fragments, holders, backlog, what dominates."""
    rows: list[Mapping[str, Any]] = body.get("requests", [])
    done = [r for r in rows if not r.get("failed") and isinstance(r.get("ms"), int | float)]
    latency = [float(r["ms"]) for r in done]
    timed = [r for r in done if "total_s" in r]
    head = (f"{mode}: {len(rows)} requests, {len(rows) - len(done)} failed; total p50 "
            f"{percentile(latency, 50):.1f} ms, p99 {percentile(latency, 99):.1f} ms")
    lines = [head]
    if not timed:
        lines.append("  no per-request timing recorded (the agents did not report it)")
    else:
        table = [("per request, summed over its chunks", "mean ms", "p99 ms", "share")]
        share = shares(timed)
        for name, label in (*PHASES, *WAITS):
            xs = [_num(r, name) for r in timed]
            inside = " (inside)" if (name, label) in WAITS else ""
            table.append((label + inside, _ms(_mean(xs)), _ms(percentile(xs, 99)),
                          f"{share.get(name, 0.0):.0%}" if share else "-"))
        rounds = [_num(r, "retransmit_rounds") for r in timed]
        busy = [_num(r, "busy") for r in timed]
        table.append(("retransmit rounds (count)", f"{_mean(rounds):.2f}", f"{percentile(rounds, 99):.0f}", ""))
        table.append(("BUSY NACKs (count)", f"{_mean(busy):.2f}", f"{percentile(busy, 99):.0f}", ""))
        lines.append(_aligned(table))
        frags = sum(_num(r, "fragments") for r in timed)
        if frags:
            lines.append(f"  fragments: {sum(_num(r, 'coalesced') for r in timed) / frags:.1%} coalesced replicas, "
                         f"{sum(_num(r, 'switch_served') for r in timed) / frags:.1%} switch-served, "
                         f"{sum(_num(r, 'duplicates') for r in timed) / frags:.1%} duplicates (of {frags:.0f} stored)")
        shared = sum(_num(r, "shared") for r in timed)
        if shared:
            lines.append(f"  {shared:.0f} chunks were taken from another request's transfer on the same node")
    holder = body.get("holder_wait") or {}
    lines += _holder_lines(holder if isinstance(holder, dict) else {})
    lines += _backlog_lines(mode_results)
    lines.append("  " + dominant_line(timed))
    return "\n".join(lines)


def render(run_dir: Path) -> str:
    """The breakdown of every mode of a replay's results directory (``WhyError`` when it cannot be read)."""
    doc, results = load(run_dir)
    parts = []
    for mode, body in doc["modes"].items():
        mode_results = (results or {}).get(mode)
        parts.append(render_mode(mode, body, mode_results if isinstance(mode_results, dict) else None))
    return "\n\n".join(parts)
