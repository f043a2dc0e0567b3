"""The reuse-value policy: admission gate, leaves before parents, demote vs drop, pins, quotas, experts."""

from __future__ import annotations

import pytest

from controller.policy import (
    Admit,
    Evict,
    EvictAction,
    Expert,
    Observation,
    Pin,
    PolicyConfig,
    PolicyEngine,
    QuotaBook,
    QuotaError,
    Tier,
    TierLayout,
    TierSpec,
    Unpin,
)
from controller.policy.admission import AdmissionGate
from controller.policy.eviction import demotion
from controller.policy.sketch import FrequencySketch

SLOT = 1000
CHUNK = 3 * SLOT  # three slots per chunk


def _engine(chunks: int, **kw: object) -> PolicyEngine:
    cfg = PolicyConfig(capacity_bytes=chunks * CHUNK, slot_bytes=SLOT, **kw)  # type: ignore[arg-type]
    return PolicyEngine(cfg)


def _one_expert(
    chunks: int, half_life: float = 1e6, probation: int = 2, fifo: float = 0.0, **kw: object
) -> PolicyEngine:
    return _engine(chunks, experts=(Expert(half_life, probation, fifo),), **kw)


def test_step_admits_into_free_space_with_consecutive_slots() -> None:
    e = _one_expert(4)
    changes = e.step([Observation(k, None, 0, CHUNK) for k in (1, 2, 3)])
    admits = [c for c in changes if isinstance(c, Admit)]
    assert [(c.key, c.base_slot, c.n_slots) for c in admits] == [(1, 0, 3), (2, 3, 3), (3, 6, 3)]
    assert all(c.reason == "fits in free space" for c in admits)
    assert e.step([Observation(1, None, 0, CHUNK)]) == []  # a hit changes nothing
    assert e.stats["hits"] == 1


def test_one_shot_keys_stay_out_of_a_full_pool() -> None:
    e = _one_expert(4)
    hot = [1, 2, 3, 4]
    for _ in range(3):
        e.step([Observation(k, None, 0, CHUNK) for k in hot])
    changes = e.step([Observation(1000 + i, None, 0, CHUNK) for i in range(200)])  # a scan of one-shots
    assert not [c for c in changes if isinstance(c, Admit)]
    assert e.stats["rejected_probation"] == 200
    assert all(e.holds(k) for k in hot)
    # a repeatedly fetched newcomer passes probation and beats a cold victim eventually
    for _ in range(8):
        e.access(99, None, 0, CHUNK)
    assert e.holds(99)


def test_admission_gate_verdicts() -> None:
    gate = AdmissionGate(FrequencySketch(width=1024), probation_hits=2)
    assert gate.judge(1, 5.0, None).admit  # free space
    v = gate.judge(1, 5.0, 1.0)
    assert not v.admit and "probation" in v.reason
    assert gate.judge(3, 5.0, 1.0).admit
    v = gate.judge(3, 1.0, 5.0)
    assert not v.admit and "does not beat" in v.reason


def test_leaves_are_evicted_before_their_parents() -> None:
    e = _one_expert(3, probation=1)
    # chain 10 <- 11 <- 12: the parent has the lowest count, yet the leaf must go first
    e.access(10, None, 0, CHUNK)
    for _ in range(3):
        e.access(11, 10, 1, CHUNK)
    for _ in range(5):
        e.access(12, 11, 2, CHUNK)
    e.drain()
    for _ in range(20):
        e.access(50, None, 0, CHUNK)
    evicted = [c.key for c in e.drain() if isinstance(c, Evict)]
    assert evicted[0] == 12  # the only leaf of the chain
    assert e.holds(10) and e.holds(11) and e.holds(50)


def test_evicted_chunk_is_demoted_or_dropped_with_a_reason() -> None:
    e = _one_expert(2, half_life=1e9, probation=1)
    for _ in range(4):
        e.access(1, None, 0, CHUNK)  # expected hits ~4: worth demoting
    e.access(2, None, 0, CHUNK)
    e.drain()
    for _ in range(6):
        e.access(3, None, 0, CHUNK)
    ev = [c for c in e.drain() if isinstance(c, Evict)]
    assert ev and ev[0].key == 2
    assert ev[0].action is EvictAction.DROP and ev[0].target is None
    assert "not worth keeping" in ev[0].reason
    for _ in range(10):
        e.access(4, None, 0, CHUNK)
    ev = [c for c in e.drain() if isinstance(c, Evict)]
    assert ev and ev[0].key in (1, 3)
    assert ev[0].action is EvictAction.DEMOTE and ev[0].target is Tier.POOL
    assert "demote to pool" in ev[0].reason


