"""Megabyte bodies through kvpool.http_server and kvpool.http_client: the paths that skip h11's buffers
(the client reads a large octet-stream answer straight from the socket, the server writes one from its
own buffers), what they return, and what a client that hangs up, stops reading or stalls costs."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool import auth, http_client
from kvpool.http_api import ApiUnreachableError, Response, Router
from kvpool.http_client import BodyReader, JsonClient
from kvpool.http_server import ApiServer

TOKEN = auth.Token("t" * 40, Path("/nonexistent/token"))
BIG = 3 << 20


def _halves(n: int) -> Response:
    """``n`` bytes as a ``bytes`` half and a half in a view of a bytearray (the server writes both as they are)."""
    return Response.octets([b"k" * (n // 2), memoryview(bytearray(b"v" * (n // 2)))])


def _router() -> Router:
    r = Router()
    r.add("PUT", "/v1/echo", lambda req: Response.octets([req.body()]))
    r.add("GET", "/v1/big/{n}", lambda req: _halves(int(req.params["n"])))
    r.add("GET", "/v1/health", lambda _req: Response.json({"ok": True}))
    return r


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ApiServer]:
    srv = ApiServer(_router(), "127.0.0.1", 0, token=TOKEN, unix_path=tmp_path / "api.sock", max_body_bytes=2 * BIG,
                    name="test-api", timeout_s=1.0).start()
    try:
        yield srv
    finally:
        srv.stop()


def _split(src: BodyReader) -> list[bytes]:
    """Odd-sized takes, then the rest."""
    out = [src.take(1), src.take(12345), src.take(1 << 20)]
    return [*out, src.take(src.left)]


def test_megabyte_bodies_round_trip_from_the_socket_over_tcp_and_unix(server: ApiServer, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    direct: list[int] = []

    class Counted(http_client._SocketReader):
        def __init__(self, sock: socket.socket, length: int, timeout: float | None) -> None:
            direct.append(length)
            super().__init__(sock, length, timeout)

    monkeypatch.setattr(http_client, "_SocketReader", Counted)
    body = os.urandom(BIG)
    for url in (server.url, f"unix:{tmp_path / 'api.sock'}"):
        c = JsonClient(url, 5, "test API", TOKEN.value)
        for _ in range(2):  # a big answer closes its connection; the next request opens another
            assert c.request("PUT", "/v1/echo", [body[:100], memoryview(body)[100:]]).body == body
            assert c.get("/v1/health") == {"ok": True}
            _reply, parts = c.request_with("PUT", "/v1/echo", _split, body)
            assert b"".join(parts) == body and [len(p) for p in parts[:3]] == [1, 12345, 1 << 20]
            assert c.request("GET", f"/v1/big/{BIG}").body == b"k" * (BIG // 2) + b"v" * (BIG // 2)
        small = c.request("PUT", "/v1/echo", b"abc").body  # under DIRECT_BODY: through httpx as before
        assert small == b"abc"
        c.close()
    assert direct == [BIG] * 12


def _hang_up_after_head(port: int, n: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET /v1/big/{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")


def test_a_client_that_hangs_up_mid_answer_costs_the_server_nothing(server: ApiServer,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        for _ in range(10):
            _hang_up_after_head(server.port, 32 << 20)
        c = JsonClient(server.url, 5, "test API", TOKEN.value)
        assert c.get("/v1/health") == {"ok": True}
        assert len(c.request("GET", f"/v1/big/{BIG}").body) == BIG
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout(server: ApiServer) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.connect(("127.0.0.1", server.port))
        s.sendall(b"GET /v1/big/67108864 HTTP/1.1\r\nHost: x\r\n\r\n")
        t0 = time.monotonic()
        c = JsonClient(server.url, 5, "test API", TOKEN.value)
        assert c.get("/v1/health") == {"ok": True}  # answered meanwhile
        time.sleep(2.5)  # past timeout_s (1 s) without reading: the server gives up on this answer
        s.settimeout(10)
        got = 0
        while data := s.recv(1 << 20):
            got += len(data)
        assert got < 64 << 20  # cut short: the connection was closed, not the answer completed
        assert time.monotonic() - t0 < 15


def _stalling_server(answer: bytes, hold_s: float) -> tuple[socket.socket, threading.Thread]:
    """A one-connection server that reads a request head, writes ``answer`` and then holds the connection."""
    lsock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = lsock.accept()
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(4096)
            conn.sendall(answer)
            time.sleep(hold_s)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return lsock, t


@pytest.mark.parametrize("hold_s", [3.0, 0.0])  # stalls mid-body; closes mid-body
def test_the_client_gives_up_on_a_body_that_stalls_or_ends_early(hold_s: float) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n"
    lsock, t = _stalling_server(head + b"x" * 1000, hold_s)
    with lsock:
        c = JsonClient(f"http://127.0.0.1:{lsock.getsockname()[1]}", 0.5, "test API")
        t0 = time.monotonic()
        with pytest.raises(ApiUnreachableError, match=r"test API at .* is unreachable"):
            c.request_with("GET", "/x", lambda src: src.take(src.left))
        assert time.monotonic() - t0 < 2.5
        t.join(5)
