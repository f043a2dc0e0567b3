"""q1 admission: which chunks deserve the switch pool, per workload family and pool size.

Every family (the shared conversation trace and the generated tool, docqa, chat and
synthetic ones) runs through the full simulator at 64 nodes with Qwen2.5-0.5B (12 KiB of KV
per token, so a 512-token chunk is 6 MiB and 16 MiB holds two chunks) for switch pools from
16 MiB (a switch's SRAM) to 24 GiB (switch-attached memory), under the reuse-value policy,
LRU, LFU, GDSF, S3-FIFO and offline Belady. Reported per cell: switch hit ratio (fetches the
switch served / chunk fetches), its share of Belady's, the tokens whose KV the switch served,
and the bytes it took off the holders' links (served or coalesced).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from controller.sim.config import MODELS, ClusterConfig
from controller.sim.experiments.common import Context, md_table, mib_label, pyplot
from controller.sim.locality import plan
from controller.sim.simulator import _switch_replay, run_policy

FULL_MIB = (16.0, 64.0, 256.0, 1024.0, 4096.0, 24576.0)
QUICK_MIB = (16.0, 256.0, 4096.0)
ONLINE = ("value", "lru", "lfu", "gdsf", "s3fifo")
BASELINES = ONLINE[1:]


def run(ctx: Context) -> dict[str, Any]:
    """Policies x sizes x families on the full simulator (64 nodes, Qwen2.5-0.5B)."""
    mibs = QUICK_MIB if ctx.quick else FULL_MIB
    base = ClusterConfig(nodes=16 if ctx.quick else 64, model=MODELS["qwen2.5-0.5b"], seed=ctx.seed)
    rows: list[dict[str, Any]] = []
    pool_saved: dict[str, int] = {}
    for fam in ctx.families():
        trace = ctx.load(fam)
        p = plan(trace, base)
        holder = run_policy(trace, p, base, "holder")
        pool_saved[fam] = holder.prefill_tokens_saved
        counts = np.sort(np.unique(p.fetch_key, return_counts=True)[1])[::-1] if p.n_fetches else np.zeros(0)
        for mib in mibs:
            cfg = replace(base, switch_mib=mib)
            bel = float(_switch_replay(p, cfg, "belady")[0].mean()) if p.n_fetches and cfg.switch_chunks else 0.0
            for pol in (*ONLINE, "belady"):
                r = run_policy(trace, p, cfg, pol, belady_ratio=bel)
                rows.append(
                    {
                        "family": fam,
                        "switch_mib": mib,
                        "chunks": cfg.switch_chunks,
                        "policy": pol,
                        "fetches": r.fetches,
                        "hit_ratio": r.switch_hit_ratio,
                        "belady_hit_ratio": bel,
                        "of_belady": r.of_belady if bel > 0 else 1.0,
                        "tokens_from_switch": _served_tokens(p, cfg, pol, r.switch_hits),
                        "gib_off_holders": (holder.holder_bytes - r.holder_bytes) / 2**30,
                        "coalesced": r.coalesced_fetches,
                        "ttft_p99_ms": r.ttft_p99_ms,
                        "a0_hit_ratio": _a0(counts, cfg.switch_chunks, p.n_fetches),
                    }
                )
            ctx.log(f"q1: {fam} {mib_label(mib)} done")
    return {
        "question": "q1",
        "model": base.model.name,
        "nodes": base.nodes,
        "sizes_mib": list(mibs),
        "prefill_tokens_saved_by_pool": pool_saved,
        "rows": rows,
        "target": target_check(rows),
    }


def _a0(counts: np.ndarray, chunks: int, fetches: int) -> float:
    """Static popularity oracle: the pool holds the ``chunks`` most fetched chunks of the whole trace.

    It knows popularity but not timing (each chunk's first fetch still misses); for traffic whose
    requests are independent draws from fixed popularities no online policy does better.
    """
    if fetches == 0 or chunks <= 0:
        return 0.0
    return float((counts[:chunks] - 1).sum()) / fetches


def _served_tokens(p: Any, cfg: ClusterConfig, policy: str, hits: int) -> int:
    """Tokens of KV the switch served: hits x tokens per chunk (full 512-token blocks but the tails)."""
    if hits == 0 or p.n_fetches == 0:
        return 0
    return round(hits * float(p.fetch_tokens.mean()))


def target_check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, size): does ``value`` reach the best baseline and 0.9 of Belady? One entry per cell."""
    cells: dict[tuple[str, float], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        cells[r["family"], r["switch_mib"]][r["policy"]] = r
    out = []
    for (fam, mib), at in cells.items():
        v = at["value"]
        best = max(BASELINES, key=lambda q: at[q]["hit_ratio"])
        out.append(
            {
                "family": fam,
                "switch_mib": mib,
                "value": v["hit_ratio"],
                "best_baseline": best,
                "best_baseline_hit_ratio": at[best]["hit_ratio"],
                "belady": v["belady_hit_ratio"],
                "of_belady": v["of_belady"],
                "a0_of_belady": v["a0_hit_ratio"] / v["belady_hit_ratio"] if v["belady_hit_ratio"] > 0 else 1.0,
                "beats_baselines": v["hit_ratio"] >= at[best]["hit_ratio"],
                "reaches_0_9_belady": v["of_belady"] >= 0.9,
            }
        )
    return out


def table(res: dict[str, Any]) -> str:
    """One line per (family, size, policy), then the target check per cell."""
    head = (
        f"q1: {res['nodes']} nodes, {res['model']} (6 MiB chunks), switch pool per size; hit ratio = switch-served "
        "fetches / chunk fetches.\n\n"
    )
    rows = []
    for r in res["rows"]:
        rows.append(
            [
                r["family"],
                f"{mib_label(r['switch_mib'])} ({r['chunks']})",
                r["policy"],
                f"{r['hit_ratio']:.4f}",
                f"{r['of_belady']:.3f}",
                f"{r['tokens_from_switch'] / 1e6:.2f}",
                f"{r['gib_off_holders']:.1f}",
                str(r["coalesced"]),
            ]
        )
    t1 = md_table(
        ["family", "switch (chunks)", "policy", "hit ratio", "of Belady", "Mtokens from switch", "GiB off holders",
         "coalesced"],
        rows,
    )
    saved = ", ".join(f"{f} {v / 1e6:.2f}M" for f, v in res["prefill_tokens_saved_by_pool"].items())
    t1 += (
        f"\n\nPrefill tokens saved by sharing through the holders' pool (the same under every switch policy, since "
        f"the holders keep every chunk): {saved}.\n\nTarget per cell (value >= best of LRU/LFU/GDSF/S3-FIFO, and >= "
        f"0.9 of Belady). A0 = a static oracle holding the most fetched chunks of the whole trace (knows "
        f"popularity, not timing):\n\n"
    )
    trows = []
    for c in res["target"]:
        trows.append(
            [
                c["family"],
                mib_label(c["switch_mib"]),
                f"{c['value']:.4f}",
                f"{c['best_baseline']} {c['best_baseline_hit_ratio']:.4f}",
                f"{c['belady']:.4f}",
                f"{c['of_belady']:.2f}",
                f"{c['a0_of_belady']:.2f}",
                "yes" if c["beats_baselines"] else "NO",
                "yes" if c["reaches_0_9_belady"] else "no",
            ]
        )
    t2 = md_table(
        ["family", "switch", "value", "best baseline", "Belady", "value of Belady", "A0 of Belady",
         ">= best baseline", ">= 0.9 Belady"],
        trows,
    )
    return head + t1 + t2


def plot(res: dict[str, Any], path: Path) -> None:
    """Share of Belady against pool size, one panel per family, one line per online policy."""
    plt = pyplot()
    fams = list(dict.fromkeys(r["family"] for r in res["rows"]))
    fig, axes = plt.subplots(1, len(fams), figsize=(3.2 * len(fams), 3.2), sharey=True, squeeze=False)
    for ax, fam in zip(axes[0], fams, strict=True):
        for pol in ONLINE:
            pts = sorted((r for r in res["rows"] if r["family"] == fam and r["policy"] == pol),
                         key=lambda r: r["switch_mib"])
            ax.plot([r["switch_mib"] for r in pts], [r["of_belady"] for r in pts], marker="o", markersize=3,
                    label=pol, linewidth=2.0 if pol == "value" else 1.0)
        ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_title(fam, fontsize=9)
        ax.set_xlabel("switch pool MiB", fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("hit ratio / Belady's")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
