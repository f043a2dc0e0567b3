"""Operator overrides in the policy: admit past the gate, evict with a chosen action, tenant quotas."""

from __future__ import annotations

import pytest

from controller.policy.changes import Admit, Evict, EvictAction
from controller.policy.engine import PolicyConfig, PolicyEngine
from controller.policy.operator import admit, evict, set_quota
from controller.policy.quotas import QuotaError
from controller.policy.tiers import Tier

SLOT = 1408


def engine(slots: int = 40) -> PolicyEngine:
    return PolicyEngine(PolicyConfig(capacity_bytes=slots * SLOT))


def test_admit_places_in_every_expert_and_is_idempotent() -> None:
    e = engine()
    changes = admit(e, 0xA, None, 0, 3 * SLOT)
    assert [type(c) for c in changes] == [Admit]
    adm = changes[0]
    assert isinstance(adm, Admit) and adm.n_slots == 3 and adm.tier is Tier.SWITCH
    assert all(0xA in p.residents for p in e.experts)
    assert e.holds(0xA)
    assert admit(e, 0xA, None, 0, 3 * SLOT) == []


def test_admit_displaces_unpinned_leaves_but_never_pins() -> None:
    e = engine(20)
    main = e.pool.main_slots
    e.pin(0x1, None, 0, 4 * SLOT)
    fill = main - 4
    admit(e, 0x2, None, 0, fill * SLOT)
    assert e.pool.main_used == main
    changes = admit(e, 0x3, None, 0, 2 * SLOT)
    evicted = [c.key for c in changes if isinstance(c, Evict)]
    assert evicted == [0x2] and e.holds(0x3) and e.holds(0x1)
    # Only the pin (4 slots) and 0x3 (2) remain; a chunk needing all of main cannot displace the pin.
    with pytest.raises(QuotaError, match="no space"):
        admit(e, 0x4, None, 0, main * SLOT)
    with pytest.raises(QuotaError, match="more than"):
        admit(e, 0x5, None, 0, (e.pool.n_slots + 1) * SLOT)
    assert e.holds(0x1) and e.holds(0x3) and not e.holds(0x4)


def test_evict_uses_the_operators_action() -> None:
    e = engine()
    admit(e, 0xA, None, 0, SLOT)
    (ev,) = evict(e, 0xA, EvictAction.DROP)
    assert isinstance(ev, Evict) and ev.action is EvictAction.DROP and ev.target is None
    assert not any(0xA in p.residents for p in e.experts)
    admit(e, 0xB, None, 0, SLOT)
    (ev,) = evict(e, 0xB, EvictAction.DEMOTE)
    assert isinstance(ev, Evict) and ev.action is EvictAction.DEMOTE and ev.target is Tier.POOL
    assert e.pool.allocator.free_slots == e.pool.n_slots and e.pool.main_used == 0


def test_evict_refuses_pinned_parents_and_absent_chunks() -> None:
    e = engine()
    e.pin(0x1, None, 0, SLOT)
    with pytest.raises(QuotaError, match="pinned"):
        evict(e, 0x1, EvictAction.DROP)
    admit(e, 0x2, None, 0, SLOT)
    admit(e, 0x3, 0x2, 1, SLOT)
    with pytest.raises(QuotaError, match="child"):
        evict(e, 0x2, EvictAction.DROP)
    with pytest.raises(QuotaError, match="not in the switch pool"):
        evict(e, 0x99, EvictAction.DROP)
    assert e.holds(0x1) and e.holds(0x2) and e.holds(0x3)
    evict(e, 0x3, EvictAction.DROP)
    evict(e, 0x2, EvictAction.DROP)  # a leaf now
    assert not e.holds(0x2)


def test_quota_evicts_lowest_value_leaves_down_to_it() -> None:
    e = engine()
    for k in range(1, 6):
        admit(e, k, None, 0, 2 * SLOT, tenant=7)
    admit(e, 0x50, None, 0, 2 * SLOT, tenant=1)
    changes = set_quota(e, 7, 5)
    gone = [c.key for c in changes if isinstance(c, Evict)]
    assert len(gone) == 3 and 0x50 not in gone
    assert e.pool.quotas.used[7] == 4
    # Over quota: another admission of tenant 7 first displaces one of its own chunks.
    changes = admit(e, 0x6, None, 0, 2 * SLOT, tenant=7)
    assert sum(isinstance(c, Evict) for c in changes) == 1 and e.pool.quotas.used[7] == 4
    set_quota(e, 7, None)
    assert 7 not in e.pool.quotas.quotas


def test_quota_below_the_pinned_slots_is_refused_and_changes_nothing() -> None:
    e = engine()
    e.pin(0x1, None, 0, 3 * SLOT, tenant=2)
    with pytest.raises(QuotaError, match="pinned slots"):
        set_quota(e, 2, 2)
    with pytest.raises(QuotaError, match="at least 1"):
        set_quota(e, 2, 0)
    assert all(2 not in p.quotas.quotas for p in e.experts)
