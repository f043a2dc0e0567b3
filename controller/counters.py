"""Data-plane counters of one switch, read over P4Runtime and labelled with the contract's enums.

The index enums live in :mod:`kvpool.contract` (the P4 program's contract);
``tests/kvpool/test_contract.py`` checks them against ``p4/include/constants.p4`` and the blocks
p4/README.md documents, so a renumbered P4 constant cannot silently relabel the
operator's view.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from kvpool import contract as n
from kvpool.contract import CoalesceStat, DropReason, EgressStat, PoolStat, PopularityStat
from kvpool.p4rt.codec import CounterValue

#: Labelled counter -> (section name in the stats document, its enum).
LABELLED: dict[str, tuple[str, type[enum.IntEnum]]] = {
    n.DROP_REASON: ("drops", DropReason),
    n.POOL_STATS: ("pool", PoolStat),
    n.COALESCE_STATS: ("coalesce", CoalesceStat),
    n.POPULARITY_STATS: ("popularity", PopularityStat),
    n.EGRESS_STATS: ("egress", EgressStat),
}


class CounterReader(Protocol):
    """What is needed of a switch driver: ``P4RuntimeSwitch.read_counter``."""

    def read_counter(self, name: str, index: int | None = None) -> dict[int, CounterValue]:
        """Cells of an indexed counter, index -> value."""


def read_stats(sw: CounterReader) -> dict[str, Any]:
    """Every labelled counter (packets, by enum name) plus slot hit/fill totals, of one switch."""
    out: dict[str, Any] = {}
    for counter, (section, labels) in LABELLED.items():
        cells = sw.read_counter(counter)
        # NONE is documented as never counted: leave it out rather than show a permanent 0.
        out[section] = {m.name.lower(): cells[m.value].packets if m.value in cells else 0
                        for m in labels if not (labels is DropReason and m is DropReason.NONE)}
    hits = sw.read_counter(n.SLOT_HITS)
    fills = sw.read_counter(n.SLOT_FILLS)
    out["slots"] = {"hits": sum(v.packets for v in hits.values()), "fills": sum(v.packets for v in fills.values()),
                    "slots_hit": sum(1 for v in hits.values() if v.packets)}
    replicas = sw.read_counter(n.WAITER_REPLICAS)
    out["waiter_replicas"] = {str(i): v.packets for i, v in sorted(replicas.items()) if v.packets}
    return out
