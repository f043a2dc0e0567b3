"""scripts/render_dashboard.py and kvpool.dashboard against a fake Prometheus HTTP API (no Prometheus needed)."""

from __future__ import annotations

import json
import runpy
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvpool import dashboard
from tests.paths import REPO, SCRIPTS

SCRIPT = SCRIPTS / "render_dashboard.py"
DASHBOARD = REPO / "deploy" / "grafana" / "kvpool.json"


class FakePrometheus:
    """Answers ``/api/v1/query_range`` as Prometheus does: a matrix per query, an error for a bad one."""

    def __init__(self) -> None:
        self.queries: list[dict[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
                fake.queries.append(q)
                status, doc = fake.answer(url.path, q)
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, q: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if path != "/api/v1/query_range":
            return 404, {"status": "error", "errorType": "not_found", "error": path}
        expr = q["query"]
        if "kvpool_controller_switch_connected" in expr:
            return 400, {"status": "error", "errorType": "bad_data", "error": "parse error: unexpected thing"}
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        times = [start + i * step for i in range(int((end - start) / step) + 1)]
        if "switch_pool_used_slots" in expr:
            return 200, {"status": "success", "data": {"resultType": "matrix", "result": []}}
        series = [{"metric": {"switch": "s1", "path": "switch", "outcome": "exact", "instance": "h0"},
                   "values": [[t, "NaN" if i == 0 else str(0.25 * i)] for i, t in enumerate(times)]}]
        return 200, {"status": "success", "data": {"resultType": "matrix", "result": series}}


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def test_rate_interval_and_legends_as_grafana_makes_them() -> None:
    assert dashboard.rate_interval(2, 2) == "8s"  # four scrapes
    assert dashboard.rate_interval(30, 5) == "35s"  # the step plus one scrape
    assert dashboard.legend("GETs served by {{switch}}", {"switch": "s1"}) == "GETs served by s1"
    assert dashboard.legend("{{ switch }}: {{reason}}", {"switch": "s2"}) == "s2: "


def test_the_script_draws_every_panel_from_its_own_queries(prom: FakePrometheus, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dash.png"
    argv = ["--prometheus", prom.url, "--start", "1000", "--end", "1120", "--scrape-interval", "2", "--step", "4",
            "--out", str(out)]
    assert runpy.run_path(str(SCRIPT))["main"](argv) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] if p["type"] == "timeseries" for t in p["targets"]]
    # Every target asked once, over the window, $__rate_interval as Grafana computes it.
    assert [q["query"] for q in prom.queries] == [e.replace("$__rate_interval", "8s") for e in exprs]
    assert {(q["start"], q["end"], q["step"]) for q in prom.queries} == {("1000.000", "1120.000", "4")}
    text = capsys.readouterr()
    assert f"{out}: 10 panels over 120 s; no data in: Switch pool occupancy" in text.out
    assert "P4Runtime" in text.err and "parse error" in text.err  # a refused query is reported, not fatal


def test_panels_keep_titles_units_and_legends(prom: FakePrometheus) -> None:
    doc = json.loads(DASHBOARD.read_text())
    panels = dashboard.evaluate(doc, dashboard.prometheus_query(prom.url), 0, 10, 2, 2)
    by_title = {p.title: p for p in panels}
    assert [p.title for p in panels if p.kind == "row"] == ["Pool", "Fetches", "Controller"]
    hit = by_title["Pool hit ratio"]
    assert hit.unit == "percentunit" and hit.grid == {"h": 8, "w": 12, "x": 0, "y": 1}
    assert [s.legend for s in hit.series] == ["GETs served by s1", "bytes from switch pools (agents)"]
    assert hit.series[0].times == [0, 2, 4, 6, 8, 10] and hit.series[0].values[1:3] == [0.25, 0.5]
    assert by_title["P4Runtime"].errors and not by_title["Switch pool occupancy"].series


def test_reading_a_stored_run_needs_prometheus_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    rc = runpy.run_path(str(SCRIPT))["main"](["--tsdb", str(tmp_path / "tsdb"), "--out", str(tmp_path / "d.png")])
    assert rc == 1
    assert capsys.readouterr().err.strip() == (
        "render_dashboard: prometheus is not on PATH (Debian: apt-get install -y prometheus)")
