"""The agent daemon: config file + flags, local API through the client library, prefixes, clean shutdown."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hostagent.chunking import chunk_keys
from hostagent.cli import build_parser, config_from_args, parse_size
from hostagent.client import AgentClient
from hostagent.daemon import UNPACED_TURN, Agent, AgentConfig, load_config, spawn_agent
from hostagent.serialize import deserialize, serialize
from hostagent.transport import TransportConfig
from kvpool.config import ConfigError
from kvpool.http_api import ApiError, ApiUnreachableError


def _agent(**kw: object) -> Agent:
    cfg = AgentConfig(udp_port=0, api_port=0, log_level="WARNING").replace(**kw)
    return Agent(cfg)


@pytest.fixture
def agents() -> Iterator[tuple[Agent, Agent]]:
    a, b = _agent(), _agent()
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def _udp(agent: Agent) -> str:
    return f"127.0.0.1:{agent.transport.port}"


def test_health_put_get_delete_and_stats(agents: tuple[Agent, Agent]) -> None:
    a, _ = agents
    c = AgentClient(a.api_url)
    h = c.health()
    assert h["ok"] and h["pid"] == os.getpid() and h["udp"][1] == a.transport.port
    assert c.put_chunk(0xABC, b"hello", generation=3) == {"key": "0x0000000000000abc", "bytes": 5, "tier": "dram"}
    assert c.get_chunk(0xABC) == b"hello"
    assert a.store.generation(0xABC) == 3
    with pytest.raises(ApiError) as err:
        c.get_chunk(0xABD)
    assert err.value.status == 404 and "not held here" in err.value.message
    st = c.stats()
    assert st["agent"]["published_chunks"] == 1 and st["tiers"]["chunks"] == 1
    assert st["api"]["errors"] == {"chunk_not_found": 1} and st["transport"]["drops_total"] == 0


def test_publish_prefix_fetch_through_second_agent(agents: tuple[Agent, Agent]) -> None:
    a, b = agents
    torch.manual_seed(0)
    tokens = list(range(100, 150))  # 3 full blocks of 16 + 2 tokens
    layers = [(torch.randn(1, 2, 50, 8), torch.randn(1, 2, 50, 8)) for _ in range(3)]
    keys = AgentClient(a.api_url).publish_prefix("m", tokens, layers, block_size=16)
    assert keys == chunk_keys("m", tokens, 16) and len(keys) == 3
    got = AgentClient(b.api_url).fetch_prefix("m", tokens, block_size=16, holder=_udp(a))
    assert got.keys == keys and got.num_tokens == 48 and got.stopped is None and got.chunks is not None
    for layer, (k, v) in enumerate(layers):
        assert torch.equal(got.chunks[:, layer, 0].permute(1, 0, 2, 3).reshape(2, 48, 8), k[0, :, :48])
        assert torch.equal(got.chunks[:, layer, 1].permute(1, 0, 2, 3).reshape(2, 48, 8), v[0, :, :48])
    assert b.stats()["agent"]["fetch_remote"] == 3
    # Fetched chunks now live in b's tiers: a second fetch is local, and b serves them onwards.
    again = AgentClient(b.api_url).fetch_prefix("m", tokens, block_size=16)
    assert again.keys == keys and b.stats()["agent"]["fetch_local_hits"] == 3
    c = _agent()
    c.start()
    try:
        onward = AgentClient(c.api_url).fetch_prefix("m", tokens, block_size=16, holder=_udp(b))
    finally:
        c.stop()
    assert onward.keys == keys
    assert b.stats()["transport"]["holder"]["fragments_served"] > 0


def test_fetch_returns_longest_available_prefix(agents: tuple[Agent, Agent]) -> None:
    a, b = agents
    blobs = [serialize(torch.full((1, 2, 1, 4, 2), float(i))) for i in range(3)]
    keys = [11, 12, 13]
    AgentClient(a.api_url).publish_chunks([11, 13], [blobs[0], blobs[2]])
    got, data, stopped = AgentClient(b.api_url).fetch_chunks(keys, _udp(a))
    assert got == [11] and torch.equal(deserialize(bytearray(data[0])), torch.full((1, 2, 1, 4, 2), 0.0))
    assert stopped is not None and "NACK UNKNOWN_CHUNK" in stopped and "0x000000000000000c" in stopped
    summary = AgentClient(b.api_url).prefetch(keys[:1], _udp(a))
    assert summary["found"] == 1 and summary["requested"] == 1 and summary["stopped"] is None
    # Without a holder only local chunks count: 11 is local now, 12 is not.
    assert AgentClient(b.api_url).fetch_chunks(keys)[0] == [11]


def test_tiers_demote_through_the_api() -> None:
    a = _agent(dram_bytes=1000, backend="memory")
    a.start()
    try:
        c = AgentClient(a.api_url)
        for k in range(5):
            c.put_chunk(k + 1, bytes([k]) * 400)
        tiers = c.stats()["tiers"]
        assert [t["name"] for t in tiers["tiers"]] == ["dram", "memory"]
        assert tiers["dropped"] == 0 and tiers["tiers"][1]["chunks"] == 3
        assert c.get_chunk(1) == bytes([0]) * 400  # promoted back from the lowest tier
    finally:
        a.stop()


def test_holder_without_dram_serves_from_its_backend() -> None:
    a = _agent(dram_bytes=0, backend="memory")
    a.start()
    try:
        c = AgentClient(a.api_url)
        c.put_chunk(3, b"x" * 500)
        tiers = c.stats()["tiers"]
        assert [t["name"] for t in tiers["tiers"]] == ["memory"] and tiers["tiers"][0]["chunks"] == 1
        assert c.get_chunk(3) == b"x" * 500
    finally:
        a.stop()


def test_config_file_then_flags(tmp_path: Path) -> None:
    conf = tmp_path / "agent.toml"
    conf.write_text('[agent]\nudp_port = 9000\napi_port = 9001\ndram_bytes = 4096\nrate_bytes_per_s = 5\n'
                    'single_gets = true\n')
    cfg = load_config(conf)
    assert (cfg.udp_port, cfg.api_port, cfg.dram_bytes, cfg.rate_bytes_per_s) == (9000, 9001, 4096, 5.0)
    assert cfg.single_gets and cfg.transport_config().single_fragment_gets
    # A paced holder takes turns of the transport's quantum, an unpaced one of about 1 MB.
    assert cfg.transport_config().send_quantum == TransportConfig().send_quantum
    assert config_from_args(build_parser().parse_args([])).transport_config().send_quantum == UNPACED_TURN
    assert not config_from_args(build_parser().parse_args([])).single_gets
    assert config_from_args(build_parser().parse_args(["--single-gets"])).single_gets
    assert config_from_args(build_parser().parse_args([])).transport_config().share_transfers
    assert not config_from_args(build_parser().parse_args(["--no-shared-transfers"])).transport_config().share_transfers
    args = build_parser().parse_args(["--config", str(conf), "--api-port", "9100", "--dram-bytes", "2MiB"])
    cfg = config_from_args(args)
    assert (cfg.udp_port, cfg.api_port, cfg.dram_bytes) == (9000, 9100, 2 << 20)
    assert parse_size("64MiB") == 64 << 20 and parse_size("1g") == 1 << 30 and parse_size("10") == 10
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")


@pytest.mark.parametrize(("text", "match"), [
    ("[agent]\nbogus = 1\n", "unknown setting 'bogus'"),
    ("[agent]\nsingle_gets = 1\n", "single_gets must be bool"),
    ("[agent]\nudp_port = true\n", "udp_port must be int"),
    ("[agent]\nudp_port = \"x\"\n", "udp_port must be int"),
    ("[agent]\nbackend = \"floppy\"\n", "backend must be one of"),
    ("[agent]\nwindow_fragments = 1\n", "window_fragments"),
    ("[agent]\ndram_bytes = 0\n", "dram_bytes 0 needs a backend"),
    ("[agent]\ndram_bytes = -1\n", "dram_bytes and gpu_bytes >= 0"),
    ("[agent]\nrecord_cache_bytes = -1\n", "record_cache_bytes must be >= 0"),
    ("udp_port = 1\n", "settings go in the \\[agent\\] table"),
    ("[agent\n", "not valid TOML"),
])
def test_bad_config_files(tmp_path: Path, text: str, match: str) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(conf)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hostagent.cli", *args], capture_output=True, text=True, timeout=60)


def test_cli_help_and_usage_errors(tmp_path: Path) -> None:
    h = _cli("--help")
    assert h.returncode == 0 and "--config" in h.stdout and "--ready-file" in h.stdout
    missing = _cli("--config", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0 and "does not exist" in missing.stderr
    assert _cli("--backend", "floppy").returncode == 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_daemon_stops_cleanly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    conf = tmp_path / "agent.toml"
    conf.write_text('[agent]\nlog_level = "DEBUG"\ndram_bytes = 1048576\n')
    proc = spawn_agent(tmp_path, "--config", str(conf))
    try:
        c = AgentClient(proc.api_url)
        assert c.health()["pid"] == proc.pid
        c.put_chunk(5, b"x" * 100)
        assert c.stats()["tiers"]["tiers"][0]["capacity_bytes"] == 1 << 20
        proc.process.send_signal(sig)
        assert proc.process.wait(15) == 0
    finally:
        proc.stop()
    log = proc.log()
    assert f"received {sig.name}, shutting down" in log and "agent stopped" in log
    with pytest.raises(ApiUnreachableError, match=r"agent API at .+ is unreachable"):
        AgentClient(proc.api_url, timeout=2).health()


def test_port_in_use_fails_to_start(agents: tuple[Agent, Agent]) -> None:
    a, _ = agents
    r = _cli("--udp-port", str(a.transport.port), "--api-port", "0")
    assert r.returncode == 1 and "cannot start" in r.stderr
