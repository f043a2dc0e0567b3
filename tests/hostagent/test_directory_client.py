"""An agent registered with a real controller API keeps the directory in step with its tiers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from hostagent.registration import ControllerClient
from kvpool.http_api import ApiError
from tests.ctl_harness import TOPO, running


def _until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _registered(controller_url: str, node: str, role: str) -> Agent:
    """A started agent registered with the controller as ``node`` of the harness topology."""
    a = Agent(AgentConfig(udp_port=0, api_port=0, controller=controller_url, node_id=node, role=role,
                          advertise=TOPO.hosts[node].address, log_level="WARNING"))
    a.start()
    return a


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
        holder, requester = _registered(ctl_daemon.url, "h0", "holder"), _registered(ctl_daemon.url, "h1", "inference")
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


def test_generations_come_from_the_directory_and_stale_cached_copies_are_never_used(tmp_path: Path) -> None:
    from hostagent.serialize import serialize

    def blob(seed: int) -> bytes:
        gen = torch.Generator().manual_seed(seed)
        return bytes(serialize(torch.randn(2, 64, 32, generator=gen)))

    key, first, second = 0xC0DE, blob(1), blob(2)
    with running(tmp_path, switch=False) as ctl_daemon:
        ctl = ControllerClient(ctl_daemon.url)
        holder, requester = _registered(ctl_daemon.url, "h0", "holder"), _registered(ctl_daemon.url, "h1", "inference")
        try:
            hc, rc = AgentClient(holder.api_url), AgentClient(requester.api_url)
            udp = f"127.0.0.1:{holder.transport.port}"
            hc.put_chunk(key, first, generation=77)  # a holder's generation is the directory's, not its own
            assert holder.store.generation(key) == 1 and ctl.generations([key]) == {key: 1}
            assert rc.fetch_chunks([key], udp)[1] == [first]
            assert requester.store.generation(key) == 1
            assert rc.fetch_chunks([key], udp)[1] == [first]  # from its own tier
            assert requester.stats()["agent"]["fetch_local_hits"] == 1

            hc.put_chunk(key, second)  # other bytes: the next generation, before this returns
            assert ctl.generations([key]) == {key: 2}
            # The requester's copy is of generation 1: dropped, the current bytes fetched instead.
            assert rc.fetch_chunks([key], udp)[1] == [second]
            assert requester.store.generation(key) == 2 and requester.stats()["agent"]["stale_dropped"] == 1

            # The same bytes again (a holder restarting and publishing what it has): same generation.
            holder.stop()
            holder = _registered(ctl_daemon.url, "h0", "holder")
            AgentClient(holder.api_url).put_chunk(key, second)
            assert holder.store.generation(key) == 2 and ctl.generations([key]) == {key: 2}
            assert rc.fetch_chunks([key], f"127.0.0.1:{holder.transport.port}")[1] == [second]
            assert requester.stats()["agent"]["stale_dropped"] == 1  # still current: used as it is
            # Only copies of the current generation are offered to requesters.
            _until(lambda: {h["node_id"] for h in ctl.holders(key)} == {"h0", "h1"}, "both current copies")
        finally:
            requester.stop()
            holder.stop()


def test_only_holders_may_move_a_generation(tmp_path: Path) -> None:
    with running(tmp_path, switch=False) as ctl_daemon:
        requester = _registered(ctl_daemon.url, "h1", "inference")
        try:
            assert requester.directory is not None
            with pytest.raises(ApiError) as err:
                requester.directory.registration.versions([(5, 0x1234, 100)])
            assert err.value.status == 403
            AgentClient(requester.api_url).put_chunk(5, b"x" * 100, generation=3)  # its own copy, its own word
            assert requester.store.generation(5) == 3
            assert ControllerClient(ctl_daemon.url).generations([5]) == {}
        finally:
            requester.stop()


def test_a_holder_answers_the_nodes_the_directory_registers(tmp_path: Path) -> None:
    with running(tmp_path, switch=False) as ctl_daemon:
        holder = _registered(ctl_daemon.url, "h0", "holder")
        try:
            gate = holder.gate
            assert gate is not None
            requester = TOPO.hosts["h2"].address
            assert not gate.verified(requester)  # not registered: its GETs would get nothing
            gate.admit(requester, 1)  # a GET from it: the holder looks at the directory again at once
            other = _registered(ctl_daemon.url, "h2", "inference")
            try:
                _until(lambda: gate.verified(requester), "the holder to learn the registered requester")
            finally:
                other.stop()  # a clean stop deregisters
            _until(lambda: not gate.verified(requester), "the holder to forget the deregistered requester")
            assert holder.stats()["transport"]["gate"]["registered"] >= 1  # h0 itself
        finally:
            holder.stop()
