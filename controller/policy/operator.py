"""Operator overrides the engine has no verb for: admit or evict a chunk now, set a tenant's quota.

Pins go through :meth:`PolicyEngine.pin` / :meth:`PolicyEngine.unpin`. Eviction by hand and
quota changes are applied to every expert (as pins are), so an override survives a leader
switch, and return the leader's changes exactly as :meth:`PolicyEngine.step` does, so the
daemon ships them the same way; each settles the switch (the leftovers of earlier leaders go,
``image.py``), so after an override the switch holds nothing the leader does not. The pool's
own bookkeeping does the work (:meth:`ValuePool.admit`, :meth:`ValuePool.evict`,
:meth:`ValuePool.set_quota`).
"""

from __future__ import annotations

import contextlib

from controller.policy.changes import Change, EvictAction
from controller.policy.engine import PolicyEngine
from controller.policy.quotas import QuotaError


def admit(
    engine: PolicyEngine, key: int, parent: int | None, position: int, nbytes: int, tenant: int = 0
) -> list[Change]:
    """Admit ``key`` past the gate in every expert; QuotaError (nothing changed) when the leader has no room."""
    engine.pool.admit(key, parent, position, nbytes, tenant)
    for pool in engine.experts:
        if pool is not engine.pool:
            # A shadow expert without room simply does not hold it: shadows only score themselves.
            with contextlib.suppress(QuotaError):
                pool.admit(key, parent, position, nbytes, tenant)
    return engine.drain(settle=True)


def evict(engine: PolicyEngine, key: int, action: EvictAction, why: str = "evicted by operator") -> list[Change]:
    """Evict ``key`` from every expert now; QuotaError (nothing changed) if the leader cannot let it go."""
    lead = engine.pool.residents.get(key)
    if lead is None:
        if engine.holds(key):  # a leftover of an earlier leader: only the switch holds it
            return engine.evict_leftover(key, action, why)
        raise QuotaError(f"chunk {key:#x} is not in the {engine.tier.name.lower()} pool")
    engine.pool.evict(key, action, why)  # raises before any change for a pinned chunk or a parent
    for pool in engine.experts:
        r = pool.residents.get(key)
        # A shadow expert may hold the chunk as a parent or pinned differently; its own policy decides then.
        if pool is not engine.pool and r is not None and not r.pinned and r.children == 0:
            pool.evict(key, action, why)
    return engine.drain(settle=True)


def set_quota(engine: PolicyEngine, tenant: int, slots: int | None) -> list[Change]:
    """Set (``slots``) or lift (None) ``tenant``'s slot quota in every expert; QuotaError if pins exceed it."""
    if slots is not None:
        if slots < 1:
            raise QuotaError(f"quota of tenant {tenant} must be at least 1 slot, got {slots}")
        for pool in engine.experts:  # check all first: a refused quota changes nothing anywhere
            pinned = sum(r.n_slots for r in pool.residents.values() if r.tenant == tenant and r.pinned)
            if pinned > slots:
                raise QuotaError(
                    f"tenant {tenant} has {pinned} pinned slots, more than the quota of {slots}: unpin first"
                )
    for pool in engine.experts:
        pool.set_quota(tenant, slots)
    return engine.drain(settle=True)
