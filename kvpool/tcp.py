"""TCP port helpers: pick a free port, wait until a server listens on one.

One home for what the switch launchers (``switchmodel.targets``, the Mininet builder),
the tests and the benchmarks all need when they start a server process and must know
when it can be reached.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port(host: str = "127.0.0.1", start: int | None = None, span: int = 1000) -> int:
    """A TCP port on ``host`` that is free right now.

    Without ``start`` the kernel picks one (ephemeral range). With ``start``, the first free
    port of ``start .. start + span - 1``: launchers that like readable, stable addresses
    (the first BMv2 at 50051, as p4lang's tutorials have it) ask this way.
    OSError when none of them is free.
    """
    candidates = [0] if start is None else range(start, start + span)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free TCP port on {host} in {start}..{(start or 0) + span - 1}")


def wait_listening(address: str, timeout_s: float, gave_up: Callable[[], bool] = lambda: False,
                   poll_s: float = 0.05) -> bool:
    """Poll until a TCP connect to ``HOST:PORT`` succeeds; True then, False on timeout or once ``gave_up()``.

    ``gave_up`` lets the caller stop early, typically when the server process it started
    has exited; the caller words the error, since only it knows which log to point at.
    """
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        if gave_up():
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.2)
            # A loopback connect to a port nobody listens on yet can pick that very port as its
            # own (TCP simultaneous open) and "succeed" by talking to itself: not a listener.
            if sock.connect_ex((host, int(port))) == 0 and sock.getsockname() != sock.getpeername():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
