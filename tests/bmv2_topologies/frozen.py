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
from collections.abc import Callable

from bmv2_topologies.experiment.report import ModeResult
from bmv2_topologies.experiment.testbed import Testbed


def run_with_holder_frozen(bed: Testbed, mode: str, seconds: float = 0.9, holder: str = "h0") -> ModeResult:
    """``bed.run_mode(mode)`` with ``holder``'s agent stopped (SIGSTOP) for the first ``seconds`` of the replay.

    Stopped when the replay starts, not before the mode's setup (which publishes to the holder
    through its API, and on a busy machine takes longer than ``seconds``): the requesters' GETs
    are then sure to reach the switches while the holder cannot answer.
    """
    holder_pid = json.loads((bed.run_dir / f"{holder}.ready").read_text())["pid"]

    def frozen_replay(result: ModeResult, progress: Callable[[], None] | None) -> None:
        os.kill(holder_pid, signal.SIGSTOP)
        thaw = threading.Timer(seconds, os.kill, (holder_pid, signal.SIGCONT))
        thaw.start()
        try:
            bed._replay(result, progress)
        finally:
            thaw.join()
            os.kill(holder_pid, signal.SIGCONT)

    return bed.run_mode(mode, replay=frozen_replay)
