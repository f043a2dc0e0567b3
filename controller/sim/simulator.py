"""Run configurations end to end: plan once per cluster shape, replay each policy, collect metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np

from controller.sim.caches import NO_SWITCH, POLICIES, CacheResult, replay
from controller.sim.config import MODELS, ClusterConfig
from controller.sim.locality import FetchPlan, plan
from controller.sim.timing import replay_time
from kvpool.trace import Trace


@dataclass
class SimResult:
    """Metrics of one (cluster, policy) run; ``as_dict`` is what the CLI prints and writes."""

    policy: str
    model: str
    nodes: int
    holders: int
    switches: int
    switch_mib: float
    switch_chunks: int
    chunk_mib: float
    requests: int
    block_refs: int
    fetches: int
    switch_hits: int
    switch_hit_ratio: float
    belady_hit_ratio: float
    of_belady: float
    hbm_ratio: float
    dram_ratio: float
    switch_ratio: float
    pool_ratio: float
    recompute_ratio: float
    prefill_tokens_total: int
    prefill_tokens_saved: int
    gpu_s_saved: float
    holder_bytes: int
    fetch_bytes: int
    holder_bytes_saved: int
    switch_bytes: int
    coalesced_fetches: int
    peak_incast: int
    ttft_mean_ms: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    control_msgs: int
    control_msgs_per_s: float
    controller_load: float
    transfer_s: float
    duration_s: float
    runtime_s: float

    def as_dict(self) -> dict[str, float | int | str]:
        """Plain JSON-able dict."""
        return asdict(self)


def _scaled(report: Callable[[str, float], None], label: str, scale: float) -> Callable[[float], None]:
    """A progress callback reporting ``label`` at ``scale`` x its argument."""

    def cb(x: float) -> None:
        report(label, x * scale)

    return cb


def _shifted(progress: Callable[[float], None], index: int, count: int) -> Callable[[float], None]:
    """Progress of part ``index`` of ``count`` equal parts, as a fraction of the whole."""

    def cb(f: float) -> None:
        progress((index + f) / count)

    return cb


def _switch_replay(
    p: FetchPlan, cfg: ClusterConfig, policy: str, progress: Callable[[float], None] | None = None
) -> tuple[np.ndarray, int]:
    """Hits of ``policy`` over every switch's own fetch sequence, and its table writes."""
    hits = np.zeros(p.n_fetches, dtype=np.bool_)
    writes = 0
    cost = cfg.model.cost(cfg.block_tokens)
    for s in range(cfg.switches):
        idx = p.switch_fetches(s) if cfg.switches > 1 else np.arange(p.n_fetches)
        if idx.size == 0:
            continue
        key, par, pos = p.fetch_key[idx], p.fetch_parent[idx], p.fetch_pos[idx]
        is_write = None
        if cfg.fill_on_write and p.write_off is not None:
            key, par, pos, is_write = _with_writes(p, idx, s)
        res: CacheResult = replay(
            policy,
            key.tolist(),
            par.tolist(),
            pos.tolist(),
            cfg.switch_chunks,
            cfg.chunk_bytes,
            cfg.slot_bytes,
            cost,
            None if progress is None else _shifted(progress, s, cfg.switches),
            None if is_write is None else is_write.tolist(),
        )
        hits[idx] = res.hits if is_write is None else res.hits[~is_write]
        writes += res.admissions + res.evictions
    return hits, writes


