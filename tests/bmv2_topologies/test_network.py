"""The Mininet builder: hosts, shaped links and one switch process per switch, all stopped again.

Needs root and Mininet; skips with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bmv2_topologies.network import EmulatedNetwork, NetworkError, mininet_available, switch_command
from kvpool.topology import star

REASON = mininet_available()


def _links() -> str:
    return subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout


def test_switch_commands_for_both_targets(tmp_path: Path) -> None:
    cmd = switch_command("model", 3, "127.0.0.1:9999", {1: "s1-eth1", 2: "s1-eth2"}, tmp_path / "s1.log")
    assert cmd[1:] == ["-m", "switchmodel.cli", "--device-id", "3", "--grpc-addr", "127.0.0.1:9999",
                       "--interface", "1@s1-eth1", "--interface", "2@s1-eth2"]
    with pytest.raises(NetworkError, match="unknown target"):
        switch_command("tofino", 1, "127.0.0.1:1", {}, tmp_path / "x.log")
    watched = switch_command("model", 1, "127.0.0.1:1", {}, tmp_path / "x.log", impair_file=tmp_path / "s1.impair")
    assert watched[-2:] == ["--impair-file", str(tmp_path / "s1.impair")]


@pytest.mark.root
@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_star_comes_up_shaped_and_goes_away(tmp_path: Path) -> None:
    net = EmulatedNetwork(star(2, holder_mbps=50), target="model", log_dir=tmp_path,
                          extra_neighbours={"10.0.0.254": "02:00:00:00:00:fe"})
    with net:
        handle = net.switches["s1"]
        assert handle.process is not None and handle.process.poll() is None
        assert handle.ports == {1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"}
        h1 = net.host("h1")
        assert "10.0.0.1/24" in h1.cmd("ip -br addr show h1-eth0")
        # Static ARP for every other host, and TX checksum offload off (the veth trap).
        neigh = h1.cmd("ip neigh show dev h1-eth0")
        assert "10.0.0.100 lladdr 08:00:00:00:00:64 PERMANENT" in neigh
        assert "10.0.0.2 lladdr 08:00:00:00:00:02 PERMANENT" in neigh
        assert "10.0.0.254 lladdr 02:00:00:00:00:fe PERMANENT" in neigh
        assert "tx-checksumming: off" in h1.cmd("ethtool -k h1-eth0")
        # The holder's link is shaped on the switch side (tc htb at 50 Mbit/s).
        assert "rate 50Mbit" in net.host("s1").cmd("tc class show dev s1-eth1")
        pid = handle.process.pid
        assert net.switch_state("s1").startswith(f"running as pid {pid}; log {tmp_path / 's1.log'}")
    assert handle.process.poll() is not None
    assert net.switch_state("s1").startswith("exited with code ")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "s1-eth1" not in _links()


@pytest.mark.root
@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_switch_that_dies_is_reported_and_cleaned_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bmv2_topologies.network as network

    def broken(*args: object, **kwargs: object) -> list[str]:
        return ["python3", "-c", "import sys; print('no such pipeline'); sys.exit(3)"]

    monkeypatch.setattr(network, "switch_command", broken)
    with pytest.raises(NetworkError, match=r"exited with code 3.*no such pipeline"):
        EmulatedNetwork(star(1), target="model", log_dir=tmp_path).start()
    assert "s1-eth1" not in _links()
