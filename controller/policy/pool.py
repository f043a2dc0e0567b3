"""One tier's residency under the reuse-value rules: probation, value-gated main, leaves first, pins.

A :class:`ValuePool` holds chunks in a paged slot array, in two segments:

- **probation**: a small FIFO (``probation_fraction`` of the slots) where a chunk seen for the
  first time lands. If it is fetched again before it reaches the head it is promoted to the
  main segment (when it beats the main segment's victim); otherwise it leaves without ever
  displacing a proven chunk, so one-shot prefixes stay out.
- **main**: every resident carries a decayed hit count (half-life in fetches, fixed per pool)
  and a score ``log2(count) + t / half_life + log2(saving per hit / slots)`` that stays
  constant between hits, so the lowest-value leaf is the top of a heap. A candidate seen
  before (sketch count >= 2) enters main directly if its value beats the victims'.

The :class:`~controller.policy.engine.PolicyEngine` runs several pools with different
half-lives over the same fetches and lets the best one drive the switch.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

from controller.policy.admission import AdmissionGate
from controller.policy.allocator import SlotAllocator
from controller.policy.changes import Admit, Change, Evict, EvictAction, Pin, Unpin
from controller.policy.eviction import EvictionOrder, Resident, demotion
from controller.policy.quotas import QuotaBook, QuotaError
from controller.policy.tiers import Tier, TierLayout


class ValuePool:
    """Residency of one tier: probation FIFO, value-gated main segment, leaf-first eviction, pins, quotas."""

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
        probation_fraction: float = 0.1,
        demote_min_hits: float = 1.0,
        tenant_quotas: dict[int, int] | None = None,
        pin_fraction: float = 0.25,
        position_tilt: float = 0.0,
        leaves_first: bool = True,
    ) -> None:
        if half_life <= 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        if not 0.0 <= probation_fraction < 1.0:
            raise ValueError(f"probation_fraction must be within [0, 1), got {probation_fraction}")
        self.tier = tier
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        self.half_life = half_life
        self.gate = gate
        self.saving = saving
        self.layout = layout
        self.demote_min_hits = demote_min_hits
        #: weight of log2(1 + position) in a chunk's value (0: position only through ``saving``)
        self.position_tilt = position_tilt
        #: a chunk with resident children is no victim (False: every chunk competes on value alone)
        self.leaves_first = leaves_first
        self._demote_to = layout.demotion_target(tier)
        self.allocator = SlotAllocator(n_slots)
        self.quotas = QuotaBook(n_slots, dict(tenant_quotas or {}), pin_fraction)
        self.residents: dict[int, Resident] = {}
        # resident children per parent key, whether or not the parent itself is resident, so
        # a parent admitted after its children starts with the right count
        self._kids: dict[int, int] = {}
        self.order = EvictionOrder()
        self.probation_slots = int(n_slots * probation_fraction)
        self.main_slots = n_slots - self.probation_slots
        self.fifo: OrderedDict[int, None] = OrderedDict()  # probation residents, oldest first
        self.fifo_used = 0
        self.main_used = 0
        self.clock = 0.0
        #: when False (a shadow pool) no change objects are built: only the outcome matters
        self.record = True
        self.changes: list[Change] = []
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "hits",
                "misses",
                "admitted",
                "promoted",
                "rejected_probation",
                "rejected_value",
                "too_big",
                "demoted",
                "dropped",
            ),
            0,
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

    def on_probation(self, key: int) -> bool:
        """Whether ``key`` sits in the probation segment."""
        return key in self.fifo

    def access(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int, estimate: int) -> bool:
        """One fetch at the next clock tick; ``estimate`` is the gate's count for ``key`` (this fetch included)."""
        self.clock += 1.0
        now = self.clock
        r = self.residents.get(key)
        if r is not None:
            self.stats["hits"] += 1
            self._count_hit(r, now)
            r.score = r.log2_count + now / self.half_life + r.gain
            if r.children == 0 and not r.pinned and key not in self.fifo:
                self.order.push(r)
            return True
        self.stats["misses"] += 1
        self._consider(key, parent, position, nbytes, tenant, estimate)
        return False

    # ----------------------------------------------------------------- admission

    def _count_hit(self, r: Resident, now: float) -> None:
        """Add one hit at ``now`` to ``r``'s decayed count (kept as its log2 at time ``r.t0``)."""
        decayed = r.log2_count - (now - r.t0) / self.half_life
        # log2(2**decayed + 1), kept finite for counts decayed to nothing
        r.log2_count = decayed + math.log2(1.0 + 2.0 ** (-decayed)) if decayed > -60 else 0.0
        r.t0 = now

    def _refused_outright(self, n: int, tenant: int) -> bool:
        """For pools with no per-tenant victim order (S3-FIFO, next fetch): True, and counted, when a
        chunk of ``n`` slots cannot come in whatever leaves: larger than the pool or than its tenant's
        quota, or the tenant at its quota (it then admits nothing until it is under)."""
        quota = self.quotas.quotas.get(tenant)
        if n > self.n_slots or (quota is not None and n > quota):
            self.stats["too_big"] += 1
            return True
        if quota is not None and self.quotas.used[tenant] + n > quota:
            self.stats["rejected_value"] += 1
            return True
        return False

    def _gain(self, position: int, n_slots: int) -> float:
        return math.log2(self.saving(position) / n_slots) + self.position_tilt * math.log2(1.0 + position)

    def _worth(self, r: Resident) -> float:
        """Expected hits x saving per hit, now (the quantity victims are weighed by)."""
        return float(2.0 ** (r.log2_count - (self.clock - r.t0) / self.half_life + r.gain)) * r.n_slots

    def _consider(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int, estimate: int) -> None:
        n = self.slots_for(nbytes)
        quota = self.quotas.quotas.get(tenant)  # None: the tenant may use the whole pool
        if n > self.main_slots or (quota is not None and n > quota):
            self.stats["too_big"] += 1
            return
        gain = self._gain(position, n)
        gate = self.gate
        if self.probation_slots and gate.on_probation(estimate):
            if n > self.probation_slots or (quota is not None and self.quotas.used[tenant] + n > quota):
                self.stats["rejected_probation"] += 1
                return
            while self.fifo_used + n > self.probation_slots:
                if not self._expire_probation():
                    self.stats["rejected_probation"] += 1
                    return
            base = self.allocator.alloc(n)
            if base is None:  # only with mixed chunk sizes: no run long enough
                self.stats["rejected_probation"] += 1
                return
            self._install(key, parent, position, nbytes, n, base, tenant, 0.0, gain, probation=True)
            self.stats["admitted"] += 1
            if self.record:
                self.changes.append(Admit(key, self.tier, base, n, 2.0**gain, "on probation: first sighting"))
            return
        cand_worth = estimate * 2.0**gain * n
        if quota is None and self.main_used + n > self.main_slots:
            # Fast path of a full pool (most misses): decide against the cheapest victim
            # without taking it out of the heap, unless it would really go.
            if gate.on_probation(estimate):
                self.stats["rejected_probation"] += 1
                return
            top = self.order.peek_victim(self.residents)
            one_victim = top is not None and self.main_used - top.n_slots + n <= self.main_slots
            if one_victim and top is not None and cand_worth <= self._worth(top):
                self.stats["rejected_value"] += 1
                return
        victims = self._make_room(n, tenant, quota)
        if victims is None:
            self.stats["rejected_value"] += 1
            return
        victims_worth = sum(self._worth(v) for v in victims) if victims else None
        if not gate.admits(estimate, cand_worth, victims_worth):
            for v in victims:
                self.order.push(v)
            self.stats["rejected_probation" if gate.on_probation(estimate) else "rejected_value"] += 1
            return
        for v in victims:
            self._evict(v, "displaced by", key)
        base = self.allocator.alloc(n)
        while base is None:  # enough free slots but no run long enough (mixed chunk sizes)
            w = self.order.pop_victim(self.residents, None)
            if w is None:
                return
            self._evict(w, "defragmenting for", key)
            base = self.allocator.alloc(n)
        self._install(key, parent, position, nbytes, n, base, tenant, math.log2(max(estimate, 1)), gain)
        self.stats["admitted"] += 1
        if self.record:
            reason = gate.judge(estimate, cand_worth, victims_worth).reason
            self.changes.append(Admit(key, self.tier, base, n, cand_worth / n, reason))

    def _make_room(self, n: int, tenant: int, quota: int | None) -> list[Resident] | None:
        """Pop main victims until ``n`` more slots fit main (and the tenant's quota); None if impossible."""
        used = self.quotas.used[tenant] if quota is not None else 0
        limit = quota if quota is not None else self.n_slots
        quota_bound = used + n > limit
        victims: list[Resident] = []
        freed = 0
        pop = self.order.pop_victim
        while self.main_used - freed + n > self.main_slots or (quota_bound and used - freed + n > limit):
            v = pop(self.residents, tenant if quota_bound else None)
            if v is None:
                for u in victims:  # everything left is pinned or has resident children
                    self.order.push(u)
                return None
            victims.append(v)
            freed += v.n_slots
        return victims

    def _expire_probation(self) -> bool:
        """Move the oldest probation leaf out: promoted to main if it was hit and beats main's victim."""
        fifo = self.fifo
        for _ in range(len(fifo)):
            key, _ = fifo.popitem(last=False)
            r = self.residents[key]
            if r.children:  # leaves before parents: give it another lap
                fifo[key] = None
                continue
            self.fifo_used -= r.n_slots
            if r.log2_count > 0.0:  # hit while on probation: a candidate for main
                victims = self._make_room(r.n_slots, r.tenant, self.quotas.quotas.get(r.tenant))
                if victims is not None:
                    worth = sum(self._worth(v) for v in victims) if victims else None
                    if worth is None or self._worth(r) > worth:
                        for v in victims:
                            self._evict(v, "displaced by promotion of", key)
                        self.main_used += r.n_slots
                        self.order.push(r)
                        self.stats["promoted"] += 1
                        return True
                    for v in victims:
                        self.order.push(v)
            fifo[key] = None  # back in its segment for the bookkeeping of _evict
            self.fifo_used += r.n_slots
            self._evict(r, "probation expired for", key)
            return True
        return False

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
        probation: bool = False,
    ) -> Resident:
        now = self.clock
        r = Resident(key, parent, tenant, position, nbytes, n, base, log2_count, now, gain)
        r.score = log2_count + now / self.half_life + gain
        r.children = self._kids.get(key, 0)
        self.residents[key] = r
        self.quotas.charge(tenant, n)
        if parent is not None and self.leaves_first:
            self._kids[parent] = self._kids.get(parent, 0) + 1
            p = self.residents.get(parent)
            if p is not None:
                p.children += 1  # the parent stops being a leaf; its heap entry goes stale
        if probation:
            self.fifo[key] = None
            self.fifo_used += n
        else:
            self.main_used += n
            self.order.push(r)
        return r

    def _evict(self, r: Resident, why: str, by: int, forced: EvictAction | None = None) -> None:
        expected = 2.0 ** (r.log2_count - (self.clock - r.t0) / self.half_life)
        if forced is not None:  # the operator chose demote or drop (operator.evict)
            action, reason = forced, "operator's choice"
            target = self._demote_to if forced is EvictAction.DEMOTE else None
        elif self.record:
            action, target, reason = demotion(expected, self._demote_to, self.demote_min_hits)
        else:  # same rule as demotion(), without formatting a reason nobody reads
            demote = self._demote_to is not None and expected >= self.demote_min_hits
            action = EvictAction.DEMOTE if demote else EvictAction.DROP
        del self.residents[r.key]
        if self.fifo.pop(r.key, 0) is None:
            self.fifo_used -= r.n_slots
        else:
            self.main_used -= r.n_slots
        self.allocator.free(r.base_slot, r.n_slots)
        self.quotas.charge(r.tenant, -r.n_slots)
        if r.pinned:
            self.quotas.pinned_slots -= r.n_slots
        if r.parent is not None and self.leaves_first:
            left = self._kids[r.parent] - 1
            if left:
                self._kids[r.parent] = left
            else:
                del self._kids[r.parent]
            p = self.residents.get(r.parent)
            if p is not None:
                p.children -= 1
                if p.children == 0 and not p.pinned and p.key not in self.fifo:
                    self.order.push(p)  # now a leaf: a candidate again
        self.stats["demoted" if action is EvictAction.DEMOTE else "dropped"] += 1
        if self.record:
            self.changes.append(Evict(r.key, self.tier, action, target, expected, f"{why} {by:#x}; {reason}"))

    # ----------------------------------------------------------------- operator actions

    def pin(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int) -> None:
        """Pin ``key`` for ``tenant`` in the main segment, admitting it (displacing unpinned leaves) when absent."""
        r = self.residents.get(key)
        if r is not None and r.pinned:
            return
        n = r.n_slots if r is not None else self.slots_for(nbytes)
        self.quotas.check_pin(tenant, n)
        if r is not None and key in self.fifo:  # promote out of probation first
            del self.fifo[key]
            self.fifo_used -= n
            self.main_used += n
        if r is None:
            while self.main_used + n > self.main_slots or self.quotas.over_quota(tenant, n):
                v = self.order.pop_victim(self.residents, tenant if self.quotas.over_quota(tenant, n) else None)
                if v is None:
                    raise QuotaError(f"cannot pin {key:#x}: no unpinned chunk left to displace")
                self._evict(v, "displaced by pin of", key)
            base = self.allocator.alloc(n)
            while base is None:
                v = self.order.pop_victim(self.residents, None)
                if v is None:
                    raise QuotaError(f"cannot pin {key:#x}: pool too fragmented")
                self._evict(v, "defragmenting for pin of", key)
                base = self.allocator.alloc(n)
            r = self._install(key, parent, position, nbytes, n, base, tenant, 0.0, self._gain(position, n))
            if self.record:
                self.changes.append(Admit(key, self.tier, base, n, 0.0, "pinned by operator"))
        r.pinned = True
        self.quotas.pinned_slots += n
        if self.record:
            self.changes.append(Pin(key, self.tier, r.tenant))

    def admit(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int) -> bool:
        """Admit ``key`` into main now, past the gate (operator override); False if already resident.

        Displaces the lowest-value unpinned leaves as needed; QuotaError, nothing changed, when
        the chunk is larger than main or the tenant's quota, or only pinned chunks and parents remain.
        """
        if key in self.residents:
            return False
        n = self.slots_for(nbytes)
        quota = self.quotas.quotas.get(tenant)
        if n > self.main_slots or (quota is not None and n > quota):
            limit = self.main_slots if quota is None or self.main_slots < quota else quota
            raise QuotaError(f"cannot admit {key:#x}: {n} slots, more than the {limit} it may use")
        victims = self._make_room(n, tenant, quota)
        if victims is None:
            raise QuotaError(f"cannot admit {key:#x}: no space, only pinned chunks and parents left to displace")
        for v in victims:
            self._evict(v, "displaced by operator admission of", key)
        base = self.allocator.alloc(n)
        while base is None:  # enough free slots but no run long enough
            w = self.order.pop_victim(self.residents, None)
            if w is None:
                raise QuotaError(f"cannot admit {key:#x}: pool too fragmented")
            self._evict(w, "defragmenting for operator admission of", key)
            base = self.allocator.alloc(n)
        self._install(key, parent, position, nbytes, n, base, tenant, 0.0, self._gain(position, n))
        self.stats["admitted"] += 1
        if self.record:
            self.changes.append(Admit(key, self.tier, base, n, self.value_of(key), "admitted by operator"))
        return True

    def restore(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int, base_slot: int) -> None:
        """Take ``key`` as resident at ``base_slot`` in main, as a switch already holds it (no change emitted).

        For a controller that adopts a warm switch: the chunk starts with no counted hits
        and competes on value like any other from its next fetch. AllocatorError when its
        slots are taken, QuotaError when it is larger than main.
        """
        if key in self.residents:
            raise QuotaError(f"chunk {key:#x} is already resident")
        n = self.slots_for(nbytes)
        if self.main_used + n > self.main_slots:
            raise QuotaError(f"cannot restore {key:#x}: {n} slots, main has {self.main_slots - self.main_used} left")
        self.allocator.reserve(base_slot, n)
        self._install(key, parent, position, nbytes, n, base_slot, tenant, 0.0, self._gain(position, n))

    def evict(self, key: int, action: EvictAction, why: str = "evicted by operator") -> None:
        """Evict ``key`` now with the operator's ``action``; QuotaError if absent, pinned or a parent."""
        r = self.residents.get(key)
        if r is None:
            raise QuotaError(f"chunk {key:#x} is not resident")
        if r.pinned:
            raise QuotaError(f"chunk {key:#x} is pinned: unpin it first")
        if r.children:
            raise QuotaError(f"chunk {key:#x} has {r.children} resident child chunk(s): evict them first")
        self._evict(r, why, key, action)

    def set_quota(self, tenant: int, slots: int | None) -> None:
        """Set (or lift, None) ``tenant``'s slot quota; its lowest-value leaves go until it fits.

        QuotaError, nothing changed, when the tenant's pinned chunks alone exceed ``slots``.
        Chunks that cannot go (parents of resident chunks, probation) stay; the tenant then
        admits nothing until it is under the quota.
        """
        if slots is None:
            self.quotas.quotas.pop(tenant, None)
            return
        if slots < 1:
            raise QuotaError(f"quota of tenant {tenant} must be at least 1 slot, got {slots}")
        pinned = sum(r.n_slots for r in self.residents.values() if r.tenant == tenant and r.pinned)
        if pinned > slots:
            raise QuotaError(f"tenant {tenant} has {pinned} pinned slots, more than the quota of {slots}: unpin first")
        self.quotas.quotas[tenant] = slots
        while self.quotas.used[tenant] > slots:
            v = self.order.pop_victim(self.residents, tenant)
            if v is None:
                break
            self._evict(v, f"tenant {tenant} over its quota of {slots} slots, set by operator for", v.key)

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
