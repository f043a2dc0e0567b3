"""Start a switch target as a subprocess on a ``VethLab``: BMv2 or the reference model.

Both get the lab's switch-side interfaces as ports 1..N and a P4Runtime gRPC server on
a free loopback port; the caller pushes the pipeline and writes state over P4Runtime,
identically for both.  Used by the data-plane tests (veth mode) and by
``scripts/bench_switch.py``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kvpool.tcp import free_port, wait_listening

SIMPLE_SWITCH_GRPC = "simple_switch_grpc"
#: Where a BMv2 built from source installs (``--prefix /opt/bmv2``) when it is not on PATH.
BMV2_PREFIX_BIN = Path("/opt/bmv2/bin")


class TargetError(RuntimeError):
    """A target did not come up; the message carries the tail of its log."""


def find_simple_switch_grpc() -> str | None:
    """Path of ``simple_switch_grpc``: on PATH, else in /opt/bmv2/bin; None when neither has it."""
    found = shutil.which(SIMPLE_SWITCH_GRPC)
    if found is None and os.access(BMV2_PREFIX_BIN / SIMPLE_SWITCH_GRPC, os.X_OK):
        found = str(BMV2_PREFIX_BIN / SIMPLE_SWITCH_GRPC)
    return found


def bmv2_missing() -> str | None:
    """None when ``simple_switch_grpc`` is found and we are root, else why BMv2 cannot run on veths."""
    if find_simple_switch_grpc() is None:
        return (f"{SIMPLE_SWITCH_GRPC} is neither on PATH nor in {BMV2_PREFIX_BIN} "
                "(BMv2 with PI/P4Runtime is not installed)")
    if os.geteuid() != 0:
        return "BMv2 on veth pairs needs root"
    return None


@dataclass
class Process:
    """A started target: its process, gRPC address and log file."""

    name: str
    proc: subprocess.Popen[bytes]
    grpc_addr: str
    log_path: Path
    _log: IO[bytes]

    def stop(self) -> None:
        """Terminate the process (and only it) and close the log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        """Last lines of the process's log, for error messages."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def _wait_listening(target: Process, timeout: float) -> None:
    if wait_listening(target.grpc_addr, timeout, lambda: target.proc.poll() is not None):
        return
    if target.proc.poll() is not None:
        raise TargetError(f"{target.name} exited with {target.proc.returncode}:\n{target.log_tail()}")
    target.stop()
    raise TargetError(f"{target.name} did not listen on {target.grpc_addr} within {timeout:.0f} s:\n"
                      f"{target.log_tail()}")


def _start(name: str, argv: list[str], grpc_addr: str, log_dir: Path, timeout: float) -> Process:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{grpc_addr.rsplit(':', 1)[1]}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    target = Process(name, proc, grpc_addr, log_path, log)
    _wait_listening(target, timeout)
    return target


@functools.cache
def bmv2_options(binary: str = SIMPLE_SWITCH_GRPC) -> frozenset[str]:
    """The long options ``binary --help`` lists: BMv2's depend on how it was built.

    A build without Thrift (``--without-thrift``, P4Runtime only) has no ``--thrift-port``
    and refuses to start when given one; one without nanomsg has no ``--notifications-addr``.
    """
    try:
        proc = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"cannot run {binary} --help: {exc}") from None
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", proc.stdout + proc.stderr))


def bmv2_argv(switch_ifs: Sequence[str], grpc_port: int, options: frozenset[str], device_id: int = 0,
              trace: bool = False, thrift_port: int | None = None, binary: str = SIMPLE_SWITCH_GRPC) -> list[str]:
    """The ``simple_switch_grpc`` command line, with only the options this build (``options``) has."""
    argv = [binary, "--device-id", str(device_id)]
    if "--thrift-port" in options and thrift_port is not None:
        argv += ["--thrift-port", str(thrift_port)]
    if "--notifications-addr" in options:
        # A notifications address of its own: the default is derived from the device id
        # alone, so two instances with the same id (one per test run) would collide.
        argv += ["--notifications-addr", f"ipc:///tmp/kvpool-bmv2-{grpc_port}-notifications.ipc"]
    argv.append("--no-p4")
    for i, ifname in enumerate(switch_ifs, start=1):
        argv += ["-i", f"{i}@{ifname}"]
    if trace:
        argv += ["--log-console", "-L", "trace"]
    argv += ["--", "--grpc-server-addr", f"127.0.0.1:{grpc_port}"]
    return argv


def start_bmv2(switch_ifs: Sequence[str], log_dir: Path, device_id: int = 0, timeout: float = 30.0,
               trace: bool = False, binary: str | None = None) -> Process:
    """Start ``simple_switch_grpc`` with ``switch_ifs`` as ports 1..N (none is fine) and no program loaded.

    ``binary`` defaults to :func:`find_simple_switch_grpc`; ``trace`` logs every table,
    action and register access to the log file (slow).
    """
    binary = binary or find_simple_switch_grpc() or SIMPLE_SWITCH_GRPC
    options = bmv2_options(binary)
    grpc_port = free_port()
    argv = bmv2_argv(switch_ifs, grpc_port, options, device_id, trace, thrift_port=free_port(), binary=binary)
    return _start("bmv2", argv, f"127.0.0.1:{grpc_port}", log_dir, timeout)


def start_model(switch_ifs: Sequence[str], log_dir: Path, device_id: int = 0, timeout: float = 30.0) -> Process:
    """Start the reference model (``kvpool-switch``) with ``switch_ifs`` as ports 1..N."""
    grpc_port = free_port()
    argv = [sys.executable, "-m", "switchmodel.cli", "--device-id", str(device_id),
            "--grpc-addr", f"127.0.0.1:{grpc_port}"]
    for i, ifname in enumerate(switch_ifs, start=1):
        argv += ["--interface", f"{i}@{ifname}"]
    return _start("model", argv, f"127.0.0.1:{grpc_port}", log_dir, timeout)
