"""Phase 1: route requests to nodes and play each node's local tiers (GPU HBM, host DRAM).

Independent of the switch policy: what a node holds locally depends only on what it ran, and
the holders' pool keeps every chunk any node computed. So one pass yields the exact
sequence of chunk fetches (prefix blocks a request needs that its node does not hold but
the cluster does) that every switch policy, and Belady, is then replayed on.
"""

from __future__ import annotations

from collections import OrderedDict, deque
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
    demoted_blocks: int = 0  # HBM -> DRAM demotions over all nodes
    write_off: I64 | None = None  # CSR by request: chunks each request computed (they pass the switch)
    write_key: I64 | None = None
    write_parent: I64 | None = None
    write_pos: I64 | None = None

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
    """One node's HBM and DRAM as LRU lists; HBM evictions are demoted to DRAM (all, reused ones, or none)."""

    __slots__ = ("demote", "demoted", "dram", "dram_cap", "hbm", "hbm_cap", "uses")

    def __init__(self, hbm_cap: int, dram_cap: int, demote: str = "all", track_uses: bool = False) -> None:
        self.hbm: OrderedDict[int, None] = OrderedDict()
        self.dram: OrderedDict[int, None] = OrderedDict()
        self.hbm_cap = hbm_cap
        self.dram_cap = dram_cap if demote != "none" else 0
        self.demote = demote
        #: uses of each chunk at this node (only kept when a mode needs it: it grows with the trace)
        self.uses: dict[int, int] | None = {} if track_uses or demote == "reused" else None
        self.demoted = 0

    def use(self, key: int) -> int:
        """Count one use of ``key`` by this node; returns the uses so far (0 when not tracked)."""
        uses = self.uses
        if uses is None:
            return 0
        n = uses.get(key, 0) + 1
        uses[key] = n
        return n

    def put(self, key: int) -> None:
        """Hold ``key`` in HBM (most recent), demoting (or dropping) the LRU chunk when full."""
        hbm = self.hbm
        if key in hbm:
            hbm.move_to_end(key)
            return
        self.dram.pop(key, None)
        hbm[key] = None
        if len(hbm) > self.hbm_cap:
            old, _ = hbm.popitem(last=False)
            if self.dram_cap and (self.demote == "all" or (self.uses is not None and self.uses.get(old, 0) >= 2)):
                self.dram[old] = None
                self.demoted += 1
                if len(self.dram) > self.dram_cap:
                    self.dram.popitem(last=False)


class _Affinity:
    """Route a request to the node that last used the deepest block of its prompt, unless that node is busy.

    Busy: it took more than ``(1 + slack)`` times its fair share of the prompt tokens routed in
    the last ``8 x nodes`` requests (tokens stand in for prefill work, which phase 1 cannot time).
    Mooncake's conductor routes by prefix match and load in the same spirit.
    """

    def __init__(self, nodes: int, slack: float) -> None:
        self.last_user: dict[int, int] = {}
        self.window: deque[tuple[int, int]] = deque()
        self.size = 8 * nodes
        self.nodes = nodes
        self.slack = slack
        self.recent = [0] * nodes
        self.total = 0

    def route(self, ids: list[int], tokens: int, fallback: int) -> int:
        """The node for a request of ``tokens`` tokens with block ids ``ids`` (``fallback``: its random node)."""
        node = fallback
        lu = self.last_user
        limit = (1.0 + self.slack) * self.total / self.nodes
        for h in reversed(ids):
            cand = lu.get(h)
            if cand is not None:
                if self.recent[cand] + tokens <= limit + tokens / self.nodes:
                    node = cand
                break
        self.window.append((node, tokens))
        self.recent[node] += tokens
        self.total += tokens
        if len(self.window) > self.size:
            old, t = self.window.popleft()
            self.recent[old] -= t
            self.total -= t
        for h in ids:
            lu[h] = node
        return node


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
        np.arange(n, dtype=np.int64) % cfg.nodes if cfg.routing == "round_robin" else rng.integers(0, cfg.nodes, size=n)
    ).astype(np.int64)
    affinity = _Affinity(cfg.nodes, cfg.affinity_slack) if cfg.routing == "affinity" else None
    promote2 = cfg.promote_after == 2
    tiers = [
        _NodeTiers(cfg.blocks_in(cfg.hbm_gib), cfg.blocks_in(cfg.dram_gib), cfg.demote, promote2)
        for _ in range(cfg.nodes)
    ]
    writes = cfg.fill_on_write
    w_off = [0]
    w_key: list[int] = []
    w_par: list[int] = []
    w_pos: list[int] = []
    bt = cfg.block_tokens
    pool_cap = cfg.blocks_in(cfg.pool_gib) if cfg.pool_gib else 0
    produced: dict[int, int] = {}  # chunk -> request that computed it (the holder pool's directory)
    pool_lru: OrderedDict[int, None] = OrderedDict()
    blocks = trace.blocks.tolist()
    offsets = trace.offsets.tolist()
    inputs = trace.input_lengths.tolist()
    nodes = nodes_arr.tolist()  # random draws; affinity routing overrides them request by request

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
        if affinity is not None:
            nodes[i] = affinity.route(ids, inputs[i], nodes[i])
        node = tiers[nodes[i]]
        hbm, dram = node.hbm, node.dram
        inp = inputs[i]
        hb = db = dt = lt = 0
        lprefix = 0
        still_local_prefix = True
        usable_end = len(ids)
        fetched_at: list[int] = []  # positions fetched (for promote_after=2)
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
                if promote2:
                    fetched_at.append(j)
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
                if writes:
                    w_key.append(h)
                    w_par.append(ids[j - 1] if j else -1)
                    w_pos.append(j)
                if pool_cap:
                    pool_lru[h] = None
                    if len(pool_lru) > pool_cap:
                        old, _ = pool_lru.popitem(last=False)
                        del produced[old]
        if promote2:
            fetched = set(fetched_at)
            for j, h in enumerate(ids):
                if node.use(h) < 2 and j in fetched:
                    continue  # first use here: streamed through HBM for this prefill, not kept
                node.put(h)
        else:
            track = node.uses is not None
            for h in ids:
                if track:
                    node.use(h)
                node.put(h)
        if writes:
            w_off.append(len(w_key))
        usable_tokens = min(inp, usable_end * bt)
        hbm_b[i], dram_b[i], dram_t[i], local_t[i] = hb, db, dt, lt
        lprefix_t[i] = lprefix
        recompute_t[i] = inp - usable_tokens
        new_c[i] = nc
        f_off.append(len(f_key))
    if progress is not None:
        progress(n)
    nodes_arr = np.asarray(nodes, dtype=np.int64)
    switch_arr = (nodes_arr * cfg.switches) // cfg.nodes
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
        demoted_blocks=sum(t.demoted for t in tiers),
        write_off=np.asarray(w_off, dtype=np.int64) if writes else None,
        write_key=np.asarray(w_key, dtype=np.int64) if writes else None,
        write_parent=np.asarray(w_par, dtype=np.int64) if writes else None,
        write_pos=np.asarray(w_pos, dtype=np.int64) if writes else None,
    )
