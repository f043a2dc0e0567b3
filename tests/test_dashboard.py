"""The committed Grafana dashboard (deploy/grafana/kvpool.json) asks only for metrics the daemons export.

The names come from live registries: a real agent and a real controller (over the model
switch, tests/ctl_harness.py) scraped through ``/metrics``, so a renamed metric fails here,
not on an operator's empty panel. Every expression also parses as PromQL (promql-parser, the
dev extra), with Grafana's ``$__rate_interval`` replaced by a duration.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostagent.daemon import Agent, AgentConfig
from tests.ctl_harness import running
from tests.paths import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "kvpool.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _exported(text: str) -> set[str]:
    """Every series name an exposition offers a query, families without samples yet included."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in SUFFIXES[family.type])
    return names


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    import urllib.request

    agent = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))
    agent.start()
    try:
        with urllib.request.urlopen(agent.api_url + "/metrics", timeout=10) as reply:
            names = _exported(reply.read().decode())
    finally:
        agent.stop()
    with running(tmp_path_factory.mktemp("ctl")) as d, urllib.request.urlopen(d.url + "/metrics", timeout=10) as r:
        names |= _exported(r.read().decode())
    return names


def _targets(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def _promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "5m")


def test_dashboard_is_a_grafana_dashboard_over_a_prometheus_variable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "kvpool" and dash["schemaVersion"] >= 36
    [var] = dash["templating"]["list"]
    assert (var["type"], var["query"], var["name"]) == ("datasource", "prometheus", "datasource")
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in dash["panels"]}
    assert {"Pool hit ratio", "Bytes saved on the holder links", "Incast at the holders", "Fetch latency percentiles",
            "Drops"} <= titles
    for p in dash["panels"]:
        assert set(p["gridPos"]) == {"h", "w", "x", "y"}
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    assert any("histogram_quantile(0.99" in e for _, e in _targets(dash))


def test_every_metric_the_dashboard_asks_for_is_exported(exported: set[str]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    asked = {(title, name) for title, expr in _targets(dash) for name in re.findall(r"\bkvpool_[a-z0-9_]+", expr)}
    assert len({n for _, n in asked}) >= 15
    missing = sorted(f"{title}: {name}" for title, name in asked if name not in exported)
    assert not missing, "the dashboard asks for metrics no daemon exports:\n" + "\n".join(missing)


def test_every_expression_parses_as_promql(exported: set[str]) -> None:
    promql_parser = pytest.importorskip("promql_parser", reason="promql-parser (kvpool[dev]) checks the PromQL")
    dash = json.loads(DASHBOARD.read_text())
    for title, expr in _targets(dash):
        names: list[str] = []

        def visit(node: Any, names: list[str] = names) -> bool:
            if isinstance(node, promql_parser.VectorSelector):
                names.append(node.name)
            return True

        promql_parser.walk(promql_parser.parse(_promql(expr)), visit)
        assert names and set(names) <= exported, (title, expr, names)


def test_the_prometheus_example_scrapes_the_daemons_default_ports() -> None:
    text = (REPO / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "metrics_path: /metrics" in text
    assert re.search(r"127\.0\.0\.1:7471", text) and re.search(r"127\.0\.0\.1:7480", text)
    assert Path(DASHBOARD).name in (REPO / "deploy" / "README.md").read_text()


def test_every_exported_metric_is_in_the_reference(exported: set[str]) -> None:
    """docs/reference/metrics.md lists each family (histograms by their base name) and nothing that is gone."""
    doc = (REPO / "docs" / "reference" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(kvpool_[a-z0-9_]+)` \|", doc, re.MULTILINE))
    families = {re.sub(r"_(bucket|count|sum)$", "", n) if n.endswith(("_bucket", "_count", "_sum")) else n
                for n in exported}
    assert families - listed == set(), "exported but not in docs/reference/metrics.md"
    model = {n for n in listed if n.startswith("kvpool_model_")}  # the model's, checked in tests/switchmodel
    assert listed - families - model == set(), "in docs/reference/metrics.md but exported by no daemon"
