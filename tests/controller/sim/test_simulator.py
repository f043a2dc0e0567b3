"""Simulator sanity: no sharing means no switch hits, coalescing saves holder bytes, config errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.sim.caches import replay
from controller.sim.config import MODELS, ClusterConfig, ConfigError
from controller.sim.locality import plan
from controller.sim.simulator import run_policy, sweep, sweep_steps
from kvpool.trace import SyntheticSpec, Trace, TraceRequest, generate, read_jsonl
from tests.paths import MOONCAKE_TRACE

MOONCAKE = MOONCAKE_TRACE
SMALL = ClusterConfig(nodes=16, holders=2, switch_mib=96.0, hbm_gib=1.0, dram_gib=2.0)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate(SyntheticSpec(n_requests=1500, rate_per_s=20.0, n_prefixes=40, seed=11))


def test_no_sharing_has_no_switch_hits_and_more_prefill(trace: Trace) -> None:
    p = plan(trace, SMALL)
    none = run_policy(trace, p, SMALL, "none")
    holder = run_policy(trace, p, SMALL, "holder")
    value = run_policy(trace, p, SMALL, "value")
    assert none.switch_hits == 0 and none.switch_hit_ratio == 0.0 and none.holder_bytes == 0
    assert none.control_msgs == 0
    assert holder.switch_hits == 0 and holder.holder_bytes == holder.fetch_bytes > 0
    assert value.switch_hits > 0
    assert none.prefill_tokens_saved < holder.prefill_tokens_saved == value.prefill_tokens_saved
    assert none.ttft_p50_ms >= holder.ttft_p50_ms
    assert value.holder_bytes < holder.holder_bytes
    assert value.holder_bytes_saved == value.fetch_bytes - value.holder_bytes
    ratios = value.hbm_ratio + value.dram_ratio + value.switch_ratio + value.pool_ratio + value.recompute_ratio
    assert ratios == pytest.approx(1.0)


def test_belady_bounds_online_policies_in_the_full_simulator(trace: Trace) -> None:
    rows = sweep(
        trace,
        SMALL,
        policies=["value", "lru", "lfu", "gdsf", "s3fifo", "belady"],
        switch_mibs=[48.0, 192.0],
        nodes=[16],
    )
    for r in rows:
        assert r.switch_hit_ratio <= r.belady_hit_ratio + 1e-12
        assert r.of_belady <= 1.0 + 1e-9
    bel = [r for r in rows if r.policy == "belady"]
    assert all(r.of_belady == pytest.approx(1.0) for r in bel)


def test_bigger_pool_never_lowers_lru_hit_ratio(trace: Trace) -> None:
    rows = sweep(trace, SMALL, policies=["lru"], switch_mibs=[6.0, 24.0, 96.0, 384.0, 1536.0], nodes=[16])
    hit = [r.switch_hit_ratio for r in rows]
    assert hit == sorted(hit) and hit[-1] > hit[0]


def _burst() -> Trace:
    # 32 requests at the same instant share a hot 8-block prefix that one earlier request computed
    reqs = [TraceRequest(0.0, 8 * 512, 1, tuple(range(8)))]
    reqs += [TraceRequest(10_000.0, 9 * 512, 1, (*range(8), 100 + i)) for i in range(32)]
    return Trace.from_requests(reqs)


def test_coalescing_reduces_holder_bytes_and_incast() -> None:
    tr = _burst()
    cfg = ClusterConfig(
        nodes=32,
        holders=1,
        switch_mib=0.0,
        hbm_gib=1.0,
        dram_gib=1.0,
        routing="round_robin",
        holder_gbps=10.0,
        model=MODELS["llama3-8b"],
    )
    p = plan(tr, cfg)
    with_c = run_policy(tr, p, cfg, "holder")
    on = run_policy(tr, p, cfg, "lru")  # a switch with a zero-size pool: coalescing only
    off = run_policy(tr, p, replace(cfg, coalesce=False), "lru")
    assert with_c.holder_bytes == off.holder_bytes == p.n_fetches * cfg.chunk_bytes
    assert on.coalesced_fetches > 0
    assert on.holder_bytes < off.holder_bytes / 4
    assert on.peak_incast < off.peak_incast
    assert on.ttft_p99_ms < off.ttft_p99_ms


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ({"nodes": 0}, "--nodes"),
        ({"holders": -1}, "--holders"),
        ({"holder_gbps": -5.0}, "--holder-gbps"),
        ({"node_gbps": 0.0}, "--node-gbps"),
        ({"hbm_gib": 0.0}, "--hbm-gib"),
        ({"switch_mib": -1.0}, "--switch-mib"),
        ({"routing": "magic"}, "--routing"),
        ({"switches": 9, "nodes": 4}, "--switches"),
    ],
)
def test_nonsensical_config_names_the_option(change: dict[str, object], option: str) -> None:
    with pytest.raises(ConfigError, match=option):
        replace(ClusterConfig(), **change).validate()  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.skipif(not MOONCAKE.exists(), reason="Mooncake trace not present in ../shared/data/mooncake/")
def test_value_policy_leads_online_baselines_on_the_mooncake_trace() -> None:
    tr = read_jsonl(MOONCAKE)
    rows = sweep(
        tr, ClusterConfig(), policies=["value", "lru", "lfu", "gdsf", "s3fifo"], switch_mibs=[384.0, 6144.0], nodes=[64]
    )
    for mib in (384.0, 6144.0):
        at = {r.policy: r for r in rows if r.switch_mib == mib}
        for pol in ("lru", "lfu", "gdsf", "s3fifo"):
            assert at["value"].switch_hit_ratio >= at[pol].switch_hit_ratio - 0.005, (mib, pol)
            assert at["value"].ttft_p99_ms <= at[pol].ttft_p99_ms * 1.005, (mib, pol)


def test_each_switch_replays_its_own_fetches(trace: Trace) -> None:
    one = replace(SMALL, switch_mib=384.0)
    two = replace(one, switches=2)
    p = plan(trace, two)
    halves = [p.switch_fetches(s) for s in range(2)]
    assert halves[0].size + halves[1].size == p.n_fetches and halves[0].size and halves[1].size
    r1 = run_policy(trace, plan(trace, one), one, "lru")
    r2 = run_policy(trace, p, two, "lru")
    assert r1.fetches == r2.fetches  # the same requests and local tiers: the same fetches
    cost = two.model.cost()
    per_switch = [
        replay(
            "lru",
            p.fetch_key[h].tolist(),
            p.fetch_parent[h].tolist(),
            p.fetch_pos[h].tolist(),
            two.switch_chunks,
            two.chunk_bytes,
            two.slot_bytes,
            cost,
        ).hits.sum()
        for h in halves
    ]
    assert r2.switch_hits == sum(per_switch) > 0  # each pool sees only the fetches behind it


def test_sweep_reports_monotone_progress_up_to_its_step_count(trace: Trace) -> None:
    seen: list[float] = []
    labels: set[str] = set()

    def progress(label: str, steps: float) -> None:
        seen.append(steps)
        labels.add(label)

    sweep(trace, SMALL, policies=["value", "lru"], switch_mibs=[48.0, 96.0], nodes=[8], progress=progress)
    assert seen == sorted(seen)
    assert seen[-1] == sweep_steps(1, 1, 2, 2) == 7
    assert any("policy=value" in lab for lab in labels) and any("local tiers" in lab for lab in labels)


def test_a_switchs_pending_table_and_waiter_ids_bound_coalescing() -> None:
    """Coalescing needs a free pending slot for the chunk and a waiter id for the node, as in P4."""
    tr = _burst()
    cfg = ClusterConfig(nodes=32, holders=1, switch_mib=0.0, hbm_gib=1.0, dram_gib=1.0, routing="round_robin",
                        holder_gbps=10.0, model=MODELS["llama3-8b"])
    p = plan(tr, cfg)
    free = run_policy(tr, p, cfg, "lru")
    one_slot = run_policy(tr, p, replace(cfg, pending_slots=1), "lru")
    few_waiters = run_policy(tr, p, replace(cfg, max_waiters=4), "lru")
    off = run_policy(tr, p, replace(cfg, coalesce=False), "lru")
    assert 0 < one_slot.coalesced_fetches < free.coalesced_fetches
    assert 0 < few_waiters.coalesced_fetches < free.coalesced_fetches
    for limited in (one_slot, few_waiters):
        assert free.holder_bytes < limited.holder_bytes < off.holder_bytes


def test_the_tofino1_preset_is_the_tna_programs_geometry() -> None:
    from controller.sim.config import SWITCH_PRESETS
    from kvpool import contract

    cfg = SWITCH_PRESETS["tofino1"].apply(ClusterConfig())
    cfg.validate()
    assert (cfg.switch_mib, cfg.pending_slots, cfg.max_waiters) == (
        0.0, contract.TNA_PENDING_SLOTS, contract.TNA_MAX_WAITERS)
    assert cfg.switch_chunks == 0  # its pool serves 128-byte fragments only: no KV chunk
    with pytest.raises(ConfigError, match="--pending-slots"):
        replace(cfg, pending_slots=-1).validate()
