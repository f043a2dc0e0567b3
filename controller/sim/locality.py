"""Phase 1: route requests to nodes and play each node's local tiers (GPU HBM, host DRAM).

Independent of the switch policy: what a node holds locally depends only on what it ran, and
the holders' pool keeps every chunk any node computed. So one pass yields the exact
sequence of chunk fetches (prefix blocks a request needs that its node does not hold but
the cluster does) that every switch policy, and Belady, is then replayed on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sim.config import ClusterConfig
from kvpool.trace import Trace

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def holder_of(key: int, holders: int) -> int:
    """The holder that owns ``key`` in the pool (a fixed hash placement, as a DHT would)."""
    return (((key * _MIX) & _MASK) >> 32) % holders


@dataclass
class FetchPlan:
    """Everything the later phases need, as flat arrays (fetches in CSR layout by request)."""

    node: I64
    switch: I64
    arrival_ms: F64
    input_tokens: I64
    hbm_blocks: I64  # local hits in GPU memory
    dram_blocks: I64  # local hits in host memory
    dram_tokens: I64  # tokens loaded from host memory (PCIe time)
    local_tokens: I64  # tokens covered by local tiers within the usable prefix
    local_prefix_tokens: I64  # tokens of the longest locally held prefix (the no-sharing case)
    recompute_tokens: I64  # tokens prefilled even with sharing (past the usable prefix)
    new_chunks: I64  # chunks this request computed and registered in the directory
    fetch_off: I64
    fetch_key: I64
    fetch_parent: I64  # -1: no parent (first block)
    fetch_pos: I64
    fetch_tokens: I64
    fetch_holder: I64
    fetch_producer: I64  # request that computed the chunk (its completion gates availability)
    block_refs: int

    @property
    def n_requests(self) -> int:
        """Requests in the plan."""
        return int(self.node.shape[0])

    @property
    def n_fetches(self) -> int:
        """Chunk fetches over all requests."""
        return int(self.fetch_key.shape[0])

    def switch_fetches(self, switch: int) -> I64:
        """Indices of the fetches issued behind ``switch``, in order."""
        per_fetch = np.repeat(self.switch, np.diff(self.fetch_off))
        return np.flatnonzero(per_fetch == switch).astype(np.int64)


class _NodeTiers:
    """One node's HBM and DRAM as LRU lists; HBM evictions are demoted to DRAM."""

    __slots__ = ("dram", "dram_cap", "hbm", "hbm_cap")

    def __init__(self, hbm_cap: int, dram_cap: int) -> None:
        self.hbm: OrderedDict[int, None] = OrderedDict()
        self.dram: OrderedDict[int, None] = OrderedDict()
        self.hbm_cap = hbm_cap
        self.dram_cap = dram_cap

    def put(self, key: int) -> None:
        """Hold ``key`` in HBM (most recent), demoting the LRU chunk to DRAM when full."""
        hbm = self.hbm
        if key in hbm:
            hbm.move_to_end(key)
            return
        self.dram.pop(key, None)
        hbm[key] = None
        if len(hbm) > self.hbm_cap:
            old, _ = hbm.popitem(last=False)
            if self.dram_cap:
                self.dram[old] = None
                if len(self.dram) > self.dram_cap:
                    self.dram.popitem(last=False)


