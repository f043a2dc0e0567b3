"""``kvpool-controller``: program a topology's switches and run the pool policy until stopped.

Example (switch addresses as the Mininet builder prints them)::

    kvpool-controller --topology bmv2_topologies/star.json --switch s1=127.0.0.1:50051@1 \\
        --catalog chunks.json --holder-api unix:/tmp/kvpool/h0.sock --mode pool

Settings come from defaults, then the ``[controller]`` table of an optional TOML file
(``--config``; keys as the long options, with underscores: ``ControllerConfig``), then
flags. A bad setting (an unknown key, a wrong type, a bad value) is one line on stderr and
exit status 2. SIGTERM or SIGINT ends it cleanly: the current epoch finishes, the
P4Runtime connections close, exit status 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvpool import auth, config, logs
from kvpool.config import ConfigError
from kvpool.http_client import check_url

log = logging.getLogger("kvpool.controller")

MODES = ("plain", "multicast", "pool")
TARGETS = ("bmv2", "model", "unknown")
LOG_LEVELS = ("debug", "info", "warning", "error")


def parse_switch(text: str) -> tuple[str, str, int]:
    """``NAME=HOST:PORT[@DEVICE_ID]`` to (name, address, device id); ValueError with a one-line reason."""
    name, eq, rest = text.partition("=")
    addr, _, dev = rest.partition("@")
    host, _, port = addr.rpartition(":")
    if not eq or not name or not host or not port.isdigit() or (dev and not dev.isdigit()):
        raise ValueError(f"switch {text!r}: expected NAME=HOST:PORT[@DEVICE_ID]")
    return name, addr, int(dev) if dev else 1


@dataclass
class ControllerConfig:
    """Every setting of ``kvpool-controller``; TOML keys under ``[controller]`` have the same names."""

    topology: Path | None = None
    """Topology JSON (bmv2_topologies/*.json); required."""
    switch: list[str] = field(default_factory=list)
    """``NAME=HOST:PORT[@DEVICE_ID]`` per switch of the topology; required."""
    mode: str = "pool"
    """plain, multicast or pool."""
    catalog: Path | None = None
    """Chunk catalog JSON (key, parent, position, nbytes)."""
    holder_api: str = ""
    """Holder agent API asked to push chunks into a switch (``http://HOST:PORT`` or ``unix:/PATH``): the
    pool a restarted switch held, chunks moved to a new placement, and with ``push_admitted`` every
    admitted chunk."""
    push_admitted: bool = False
    """Ask the holder to push each chunk as it is admitted, so its next fetch is a hit; otherwise the
    answers that cross its switch fill it (no copy the holder's link would not carry anyway)."""
    agent_api: list[str] = field(default_factory=list)
    """Agent APIs told which chunks to ask for one fragment at a time (hot, pooled): every agent's."""
    p4info: Path | None = None
    """P4Info (default p4/build/kvpool.p4info.txtpb)."""
    bmv2_json: Path | None = None
    """BMv2 JSON pushed with the P4Info (default p4/build/kvpool.json)."""
    epoch: float = 0.5
    """Seconds per policy epoch."""
    threshold: int | None = None
    """Missed GETs before the switch reports a chunk hot (default: the fabric's)."""
    pending_timeout_us: int | None = None
    """How long a pending GET absorbs duplicates (default: the fabric's)."""
    status_file: Path | None = None
    """Write the controller status as JSON here every epoch."""
    api: str = ""
    """Serve the operator/agent API on this ``HOST:PORT``."""
    api_socket: Path | None = None
    """Also serve the API on this Unix socket."""
    target: str = "unknown"
    """What the switches run (bmv2, model), shown by ``kvpool-ctl status``."""
    heartbeat_timeout: float = 3.0
    """Seconds without a heartbeat before an agent is marked down."""
    log_level: str = "info"
    """debug, info, warning or error."""
    log_format: str = "text"
    """``text`` or ``json`` (``kvpool.logs``)."""
    token_file: Path | None = None
    """The token file mutating API calls must present, made at first start (default: kvpool.auth's)."""

    def switches(self) -> list[tuple[str, str, int]]:
        """The parsed ``switch`` entries."""
        try:
            return [parse_switch(s) for s in self.switch]
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first bad or missing setting."""
        if self.topology is None:
            raise ConfigError("--topology is required (or topology in the [controller] table of --config)")
        if not self.switch:
            raise ConfigError("--switch is required (or switch in the [controller] table of --config)")
        self.switches()
        choices = {"mode": MODES, "target": TARGETS, "log_level": LOG_LEVELS, "log_format": logs.FORMATS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("epoch", "heartbeat_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {getattr(self, name)!r}")
        for name in ("threshold", "pending_timeout_us"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name, url in [("holder_api", self.holder_api)] + [("agent_api", a) for a in self.agent_api]:
            if not url:
                continue
            try:
                check_url(url, name)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.api:
            host, _, port = self.api.rpartition(":")
            if not host or not port.isdigit() or int(port) > 0xFFFF:
                raise ConfigError(f"api must be HOST:PORT, got {self.api!r}")


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool-controller`` argument parser."""
    p = argparse.ArgumentParser(prog="kvpool-controller", description=(__doc__ or "").splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="TOML file with a [controller] table of defaults for the options below")
    p.add_argument("--topology", type=Path, help="topology JSON (bmv2_topologies/*.json)")
    p.add_argument("--switch", action="append", default=None, metavar="NAME=HOST:PORT[@ID]",
                   help="P4Runtime address of a switch of the topology (repeat per switch)")
    p.add_argument("--mode", choices=MODES, help="how much the switches help (default pool)")
    p.add_argument("--catalog", type=Path, help="chunk catalog JSON (key, parent, position, nbytes)")
    p.add_argument("--holder-api", help="holder agent API URL asked to push chunks into a switch: a restarted "
                        "switch's pool, moved chunks, admitted ones with --push-admitted (http:// or unix:)")
    p.add_argument("--push-admitted", action="store_true", default=None,
                   help="have the holder push each chunk as it is admitted (default: the answers that cross its "
                        "switch fill it, which costs the holder's link nothing extra)")
    p.add_argument("--agent-api", action="append", default=None, metavar="URL",
                   help="agent API URL told which chunks are hot or pooled, so it asks for them one fragment at a "
                        "time and everything else by range (repeat per agent; http:// or unix:)")
    p.add_argument("--p4info", type=Path, help="P4Info (default p4/build/kvpool.p4info.txtpb)")
    p.add_argument("--bmv2-json", type=Path, help="BMv2 JSON pushed with the P4Info (default p4/build/kvpool.json)")
    p.add_argument("--epoch", type=float, help="seconds per policy epoch (default 0.5)")
    p.add_argument("--threshold", type=int, help="missed GETs before the switch reports a chunk hot (default 4)")
    p.add_argument("--pending-timeout-us", type=int,
                   help="how long a pending GET absorbs duplicates (default 100000); under load set it to at least "
                        "2 x (2 x the holders' --max-queue), the longest an admitted GET waits, or "
                        "waiters absorbed into an expired slot are never answered")
    p.add_argument("--status-file", type=Path, help="write the controller status as JSON here every epoch")
    p.add_argument("--api", metavar="HOST:PORT",
                   help="serve the operator/agent API (controller.api, used by kvpool-ctl) on this TCP address, "
                        "e.g. 127.0.0.1:7480")
    p.add_argument("--api-socket", type=Path, metavar="PATH",
                   help="also serve the API on this Unix socket (agents inside Mininet hosts reach it there)")
    p.add_argument("--target", choices=["bmv2", "model"], help="what the switches run (shown by kvpool-ctl status)")
    p.add_argument("--heartbeat-timeout", type=float,
                   help="seconds without a heartbeat before an agent is marked down (default 3)")
    p.add_argument("--log-level", choices=LOG_LEVELS, default=None)
    p.add_argument("--log-format", choices=logs.FORMATS, default=None,
                   help="text (default: timestamp, level, component, message, key=value) or json (one object per line)")
    p.add_argument("--token-file", type=Path, metavar="PATH",
                   help="token that mutating API calls must present, made on first start (default "
                        "$KVPOOL_TOKEN_FILE, else $XDG_RUNTIME_DIR/kvpool/token or ~/.config/kvpool/token)")
    return p


def config_from_args(args: argparse.Namespace) -> ControllerConfig:
    """Defaults, then the ``[controller]`` table of ``--config``, then the flags given; validated."""
    cfg = ControllerConfig() if args.config is None else config.load(args.config, "controller", ControllerConfig)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cfg) if getattr(args, f.name, None) is not None}
    cfg = dataclasses.replace(cfg, **given)
    cfg.validate()
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kvpool-controller``: 0 on a clean stop, 2 on a bad configuration, 1 if it cannot run."""
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        print(f"kvpool-controller: {exc}", file=sys.stderr)
        return 2
    logs.configure(cfg.log_format, cfg.log_level)

    # Imported once the configuration is known good: --help and a bad flag stay fast.
    from controller.catalog import Catalog
    from controller.daemon import Controller
    from controller.fabric import FabricSettings
    from controller.hints import AgentHintClient
    from controller.holder_push import HolderPushClient
    from controller.p4runtime import SwitchUnreachableError, WriteError
    from controller.settings import ControllerError, ControllerSettings, Mode, SwitchEndpoint
    from kvpool.topology import TopologyError, load

    assert cfg.topology is not None  # validate() requires it
    try:
        token = auth.load_or_create(cfg.token_file)
        topo = load(cfg.topology)
        fabric = FabricSettings(
            popularity_threshold=cfg.threshold or FabricSettings.popularity_threshold,
            pending_timeout_us=cfg.pending_timeout_us or FabricSettings.pending_timeout_us,
        )
        settings = ControllerSettings(mode=Mode(cfg.mode), fabric=fabric, epoch_s=cfg.epoch,
                                      heartbeat_timeout_s=cfg.heartbeat_timeout, target=cfg.target,
                                      push_admitted=cfg.push_admitted)
        if cfg.p4info is not None:
            settings.p4info = cfg.p4info
        if cfg.bmv2_json is not None:
            settings.bmv2_json = cfg.bmv2_json
        if not settings.p4info.exists():
            raise ControllerError(f"P4Info {settings.p4info} not found (build p4/ with `make -C p4`)")
        catalog = Catalog.load(cfg.catalog) if cfg.catalog is not None else Catalog()
        filler = HolderPushClient(cfg.holder_api, fabric.fill_sink, token=token.value) if cfg.holder_api else None
        endpoints = [SwitchEndpoint(name, addr, dev) for name, addr, dev in cfg.switches()]
        sinks = [AgentHintClient(url, token=token.value) for url in cfg.agent_api]
        controller = Controller(topo, endpoints, settings, catalog, filler, hint_sinks=sinks).start()
    except (TopologyError, ControllerError, SwitchUnreachableError, WriteError, OSError, auth.TokenError) as exc:
        print(f"kvpool-controller: {exc}", file=sys.stderr)
        return 1
    api = None
    if cfg.api or cfg.api_socket is not None:
        from controller.api import DEFAULT_PORT, ControllerAPI

        host, _, port = (cfg.api or f"127.0.0.1:{DEFAULT_PORT}").rpartition(":")
        try:
            api = ControllerAPI(controller, host, int(port), cfg.api_socket, token=token).start()
        except OSError as exc:
            controller.close()
            print(f"kvpool-controller: --api {cfg.api}: cannot serve there ({exc})", file=sys.stderr)
            return 1
        log.info("API on %s%s", api.url, f" and unix:{cfg.api_socket}" if cfg.api_socket else "",
                 extra=logs.kv(metrics=f"{api.url}/metrics"))

    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after this epoch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    status_file = cfg.status_file

    def on_epoch(_report: object) -> None:
        if status_file is not None:
            tmp = status_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(controller.status()) + "\n")
            tmp.replace(status_file)

    log.info("controlling %d switch(es) in mode %s; %d chunks in the catalog", len(endpoints), settings.mode,
             len(catalog), extra=logs.kv(switches=len(endpoints), mode=str(settings.mode), catalog=len(catalog)))
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
