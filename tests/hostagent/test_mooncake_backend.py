"""MooncakeBackend against a real mooncake_master and store node on loopback.

Skips (with the reason) where the Mooncake wheel or its binaries cannot run here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hostagent.backend import BackendError, ChunkBackend
from hostagent.mooncake_master import (
    MasterConfig,
    MooncakeMaster,
    MooncakeProcessError,
    MooncakeStoreNode,
    find_binary,
)
from tests.paths import REPO

try:
    from hostagent.mooncake_backend import MooncakeBackend, store_key

    find_binary("mooncake_master")
    find_binary("mooncake_client")
    import mooncake.store  # noqa: F401  (the client library must load, not just the binaries exist)
except (ImportError, MooncakeProcessError) as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"Mooncake Store cannot run here: {exc}", allow_module_level=True)



def payload(key: int, size: int) -> bytes:
    """Bytes that differ per key and size, so a stale or foreign value cannot pass."""
    seed = key.to_bytes(8, "little") + size.to_bytes(8, "little")
    return (seed * (size // 16 + 1))[:size] if size < 64 else os.urandom(size - 16) + seed


def start_pool(tmp: Path, segment_bytes: int, **config: Any) -> tuple[MooncakeMaster, MooncakeStoreNode]:
    """A master and one store node, or a skip when they cannot start on this machine."""
    master = MooncakeMaster(MasterConfig(**config), log_path=tmp / "master.log")
    try:
        master.start()
    except MooncakeProcessError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"mooncake_master cannot start here: {exc}")
    node = MooncakeStoreNode(master, segment_bytes, log_path=tmp / "store.log")
    try:
        node.start()
    except MooncakeProcessError:
        master.stop()
        raise
    return master, node


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeMaster]:
    """A master with a 64 MiB store node, shared by the module's quick tests."""
    master, node = start_pool(tmp_path_factory.mktemp("mooncake"), 64 << 20)
    with master, node:
        yield master


@pytest.fixture(scope="module", params=[True, False], ids=["zero_copy", "plain"])
def backend(request: pytest.FixtureRequest, pool: MooncakeMaster) -> Iterator[MooncakeBackend]:
    """A pure client (no segment of its own) in both transfer modes."""
    with MooncakeBackend.for_master(pool, zero_copy=request.param, local_buffer_bytes=16 << 20) as b:
        yield b


def test_is_a_chunk_backend(backend: MooncakeBackend) -> None:
    assert isinstance(backend, ChunkBackend)
    assert backend.name == "mooncake"
    assert store_key(0xABC) == "kvpool/0000000000000abc"


@pytest.mark.parametrize("size", [1, 100, 1408, 65_536, 1 << 20, (3 << 20) + 7])
def test_round_trip_is_bit_identical(backend: MooncakeBackend, size: int) -> None:
    key = 0xFEED_0000_0000_0000 | size | (backend.zero_copy << 40)
    data = payload(key, size)
    backend.put(key, data)
    assert backend.get(key) == data
    assert backend.contains(key)


def test_large_value_grows_the_registered_buffer(pool: MooncakeMaster) -> None:
    # Above the local buffer (1 MiB here) only the registered-buffer path can move it.
    data = payload(77, 6 << 20)
    with MooncakeBackend.for_master(pool, zero_copy=True, local_buffer_bytes=1 << 20) as b:
        b.put(77, memoryview(data))
        assert b.get(77) == data
    with (
        MooncakeBackend.for_master(pool, zero_copy=False, local_buffer_bytes=1 << 20) as plain,
        pytest.raises(BackendError, match="exceeds local_buffer_bytes"),
    ):
        plain.put(78, data)


def test_missing_key_is_none(backend: MooncakeBackend) -> None:
    assert backend.get(0x1234_5678_9ABC_DEF0) is None
    assert not backend.contains(0x1234_5678_9ABC_DEF0)


