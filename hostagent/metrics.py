"""The agent's Prometheus metrics: its ``/v1/stats`` snapshot written as families (``kvpool.metrics``).

Nothing here counts: every value is read from ``Agent.stats()`` when Prometheus scrapes, so
``/metrics`` and ``/v1/stats`` agree by construction. Prefixes by role: ``kvpool_agent_`` (the
requester and the local tiers), ``kvpool_holder_`` (answering GETs), ``kvpool_transport_``
(the UDP socket both roles share), ``kvpool_api_`` (the local HTTP API). The names and what
each one reads: docs/reference/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from hostagent.timing import WAIT_EDGES_S
from kvpool import wire
from kvpool.metrics import Families, SnapshotCollector, cumulative

_WAIT_EVERY: Final = 4
"""The holder's answer-wait histogram has four buckets per doubling; Prometheus gets one per doubling."""


def collector(stats: Callable[[], dict[str, Any]]) -> SnapshotCollector:
    """A collector over an agent's ``stats`` (``hostagent.daemon.Agent.stats``)."""
    return SnapshotCollector(stats, fill)


def fill(f: Families, st: dict[str, Any]) -> None:
    """Every family of one agent snapshot."""
    _agent(f, st["agent"])
    _tiers(f, st["tiers"])
    tr = st["transport"]
    _requester(f, tr)
    _transport(f, tr)
    if "holder" in tr:
        _holder(f, tr)
    if "api" in st:
        f.counter("kvpool_api_requests", "API requests answered (refusals included)", st["api"]["requests"])
        f.declare("kvpool_api_errors", "API requests refused, by error code", "code")
        for code, n in sorted(st["api"]["errors"].items()):
            f.counter("kvpool_api_errors", "API requests refused, by error code", n, code=code)
    if "directory" in st:
        d = st["directory"]
        f.counter("kvpool_agent_directory_publishes", "Chunk publications sent to the controller's directory",
                  d["publishes"])
        f.counter("kvpool_agent_directory_withdrawals", "Chunk withdrawals sent to the directory", d["withdrawals"])


def _agent(f: Families, a: dict[str, Any]) -> None:
    doc = "Chunks of fetch calls by outcome: local (from this agent's tiers), exact (fetched, verified), error"
    for outcome, key in (("local", "fetch_local_hits"), ("exact", "fetch_remote"), ("error", "fetch_failed")):
        f.counter("kvpool_agent_fetched_chunks", doc, a[key], outcome=outcome)
    f.latency("kvpool_agent_fetch_duration_seconds", "Fetch calls that asked a holder, by duration",
              a["fetch_seconds"])
    f.counter("kvpool_agent_published_chunks", "Chunks published into this agent", a["published_chunks"])
    f.counter("kvpool_agent_stale_dropped_chunks", "Local chunks dropped for an older generation", a["stale_dropped"])
    f.gauge("kvpool_agent_uptime_seconds", "Seconds since the agent started", a["uptime_s"])


def _tiers(f: Families, t: dict[str, Any]) -> None:
    for tier in t["tiers"]:
        name = tier["name"]
        f.gauge("kvpool_agent_tier_used_bytes", "Bytes held in a local tier", tier["used_bytes"], tier=name)
        f.gauge("kvpool_agent_tier_capacity_bytes", "Capacity of a local tier", tier["capacity_bytes"], tier=name)
        f.gauge("kvpool_agent_tier_chunks", "Chunks held in a local tier", tier["chunks"], tier=name)
        f.counter("kvpool_agent_tier_hits", "Chunk reads answered by a local tier", tier["hits"], tier=name)
        f.counter("kvpool_agent_tier_demotions", "Chunks demoted out of a tier", tier["demoted_out"], tier=name)
    f.counter("kvpool_agent_tier_misses", "Chunk reads no local tier held", t["misses"])
    f.counter("kvpool_agent_tier_dropped_chunks", "Chunks dropped from the last tier", t["dropped"])
    f.counter("kvpool_agent_tier_dropped_bytes", "Bytes dropped from the last tier", t["dropped_bytes"])


