"""An agent registered with a real controller API keeps the directory in step with its tiers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from hostagent.registration import ControllerClient
from tests.ctl_harness import TOPO, running


def _until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _tiers_of(ctl: ControllerClient, key: int) -> list[str]:
    return [h["tier"] for h in ctl.holders(key) if h["node_id"] == "h0"]


def test_agent_publishes_demotions_and_withdrawals(tmp_path: Path) -> None:
    with running(tmp_path, switch=False) as ctl_daemon:
        ctl = ControllerClient(ctl_daemon.url)
        cfg = AgentConfig(udp_port=0, api_port=0, dram_bytes=100_000, backend="memory", controller=ctl_daemon.url,
                          node_id="h0", advertise=TOPO.hosts["h0"].address, log_level="WARNING")
        agent = Agent(cfg)
        agent.start()
        try:
            nodes = {n["node_id"]: n for n in ctl.get("/v1/nodes")["nodes"]}
            assert nodes["h0"]["up"] and nodes["h0"]["role"] == "holder"
            assert nodes["h0"]["capacities"] == {"dram": 100_000, "pool": 1 << 40}
            client = AgentClient(agent.api_url)
            client.publish_chunks([1, 2, 3], [bytes([k]) * 40_000 for k in (1, 2, 3)])
            # 120 kB into 100 kB of DRAM: chunk 1 was demoted to the backend ("pool").
            _until(lambda: [_tiers_of(ctl, k) for k in (1, 2, 3)] == [["pool"], ["dram"], ["dram"]],
                   "the directory to show the demotion")
            assert client.get_chunk(1) == bytes([1]) * 40_000  # promoted back; chunk 2 goes down
            _until(lambda: [_tiers_of(ctl, k) for k in (1, 2, 3)] == [["dram"], ["pool"], ["dram"]],
                   "the directory to show the promotion")
            client.delete_chunk(3)
            _until(lambda: _tiers_of(ctl, 3) == [], "the withdrawal")
            st = client.stats()["directory"]
            assert st["node_id"] == "h0" and st["errors"] == 0 and st["published_chunks"] == 2
            assert st["publishes"] >= 5 and st["withdrawals"] >= 3
        finally:
            agent.stop()
        assert "h0" not in {n["node_id"] for n in ctl.get("/v1/nodes")["nodes"]}  # deregistered


def test_unreachable_or_refusing_controller_fails_start_cleanly(tmp_path: Path) -> None:
    agent = Agent(AgentConfig(udp_port=0, api_port=0, controller="http://127.0.0.1:1", node_id="h0",
                              log_level="WARNING"))
    with pytest.raises(RuntimeError, match=r"controller http://127\.0\.0\.1:1"):
        agent.start()
    with running(tmp_path, switch=False) as ctl_daemon:
        # 127.0.0.1 is not a host of the controller's topology: registration is refused.
        agent = Agent(AgentConfig(udp_port=0, api_port=0, controller=ctl_daemon.url, node_id="h9",
                                  log_level="WARNING"))
        with pytest.raises(RuntimeError, match="controller"):
            agent.start()


def test_requester_finds_the_holder_in_the_directory(tmp_path: Path) -> None:
    with running(tmp_path, switch=False) as ctl_daemon:
        def agent(node: str, role: str) -> Agent:
            a = Agent(AgentConfig(udp_port=0, api_port=0, controller=ctl_daemon.url, node_id=node, role=role,
                                  advertise=TOPO.hosts[node].address, log_level="WARNING"))
            a.start()
            return a

        holder, requester = agent("h0", "holder"), agent("h1", "inference")
        try:
            AgentClient(holder.api_url).put_chunk(0xC0FFEE, b"kv" * 100)
            assert holder.directory is not None
            _until(lambda: holder.directory is not None and holder.directory.stats()["published_chunks"] == 1,
                   "the publish")
            # Peers are addressed at the kvpool port of the address they registered.
            assert requester.holder_from_directory(0xC0FFEE) == (TOPO.hosts["h0"].address, 7470)
            assert holder.holder_from_directory(0xC0FFEE) is None  # only itself holds it
            assert requester.holder_from_directory(0xBAD) is None  # nobody does
        finally:
            requester.stop()
            holder.stop()