def test_demotion_rule() -> None:
    assert demotion(3.0, Tier.POOL, 1.0)[0] is EvictAction.DEMOTE
    assert demotion(0.2, Tier.POOL, 1.0)[0] is EvictAction.DROP
    action, target, reason = demotion(9.0, None, 1.0)
    assert action is EvictAction.DROP and target is None and "no lower tier" in reason


def test_tier_layout_rules() -> None:
    layout = TierLayout({t: TierSpec(t, 1 << 30) for t in (Tier.HBM, Tier.DRAM, Tier.SWITCH, Tier.POOL)})
    assert layout.demotion_target(Tier.HBM) is Tier.DRAM
    assert layout.demotion_target(Tier.DRAM) is Tier.POOL
    assert layout.demotion_target(Tier.SWITCH) is Tier.POOL
    assert layout.demotion_target(Tier.POOL) is None
    assert layout.promotion_target(Tier.POOL) is Tier.SWITCH
    assert layout.promotion_target(Tier.DRAM) is Tier.HBM
    no_dram = TierLayout({Tier.HBM: TierSpec(Tier.HBM, 1), Tier.POOL: TierSpec(Tier.POOL, 1)})
    assert no_dram.demotion_target(Tier.HBM) is Tier.POOL
    with pytest.raises(ValueError, match="capacity must be positive"):
        TierSpec(Tier.SWITCH, 0)


def test_pins_survive_pressure_and_are_bounded() -> None:
    e = _one_expert(8, probation=1, pin_fraction=0.25)  # 24 slots, pins may hold 6 = two chunks
    changes = e.pin(7, None, 0, CHUNK)
    assert any(isinstance(c, Pin) and c.key == 7 for c in changes)
    e.pin(8, None, 0, CHUNK)
    with pytest.raises(QuotaError, match="pin bound"):
        e.pin(9, None, 0, CHUNK)
    for k in range(100, 160):
        for _ in range(3):
            e.access(k, None, 0, CHUNK)
    assert e.holds(7) and e.holds(8)
    changes = e.unpin(7)
    assert any(isinstance(c, Unpin) for c in changes)
    for k in range(200, 260):
        for _ in range(3):
            e.access(k, None, 0, CHUNK)
    assert not e.holds(7) and e.holds(8)
    with pytest.raises(QuotaError, match="not pinned"):
        e.unpin(7)


def test_tenant_quota_limits_a_tenant_to_its_share() -> None:
    e = _one_expert(6, probation=1, tenant_quotas={1: 2 * 3})  # tenant 1: two chunks
    for k in range(10):
        for _ in range(2):
            e.access(k, None, 0, CHUNK, tenant=1)
    pool = e.pool
    assert pool.quotas.used[1] <= 6
    assert sum(1 for r in pool.residents.values() if r.tenant == 1) == 2
    for k in range(50, 54):
        e.access(k, None, 0, CHUNK, tenant=2)
    assert sum(1 for r in pool.residents.values() if r.tenant == 2) == 4


def test_quota_book_validation() -> None:
    with pytest.raises(QuotaError):
        QuotaBook(0)
    with pytest.raises(QuotaError):
        QuotaBook(10, {1: 0})
    with pytest.raises(QuotaError):
        QuotaBook(10, pin_fraction=2.0)
    q = QuotaBook(10, {1: 4}, pin_fraction=0.5)
    q.check_pin(1, 4)
    with pytest.raises(QuotaError, match="quota"):
        q.check_pin(1, 5)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="capacity must be positive"):
        PolicyEngine(PolicyConfig(capacity_bytes=0))
    with pytest.raises(ValueError, match="smaller than one slot"):
        PolicyEngine(PolicyConfig(capacity_bytes=10, slot_bytes=100))
    with pytest.raises(ValueError, match="hit_saving"):
        PolicyEngine(PolicyConfig(capacity_bytes=10_000, hit_saving="speed"))


def test_leader_switch_turns_the_switch_into_the_better_expert() -> None:
    # A recency expert and a frequency expert; a hot set interleaved with a scan defeats recency.
    e = _engine(4, experts=(Expert(2.0), Expert(1e6)), epoch_fetches=16, leader_half_life=5000.0)
    assert e.leader == 0
    changes: list[object] = []
    fresh = 1000
    for _ in range(80):
        for k in (0, 1, 2, fresh, fresh + 1, fresh + 2):
            e.access(k, None, 0, CHUNK)
        fresh += 3
        changes.extend(e.drain())
    assert e.leader == 1 and e.leader_switches >= 1
    # the hand-over writes nothing: the hot set both experts held stays where it was
    assert not {c.key for c in changes if isinstance(c, Admit | Evict) and "leader switch" in c.reason} & {0, 1, 2}
    assert all(e.holds(k) for k in (0, 1, 2))
    # the switch holds the leader's chunks (those fetched since) and leftovers, nothing else
    assert set(e.image.held) - set(e.image.leftovers) <= set(e.experts[1].residents)
    assert e.experts[1].stats["hits"] > e.experts[0].stats["hits"]


