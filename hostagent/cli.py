"""Run a kvpool host agent: holder and requester over kvpool UDP, with a local HTTP API (``kvpool-agent``).

Settings come from defaults, then the ``[agent]`` table of ``--config FILE`` (TOML), then
flags.  The agent runs until SIGTERM or SIGINT, then closes its sockets, joins its
threads and exits 0.  ``--ready-file`` receives a JSON line ``{"pid", "udp", "api_url",
"tiers"}`` once every socket is bound (useful with port 0).

Example::

    kvpool-agent --udp-port 7470 --api-port 7471 --dram-bytes 4GiB
    curl -s http://127.0.0.1:7471/v1/stats
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from hostagent.daemon import BACKENDS, Agent, AgentConfig, load_config
from kvpool import logs
from kvpool.config import ConfigError

_SIZE = re.compile(r"^(\d+)\s*(|k|m|g|t|kb|mb|gb|tb|kib|mib|gib|tib)$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"64MiB"``, ``"1g"``, ``"4096"`` to bytes (binary units)."""
    m = _SIZE.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"size must be a number with an optional unit (KiB, MiB, GiB), got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)[:1].lower()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the agent's flags (also used by ``kvpool agent``)."""
    parser.add_argument("--config", type=Path, help="TOML file with an [agent] table (flags override it)")
    parser.add_argument("--host", help="address of the UDP sockets (default 127.0.0.1)")
    parser.add_argument("--udp-port", type=int, help="kvpool UDP port peers send GETs to (default 7470; 0 = any)")
    parser.add_argument("--api-host", help="address of the HTTP API (default 127.0.0.1; keep it on loopback)")
    parser.add_argument("--api-port", type=int, help="HTTP API port (default 7471; 0 = any)")
    parser.add_argument("--dram-bytes", type=parse_size,
                        help="host DRAM tier capacity (default 1GiB; 0 with --backend: serve from the backend)")
    parser.add_argument("--record-cache-bytes", type=parse_size,
                        help="DATA records a holder keeps to answer hot chunks from without copying them "
                             "again (default 256MiB; 0: none)")
    parser.add_argument("--gpu-bytes", type=parse_size, help="GPU tier capacity, used only with CUDA (default 0)")
    parser.add_argument("--backend", choices=BACKENDS, help="lowest tier below DRAM (default none)")
    parser.add_argument("--mooncake-master", help="Mooncake master RPC address host:port (backend mooncake)")
    parser.add_argument("--mooncake-metadata-url", help="Mooncake HTTP metadata URL (backend mooncake)")
    parser.add_argument("--mooncake-segment",
                        help="store node segment host:port to keep published chunks on (backend mooncake)")
    parser.add_argument("--rate", dest="rate_bytes_per_s", type=parse_size,
                        help="pace DATA sent to peers at this many bytes/s (default unpaced)")
    parser.add_argument("--burst", dest="burst_bytes", type=parse_size,
                        help="pacing token bucket depth in bytes (default 256KiB)")
    parser.add_argument("--max-queue", dest="max_queue_s", type=float,
                        help="seconds of paced sending a holder queues before it answers GETs BUSY with a retry "
                        "hint (default 1; 0: bounded by fragments only)")
    parser.add_argument("--gather", dest="gather_s", type=float,
                        help="seconds a holder waits before it answers the head of a chunk the controller calls "
                        "hot, so the GETs of a wave meet at a switch (default 0)")
    parser.add_argument("--window", dest="window_fragments", type=int, help="fragments in flight per request")
    parser.add_argument("--servable-window", dest="servable_window", type=int,
                        help="fragments in flight per request for a chunk the switches pool and answer at once, in "
                        "bursts their queues must hold (default 0: --window)")
    parser.add_argument("--max-inflight", dest="max_inflight_fragments", type=int,
                        help="fragments in flight over all requests")
    parser.add_argument("--retransmit-timeout", dest="retransmit_timeout_s", type=float,
                        help="seconds of silence before re-asking for missing fragments")
    parser.add_argument("--give-up", dest="give_up_s", type=float, help="seconds of silence before a fetch fails")
    parser.add_argument("--integrity-retries", dest="integrity_retries", type=int,
                        help="rounds of re-asking for a chunk that failed its integrity checks before the fetch "
                        "fails (default 3)")
    parser.add_argument("--api-socket", help="also serve the API on this Unix socket path (reachable from other "
                        "network namespaces)")
    parser.add_argument("--single-gets", action="store_true", default=None,
                        help="one GET per fragment for every chunk, so a switch can serve and coalesce them "
                        "(default: range GETs, single GETs only for chunks the controller's hints name)")
    parser.add_argument("--no-shared-transfers", dest="share_transfers", action="store_false", default=None,
                        help="every fetch transfers its own copy (default: concurrent fetches of one chunk share "
                        "one transfer)")
    parser.add_argument("--no-udp-offload", dest="udp_offload", action="store_false", default=None,
                        help="one send and one receive call per datagram (default: UDP GSO and GRO where the "
                        "kernel and the path take them, falling back on their own)")
    parser.add_argument("--fetch-timeout", dest="fetch_timeout_s", type=float, help="default deadline of one fetch")
    parser.add_argument("--controller", help="controller API to register with (http://HOST:PORT or unix:/PATH)")
    parser.add_argument("--node-id", help="node id in the controller's directory (default: host name)")
    parser.add_argument("--role", choices=["holder", "inference"], help="directory role (default holder)")
    parser.add_argument("--advertise", help="address registered in the directory (default: --host)")
    parser.add_argument("--pool-bytes", type=parse_size,
                        help="capacity declared to the directory for the tier below DRAM (default 1TiB)")
    parser.add_argument("--allow", action="append", default=None, metavar="ADDR|CIDR",
                        help="answer GETs from these requesters besides loopback and nodes registered with the "
                        "controller (repeat; e.g. 10.0.0.0/24)")
    parser.add_argument("--no-verify-requesters", dest="verify_requesters", action="store_false", default=None,
                        help="answer GETs from any source (DATA goes to whatever source a GET names)")
    parser.add_argument("--source-budget", type=float,
                        help="fragments per second sent to one requester (default: the pacing rate, else 100000)")
    parser.add_argument("--serve-window", type=int,
                        help="most fragments one GET is answered with (default: --window)")
    parser.add_argument("--token-file", help="token that mutating API calls must present, made on first start "
                        "(default $KVPOOL_TOKEN_FILE, else $XDG_RUNTIME_DIR/kvpool/token or ~/.config/kvpool/token)")
    parser.add_argument("--api-workers", type=int, help="API requests served at once (default 64)")
    parser.add_argument("--api-timeout", dest="api_timeout_s", type=float,
                        help="seconds a request head, a body read or an answer write may stall (default 10)")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="logging level")
    parser.add_argument("--log-format", choices=logs.FORMATS,
                        help="text (default: timestamp, level, component, message, key=value) or json (one object "
                        "per line), kvpool.logs")
    parser.add_argument("--log-file", type=Path, help="log here instead of stderr")
    parser.add_argument("--ready-file", type=Path, help="write a JSON line with pid and bound addresses here")


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """Defaults, then the config file, then flags."""
    cfg = load_config(args.config)
    overrides = {name: getattr(args, name, None) for name in (
        "host", "udp_port", "api_host", "api_port", "api_socket", "dram_bytes", "gpu_bytes", "backend",
        "record_cache_bytes",
        "mooncake_master", "mooncake_metadata_url", "mooncake_segment", "rate_bytes_per_s", "burst_bytes",
        "max_queue_s", "gather_s", "window_fragments", "servable_window", "max_inflight_fragments",
        "retransmit_timeout_s", "give_up_s", "fetch_timeout_s", "log_level", "log_format", "controller", "node_id",
        "role", "advertise", "pool_bytes", "single_gets", "share_transfers", "udp_offload", "token_file",
        "api_workers", "api_timeout_s",
        "integrity_retries", "verify_requesters", "allow", "source_budget", "serve_window")}
    if overrides["rate_bytes_per_s"] is not None:
        overrides["rate_bytes_per_s"] = float(overrides["rate_bytes_per_s"])
    cfg = cfg.replace(**overrides)
    cfg.validate()
    return cfg


