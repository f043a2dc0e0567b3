"""scripts/udp_blast.py, the reference blast bench_hostagent holds the agent against: it counts what arrived."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.paths import SCRIPTS

SCRIPT = SCRIPTS / "udp_blast.py"


@pytest.mark.parametrize("extra", [[], ["--gso", "--flows", "2"]], ids=["per-datagram", "gso-2-flows"])
def test_blast_counts_whole_datagrams(extra: list[str]) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--count", "500", "--size", "1448", *extra],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    got = json.loads(out.splitlines()[-1])
    flows = 2 if extra else 1
    assert 0 < got["packets"] <= 500 * flows  # loopback may drop under load, never invent
    assert got["bytes"] == got["packets"] * 1448
    assert got["seconds"] >= 0 and got["mbps"] >= 0


def test_bad_arguments_say_so() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--count", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--count" in run.stderr
