"""Socket buffer sizing shared by the host agent's UDP sockets and the model switch's ports.

Both must ride out a few hundred milliseconds in which their one Python loop does not read
(a busy or descheduled thread on a shared CPU), so both ask for buffers far past Linux's
default ``net.core.rmem_max``: as root the kernel lets them (``SO_*BUFFORCE``), otherwise it
caps the plain option at the sysctl maximum.
"""

from __future__ import annotations

import socket
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
