"""A holder agent fronting a real Mooncake Store: chunks demoted below DRAM are served from the store.

Skips (with the reason) where the Mooncake wheel or its binaries cannot run here.
"""

from __future__ import annotations

import os
from pathlib import Path

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


@pytest.mark.slow
def test_holder_serves_chunks_demoted_to_mooncake(tmp_path: Path) -> None:
    master = MooncakeMaster(MasterConfig(), log_path=tmp_path / "master.log")
    try:
        master.start()
    except MooncakeProcessError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"mooncake_master cannot start here: {exc}")
    node = MooncakeStoreNode(master, 64 << 20, log_path=tmp_path / "store.log")
    holder = requester = None
    try:
        node.start()
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
        for proc in (requester, holder):
            if proc is not None:
                assert proc.stop() == 0
        node.stop()
        master.stop()
