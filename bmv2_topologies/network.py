"""Build a topology in Mininet with P4Runtime switches of either target.

``model`` runs kvpool's reference switch (``kvpool-switch``) on the switch's interfaces;
``bmv2`` runs ``simple_switch_grpc``. Either way each switch gets its own gRPC port and
device id, the builder waits until the port listens, and hosts get TX checksum offload
turned off (a software switch reading veths otherwise forwards UDP with bad checksums
that the receiver drops silently) and static ARP entries for every other host.

Only what this module started is stopped, by PID; it never runs Mininet's global cleanup.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.tcp import free_port, wait_listening
from kvpool.topology import Topology
from switchmodel.dataplane import frames_lost as logged_frames_lost
from switchmodel.targets import find_simple_switch_grpc

log = logging.getLogger(__name__)

TARGETS = ("model", "bmv2")
BASE_GRPC_PORT = 50051


def interface_name(switch: str, port: int) -> str:
    """The Linux interface of ``switch``'s port ``port`` (the root namespace holds it)."""
    return f"{switch}-eth{port}"


class _QuietHtbQuantum(logging.Filter):
    """Drop tc's "quantum of class ... is big" warning, which Mininet reports as an error.

    htb prints it for every fast shaped link (rate / r2q above 200 kB); the link is
    shaped correctly all the same, and a user should not read "Error" on a good run.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "quantum of class" not in record.getMessage()


class NetworkError(RuntimeError):
    """The emulated network could not be built or a switch did not come up."""


def default_target() -> str:
    """``bmv2`` when ``simple_switch_grpc`` is installed (on PATH or in /opt/bmv2/bin), else ``model``."""
    return "bmv2" if find_simple_switch_grpc() else "model"


def mininet_available() -> str | None:
    """None when Mininet can run here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "Mininet needs root"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "Mininet's Python module is not importable (run scripts/setup.sh as root)"
    if not shutil.which("mnexec"):
        return "mnexec is missing (Debian package mininet)"
    return None


@dataclass
class SwitchHandle:
    """A running switch process: where to reach it over P4Runtime, and its PID."""

    name: str
    target: str
    device_id: int
    grpc_addr: str
    ports: dict[int, str]  # port number -> interface name
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    command: list[str] = field(default_factory=list, repr=False)
    metrics_addr: str | None = None
    """Where a model switch serves its own ``/metrics`` (``HOST:PORT``), when asked for."""


def switch_command(target: str, device_id: int, grpc_addr: str, ports: dict[int, str],
                   log_path: Path, bmv2_json: Path | None = None, impair_file: Path | None = None,
                   metrics_addr: str | None = None) -> list[str]:
    """The command line that starts one switch of ``target`` on ``ports``.

    ``impair_file`` (model only) is the file of link impairments the switch watches;
    ``metrics_addr`` (model only) where it serves its own ``/metrics``.
    """
    if target == "bmv2":
        exe = find_simple_switch_grpc()
        if exe is None:
            raise NetworkError("target bmv2: simple_switch_grpc is neither on PATH nor in /opt/bmv2/bin "
                               "(use --target model)")
        cmd = [exe, "--device-id", str(device_id), "--log-file", str(log_path.with_suffix(".bmv2")),
               "--log-flush"]
        for port, intf in ports.items():
            cmd += ["-i", f"{port}@{intf}"]
        # No JSON: the controller pushes the pipeline over P4Runtime, like every other config.
        cmd += ["--no-p4", "--", "--grpc-server-addr", grpc_addr]
        return cmd
    if target == "model":
        cmd = [sys.executable, "-m", "switchmodel.cli", "--device-id", str(device_id), "--grpc-addr", grpc_addr]
        for port, intf in ports.items():
            cmd += ["--interface", f"{port}@{intf}"]
        if impair_file is not None:
            cmd += ["--impair-file", str(impair_file)]
        if metrics_addr is not None:
            cmd += ["--metrics", metrics_addr]
        return cmd
    raise NetworkError(f"unknown target {target!r}; choose one of {TARGETS}")


