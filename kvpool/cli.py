"""``kvpool``: the umbrella command (``kvpool sim``, ``kvpool demo``, ...).

Each subcommand lives in the module that owns it and exposes two functions,
``add_arguments(parser)`` and ``run(args) -> int``; this file only maps names to modules,
imported lazily so ``kvpool --help`` does not pay for torch or Mininet.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence

#: subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("bmv2_topologies.demo", "the end-to-end Mininet experiment: one stream, plain / multicast / pool"),
    "agent": ("hostagent.cli", "run a host agent (holder + requester, local HTTP API)"),
    "sim": ("controller.sim.cli", "replay a prefix-reuse trace over a modelled cluster"),
    "why": ("bmv2_topologies.why", "where the time of a replay's requests went, per mode (from kvpool demo --out)"),
    "experiment": ("bmv2_topologies.research", "answer a research question (q1-q4, fig9, ttft): table, plot, JSON"),
    "workload": (
        "kvpool.workloads",
        "generate a seeded trace of one traffic family (tool, docqa, chat, synthetic, sysprompt)",
    ),
    "switch": ("switchmodel.cli", "run the reference switch model (P4Runtime server, packet I/O)"),
    "ctl": ("controller.ctl", "operate the pool through the controller daemon's API"),
    "report": ("kvpool.report", "render the docs' result tables from results/*.json; --check, --add RUN_DIR --as NAME"),
    "mooncake": ("hostagent.mooncake_master", "run a Mooncake Store pool (master + store node) until stopped"),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool`` argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="kvpool", description="In-network KV-cache pool for LLM inference.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C: every ``with`` and ``finally`` runs (networks stopped, daemons ended)."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvpool`` console script."""
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # Without it a plain ``kill`` (or a CI timeout) ends the process where it stands and
        # leaves the demo's switch, agents and Mininet links behind.
        signal.signal(signal.SIGTERM, _terminated)
    try:
        return int(args._module.run(args))
    except KeyboardInterrupt:
        print("kvpool: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
