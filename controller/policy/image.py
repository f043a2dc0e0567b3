"""What the switch holds: the leading expert's chunks, and leftovers of earlier leaders until room is needed.

The engine's experts are shadows; the switch holds one set of chunks. Without a leader switch
that set is the leader's pool, change for change. At a leader switch the new leader's pool
differs from what the switch holds, and there are two ways to get there:

- **eagerly** (what the engine did before): write the new leader's pool into the switch at once.
  Every chunk the switch held and the new leader does not is dropped, and every chunk the new
  leader holds and the switch does not is installed empty, a miss until a fetch fills it. The
  dropped chunks are lost at once, although many would still have been hit.
- **lazily** (:class:`SwitchImage`): write nothing. The chunks the new leader does not hold stay
  as *leftovers* and keep serving; a chunk the new leader holds is placed as it passes (the
  fetch that misses on it fills it, exactly as for any admission), and it takes the slots of the
  oldest leftover when the switch is full (leftovers line up in the order the switch placed
  them, and one that is fetched goes to the back of the line; ranking them by the experts'
  votes instead moved no cell, docs/research/README.md). The switch converges to the leader
  at the pace of the fetches, and a hit on a leftover is a hit the eager switch would have
  thrown away.

Over the 30 cells of the leave-one-family-out runs (docs/research/README.md: same experts, same race)
the lazy switch is never behind the eager one; on the held-out conversation trace it is worth
1.1 points of hit ratio at 4 GiB and 1.6 at 24 GiB. A chunk the leader itself evicts is
a leftover too, for the same reason (it goes when the slots are needed, usually at once).

Operator verbs (pins, admissions and evictions by hand, quotas) settle the switch: every leftover
goes, so after one the switch holds nothing the leader does not. A tenant with a quota never has
leftovers (its quota bounds what it holds in the switch, not only in the leader's pool).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from controller.policy.allocator import AllocatorError, SlotAllocator
from controller.policy.changes import Admit, Change, Evict, EvictAction, Pin, Unpin
from controller.policy.pool import ValuePool
from controller.policy.tiers import Tier


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the switch holds a chunk, and for whom."""

    base_slot: int
    n_slots: int
    tenant: int


