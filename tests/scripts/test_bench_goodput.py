"""Smoke test of the goodput section of scripts/bench_hostagent.py (two real agents, small data; no timing asserted)."""

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
