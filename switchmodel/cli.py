"""``kvpool-switch``: run the reference switch model behind a P4Runtime gRPC server.

Like ``simple_switch_grpc``, the switch starts without a pipeline; a controller pushes
P4Info + BMv2 JSON with SetForwardingPipelineConfig. ``--p4info`` preloads one instead.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from kvpool import logs
from kvpool.p4rt.p4info import P4Info
from switchmodel import dataplane, metrics
from switchmodel.p4rt_server import P4RuntimeServer
from switchmodel.ports import PortError
from switchmodel.state import SwitchState


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the switch's options on ``parser``."""
    parser.add_argument("--grpc-addr", default="127.0.0.1:9559",
                        help="P4Runtime listen address host:port (default %(default)s; port 0 picks a free one)")
    parser.add_argument("--device-id", type=int, default=1, help="P4Runtime device id (default %(default)s)")
    parser.add_argument("--p4info", type=Path, help="preload this P4Info (text or binary) as the pipeline")
    parser.add_argument("--json", type=Path, help="BMv2 JSON to preload with --p4info (default actions come from it)")
    parser.add_argument("--log-level", default="warning", choices=logs.LEVELS)
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS,
                        help="text (timestamp, level, component, message, key=value) or json (one object per line)")
    parser.add_argument("--metrics", metavar="HOST:PORT",
                        help="serve the model's own counters (ports, impairments) for Prometheus at "
                        "http://HOST:PORT/metrics (port 0 picks one; the P4 counters are the controller's to export)")
    dataplane.add_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool-switch`` argument parser."""
    parser = argparse.ArgumentParser(prog="kvpool-switch",
                                     description="Run the kvpool reference switch model behind P4Runtime (gRPC).")
    add_arguments(parser)
    return parser


def make_state(args: argparse.Namespace) -> SwitchState:
    """A switch state from the parsed options, with the preloaded pipeline if any."""
    state = SwitchState(device_id=args.device_id)
    if args.p4info is not None:
        device_config = args.json.read_bytes() if args.json is not None else b""
        state.set_pipeline(P4Info.load(args.p4info), device_config)
    return state


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM."""
    logs.configure(args.log_format, args.log_level)
    if args.json is not None and args.p4info is None:
        print("kvpool-switch: --json needs --p4info", file=sys.stderr)
        return 2
    for path in (args.p4info, args.json):
        if path is not None and not path.is_file():
            print(f"kvpool-switch: {path}: no such file", file=sys.stderr)
            return 2
    try:
        specs = dataplane.port_specs(args)
        impair = dataplane.impair_specs(args)
    except ValueError as e:
        print(f"kvpool-switch: {e}", file=sys.stderr)
        return 2
    # Pure-Python protobuf (protobuf < 3.21 on Python 3.11) allocates many small objects per
    # message; the default GC thresholds then spend more time collecting than decoding a batch.
    gc.set_threshold(50_000, 20, 20)
    try:
        state = make_state(args)
    except (OSError, ValueError) as e:
        print(f"kvpool-switch: {e}", file=sys.stderr)
        return 1
    # The ports first, the P4Runtime listener last: a launcher that waits for the port to
    # listen then knows the switch is whole, and a port that fails ends the process before
    # anyone connects to a switch that is about to vanish.
    try:
        plane = dataplane.start(state, specs, keep_offloads=args.keep_offloads, impair=impair,
                                impair_file=args.impair_file)
    except PortError as e:
        print(f"kvpool-switch: {e}", file=sys.stderr)
        return 1
    try:
        server = P4RuntimeServer(state, args.grpc_addr).start()
    except (OSError, ValueError) as e:
        plane.stop()
        print(f"kvpool-switch: {e}", file=sys.stderr)
        return 1
    host = args.grpc_addr.rsplit(":", 1)[0]
    # One line on stdout so a parent process can learn the port when it asked for port 0.
    print(f"kvpool-switch: device {args.device_id} serving P4Runtime on {host}:{server.port}", flush=True)
    if args.metrics is not None:
        try:
            _, http = metrics.serve(args.metrics, plane.ports)
        except (OSError, ValueError) as e:
            plane.stop()
            server.stop()
            print(f"kvpool-switch: --metrics {args.metrics}: {e}", file=sys.stderr)
            return 1
        print(f"kvpool-switch: metrics on http://{args.metrics.rpartition(':')[0]}:{http.server_port}/metrics",
              flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    plane.stop()
    server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvpool-switch`` console script."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
