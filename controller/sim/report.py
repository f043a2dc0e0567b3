"""Write simulator results: CSV, JSON and matplotlib plots (imported only when asked for)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def write_outputs(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write results.csv, results.json and the plots into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.csv", out / "results.json"]
    with written[0].open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    written[1].write_text(json.dumps(rows, indent=1) + "\n")
    written.extend(plot(rows, out))
    return written


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """Hit ratio and TTFT p99 against switch size, one line per policy (per nodes/model group)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(int(r["nodes"]), str(r["model"]))].append(r)
    paths: list[Path] = []
    for (nodes, model), rs in groups.items():
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        by_pol: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            by_pol[str(r["policy"])].append(r)
        for pol, prs in sorted(by_pol.items()):
            prs.sort(key=lambda r: float(r["switch_mib"]))
            xs = [float(r["switch_mib"]) for r in prs]
            ax1.plot(xs, [float(r["switch_hit_ratio"]) for r in prs], marker="o", label=pol)
            ax2.plot(xs, [float(r["ttft_p99_ms"]) for r in prs], marker="o", label=pol)
        for ax, title in ((ax1, "switch hit ratio"), (ax2, "TTFT p99 (ms)")):
            ax.set_xscale("symlog")
            ax.set_xlabel("switch pool (MiB)")
            ax.set_title(f"{title}: {nodes} nodes, {model}")
            ax.grid(True, alpha=0.3)
        ax1.legend(fontsize=8)
        fig.tight_layout()
        p = out / f"sim_{nodes}nodes_{model}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths
