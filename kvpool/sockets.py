"""Socket buffer sizing shared by the host agent's UDP sockets and the model switch's ports.

Both must ride out a few hundred milliseconds in which their one Python loop does not read
(a busy or descheduled thread on a shared CPU), so both ask for buffers far past Linux's
default ``net.core.rmem_max``: as root the kernel lets them (``SO_*BUFFORCE``), otherwise it
caps the plain option at the sysctl maximum.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Final

SO_SNDBUFFORCE: Final = 32  # Linux values; Python does not export them.
SO_RCVBUFFORCE: Final = 33


def set_buffers(sock: socket.socket, size: int) -> None:
    """Ask for ``size``-byte receive and send buffers; as root past net.core.{r,w}mem_max."""
    for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:  # not root: the kernel caps the plain option at the sysctl maximum
            sock.setsockopt(socket.SOL_SOCKET, plain, size)


# UDP segmentation offload (Linux >= 4.18) and receive coalescing (>= 5.0); Python 3.11 does not
# export the constants.  The datagrams on the wire are the same either way: GSO hands the
# kernel one buffer of equal-size segments that leave as separate datagrams (split in the
# kernel, or by a NIC that offloads it); GRO hands a receiver one buffer of several equal-size
# datagrams from one sender and the segment size in a cmsg.
UDP_SEGMENT: Final = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO: Final = getattr(socket, "UDP_GRO", 104)
UDP_MAX_GSO_BYTES: Final = 0xFFFF - 20 - 8
"""Most payload one segmented IPv4 send may carry (the IP total length is 16 bits)."""
GRO_CMSG_SPACE: Final = socket.CMSG_SPACE(4)
"""Ancillary room for the ``UDP_GRO`` cmsg (an int: the segment size) of one ``recvmsg``."""


def gso_supported(sock: socket.socket, segment: int) -> bool:
    """Whether the kernel takes segmented sends of ``segment``-byte datagrams on ``sock`` (the option is left off).

    Segmented sends then go one by one with ``gso_cmsg`` (a cmsg per ``sendmsg``), so other
    sends on the socket stay ordinary: on older kernels a socket-wide ``UDP_SEGMENT`` fails
    every send where the egress cannot checksum (EIO), single datagrams included.  A path
    may still refuse a segmented send (``EIO``, ``EINVAL``, ``EMSGSIZE``): the sender falls back.
    """
    try:
        sock.setsockopt(socket.SOL_UDP, UDP_SEGMENT, segment)
        sock.setsockopt(socket.SOL_UDP, UDP_SEGMENT, 0)
    except OSError:
        return False
    return True


_SIOCGIFADDR: Final = 0x8915


def _interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name``, or None (no address, gone)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])


def _udp_segmentation_on(name: str) -> bool | None:
    """Whether ``name`` takes segmented UDP frames whole (``tx-udp-segmentation``); None if ethtool cannot tell."""
    ethtool = shutil.which("ethtool") or "/usr/sbin/ethtool"
    try:
        out = subprocess.run([ethtool, "-k", name], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.strip().startswith("tx-udp-segmentation:"):
            return line.split(":", 1)[1].split()[0] == "on"
    return None


def gso_path_refusal(host: str) -> str:
    """Why segmented sends from a socket bound to ``host`` could reach the next hop whole ("" where they cannot).

    Where the egress device cannot segment UDP (``tx-udp-segmentation`` off: the project's
    Mininet hosts, whose offloads are off), the kernel splits a segmented send into ordinary
    frames before the device; a physical NIC that can splits it itself; loopback hands it
    to a local socket, which splits it or takes it coalesced.  But a virtual device that takes
    it whole (a veth or tap with offloads on) passes the 64 KiB frame to its peer, and a
    software switch reading that peer with a packet socket (the model switch, BMv2) sees one
    frame it cannot parse, and nothing tells the sender.  Such a path gets one send per datagram.
    """
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return f"cannot tell the egress of {host!r}"
    if addr.is_loopback:
        return ""
    for _, name in socket.if_nameindex():
        if name == "lo" or (not addr.is_unspecified and _interface_address(name) != host):
            continue
        sysfs = Path("/sys/class/net") / name
        with contextlib.suppress(OSError):
            if (sysfs / "operstate").read_text().strip() == "down":
                continue  # sends nothing
        if (sysfs / "device").exists():
            continue  # a physical NIC: it segments what it takes whole, or the kernel does first
        whole = _udp_segmentation_on(name)
        if whole is None:
            return f"cannot read the offloads of virtual interface {name} (ethtool -k)"
        if whole:
            return (f"virtual interface {name} takes segmented UDP whole (tx-udp-segmentation on): "
                    "a software switch behind it would see 64 KiB frames")
    return ""


def gso_cmsg(segment: int) -> list[tuple[int, int, bytes]]:
    """Ancillary data that makes one ``sendmsg`` leave as ``segment``-byte datagrams (a u16 option)."""
    return [(socket.SOL_UDP, UDP_SEGMENT, segment.to_bytes(2, sys.byteorder))]


def enable_gro(sock: socket.socket) -> bool:
    """Let ``sock`` receive coalesced datagrams (read with ``recvmsg`` and ``gro_segment``); False if refused."""
    try:
        sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def gro_segment(ancdata: list[tuple[int, int, bytes]], received: int) -> int:
    """Segment size of a buffer ``recvmsg`` returned with ``ancdata``: the ``UDP_GRO`` cmsg's, else ``received``."""
    for level, kind, data in ancdata:
        if level == socket.SOL_UDP and kind == UDP_GRO and len(data) >= 4:
            return int.from_bytes(data[:4], sys.byteorder) or received
    return received
