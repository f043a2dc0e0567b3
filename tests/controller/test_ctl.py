"""``kvpool-ctl``: one test per command against a real daemon and the model switch (tests/ctl_harness.py).

Most commands run in-process through ``controller.ctl.main`` (output captured); the
interfaces other checks rely on (``--help``, ``status --json``), the unreachable daemon
and ``shell`` run the installed console script as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller import ctl
from hostagent.registration import ControllerClient, Registration
from kvpool import wire
from kvpool.http_client import JsonClient
from tests.ctl_harness import BIG, OTHER, SMALL, TOPO, TWO, UNKNOWN, Daemon, running
from tests.paths import REPO

ROOT = REPO
CTL = [sys.executable, "-m", "controller.ctl"]
H0, H1 = TOPO.hosts["h0"], TOPO.hosts["h1"]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running(tmp_path) as d:
        yield d


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Daemon]:
    """The daemon and its API without a switch (directory commands; no P4Info needed)."""
    with running(tmp_path, switch=False) as d:
        yield d


def run(daemon: Daemon, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``kvpool-ctl --api URL ARGV...`` in-process: (exit status, stdout, stderr)."""
    try:
        code = ctl.main(["--api", daemon.url, *argv])
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(daemon: Daemon, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(daemon, capsys, *argv, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def cli(*argv: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The console script's module in a subprocess."""
    return subprocess.run([*CTL, *argv], input=stdin, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200"})


# ------------------------------------------------------------------------------------ interfaces
def test_help_lists_every_command() -> None:
    r = cli("--help")
    assert r.returncode == 0
    for command in ("status", "top", "admit", "evict", "pin", "unpin", "quota", "tiers", "stats", "shell"):
        assert command in r.stdout, command
    r = cli("evict", "--help")
    assert "--demote" in r.stdout and "--drop" in r.stdout


def test_status_json_is_one_object_with_switches_and_nodes(daemon: Daemon) -> None:
    r = cli("--api", daemon.url, "status", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["switches"]["s1"]["connected"] is True
    assert doc["nodes"] == {"up": 0, "down": 0}
    assert r.stdout.count("\n") == 1


def test_unreachable_daemon_exits_3_with_one_line(tmp_path: Path) -> None:
    r = cli("--api", f"unix:{tmp_path / 'nothing.sock'}", "status")
    assert r.returncode == ctl.EXIT_DAEMON_UNREACHABLE
    assert r.stdout == "" and r.stderr.count("\n") == 1
    assert "unreachable" in r.stderr and "kvpool-controller" in r.stderr
    r = cli("--api", "http://127.0.0.1:1", "top", "--json")
    assert r.returncode == ctl.EXIT_DAEMON_UNREACHABLE and r.stderr.count("\n") == 1


@pytest.mark.parametrize("argv", [
    [], ["frobnicate"], ["admit"], ["admit", "zz"], ["admit", f"{1 << 64:#x}"], ["evict", "0x1", "--demote", "--drop"],
    ["quota", "1", "0"], ["quota", "-1", "4"], ["top", "--sort", "colour"], ["top", "--limit", "0"],
])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        ctl.main(["--api", "http://127.0.0.1:1", *argv])
    assert e.value.code == ctl.EXIT_USAGE
    assert "kvpool-ctl" in capsys.readouterr().err


def test_bad_api_address_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["--api", "ftp://nowhere", "status"]) == ctl.EXIT_USAGE
    assert "expected http://HOST:PORT or unix:/PATH" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ reads
def test_status_table(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(daemon, capsys, "status")
    assert code == 0
    assert "s1" in out and daemon.switch_address in out and "master" in out
    assert "kvpool.p4info.txtpb (installed)" in out and "nodes 0 up, 0 down" in out and "target model" in out


def test_status_with_a_lost_switch_exits_4(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.stop_event.set()
    daemon.loop.join(timeout=5)
    daemon.server.stop(0)
    code, out, _ = run(daemon, capsys, "status")
    assert code == ctl.EXIT_SWITCH_UNREACHABLE and "DOWN" in out


def test_top_table_json_sort_and_watch(daemon: Daemon, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (SMALL, TWO):
        assert run(daemon, capsys, "admit", f"{key:#x}")[0] == 0
    code, out, _ = run(daemon, capsys, "top")
    assert code == 0 and f"{SMALL:#x}" in out and f"{TWO:#x}" in out and "switch" in out
    doc = run_json(daemon, capsys, "top", "--sort", "hits", "--limit", "1")
    assert doc["sort"] == "hits" and len(doc["chunks"]) == 1
    assert set(doc["chunks"][0]) >= {"key", "value", "hits", "estimate", "tier", "holders"}
    # --watch refreshes --count times from the daemon, then stops by itself.
    calls: list[str] = []
    real_get = JsonClient.get

    def counting_get(self: JsonClient, path: str) -> dict[str, Any]:
        calls.append(path)
        return real_get(self, path)

    monkeypatch.setattr(JsonClient, "get", counting_get)
    code, out, _ = run(daemon, capsys, "top", "--watch", "--count", "3", "--interval", "0.01")
    assert code == 0 and len(calls) == 3 and all(p.startswith("/v1/top") for p in calls)
    assert f"{TWO:#x}" in out


def test_tiers(bare: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon = bare
    client = ControllerClient(daemon.url)
    Registration(client, "h0", H0.address, "holder", {"dram": 2048, "pool": 1 << 20}).register()
    code, out, _ = run(daemon, capsys, "tiers")
    assert code == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip() and ln.split()[0] in
             ("hbm", "dram", "pool", "switch")}
    assert "2.0 KiB" in lines["dram"] and "1.0 MiB" in lines["pool"] and "44.0 KiB" in lines["switch"]
    doc = run_json(daemon, capsys, "tiers")
    assert doc["tiers"]["dram"]["capacity"] == 2048


def test_stats_counts_packets_by_label(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.send(H1, H0, wire.get_packet(UNKNOWN, 0, 2, request_id=3))  # a range GET: coalescable
    code, out, _ = run(daemon, capsys, "stats")
    assert code == 0
    row = next(ln for ln in out.splitlines() if "pool.lookup_miss" in ln)
    assert row.split()[-1] == "1"
    doc = run_json(daemon, capsys, "stats")
    assert doc["switches"]["s1"]["coalesce"]["first"] == 1
    code, out, _ = run(daemon, capsys, "stats", "--all")
    assert "drops.bad_version" in out


def test_stats_with_an_unreachable_switch_exits_4(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.stop_event.set()
    daemon.loop.join(timeout=5)
    daemon.server.stop(0)
    code, out, _ = run(daemon, capsys, "stats")
    assert code == ctl.EXIT_SWITCH_UNREACHABLE and "unreachable: s1" in out


def test_nodes_and_chunk(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    reg = Registration(ControllerClient(daemon.url), "h0", H0.address, "holder", {"pool": 1 << 20})
    reg.register()
    reg.publish([TWO], "pool", 2 * wire.FRAG_PAYLOAD)
    run(daemon, capsys, "admit", f"{TWO:#x}")
    code, out, _ = run(daemon, capsys, "nodes")
    assert code == 0 and "h0" in out and H0.address in out and "up" in out
    code, out, _ = run(daemon, capsys, "chunk", TWO.to_bytes(8, "big").hex())  # bare hex works too
    assert code == 0 and "(switches)" in out and "h0" in out and "pool" in out
    code, _, err = run(daemon, capsys, "chunk", f"{UNKNOWN:#x}")
    assert code == ctl.EXIT_REFUSED and "unknown" in err


# ------------------------------------------------------------------------------------ overrides
def test_admit_and_evict_show_in_the_switch(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(daemon, capsys, "admit", f"{TWO:#x}")
    assert code == 0 and f"admit {TWO:#x} at slot" in out
    assert daemon.pool_entry(TWO) is not None
    code, _, err = run(daemon, capsys, "evict", f"{TWO:#x}", "--demote")
    assert code == ctl.EXIT_REFUSED and err.count("\n") == 1 and "no_lower_tier" in err and "--drop" in err
    assert daemon.pool_entry(TWO) is not None
    code, out, _ = run(daemon, capsys, "evict", f"{TWO:#x}", "--drop")
    assert code == 0 and "(drop)" in out and daemon.pool_entry(TWO) is None
    code, _, err = run(daemon, capsys, "admit", f"{UNKNOWN:#x}")
    assert code == ctl.EXIT_REFUSED and "not in the catalog" in err


def test_pin_unpin_and_pinned_limit(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(daemon, capsys, "pin", f"{BIG:#x}")
    assert code == 0 and f"pin {BIG:#x} at slot" in out and daemon.pool_entry(BIG) is not None
    code, _, err = run(daemon, capsys, "pin", f"{OTHER:#x}")
    assert code == ctl.EXIT_REFUSED and "pin bound" in err and "[pin_limit]" in err
    code, _, err = run(daemon, capsys, "evict", f"{BIG:#x}", "--drop")
    assert code == ctl.EXIT_REFUSED and "unpin it first" in err
    assert run(daemon, capsys, "unpin", f"{BIG:#x}")[0] == 0
    code, _, err = run(daemon, capsys, "unpin", f"{BIG:#x}")
    assert code == ctl.EXIT_REFUSED and "not pinned" in err
    assert daemon.pool_entry(BIG) is not None


def test_quota(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    for key in (SMALL, TWO, OTHER):
        run(daemon, capsys, "admit", f"{key:#x}")
    doc = run_json(daemon, capsys, "quota", "0", "1")
    assert doc["tenant"] == 0 and doc["slots"] == 1 and len(doc["evicted"]) == 2
    assert sum(daemon.pool_entry(k) is not None for k in (SMALL, TWO, OTHER)) == 1
    code, out, _ = run(daemon, capsys, "quota", "0", "off")
    assert code == 0 and "quota of tenant 0: off" in out


# ------------------------------------------------------------------------------------ shell
@pytest.mark.slow
def test_shell_attaches_read_only_and_reads_the_pool(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(daemon, capsys, "admit", f"{TWO:#x}")[0] == 0
    script = "print('ENTRIES', len(list(table_entry['MyIngress.pool.pool_lookup'].read())))\n"
    r = cli("--api", daemon.url, "shell", "s1", stdin=script, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "ENTRIES 2" in r.stdout  # the admitted chunk and the controller's placement mark
    assert "only have read access" in r.stdout  # a backup: the controller keeps the switch
    st = ControllerClient(daemon.url).get("/v1/status")["switches"]["s1"]
    assert st["master"] is True


def test_shell_errors(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(daemon, capsys, "shell", "s9")
    assert code == ctl.EXIT_REFUSED and "no switch 's9'" in err
    daemon.stop_event.set()
    daemon.loop.join(timeout=5)
    daemon.server.stop(0)
    code, _, err = run(daemon, capsys, "shell", "s1", "--timeout", "1")
    assert code == ctl.EXIT_SWITCH_UNREACHABLE and "does not answer" in err