def test_overwrite_replaces_value(backend: MooncakeBackend) -> None:
    key = 0x0B0B + backend.zero_copy
    backend.put(key, b"first value, longer than the second")
    assert backend.get(key) == b"first value, longer than the second"
    backend.put(key, b"second")
    assert backend.get(key) == b"second"


def test_delete_while_leased_then_missing(backend: MooncakeBackend) -> None:
    key = 0xDE1 + backend.zero_copy
    backend.put(key, b"x" * 5000)
    assert backend.get(key) == b"x" * 5000  # the read leases the object for 10 s
    backend.delete(key)
    assert backend.get(key) is None
    backend.delete(key)  # missing is not an error


def test_bad_input_is_rejected_without_touching_the_store(backend: MooncakeBackend) -> None:
    with pytest.raises(BackendError, match="empty"):
        backend.put(5, b"")
    with pytest.raises(ValueError, match="64-bit"):
        backend.put(1 << 64, b"x")
    with pytest.raises(ValueError, match="64-bit"):
        backend.get(-1)


@pytest.mark.slow
def test_two_processes_share_the_pool(pool: MooncakeMaster) -> None:
    # The writer exits before the reader starts: the data lives on the store node.
    script = textwrap.dedent(
        """
        import hashlib, sys
        from hostagent.mooncake_backend import MooncakeBackend
        role, master, meta = sys.argv[1:4]
        keys = [0xC0DE0000 + i for i in range(8)]
        with MooncakeBackend(master, meta) as b:
            for k in keys:
                value = hashlib.sha256(k.to_bytes(8, "little")).digest() * (4096 * (k % 8 + 1))
                if role == "write":
                    b.put(k, value)
                else:
                    got = b.get(k)
                    assert got == value, (hex(k), None if got is None else len(got))
        print(role, "ok", b.hostname)
        """
    )
    outs = []
    for role in ("write", "read"):
        proc = subprocess.run(
            [sys.executable, "-c", script, role, pool.rpc_address, pool.metadata_url],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout.split())
    assert outs[0][:2] == ["write", "ok"] and outs[1][:2] == ["read", "ok"]
    assert outs[0][2] != outs[1][2]  # two distinct clients of the pool


@pytest.mark.slow
def test_evicted_chunk_is_missing_never_stale(tmp_path: Path) -> None:
    # 16 MiB of pool, 40 chunks of 1 MiB: the master must evict (short leases make the
    # early chunks evictable). Every read is either the chunk's own bytes or None.
    master, node = start_pool(tmp_path, 16 << 20, lease_ttl_ms=50)
    values = {k: payload(k, 1 << 20) for k in range(40)}
    with master, node, MooncakeBackend.for_master(master) as b:
        for k, v in values.items():
            b.put(k, v)
        got = {k: b.get(k) for k in values}
        present = [k for k, v in got.items() if v is not None]
        assert all(got[k] == values[k] for k in present)
        assert got[0] is None and got[1] is None
        assert len(present) <= 16
        # Which later chunks survive depends on the master's background eviction and
        # lease clock (under load it has evicted the newest too), so the pool's health is
        # checked on a fresh chunk read straight back, not on chunk 39 read last.
        fresh = payload(40, 1 << 20)
        b.put(40, fresh)
        assert b.get(40) == fresh
        # A removed chunk after an overwrite stays removed, not the old value.
        b.put(39, b"new")
        b.delete(39)
        assert b.get(39) is None


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_master_killed_is_an_error_not_a_hang(tmp_path: Path) -> None:
    master, node = start_pool(tmp_path, 16 << 20)
    with node, MooncakeBackend.for_master(master, call_timeout=2.0, full_retry_s=0.0) as b:
        b.put(1, b"before the crash")
        assert b.get(1) == b"before the crash"
        master.kill()
        # Each call fails by itself (RPC_FAIL, ~4.3 s) or at the 2 s deadline, whichever first.
        ops: list[Callable[[], object]] = [lambda: b.get(1), lambda: b.put(2, b"after"), lambda: b.delete(1)]
        for op in ops:
            with pytest.raises(BackendError, match="mooncake"):
                op()
    # Connecting to a dead master would block ~90 s inside the library (with the GIL held):
    # the backend probes the master first and refuses at once.
    with pytest.raises(BackendError, match="unreachable"):
        MooncakeBackend.for_master(master, setup_timeout=2.0)
    master.stop()


