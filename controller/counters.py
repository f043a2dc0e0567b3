"""Data-plane counters of one switch, read over P4Runtime and labelled with p4/README.md's enums.

The enums mirror the ``class ...(enum.IntEnum)`` blocks of p4/README.md (the data plane's
documented indices); ``tests/test_controller_api.py`` checks them against it, so a renumbered
P4 constant cannot silently relabel the operator's view.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from controller import p4names as n
from controller.p4runtime import CounterValue


class DropReason(enum.IntEnum):
    """Indices of ``MyIngress.drop_reason``."""

    NONE = 0
    PARSE_ERROR = 1
    BAD_CHECKSUM = 2
    TTL_EXPIRED = 3
    NO_ROUTE = 4
    UNHANDLED = 5
    BAD_VERSION = 6
    BAD_OPCODE = 7
    BAD_FLAGS = 8
    BAD_RANGE = 9
    BAD_LENGTH = 10
    BAD_STATUS = 11
    NOT_WRITER = 12
    FILL_MISMATCH = 13


class PoolStat(enum.IntEnum):
    """Indices of ``MyIngress.pool.pool_stats``."""

    LOOKUP_MISS = 0
    HIT = 1
    MISS_UNFILLED = 2
    BYPASS = 3
    FILL = 4
    FILL_STALE = 5
    FILL_SKIPPED = 6
    FILL_UNAUTH = 7
    INVALIDATE = 8
    INVALIDATE_STALE = 9
    SLOT_RANGE = 10
    NO_ROOM = 11


class CoalesceStat(enum.IntEnum):
    """Indices of ``MyIngress.coalesce.coalesce_stats``."""

    FIRST = 0
    ABSORBED = 1
    RETRANSMIT = 2
    COLLISION = 3
    NO_WAITER_ID = 4
    RELEASE = 5
    EXPIRED_REUSED = 6


class PopularityStat(enum.IntEnum):
    """Indices of ``MyIngress.popularity.popularity_stats``."""

    COUNTED = 0
    REPORTED = 1
    SUPPRESSED = 2


class EgressStat(enum.IntEnum):
    """Indices of ``MyEgress.coalesce.egress_stats``."""

    REPLICA_SENT = 0
    REPLICA_PRUNED = 1
    NO_WAITER_ENTRY = 2
    REPLY_RECORDED = 3


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
