"""Right bytes or a clear error on the Mininet star: faults, republishes, moves, restarts, in every mode.

Needs root (Mininet). Prints one line per (mode, case), then the last line
``wrong_bytes_returned=<n> stale_served=<n> poisoned_after=<n>`` (all three must be 0; the
exit status is 1 otherwise). See bmv2_topologies/experiment/integrity.py for the cases.

    sudo .venv/bin/python scripts/bench_integrity.py                       # model target
    sudo .venv/bin/python scripts/bench_integrity.py --target bmv2 \
        --cases republish_same,republish_new,readmit_moved,holder_restart  # BMv2 cannot impair links
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The script's flags (defaults from ``IntegrityConfig``)."""
    from bmv2_topologies.experiment.integrity import CASES, IntegrityConfig

    d = IntegrityConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requesters", type=int, default=d.requesters, help="inference hosts (default %(default)s)")
    p.add_argument("--target", choices=["model", "bmv2"], default="model", help="switch target (default model)")
    p.add_argument("--modes", default=",".join(d.modes), help="comma-separated subset of plain,multicast,pool")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--chunks", type=int, default=d.chunks, help="chunks in the prefix (default %(default)s)")
    p.add_argument("--chunk-kib", type=int, default=d.chunk_kib, help="KiB per chunk (default %(default)s)")
    p.add_argument("--rounds", type=int, default=d.rounds, help="fetch rounds under each impairment")
    p.add_argument("--holder-mbps", type=float, default=d.holder_mbps, help="holder link bandwidth")
    p.add_argument("--out", type=Path, default=d.out, help="results.txt and the run's logs go here")
    p.add_argument("--seed", type=int, default=d.seed)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run every case; 0 when no wrong, stale or poisoned bytes were seen."""
    args = build_parser().parse_args(argv)
    from bmv2_topologies.experiment.integrity import IntegrityConfig, run_integrity
    from bmv2_topologies.network import NetworkError, mininet_available

    reason = mininet_available()
    if reason:
        print(f"bench_integrity: {reason}", file=sys.stderr)
        return 1
    cfg = IntegrityConfig(requesters=args.requesters, target=args.target, modes=tuple(args.modes.split(",")),
                          cases=tuple(args.cases.split(",")), chunks=args.chunks, chunk_kib=args.chunk_kib,
                          rounds=args.rounds, holder_mbps=args.holder_mbps, out=args.out, seed=args.seed)
    try:
        cfg.validate()
        results, last = run_integrity(cfg)
    except ValueError as exc:
        print(f"bench_integrity: {exc}", file=sys.stderr)
        return 2
    except (NetworkError, RuntimeError, OSError) as exc:
        print(f"bench_integrity: {exc}", file=sys.stderr)
        return 1
    print(last)
    bad = sum(r.wrong_bytes + r.stale + r.poisoned_after for r in results)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