@pytest.mark.slow
def test_store_node_killed_is_an_error(tmp_path: Path) -> None:
    master, node = start_pool(tmp_path, 16 << 20)
    with master, MooncakeBackend.for_master(master, call_timeout=5.0) as b:
        b.put(3, b"on the node" * 100)
        node.kill()
        with pytest.raises(BackendError, match="TRANSFER_FAIL"):
            b.get(3)


def test_missing_binary_is_a_one_line_error() -> None:
    with pytest.raises(MooncakeProcessError, match="no_such_mooncake_tool not found: install"):
        find_binary("no_such_mooncake_tool")


def test_master_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    bad = MasterConfig(extra_args=("--no_such_flag=1",))
    master = MooncakeMaster(bad, log_path=tmp_path / "bad.log")
    with pytest.raises(MooncakeProcessError, match=r"exited with code .*no_such_flag"):
        master.start(attempts=1)
    assert not master.running


def test_backend_refuses_an_unreachable_master() -> None:
    with pytest.raises(BackendError, match="unreachable"):
        MooncakeBackend("127.0.0.1:1", "http://127.0.0.1:1/metadata", setup_timeout=1.0)


@pytest.mark.slow
def test_cli_serves_until_sigterm_and_stops_its_processes(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    argv = ["--segment-mib", "16", "--log-dir", str(tmp_path), "--ready-file", str(ready)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hostagent.mooncake_master", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert json.loads(ready.read_text()) == info
        pids = [info["master_pid"]] + [n["pid"] for n in info["store_nodes"]]
        with MooncakeBackend(info["rpc_address"], info["metadata_url"]) as b:
            b.put(9, b"through the CLI's pool")
            assert b.get(9) == b"through the CLI's pool"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert (tmp_path / "mooncake_master.log").exists() and (tmp_path / "mooncake_store0.log").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--store-nodes", "-1"], "--store-nodes must be >= 0"), (["--segment-mib", "8"], "at least 16")],
)
def test_cli_usage_error_exits_2(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hostagent.mooncake_master", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.slow
def test_backend_can_lend_its_own_dram(tmp_path: Path) -> None:
    # No store node: the pool is the 16 MiB segment the first backend mounts.
    with MooncakeMaster(log_path=tmp_path / "master.log") as master:
        with pytest.raises(ValueError, match="at least 16777216"):
            MooncakeBackend.for_master(master, segment_bytes=8 << 20)
        with pytest.raises(ValueError, match="peers can reach"):
            MooncakeBackend.for_master(master, segment_bytes=16 << 20, local_hostname="0.0.0.0")
        with MooncakeBackend.for_master(master, segment_bytes=16 << 20) as lender:
            data = payload(11, 3 << 20)
            lender.put(11, data)
            assert lender.get(11) == data
            assert master.segments() == [lender.hostname]
            with MooncakeBackend.for_master(master) as reader:
                assert reader.get(11) == data
        # The lender's segment left with it: its chunks are gone, reported as missing.
        with MooncakeBackend.for_master(master) as late:
            assert late.get(11) is None


def _ip(*args: str) -> None:
    """Run ``ip ARGS``, raising with its stderr on failure."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


@pytest.mark.slow
@pytest.mark.root
def test_pool_in_one_namespace_serves_a_client_in_another(tmp_path: Path) -> None:
    # As on a Mininet star: the pool on the holder's address, a client on another host's.
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    holder, reader = f"kvpmc-h{os.getpid()}", f"kvpmc-r{os.getpid()}"
    veth = f"kvpmc{os.getpid() % 100000}"
    try:
        _ip("netns", "add", holder)
        _ip("netns", "add", reader)
        _ip("link", "add", veth + "a", "type", "veth", "peer", "name", veth + "b")
        for ns, dev, addr in ((holder, veth + "a", "10.77.0.1/24"), (reader, veth + "b", "10.77.0.2/24")):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", addr, "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as exc:
        for ns in (holder, reader):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        pytest.skip(f"cannot create network namespaces here: {exc}")
    ready = tmp_path / "ready.json"
    cli = ["--host", "10.77.0.1", "--segment-mib", "16", "--ready-file", str(ready), "--log-dir", str(tmp_path)]
    # `ip netns exec` execs its command, so this PID is the pool CLI's own.
    pool = subprocess.Popen(
        ["ip", "netns", "exec", holder, sys.executable, "-m", "hostagent.mooncake_master", *cli],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert pool.stdout is not None
        info = json.loads(pool.stdout.readline())
        assert info["rpc_address"].startswith("10.77.0.1:")
        assert info["store_nodes"][0]["segment"].startswith("10.77.0.1:")
        bench = [sys.executable, "scripts/bench_mooncake.py", "--master", info["rpc_address"]]
        bench += ["--metadata", info["metadata_url"], "--local-hostname", "10.77.0.2", "--size-kib", "512"]
        for mode in ("--publish", "--pull"):
            proc = subprocess.run(
                ["ip", "netns", "exec", reader, *bench, mode, "--repeats", "3"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out["host"] == "10.77.0.2" and out["size"] == 512 << 10 and len(out["gets"]) == 3
    finally:
        pool.send_signal(signal.SIGTERM)
        pool.wait(timeout=30)
        for ns in (holder, reader):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "plain"])
def test_a_preferred_segment_keeps_the_writes_on_that_store_node(tmp_path: Path, zero_copy: bool) -> None:
    # Two store nodes, one pool: a holder prefers its own host's node for what it publishes.
    master, first = start_pool(tmp_path, 32 << 20)
    second = MooncakeStoreNode(master, 32 << 20, log_path=tmp_path / "store2.log")
    with master, first, second.start():
        keys = list(range(0x5E60, 0x5E60 + 8))
        with MooncakeBackend.for_master(master, zero_copy=zero_copy, preferred_segment=second.segment_name) as b:
            values = {k: payload(k, 300_000) for k in keys}
            for k, v in values.items():
                b.put(k, v)
            assert {k: b.segments_of(k) for k in keys} == {k: [second.segment_name] for k in keys}
            assert all(b.get(k) == v for k, v in values.items())
            assert b.segments_of(0x5E5F) == []


def test_store_nodes_join_a_running_pool_from_its_ready_file(tmp_path: Path) -> None:
    master, node = start_pool(tmp_path, 16 << 20)
    with master, node:
        ready = tmp_path / "pool.ready"
        ready.write_text(json.dumps({"rpc_address": master.rpc_address, "metadata_url": master.metadata_url,
                                     "admin_url": master.admin_url}))
        joined = tmp_path / "joined.ready"
        proc = subprocess.Popen([sys.executable, "-m", "hostagent.mooncake_master", "--join", str(ready),
                                 "--segment-mib", "16", "--log-dir", str(tmp_path), "--ready-file", str(joined)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        try:
            assert proc.stdout is not None
            info = json.loads(proc.stdout.readline())
            (added,) = info["store_nodes"]
            assert info["master_pid"] is None and info["rpc_address"] == master.rpc_address
            assert added["segment"] in master.segments() and len(master.segments()) == 2
            assert json.loads(joined.read_text()) == info
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        assert proc.returncode == 0
    bad = subprocess.run([sys.executable, "-m", "hostagent.mooncake_master", "--join", str(tmp_path / "none")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 1 and "no such ready file" in bad.stderr
