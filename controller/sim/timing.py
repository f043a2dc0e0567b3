"""Phase 3: turn hits and misses into time: link queues, coalescing, incast, prefill, TTFT.

Each holder link and each node's GPU is a FIFO server. A chunk fetch served by the switch
costs one switch round trip plus its bytes on the node's link (and waits for the chunk's fill
if the holder transfer that brings it into the switch is still under way: the data plane holds
such a GET as a coalesced waiter); one served by a holder queues on that holder's link (N
nodes pulling from one holder is the N-to-1 incast), unless the switch already has a transfer
of the same chunk outstanding, in which case the request joins it (coalescing; the response is
multicast) and no holder bytes move. What is neither local nor fetched is prefilled.

A chunk enters the directory when the request that computed it is done. A request that
arrives before then does not find it: its reusable prefix ends at that block and it prefills
from there (under heavy load the producer may still sit in a GPU queue). Phase 1 could not know
this (it has no clock), so such fetches are planned, and replayed by the switch policies, but
never made.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sim.config import ClusterConfig
from controller.sim.locality import FetchPlan


@dataclass
class Timing:
    """Per-request TTFT and the link-level totals of one run."""

    ttft_ms: npt.NDArray[np.float64]
    compute_tokens: npt.NDArray[np.int64]
    compute_s: float
    holder_bytes: int
    fetch_bytes: int
    switch_bytes: int
    coalesced: int
    peak_incast: int
    transfer_s: float
    #: fetches planned but not made: their chunk was not stored yet when the request arrived
    skipped: npt.NDArray[np.bool_] | None = None


def replay_time(plan: FetchPlan, cfg: ClusterConfig, hits: npt.NDArray[np.bool_] | None, sharing: bool) -> Timing:
    """Time every request; ``hits`` marks fetches the switch served (None: no switch)."""
    n = plan.n_requests
    cost = cfg.model.cost(cfg.block_tokens)
    flops_per_s = cfg.model.flops_per_s
    kvb = cfg.model.kv_bytes_per_token
    node_bps = cfg.node_gbps * 1e9 / 8
    holder_bps = cfg.holder_gbps * 1e9 / 8
    pcie_bps = cfg.pcie_gbps * 1e9 / 8
    sw_rtt = cfg.switch_rtt_us / 1e3
    h_rtt = cfg.holder_rtt_us / 1e3
    coalesce = sharing and hits is not None and cfg.coalesce
    n_sw = cfg.switches

    arrival = plan.arrival_ms.tolist()
    nodes = plan.node.tolist()
    switch = plan.switch.tolist()
    inputs = plan.input_tokens.tolist()
    usable = plan.input_tokens - (plan.recompute_tokens if sharing else plan.input_tokens - plan.local_prefix_tokens)
    usable_l = usable.tolist()
    dram_t = plan.dram_tokens.tolist()
    off = plan.fetch_off.tolist()
    f_key = plan.fetch_key.tolist()
    f_tok = plan.fetch_tokens.tolist()
    f_hold = plan.fetch_holder.tolist()
    f_prod = plan.fetch_producer.tolist()
    f_hit = hits.tolist() if hits is not None else None

    gpu_free = [0.0] * cfg.nodes
    holder_free = [0.0] * cfg.holders
    flows: list[list[float]] = [[] for _ in range(cfg.holders)]  # end times of live flows per holder
    inflight: dict[int, float] = {}
    # The switch's pending table and waiter ids (ClusterConfig.pending_slots, max_waiters; 0: no limit).
    slots, max_waiters = cfg.pending_slots, cfg.max_waiters
    slot_holder: dict[tuple[int, int], int] = {}  # (switch, slot) -> tag of the fetch that opened it
    waiter_ids: list[dict[int, int]] = [{} for _ in range(n_sw)]  # per switch: node -> waiter id
    filled: dict[int, float] = {}  # (chunk, switch) tag -> when the holder transfer that fills it ends
    f_pos = plan.fetch_pos.tolist()
    bt = cfg.block_tokens
    finish = [0.0] * n
    compute_tok = np.empty(n, dtype=np.int64)
    skipped = np.zeros(plan.n_fetches, dtype=np.bool_)
    ttft = np.empty(n, dtype=np.float64)
    holder_bytes = fetch_bytes = switch_bytes = coalesced = peak = 0
    compute_s = transfer_s = 0.0
    for i in range(n):
        t = arrival[i]
        ready_at = t
        usable_i = usable_l[i]
        if sharing and off[i + 1] > off[i]:
            node_bytes = 0
            flow_end: dict[int, tuple[float, float]] = {}
            for f in range(off[i], off[i + 1]):
                if finish[f_prod[f]] > t:
                    # not in the directory yet: the reusable prefix ends here
                    usable_i = min(usable_i, f_pos[f] * bt)
                    skipped[f : off[i + 1]] = True
                    break
                b = f_tok[f] * kvb
                node_bytes += b
                start = t
                tag = f_key[f] * n_sw + switch[i]
                if f_hit is not None and f_hit[f]:
                    end = start + sw_rtt
                    fill = filled.get(tag, 0.0)
                    if fill > end:  # admitted on a miss whose DATA is still on its way: wait for it
                        end = fill
                        coalesced += 1
                    switch_bytes += b
                else:
                    waits = coalesce and _has_waiter_id(waiter_ids[switch[i]], nodes[i], max_waiters)
                    if waits:
                        e = inflight.get(tag)
                        if e is not None and e > start:
                            coalesced += 1
                            ready_at = max(ready_at, e)
                            continue
                    h = f_hold[f]
                    begin = max(start, holder_free[h])
                    dur = b / holder_bps * 1e3
                    holder_free[h] = begin + dur
                    end = begin + dur + h_rtt
                    holder_bytes += b
                    if waits:
                        slot = (switch[i], _pending_slot(f_key[f], slots))
                        held = slot_holder.get(slot)
                        if not slots or held is None or held == tag or inflight.get(held, 0.0) <= start:
                            slot_holder[slot] = tag  # otherwise a collision: not coalesced
                            inflight[tag] = end
                    filled[tag] = end
                    # The flow is outstanding from when the request asks (not when the FIFO
                    # link gets to it) until its last byte: queued requests count as incast.
                    fb, fe = flow_end.get(h, (start, end))
                    flow_end[h] = (min(fb, start), max(fe, end))
                ready_at = max(ready_at, end)
            fetch_bytes += node_bytes
            wire = node_bytes / node_bps * 1e3
            transfer_s += wire / 1e3
            ready_at = max(ready_at, t + wire + sw_rtt)
            for h, (fb, fe) in flow_end.items():
                live = flows[h]
                while live and live[0] <= fb:
                    heapq.heappop(live)
                heapq.heappush(live, fe)
                peak = max(peak, len(live))
        ready_at += dram_t[i] * kvb / pcie_bps * 1e3
        inp = inputs[i]
        u = usable_i
        compute_tok[i] = inp - u
        flops = cost.prefix_flops(inp) - cost.prefix_flops(u)
        c_s = flops / flops_per_s
        compute_s += c_s
        begin = max(ready_at, gpu_free[nodes[i]])
        end = begin + c_s * 1e3
        gpu_free[nodes[i]] = end
        finish[i] = end
        ttft[i] = end - t
    return Timing(
        ttft_ms=ttft,
        compute_tokens=compute_tok,
        compute_s=compute_s,
        holder_bytes=holder_bytes,
        fetch_bytes=fetch_bytes,
        switch_bytes=switch_bytes,
        coalesced=coalesced,
        peak_incast=peak,
        transfer_s=transfer_s,
        skipped=skipped,
    )


def _has_waiter_id(ids: dict[int, int], node: int, limit: int) -> bool:
    """Whether ``node`` has a waiter id on its switch: ids go to nodes in the order they first fetch."""
    if not limit:
        return True
    if node not in ids and len(ids) < limit:
        ids[node] = len(ids)
    return node in ids


def _pending_slot(key: int, slots: int) -> int:
    """The pending slot of a chunk (a multiplicative hash of its key); 0 when the table is unlimited."""
    return ((key * 0x9E3779B1) & 0xFFFFFFFF) % slots if slots else 0
