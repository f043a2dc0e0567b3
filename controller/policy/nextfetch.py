"""A next-fetch expert: evict the chunk whose next fetch looks furthest away (Belady, predicted).

Belady evicts whatever is next used furthest in the future, and bypasses a chunk whose next use
comes after every resident's. Every other expert ranks chunks by how often they were fetched
(decayed counts, S3-FIFO's laps); none asks *when* a chunk will be fetched next, which is
what Belady's edge on session traffic is made of (an agent's next step or a chat's next turn
re-fetches its prefix a few dozen fetches later, on another node). :class:`NextFetchPool`
predicts it from the chunk's own history:

- the expected gap between its fetches, an exponentially weighted mean of the gaps seen
  (weight :data:`GAP_WEIGHT` on the latest); a chunk seen once gets :data:`FIRST_GAP`;
- the time left before its next fetch: ``gap - age`` while the chunk is not yet due (``age``
  = fetches since its last); once overdue, ``OVERDUE x age``, growing with the wait, since a
  chunk that missed its turn has most likely had its last (its session is over);
- on a miss with the pool full: the victim is the resident with the most time left among
  :data:`SAMPLE` drawn at random (the sampled eviction of Redis, Hyperbolic caching and LRB:
  the score changes with time, so no heap can keep it in order), and the fetched chunk is
  not admitted at all when its own time left is at least the victim's.

Where it pays (docs/research/README.md, the leave-one-family-out runs): small pools on session
traffic, tool at 16 and 64 MiB and chat from 256 MiB to 4 GiB, where decayed counts keep
chunks that were popular rather than chunks about to be fetched. On docqa and synthetic
traffic (independent draws from fixed popularities) it trails the frequency experts, and the
race leaves it alone there.

It is a :class:`~controller.policy.pool.ValuePool` in everything but the order of victims and
admission, so slots, quotas, pins, operator verbs, demotion and the change log are the pool's
own (operator verbs that need a victim take the pool's value order: the decayed count kept for
demotion). With ``leaves_first`` a parent of resident chunks is never a victim. The gap history
of chunks not resident is bounded (:data:`HISTORY`, oldest forgotten first), like S3-FIFO's
ghosts, so a long-running controller does not grow with every key it ever saw.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from typing import Any

from controller.policy.changes import Admit, EvictAction
from controller.policy.eviction import Resident
from controller.policy.pool import ValuePool

#: weight of the latest gap in a chunk's mean gap between fetches
GAP_WEIGHT = 0.5
#: expected gap (fetches) of a chunk fetched once, before any chunk came back: the pool then learns
#: it as the mean gap at which chunks come back the first time (weight :data:`FIRST_GAP_WEIGHT`), so
#: it follows the workload's pace instead of a constant (a constant 1000 cut this expert's hits,
#: run alone, to 30% and 53% on the conversation trace at 1 and 4 GiB and to 77% on docqa at 4 GiB)
FIRST_GAP = 1000.0
#: weight of the latest first return in the learned first gap
FIRST_GAP_WEIGHT = 1.0 / 32.0
#: an overdue chunk's time left is this many times its wait (the leave-one-family-out runs
#: preferred 2 to 1 or 0.5: at 1 GiB on docqa the slower verdict cost the race 0.2 points)
OVERDUE = 2.0
#: residents sampled per eviction
SAMPLE = 64
#: chunks whose gap history is kept besides the residents'
HISTORY = 1 << 16


class NextFetchPool(ValuePool):
    """Residency by predicted next fetch: evict (or bypass) what comes back last, sampled."""

    def __init__(self, *, seed: int = 0, **kwargs: Any) -> None:
        """The :class:`ValuePool` arguments (no probation segment: bypass is this pool's admission rule)."""
        kwargs["probation_fraction"] = 0.0
        super().__init__(**kwargs)
        #: key -> [last fetch, mean gap (negative: seen once)], oldest first
        self._history: OrderedDict[int, list[float]] = OrderedDict()
        # residents in an array, for sampling in O(1)
        self._keys: list[int] = []
        self._at: dict[int, int] = {}
        self._rng = random.Random(seed)
        #: expected gap of a chunk seen once: the mean gap of first returns so far
        self.first_gap = FIRST_GAP

    def time_left(self, key: int) -> float:
        """Predicted fetches until ``key``'s next fetch (larger: evicted first)."""
        h = self._history.get(key)
        if h is None:  # a resident whose history was forgotten has not been fetched for a long time
            r = self.residents.get(key)
            return OVERDUE * (self.clock - r.t0) if r is not None else math.inf
        age = self.clock - h[0]
        gap = h[1] if h[1] >= 0.0 else self.first_gap
        return gap - age if age < gap else OVERDUE * age

    def access(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int, estimate: int) -> bool:
        """One fetch: learn its gap; a hit refreshes the decayed count, a miss may admit it."""
        self.clock += 1.0
        now = self.clock
        hist = self._history
        h = hist.get(key)
        if h is None:
            hist[key] = [now, -1.0]
            if len(hist) > HISTORY + len(self._keys):
                hist.popitem(last=False)
        else:
            gap = now - h[0]
            if h[1] < 0.0:  # its first return
                h[1] = gap
                self.first_gap += FIRST_GAP_WEIGHT * (gap - self.first_gap)
            else:
                h[1] = GAP_WEIGHT * gap + (1.0 - GAP_WEIGHT) * h[1]
            h[0] = now
            hist.move_to_end(key)
        r = self.residents.get(key)
        if r is not None:
            self.stats["hits"] += 1
            self._count_hit(r, now)  # feeds value_of, the operator verbs' order and demote-or-drop only
            return True
        self.stats["misses"] += 1
        self._admit_miss(key, parent, position, nbytes, tenant)
        return False

    def _victim(self) -> Resident | None:
        """The sampled resident with the most time left (a leaf, not pinned); None if there is none."""
        keys, residents = self._keys, self.residents
        pool = keys if len(keys) <= SAMPLE else self._rng.sample(keys, SAMPLE)
        for candidates in (pool, keys):  # all of them only when no sampled one may go
            best: Resident | None = None
            most = -math.inf
            for k in candidates:
                r = residents[k]
                if r.pinned or r.children:
                    continue
                t = self.time_left(k)
                if t > most:
                    best, most = r, t
            if best is not None or candidates is keys:
                return best
        return None

    def _admit_miss(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int) -> None:
        n = self.slots_for(nbytes)
        if self._refused_outright(n, tenant):  # no per-tenant order here either
            return
        first = True
        while self.main_used + n > self.n_slots:
            v = self._victim()
            if v is None or (first and self.time_left(key) >= self.time_left(v.key)):
                self.stats["rejected_value"] += 1  # comes back after everything resident: bypass
                return
            first = False
            self._evict(v, "next fetch furthest away, displaced by", key)
        base = self.allocator.alloc(n)
        while base is None:  # enough free slots but no run long enough (mixed chunk sizes)
            v = self._victim()
            if v is None:
                self.stats["rejected_value"] += 1
                return
            self._evict(v, "next fetch furthest away, defragmenting for", key)
            base = self.allocator.alloc(n)
        self._install(key, parent, position, nbytes, n, base, tenant, 0.0, self._gain(position, n))
        self.stats["admitted"] += 1
        if self.record:
            why = f"next fetch due in {self.time_left(key):.0f} fetches, sooner than the victim's"
            self.changes.append(Admit(key, self.tier, base, n, self.value_of(key), why))

    def _install(self, key: int, parent: int | None, position: int, nbytes: int, n: int, base: int,
                 tenant: int, log2_count: float, gain: float, probation: bool = False) -> Resident:
        r = super()._install(key, parent, position, nbytes, n, base, tenant, log2_count, gain, probation)
        self._at[key] = len(self._keys)
        self._keys.append(key)
        return r

    def _evict(self, r: Resident, why: str, by: int, forced: EvictAction | None = None) -> None:
        super()._evict(r, why, by, forced)
        i = self._at.pop(r.key)
        last = self._keys.pop()
        if last != r.key:
            self._keys[i] = last
            self._at[last] = i
