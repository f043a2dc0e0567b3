"""One mode of a Mininet testbed run with its holder agent frozen at the start (the e2e tests' "at once").

While the holder is stopped, the first GETs of every requester reach the switches (well
under their retransmit timeout), so every duplicate finds its fragment pending; after
that the multicast answers keep the requesters in step.
"""

from __future__ import annotations

import json
import os
import signal
import threading

from bmv2_topologies.experiment.report import ModeResult
from bmv2_topologies.experiment.testbed import Testbed


def run_with_holder_frozen(bed: Testbed, mode: str, seconds: float = 0.9, holder: str = "h0") -> ModeResult:
    """``bed.run_mode(mode)`` with ``holder``'s agent stopped (SIGSTOP) for its first ``seconds``."""
    holder_pid = json.loads((bed.run_dir / f"{holder}.ready").read_text())["pid"]
    os.kill(holder_pid, signal.SIGSTOP)
    thaw = threading.Timer(seconds, os.kill, (holder_pid, signal.SIGCONT))
    thaw.start()
    try:
        return bed.run_mode(mode)
    finally:
        thaw.join()
        os.kill(holder_pid, signal.SIGCONT)
