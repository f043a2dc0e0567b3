"""One tier's residency under the reuse-value rules: admit, score, evict leaves first, pin.

A :class:`ValuePool` holds chunks in a paged slot array. Each resident carries a decayed hit
count (half-life in fetches, fixed per pool) and a score ``log2(count) + t / half_life +
log2(saving per hit / slots)`` that stays constant between hits, so the lowest-value leaf is
the top of a heap. The :class:`~controller.policy.engine.PolicyEngine` runs several pools
with different half-lives over the same fetches and lets the best one drive the switch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from controller.policy.admission import AdmissionGate
from controller.policy.allocator import SlotAllocator
from controller.policy.changes import Admit, Change, Evict, EvictAction, Pin, Unpin
from controller.policy.eviction import EvictionOrder, Resident, demotion
from controller.policy.quotas import QuotaBook, QuotaError
from controller.policy.tiers import Tier, TierLayout


class ValuePool:
    """Residency of one tier: value-gated admission, leaf-first eviction with demotion, pins, quotas."""

    def __init__(
        self,
        *,
        tier: Tier,
        n_slots: int,
        slot_bytes: int,
        half_life: float,
        gate: AdmissionGate,
        saving: Callable[[int], float],
        layout: TierLayout,
        demote_min_hits: float = 1.0,
        tenant_quotas: dict[int, int] | None = None,
        pin_fraction: float = 0.25,
    ) -> None:
        if half_life <= 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        self.tier = tier
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        self.half_life = half_life
        self.gate = gate
        self.saving = saving
        self.layout = layout
        self.demote_min_hits = demote_min_hits
        self.allocator = SlotAllocator(n_slots)
        self.quotas = QuotaBook(n_slots, dict(tenant_quotas or {}), pin_fraction)
        self.residents: dict[int, Resident] = {}
        self.order = EvictionOrder()
        self.clock = 0.0
        #: when False (a shadow pool) no change objects are built: only the outcome matters
        self.record = True
        self.changes: list[Change] = []
        self.stats: dict[str, int] = dict.fromkeys(
            ("hits", "misses", "admitted", "rejected_probation", "rejected_value", "too_big", "demoted", "dropped"), 0
        )

    def slots_for(self, nbytes: int) -> int:
        """Slots a chunk of ``nbytes`` bytes occupies."""
        return max(1, -(-nbytes // self.slot_bytes))

    def value_of(self, key: int) -> float:
        """Current reuse value of a resident chunk (expected hits x saving per hit / slot), else 0."""
        r = self.residents.get(key)
        if r is None:
            return 0.0
        return float(2.0 ** (r.log2_count - (self.clock - r.t0) / self.half_life + r.gain))

    def access(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int, estimate: int) -> bool:
        """One fetch at the next clock tick; ``estimate`` is the gate's count for ``key`` (this fetch included)."""
        self.clock += 1.0
        now = self.clock
        r = self.residents.get(key)
        if r is not None:
            self.stats["hits"] += 1
            h = self.half_life
            decayed = r.log2_count - (now - r.t0) / h
            # log2(2**decayed + 1), kept finite for counts decayed to nothing
            r.log2_count = decayed + math.log2(1.0 + 2.0 ** (-decayed)) if decayed > -60 else 0.0
            r.t0 = now
            r.score = r.log2_count + now / h + r.gain
            if r.children == 0 and not r.pinned:
                self.order.push(r)
            return True
        self.stats["misses"] += 1
        self._consider(key, parent, position, nbytes, tenant, estimate)
        return False

    # ----------------------------------------------------------------- admission

    def _gain(self, position: int, n_slots: int) -> float:
        return math.log2(self.saving(position) / n_slots)

    def _worth(self, r: Resident) -> float:
        """Expected hits x saving per hit, now (the quantity victims are weighed by)."""
        return float(2.0 ** (r.log2_count - (self.clock - r.t0) / self.half_life + r.gain)) * r.n_slots

    def _over(self, tenant: int, n: int, freed: int) -> bool:
        return self.quotas.used[tenant] - freed + n > self.quotas.quota(tenant)

    def _consider(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int, estimate: int) -> None:
        n = self.slots_for(nbytes)
        if n > self.n_slots or n > self.quotas.quota(tenant):
            self.stats["too_big"] += 1
            return
        gain = self._gain(position, n)
        cand_worth = estimate * 2.0**gain * n
        quota_bound = self._over(tenant, n, 0)
        victims: list[Resident] = []
        freed = 0
        while (quota_bound and self._over(tenant, n, freed)) or self.allocator.free_slots + freed < n:
            v = self.order.pop_victim(self.residents, tenant if quota_bound else None)
            if v is None:
                break
            victims.append(v)
            freed += v.n_slots
        if self.allocator.free_slots + freed < n or (quota_bound and self._over(tenant, n, freed)):
            for v in victims:  # everything left is pinned or has resident children
                self.order.push(v)
            self.stats["rejected_value"] += 1
            return
        victims_worth = sum(self._worth(v) for v in victims) if victims else None
        verdict = self.gate.judge(estimate, cand_worth, victims_worth)
        if not verdict.admit:
            for v in victims:
                self.order.push(v)
            self.stats["rejected_probation" if self.gate.on_probation(estimate) else "rejected_value"] += 1
            return
        for v in victims:
            self._evict(v, f"displaced by {key:#x}")
        base = self.allocator.alloc(n)
        while base is None:  # enough free slots but no run long enough (mixed chunk sizes)
            v = self.order.pop_victim(self.residents, None)
            if v is None:
                return
            self._evict(v, f"defragmenting for {key:#x}")
            base = self.allocator.alloc(n)
        self._install(key, parent, position, nbytes, n, base, tenant, math.log2(max(estimate, 1)), gain)
        self.stats["admitted"] += 1
        if self.record:
            self.changes.append(Admit(key, self.tier, base, n, cand_worth / n, verdict.reason))

    def _install(
        self,
        key: int,
        parent: int | None,
        position: int,
        nbytes: int,
        n: int,
        base: int,
        tenant: int,
        log2_count: float,
        gain: float,
    ) -> Resident:
        now = self.clock
        r = Resident(key, parent, tenant, position, nbytes, n, base, log2_count, now, gain)
        r.score = log2_count + now / self.half_life + gain
        self.residents[key] = r
        self.quotas.charge(tenant, n)
        p = self.residents.get(parent) if parent is not None else None
        if p is not None:
            p.children += 1  # the parent stops being a leaf; its heap entry goes stale
        self.order.push(r)
        return r

    def _evict(self, r: Resident, why: str) -> None:
        expected = 2.0 ** (r.log2_count - (self.clock - r.t0) / self.half_life)
        action, target, reason = demotion(expected, self.layout.demotion_target(self.tier), self.demote_min_hits)
        del self.residents[r.key]
        self.allocator.free(r.base_slot, r.n_slots)
        self.quotas.charge(r.tenant, -r.n_slots)
        if r.pinned:
            self.quotas.pinned_slots -= r.n_slots
        p = self.residents.get(r.parent) if r.parent is not None else None
        if p is not None:
            p.children -= 1
            if p.children == 0 and not p.pinned:
                self.order.push(p)  # now a leaf: a candidate again
        self.stats["demoted" if action is EvictAction.DEMOTE else "dropped"] += 1
        if self.record:
            self.changes.append(Evict(r.key, self.tier, action, target, expected, f"{why}; {reason}"))

    # ----------------------------------------------------------------- operator actions

    def pin(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int) -> None:
        """Pin ``key`` for ``tenant``, admitting it (displacing unpinned leaves) when absent."""
        r = self.residents.get(key)
        if r is not None and r.pinned:
            return
        n = r.n_slots if r is not None else self.slots_for(nbytes)
        self.quotas.check_pin(tenant, n)
        if r is None:
            while self.allocator.free_slots < n or self.quotas.over_quota(tenant, n):
                v = self.order.pop_victim(self.residents, tenant if self.quotas.over_quota(tenant, n) else None)
                if v is None:
                    raise QuotaError(f"cannot pin {key:#x}: no unpinned chunk left to displace")
                self._evict(v, f"displaced by pin of {key:#x}")
            base = self.allocator.alloc(n)
            while base is None:
                v = self.order.pop_victim(self.residents, None)
                if v is None:
                    raise QuotaError(f"cannot pin {key:#x}: pool too fragmented")
                self._evict(v, f"defragmenting for pin of {key:#x}")
                base = self.allocator.alloc(n)
            r = self._install(key, parent, position, nbytes, n, base, tenant, 0.0, self._gain(position, n))
            if self.record:
                self.changes.append(Admit(key, self.tier, base, n, 0.0, "pinned by operator"))
        r.pinned = True
        self.quotas.pinned_slots += n
        if self.record:
            self.changes.append(Pin(key, self.tier, r.tenant))

    def unpin(self, key: int) -> None:
        """Release a pin; the chunk competes on value again."""
        r = self.residents.get(key)
        if r is None or not r.pinned:
            raise QuotaError(f"chunk {key:#x} is not pinned")
        r.pinned = False
        self.quotas.pinned_slots -= r.n_slots
        if r.children == 0:
            self.order.push(r)
        if self.record:
            self.changes.append(Unpin(key, self.tier))
