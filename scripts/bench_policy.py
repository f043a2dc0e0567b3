"""Benchmark the reuse-value policy engine and the simulator (a script, not a timed test).

Part 1 replays the Mooncake trace (when present) for 64 nodes through every switch policy and
prints, per policy, the fetches, the time per fetch, its ratio to LRU's, and the end-to-end time
of what ``kvpool sim --trace ... --policy value`` does (read, plan, Belady, value, timing),
checked against the 10 s target.

Part 2 generates a synthetic trace (1,000,000 requests by default), plans it, and feeds its
fetch stream to ``PolicyEngine.step`` one epoch (``--epoch`` observations, the engine's
default 512) at a time, as the controller daemon would, then times the requests.

``epoch_ms_1e6`` (the last line) is the mean wall-clock milliseconds of one policy epoch
(``--epoch`` fetch observations processed as ``PolicyEngine.step`` does: ``access`` each, then
``drain`` the changes) over the whole fetch stream of the synthetic 1e6-request trace.
Exit status 1 if a check fails (Belady below an online policy, or the Mooncake replay over
its time target).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from controller.policy.engine import PolicyConfig, PolicyEngine
from controller.sim.caches import POLICIES, replay
from controller.sim.config import ClusterConfig
from controller.sim.locality import plan
from controller.sim.simulator import run_policy
from controller.sim.timing import replay_time
from kvpool.trace import SyntheticSpec, generate, read_jsonl, shared_trace_path

#: the shared trace next to (or above) the checkout, or where KVPOOL_MOONCAKE_TRACE points
MOONCAKE = shared_trace_path()


def bench_mooncake(path: Path, budget_s: float) -> bool:
    """Part 1; returns whether the checks passed."""
    ok = True
    cfg = ClusterConfig(nodes=64)
    t0 = time.perf_counter()
    trace = read_jsonl(path)
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = plan(trace, cfg)
    t_plan = time.perf_counter() - t0
    keys, par, pos = p.fetch_key.tolist(), p.fetch_parent.tolist(), p.fetch_pos.tolist()
    cost = cfg.model.cost()
    times: dict[str, float] = {}
    ratio: dict[str, float] = {}
    for pol in POLICIES:
        t0 = time.perf_counter()
        r = replay(pol, keys, par, pos, cfg.switch_chunks, cfg.chunk_bytes, cfg.slot_bytes, cost)
        times[pol] = time.perf_counter() - t0
        ratio[pol] = float(r.hits.mean())
    t0 = time.perf_counter()
    res = run_policy(trace, p, cfg, "value")  # Belady + value + timing, as the CLI runs it
    t_run = time.perf_counter() - t0
    total = t_read + t_plan + t_run
    print(f"Mooncake trace {path.name}: {len(trace)} requests, {trace.n_blocks} block refs, {p.n_fetches} fetches")
    print(f"64 nodes, {cfg.model.name}, switch {cfg.switch_mib:g} MiB = {cfg.switch_chunks} chunks")
    print(f"{'policy':8s} {'hit ratio':>9s} {'of Belady':>9s} {'us/fetch':>9s} {'x LRU':>7s}")
    for pol in POLICIES:
        us = times[pol] / max(p.n_fetches, 1) * 1e6
        print(
            f"{pol:8s} {ratio[pol]:9.4f} {ratio[pol] / ratio['belady']:9.3f} {us:9.2f} {times[pol] / times['lru']:7.1f}"
        )
        if ratio[pol] > ratio["belady"] + 1e-12:
            print(f"CHECK FAILED: {pol} beats Belady")
            ok = False
    verdict = "PASS" if total < budget_s else "FAIL"
    print(
        f"kvpool sim --policy value end to end: read {t_read:.2f} s + plan {t_plan:.2f} s + "
        f"Belady/value/timing {t_run:.2f} s = {total:.2f} s (target < {budget_s:g} s: {verdict})"
    )
    print(f"  switch hit ratio {res.switch_hit_ratio:.4f} = {res.of_belady:.3f} of Belady")
    return ok and total < budget_s


def bench_synthetic(n: int, epoch: int) -> float:
    """Part 2; returns epoch_ms."""
    cfg = ClusterConfig(nodes=64)
    t0 = time.perf_counter()
    trace = generate(SyntheticSpec(n_requests=n, rate_per_s=100.0, seed=1))
    t_gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = plan(trace, cfg)
    t_plan = time.perf_counter() - t0
    keys, par, pos = p.fetch_key.tolist(), p.fetch_parent.tolist(), p.fetch_pos.tolist()
    cost = cfg.model.cost()
    t0 = time.perf_counter()
    bel = replay("belady", keys, par, pos, cfg.switch_chunks, cfg.chunk_bytes, cfg.slot_bytes, cost)
    t_bel = time.perf_counter() - t0
    engine = PolicyEngine(
        PolicyConfig(
            capacity_bytes=cfg.switch_chunks * cfg.slots_per_chunk * cfg.slot_bytes,
            slot_bytes=cfg.slot_bytes,
            cost=cost,
        )
    )
    hits = np.zeros(len(keys), dtype=np.bool_)
    n_changes = 0
    epochs = 0
    t0 = time.perf_counter()
    access = engine.access
    for start in range(0, len(keys), epoch):
        # One epoch exactly as PolicyEngine.step runs it (access per observation, then drain),
        # unrolled here to keep which fetches the leader served.
        for i in range(start, min(start + epoch, len(keys))):
            pa = par[i]
            hits[i] = access(keys[i], pa if pa >= 0 else None, pos[i], cfg.chunk_bytes)
        n_changes += len(engine.drain())
        epochs += 1
    t_val = time.perf_counter() - t0
    served = int(hits.sum())
    t0 = time.perf_counter()
    tm = replay_time(p, cfg, hits, True)
    t_time = time.perf_counter() - t0
    epoch_ms = t_val / max(epochs, 1) * 1e3
    total = t_gen + t_plan + t_bel + t_val + t_time
    print(f"synthetic trace: {n} requests, {trace.n_blocks} block refs, {p.n_fetches} fetches, 64 nodes")
    print(
        f"  generate {t_gen:.1f} s, plan {t_plan:.1f} s, Belady {t_bel:.1f} s, "
        f"value {t_val:.1f} s, timing {t_time:.1f} s"
    )
    print(f"  total {total:.1f} s; {epochs} epochs of {epoch} fetches, {epoch_ms:.2f} ms each")
    print(
        f"  value policy: {served / max(len(keys), 1):.4f} hit ratio vs Belady {float(bel.hits.mean()):.4f}; "
        f"{n_changes} changes; {engine.leader_switches} leader switches; "
        f"TTFT p99 {np.percentile(tm.ttft_ms, 99):.1f} ms"
    )
    return epoch_ms


def main(argv: list[str] | None = None) -> int:
    """Run both parts; the last line is ``epoch_ms_1e6=<ms>``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=MOONCAKE, help="Mooncake JSONL trace for part 1")
    ap.add_argument("--requests", type=int, default=1_000_000, help="synthetic requests for part 2")
    ap.add_argument("--epoch", type=int, default=512, help="fetch observations per engine epoch")
    ap.add_argument("--budget-s", type=float, default=10.0, help="time target of part 1")
    args = ap.parse_args(argv)
    ok = True
    if args.trace.exists():
        ok = bench_mooncake(args.trace, args.budget_s)
    else:
        print(f"part 1 skipped: {args.trace} not found")
    epoch_ms = bench_synthetic(args.requests, args.epoch)
    print(f"epoch_ms_1e6={epoch_ms:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
