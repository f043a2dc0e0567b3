"""``kvpool experiment q1|q2|q3|q4|fig9``: run one research question, write its table, JSON and plot.

Writes ``<out>/<question>/table.txt`` (also printed), ``result.json`` and ``plot.png``.
``--quick`` is the reduced run the test suite uses (under a minute); full runs take at most
about 10 minutes on two cores. The shared Mooncake trace is found next to the checkout
(``shared/data/mooncake/``) or named by ``--trace``; without it the experiments run on the
generated families only and say so.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

QUESTIONS = {
    "q1": "admission: what deserves the switch pool (policies x sizes x families)",
    "q2": "tier flow: when KV moves between GPU HBM, host DRAM, the switch and the holders",
    "q3": "value recovery: what demoting evicted KV recovers and what it costs",
    "q4": "cost and benefit at scale: where the pool starts and stops paying",
    "fig9": "Mooncake's cache-capacity curve reproduced on the shared trace",
}


def add_arguments(parser: argparse.ArgumentParser, extra: dict[str, str] | None = None) -> None:
    """Register ``kvpool experiment`` options; ``extra`` adds questions answered elsewhere (name: help)."""
    questions = QUESTIONS | (extra or {})
    parser.add_argument(
        "question", choices=sorted(questions), help="; ".join(f"{k}: {v}" for k, v in questions.items())
    )
    parser.add_argument("--quick", action="store_true", help="reduced run (under a minute), as the tests use")
    parser.add_argument("--out", type=Path, default=Path("results"), help="results folder (default results/)")
    parser.add_argument(
        "--trace", type=Path, help="the Mooncake conversation trace (default: found next to the checkout)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated workloads (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def execute(question: str, quick: bool, out: Path, trace: Path | None = None, seed: int = 0,
            quiet: bool = True) -> dict[str, Any]:
    """Run ``question`` and write its files; returns the result (as written to result.json)."""
    from controller.sim.experiments.common import Context
    from kvpool.trace import find_shared_trace

    mod = importlib.import_module(f"controller.sim.experiments.{question}")
    path = trace if trace is not None else find_shared_trace()

    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    res: dict[str, Any] = mod.run(Context(quick=quick, trace_path=path, seed=seed, log=log))
    res["quick"] = quick
    res["runtime_s"] = time.perf_counter() - t0
    res["trace_path"] = str(path) if path is not None else None
    folder = out / question
    folder.mkdir(parents=True, exist_ok=True)
    text = mod.table(res)
    (folder / "table.txt").write_text(text + "\n")
    (folder / "result.json").write_text(json.dumps(res, indent=1) + "\n")
    mod.plot(res, folder / "plot.png")
    return res


def run(args: argparse.Namespace) -> int:
    """Run the experiment; 2 on bad input."""
    if args.trace is not None and not args.trace.is_file():
        print(f"kvpool experiment: error: --trace {args.trace} is not a file", file=sys.stderr)
        return 2
    try:
        res = execute(args.question, args.quick, args.out, args.trace, args.seed, args.quiet)
    except OSError as exc:
        print(f"kvpool experiment: error: cannot write into {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    mod = importlib.import_module(f"controller.sim.experiments.{args.question}")
    print(mod.table(res))
    if res["trace_path"] is None:
        print("(the shared Mooncake trace was not found: generated families only)")
    print(f"{args.question}: {res['runtime_s']:.0f} s; files in {args.out / args.question}/")
    return 0
