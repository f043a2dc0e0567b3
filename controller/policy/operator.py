"""Operator overrides the engine has no verb for: evict a chunk now, set a tenant's quota.

Pins go through :meth:`PolicyEngine.pin` / :meth:`PolicyEngine.unpin`. Eviction by hand and
quota changes are here, applied to every expert (as pins are) so that the overrides survive
a leader switch, and returning the leader's changes exactly as :meth:`PolicyEngine.step`
does, so the daemon ships them the same way.

Unlike the pool's own eviction, which picks demote-or-drop from the chunk's expected hits,
an operator eviction carries the operator's choice; hence a removal of its own here rather
than a call into the pool's eviction path (the bookkeeping is the same: slots, tenant
charge, pin count, the parent becoming a leaf again).
"""

from __future__ import annotations

from controller.policy.changes import Change, Evict, EvictAction
from controller.policy.engine import PolicyEngine
from controller.policy.eviction import Resident, demotion
from controller.policy.pool import ValuePool
from controller.policy.quotas import QuotaError


def _remove(pool: ValuePool, r: Resident, action: EvictAction, why: str) -> None:
    """Take ``r`` out of ``pool`` and record an Evict with ``action``."""
    expected = 2.0 ** (r.log2_count - (pool.clock - r.t0) / pool.half_life)
    del pool.residents[r.key]
    pool.allocator.free(r.base_slot, r.n_slots)
    pool.quotas.charge(r.tenant, -r.n_slots)
    if r.pinned:
        pool.quotas.pinned_slots -= r.n_slots
    p = pool.residents.get(r.parent) if r.parent is not None else None
    if p is not None:
        p.children -= 1
        if p.children == 0 and not p.pinned:
            pool.order.push(p)  # now a leaf: a candidate again
    pool.stats["demoted" if action is EvictAction.DEMOTE else "dropped"] += 1
    if pool.record:
        target = pool.layout.demotion_target(pool.tier) if action is EvictAction.DEMOTE else None
        pool.changes.append(Evict(r.key, pool.tier, action, target, expected, why))


def evict(engine: PolicyEngine, key: int, action: EvictAction, why: str = "evicted by operator") -> list[Change]:
    """Evict ``key`` from every expert now; refuses (QuotaError) a pinned chunk or one with resident children."""
    lead = engine.pool.residents.get(key)
    if lead is not None and lead.pinned:
        raise QuotaError(f"chunk {key:#x} is pinned: unpin it first")
    if lead is not None and lead.children:
        raise QuotaError(f"chunk {key:#x} has {lead.children} resident child chunk(s): evict them first")
    for pool in engine.experts:
        r = pool.residents.get(key)
        # A shadow expert may hold the chunk as a parent; it keeps it (its own policy decides).
        if r is not None and not r.pinned and r.children == 0:
            _remove(pool, r, action, why)
    return engine.drain()


def set_quota(engine: PolicyEngine, tenant: int, slots: int | None) -> list[Change]:
    """Set (``slots``) or lift (None) ``tenant``'s slot quota; evicts its lowest-value leaves down to it.

    Refused (QuotaError, nothing changed) when the tenant's pinned chunks alone exceed the quota.
    """
    if slots is not None and slots < 1:
        raise QuotaError(f"quota of tenant {tenant} must be at least 1 slot, got {slots}")
    if slots is not None:
        for pool in engine.experts:
            pinned = sum(r.n_slots for r in pool.residents.values() if r.tenant == tenant and r.pinned)
            if pinned > slots:
                raise QuotaError(f"tenant {tenant} has {pinned} pinned slots, more than the quota of {slots}: "
                                 "unpin first")
    for pool in engine.experts:
        if slots is None:
            pool.quotas.quotas.pop(tenant, None)
            continue
        pool.quotas.quotas[tenant] = slots
        while pool.quotas.used[tenant] > slots:
            v = pool.order.pop_victim(pool.residents, tenant)
            if v is None:
                break  # the rest are parents of resident chunks or pinned: no admission until it shrinks
            action, _target, reason = demotion(2.0 ** (v.log2_count - (pool.clock - v.t0) / pool.half_life),
                                              pool.layout.demotion_target(pool.tier), pool.demote_min_hits)
            _remove(pool, v, action, f"over the quota of tenant {tenant} ({slots} slots); {reason}")
    return engine.drain()
