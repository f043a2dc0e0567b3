"""The model switch's own counters for Prometheus (``--metrics``): ports and impairments, read at scrape time."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families

from kvpool.metrics import exposition
from switchmodel import metrics
from switchmodel.ports import PortIO, PortStats
from tests.scrape import parse, scrape, value


class _Impairer:
    def stats(self) -> dict[str, dict[str, int]]:
        return {"2:out": {"frames": 10, "lost": 3, "duplicated": 0, "corrupted": 1, "reordered": 0}}


def test_port_and_impairment_counters_are_read_at_scrape_time() -> None:
    stats = PortStats(rx_bytes=1500, tx_bytes=900, tx_errors=2, per_port_rx={1: 4}, per_port_tx={2: 3})
    ports = cast(PortIO, SimpleNamespace(stats=stats, impairer=_Impairer()))
    reg, server = metrics.serve("127.0.0.1:0", ports)
    m = parse(exposition(reg)[0].decode())
    assert value(m, "kvpool_model_port_frames_total", port="1", direction="rx") == 4
    assert value(m, "kvpool_model_port_frames_total", port="2", direction="tx") == 3
    assert value(m, "kvpool_model_bytes_total", direction="rx") == 1500
    assert value(m, "kvpool_model_tx_errors_total") == 2
    assert value(m, "kvpool_model_impair_frames_total", channel="2:out", what="lost") == 3
    stats.per_port_rx[1] = 9  # the loop counts on; the next scrape (over HTTP this time) sees it
    try:
        content_type, m2 = scrape(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert content_type.startswith("text/plain")
    assert value(m2, "kvpool_model_port_frames_total", port="1", direction="rx") == 9


def test_switch_process_serves_metrics_with_flag() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "switchmodel.cli", "--grpc-addr", "127.0.0.1:0",
                             "--metrics", "127.0.0.1:0", "--log-format", "json"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "serving P4Runtime on" in proc.stdout.readline()
        line = proc.stdout.readline()
        assert line.startswith("kvpool-switch: metrics on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].strip().removesuffix("/metrics")
        import urllib.request

        with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
            families: dict[str, Any] = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
        assert "kvpool_model_port_frames" in families  # declared even before a port carried a frame
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_every_model_metric_is_in_the_reference() -> None:
    import re

    from tests.paths import REPO

    stats = PortStats(per_port_rx={1: 1}, per_port_tx={1: 1})
    reg, server = metrics.serve("127.0.0.1:0", cast(PortIO, SimpleNamespace(stats=stats, impairer=_Impairer())))
    server.shutdown()
    server.server_close()
    names = {f.name + ("_total" if f.type == "counter" else "")
             for f in text_string_to_metric_families(exposition(reg)[0].decode())}
    doc = (REPO / "docs" / "reference" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(kvpool_model_[a-z0-9_]+)` \|", doc, re.MULTILINE))
    assert names == listed
