"""Socket buffer sizing shared by the host agent's UDP sockets and the model switch's ports.

Both must ride out a few hundred milliseconds in which their one Python loop does not read
(a busy or descheduled thread on a shared CPU), so both ask for buffers far past Linux's
default ``net.core.rmem_max``: as root the kernel lets them (``SO_*BUFFORCE``), otherwise it
caps the plain option at the sysctl maximum.
"""

from __future__ import annotations

import socket
import sys
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
