"""One shared prefix cache holding the last copy of every chunk, as Mooncake's KV pool does.

Unlike the switch pool (a copy above holders that keep everything), a hit here saves prefill,
and only a *prefix* hit counts: a request reuses blocks 0..j-1 when all of them are cached
and block j is not; what follows block j is recomputed even if cached (a block is useless
without its parent). Every block a request touches is then held (computed or reused), so
capacity and eviction decide what later requests find. This is the setting of the Mooncake
FAST'25 paper's cache-capacity figure: prefix hit rate against cache capacity in tokens.

Policies: ``lru`` (blocks touched deepest first, so a prefix's root is its most recent block
and leaves are evicted before their parents, as vLLM's prefix cache frees them), ``lfu``
(request counts, ties by recency) and ``value`` (the controller's engine as a last-copy tier:
a hit saves the block's prefill, which grows with its position; leaves before parents).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.policy.engine import PolicyConfig, PolicyEngine
from controller.policy.tiers import Tier
from controller.policy.value import PrefillCost
from kvpool.trace import BLOCK_TOKENS, Trace

PREFIX_POLICIES = ("lru", "lfu", "value")


@dataclass
class PrefixResult:
    """Reused prefix tokens per request (and the totals) for one policy and capacity."""

    policy: str
    capacity_blocks: int
    hit_tokens: npt.NDArray[np.int64]
    input_tokens: int

    @property
    def hit_rate(self) -> float:
        """Reused prefix tokens / all input tokens."""
        return float(self.hit_tokens.sum()) / max(self.input_tokens, 1)


def _usable(trace: Trace, i: int) -> tuple[list[int], int]:
    ids = trace.blocks[trace.offsets[i] : trace.offsets[i + 1]].tolist()
    return ids, int(trace.input_lengths[i])


def _reused_tokens(ids: list[int], inp: int, held: Callable[[int], bool]) -> int:
    """Tokens of the longest prefix of ``ids`` whose blocks are all ``held`` (what the request reuses)."""
    j = 0
    while j < len(ids) and held(ids[j]):
        j += 1
    return min(inp, j * BLOCK_TOKENS)


def infinite(trace: Trace) -> PrefixResult:
    """The theoretical maximum: a cache that never evicts (every block seen before is reused)."""
    seen: set[int] = set()
    out = np.zeros(len(trace), dtype=np.int64)
    for i in range(len(trace)):
        ids, inp = _usable(trace, i)
        out[i] = _reused_tokens(ids, inp, seen.__contains__)
        seen.update(ids)
    return PrefixResult("infinite", -1, out, int(trace.input_lengths.sum()))


def _lru(trace: Trace, cap: int) -> npt.NDArray[np.int64]:
    od: OrderedDict[int, None] = OrderedDict()
    out = np.zeros(len(trace), dtype=np.int64)
    for i in range(len(trace)):
        ids, inp = _usable(trace, i)
        out[i] = _reused_tokens(ids, inp, od.__contains__)
        for h in reversed(ids):  # deepest first: the root ends most recent, leaves go first
            od[h] = None
            od.move_to_end(h)
        while len(od) > cap:
            od.popitem(last=False)
    return out


def _lfu(trace: Trace, cap: int) -> npt.NDArray[np.int64]:
    count: dict[int, int] = {}
    stamp: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []
    out = np.zeros(len(trace), dtype=np.int64)
    tick = 0
    for i in range(len(trace)):
        ids, inp = _usable(trace, i)
        out[i] = _reused_tokens(ids, inp, count.__contains__)
        for h in reversed(ids):
            tick += 1
            c = count.get(h, 0) + 1
            count[h] = c
            stamp[h] = tick
            heapq.heappush(heap, (c, tick, h))
        while len(count) > cap:
            c0, s0, k0 = heapq.heappop(heap)
            if count.get(k0) == c0 and stamp[k0] == s0:
                del count[k0], stamp[k0]
    return out


def _value(trace: Trace, cap: int, cost: PrefillCost, chunk_bytes: int) -> npt.NDArray[np.int64]:
    slot = chunk_bytes  # one slot per chunk: the pool is paged in chunks
    engine = PolicyEngine(
        PolicyConfig(capacity_bytes=cap * slot, slot_bytes=slot, cost=cost, tier=Tier.POOL, hit_saving="compute")
    )
    out = np.zeros(len(trace), dtype=np.int64)
    access, holds = engine.access, engine.holds
    for i in range(len(trace)):
        ids, inp = _usable(trace, i)
        out[i] = _reused_tokens(ids, inp, holds)
        parent: int | None = None
        for pos, h in enumerate(ids):
            access(h, parent, pos, chunk_bytes)
            parent = h
        if i & 1023 == 1023:
            engine.drain()
    return out


def replay_prefix(trace: Trace, policy: str, capacity_blocks: int, cost: PrefillCost) -> PrefixResult:
    """Replay ``trace`` through a shared prefix cache of ``capacity_blocks`` 512-token blocks."""
    if capacity_blocks <= 0:
        raise ValueError(f"prefix cache capacity must be positive, got {capacity_blocks} blocks")
    if policy == "lru":
        hit = _lru(trace, capacity_blocks)
    elif policy == "lfu":
        hit = _lfu(trace, capacity_blocks)
    elif policy == "value":
        hit = _value(trace, capacity_blocks, cost, 1 << 20)
    else:
        raise ValueError(f"unknown prefix-cache policy {policy!r} (choose from {', '.join(PREFIX_POLICIES)})")
    return PrefixResult(policy, capacity_blocks, hit, int(trace.input_lengths.sum()))
