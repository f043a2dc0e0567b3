"""The controller's ``/metrics``: Prometheus' text format, read by its parser, equal to ``/v1/stats`` after traffic.

A real daemon and the model switch over gRPC (tests/ctl_harness.py): a chunk is admitted
through the API, filled by the holder's DATA crossing the switch and served to a requester
from switch memory; two range GETs are coalesced; a malformed packet is dropped. Every one of
those counts, and the policy's and the driver's own, appears in ``/metrics`` with the value
``/v1/stats`` (or ``/v1/status``) shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostagent.registration import ControllerClient
from kvpool import wire
from tests.ctl_harness import P4INFO, SKIP_REASON, SMALL, TOPO, UNKNOWN, Daemon, ModelSwitch, running
from tests.scrape import scrape, value

H0, H1, H2 = (TOPO.hosts[h] for h in ("h0", "h1", "h2"))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running(tmp_path) as d:
        yield d


def test_metrics_match_the_stats_after_traffic(daemon: Daemon) -> None:
    api = ControllerClient(daemon.url, timeout=10)
    assert api.post("/v1/admit", {"key": f"{SMALL:#x}"})["admitted"] == [f"{SMALL:#x}"]
    chunk = bytes(range(256)) * 3 + bytes(232)  # SMALL's 1000 bytes
    daemon.send(H0, H1, wire.data_packet(SMALL, 0, chunk), sport=wire.KVPOOL_UDP_PORT)  # fills on pass
    served = daemon.send(H2, H0, wire.get_packet(SMALL, 0, request_id=9, room=True))
    assert [port for port, _ in served] == [3], "the switch did not answer from its pool"
    daemon.send(H1, H0, wire.get_packet(UNKNOWN, 0, 2, request_id=1))  # range GETs: the second is absorbed
    daemon.send(H2, H0, wire.get_packet(UNKNOWN, 0, 2, request_id=2))
    daemon.send(H1, H0, b"\x00" * 10)  # too short for a kvpool header: dropped

    content_type, m = scrape(daemon.url)
    stats = api.get("/v1/stats")["switches"]["s1"]
    status = api.get("/v1/status")
    assert content_type.startswith("text/plain; version=0.0.4")
    s1 = {"switch": "s1"}
    assert stats["pool"]["hit"] == 1 and stats["coalesce"]["absorbed"] == 1 and stats["drops"]["parse_error"] == 1
    for event in ("hit", "fill", "lookup_miss"):
        assert value(m, "kvpool_switch_pool_events_total", event=event, **s1) == stats["pool"][event], event
    for event in ("first", "absorbed"):
        assert value(m, "kvpool_switch_coalesce_events_total", event=event, **s1) == stats["coalesce"][event]
    for reason, n in stats["drops"].items():
        assert value(m, "kvpool_switch_drops_total", reason=reason, **s1) == n, reason
    assert value(m, "kvpool_switch_slot_hits_total", **s1) == stats["slots"]["hits"] == 1
    assert value(m, "kvpool_switch_up", **s1) == 1
    assert value(m, "kvpool_switch_pool_used_slots", **s1) == status["switches"]["s1"]["slots"]["used"] == 1
    assert value(m, "kvpool_switch_pool_slots", **s1) == status["switches"]["s1"]["slots"]["total"]
    assert value(m, "kvpool_controller_switch_reconnects_total", **s1) == status["switches"]["s1"]["reconnects"]
    assert value(m, "kvpool_controller_p4runtime_write_errors_total", **s1) == 0
    assert value(m, "kvpool_controller_policy_admissions_total") >= 1
    assert 0 < value(m, "kvpool_controller_epochs_total") <= status["epoch"]  # status was read after the scrape
    assert value(m, "kvpool_api_requests_total") == 1  # the admit (a request is counted once answered)


def test_a_lost_switch_reads_as_down_not_as_zeros(daemon: Daemon) -> None:
    daemon.stop_event.set()
    daemon.loop.join(timeout=5)
    daemon.server.stop(0)
    _, m = scrape(daemon.url)
    assert value(m, "kvpool_switch_up", switch="s1") == 0
    assert not any(name == "kvpool_switch_pool_events_total" for name, _ in m)


def test_metrics_are_a_read_open_like_the_stats(daemon: Daemon) -> None:
    """``/metrics`` follows ``/v1/stats``' auth rule: a GET, open to whoever can connect (no token)."""
    import urllib.request

    for path in ("/v1/stats", "/metrics"):
        with urllib.request.urlopen(daemon.url + path, timeout=10) as reply:  # no Authorization header
            assert reply.status == 200, path


def test_kvpool_controller_logs_json_and_serves_metrics(tmp_path: Path) -> None:
    """The real CLI: ``--log-format json`` lines name where ``/metrics`` is; a scrape there reads the switch."""
    if not P4INFO.exists():
        pytest.skip(SKIP_REASON)
    switch = ModelSwitch()
    topo = tmp_path / "star.json"
    topo.write_text(json.dumps(TOPO.to_dict()))
    log_path = tmp_path / "controller.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "--topology", str(topo),
                                 "--switch", f"s1={switch.address}@1", "--mode", "pool", "--epoch", "0.1",
                                 "--p4info", str(P4INFO), "--api", "127.0.0.1:0", "--log-format", "json",
                                 "--token-file", str(tmp_path / "token")],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        url: str | None = None
        api_line: dict[str, str] | None = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
            api_line = next((x for x in lines if "metrics" in x), None)
            url = None if api_line is None else api_line["metrics"]
        assert api_line is not None and url is not None, log_path.read_text()[-2000:]
        assert api_line["component"] == "controller" and api_line["level"] == "info"
        assert api_line["msg"].startswith("API on http://127.0.0.1:")
        _, m = scrape(url.removesuffix("/metrics"))
        assert value(m, "kvpool_switch_up", switch="s1") == 1
        assert value(m, "kvpool_controller_switch_connected", switch="s1") == 1
        assert value(m, "kvpool_switch_pool_slots", switch="s1") > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        switch.stop()
    assert code == 0, log_path.read_text()[-2000:]
