"""fig9: the simulator held against Mooncake's published cache-capacity curve.

Mooncake's FAST'25 paper reports, on its conversation trace, that a KV cache of about 3M
tokens reaches under half of the theoretical prefix hit rate and about 50M tokens nearly all
of it. Here: one shared prefix cache (:mod:`controller.sim.prefixcache`) replays the shared
trace at capacities from 0.25M to 64M tokens; the y axis is the prefix hit rate (reused
prefix tokens / input tokens) over the theoretical maximum (a cache that never evicts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.sim.config import MODELS
from controller.sim.experiments.common import Context, md_table, pyplot
from controller.sim.prefixcache import PREFIX_POLICIES, infinite, replay_prefix
from kvpool.trace import BLOCK_TOKENS

FULL_MTOKENS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 32.0, 50.0, 64.0)
QUICK_MTOKENS = (0.1, 0.5, 3.0, 50.0)


def run(ctx: Context) -> dict[str, Any]:
    """Prefix hit rate / theoretical maximum against capacity, per policy."""
    family = "conversation" if ctx.trace_path is not None else "chat"
    trace = ctx.load(family)
    best = infinite(trace)
    cost = MODELS["llama3-8b"].cost()
    caps = QUICK_MTOKENS if ctx.quick else FULL_MTOKENS
    policies = ("lru", "lfu") if ctx.quick else PREFIX_POLICIES
    points: list[dict[str, Any]] = []
    for m in caps:
        blocks = max(1, int(m * 1e6) // BLOCK_TOKENS)
        for pol in policies:
            r = replay_prefix(trace, pol, blocks, cost)
            points.append(
                {
                    "policy": pol,
                    "capacity_mtokens": m,
                    "capacity_blocks": blocks,
                    "hit_rate": r.hit_rate,
                    "of_max": r.hit_rate / best.hit_rate if best.hit_rate else 0.0,
                }
            )
            ctx.log(f"fig9: {pol} at {m:g}M tokens: {points[-1]['of_max']:.3f} of the maximum")
    unique = len(set(trace.blocks.tolist()))
    return {
        "question": "fig9",
        "trace": family,
        "requests": len(trace),
        "input_tokens": int(trace.input_lengths.sum()),
        "unique_blocks": unique,
        "unique_mtokens": unique * BLOCK_TOKENS / 1e6,
        "theoretical_hit_rate": best.hit_rate,
        "points": points,
    }


def table(res: dict[str, Any]) -> str:
    """Capacity x policy: prefix hit rate and its share of the theoretical maximum."""
    pols = sorted({p["policy"] for p in res["points"]}, key=PREFIX_POLICIES.index)
    caps = sorted({p["capacity_mtokens"] for p in res["points"]})
    at = {(p["capacity_mtokens"], p["policy"]): p for p in res["points"]}
    rows = []
    for c in caps:
        rows.append([f"{c:g}M"] + [f"{at[c, p]['hit_rate']:.3f} ({at[c, p]['of_max']:.2f})" for p in pols])
    head = (
        f"fig9: {res['trace']} trace, {res['requests']} requests, {res['unique_mtokens']:.1f}M tokens of distinct "
        f"blocks; theoretical prefix hit rate {res['theoretical_hit_rate']:.3f}. Cells: hit rate (share of max).\n\n"
    )
    return head + md_table(["cache capacity (tokens)", *pols], rows)


def plot(res: dict[str, Any], path: Path) -> None:
    """Share of the theoretical prefix hit rate against capacity (log x), with the paper's two points."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    pols = sorted({p["policy"] for p in res["points"]}, key=PREFIX_POLICIES.index)
    for pol in pols:
        pts = sorted((p for p in res["points"] if p["policy"] == pol), key=lambda p: p["capacity_mtokens"])
        ax.plot([p["capacity_mtokens"] for p in pts], [p["of_max"] for p in pts], marker="o", label=pol)
    ax.scatter([3.0, 50.0], [0.5, 1.0], marker="x", color="black", zorder=5, label="paper: <1/2 at 3M, ~all at 50M")
    ax.axvline(res["unique_mtokens"], color="grey", linestyle=":", label="all distinct blocks of this trace")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (million tokens)")
    ax.set_ylabel("prefix hit rate / theoretical max")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"fig9: {res['trace']} trace ({res['requests']} requests)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
