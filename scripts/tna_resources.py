"""Summarise what bf-p4c placed in one Tofino pipe: p4/tna/build/resources.json.

bf-p4c (run with ``-g``) writes ``<out>/pipe/logs/resources.json``: every RAM, ALU and hash
bit of every stage, thousands of lines.  This keeps, per stage, how many of each unit the
program uses and how many the stage has, the stage count, and a digest of the sources, so
``tests/p4/test_tna.py`` can say "still fits one pipe" and "compiled from these sources"
without the compiler.  ``make -C p4 tna`` runs it after the compile:

    python -m scripts.tna_resources OUT_DIR --compiler "$(bf-p4c --version)" > p4/tna/build/resources.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
}


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


def summarise(resources: dict[str, Any], compiler: str, digest: str) -> dict[str, Any]:
    """The per-stage summary of one bf-p4c resources.json."""
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
    return {
        "program": str(resources.get("program_name", contract.TNA_MAIN.name)),
        "target": "tofino",
        "compiler": compiler,
        "sources_sha256": digest,
        "stages_available": int(mau["nStages"]),
        "stages_used": 1 + max(busy, default=-1),
        "totals": totals,
        "stages": stages,
    }


def main(argv: list[str] | None = None) -> int:
    """Print the summary of ``OUT_DIR/pipe/logs/resources.json`` as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="bf-p4c's output directory (-o)")
    parser.add_argument("--compiler", default="bf-p4c", help="what compiled it (bf-p4c --version)")
    args = parser.parse_args(argv)
    path = args.out_dir / contract.TNA_PIPE / "logs" / "resources.json"
    if not path.is_file():
        print(f"{path} is missing: compile with bf-p4c -g", file=sys.stderr)
        return 1
    summary = summarise(json.loads(path.read_text()), args.compiler.strip(),
                        sources_digest(contract.tna_sources()))
    json.dump(summary, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
