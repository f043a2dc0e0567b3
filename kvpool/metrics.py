"""Prometheus metrics for kvpool's daemons: families built from a stats snapshot at scrape time, ``/metrics``.

One home per fact: a daemon's counters live where they are counted and ``/v1/stats`` reads
them; a ``SnapshotCollector`` turns that same snapshot into Prometheus families when
Prometheus scrapes, so ``/metrics`` and ``/v1/stats`` agree by construction and no hot path
counts anything twice. Each daemon has its own ``CollectorRegistry`` (never the global
default): tests run several agents in one process. A latency the snapshot keeps as bucket
counts (``LatencyHistogram``, or the holder's answer-wait buckets) becomes a Prometheus
histogram, so ``histogram_quantile`` works over it.

Names follow Prometheus conventions: the ``kvpool_`` prefix, base units in the name
(``_bytes``, ``_seconds``), ``_total`` on counters (prometheus_client writes it), labels for
what varies (``tier``, ``path``, ``reason``, ``switch``). The names, per daemon:
docs/reference/metrics.md.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_EDGES_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                          30.0, 60.0)
"""Upper edges (seconds) of ``LatencyHistogram``'s buckets: a loopback chunk to a minute-long prefix."""


class LatencyHistogram:
    """Durations counted in fixed buckets (thread-safe); its ``snapshot`` goes into a daemon's stats."""

    def __init__(self, edges: Sequence[float] = LATENCY_EDGES_S) -> None:
        self.edges = tuple(edges)
        self._counts = [0] * (len(self.edges) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        """Count one duration (bucket i holds ``(edges[i-1], edges[i]]``; the last, everything longer)."""
        with self._lock:
            self._counts[bisect.bisect_left(self.edges, seconds)] += 1
            self._sum += seconds

    def snapshot(self) -> dict[str, Any]:
        """``{"count", "sum_s", "edges_s", "buckets"}``: per-bucket counts, not cumulative (one more than edges)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        return {"count": sum(counts), "sum_s": round(total, 6), "edges_s": list(self.edges), "buckets": counts}


def cumulative(edges: Sequence[float], counts: Sequence[int], every: int = 1) -> list[tuple[str, float]]:
    """Prometheus buckets (``le``, cumulative count) from per-bucket ``counts`` over ``edges``, ``+Inf`` last.

    ``every`` keeps one edge in so many (a fine histogram, such as the holder's 81 edges, is
    exposed coarser: a cumulative count at a kept edge is exact, whichever edges are dropped).
    """
    out: list[tuple[str, float]] = []
    running = 0
    for i, edge in enumerate(edges):
        running += counts[i]
        if i % every == every - 1 or i == len(edges) - 1:
            out.append((f"{edge:.6g}", float(running)))
    out.append(("+Inf", float(sum(counts))))
    return out


class Families:
    """Metric families by name, filled sample by sample while a collector reads its snapshot."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def _family(self, kind: type[Metric], name: str, doc: str, labels: dict[str, str]) -> Metric:
        family = self._by_name.get(name)
        if family is None:
            family = kind(name, doc, labels=list(labels))  # type: ignore[call-arg]
            self._by_name[name] = family
        return family

    def declare(self, name: str, doc: str, *labels: str) -> None:
        """A counter family that may have no sample yet (its reasons appear as they happen): still listed."""
        self._family(CounterMetricFamily, name, doc, dict.fromkeys(labels, ""))

    def counter(self, name: str, doc: str, value: float, **labels: str) -> None:
        """A counter sample (``name`` without ``_total``: prometheus_client appends it)."""
        fam = self._family(CounterMetricFamily, name, doc, labels)
        fam.add_metric(list(labels.values()), float(value))  # type: ignore[attr-defined]

    def gauge(self, name: str, doc: str, value: float, **labels: str) -> None:
        """A gauge sample."""
        fam = self._family(GaugeMetricFamily, name, doc, labels)
        fam.add_metric(list(labels.values()), float(value))  # type: ignore[attr-defined]

    def histogram(self, name: str, doc: str, buckets: list[tuple[str, float]], sum_value: float,
                  **labels: str) -> None:
        """A histogram sample from cumulative ``buckets`` (``cumulative``) and the sum of what was counted."""
        fam = self._family(HistogramMetricFamily, name, doc, labels)
        fam.add_metric(list(labels.values()), buckets, float(sum_value))  # type: ignore[attr-defined]

    def latency(self, name: str, doc: str, snap: dict[str, Any], **labels: str) -> None:
        """A histogram from a ``LatencyHistogram.snapshot``."""
        self.histogram(name, doc, cumulative(snap["edges_s"], snap["buckets"]), snap["sum_s"], **labels)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._by_name.values())


class SnapshotCollector(Collector):
    """A collector that reads a snapshot at scrape time and writes it as families (``fill``)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]],
                 fill: Callable[[Families, dict[str, Any]], None]) -> None:
        self._snapshot = snapshot
        self._fill = fill

    def collect(self) -> Iterable[Metric]:
        """The families of one fresh snapshot."""
        out = Families()
        self._fill(out, self._snapshot())
        return list(out)

    def describe(self) -> Iterable[Metric]:
        """Nothing: registering must not take a snapshot (the daemon may not be started yet)."""
        return []


def registry(*collectors: Collector) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding ``collectors``."""
    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    return reg


def exposition(reg: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """The scrape body and its content type, by the ``Accept`` header (Prometheus text 0.0.4 by default)."""
    encoder, content_type = choose_encoder(accept)
    return encoder(reg), content_type