def _requester(f: Families, tr: dict[str, Any]) -> None:
    for path, n in tr["goodput_bytes_by_path"].items():
        f.counter("kvpool_agent_received_bytes", "Verified chunk bytes received, by path: holder (its own answer), "
                  "coalesced (a switch's replica of another requester's answer), switch (a switch's pool)", n,
                  path=path)
    f.counter("kvpool_agent_transfers", "Chunk transfers ended, by outcome", tr["requests_completed"],
              outcome="completed")
    f.counter("kvpool_agent_transfers", "Chunk transfers ended, by outcome", tr["requests_failed"], outcome="failed")
    for path, n in tr["requests_by_path"].items():
        f.counter("kvpool_agent_transfers_started", "Chunk transfers started, by GET path", n, path=path)
    f.gauge("kvpool_agent_transfers_active", "Chunk transfers in flight", tr["requests_active"])
    f.gauge("kvpool_agent_transfers_waiting", "Chunk transfers waiting for a slot", tr["requests_waiting"])
    f.counter("kvpool_agent_gets_sent", "GET datagrams sent", tr["gets_sent"])
    f.counter("kvpool_agent_retransmit_gets", "GETs that re-asked for fragments", tr["retransmit_gets"])
    doc = ("Fragments re-asked, by reason: stall (silence), overtaken (later ones arrived), gap (the holder's "
           "answer passed over them), join (missed before a join)")
    for reason, key in (("stall", "stall_retransmits"), ("overtaken", "overtaken_retransmits"),
                        ("gap", "gap_retransmits"), ("join", "join_reasks")):
        f.counter("kvpool_agent_retransmitted_fragments", doc, tr[key], reason=reason)
    f.counter("kvpool_agent_busy_received", "BUSY NACKs received from holders", tr["busy_received"])
    f.counter("kvpool_agent_busy_retries", "Re-asks after a BUSY NACK", tr["busy_retries"])
    f.counter("kvpool_agent_nacks_received", "NACKs received (any status)", tr["nacks_received"])
    f.counter("kvpool_agent_duplicate_fragments", "Fragments received again (stored nothing)", tr["duplicates"])
    f.counter("kvpool_agent_joined_requests", "Transfers a switch joined to another's answer", tr["joined_requests"])
    f.counter("kvpool_agent_shared_transfers", "Chunks taken from another call's transfer", tr["shared_transfers"])
    ig = tr["integrity"]
    doc = "Integrity checks failed and retried, by unit: fragment (re-asked), chunk (fetched again)"
    f.counter("kvpool_agent_integrity_retries", doc, ig["fragments_check_failed"], unit="fragment")
    f.counter("kvpool_agent_integrity_retries", doc, ig["chunks_check_failed"], unit="chunk")
    f.counter("kvpool_agent_integrity_failures", "Transfers failed after every integrity retry",
              ig["integrity_failures"])
    f.counter("kvpool_agent_switch_fragments_check_failed", "Switch-served fragments that failed their check",
              ig["switch_fragments_check_failed"])
    f.counter("kvpool_agent_chunks_verified", "Chunks that passed the whole-chunk check", ig["chunks_verified"])


def _transport(f: Families, tr: dict[str, Any]) -> None:
    f.counter("kvpool_transport_datagrams", "Datagrams, by direction", tr["datagrams_received"], direction="received")
    f.counter("kvpool_transport_datagrams", "Datagrams, by direction", tr["datagrams_sent"], direction="sent")
    f.counter("kvpool_transport_sent_bytes", "Bytes sent on the UDP socket", tr["bytes_sent"])
    f.counter("kvpool_transport_send_errors", "Datagrams the socket refused to send", tr["send_errors"])
    f.declare("kvpool_transport_drops", "Datagrams (or records) dropped, by reason", "reason")
    for reason, n in sorted(tr["drops"].items()):  # a reason appears once it has dropped something
        f.counter("kvpool_transport_drops", "Datagrams (or records) dropped, by reason", n, reason=reason)


def _holder(f: Families, tr: dict[str, Any]) -> None:
    h = tr["holder"]
    f.counter("kvpool_holder_gets", "GETs answered", h["gets"])
    f.counter("kvpool_holder_served_fragments", "DATA fragments sent", h["fragments_served"])
    f.counter("kvpool_holder_served_bytes", "Payload bytes sent in DATA fragments", h["bytes_served"])
    nacks = {s.name.lower(): 0 for s in wire.Status if s is not wire.Status.OK}
    nacks.update({k.lower(): v for k, v in h["nacks"].items()})
    for status, n in sorted(nacks.items()):
        f.counter("kvpool_holder_nacks", "NACKs sent, by status (busy: the holder's queue was full)", n,
                  status=status)
    f.gauge("kvpool_holder_send_queue_answers", "Answers waiting in the send queue", tr["send_queue"])
    f.gauge("kvpool_holder_send_queue_fragments", "Fragments waiting in the send queue", tr["send_queue_fragments"])
    f.counter("kvpool_holder_pushed_fragments", "Fragments pushed unasked", tr["pushed_fragments"])
    f.counter("kvpool_holder_reasks_carried", "Joiners' missed fragments sent inside the answer they joined",
              tr["reasks_carried"])
    w = tr["answer_wait"]
    f.histogram("kvpool_holder_answer_wait_seconds", "How long an answer waited in the send queue (holds apart)",
                cumulative(WAIT_EDGES_S, w["buckets"], _WAIT_EVERY), w["queue_sum_s"])
    f.counter("kvpool_holder_held_answers", "Answers that waited out a hold", w["held"])
    f.counter("kvpool_holder_hold_seconds", "Seconds answers spent held", w["hold_sum_s"])
    if "gate" in tr:
        g = tr["gate"]
        doc = "GETs refused by the requester gate, by reason"
        f.counter("kvpool_holder_refused_gets", doc, g["refused_unverified"], reason="unverified")
        f.counter("kvpool_holder_refused_gets", doc, g["refused_budget"], reason="budget")
