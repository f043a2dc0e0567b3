"""``kvpool demo --observe`` without Mininet: the scrape configuration, the agent proxy, a missing Prometheus."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bmv2_topologies import demo
from bmv2_topologies.experiment import observe, testbed
from hostagent.daemon import Agent, AgentConfig


def test_scrape_config_names_every_target_by_its_host() -> None:
    cfg = observe.scrape_config({"h0": ("127.0.0.1:1001", "holder"), "h1": ("127.0.0.1:1002", "inference")},
                                "127.0.0.1:2000", {"s1": "127.0.0.1:3000"})
    assert json.loads(json.dumps(cfg)) == cfg  # written as JSON, which is YAML
    assert cfg["global"]["scrape_interval"] == "2s"
    jobs = {j["job_name"]: j["static_configs"] for j in cfg["scrape_configs"]}
    assert list(jobs) == ["kvpool-controller", "kvpool-agent", "kvpool-switch"]  # the example config's names
    assert jobs["kvpool-agent"] == [
        {"targets": ["127.0.0.1:1001"], "labels": {"instance": "h0", "role": "holder"}},
        {"targets": ["127.0.0.1:1002"], "labels": {"instance": "h1", "role": "inference"}}]
    assert jobs["kvpool-controller"] == [{"targets": ["127.0.0.1:2000"], "labels": {"instance": "controller"}}]
    assert "kvpool-switch" not in {j["job_name"] for j in observe.scrape_config({}, "x:1", {})["scrape_configs"]}


def test_an_agent_on_a_unix_socket_is_scraped_through_a_loopback_proxy(tmp_path: Path) -> None:
    sock = tmp_path / "h1.sock"
    agent = Agent(AgentConfig(udp_port=0, api_port=0, api_socket=str(sock), log_level="WARNING"))
    agent.start()
    proxy = observe._UnixMetrics(f"unix:{sock}")
    try:
        with urllib.request.urlopen(f"http://{proxy.address}/metrics", timeout=10) as reply:
            text = reply.read().decode()
            assert reply.headers["Content-Type"].startswith("text/plain")
        assert "kvpool_agent_fetched_chunks_total" in text
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{proxy.address}/v1/stats", timeout=10)
        assert e.value.code == 404
    finally:
        proxy.close()
        agent.stop()


def test_observe_without_prometheus_stops_at_once_saying_how_to_install_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(testbed, "mininet_available", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    assert demo.run(p.parse_args(["--observe", "--out", str(tmp_path / "out")])) == 1
    assert capsys.readouterr().err.strip() == (
        "kvpool demo: --observe: prometheus is not on PATH (Debian: apt-get install -y prometheus)")
    assert not (tmp_path / "out").exists()
