"""Table entries written per second over P4Runtime: one update per Write vs batched Writes.

Starts the model switch (``kvpool-switch``) in its own process, or uses ``--address`` (for
example a ``simple_switch_grpc``), pushes the pipeline with the controller's driver, then
for each mode inserts N entries into one table and deletes them again, timing the inserts.
Prints a table and, last, ``batched_vs_single=<ratio>`` (batched entries/s over one-at-a-time
entries/s, both measured in this run).

    .venv/bin/python scripts/bench_p4rt.py                   # model switch, kvpool P4Info
    .venv/bin/python scripts/bench_p4rt.py --entries 1000 --batch 64 --batch 512
    .venv/bin/python scripts/bench_p4rt.py --address 127.0.0.1:9559 --json p4/build/kvpool.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from controller.p4runtime import Entry, P4RuntimeSwitch
from kvpool import contract
from kvpool.p4rt.p4info import P4Info, TableInfo

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_P4INFO = contract.P4INFO_PATH
FALLBACK_P4INFO = ROOT / "tests" / "data" / "p4rt_mini.p4info.txtpb"


def make_entries(p4info: P4Info, table: TableInfo, n: int) -> list[Entry]:
    """``n`` distinct entries for ``table``: the widest key field carries the entry number."""
    if not table.match_fields:
        raise SystemExit(f"bench_p4rt: table {table.name} has no key; pick another with --table")
    unique = max(table.match_fields, key=lambda f: f.bitwidth)
    if n > (1 << unique.bitwidth):
        raise SystemExit(f"bench_p4rt: {n} entries do not fit in key field {unique.name} (bit<{unique.bitwidth}>)")
    refs = [r for r in table.action_refs if r.scope != "DEFAULT_ONLY"]
    if not refs:
        raise SystemExit(f"bench_p4rt: table {table.name} has no action usable in entries")
    action = p4info.action(refs[0].action_id)
    entries = []
    for i in range(n):
        match: dict[str, int | tuple[int, int]] = {}
        for f in table.match_fields:
            v = i if f is unique else 0
            full = (1 << f.bitwidth) - 1
            if f.match_type == "lpm":
                match[f.name] = (v, f.bitwidth)
            elif f.match_type == "ternary":
                match[f.name] = (v, full)
            elif f.match_type == "range":
                match[f.name] = (v, v)
            elif f.match_type == "exact" or f is unique:
                match[f.name] = v
        params = {p.name: i & ((1 << p.bitwidth) - 1) for p in action.params}
        entries.append(Entry(table.name, match, action.name, params, 1 if table.needs_priority else 0))
    return entries


def start_model(p4info_path: Path) -> tuple[subprocess.Popen[str], str]:
    """Run ``kvpool-switch`` on a free port in a child process; returns it and its address."""
    proc = subprocess.Popen([sys.executable, "-m", "switchmodel.cli", "--grpc-addr", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "serving P4Runtime on" not in line:
        proc.kill()
        raise SystemExit(f"bench_p4rt: kvpool-switch did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def timed_insert(sw: P4RuntimeSwitch, entries: list[Entry], batch: int) -> float:
    """Seconds to insert ``entries`` in Writes of ``batch`` updates (then delete them, untimed)."""
    sw.batch_size = batch
    start = time.perf_counter()
    if batch == 1:
        for e in entries:
            sw.insert_entries([e])
    else:
        sw.insert_entries(entries)
    elapsed = time.perf_counter() - start
    sw.batch_size = 1024
    sw.delete_entries(entries)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--address", help="benchmark this P4Runtime switch instead of starting the model")
    parser.add_argument("--p4info", type=Path,
                        default=DEFAULT_P4INFO if DEFAULT_P4INFO.exists() else FALLBACK_P4INFO,
                        help="P4Info to push (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="device config (BMv2 JSON) to push with the P4Info")
    parser.add_argument("--table", help="table to fill (default: the largest table in the P4Info)")
    parser.add_argument("--entries", type=int, default=1000, help="entries per run (default %(default)s)")
    parser.add_argument("--batch", type=int, action="append", help="batch size(s) to compare (default 64 and 512)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per mode; the best is reported (default 2)")
    args = parser.parse_args(argv)
    if args.entries < 1 or args.repeat < 1:
        parser.error("--entries and --repeat must be positive")
    batches = sorted(set(args.batch or [64, 512]))
    if any(b < 2 for b in batches):
        parser.error("--batch sizes must be >= 2 (1 is the one-at-a-time baseline, always measured)")
    p4info = P4Info.load(args.p4info)
    table = p4info.table(args.table) if args.table else max(p4info.tables, key=lambda t: t.size)
    n = min(args.entries, table.size) if table.size else args.entries
    entries = make_entries(p4info, table, n)
    device_config = args.json.read_bytes() if args.json else b""

    proc = None
    address = args.address
    if address is None:
        proc, address = start_model(args.p4info)
    try:
        with P4RuntimeSwitch(address, p4info, device_config, timeout_s=10, reconnect=False) as sw:
            sw.connect()
            print(f"# {n} entries into {table.name} on {address} "
                  f"({'model switch' if proc else 'given switch'}), best of {args.repeat}", file=sys.stderr)
            rates: dict[int, float] = {}
            for batch in [1, *batches]:
                best = min(timed_insert(sw, entries, batch) for _ in range(args.repeat))
                rates[batch] = n / best
                print(f"#   batch {batch:>5}: {best * 1e3:8.1f} ms", file=sys.stderr, flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)

    print(f"{'mode':<12} {'batch':>6} {'entries':>8} {'entries/s':>11} {'vs single':>10}")
    for batch, rate in rates.items():
        mode = "single" if batch == 1 else "batched"
        print(f"{mode:<12} {batch:>6} {n:>8} {rate:>11.0f} {rate / rates[1]:>9.1f}x")
    best_batched = max(rates[b] for b in batches)
    print(f"batched_vs_single={best_batched / rates[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
