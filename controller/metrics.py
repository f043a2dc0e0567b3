"""The controller's Prometheus metrics: what its API reads, written as families (``kvpool.metrics``).

Nothing here counts. At scrape time ``ControllerAPI.metrics_snapshot`` gathers the switches'
data-plane counters exactly as ``/v1/stats`` reads them (over P4Runtime, now), each switch
driver's health (reconnects, refused writes), the epoch loop's counters and the policy's
(``Controller.snapshot``), and ``fill`` writes them out. Data-plane counters are
``kvpool_switch_*`` with a ``switch`` label (the name in the topology); the controller's own
are ``kvpool_controller_*``. A switch that could not be read has ``kvpool_switch_up 0`` and no
counters that scrape (Prometheus then sees a gap, not a reset). Names: docs/reference/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kvpool import wire
from kvpool.metrics import Families, SnapshotCollector

#: Section of a switch's stats (``controller.counters.read_stats``) -> family and its label.
SECTIONS: Final = {
    "drops": ("kvpool_switch_drops", "reason", "Packets the switch dropped, by reason"),
    "pool": ("kvpool_switch_pool_events", "event", "Switch pool events (hit: a GET answered from switch memory)"),
    "coalesce": ("kvpool_switch_coalesce_events", "event",
                 "Coalescing events (absorbed: a GET joined to an answer in progress)"),
    "popularity": ("kvpool_switch_popularity_events", "event", "Popularity sketch events"),
    "egress": ("kvpool_switch_egress_events", "event", "Egress events (replica_sent: an answer copied to a waiter)"),
}

#: Policy counter (``PolicyEngine.stats``) -> family and labels.
POLICY: Final = {
    "admitted": ("kvpool_controller_policy_admissions", {}),
    "demoted": ("kvpool_controller_policy_evictions", {"action": "demote"}),
    "dropped": ("kvpool_controller_policy_evictions", {"action": "drop"}),
    "rejected_probation": ("kvpool_controller_policy_rejections", {"reason": "probation"}),
    "rejected_value": ("kvpool_controller_policy_rejections", {"reason": "value"}),
    "too_big": ("kvpool_controller_policy_rejections", {"reason": "too_big"}),
    "leader_switches": ("kvpool_controller_policy_leader_handovers", {}),
}
_POLICY_DOC: Final = {
    "kvpool_controller_policy_admissions": "Chunks the policy admitted into the switch pool",
    "kvpool_controller_policy_evictions": "Chunks the policy evicted, by action (demote: to a lower tier)",
    "kvpool_controller_policy_rejections": "Admission candidates the policy refused, by reason",
    "kvpool_controller_policy_leader_handovers": "Times another policy expert took the lead",
}


def collector(snapshot: Callable[[], dict[str, Any]]) -> SnapshotCollector:
    """A collector over ``ControllerAPI.metrics_snapshot``."""
    return SnapshotCollector(snapshot, fill)


def fill(f: Families, doc: dict[str, Any]) -> None:
    """Every family of one controller snapshot (see the module docstring for its parts)."""
    for name, stats in sorted(doc["switches"].items()):
        _switch(f, name, stats)
    pool = doc["pool"]
    for name, health in sorted(doc["health"].items()):
        f.gauge("kvpool_switch_pool_slots", "Slots of the switch pool", pool["slots"], switch=name)
        f.gauge("kvpool_switch_pool_used_slots", "Slots holding admitted chunks", pool["used"], switch=name)
        f.gauge("kvpool_switch_pool_used_bytes", "Bytes of the switch pool holding admitted chunks",
                pool["used"] * wire.FRAG_PAYLOAD, switch=name)
        f.gauge("kvpool_switch_pool_chunks", "Chunks admitted into the switch pool", pool["chunks"], switch=name)
        f.gauge("kvpool_controller_switch_connected", "1 while the P4Runtime connection is up",
                int(health["connected"]), switch=name)
        f.gauge("kvpool_controller_switch_master", "1 while this controller is primary", int(health["master"]),
                switch=name)
        f.counter("kvpool_controller_switch_reconnects", "P4Runtime reconnects (each followed by a resync)",
                  health["reconnects"], switch=name)
        f.counter("kvpool_controller_p4runtime_write_errors", "Updates the switch refused or never got",
                  health.get("write_errors", 0), switch=name)
    c = doc["controller"]
    f.counter("kvpool_controller_epochs", "Policy epochs run", c["epoch"])
    f.counter("kvpool_controller_failed_epochs", "Policy epochs that failed (the loop ran on)", c["failed_epochs"])
    f.gauge("kvpool_controller_catalog_chunks", "Chunks in the catalog", c["catalog"])
    for key, (name, labels) in POLICY.items():
        f.counter(name, _POLICY_DOC[name], doc["policy"].get(key, 0), **labels)
    for state, n in sorted(doc["nodes"].items()):
        f.gauge("kvpool_controller_nodes", "Agents registered with the directory, by state", n, state=state)
    api = doc["api"]
    f.counter("kvpool_api_requests", "API requests answered (refusals included)", api["requests"])
    f.declare("kvpool_api_errors", "API requests refused, by error code", "code")
    for code, n in sorted(api["errors"].items()):
        f.counter("kvpool_api_errors", "API requests refused, by error code", n, code=code)


def _switch(f: Families, name: str, stats: dict[str, Any]) -> None:
    f.gauge("kvpool_switch_up", "1 when the switch's counters were read this scrape", int("error" not in stats),
            switch=name)
    if "error" in stats:
        return
    for section, (family, label, doc) in SECTIONS.items():
        for key, n in stats[section].items():
            f.counter(family, doc, n, switch=name, **{label: key})
    slots = stats["slots"]
    f.counter("kvpool_switch_slot_hits", "GETs answered from switch slots (per-slot counters summed)",
              slots["hits"], switch=name)
    f.counter("kvpool_switch_slot_fills", "Slot fills from passing DATA", slots["fills"], switch=name)
    f.gauge("kvpool_switch_slots_hit", "Slots hit at least once", slots["slots_hit"], switch=name)
