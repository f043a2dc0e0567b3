"""Data-plane counters of one switch, read over P4Runtime and labelled with the contract's enums.

The index enums live in :mod:`kvpool.contract` (the P4 program's contract);
``tests/kvpool/test_contract.py`` checks them against ``p4/include/constants.p4`` and the blocks
p4/README.md documents, so a renumbered P4 constant cannot silently relabel the
operator's view.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from controller.p4runtime import P4RuntimeError
from kvpool import contract as n
from kvpool.contract import CoalesceStat, DropReason, EgressStat, PoolStat, PopularityStat
from kvpool.p4rt.codec import CounterValue

log = logging.getLogger("kvpool.controller")

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


class CellReader(Protocol):
    """What is needed of a switch driver: ``P4RuntimeSwitch.read_counter_cells``."""

    def read_counter_cells(self, name: str, indices: Iterable[int]) -> dict[int, CounterValue]:
        """The given cells of an indexed counter, index -> value."""


def summed_cells(switches: Iterable[tuple[str, CellReader]], counter: str, indices: list[int]) -> dict[int, int] | None:
    """Packets of the given cells of ``counter``, summed over ``switches``; None if one read failed.

    None rather than a partial sum: a sum that drops a switch reads as that switch's counts reset.
    """
    total: dict[int, int] = {}
    for name, sw in switches:
        try:
            cells = sw.read_counter_cells(counter, indices)
        except P4RuntimeError as exc:  # the next epoch reads again
            log.info("switch %s: %s not read this epoch (%s)", name, counter, str(exc).splitlines()[0])
            return None
        for idx, v in cells.items():
            total[idx] = total.get(idx, 0) + v.packets
    return total


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
