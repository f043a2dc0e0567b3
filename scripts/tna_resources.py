"""Summarise what bf-p4c placed in one Tofino pipe: p4/tna/build/resources.json.

bf-p4c (run with ``-g``) writes ``<out>/pipe/logs/resources.json``: every RAM, ALU and hash
bit of every stage, thousands of lines.  This keeps, per stage, how many of each unit the
program uses and how many the stage has, the stage count, and a digest of the sources, so
``tests/p4/test_tna.py`` can say "still fits one pipe" and "compiled from these sources"
without the compiler.  ``make -C p4 tna`` runs it after the compile:

    python -m scripts.tna_resources OUT_DIR --compiler "$(bf-p4c --version)" > p4/tna/build/resources.json

and ``--table SUMMARY`` turns that summary into ``results/tna-fit.json`` (a ``kvpool report``
table: used of available per stage, which p4/README.md shows).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvpool import contract

#: Summary unit -> (its resources.json member, the array of used units, how the total is found).
UNITS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "srams": ("rams", "srams", ("nRows", "nColumns")),
    "map_rams": ("map_rams", "maprams", ("nRows", "nUnits")),
    "tcams": ("tcams", "tcams", ("nRows", "nColumns")),
    "gateways": ("gateways", "gateways", ("nRows", "nUnits")),
    "stateful_alus": ("meter_alus", "meters", ("nAlus",)),
    "stats_alus": ("statistic_alus", "stats", ("nAlus",)),
    "logical_tables": ("logical_tables", "ids", ("size",)),
    "hash_bits": ("hash_bits", "bits", ("nBits", "nFunctions")),
    "hash_units": ("hash_distribution_units", "units", ("nHashIds", "nUnitIds")),
    "xbar_bytes": ("xbar_bytes", "bytes", ("size",)),
}


def phv_use(phv: dict[str, Any], resources: dict[str, Any]) -> dict[str, dict[str, int]]:
    """PHV containers the program allocated (bf-p4c's phv.json), of those the pipe has, by kind and width."""
    use: dict[str, dict[str, int]] = {}
    for kind, groups in resources["resources"].get("phv_containers", {}).items():
        for group in groups:
            use[f"{kind}{group['width']}"] = {"used": 0, "available": int(group["units"])}
    for container in phv.get("containers", []):
        key = f"{container['container_type']}{container['bit_width']}"
        use.setdefault(key, {"used": 0, "available": 0})["used"] += 1
    return use


def sources_digest(paths: list[Path]) -> str:
    """sha256 over the sources' names and bytes, in order."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _capacity(block: dict[str, Any], keys: tuple[str, ...]) -> int:
    total = 1
    for key in keys:
        total *= int(block[key])
    return total


def summarise(resources: dict[str, Any], compiler: str, digest: str,
              phv: dict[str, Any] | None = None) -> dict[str, Any]:
    """The per-stage summary of one bf-p4c resources.json (and its phv.json, for the PHV)."""
    mau = resources["resources"]["mau"]
    stages = []
    for stage in sorted(mau["mau_stages"], key=lambda s: int(s["stage_number"])):
        row: dict[str, Any] = {"stage": int(stage["stage_number"])}
        for unit, (member, entries, keys) in UNITS.items():
            block = stage.get(member)
            if block is None:
                continue
            row[unit] = {"used": len(block.get(entries, [])), "available": _capacity(block, keys)}
        stages.append(row)
    busy = [int(s["stage"]) for s in stages if any(v["used"] for k, v in s.items() if k != "stage")]
    totals = {unit: sum(s[unit]["used"] for s in stages if unit in s) for unit in UNITS}
    summary = {
        "program": str(resources.get("program_name", contract.TNA_MAIN.name)),
        "target": "tofino",
        "compiler": compiler,
        "sources_sha256": digest,
        "stages_available": int(mau["nStages"]),
        "stages_used": 1 + max(busy, default=-1),
        "totals": totals,
        "stages": stages,
    }
    if phv is not None:
        summary["phv_containers"] = phv_use(phv, resources)
    return summary


#: Columns of the per-stage table: (header, summary unit).
TABLE_UNITS: tuple[tuple[str, str], ...] = (
    ("logical tables", "logical_tables"), ("gateways", "gateways"), ("SRAM", "srams"), ("map RAM", "map_rams"),
    ("TCAM", "tcams"), ("stateful ALUs", "stateful_alus"), ("stats ALUs", "stats_alus"),
    ("hash units", "hash_units"), ("crossbar bytes", "xbar_bytes"),
)


def table_result(summary: dict[str, Any], commit: str, date: str) -> dict[str, Any]:
    """A ``kvpool report`` result of kind ``table``: per stage, used/available of each unit."""
    def cell(use: dict[str, int] | None) -> str:
        return "-" if use is None else f"{use['used']}/{use['available']}"

    rows = [[str(st["stage"]), *(cell(st.get(unit)) for _, unit in TABLE_UNITS)] for st in summary["stages"]]
    per_stage = {unit: next((st[unit]["available"] for st in summary["stages"] if unit in st), 0)
                 for _, unit in TABLE_UNITS}
    rows.append([f"pipe ({summary['stages_used']} of {summary['stages_available']} stages)",
                 *(f"{summary['totals'][unit]}/{per_stage[unit] * summary['stages_available']}"
                   for _, unit in TABLE_UNITS)])
    phv = ", ".join(f"{kind} {use['used']}/{use['available']}"
                    for kind, use in summary.get("phv_containers", {}).items())
    return {
        "kind": "table",
        "command": "make -C p4 tna",
        "commit": commit,
        "date": date,
        "machine": {"description": f"{summary['compiler']}, Tofino 1"
                                   + (", assembled by bfas" if summary.get("assembled") else "")},
        "note": f"PHV containers used/available: {phv}" if phv else "",
        "figures": {"columns": ["stage", *(h for h, _ in TABLE_UNITS)], "rows": rows},
    }


def main(argv: list[str] | None = None) -> int:
    """Print the summary of ``OUT_DIR/pipe/logs/resources.json`` as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, nargs="?", help="bf-p4c's output directory (-o)")
    parser.add_argument("--table", type=Path, metavar="SUMMARY",
                        help="print the results/tna-fit.json table of a summary this script wrote, instead")
    parser.add_argument("--compiler", default="bf-p4c", help="what compiled it (bf-p4c --version)")
    parser.add_argument("--assembled", action="store_true",
                        help="the assembler (bfas: the bf-p4c driver runs it) accepted the output")
    args = parser.parse_args(argv)
    if args.table is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=contract.TNA_DIR).stdout.strip()
        json.dump(table_result(json.loads(args.table.read_text()), commit, dt.date.today().isoformat()),
                  sys.stdout, indent=1)
        print()
        return 0
    if args.out_dir is None:
        parser.error("give bf-p4c's output directory, or --table SUMMARY")
    path = args.out_dir / contract.TNA_PIPE / "logs" / "resources.json"
    if not path.is_file():
        print(f"{path} is missing: compile with bf-p4c -g", file=sys.stderr)
        return 1
    phv_path = path.with_name("phv.json")
    phv = json.loads(phv_path.read_text()) if phv_path.is_file() else None
    summary = summarise(json.loads(path.read_text()), args.compiler.strip(),
                        sources_digest(contract.tna_sources()), phv)
    summary["assembled"] = args.assembled
    json.dump(summary, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
