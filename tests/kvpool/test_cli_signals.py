"""``kvpool``: a SIGTERM unwinds the subcommand like Ctrl-C, so what it started is stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

# A stand-in subcommand: announces it runs, then waits in a ``finally`` that records the cleanup.
_SCRIPT = """
import sys, time, types
from kvpool import cli
mod = types.ModuleType("fake")
mod.add_arguments = lambda p: None
def run(args):
    try:
        print("running", flush=True)
        time.sleep(60)
    finally:
        open(sys.argv[1], "w").write("cleaned up")
    return 0
mod.run = run
sys.modules["fake"] = mod
cli.SUBCOMMANDS["fake"] = ("fake", "a test subcommand")
sys.exit(cli.main(["fake"]))
"""


def test_sigterm_runs_the_subcommands_cleanup_and_exits_143(tmp_path: Path) -> None:
    marker = tmp_path / "cleanup"
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 128 + signal.SIGTERM
    assert marker.read_text() == "cleaned up"  # the finally ran: networks and daemons would be stopped
