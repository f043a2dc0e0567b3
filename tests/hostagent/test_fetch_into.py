"""``AgentClient.fetch_chunks_into``: chunks received straight into the caller's buffer, over TCP and the
Unix socket; views of that buffer come back, nothing is written past it, and a short or failed answer
is an error, never a partial success."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from hostagent.api import CHUNK_ALIGN, pack_bundle
from hostagent.client import AgentClient, BufferTooSmallError, bundle_space, staging_buffer
from hostagent.daemon import Agent, AgentConfig
from hostagent.serialize import deserialize, serialize
from kvpool import http_client
from kvpool.http_api import ApiError, ApiUnreachableError

KEYS = [0x11, 0x12, 0x13]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    sock = tmp_path_factory.mktemp("api") / "api.sock"
    a = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING", api_socket=str(sock)))
    a.start()
    try:
        yield a
    finally:
        a.stop()


@pytest.fixture(scope="module")
def chunks(agent: Agent) -> list[torch.Tensor]:
    torch.manual_seed(0)
    # One chunk of 600 KiB (over http_client.DIRECT_BODY alone), two small ones of odd lengths.
    out = [torch.randn(4, 2, 2, 96, 200).to(torch.float16), torch.randn(3, 2, 1, 5, 7), torch.randn(1, 2, 1, 3, 3)]
    AgentClient(agent.api_url).publish_chunks(KEYS, [serialize(c) for c in out])
    return out


def _urls(agent: Agent) -> list[str]:
    return [agent.api_url, f"unix:{agent.config.api_socket}"]


def _space(chunks: list[torch.Tensor]) -> int:
    return bundle_space([len(serialize(c)) for c in chunks])


def _addr(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


@pytest.mark.parametrize("kind", ["tensor", "pinned-or-not", "bytearray", "numpy", "odd-memoryview"])
def test_chunks_land_in_the_callers_buffer_over_tcp_and_unix(agent: Agent, chunks: list[torch.Tensor], kind: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    direct: list[int] = []

    class Counted(http_client._SocketReader):
        def __init__(self, sock: socket.socket, length: int, timeout: float | None) -> None:
            direct.append(length)
            super().__init__(sock, length, timeout)

    monkeypatch.setattr(http_client, "_SocketReader", Counted)
    space = _space(chunks)
    backing = bytearray(space + 3)
    buffer: torch.Tensor | npt.NDArray[Any] | bytearray | memoryview
    if kind == "tensor":
        buffer = torch.empty(space, dtype=torch.uint8)
    elif kind == "pinned-or-not":
        buffer = staging_buffer(space)  # pinned where CUDA is there
    elif kind == "bytearray":
        buffer = bytearray(space)
    elif kind == "numpy":
        buffer = np.empty(space // 4 + 1, dtype=np.float32)
    else:
        buffer = memoryview(backing)[3:]  # a start 3 bytes past an allocation: chunks still aligned
    whole = np.frombuffer(buffer.numpy() if isinstance(buffer, torch.Tensor) else buffer, dtype=np.uint8)
    for url in _urls(agent):
        client = AgentClient(url)
        for _ in range(2):  # the same buffer, reused
            whole[:] = 0xEE
            got, views, stopped = client.fetch_chunks_into(KEYS, buffer)
            assert got == KEYS and stopped is None
            lo = int(whole.ctypes.data)
            hi = lo + whole.nbytes
            for view, chunk in zip(views, chunks, strict=True):
                arr = np.frombuffer(view, dtype=np.uint8)
                assert np.shares_memory(arr, whole) and lo <= arr.ctypes.data and arr.ctypes.data + arr.nbytes <= hi
                assert arr.ctypes.data % CHUNK_ALIGN == 0
                assert bytes(view) == bytes(serialize(chunk))
                tensor = deserialize(view)  # a view too, its checksum verified
                assert torch.equal(tensor, chunk) and np.shares_memory(tensor.view(torch.uint8).numpy(), whole)
        client.http.close()
    assert len(direct) == 4, "every answer read from the socket, past h11"


def test_a_buffer_too_small_is_refused_before_a_byte_is_written(agent: Agent, chunks: list[torch.Tensor]) -> None:
    for url in _urls(agent):
        client = AgentClient(url)
        backing = bytearray(b"\xab" * (_space(chunks) + 256))
        with pytest.raises(BufferTooSmallError) as err:
            client.fetch_chunks_into(KEYS, memoryview(backing)[:100])
        assert err.value.size == 100 and err.value.needed > 100 and "bundle_space" in str(err.value)
        assert backing == b"\xab" * len(backing), "a refused fetch wrote into the buffer"
        # Exactly what it said it needs (same start): fits, and the bytes after it stay as they were.
        need = err.value.needed
        got, views, _ = client.fetch_chunks_into(KEYS, memoryview(backing)[:need])
        assert got == KEYS and all(bytes(v) == bytes(serialize(c)) for v, c in zip(views, chunks, strict=True))
        assert backing[need:] == b"\xab" * (len(backing) - need)
        with pytest.raises(BufferTooSmallError):
            client.fetch_chunks_into(KEYS, memoryview(backing)[: need - 1])
        with pytest.raises(ValueError, match="writable"):
            client.fetch_chunks_into(KEYS, memoryview(bytes(need)))


def test_what_the_agent_does_not_hold_is_a_stop_not_an_error(agent: Agent, chunks: list[torch.Tensor]) -> None:
    for url in _urls(agent):
        got, views, stopped = AgentClient(url).fetch_chunks_into([*KEYS[:2], 0x99], bytearray(_space(chunks)))
        assert got == KEYS[:2] and len(views) == 2 and stopped is not None and "0x0000000000000099" in stopped
        assert AgentClient(url).fetch_chunks_into([0x99], bytearray(0))[:2] == ([], [])


# ------------------------------------------------------------------ answers that go wrong


def _serve_once(listener: socket.socket, answer: bytes, done: threading.Event) -> None:
    """Read one request (head and body), send ``answer``, hang up."""
    conn, _ = listener.accept()
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(body) < length:
            body += conn.recv(65536)
        with contextlib.suppress(OSError):  # the client may hang up first (a bad answer's head is enough)
            conn.sendall(answer)
            conn.shutdown(socket.SHUT_WR)
        done.wait(10)


def _bundle_answer(keys: list[int], blobs: list[bytes], cut: int = 0) -> bytes:
    body = b"".join(bytes(p) for p in pack_bundle(keys, blobs))
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % len(body))
    return head + body[: len(body) - cut]


@pytest.fixture(params=["tcp", "unix"])
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    if request.param == "tcp":
        listener = socket.create_server(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    else:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(tmp_path / "fake.sock"))
        listener.listen(4)
        url = f"unix:{tmp_path / 'fake.sock'}"
    with listener:
        yield listener, url


BLOBS = [bytes(range(256)) * 300, b"\x01" * 1000]


def _answer(status: str, kind: str, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(), kind.encode(), len(body), body)


def _index_then(keys: list[int], lengths: list[int], chunks: bytes) -> bytes:
    """A 200 bundle answer whose index lists ``lengths`` but whose body carries ``chunks``."""
    index = len(keys).to_bytes(8, "little") + b"".join(
        k.to_bytes(8, "little") + n.to_bytes(8, "little") for k, n in zip(keys, lengths, strict=True))
    return _answer("200 OK", "application/octet-stream", index + chunks)


@pytest.mark.parametrize(("answer", "error", "words"), [
    (_bundle_answer(KEYS[:2], BLOBS, cut=1), ApiUnreachableError, "ended early"),
    (_bundle_answer(KEYS[:2], BLOBS, cut=len(BLOBS[1]) + 500), ApiUnreachableError, "ended early"),
    (_bundle_answer(KEYS[:2], BLOBS, cut=sum(map(len, BLOBS)) + 20), ApiUnreachableError, "ended early"),
    (_bundle_answer([0x77], BLOBS[:1]), ApiError, "other keys"),
    (_index_then(KEYS[:2], [len(b) for b in BLOBS], BLOBS[0]), ApiError, "malformed bundle"),
    (_index_then(KEYS[:1], [1 << 40], BLOBS[0]), ApiError, "malformed bundle"),
    (_answer("404 Not Found", "application/json", b'{"error": "no such chunk", "code": "missing"}'), ApiError,
     "no such chunk"),
    (_answer("200 OK", "application/json", b'{"found": 3}'), ApiError, "malformed bundle"),
])
def test_a_short_or_failed_answer_is_an_error(fake: tuple[socket.socket, str], answer: bytes,
                                              error: type[Exception], words: str) -> None:
    listener, url = fake
    done = threading.Event()
    server = threading.Thread(target=_serve_once, args=(listener, answer, done), daemon=True)
    server.start()
    try:
        with pytest.raises(error, match=words):
            AgentClient(url, timeout=5, token="t" * 40).fetch_chunks_into(KEYS, bytearray(1 << 20))
    finally:
        done.set()
        server.join(10)