class EmulatedNetwork:
    """A Mininet network of a ``Topology``; use as a context manager so it always stops."""

    def __init__(self, topo: Topology, target: str | None = None, log_dir: Path | str = "logs",
                 switch_timeout: float = 30.0, extra_neighbours: dict[str, str] | None = None,
                 metrics: bool = False) -> None:
        reason = mininet_available()
        if reason:
            raise NetworkError(reason)
        self.topo = topo
        self.target = target or default_target()
        if self.target not in TARGETS:
            raise NetworkError(f"unknown target {self.target!r}; choose one of {TARGETS}")
        self.log_dir = Path(log_dir)
        self.switch_timeout = switch_timeout
        #: Static ARP entries every host gets besides the other hosts (e.g. the fill sink).
        self.extra_neighbours = dict(extra_neighbours or {})
        #: Model switches serve their own ``/metrics`` on loopback (``SwitchHandle.metrics_addr``).
        self.metrics = metrics
        #: Per switch, the file of link impairments a model switch watches (``set_impairment``).
        self.impair_files: dict[str, Path] = {}
        self.switches: dict[str, SwitchHandle] = {}
        self.net: Any = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EmulatedNetwork:
        """Create hosts and links, start one switch process per switch, wait for them."""
        # Optional: Mininet is a root-only Debian package; importing this module must not need it.
        from mininet.link import TCLink
        from mininet.log import lg
        from mininet.net import Mininet
        from mininet.node import Host, Switch

        class ExternalSwitch(Switch):  # type: ignore[misc]
            """Holds a switch's interfaces in the root namespace; the process is started by us."""

            def start(self, controllers: list[Any]) -> None:
                """Nothing to start: ``EmulatedNetwork`` runs the switch process itself."""


        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not any(isinstance(f, _QuietHtbQuantum) for f in lg.filters):
            lg.addFilter(_QuietHtbQuantum())
        net = Mininet(topo=None, controller=None, switch=None, build=False, autoSetMacs=False,
                      autoStaticArp=False)
        self.net = net
        try:
            for i, sw in enumerate(self.topo.switches):
                net.addSwitch(sw, cls=ExternalSwitch, dpid="%016x" % (i + 1))
            for h in self.topo.hosts.values():
                net.addHost(h.name, ip=h.ip, mac=h.mac, cls=Host)
            for link in self.topo.links:
                opts: dict[str, Any] = {}
                if link.bandwidth_mbps is not None:
                    opts["bw"] = link.bandwidth_mbps
                if link.latency != "0ms":
                    opts["delay"] = link.latency
                kwargs: dict[str, Any] = {"cls": TCLink, **opts} if opts else {}
                if link.a.port is not None:
                    kwargs["port1"] = link.a.port
                    kwargs["intfName1"] = interface_name(link.a.node, link.a.port)
                if link.b.port is not None:
                    kwargs["port2"] = link.b.port
                    kwargs["intfName2"] = interface_name(link.b.node, link.b.port)
                net.addLink(link.a.node, link.b.node, **kwargs)
            net.build()
            self._configure_hosts()
            for i, sw in enumerate(self.topo.switches):
                self._start_switch(sw, device_id=i + 1)
        except BaseException:
            self.stop()
            raise
        return self

    def _configure_hosts(self) -> None:
        for h in self.topo.hosts.values():
            node = self.net.get(h.name)
            intf = node.defaultIntf()
            node.cmd(f"ethtool --offload {intf} rx off tx off sg off >/dev/null 2>&1")
            node.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
            neighbours = {o.address: o.mac for o in self.topo.hosts.values() if o.name != h.name}
            for ip, mac in (neighbours | self.extra_neighbours).items():
                node.cmd(f"ip neigh replace {ip} lladdr {mac} dev {intf} nud permanent")
        for sw in self.topo.switches:
            node = self.net.get(sw)
            for intf in node.intfList():
                if intf.name != "lo":
                    node.cmd(f"ethtool --offload {intf.name} rx off tx off sg off >/dev/null 2>&1")
                    node.cmd(f"sysctl -qw net.ipv6.conf.{intf.name}.disable_ipv6=1")

    def _start_switch(self, name: str, device_id: int) -> None:
        try:
            port = free_port(start=BASE_GRPC_PORT + device_id)
        except OSError as exc:
            raise NetworkError(str(exc)) from None
        grpc_addr = f"127.0.0.1:{port}"
        ports = {p: interface_name(name, p) for p in self.topo.switch_ports(name)}
        log_path = self.log_dir / f"{name}.log"
        impair_file = None
        if self.target == "model":
            impair_file = (self.log_dir / f"{name}.impair").resolve()
            impair_file.unlink(missing_ok=True)  # a previous run's file would impair this one
            self.impair_files[name] = impair_file
        metrics_addr = None
        if self.metrics and self.target == "model":
            try:
                metrics_addr = f"127.0.0.1:{free_port(start=port + 1000)}"
            except OSError as exc:
                raise NetworkError(str(exc)) from None
        cmd = switch_command(self.target, device_id, grpc_addr, ports, log_path, impair_file=impair_file,
                             metrics_addr=metrics_addr)
        self.switches[name] = SwitchHandle(name, self.target, device_id, grpc_addr, ports, log_path, None, cmd,
                                           metrics_addr)
        log_path.write_bytes(b"")  # this run's log only; a restart appends to it
        self._spawn(self.switches[name])

    def _spawn(self, handle: SwitchHandle) -> None:
        """Start ``handle``'s switch process (appending to its log) and wait until it listens."""
        log.info("starting %s (%s): %s", handle.name, self.target, " ".join(handle.command))
        with handle.log_path.open("ab") as out:
            proc = subprocess.Popen(handle.command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        handle.process = proc
        grpc_addr, log_path = handle.grpc_addr, handle.log_path
        if not wait_listening(grpc_addr, self.switch_timeout, lambda: proc.poll() is not None, poll_s=0.1):
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-800:] if log_path.exists() else ""
                raise NetworkError(f"switch exited with code {proc.returncode} before listening on {grpc_addr}: "
                                   f"{tail}")
            raise NetworkError(f"switch did not listen on {grpc_addr} within {self.switch_timeout:.0f} s "
                               f"(log: {log_path})")

    def _kill(self, handle: SwitchHandle, sig: int = signal.SIGTERM) -> None:
        """End ``handle``'s process group (SIGKILL if ``sig`` does not end it within 5 s)."""
        proc = handle.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def restart_switch(self, name: str, sig: int = signal.SIGKILL) -> SwitchHandle:
        """Kill switch ``name``'s process (SIGKILL: a crash) and start it again on the same ports and address.

        The new process starts empty: no pipeline, no entries, no registers; returns once
        it listens. Its controller must notice and program it again.
        """
        handle = self.switches.get(name)
        if handle is None:
            raise NetworkError(f"no switch {name!r} (switches: {', '.join(sorted(self.switches))})")
        self._kill(handle, sig)
        self._spawn(handle)
        return handle

    def switch_state(self, name: str) -> str:
        """One line on switch ``name``'s process for an error: running or exited, and its log's tail."""
        handle = self.switches[name]
        proc = handle.process
        state = ("not started" if proc is None else f"running as pid {proc.pid}" if proc.poll() is None
                 else f"exited with code {proc.returncode}")
        tail = handle.log_path.read_text(errors="replace")[-600:].strip() if handle.log_path.exists() else ""
        return f"{state}; log {handle.log_path}" + (f" ends: {tail}" if tail else " is empty")

    def frames_lost(self) -> dict[str, int]:
        """Per model switch that lost any: frames its ports dropped (a full socket buffer), from its log.

        Read once the switches stopped (each logs its port counters as it exits). A loss
        means the model could not keep up: latencies then measure the emulation.
        """
        out: dict[str, int] = {}
        for name, handle in self.switches.items():
            if handle.target != "model" or not handle.log_path.exists():
                continue
            lost = logged_frames_lost(handle.log_path.read_text(errors="replace"))
            if lost:
                out[name] = lost
        return out

    def stop(self) -> None:
        """Stop the switch processes this network started, then the Mininet hosts and links."""
        for handle in self.switches.values():
            self._kill(handle)
        if self.net is not None:
            self.net.stop()
            self.net = None

    def __enter__(self) -> EmulatedNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers
    def set_impairment(self, switch: str, specs: Sequence[str]) -> None:
        """Impair ``switch``'s links with ``specs`` (``switchmodel.impair`` syntax); ``[]`` stops it.

        Takes effect within about 0.1 s.  Only the model target can: BMv2 has no such
        option and this kernel has no ``sch_netem`` for ``tc``.
        """
        path = self.impair_files.get(switch)
        if path is None:
            if not specs:
                return
            raise NetworkError(f"switch {switch}: link impairment needs the model target (target is {self.target})")
        from switchmodel.impair import parse_specs

        text = "".join(f"{s}\n" for s in specs)
        parse_specs(text.splitlines())  # a bad spec fails here, not silently in the switch
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # atomic: the switch never reads half a file

    def host(self, name: str) -> Any:
        """The Mininet host object (``.cmd``, ``.popen``) for ``name``."""
        return self.net.get(name)

    def popen(self, host: str, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``args`` inside ``host``'s namespace; the caller ends it by PID."""
        proc: subprocess.Popen[bytes] = self.net.get(host).popen(args, **kwargs)
        return proc