def _with_writes(p: FetchPlan, idx: np.ndarray, switch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fetches ``idx`` behind ``switch`` merged with the chunks its nodes computed, in request order.

    A request's writes follow its fetches (it computes after fetching); the fetches keep their order.
    """
    assert p.write_off is not None and p.write_key is not None
    assert p.write_parent is not None and p.write_pos is not None
    n_req = p.n_requests
    f_req = np.repeat(np.arange(n_req), np.diff(p.fetch_off))[idx]
    w_req_all = np.repeat(np.arange(n_req), np.diff(p.write_off))
    w_sel = np.flatnonzero(p.switch[w_req_all] == switch)
    req = np.concatenate([f_req, w_req_all[w_sel]])
    kind = np.concatenate([np.zeros(idx.size, np.int64), np.ones(w_sel.size, np.int64)])
    order = np.lexsort((kind, req))  # stable: fetches and writes keep their own order
    key = np.concatenate([p.fetch_key[idx], p.write_key[w_sel]])[order]
    par = np.concatenate([p.fetch_parent[idx], p.write_parent[w_sel]])[order]
    pos = np.concatenate([p.fetch_pos[idx], p.write_pos[w_sel]])[order]
    return key, par, pos, kind[order].astype(np.bool_)


def run_policy(
    trace: Trace,
    p: FetchPlan,
    cfg: ClusterConfig,
    policy: str,
    belady_ratio: float | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Replay one policy over a ready plan and time it; ``progress`` gets the fraction done."""
    if policy not in POLICIES + NO_SWITCH:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES + NO_SWITCH)})")
    t0 = time.perf_counter()
    sharing = policy != "none"
    # A switch without pool memory still coalesces and multicasts; only its pool needs capacity.
    switch_present = policy not in NO_SWITCH
    has_switch = switch_present and cfg.switch_chunks > 0
    if has_switch:
        hits, writes = _switch_replay(p, cfg, policy, None if progress is None else (lambda f: progress(0.8 * f)))
    else:
        hits, writes = np.zeros(p.n_fetches, dtype=np.bool_), 0
    if belady_ratio is None:
        belady_ratio = (
            float(_switch_replay(p, cfg, "belady")[0].mean()) if p.n_fetches and cfg.switch_chunks > 0 else 0.0
        )
    tm = replay_time(p, cfg, hits if switch_present else None, sharing)
    c = cfg.model.cost(cfg.block_tokens)
    inp = p.input_tokens.astype(np.float64)
    loc = p.local_prefix_tokens.astype(np.float64)
    # prefix_flops(n) = n * (2 P + 2 L d n), vectorised over requests: the no-sharing prefill bill
    coef = 2.0 * c.n_layers * c.d_model
    gpu_none = float(np.sum(inp * (2.0 * c.n_params + coef * inp) - loc * (2.0 * c.n_params + coef * loc)))
    gpu_none /= cfg.model.flops_per_s
    n_hits = int(hits.sum()) if sharing else 0
    refs = max(p.block_refs, 1)
    fetches = p.n_fetches if sharing else 0
    hbm = int(p.hbm_blocks.sum())
    dram = int(p.dram_blocks.sum())
    # Where blocks came from counts the fetches the timing made (a chunk not yet stored when its
    # request arrived was recomputed instead); the hit ratio stays the policy's, over the plan.
    made = ~tm.skipped if tm.skipped is not None and sharing else np.ones(p.n_fetches, dtype=np.bool_)
    fetches_made = int(made.sum()) if sharing else 0
    hits_made = int((hits & made).sum()) if sharing else 0
    duration_s = max(trace.duration_ms / 1e3, 1e-3)
    msgs = 0
    if sharing:
        # directory: one registration per new chunk, one lookup per request; plus the switch's table writes
        msgs = int(p.new_chunks.sum()) + p.n_requests + writes
    total_tokens = int(p.input_tokens.sum())
    ttft = tm.ttft_ms
    return SimResult(
        policy=policy,
        model=cfg.model.name,
        nodes=cfg.nodes,
        holders=cfg.holders,
        switches=cfg.switches,
        switch_mib=cfg.switch_mib if switch_present else 0.0,
        switch_chunks=cfg.switch_chunks if switch_present else 0,
        chunk_mib=cfg.chunk_bytes / 2**20,
        requests=p.n_requests,
        block_refs=p.block_refs,
        fetches=fetches,
        switch_hits=n_hits,
        switch_hit_ratio=n_hits / fetches if fetches else 0.0,
        belady_hit_ratio=belady_ratio,
        of_belady=(n_hits / fetches) / belady_ratio if fetches and belady_ratio > 0 else 0.0,
        hbm_ratio=hbm / refs,
        dram_ratio=dram / refs,
        switch_ratio=hits_made / refs,
        pool_ratio=(fetches_made - hits_made) / refs,
        recompute_ratio=max(0.0, 1.0 - (hbm + dram + fetches_made) / refs),
        prefill_tokens_total=total_tokens,
        prefill_tokens_saved=total_tokens - int(tm.compute_tokens.sum()),
        gpu_s_saved=gpu_none - tm.compute_s,
        holder_bytes=tm.holder_bytes,
        fetch_bytes=tm.fetch_bytes,
        holder_bytes_saved=tm.fetch_bytes - tm.holder_bytes,
        switch_bytes=tm.switch_bytes,
        coalesced_fetches=tm.coalesced,
        peak_incast=tm.peak_incast,
        ttft_mean_ms=float(ttft.mean()),
        ttft_p50_ms=float(np.percentile(ttft, 50)),
        ttft_p90_ms=float(np.percentile(ttft, 90)),
        ttft_p99_ms=float(np.percentile(ttft, 99)),
        control_msgs=msgs,
        control_msgs_per_s=msgs / duration_s,
        controller_load=msgs * cfg.ctrl_msg_us / 1e6 / duration_s,
        transfer_s=tm.transfer_s,
        duration_s=duration_s,
        runtime_s=time.perf_counter() - t0,
    )


def sweep_steps(n_nodes: int, n_models: int, n_sizes: int, n_policies: int) -> int:
    """Progress steps of a sweep: one plan per (nodes, model), one Belady per size, one per run."""
    return n_nodes * n_models * (1 + n_sizes * (1 + n_policies))


def sweep(
    trace: Trace,
    base: ClusterConfig,
    *,
    policies: list[str],
    switch_mibs: list[float],
    nodes: list[int],
    models: list[str] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> list[SimResult]:
    """Every combination of nodes x model x switch size x policy; one plan per (nodes, model).

    ``progress(label, steps)`` reports how many of :func:`sweep_steps` steps are done.
    """
    out: list[SimResult] = []
    done = 0.0

    def report(label: str, frac: float) -> None:
        if progress is not None:
            progress(label, done + frac)

    for n in nodes:
        for m in models or [base.model.name]:
            cfg0 = replace(base, nodes=n, model=MODELS[m], switches=min(base.switches, n))
            cfg0.validate()
            t0 = time.perf_counter()
            label = f"nodes={n} model={m}: routing and local tiers"
            p = plan(trace, cfg0, progress=_scaled(report, label, 1.0 / max(len(trace), 1)))
            plan_s = time.perf_counter() - t0
            done += 1
            for mib in switch_mibs:
                cfg = replace(cfg0, switch_mib=mib)
                cfg.validate()
                report(f"nodes={n} model={m} switch={mib:g}MiB: Belady", 0.0)
                bel = float(_switch_replay(p, cfg, "belady")[0].mean()) if p.n_fetches and cfg.switch_chunks else 0.0
                done += 1
                for pol in policies:
                    label = f"nodes={n} model={m} switch={mib:g}MiB policy={pol}"
                    report(label, 0.0)
                    r = run_policy(trace, p, cfg, pol, belady_ratio=bel, progress=_scaled(report, label, 1.0))
                    r.runtime_s += plan_s / (len(switch_mibs) * len(policies))
                    out.append(r)
                    done += 1
                    report(label, 0.0)
    return out
