"""Veth pairs for running a software switch against real Linux interfaces.

A ``VethLab`` makes N veth pairs: the switch side of each stays in the root network
namespace (where ``simple_switch_grpc`` or the model binds with ``-i``/``--interface``
and where its gRPC server listens on loopback), the host side goes into a network
namespace of its own, so test traffic never reaches the machine's real network.  The
test (or benchmark) talks to the host sides through raw sockets opened inside that
namespace.  IPv6 is turned off on every interface so the kernel adds no router
solicitations or MLD reports to the frames a test counts.  Everything the lab made is
removed by ``close`` (only what it made: names carry the creating process id).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

from switchmodel.ports import open_raw_socket, recv_frame

CLONE_NEWNET: Final = 0x40000000
_COUNTER = itertools.count()
_T = TypeVar("_T")


class LabError(RuntimeError):
    """The lab cannot be built (not root, no ``ip``, a command failed); the message says which."""


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")


def can_build() -> str | None:
    """None when a lab can be built here, else the reason it cannot (for pytest skips)."""
    if os.geteuid() != 0:
        return "needs root to create veth pairs and network namespaces"
    if not Path("/usr/sbin/ip").exists() and not Path("/sbin/ip").exists() and not Path("/bin/ip").exists():
        return "needs iproute2 (ip)"
    return None


def in_netns(netns: str, func: Callable[[], _T]) -> _T:
    """Run ``func`` in a thread that has entered network namespace ``netns``; return its result.

    Sockets created there stay in that namespace after the thread ends, which is how
    the test process talks to the host side without a second process.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    result: list[_T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise LabError(f"setns into {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(func())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=body, name=f"netns-{netns}")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


@dataclass
class VethLab:
    """N veth pairs: ``switch_ifs[i]`` in the root namespace, ``host_ifs[i]`` in ``host_netns[i]``.

    ``separate_hosts`` gives every host side a namespace of its own (needed when the
    hosts' kernels talk to each other through the switch); ``addresses`` gives host
    ``i`` (switch port ``i + 1``) the MAC ``02:00:00:00:00:<i+1>`` and ``10.0.0.<i+1>/24``.
    ``host_offloads_off`` turns TX/RX checksum offload off on the host sides, as
    p4lang/tutorials' P4Host does; leave it on to reproduce the checksum trap.
    """

    n_ports: int
    host_offloads_off: bool = True
    separate_hosts: bool = False
    addresses: bool = False
    netns: str = ""
    host_netns: list[str] = field(default_factory=list)
    switch_ifs: list[str] = field(default_factory=list)
    host_ifs: list[str] = field(default_factory=list)
    host_socks: list[socket.socket] = field(default_factory=list)
    _namespaces: list[str] = field(default_factory=list)

    def open(self) -> VethLab:
        """Create the namespaces and pairs, bring them up, open one raw socket per host side."""
        reason = can_build()
        if reason:
            raise LabError(reason)
        tag = f"{os.getpid() % 100000}{next(_COUNTER) % 10}"
        self.netns = f"kvpool-lab-{tag}"
        try:
            for i in range(self.n_ports):
                ns = f"{self.netns}-h{i + 1}" if self.separate_hosts else self.netns
                if ns not in self._namespaces:
                    _run("ip", "netns", "add", ns)
                    self._namespaces.append(ns)
                    _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                self.host_netns.append(ns)
                sw, host = f"kvs{tag}p{i}", f"kvh{tag}p{i}"
                _run("ip", "link", "add", sw, "type", "veth", "peer", "name", host)
                self.switch_ifs.append(sw)
                _run("ip", "link", "set", host, "netns", ns)
                self.host_ifs.append(host)
                _run("sysctl", "-qw", f"net.ipv6.conf.{sw}.disable_ipv6=1")
                _run("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{host}.disable_ipv6=1")
                if self.addresses:
                    _run("ip", "netns", "exec", ns, "ip", "link", "set", host, "address",
                         f"02:00:00:00:00:{i + 1:02x}")
                    _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.0.0.{i + 1}/24", "dev", host)
                _run("ip", "link", "set", sw, "up")
                _run("ip", "netns", "exec", ns, "ip", "link", "set", host, "up")
                if self.host_offloads_off:
                    _run("ip", "netns", "exec", ns, "ethtool", "--offload", host, "rx", "off", "tx", "off",
                         "sg", "off")
            self.host_socks = [in_netns(ns, functools.partial(open_raw_socket, h))
                               for ns, h in zip(self.host_netns, self.host_ifs, strict=True)]
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Close the sockets and delete the pairs and the namespace this lab created."""
        for sock in self.host_socks:
            sock.close()
        self.host_socks.clear()
        for sw in self.switch_ifs:
            # Deleting one end removes the pair, wherever its peer lives.
            subprocess.run(["ip", "link", "del", sw], capture_output=True, check=False)
        self.switch_ifs.clear()
        self.host_ifs.clear()
        for ns in self._namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self._namespaces.clear()
        self.host_netns.clear()
        self.netns = ""

    def __enter__(self) -> VethLab:
        """Build the lab."""
        return self.open()

    def __exit__(self, *exc: object) -> None:
        """Tear the lab down."""
        self.close()

    def send(self, index: int, frame: bytes) -> None:
        """Send ``frame`` from host side ``index`` towards the switch."""
        self.host_socks[index].send(frame)

    def recv(self, index: int) -> bytes | None:
        """A frame that reached host side ``index`` from the switch, or None if none is waiting."""
        got = recv_frame(self.host_socks[index])
        return None if got is None else got[0]
