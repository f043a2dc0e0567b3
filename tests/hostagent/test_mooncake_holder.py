"""A holder agent fronting a real Mooncake Store: chunks demoted below DRAM are served from the store.

Skips (with the reason) where the Mooncake wheel or its binaries cannot run here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hostagent.client import AgentClient
from hostagent.daemon import spawn_agent
from hostagent.mooncake_master import MasterConfig, MooncakeMaster, MooncakeProcessError, MooncakeStoreNode, find_binary

try:
    find_binary("mooncake_master")
    find_binary("mooncake_client")
    import mooncake.store  # noqa: F401  (the client library must load, not just the binaries exist)
except (ImportError, MooncakeProcessError) as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"Mooncake Store cannot run here: {exc}", allow_module_level=True)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MooncakeMaster]:
    """A master and one 64 MiB store node on loopback, stopped by PID afterwards."""
    m = MooncakeMaster(MasterConfig(), log_path=tmp_path / "master.log")
    try:
        m.start()
    except MooncakeProcessError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"mooncake_master cannot start here: {exc}")
    try:
        with MooncakeStoreNode(m, 64 << 20, log_path=tmp_path / "store.log"):
            yield m
    finally:
        m.stop()


def _stop(*agents: Any) -> None:
    for proc in agents:
        if proc is not None:
            assert proc.stop() == 0


@pytest.mark.slow
def test_holder_serves_chunks_demoted_to_mooncake(tmp_path: Path, master: MooncakeMaster) -> None:
    holder = requester = None
    try:
        # 64 KiB of DRAM for 8 chunks of 32 KiB: six of them live only in the Mooncake Store.
        holder = spawn_agent(tmp_path / "holder", "--dram-bytes", "64KiB", "--backend", "mooncake",
                             "--mooncake-master", master.rpc_address, "--mooncake-metadata-url", master.metadata_url)
        requester = spawn_agent(tmp_path / "requester")
        keys = list(range(0x4D00, 0x4D08))
        blobs = [os.urandom(32 << 10) for _ in keys]
        hc = AgentClient(holder.api_url)
        hc.publish_chunks(keys, blobs)
        tiers = hc.stats()["tiers"]
        assert [t["name"] for t in tiers["tiers"]] == ["dram", "mooncake"]
        assert tiers["tiers"][1]["chunks"] == 6 and tiers["dropped"] == 0
        got_keys, got, stopped = AgentClient(requester.api_url).fetch_chunks(keys, holder.udp_address)
        assert got_keys == keys and got == blobs and stopped is None
        hs = hc.stats()
        # Every chunk the store held was read back from it (a hit there, then promoted to DRAM).
        assert hs["tiers"]["tiers"][1]["hits"] >= 6
        assert hs["transport"]["holder"]["nacks"] == {}
    finally:
        _stop(requester, holder)


@pytest.mark.slow
def test_holder_without_dram_serves_what_the_store_holds_now(tmp_path: Path, master: MooncakeMaster) -> None:
    from hostagent.mooncake_backend import MooncakeBackend

    holder = requester = None
    try:
        holder = spawn_agent(tmp_path / "holder", "--dram-bytes", "0", "--backend", "mooncake",
                             "--mooncake-master", master.rpc_address, "--mooncake-metadata-url", master.metadata_url)
        requester = spawn_agent(tmp_path / "requester")
        keys = [0x5E00, 0x5E01, 0x5E02]
        blobs = [os.urandom(100_000) for _ in keys]
        hc = AgentClient(holder.api_url)
        hc.publish_chunks(keys, blobs)
        assert [t["name"] for t in hc.stats()["tiers"]["tiers"]] == ["mooncake"]
        with MooncakeBackend.for_master(master) as other:
            # Published means in the store, under the chunk key, byte for byte.
            assert [other.get(k) for k in keys] == blobs
            rc = AgentClient(requester.api_url)
            assert rc.fetch_chunks(keys, holder.udp_address, local=False)[:2] == (keys, blobs)
            # The store drops the middle chunk (as its eviction would): served up to it, never stale.
            other.delete(keys[1])
            got_keys, got, stopped = rc.fetch_chunks(keys, holder.udp_address, local=False)
            assert got_keys == keys[:1] and got == blobs[:1]
            assert stopped is not None and "unknown" in stopped.lower()
        assert hc.stats()["transport"]["holder"]["nacks"].get("UNKNOWN_CHUNK", 0) >= 1
    finally:
        _stop(requester, holder)
