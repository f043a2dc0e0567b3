"""``kvpool why``: where the time of a replay's requests went, per mode, from its results directory.

Reads ``request_timing.json`` (and ``results.json``) that ``kvpool demo`` wrote into its
``--out`` directory and prints, per mode (plain, multicast, pool): the request latency
(p50/p99); per request, summed over its chunks, the mean and p99 of the time queued at the
requester, waiting for the first byte, streaming, and, inside those, refused (BUSY) and
waiting out retransmit timeouts; retransmit rounds and BUSY NACKs; the share of fragments
that came as coalesced replicas or were served by a switch; how long each holder's answers
waited in its send queue (holds apart); the switches' port backlog; and which component
dominates.  docs/guide/experiments.md ("Where the time goes") says how to read it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bmv2_topologies.experiment.why import TIMING_FILE, WhyError, render


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``kvpool why``."""
    p.epilog = " ".join((__doc__ or "").split("\n\n")[1].replace("``", "").split())
    p.add_argument("results_dir", type=Path, metavar="RESULTS_DIR",
                   help=f"a replay's results directory (kvpool demo --out; holds {TIMING_FILE} and results.json)")


def run(args: argparse.Namespace) -> int:
    """Print the breakdown; 1 with a one-line error when the directory cannot be read."""
    try:
        text = render(args.results_dir)
    except WhyError as exc:
        print(f"kvpool why: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0
