"""An S3-FIFO expert: a small FIFO, a main FIFO with reinsertion, and ghost entries (SOSP'23).

Why a classic among the value experts: the leader race is only as good as its best expert,
and on bursty agent traffic (a few long prompts re-sent by many sessions) S3-FIFO's quick
demotion of one-hit chunks beats every decayed-count pool the engine ran (docs/research/README.md).
Rather than approximate it with probation knobs, :class:`FifoPool` is S3-FIFO itself:

- a first sighting enters the **small** FIFO (a tenth of the slots); leaving it unhit, the
  chunk goes and its key is remembered as a **ghost** (as many ghosts as main holds chunks);
  hit while there, it moves to main;
- a miss on a ghost enters **main** directly;
- main is a FIFO with reinsertion (CLOCK): each hit since insertion (at most 3) buys the chunk
  another lap instead of eviction.

It is a :class:`~controller.policy.pool.ValuePool` in everything but the order of victims and
admission (every miss is admitted), so slots, quotas, pins, operator verbs, demotion and the
change log are the pool's own. The simulator's S3-FIFO baseline (``controller.sim.caches``) is
this pool run alone, without the leaves-first rule, as textbook S3-FIFO; the tests check its
hits against a textbook implementation. With ``leaves_first`` (always so in a tier holding the
last copy) a parent of resident chunks is never a victim: leaving the small FIFO it moves to
main, and main passes over it until its last child is gone.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from controller.policy.changes import Admit
from controller.policy.eviction import Resident
from controller.policy.pool import ValuePool

#: hits since insertion that main remembers (each buys one more lap)
MAX_FREQ = 3


class FifoPool(ValuePool):
    """S3-FIFO residency over the pool's slots: small FIFO (``self.fifo``), main FIFO with reinsertion, ghosts."""

    def __init__(self, **kwargs: Any) -> None:
        """The :class:`ValuePool` arguments; probation and leaves-first are S3-FIFO's own here."""
        kwargs["probation_fraction"] = 0.0  # main may use every slot; the small FIFO's share is below
        super().__init__(**kwargs)
        #: the small FIFO's share of the slots (S3-FIFO's 10%, at least one chunk's worth)
        self.small_slots = max(1, self.n_slots // 10)
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self._freq: dict[int, int] = {}
        # main's FIFO position: a reinserted chunk goes to the tail with the next number
        self._lap = 0.0

    def access(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int, estimate: int) -> bool:
        """One fetch: a hit earns another lap in main; a miss is admitted (small FIFO, or main for a ghost)."""
        self.clock += 1.0
        r = self.residents.get(key)
        if r is not None:
            self.stats["hits"] += 1
            self._count_hit(r, self.clock)  # the decayed count only feeds value_of and demote-or-drop
            f = self._freq.get(key, 0)
            if f < MAX_FREQ:
                self._freq[key] = f + 1
            return True
        self.stats["misses"] += 1
        self._admit_miss(key, parent, position, nbytes, tenant)
        return False

    def _small_cap(self, n: int) -> int:
        """Slots of the small FIFO for chunks of ``n`` slots: a tenth of the chunks the pool holds, at least one."""
        return n * max(1, (self.n_slots // n) // 10)

    def _main_cap(self, n: int) -> int:
        """Slots main may fill before a promotion from the small FIFO pushes a chunk out of it."""
        return max(n, self.n_slots - self._small_cap(n))

    def _admit_miss(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int) -> None:
        n = self.slots_for(nbytes)
        if self._refused_outright(n, tenant):  # S3-FIFO has no per-tenant order
            return
        while self.fifo_used + self.main_used + n > self.n_slots:
            if not self._make_space(n, key):
                self.stats["rejected_value"] += 1
                return
        base = self.allocator.alloc(n)
        while base is None:  # enough free slots but no run long enough (mixed chunk sizes)
            if not self._make_space(n, key):
                self.stats["rejected_value"] += 1
                return
            base = self.allocator.alloc(n)
        to_main = key in self.ghost
        if to_main:
            del self.ghost[key]
        r = self._install(key, parent, position, nbytes, n, base, tenant, 0.0, self._gain(position, n),
                          probation=not to_main)
        self._freq[key] = 0
        if to_main:
            self._to_tail(r)
        self.stats["admitted"] += 1
        if self.record:
            why = "S3-FIFO: a ghost comes back, into main" if to_main else "S3-FIFO: first sighting, small FIFO"
            self.changes.append(Admit(key, self.tier, base, n, self.value_of(key), why))

    def _to_tail(self, r: Resident) -> None:
        """(Re)enter ``r`` at main's tail."""
        self._lap += 1.0
        r.score = self._lap
        self.order.push(r)

    def _make_space(self, n: int, by: int) -> bool:
        """One round of S3-FIFO's eviction for a chunk of ``n`` slots; False when nothing could move."""
        before = self.fifo_used + self.main_used
        if self.fifo and (self.fifo_used >= self._small_cap(n) or self.main_used == 0):
            self._evict_small(by)
        else:
            self._evict_main(by)
        if self.fifo_used + self.main_used < before:
            return True
        # nothing left the pool (everything in main pinned, or the small FIFO all promoted): try the other queue
        if self.fifo:
            self._evict_small(by)
        return self.fifo_used + self.main_used < before

    def _evict_small(self, by: int) -> None:
        """Oldest of the small FIFO: into main if hit while there, else out (its key kept as a ghost)."""
        while self.fifo:
            key = next(iter(self.fifo))
            r = self.residents[key]
            # hit while there, pinned, or (leaves first) the parent of resident chunks: it stays, in main
            if self._freq.get(key, 0) > 0 or r.pinned or r.children:
                del self.fifo[key]
                self.fifo_used -= r.n_slots
                self.main_used += r.n_slots
                self._freq[key] = 0
                if not r.pinned:
                    self._to_tail(r)
                if self.main_used > self._main_cap(r.n_slots):
                    self._evict_main(by)
                continue
            del self._freq[key]
            self._evict(r, "S3-FIFO small queue: not hit, displaced by", by)
            self.ghost[key] = None
            ghosts = self._main_cap(r.n_slots) // r.n_slots
            while len(self.ghost) > ghosts:
                self.ghost.popitem(last=False)
            return

    def _evict_main(self, by: int) -> None:
        """Head of main: a chunk hit since its last lap goes round again (one hit spent), else out."""
        while True:
            r = self.order.pop_victim(self.residents, None)
            if r is None:
                return
            f = self._freq.get(r.key, 0)
            if f > 0:
                self._freq[r.key] = f - 1
                self._to_tail(r)
                continue
            self._freq.pop(r.key, None)
            self._evict(r, "S3-FIFO main queue: no hit since its last lap, displaced by", by)
            return
