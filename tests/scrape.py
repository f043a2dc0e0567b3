"""Scrape a daemon's ``/metrics`` and read it with prometheus_client's own parser (the metrics tests)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[str, Samples]:
    """The content type and every sample of ``url``/metrics, by (sample name, labels)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        content_type = reply.headers["Content-Type"]
        text = reply.read().decode()
    return content_type, parse(text)


def parse(text: str) -> Samples:
    """Samples of an exposition text by (sample name, labels)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (KeyError naming it when absent)."""
    key = (name, frozenset(labels.items()))
    if key not in samples:
        raise KeyError(f"no sample {name}{labels} among {sorted({n for n, _ in samples})}")
    return samples[key]


def names(samples: Samples) -> set[str]:
    """The sample names present (``_total``, ``_bucket``, ``_sum``, ``_count`` included)."""
    return {n for n, _ in samples}
