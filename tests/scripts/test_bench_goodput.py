"""Smoke tests of the agent-process sections of scripts/bench_hostagent.py (goodput, limit, api):
real agents, small data; no timing asserted."""

from __future__ import annotations

import runpy

import pytest

from tests.paths import SCRIPTS

SCRIPT = SCRIPTS / "bench_hostagent.py"


@pytest.mark.slow
def test_goodput_section_runs_and_reports_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    mod = runpy.run_path(str(SCRIPT))
    assert mod["main"](["--mib", "4", "--chunk-kib", "256", "--reps", "1", "--sections", "goodput"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    summary = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)
    assert {"raw_udp_mbps", "agent_goodput_mbps", "goodput_vs_raw_udp"} <= set(summary)
    assert float(summary["goodput_vs_raw_udp"]) > 0 and float(summary["agent_goodput_mbps"]) > 0
    assert lines[-1].startswith("goodput_vs_raw_udp=")
    # The table names both paths, and the agents' transfer counters are reported honestly.
    assert "raw UDP blast" in out and "kvpool agents, UDP transfer" in out and "retransmit GETs" in out
    assert "goodput_vs_raw_udp=" in out.split("load average")[0]  # in the table's notes as well


@pytest.mark.slow
def test_limit_section_reports_fetch_against_the_blasts_mooncake_and_holder_cpu(
        capsys: pytest.CaptureFixture[str]) -> None:
    mod = runpy.run_path(str(SCRIPT))
    assert mod["main"](["--mib", "2", "--chunk-kib", "256", "--reps", "1", "--sections", "limit"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    summary = dict(line.split("=", 1) for line in lines if line.count("=") == 1 and " " not in line.split("=")[0])
    for name in ("fetch_vs_gso_blast", "fetch4_vs_gso_blast", "fetch_vs_udp_blast"):
        assert float(summary[name]) > 0, name
    assert float(summary["holder_cpu_s_per_gib"]) >= 0  # /proc counts in clock ticks: 2 MiB may take none
    # Mooncake's TCP get is measured where mooncake is installed, else skipped with the reason.
    assert "fetch_vs_mooncake_tcp" in summary
    mooncake = summary["fetch_vs_mooncake_tcp"]
    assert mooncake.startswith("skipped (") or float(mooncake) > 0
    assert "GSO+GRO blast, 4 flows" in out and "send calls" in out


@pytest.mark.slow
def test_api_section_compares_the_bodies_with_a_raw_http_peer_and_the_api_before(
        capsys: pytest.CaptureFixture[str]) -> None:
    mod = runpy.run_path(str(SCRIPT))
    assert mod["main"](["--mib", "2", "--chunk-kib", "256", "--reps", "1", "--sections", "api"]) == 0
    out = capsys.readouterr().out
    summary = dict(line.split("=", 1) for line in out.splitlines() if line.count("=") == 1 and " " not in line)
    for op in ("fetch", "publish"):
        for name in (f"api_{op}_vs_raw_http", f"before_{op}_vs_raw_http", f"api_{op}_vs_before",
                     f"api_{op}_body_mbps", f"raw_http_{op}_mbps"):
            assert float(summary[name]) > 0, name
    for name in ("api_fetch_into_vs_fetch", "api_fetch_into_vs_raw_http", "api_fetch_into_body_mbps"):
        assert float(summary[name]) > 0, name
    assert "plain-socket HTTP peer" in out and "agent API at 51f67d3" in out and "into a kept buffer" in out