def test_compute_saving_weights_deep_blocks() -> None:
    e = _engine(2, experts=(Expert(1e6),), hit_saving="compute", tier=Tier.POOL)
    e.access(1, None, 0, CHUNK)
    e.access(2, None, 40, CHUNK)
    assert e.pool.value_of(2) > e.pool.value_of(1)
    f = _engine(2, experts=(Expert(1e6),))  # switch: a hit saves a holder transfer, position-neutral
    f.access(1, None, 0, CHUNK)
    f.access(2, None, 40, CHUNK)
    assert f.pool.value_of(2) == pytest.approx(f.pool.value_of(1))


def test_probation_fifo_keeps_one_shots_out_of_main_and_promotes_repeats() -> None:
    e = _one_expert(10, probation=2, fifo=0.2)  # 30 slots: 6 in probation (two chunks), 24 in main
    pool = e.pool
    for k in (1, 2, 3):  # chunks fetched twice: the second fetch is a hit while on probation
        e.access(k, None, 0, CHUNK)
        e.access(k, None, 0, CHUNK)
    assert pool.on_probation(3)
    e.drain()
    for k in range(100, 140):  # a scan of one-shots churns through probation only
        e.access(k, None, 0, CHUNK)
    assert pool.fifo_used <= pool.probation_slots
    assert all(not pool.on_probation(k) and e.holds(k) for k in (1, 2, 3))
    assert sum(1 for k in range(100, 140) if k in pool.residents) <= 2
    # the switch's slots main does not use keep the latest one-shots as leftovers, first to go
    assert {k for k in range(100, 140) if e.holds(k) and k not in pool.residents} == set(e.image.leftovers)
    evicts = [c for c in e.drain() if isinstance(c, Evict)]
    assert evicts and all("probation expired" in c.reason for c in evicts)  # nothing proven was displaced
    e.access(500, None, 0, CHUNK)
    assert pool.on_probation(500)
    e.access(500, None, 0, CHUNK)  # a hit while on probation
    e.access(501, None, 0, CHUNK)
    e.access(502, None, 0, CHUNK)  # pushes 500 out of probation: promoted, not dropped
    assert e.holds(500) and not pool.on_probation(500)
    assert pool.stats["promoted"] >= 1
    assert pool.main_used + pool.fifo_used == pool.allocator.used_slots


def test_slots_match_residents_under_random_churn() -> None:
    import random

    rng = random.Random(3)
    e = _engine(12, experts=(Expert(8.0), Expert(1e4, probation_hits=2), Expert(64.0, 2, 0.25)), epoch_fetches=32)
    e.pin(7777, None, 0, CHUNK)
    seen_bases: set[int] = set()
    for step in range(4000):
        key = rng.choice(range(40)) if rng.random() < 0.7 else 10_000 + step
        parent = key - 1 if key % 5 else None
        e.access(key, parent, key % 5, CHUNK, tenant=key % 2)
        for c in e.drain():
            if isinstance(c, Admit):
                seen_bases.add(c.base_slot)
        for pool in e.experts:
            live = {r.base_slot: r.n_slots for r in pool.residents.values()}
            assert pool.allocator.allocations() == live  # no leaked or double-booked slots
            assert pool.main_used + pool.fifo_used == pool.allocator.used_slots
            assert all(
                r.children == sum(1 for c in pool.residents.values() if c.parent == r.key)
                for r in pool.residents.values()
            )
    assert e.holds(7777)
    assert len(seen_bases) <= e.n_slots // 3  # freed slot runs are reused, never fresh ones beyond the pool


def test_restore_adopts_what_a_switch_holds() -> None:
    e = _engine(4)
    assert e.can_restore(CHUNK, 6)
    e.restore(7, None, 0, CHUNK, base_slot=6)
    e.restore(8, 7, 1, CHUNK, base_slot=0)
    assert not e.can_restore(CHUNK, 5)  # overlaps chunk 7's slots
    with pytest.raises(QuotaError):
        e.restore(7, None, 0, CHUNK, base_slot=9)  # already resident
    assert e.holds(7) and e.holds(8) and e.drain() == []  # adopted: nothing to write
    assert all(p.residents[7].base_slot == 6 for p in e.experts)
    assert e.step([Observation(7, None, 0, CHUNK)]) == [] and e.stats["hits"] == 1  # hits continue
    changes = e.step([Observation(k, None, 0, CHUNK) for k in (1, 2)])
    assert [c.base_slot for c in changes if isinstance(c, Admit)] == [3, 9]  # around the adopted runs
