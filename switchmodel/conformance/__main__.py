"""P4Runtime conformance probe: the same P4Info-generated calls to any target, every answer kept.

``python -m switchmodel.conformance --target bmv2 --record FILE`` records BMv2's answers;
``--target model`` prints the model's; ``--compare FILE`` prints the calls on which a
target differs from a recorded file (exit 1 on a difference not in KNOWN_DIFFERENCES).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from kvpool import contract
from kvpool.p4rt.p4info import P4Info
from switchmodel.conformance.golden import (
    KNOWN_DIFFERENCES,
    bmv2_target,
    bmv2_version,
    compare,
    load_golden,
    model_target,
    save_golden,
)
from switchmodel.conformance.probe import probe_all
from switchmodel.targets import TargetError, find_simple_switch_grpc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchmodel.conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("model", "bmv2"), default="model")
    parser.add_argument("--p4info", type=Path, default=contract.P4INFO_PATH)
    parser.add_argument("--device-config", type=Path, default=contract.BMV2_JSON_PATH)
    parser.add_argument("--record", type=Path, metavar="FILE", help="write the answers to FILE (a golden file)")
    parser.add_argument("--compare", type=Path, metavar="FILE", help="print the calls answered unlike FILE")
    args = parser.parse_args(argv)
    p4info = P4Info.load(args.p4info)
    target: Callable[[], contextlib.AbstractContextManager[str]]
    if args.target == "bmv2":
        binary = find_simple_switch_grpc()
        if binary is None:
            print("simple_switch_grpc is neither on PATH nor in /opt/bmv2/bin", file=sys.stderr)
            return 2
        logs = Path(tempfile.mkdtemp(prefix="kvpool-conformance-"))
        label = f"bmv2 ({bmv2_version(binary)})"

        def target() -> contextlib.AbstractContextManager[str]:
            return bmv2_target(binary, logs)
    else:
        label = "model"
        target = model_target
    try:
        with target() as address:
            answers = probe_all(address, args.p4info, args.device_config)
    except (OSError, TargetError) as e:
        print(f"cannot start {args.target}: {e}", file=sys.stderr)
        return 2
    if args.record:
        save_golden(args.record, answers, p4info, label)
        print(f"recorded {len(answers)} answers of {label} in {args.record}")
    if args.compare:
        diffs, missing = compare(load_golden(args.compare)["answers"], answers)
        for d in diffs:
            print(f"DIFFERS {'(known) ' if d.name in KNOWN_DIFFERENCES else ''}{d}")
        for name in missing:
            print(f"NO REFERENCE {name}")
        print(f"{len(answers)} calls, {len(diffs)} answered differently, {len(missing)} without a reference")
        return 1 if missing or any(d.name not in KNOWN_DIFFERENCES for d in diffs) else 0
    if not args.record:
        for name, answer in answers:
            print(f"{name}: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
