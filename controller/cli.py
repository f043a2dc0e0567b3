"""``kvpool-controller``: program a topology's switches and run the pool policy until stopped.

Example (switch addresses as the Mininet builder prints them)::

    kvpool-controller --topology bmv2_topologies/star.json --switch s1=127.0.0.1:50051@1 \\
        --catalog chunks.json --holder-api unix:/tmp/kvpool/h0.sock --mode pool

Settings come from an optional TOML file (``--config``; keys as the long options, with
underscores) overridden by flags. SIGTERM or SIGINT ends it cleanly: the current epoch
finishes, the P4Runtime connections close, exit status 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("kvpool.controller")


def _switch(text: str) -> tuple[str, str, int]:
    """Parse ``NAME=HOST:PORT[@DEVICE_ID]``."""
    try:
        name, rest = text.split("=", 1)
        addr, _, dev = rest.partition("@")
        int(addr.rsplit(":", 1)[1])
        return name, addr, int(dev) if dev else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"--switch {text!r}: expected NAME=HOST:PORT[@DEVICE_ID]") from None


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool-controller`` argument parser."""
    p = argparse.ArgumentParser(prog="kvpool-controller", description=(__doc__ or "").splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="TOML file with defaults for the options below")
    p.add_argument("--topology", type=Path, help="topology JSON (bmv2_topologies/*.json)")
    p.add_argument("--switch", action="append", type=_switch, default=None, metavar="NAME=HOST:PORT[@ID]",
                   help="P4Runtime address of a switch of the topology (repeat per switch)")
    p.add_argument("--mode", choices=["plain", "multicast", "pool"], help="how much the switches help (default pool)")
    p.add_argument("--catalog", type=Path, help="chunk catalog JSON (key, parent, position, nbytes)")
    p.add_argument("--holder-api", help="holder agent API URL asked to push admitted chunks (http:// or unix:)")
    p.add_argument("--p4info", type=Path, help="P4Info (default p4/build/kvpool.p4info.txtpb)")
    p.add_argument("--bmv2-json", type=Path, help="BMv2 JSON pushed with the P4Info (default p4/build/kvpool.json)")
    p.add_argument("--epoch", type=float, help="seconds per policy epoch (default 0.5)")
    p.add_argument("--threshold", type=int, help="missed GETs before the switch reports a chunk hot (default 4)")
    p.add_argument("--pending-timeout-us", type=int, help="how long a pending GET absorbs duplicates")
    p.add_argument("--status-file", type=Path, help="write the controller status as JSON here every epoch")
    p.add_argument("--api", metavar="HOST:PORT",
                   help="serve the operator/agent API (controller.api, used by kvpool-ctl) on this TCP address, "
                        "e.g. 127.0.0.1:7480")
    p.add_argument("--api-socket", type=Path, metavar="PATH",
                   help="also serve the API on this Unix socket (agents inside Mininet hosts reach it there)")
    p.add_argument("--target", choices=["bmv2", "model"], help="what the switches run (shown by kvpool-ctl status)")
    p.add_argument("--heartbeat-timeout", type=float,
                   help="seconds without a heartbeat before an agent is marked down (default 3)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    return p


def _merged(args: argparse.Namespace) -> dict[str, Any]:
    """TOML defaults overridden by the flags that were given."""
    cfg: dict[str, Any] = {}
    if args.config is not None:
        try:
            cfg = tomllib.loads(args.config.read_text())
        except FileNotFoundError:
            raise SystemExit(f"kvpool-controller: --config {args.config}: no such file") from None
        except tomllib.TOMLDecodeError as exc:
            raise SystemExit(f"kvpool-controller: --config {args.config}: {exc}") from None
    for key, value in vars(args).items():
        if key != "config" and value is not None:
            cfg[key] = value
    if "switch" in cfg and cfg["switch"] and isinstance(cfg["switch"][0], str):
        cfg["switch"] = [_switch(s) for s in cfg["switch"]]
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kvpool-controller``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = _merged(args)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=getattr(logging, str(cfg.get("log_level", "info")).upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for required in ("topology", "switch"):
        if not cfg.get(required):
            parser.error(f"--{required} is required (or set it in --config)")

    from controller.daemon import (
        Catalog,
        Controller,
        ControllerError,
        ControllerSettings,
        Mode,
        SwitchEndpoint,
    )
    from controller.fabric import FabricSettings
    from controller.p4runtime import SwitchUnreachableError, WriteError
    from kvpool.topology import TopologyError, load

    try:
        topo = load(cfg["topology"])
        fabric = FabricSettings(
            popularity_threshold=int(cfg.get("threshold", FabricSettings.popularity_threshold)),
            pending_timeout_us=int(cfg.get("pending_timeout_us", FabricSettings.pending_timeout_us)),
        )
        settings = ControllerSettings(mode=Mode(cfg.get("mode", "pool")), fabric=fabric,
                                      epoch_s=float(cfg.get("epoch", 0.5)),
                                      heartbeat_timeout_s=float(cfg.get("heartbeat_timeout", 3.0)),
                                      target=str(cfg.get("target", "unknown")))
        if "p4info" in cfg:
            settings.p4info = Path(cfg["p4info"])
        if "bmv2_json" in cfg:
            settings.bmv2_json = Path(cfg["bmv2_json"])
        if not settings.p4info.exists():
            raise ControllerError(f"P4Info {settings.p4info} not found (build p4/ with `make -C p4`)")
        catalog = Catalog.load(Path(cfg["catalog"])) if cfg.get("catalog") else Catalog()
        filler = None
        if cfg.get("holder_api"):
            from controller.daemon import HolderPushClient

            filler = HolderPushClient(str(cfg["holder_api"]), fabric.fill_sink)
        endpoints = [SwitchEndpoint(name, addr, dev) for name, addr, dev in cfg["switch"]]
        controller = Controller(topo, endpoints, settings, catalog, filler).start()
    except (TopologyError, ControllerError, SwitchUnreachableError, WriteError, OSError) as exc:
        print(f"kvpool-controller: {exc}", file=sys.stderr)
        return 1
    api = None
    if cfg.get("api") or cfg.get("api_socket"):
        from controller.api import DEFAULT_PORT, ControllerAPI

        host, _, port = str(cfg.get("api") or f"127.0.0.1:{DEFAULT_PORT}").rpartition(":")
        try:
            sock = Path(cfg["api_socket"]) if cfg.get("api_socket") else None
            api = ControllerAPI(controller, host or "127.0.0.1", int(port), sock).start()
        except (OSError, ValueError) as exc:
            controller.close()
            print(f"kvpool-controller: --api {cfg.get('api')}: cannot serve there ({exc})", file=sys.stderr)
            return 1
        log.info("API on %s%s", api.url, f" and unix:{sock}" if sock else "")

    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after this epoch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    status_file: Path | None = Path(cfg["status_file"]) if cfg.get("status_file") else None

    def on_epoch(_report: object) -> None:
        if status_file is not None:
            tmp = status_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(controller.status()) + "\n")
            tmp.replace(status_file)

    log.info("controlling %d switch(es) in mode %s; %d chunks in the catalog", len(endpoints), settings.mode,
             len(catalog))
    try:
        controller.run(stop, on_epoch)
    except (ControllerError, WriteError) as exc:
        print(f"kvpool-controller: {exc}", file=sys.stderr)
        return 1
    finally:
        if api is not None:
            api.stop()
        controller.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
