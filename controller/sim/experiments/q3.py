"""q3 value recovery: what demoting evicted KV (instead of dropping it) recovers, and what it costs.

The boundary studied is a node's GPU HBM and its host DRAM: when HBM is full, the chunk it
evicts is demoted to DRAM (every one, or only chunks that node used more than once) or
dropped. Recovered value is what later hits in DRAM give back: chunks not fetched again from
the pool (bytes and time on the network) or, without a pool, tokens not recomputed. Its cost
is the copies HBM -> DRAM (PCIe bytes) and the DRAM it occupies. A DRAM hit promotes the chunk back
to HBM, so a demotion yields at most one DRAM hit: hits per demotion is the share that paid. Each family runs with the
holders' pool (sharing; no switch, to isolate the node tiers) and without it (each node alone),
at 64 nodes with Llama-3-8B (64 MiB chunks; 8 GiB of HBM is 128 chunks), for two DRAM sizes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.sim.config import MODELS, ClusterConfig
from controller.sim.experiments.common import Context, md_table, pyplot
from controller.sim.locality import plan
from controller.sim.simulator import run_policy

MODES = ("none", "all", "reused")
DRAM_GIB = (8.0, 32.0)


def run(ctx: Context) -> dict[str, Any]:
    """Every family x pool / no pool x DRAM size x demotion mode."""
    base = ClusterConfig(nodes=16 if ctx.quick else 64, model=MODELS["llama3-8b"], switch_mib=0.0, seed=ctx.seed)
    fams = ["conversation", "chat"] if ctx.quick else ctx.families()
    fams = [f for f in fams if f in ctx.families()]
    rows: list[dict[str, Any]] = []
    kvb = base.model.kv_bytes_per_token
    for fam in fams:
        trace = ctx.load(fam)
        for dram in DRAM_GIB:
            for mode in MODES:
                cfg = replace(base, dram_gib=dram, demote=mode)
                p = plan(trace, cfg)
                for sharing in ("holder", "none"):
                    r = run_policy(trace, p, cfg, sharing, belady_ratio=0.0)
                    refs = max(p.block_refs, 1)
                    dram_hits = round(r.dram_ratio * refs)
                    rows.append(
                        {
                            "family": fam,
                            "pool": sharing == "holder",
                            "dram_gib": dram,
                            "demote": mode,
                            "demoted_blocks": p.demoted_blocks,
                            "dram_hits": dram_hits,
                            "hits_per_demotion": dram_hits / p.demoted_blocks if p.demoted_blocks else 0.0,
                            "gib_demoted": p.demoted_blocks * cfg.chunk_bytes / 2**30,
                            "gib_recovered": float(p.dram_tokens.sum()) * kvb / 2**30,
                            "pcie_s": (p.demoted_blocks * cfg.chunk_bytes + float(p.dram_tokens.sum()) * kvb)
                            / (cfg.pcie_gbps * 1e9 / 8),
                            "gib_from_network": r.fetch_bytes / 2**30,
                            "prefill_mtokens": (r.prefill_tokens_total - r.prefill_tokens_saved) / 1e6,
                            "ttft_p50_ms": r.ttft_p50_ms,
                            "ttft_p99_ms": r.ttft_p99_ms,
                        }
                    )
        ctx.log(f"q3: {fam} done")
    return {"question": "q3", "model": base.model.name, "nodes": base.nodes, "rows": rows, "summary": summarize(rows)}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, pool, DRAM size): what demoting all / only reused chunks changes against dropping."""
    out = []
    at = {(r["family"], r["pool"], r["dram_gib"], r["demote"]): r for r in rows}
    for (fam, pool, dram, mode), r in at.items():
        if mode == "none":
            continue
        d = at[fam, pool, dram, "none"]
        out.append(
            {
                "family": fam,
                "pool": pool,
                "dram_gib": dram,
                "demote": mode,
                "recovered_blocks": r["dram_hits"],
                "network_gib_saved": d["gib_from_network"] - r["gib_from_network"],
                "prefill_mtokens_saved": d["prefill_mtokens"] - r["prefill_mtokens"],
                "gib_demoted": r["gib_demoted"],
                "hits_per_demotion": r["hits_per_demotion"],
                "ttft_p50_change": r["ttft_p50_ms"] / d["ttft_p50_ms"] - 1.0 if d["ttft_p50_ms"] else 0.0,
                "ttft_p99_change": r["ttft_p99_ms"] / d["ttft_p99_ms"] - 1.0 if d["ttft_p99_ms"] else 0.0,
            }
        )
    return out


def table(res: dict[str, Any]) -> str:
    """Recovered value against cost per (family, pool, DRAM size, mode), relative to dropping."""
    head = (
        f"q3: {res['nodes']} nodes, {res['model']} (64 MiB chunks, 8 GiB HBM = 128 chunks per node). Against "
        "dropping HBM evictions: blocks later hit in DRAM, network GiB and prefill tokens they saved, GiB copied "
        "HBM->DRAM, DRAM hits per demotion, TTFT change.\n\n"
    )
    rows = []
    for s in res["summary"]:
        rows.append(
            [
                s["family"],
                "pool" if s["pool"] else "no pool",
                f"{s['dram_gib']:g}",
                s["demote"],
                str(s["recovered_blocks"]),
                f"{s['network_gib_saved']:.0f}",
                f"{s['prefill_mtokens_saved']:.2f}",
                f"{s['gib_demoted']:.0f}",
                f"{s['hits_per_demotion']:.2f}",
                f"{100 * s['ttft_p50_change']:+.1f}% / {100 * s['ttft_p99_change']:+.1f}%",
            ]
        )
    return head + md_table(
        ["family", "sharing", "DRAM GiB", "demote", "blocks recovered", "network GiB saved", "Mtokens not recomputed",
         "GiB demoted", "DRAM hits per demotion", "TTFT p50 / p99 vs drop"],
        rows,
    )


def plot(res: dict[str, Any], path: Path) -> None:
    """DRAM hits per demotion, and TTFT p50 change, per family (32 GiB DRAM, with and without pool)."""
    plt = pyplot()
    fams = list(dict.fromkeys(s["family"] for s in res["summary"]))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    width = 0.2
    k = 0
    for pool in (True, False):
        for mode in ("all", "reused"):
            sel = {s["family"]: s for s in res["summary"] if s["pool"] == pool and s["demote"] == mode
                   and s["dram_gib"] == max(DRAM_GIB)}
            xs = [i + k * width for i in range(len(fams))]
            label = f"{mode}, {'pool' if pool else 'no pool'}"
            a1.bar(xs, [100 * sel[f]["hits_per_demotion"] for f in fams], width, label=label)
            a2.bar(xs, [100 * sel[f]["ttft_p50_change"] for f in fams], width, label=label)
            k += 1
    for ax, title in ((a1, "DRAM hits per 100 demotions"), (a2, "TTFT p50 vs dropping (%)")):
        ax.set_xticks([i + 1.5 * width for i in range(len(fams))])
        ax.set_xticklabels(fams, fontsize=8)
        ax.set_title(f"{title}, {max(DRAM_GIB):g} GiB DRAM", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    a1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
