"""Simulator tier-flow options: demotion modes, promote on second use, fill on write, affinity routing,
and the timing rules (a hit waits for its fill; a chunk not yet stored is recomputed)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controller.sim.config import MODELS, ClusterConfig, ConfigError
from controller.sim.locality import plan
from controller.sim.simulator import run_policy
from kvpool.trace import BLOCK_TOKENS, Trace, TraceRequest
from kvpool.workloads import build

TINY = ClusterConfig(nodes=2, holders=1, switch_mib=96.0, hbm_gib=1.0, dram_gib=1.0, routing="round_robin")


def _trace(reqs: list[tuple[float, list[int]]]) -> Trace:
    return Trace.from_requests([TraceRequest(t, len(ids) * BLOCK_TOKENS, 1, tuple(ids)) for t, ids in reqs])


@pytest.fixture(scope="module")
def chat() -> Trace:
    return build("chat", n_requests=1500, seed=2)


def test_demotion_modes(chat: Trace) -> None:
    cfg = ClusterConfig(nodes=8, holders=2, model=MODELS["llama3-8b"], hbm_gib=1.0, dram_gib=4.0, switch_mib=0.0)
    plans = {m: plan(chat, replace(cfg, demote=m)) for m in ("all", "reused", "none")}
    assert plans["none"].demoted_blocks == 0 and int(plans["none"].dram_blocks.sum()) == 0
    assert 0 < plans["reused"].demoted_blocks < plans["all"].demoted_blocks
    assert int(plans["all"].dram_blocks.sum()) > 0
    # HBM behaves the same whatever happens below it
    assert np.array_equal(plans["all"].hbm_blocks, plans["none"].hbm_blocks)
    # without a pool, every DRAM hit is prefill not redone
    none = run_policy(chat, plans["none"], replace(cfg, demote="none"), "none")
    demote = run_policy(chat, plans["all"], cfg, "none")
    assert demote.prefill_tokens_saved > none.prefill_tokens_saved


def test_a_fetched_chunk_is_kept_only_from_its_second_use() -> None:
    # round robin over 2 nodes: r0 -> n0 computes 1, 2; r1 -> n1 fetches 1, 2 and computes 3;
    # r2 -> n0 (unrelated); r3 -> n1 needs 1, 2, 3, 4
    t = _trace([(0.0, [1, 2]), (1000.0, [1, 2, 3]), (2000.0, [9]), (3000.0, [1, 2, 3, 4])])
    keep1 = plan(t, TINY)
    keep2 = plan(t, replace(TINY, promote_after=2))
    r3 = slice(int(keep1.fetch_off[3]), int(keep1.fetch_off[4]))
    assert keep1.fetch_key[r3].tolist() == []  # kept after the first use: local now
    r3b = slice(int(keep2.fetch_off[3]), int(keep2.fetch_off[4]))
    assert keep2.fetch_key[r3b].tolist() == [1, 2]  # streamed through on first use; 3 was computed there
    with pytest.raises(ConfigError, match="promote-after"):
        replace(TINY, promote_after=3).validate()


def test_fill_on_write_lets_the_switch_hold_a_turn_before_anyone_fetched_it(chat: Trace) -> None:
    cfg = ClusterConfig(nodes=16, holders=2, model=MODELS["llama3-8b"], switch_mib=2048.0)
    plain = plan(chat, cfg)
    wcfg = replace(cfg, fill_on_write=True)
    wp = plan(chat, wcfg)
    assert wp.write_off is not None and wp.write_key is not None
    assert wp.write_key.size == int(wp.new_chunks.sum())
    assert np.array_equal(wp.fetch_key, plain.fetch_key)  # the fetches do not change
    bel = run_policy(chat, plain, cfg, "belady")
    bel_w = run_policy(chat, wp, wcfg, "belady")
    assert bel_w.switch_hit_ratio >= bel.switch_hit_ratio  # writes only add chances to admit
    for pol in ("lru", "value", "lfu"):
        r = run_policy(chat, wp, wcfg, pol)
        assert 0.0 <= r.switch_hit_ratio <= bel_w.switch_hit_ratio + 1e-12


def test_affinity_sends_the_next_turn_where_its_kv_is(chat: Trace) -> None:
    cfg = ClusterConfig(nodes=16, holders=2, model=MODELS["llama3-8b"], switch_mib=0.0)
    rnd = run_policy(chat, plan(chat, cfg), cfg, "holder")
    aff_cfg = replace(cfg, routing="affinity")
    aff = run_policy(chat, plan(chat, aff_cfg), aff_cfg, "holder")
    assert aff.hbm_ratio > rnd.hbm_ratio + 0.1
    assert aff.fetch_bytes < rnd.fetch_bytes
    with pytest.raises(ConfigError, match="routing"):
        replace(cfg, routing="sticky").validate()


def test_a_switch_hit_waits_for_the_fill_in_flight() -> None:
    # r0 computes chunk 1; r1 and r2 (other nodes, same instant) both need it: r1 misses and
    # the pool admits it, r2 hits, but the bytes are still on their way from the holder
    cfg = ClusterConfig(nodes=3, holders=1, switch_mib=96.0, routing="round_robin", model=MODELS["llama3-8b"])
    t = _trace([(0.0, [1]), (60_000.0, [1, 2]), (60_000.0, [1, 3])])
    p = plan(t, cfg)
    r = run_policy(t, p, cfg, "lru")
    assert r.switch_hits == 1 and r.coalesced_fetches == 1
    transfer_ms = cfg.chunk_bytes / (cfg.holder_gbps * 1e9 / 8) * 1e3
    assert r.holder_bytes == cfg.chunk_bytes  # one holder transfer served both
    assert r.ttft_p50_ms >= transfer_ms  # r2 waited for it, not just a switch round trip


def test_a_chunk_still_being_computed_is_recomputed_not_awaited() -> None:
    cfg = ClusterConfig(nodes=2, holders=1, switch_mib=0.0, routing="round_robin", model=MODELS["llama3-8b"])
    long_prompt = list(range(100, 140))  # 40 blocks: seconds of prefill on Llama-3-8B
    early = _trace([(0.0, long_prompt), (10.0, [*long_prompt, 999])])
    late = _trace([(0.0, long_prompt), (600_000.0, [*long_prompt, 999])])
    for t, fetched in ((early, 0), (late, 40 * BLOCK_TOKENS)):
        r = run_policy(t, plan(t, cfg), cfg, "holder")
        assert r.fetch_bytes == fetched * cfg.model.kv_bytes_per_token


def test_sim_cli_takes_the_tier_options(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kvpool.cli import main

    base = ["sim", "--workload", "chat", "--requests", "500", "--nodes", "8", "--no-progress", "--json"]
    assert main([*base, "--demote", "none", "--routing", "affinity", "--fill-on-write", "--promote-after", "2"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["dram_ratio"] == 0.0
    with pytest.raises(SystemExit) as exc:
        main([*base, "--demote", "sometimes"])
    assert exc.value.code == 2 and "--demote" in capsys.readouterr().err
