"""``kvpool experiment q1|q2|q3|q4|fig9|ttft``: run one research question, write its table, JSON and plot.

q1-q4 and fig9 run on the trace-driven simulator (``controller.sim.experiments.cli``, which
this command wraps); ttft runs a real model on every host of the Mininet star
(``bmv2_topologies.experiment.ttft``, root only). Each writes ``<out>/<question>/table.txt``
(also printed), ``result.json`` and ``plot.png``; ``--quick`` is the reduced run of the
test suite (under a minute).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from bmv2_topologies.experiment.ttft_config import ENGINES, SCHEMES, VLLM_BLOCK_TOKENS, TtftConfig
from controller.sim.experiments import cli as sim_cli

TTFT_HELP = "TTFT of a real model on the Mininet star: full prefill vs the prefix's KV fetched through kvpool (root)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``kvpool experiment`` options: the simulator's, plus ttft's own."""
    sim_cli.add_arguments(parser, extra={"ttft": TTFT_HELP})
    d = TtftConfig()
    g = parser.add_argument_group("ttft only")
    g.add_argument("--target", choices=["model", "bmv2"],
                   help="switch target (default model, whatever is installed: docs/research/README.md says why)")
    g.add_argument("--requesters", help=f"comma-separated requester counts (default "
                   f"{','.join(map(str, d.requesters))}; --quick: 1,2)")
    g.add_argument("--holder-mbps", type=float, help=f"holder link bandwidth (default {d.holder_mbps:g})")
    g.add_argument("--waves", type=int, help=f"waves per requester count and mode (default {d.waves}; --quick: 1)")
    g.add_argument("--engine", choices=ENGINES, default="transformers",
                   help="what runs the model on every requester: transformers driven by hand (default) or vLLM "
                   f"with kvpool's KV connector (the vLLM venv, scripts/setup_vllm.sh; {VLLM_BLOCK_TOKENS}-token "
                   "chunks)")
    g.add_argument("--schemes", help=f"compute schemes, comma-separated subset of {','.join(SCHEMES)} (default both; "
                   "--quick: serial)")


def ttft_config(args: argparse.Namespace) -> TtftConfig:
    """The ttft configuration the flags ask for, validated (ValueError names the first bad flag)."""
    cfg = TtftConfig.for_quick() if args.quick else TtftConfig()
    changes: dict[str, object] = {"seed": args.seed}
    engine = getattr(args, "engine", "transformers")
    if engine != "transformers":
        changes["engine"] = engine
        if cfg.block_tokens % VLLM_BLOCK_TOKENS:
            changes["block_tokens"] = VLLM_BLOCK_TOKENS
    if args.target is not None:
        changes["target"] = args.target
    if args.requesters is not None:
        try:
            changes["requesters"] = tuple(int(x) for x in args.requesters.split(","))
        except ValueError:
            raise ValueError(f"--requesters: not comma-separated numbers: {args.requesters!r}") from None
    if args.holder_mbps is not None:
        changes["holder_mbps"] = args.holder_mbps
    if args.waves is not None:
        changes["waves"] = args.waves
    if args.schemes is not None:
        changes["schemes"] = tuple(args.schemes.split(","))
    cfg = replace(cfg, **changes)  # type: ignore[arg-type]
    cfg.validate()
    return cfg


def run(args: argparse.Namespace) -> int:
    """Run the question; 2 on bad input, 1 when ttft could not run or its tokens differ."""
    if args.question != "ttft":
        return sim_cli.run(args)
    try:
        cfg = ttft_config(args)
    except ValueError as exc:
        print(f"kvpool experiment: error: {exc}", file=sys.stderr)
        return 2
    # Loads torch, transformers, gRPC and the controller: only when ttft runs.
    from bmv2_topologies.experiment.ttft import TtftError, execute, table

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    try:
        res = execute(cfg, args.out, log)
    except TtftError as exc:
        print(f"kvpool experiment: ttft: {exc}", file=sys.stderr)
        return 1
    print(table(res))
    for line in res["errors"] + res["mismatches"]:
        print(f"kvpool experiment: ttft: {line}", file=sys.stderr)
    print(f"ttft: {res['runtime_s']:.0f} s; files in {args.out / 'ttft'}/")
    return 0 if not res["errors"] and not res["mismatches"] else 1
