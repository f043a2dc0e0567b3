"""q2 tier flow: when should KV move between GPU HBM, host DRAM, the switch pool and the holders?

Five strategies, each the simulator with the reuse-value switch policy, 64 nodes, Llama-3-8B
(64 MiB chunks: 8 GiB of HBM holds 128, 32 GiB of DRAM 512, a 4 GiB switch pool 64):

- ``drop``: a chunk evicted from HBM is dropped; a later use fetches it from the pool again.
- ``demote``: HBM evictions are demoted to host DRAM (LRU there), used from DRAM over PCIe.
- ``promote-2nd``: as demote, but a chunk fetched from the pool or the switch is kept in HBM
  only from its second use at that node on (a first use streams through).
- ``prefetch``: as demote, and the chunks a request computes are offered to the switch pool as
  they pass on their way to the holders (fill on write), so the session's next turn, on
  whichever node, can find them one hop away: the switch's version of Mooncake's prefetch.
- ``affinity``: as demote, and a request goes to the node that last used the deepest block of
  its prompt unless that node is busy (Mooncake's conductor routes by prefix match): the next
  turn finds its KV in the node's own HBM.

At the trace's own load and at 10x (the same trace played ten times faster). Reported:
TTFT p50/p99, where each prompt block came from, and the bytes each tier moved.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.sim.config import MODELS, ClusterConfig
from controller.sim.experiments.common import Context, head, md_table, pyplot
from controller.sim.locality import plan
from controller.sim.simulator import run_policy
from kvpool.trace import speed_up

STRATEGIES: dict[str, dict[str, Any]] = {
    "drop": {"demote": "none"},
    "demote": {},
    "promote-2nd": {"promote_after": 2},
    "prefetch": {"fill_on_write": True},
    "affinity": {"routing": "affinity"},
}


def run(ctx: Context) -> dict[str, Any]:
    """Every strategy x family x load; one full simulator run each."""
    base = ClusterConfig(
        nodes=16 if ctx.quick else 64, model=MODELS["llama3-8b"], switch_mib=4096.0, seed=ctx.seed
    )
    loads = (1.0, 10.0)
    fams = ["conversation", "chat"] if ctx.quick else ctx.families()
    fams = [f for f in fams if f in ctx.families()]
    rows: list[dict[str, Any]] = []
    kvb = base.model.kv_bytes_per_token
    for fam in fams:
        trace0 = ctx.load(fam)
        if ctx.quick:
            trace0 = head(trace0, 600)
        for load in loads:
            trace = speed_up(trace0, load)
            for name, over in STRATEGIES.items():
                cfg = replace(base, **over)
                p = plan(trace, cfg)
                r = run_policy(trace, p, cfg, "value", belady_ratio=0.0)
                rows.append(
                    {
                        "family": fam,
                        "load": load,
                        "strategy": name,
                        "ttft_p50_ms": r.ttft_p50_ms,
                        "ttft_p99_ms": r.ttft_p99_ms,
                        "ttft_mean_ms": r.ttft_mean_ms,
                        "hbm": r.hbm_ratio,
                        "dram": r.dram_ratio,
                        "switch": r.switch_ratio,
                        "holders": r.pool_ratio,
                        "recompute": r.recompute_ratio,
                        "gib_dram_to_hbm": float(p.dram_tokens.sum()) * kvb / 2**30,
                        "gib_hbm_to_dram": p.demoted_blocks * cfg.chunk_bytes / 2**30,
                        "gib_holders_to_nodes": r.holder_bytes / 2**30,
                        "gib_switch_to_nodes": r.switch_bytes / 2**30,
                        "prefill_tokens_saved": r.prefill_tokens_saved,
                        "switch_hit_ratio": r.switch_hit_ratio,
                    }
                )
            ctx.log(f"q2: {fam} at {load:g}x done")
    return {
        "question": "q2", "model": base.model.name, "nodes": base.nodes, "switch_mib": base.switch_mib, "rows": rows
    }


def table(res: dict[str, Any]) -> str:
    """One line per (family, load, strategy)."""
    head = (
        f"q2: {res['nodes']} nodes, {res['model']}, {res['switch_mib'] / 1024:g} GiB switch pool (value policy). "
        "Block sources are shares of all prompt blocks; GiB moved per tier over the whole trace.\n\n"
    )
    rows = []
    for r in res["rows"]:
        rows.append(
            [
                r["family"],
                f"{r['load']:g}x",
                r["strategy"],
                f"{r['ttft_p50_ms']:.0f}",
                f"{r['ttft_p99_ms']:.0f}",
                f"{r['hbm']:.2f} / {r['dram']:.2f} / {r['switch']:.2f} / {r['holders']:.2f} / {r['recompute']:.2f}",
                f"{r['gib_dram_to_hbm']:.0f}",
                f"{r['gib_hbm_to_dram']:.0f}",
                f"{r['gib_holders_to_nodes']:.0f}",
                f"{r['gib_switch_to_nodes']:.0f}",
            ]
        )
    return head + md_table(
        ["family", "load", "strategy", "TTFT p50 ms", "TTFT p99 ms", "HBM / DRAM / switch / holders / recompute",
         "GiB DRAM->HBM", "GiB HBM->DRAM", "GiB holders->nodes", "GiB switch->nodes"],
        rows,
    )


def plot(res: dict[str, Any], path: Path) -> None:
    """TTFT p50 per strategy and family (bars), one panel per load."""
    plt = pyplot()
    loads = sorted({r["load"] for r in res["rows"]})
    fams = list(dict.fromkeys(r["family"] for r in res["rows"]))
    strats = list(STRATEGIES)
    fig, axes = plt.subplots(1, len(loads), figsize=(5.5 * len(loads), 3.4), squeeze=False)
    width = 0.8 / len(strats)
    for ax, load in zip(axes[0], loads, strict=True):
        at = {(r["family"], r["strategy"]): r for r in res["rows"] if r["load"] == load}
        for k, s in enumerate(strats):
            xs = [i + k * width for i in range(len(fams))]
            ax.bar(xs, [at[f, s]["ttft_p50_ms"] for f in fams], width, label=s)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(fams))])
        ax.set_xticklabels(fams, fontsize=8)
        ax.set_ylabel("TTFT p50 (ms)")
        ax.set_yscale("log")
        ax.set_title(f"load {load:g}x")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
