"""kvpool.http_server and kvpool.http_client: the one server (body policy, routing, errors) and the one
client, over TCP and a Unix socket."""

from __future__ import annotations

import http.client
import json
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool import auth
from kvpool.http_api import ApiError, ApiUnreachableError, Request, Response, Router
from kvpool.http_client import JsonClient
from kvpool.http_server import ApiServer

TOKEN = auth.Token("t" * 40, Path("/nonexistent/token"))
AUTH = b"Authorization: Bearer " + TOKEN.value.encode() + b"\r\n"


def _router() -> Router:
    r = Router()
    r.add("GET", "/v1/echo/{word}", lambda req: Response.json({"word": req.params["word"], "q": req.arg("q", "")}))
    r.add("POST", "/v1/json", lambda req: Response.json({"got": req.json()}))
    r.add("PUT", "/v1/raw", lambda req: Response.octets([b"<", req.body(), b">"], {"X-Len": str(req.content_length)}))
    r.add("POST", "/v1/ignore", lambda _req: Response.json({"ok": True}))  # never reads its body

    def refuse(_req: Request) -> Response:
        raise ApiError(409, "busy", "try later")

    def crash(_req: Request) -> Response:
        raise RuntimeError("a bug")

    r.add("POST", "/v1/refuse", refuse)
    r.add("GET", "/v1/crash", crash)
    return r


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ApiServer]:
    srv = ApiServer(_router(), "127.0.0.1", 0, token=TOKEN, unix_path=tmp_path / "api.sock", max_body_bytes=1000,
                    name="test-api").start()
    try:
        yield srv
    finally:
        srv.stop()


def _raw(server: ApiServer, data: bytes) -> tuple[int, dict[str, Any], bool]:
    """Send raw bytes; (status, JSON body, whether the server closed the connection after answering)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(data)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        doc = json.loads(resp.read())
        return resp.status, doc, resp.will_close


def test_client_and_server_round_trip_over_tcp_and_unix(server: ApiServer, tmp_path: Path) -> None:
    for url in (server.url, f"unix:{tmp_path / 'api.sock'}"):
        c = JsonClient(url, 5, "test API", TOKEN.value)
        assert c.get("/v1/echo/a%20b?q=1") == {"word": "a b", "q": "1"}
        assert c.post("/v1/json", {"x": [1, 2]}) == {"got": {"x": [1, 2]}}
        reply = c.request("PUT", "/v1/raw", [b"ab", memoryview(b"cd")])
        assert reply.body == b"<abcd>" and reply.header("X-Len") == "4"
        with pytest.raises(ApiError) as e:
            c.post("/v1/refuse")
        assert (e.value.status, e.value.code, e.value.message) == (409, "busy", "try later")
    # The socket file is private to its owner's group, and gone after stop.
    assert stat.S_IMODE((tmp_path / "api.sock").stat().st_mode) == 0o660


def test_answers_go_out_at_once_on_tcp(server: ApiServer) -> None:
    """The server's TCP connections have TCP_NODELAY: an answer written as head then body
    would otherwise wait for the client's delayed ACK (40 ms a request on Linux)."""
    c = JsonClient(server.url, 5, "test API", TOKEN.value)
    assert c.get("/v1/echo/x") == {"word": "x", "q": ""}
    conns = list(server._server.server_state.connections)
    assert conns
    for proto in conns:
        sock = proto.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_unknown_paths_methods_and_bugs_are_json_errors(server: ApiServer) -> None:
    c = JsonClient(server.url, 5, token=TOKEN.value)
    for method, path, status, code in (("GET", "/v1/none", 404, "unknown_path"), ("DELETE", "/v1/json", 405,
                                                                                     "bad_method"),
                                       ("GET", "/v1/crash", 500, "internal")):
        with pytest.raises(ApiError) as e:
            c.call(method, path)
        assert (e.value.status, e.value.code) == (status, code), path
        assert "\n" not in e.value.message
    assert server.counters.snapshot()["errors"] == {"unknown_path": 1, "bad_method": 1, "internal": 1}


@pytest.mark.parametrize(("head", "body", "status", "code"), [
    (b"POST /v1/json HTTP/1.1\r\n", b"", 411, "no_length"),
    (b"POST /v1/json HTTP/1.1\r\nTransfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n", 411, "no_length"),
    (b"POST /v1/json HTTP/1.1\r\nContent-Length: x\r\n", b"", 400, "bad_length"),
    (b"POST /v1/json HTTP/1.1\r\nContent-Length: 0\r\n", b"", 400, "bad_json"),
    (b"POST /v1/json HTTP/1.1\r\nContent-Length: 5\r\n", b"[1,2]", 400, "bad_json"),
    (b"POST /v1/json HTTP/1.1\r\nContent-Length: 3\r\n", b"{\xff}", 400, "bad_json"),
    (b"POST /v1/json HTTP/1.1\r\nContent-Length: 9\r\n", b"{", 400, "bad_body"),  # then the client hangs up
])
def test_body_policy(server: ApiServer, head: bytes, body: bytes, status: int, code: str) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + AUTH + b"\r\n" + body)
        if code == "bad_body":
            s.shutdown(socket.SHUT_WR)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        doc = json.loads(resp.read())
    assert (resp.status, doc["code"]) == (status, code)


def test_an_oversize_body_is_refused_from_its_length_and_the_connection_closed(server: ApiServer) -> None:
    # Announces 1001 bytes (the limit is 1000) and sends none: the answer comes from the header alone.
    status, doc, closed = _raw(server, b"PUT /v1/raw HTTP/1.1\r\nContent-Length: 1001\r\n" + AUTH + b"\r\n")
    assert (status, doc["code"], closed) == (413, "body_too_large", True)
    assert "1001" in doc["error"]


def test_an_unread_body_does_not_become_the_next_request(server: ApiServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/ignore", body=b"GET /v1/crash HTTP/1.1\r\n\r\n",
                 headers={"Authorization": f"Bearer {TOKEN.value}"})
    assert json.loads(conn.getresponse().read()) == {"ok": True}
    conn.request("GET", "/v1/echo/again")
    assert json.loads(conn.getresponse().read())["word"] == "again"  # same keep-alive connection
    conn.close()
    assert "internal" not in server.counters.snapshot()["errors"]


def test_client_names_an_unreachable_or_malformed_address(tmp_path: Path) -> None:
    with pytest.raises(ApiUnreachableError, match=r"thing API at unix:.+ is unreachable"):
        JsonClient(f"unix:{tmp_path / 'none.sock'}", 2, "thing API").get("/v1/x")
    for bad in ("ftp://x", "unix:", "http://h:99999"):
        with pytest.raises(ValueError, match="thing API"):
            JsonClient(bad, 2, "thing API")