def plan(
    trace: Trace,
    cfg: ClusterConfig,
    progress: Callable[[int], None] | None = None,
) -> FetchPlan:
    """Route every request and play the local tiers; returns the policy-independent fetch plan."""
    cfg.validate()
    n = len(trace)
    rng = np.random.default_rng(cfg.seed)
    nodes_arr = (
        rng.integers(0, cfg.nodes, size=n) if cfg.routing == "random" else np.arange(n, dtype=np.int64) % cfg.nodes
    ).astype(np.int64)
    switch_arr = (nodes_arr * cfg.switches) // cfg.nodes
    tiers = [_NodeTiers(cfg.blocks_in(cfg.hbm_gib), cfg.blocks_in(cfg.dram_gib)) for _ in range(cfg.nodes)]
    bt = cfg.block_tokens
    pool_cap = cfg.blocks_in(cfg.pool_gib) if cfg.pool_gib else 0
    produced: dict[int, int] = {}  # chunk -> request that computed it (the holder pool's directory)
    pool_lru: OrderedDict[int, None] = OrderedDict()
    blocks = trace.blocks.tolist()
    offsets = trace.offsets.tolist()
    inputs = trace.input_lengths.tolist()
    nodes = nodes_arr.tolist()

    hbm_b = np.zeros(n, np.int64)
    dram_b = np.zeros(n, np.int64)
    dram_t = np.zeros(n, np.int64)
    local_t = np.zeros(n, np.int64)
    lprefix_t = np.zeros(n, np.int64)
    recompute_t = np.zeros(n, np.int64)
    new_c = np.zeros(n, np.int64)
    f_off = [0]
    f_key: list[int] = []
    f_par: list[int] = []
    f_pos: list[int] = []
    f_tok: list[int] = []
    f_prod: list[int] = []
    n_holders = cfg.holders
    for i in range(n):
        if progress is not None and i % 4096 == 0:
            progress(i)
        ids = blocks[offsets[i] : offsets[i + 1]]
        node = tiers[nodes[i]]
        hbm, dram = node.hbm, node.dram
        inp = inputs[i]
        hb = db = dt = lt = 0
        lprefix = 0
        still_local_prefix = True
        usable_end = len(ids)
        for j, h in enumerate(ids):
            tok = min(bt, inp - j * bt)
            if tok <= 0:
                usable_end = j
                break
            if h in hbm:
                hb += 1
                lt += tok
            elif h in dram:
                db += 1
                dt += tok
                lt += tok
            else:
                still_local_prefix = False
                p = produced.get(h)
                if p is None:
                    usable_end = j
                    break
                f_key.append(h)
                f_par.append(ids[j - 1] if j else -1)
                f_pos.append(j)
                f_tok.append(tok)
                f_prod.append(p)
                if pool_cap:
                    pool_lru.move_to_end(h)
                continue
            if still_local_prefix:
                lprefix += tok
        # Compute what was missing, register it, and hold the whole prompt locally.
        nc = 0
        for j in range(usable_end, len(ids)):
            h = ids[j]
            if h not in produced:
                produced[h] = i
                nc += 1
                if pool_cap:
                    pool_lru[h] = None
                    if len(pool_lru) > pool_cap:
                        old, _ = pool_lru.popitem(last=False)
                        del produced[old]
        for h in ids:
            node.put(h)
        usable_tokens = min(inp, usable_end * bt)
        hbm_b[i], dram_b[i], dram_t[i], local_t[i] = hb, db, dt, lt
        lprefix_t[i] = lprefix
        recompute_t[i] = inp - usable_tokens
        new_c[i] = nc
        f_off.append(len(f_key))
    if progress is not None:
        progress(n)
    keys = np.asarray(f_key, dtype=np.int64)
    holders = np.fromiter((holder_of(k, n_holders) for k in f_key), dtype=np.int64, count=len(f_key))
    return FetchPlan(
        node=nodes_arr,
        switch=switch_arr.astype(np.int64),
        arrival_ms=trace.timestamps.astype(np.float64),
        input_tokens=trace.input_lengths.astype(np.int64),
        hbm_blocks=hbm_b,
        dram_blocks=dram_b,
        dram_tokens=dram_t,
        local_tokens=local_t,
        local_prefix_tokens=lprefix_t,
        recompute_tokens=recompute_t,
        new_chunks=new_c,
        fetch_off=np.asarray(f_off, dtype=np.int64),
        fetch_key=keys,
        fetch_parent=np.asarray(f_par, dtype=np.int64),
        fetch_pos=np.asarray(f_pos, dtype=np.int64),
        fetch_tokens=np.asarray(f_tok, dtype=np.int64),
        fetch_holder=holders,
        fetch_producer=np.asarray(f_prod, dtype=np.int64),
        block_refs=trace.n_blocks,
    )