class SwitchImage:
    """The switch's chunks and slots, following the leader lazily."""

    def __init__(self, tier: Tier, n_slots: int) -> None:
        self.tier = tier
        self.allocator = SlotAllocator(n_slots)
        #: chunk -> its slots in the switch
        self.held: dict[int, Placement] = {}
        #: held chunks the leader does not hold, first to go first, with the eviction to ship then
        self.leftovers: OrderedDict[int, Evict] = OrderedDict()

    def holds(self, key: int) -> bool:
        """Whether the switch holds (and serves) ``key``."""
        return key in self.held

    def touch(self, key: int) -> None:
        """A fetch hit ``key``: a leftover goes to the back of the line."""
        if key in self.leftovers:
            self.leftovers.move_to_end(key)

    def follow(self, lead: ValuePool, fetched: int | None, out: list[Change], settle: bool = False) -> None:
        """Apply the leader's pending changes to the switch, appending what to write to ``out``.

        The leader's evictions make leftovers (gone at once with ``settle``, or for a tenant
        with a quota); its admissions are placed. ``fetched``: the chunk just fetched, placed
        when the leader holds it and the switch does not (the first fetch since a hand-over).
        """
        if not lead.changes and not settle and (fetched is None or fetched in self.held):
            return  # most fetches: nothing decided, nothing to place (this runs once per fetch)
        changes, lead.changes = lead.changes, []
        quotas = lead.quotas.quotas
        for c in changes:
            if isinstance(c, Evict):
                p = self.held.get(c.key)
                if p is None:
                    continue  # never reached the switch
                if settle or p.tenant in quotas:
                    self._remove(c.key)
                    self.leftovers.pop(c.key, None)
                    out.append(c)
                else:
                    self.leftovers[c.key] = c
            elif isinstance(c, Admit):
                if c.key in self.held:
                    self.leftovers.pop(c.key, None)  # the switch kept it: wanted again, nothing to write
                else:
                    r = lead.residents.get(c.key)
                    self._place(c.key, c.n_slots, r.tenant if r is not None else 0, c.value, c.reason, c.base_slot,
                                out)
            elif isinstance(c, Pin | Unpin):
                r = lead.residents.get(c.key)
                if isinstance(c, Pin) and c.key not in self.held and r is not None:
                    # pinned by the operator while the leader held it and the switch did not yet
                    self._place(c.key, r.n_slots, r.tenant, lead.value_of(c.key), "pinned by operator", r.base_slot,
                                out)
                if c.key in self.held:
                    out.append(c)
        if fetched is not None and fetched not in self.held:
            r = lead.residents.get(fetched)
            if r is not None:
                self._place(fetched, r.n_slots, r.tenant, lead.value_of(fetched),
                            "held by the leader, not yet by the switch: placed as it passes", r.base_slot, out)
        if settle:
            self.settle(out)

    def hand_over(self, lead: ValuePool, why: str, out: list[Change]) -> None:
        """``lead`` leads now: what the switch holds and it does not becomes leftovers (nothing is written)."""
        quotas = lead.quotas.quotas
        for key, p in list(self.held.items()):
            if key in lead.residents:
                self.leftovers.pop(key, None)
            elif key not in self.leftovers:
                ev = Evict(key, self.tier, EvictAction.DROP, None, 0.0, f"{why}: not in its pool")
                if p.tenant in quotas:
                    self._remove(key)
                    out.append(ev)
                else:
                    self.leftovers[key] = ev

    def settle(self, out: list[Change]) -> None:
        """Let every leftover go: the switch is then exactly the leader's pool."""
        while self.leftovers:
            self._drop_first(out)

    def drop(self, key: int, action: EvictAction, target: Tier | None, why: str, out: list[Change]) -> None:
        """The operator evicts leftover ``key`` now (to ``target`` when demoted); KeyError if it is not one."""
        if key not in self.leftovers:
            raise KeyError(key)
        del self.leftovers[key]
        self._remove(key)
        out.append(Evict(key, self.tier, action, target, 0.0, why))

    def restore(self, key: int, base_slot: int, n_slots: int, tenant: int) -> None:
        """Take ``key`` as held at ``base_slot`` (a warm switch); AllocatorError if the slots are taken."""
        self.allocator.reserve(base_slot, n_slots)
        self.held[key] = Placement(base_slot, n_slots, tenant)

    def can_restore(self, base_slot: int, n_slots: int) -> bool:
        """Whether ``[base_slot, base_slot + n_slots)`` is free in the switch."""
        return self.allocator.is_free(base_slot, n_slots)

    # ------------------------------------------------------------------ internals

    def _place(self, key: int, n: int, tenant: int, value: float, reason: str, preferred: int,
               out: list[Change]) -> None:
        """Give ``key`` slots (the leader's own when free, else first fit, else a leftover's) and write it."""
        base: int | None = None
        try:
            self.allocator.reserve(preferred, n)
            base = preferred
        except AllocatorError:
            base = self.allocator.alloc(n)
        while base is None and self.leftovers:
            self._drop_first(out)
            base = self.allocator.alloc(n)
        if base is None:
            return  # only with mixed chunk sizes: no run long enough; it is placed at a later fetch
        self.held[key] = Placement(base, n, tenant)
        out.append(Admit(key, self.tier, base, n, value, reason))

    def _drop_first(self, out: list[Change]) -> None:
        key, ev = self.leftovers.popitem(last=False)
        self._remove(key)
        out.append(ev)

    def _remove(self, key: int) -> None:
        p = self.held.pop(key)
        self.allocator.free(p.base_slot, p.n_slots)
