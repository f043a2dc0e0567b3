"""The ``kvpool-switch`` command: serves P4Runtime in its own process, checks its options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controller.p4runtime import P4RuntimeSwitch
from switchmodel.cli import main
from tests.paths import P4RT_MINI

MINI = P4RT_MINI


def test_switch_process_serves_a_preloaded_pipeline() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "switchmodel.cli", "--grpc-addr", "127.0.0.1:0",
                             "--device-id", "3", "--p4info", str(MINI)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "device 3 serving P4Runtime on 127.0.0.1:" in line
        address = line.rsplit(" ", 1)[1].strip()
        sw = P4RuntimeSwitch(address, MINI, device_id=3, timeout_s=5, reconnect=False)
        sw.connect(push_pipeline=False)
        assert sw.switch_cookie() is None  # preloaded, not pushed by a controller: no cookie
        sw.insert_entry("pool", {"hdr.kv.key": 1, "sm.ingress_port": 2}, "pool_hit", {"slot": 3, "nfrags": 1})
        assert len(sw.read_entries("pool")) == 1
        sw.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert main(["--json", str(MINI)]) == 2
    assert main(["--p4info", str(tmp_path / "missing.txtpb")]) == 2


def test_a_port_that_fails_ends_the_switch_with_one_line() -> None:
    """Exit 1 and the interface named, and no line saying it serves (a launcher waits for that)."""
    from kvpool.tcp import free_port
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "switchmodel.cli", "--grpc-addr", f"127.0.0.1:{port}",
                           "--interface", "1@kvpool-nosuch0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "kvpool-switch: " in proc.stderr and "kvpool-nosuch0" in proc.stderr
    assert "serving P4Runtime" not in proc.stdout
