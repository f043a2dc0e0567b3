"""Phase 2: replay a switch's chunk-fetch sequence through a pool policy.

``value`` is the controller's own :class:`~controller.policy.engine.PolicyEngine`; the
baselines are textbook versions over the same paged pool (capacity in whole chunks, all
chunks the same size): LRU, LFU (in-cache counts, ties LRU), GDSF (Greedy-Dual-Size-Frequency
with the prefill compute a chunk saves as its cost), S3-FIFO (small/main/ghost FIFOs, SOSP'23)
and offline Belady (evict, or bypass, whatever is next used furthest in the future; optimal
for equal-size chunks).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.policy.admission import AdmissionGate
from controller.policy.engine import PolicyConfig, PolicyEngine
from controller.policy.fifo import FifoPool
from controller.policy.sketch import FrequencySketch
from controller.policy.tiers import Tier, TierLayout, TierSpec
from controller.policy.value import PrefillCost

ONLINE = ("value", "lru", "lfu", "gdsf", "s3fifo")
POLICIES = (*ONLINE, "belady")
#: baselines without a switch pool: no sharing at all, and the holders' pool without a switch
NO_SWITCH = ("none", "holder")
#: policies that may admit a chunk as it passes on its way to the holders (fill on write)
WRITE_AWARE = ("lru", "value", "belady")

_NEVER = 1 << 62


@dataclass
class CacheResult:
    """Which fetches the pool served, and how many table writes (admissions + evictions) it took."""

    hits: npt.NDArray[np.bool_]
    admissions: int
    evictions: int
    demotions: int = 0


def _lru(keys: list[int], cap: int, writes: list[bool] | None = None) -> CacheResult:
    hits = np.zeros(len(keys), dtype=np.bool_)
    od: OrderedDict[int, None] = OrderedDict()
    adm = ev = 0
    for i, k in enumerate(keys):
        if k in od:
            od.move_to_end(k)
            hits[i] = writes is None or not writes[i]
            continue
        od[k] = None
        adm += 1
        if len(od) > cap:
            od.popitem(last=False)
            ev += 1
    return CacheResult(hits, adm, ev)


def _lfu(keys: list[int], cap: int) -> CacheResult:
    hits = np.zeros(len(keys), dtype=np.bool_)
    count: dict[int, int] = {}
    stamp: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []
    adm = ev = 0
    for i, k in enumerate(keys):
        c = count.get(k)
        if c is not None:
            hits[i] = True
            count[k] = c + 1
            stamp[k] = i
            heapq.heappush(heap, (c + 1, i, k))
            continue
        if len(count) >= cap:
            while True:
                c0, s0, k0 = heapq.heappop(heap)
                if count.get(k0) == c0 and stamp[k0] == s0:
                    break
            del count[k0], stamp[k0]
            ev += 1
        count[k] = 1
        stamp[k] = i
        heapq.heappush(heap, (1, i, k))
        adm += 1
    return CacheResult(hits, adm, ev)


def _gdsf(keys: list[int], positions: list[int], cap: int, cost: PrefillCost) -> CacheResult:
    hits = np.zeros(len(keys), dtype=np.bool_)
    prio: dict[int, float] = {}
    freq: dict[int, int] = {}
    heap: list[tuple[float, int, int]] = []
    inflation = 0.0
    adm = ev = 0
    for i, k in enumerate(keys):
        f = freq.get(k)
        c = cost.relative(positions[i])  # equal sizes: size drops out of cost / size
        if f is not None:
            hits[i] = True
            freq[k] = f + 1
            p = inflation + (f + 1) * c
            prio[k] = p
            heapq.heappush(heap, (p, i, k))
            continue
        if len(freq) >= cap:
            while True:
                p0, _, k0 = heapq.heappop(heap)
                if prio.get(k0) == p0:
                    break
            inflation = p0
            del prio[k0], freq[k0]
            ev += 1
        freq[k] = 1
        p = inflation + c
        prio[k] = p
        heapq.heappush(heap, (p, i, k))
        adm += 1
    return CacheResult(hits, adm, ev)


def _s3fifo(keys: list[int], cap: int, chunk_bytes: int, slot_bytes: int) -> CacheResult:
    """S3-FIFO is the engine's own expert (:class:`~controller.policy.fifo.FifoPool`), run alone."""
    n_slots = cap * -(-chunk_bytes // slot_bytes)
    pool = FifoPool(
        tier=Tier.SWITCH,
        n_slots=n_slots,
        slot_bytes=slot_bytes,
        half_life=256.0,
        gate=AdmissionGate(FrequencySketch(), 1),  # unused: S3-FIFO admits every miss
        saving=lambda _position: 1.0,
        layout=TierLayout({Tier.SWITCH: TierSpec(Tier.SWITCH, n_slots * slot_bytes)}),
        leaves_first=False,  # textbook S3-FIFO: the prefix tree plays no part
    )
    pool.record = False
    access = pool.access
    hits = np.fromiter((access(k, None, 0, chunk_bytes, 0, 1) for k in keys), dtype=np.bool_, count=len(keys))
    s = pool.stats
    return CacheResult(hits, s["admitted"], s["dropped"] + s["demoted"])


def next_use(keys: list[int]) -> list[int]:
    """For each position, the index of the next access to the same key (or a huge sentinel)."""
    nxt = [_NEVER] * len(keys)
    last: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        k = keys[i]
        nxt[i] = last.get(k, _NEVER)
        last[k] = i
    return nxt


def _belady(keys: list[int], cap: int, writes: list[bool] | None = None) -> CacheResult:
    hits = np.zeros(len(keys), dtype=np.bool_)
    nxt = next_use(keys)
    resident: dict[int, int] = {}  # key -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, key), lazy
    adm = ev = 0
    for i, k in enumerate(keys):
        nu = nxt[i]
        if k in resident:
            hits[i] = writes is None or not writes[i]
            resident[k] = nu
            heapq.heappush(heap, (-nu, k))
            continue
        if nu == _NEVER:
            continue  # never used again: bypass
        if len(resident) >= cap:
            while True:
                far, k0 = heap[0]
                if resident.get(k0) == -far:
                    break
                heapq.heappop(heap)
            if -far <= nu:
                continue  # the newcomer is the one used furthest away: bypass
            heapq.heappop(heap)
            del resident[k0]
            ev += 1
        resident[k] = nu
        heapq.heappush(heap, (-nu, k))
        adm += 1
    return CacheResult(hits, adm, ev)


def _value(
    keys: list[int],
    parents: list[int],
    positions: list[int],
    cap: int,
    chunk_bytes: int,
    slot_bytes: int,
    cost: PrefillCost,
    progress: Callable[[float], None] | None = None,
    writes: list[bool] | None = None,
) -> CacheResult:
    slots = -(-chunk_bytes // slot_bytes)
    engine = PolicyEngine(PolicyConfig(capacity_bytes=cap * slots * slot_bytes, slot_bytes=slot_bytes, cost=cost))
    hits = np.zeros(len(keys), dtype=np.bool_)
    access = engine.access
    for i, k in enumerate(keys):
        p = parents[i]
        if access(k, p if p >= 0 else None, positions[i], chunk_bytes) and (writes is None or not writes[i]):
            hits[i] = True
        if i & 16383 == 16383:
            engine.drain()  # the simulator only counts the changes (in stats)
            if progress is not None:
                progress(i / len(keys))
    engine.drain()
    s = engine.stats
    return CacheResult(hits, s["admitted"], s["demoted"] + s["dropped"], s["demoted"])


def replay(
    policy: str,
    keys: list[int],
    parents: list[int],
    positions: list[int],
    capacity_chunks: int,
    chunk_bytes: int,
    slot_bytes: int,
    cost: PrefillCost,
    progress: Callable[[float], None] | None = None,
    writes: list[bool] | None = None,
) -> CacheResult:
    """Replay one switch's fetch sequence through ``policy`` with a pool of ``capacity_chunks``.

    ``progress`` gets the fraction done now and then (only the slow ``value`` replay reports).
    ``writes`` marks entries that are chunks passing the switch on their way to the holders
    (fill on write): ``lru``, ``value`` and ``belady`` may admit them then, never count them as
    hits; the other baselines do not admit on write (they see only the fetches).
    """
    if policy in NO_SWITCH or capacity_chunks <= 0:
        return CacheResult(np.zeros(len(keys), dtype=np.bool_), 0, 0)
    if writes is not None and policy not in WRITE_AWARE:
        fetch = [i for i, w in enumerate(writes) if not w]
        sub = replay(policy, [keys[i] for i in fetch], [parents[i] for i in fetch], [positions[i] for i in fetch],
                     capacity_chunks, chunk_bytes, slot_bytes, cost, progress)
        hits = np.zeros(len(keys), dtype=np.bool_)
        hits[fetch] = sub.hits
        return CacheResult(hits, sub.admissions, sub.evictions, sub.demotions)
    if policy == "lru":
        return _lru(keys, capacity_chunks, writes)
    if policy == "belady":
        return _belady(keys, capacity_chunks, writes)
    if policy == "value":
        return _value(keys, parents, positions, capacity_chunks, chunk_bytes, slot_bytes, cost, progress, writes)
    if policy == "lfu":
        return _lfu(keys, capacity_chunks)
    if policy == "gdsf":
        return _gdsf(keys, positions, capacity_chunks, cost)
    if policy == "s3fifo":
        return _s3fifo(keys, capacity_chunks, chunk_bytes, slot_bytes)
    raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES + NO_SWITCH)})")
