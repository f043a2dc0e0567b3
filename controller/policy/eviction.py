"""Eviction order (lowest value first, leaves before parents) and the demote-or-drop decision.

A chunk is useless to a reader without its parent (a key implies its whole prefix), so a
chunk whose children are still resident in the tier is never a victim: leaves go first and
a parent becomes a candidate once its last resident child has left. Evicted chunks are not
simply lost: when their expected hits warrant it they are demoted to the next tier down
("value recovery"), and the decision carries its reason.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from controller.policy.changes import EvictAction
from controller.policy.tiers import Tier


@dataclass(slots=True)
class Resident:
    """Policy state of one chunk held in a tier."""

    key: int
    parent: int | None
    tenant: int
    position: int
    nbytes: int
    n_slots: int
    base_slot: int
    log2_count: float  # log2 of the decayed hit count at time t0
    t0: float
    gain: float  # log2(compute saved per hit / slots occupied), constant per chunk
    score: float = 0.0  # log2_count + t0 / half_life + gain: static between hits
    children: int = 0  # resident children in this tier
    pinned: bool = False
    heap_seq: int = -1  # sequence number of this chunk's live heap entry


class EvictionOrder:
    """Per-tenant min-heaps of leaf residents by score, with lazy deletion."""

    def __init__(self) -> None:
        self._heaps: dict[int, list[tuple[float, int, int]]] = {}
        self._seq = 0

    def push(self, r: Resident) -> None:
        """(Re)enter ``r`` in the order with its current score."""
        self._seq += 1
        r.heap_seq = self._seq
        heapq.heappush(self._heaps.setdefault(r.tenant, []), (r.score, self._seq, r.key))

    def rebuild(self, residents: dict[int, Resident]) -> None:
        """Rebuild every heap from ``residents`` (after the scores were recomputed)."""
        self._heaps = {}
        for r in residents.values():
            if r.children == 0 and not r.pinned:
                self._seq += 1
                r.heap_seq = self._seq
                self._heaps.setdefault(r.tenant, []).append((r.score, self._seq, r.key))
        for h in self._heaps.values():
            heapq.heapify(h)

    def _clean_top(self, heap: list[tuple[float, int, int]], residents: dict[int, Resident]) -> None:
        while heap:
            _, seq, key = heap[0]
            r = residents.get(key)
            # Stale (rescored or gone), blocked by resident children, or pinned: not a victim now.
            # Blocked and pinned chunks are pushed again when that changes.
            if r is not None and r.heap_seq == seq and r.children == 0 and not r.pinned:
                return
            heapq.heappop(heap)

    def peek_victim(self, residents: dict[int, Resident]) -> Resident | None:
        """The lowest-score leaf of any tenant, left in place."""
        best: Resident | None = None
        best_score = 0.0
        for h in self._heaps.values():
            self._clean_top(h, residents)
            if h and (best is None or h[0][0] < best_score):
                best_score = h[0][0]
                best = residents[h[0][2]]
        return best

    def pop_victim(self, residents: dict[int, Resident], tenant: int | None = None) -> Resident | None:
        """Remove and return the lowest-score leaf (of ``tenant``, or of any tenant if None)."""
        best: list[tuple[float, int, int]] | None = None
        heaps = [self._heaps.get(tenant, [])] if tenant is not None else list(self._heaps.values())
        for h in heaps:
            self._clean_top(h, residents)
            if h and (best is None or h[0] < best[0]):
                best = h
        if best is None:
            return None
        _, _, key = heapq.heappop(best)
        r = residents[key]
        r.heap_seq = -1
        return r


def demotion(expected_hits: float, target: Tier | None, min_hits: float) -> tuple[EvictAction, Tier | None, str]:
    """Demote an evicted chunk to ``target`` when ``expected_hits`` reach ``min_hits``, else drop it."""
    if target is None:
        return EvictAction.DROP, None, "no lower tier to demote to"
    if expected_hits >= min_hits:
        return (
            EvictAction.DEMOTE,
            target,
            f"expected {expected_hits:.2f} hits >= {min_hits:g}: demote to {target.name.lower()}",
        )
    return EvictAction.DROP, None, f"expected {expected_hits:.2f} hits < {min_hits:g}: not worth keeping"
