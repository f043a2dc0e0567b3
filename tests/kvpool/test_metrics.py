"""kvpool.metrics: latency buckets, cumulative Prometheus buckets, families from a snapshot, the exposition."""

from __future__ import annotations

from typing import Any

from kvpool.metrics import Families, LatencyHistogram, SnapshotCollector, cumulative, exposition, registry
from tests.scrape import parse, value


def test_latency_histogram_counts_into_the_right_buckets() -> None:
    h = LatencyHistogram((0.01, 0.1, 1.0))
    for s in (0.005, 0.01, 0.05, 2.0):
        h.observe(s)
    snap = h.snapshot()
    assert snap["buckets"] == [2, 1, 0, 1] and snap["count"] == 4 and snap["sum_s"] == 2.065
    assert cumulative(snap["edges_s"], snap["buckets"]) == [("0.01", 2.0), ("0.1", 3.0), ("1", 3.0), ("+Inf", 4.0)]


def test_coarser_buckets_keep_exact_cumulative_counts() -> None:
    edges = tuple(1e-4 * 2 ** (i / 4) for i in range(81))  # the holder's answer-wait edges
    counts = [1] * (len(edges) + 1)
    coarse = cumulative(edges, counts, every=4)
    assert len(coarse) == 21 + 1 and coarse[-1] == ("+Inf", float(len(counts)))
    assert coarse[0] == (f"{edges[3]:.6g}", 4.0)  # buckets 0..3 lie under the fourth edge
    assert coarse[-2] == (f"{edges[-1]:.6g}", float(len(edges)))


def test_a_snapshot_collector_reads_at_scrape_time_and_registries_are_separate() -> None:
    state = {"n": 1}

    def fill(f: Families, snap: dict[str, Any]) -> None:
        f.counter("kvpool_test_things", "Things", snap["n"], kind="a")
        f.gauge("kvpool_test_level_bytes", "Level", 7)
        f.latency("kvpool_test_duration_seconds", "Durations", LatencyHistogram((1.0,)).snapshot())

    reg = registry(SnapshotCollector(lambda: dict(state), fill))
    other = registry(SnapshotCollector(lambda: {"n": 40}, fill))
    body, content_type = exposition(reg)
    assert content_type.startswith("text/plain; version=0.0.4")
    assert value(parse(body.decode()), "kvpool_test_things_total", kind="a") == 1
    state["n"] = 5
    m = parse(exposition(reg)[0].decode())
    assert value(m, "kvpool_test_things_total", kind="a") == 5
    assert value(m, "kvpool_test_level_bytes") == 7 and value(m, "kvpool_test_duration_seconds_count") == 0
    assert value(parse(exposition(other)[0].decode()), "kvpool_test_things_total", kind="a") == 40
    om, om_type = exposition(reg, "application/openmetrics-text; version=1.0.0")
    assert om_type.startswith("application/openmetrics-text") and om.endswith(b"# EOF\n")