def run(args: argparse.Namespace) -> int:
    """Run an agent until SIGTERM/SIGINT; 0 on a clean stop, 2 on a bad configuration, 1 if it cannot start."""
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        print(f"kvpool-agent: {exc}", file=sys.stderr)
        return 2
    handler = logs.configure(cfg.log_format, cfg.log_level, logger="kvpool", path=args.log_file)
    root = logging.getLogger("kvpool")
    log = logging.getLogger("kvpool.agent")

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        """Ask the main loop to stop (the handler itself does nothing slow)."""
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent = Agent(cfg)
        agent.start()
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"kvpool-agent: cannot start: {exc}", file=sys.stderr)
        return 1
    try:
        info = agent.ready_info()
        if args.ready_file is not None:
            tmp = args.ready_file.with_suffix(args.ready_file.suffix + ".tmp")
            tmp.write_text(json.dumps(info) + "\n")
            tmp.replace(args.ready_file)  # atomic: a watcher never reads half a line
        log.info("ready", extra=logs.kv(**info))
        while not stop.wait(1.0):
            pass
    finally:
        agent.stop()
        root.removeHandler(handler)
        handler.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool-agent`` argument parser."""
    parser = argparse.ArgumentParser(prog="kvpool-agent", description=(__doc__ or "").strip().splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Endpoints of the local API: see hostagent/api.py.")
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvpool-agent`` console script."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
