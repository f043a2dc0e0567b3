"""HTTP to local daemons over TCP or a Unix socket: one helper for every client in the project.

Agents and the controller serve their APIs on loopback TCP and, optionally, on a Unix
socket; a Unix socket is what reaches a daemon inside a Mininet host (another network
namespace, same file system).  Addresses are ``http://HOST:PORT`` or ``unix:/PATH``.
"""

from __future__ import annotations

import http.client
import socket
import urllib.parse


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        """Connect to the socket file instead of a TCP port."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def connection(url: str, timeout: float | None, what: str = "API") -> http.client.HTTPConnection:
    """An HTTP connection for ``http://HOST:PORT`` or ``unix:/PATH``; ValueError for anything else."""
    if url.startswith("unix:"):
        path = url.removeprefix("unix:").removeprefix("//")
        if not path:
            raise ValueError(f"{what} {url!r}: a unix: address needs a socket path")
        return UnixHTTPConnection(path, timeout)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{what} {url!r}: expected http://HOST:PORT or unix:/PATH")
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
