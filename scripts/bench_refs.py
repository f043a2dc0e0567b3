"""Same-run yardsticks for ``scripts/bench_hostagent.py``: what the agent's figures are divided by
(the host's UDP limit is ``scripts/udp_blast.py``).

* Mooncake Store's own TCP get of the same bytes (``mooncake_get_mbps``).
* HTTP bodies (``BodiesSide``): the same chunk bundles through a plain-socket HTTP/1.1 peer
  (``sendall`` of the parts, ``recv_into`` one reused buffer: kernel copies only), and
  through the agent's API of any tree, this one or a git revision's (``tree_at``), each
  side a client process driven over a pipe, so sides take turns under the same load.

Loaded by ``bench_hostagent.py`` with ``runpy`` (a script directory is no package).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def mooncake_get_mbps(blobs: list[bytes], reps: int) -> tuple[list[float], str]:
    """Mooncake Store's own TCP get of the same bytes on loopback: MB/s per round, or ([], why not).

    One master and one store node holding every blob; one client in this process puts them
    all, then gets them all in order, once per round (the raw library call, as
    ``scripts/bench_mooncake.py``'s "raw upsert/get"); the first round is a warm-up.
    """
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        return [], f"mooncake not importable ({exc})"
    from hostagent.mooncake_master import MasterConfig, MooncakeMaster, MooncakeProcessError, MooncakeStoreNode

    total = sum(len(b) for b in blobs)
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"  # as MooncakeBackend: advertise loopback
    rates: list[float] = []
    try:
        with MooncakeMaster(MasterConfig()) as pool, MooncakeStoreNode(pool, 2 * total + (64 << 20)):
            raw: Any = MooncakeDistributedStore()
            if raw.setup("127.0.0.1", pool.metadata_url, 0, max(64 << 20, 2 * len(blobs[0])), "tcp", "",
                         pool.rpc_address) != 0:
                return [], "mooncake client setup failed"
            try:
                names = [f"bench/limit/{i}" for i in range(len(blobs))]
                for name, blob in zip(names, blobs, strict=True):
                    if raw.upsert(name, blob) != 0:
                        return [], f"mooncake upsert of {name} failed"
                for rep in range(-1, reps):
                    t0 = time.perf_counter()
                    got = [raw.get(name) for name in names]
                    dt = time.perf_counter() - t0
                    if rep < 0 and any(g != b for g, b in zip(got, blobs, strict=True)):
                        return [], "mooncake get returned other bytes"
                    if rep >= 0:
                        rates.append(total / dt)
            finally:
                raw.close()
    except MooncakeProcessError as exc:
        return [], f"mooncake pool did not start ({exc})"
    return rates, ""


# ------------------------------------------------------------------ HTTP bodies

_BUNDLE = r"""
import os, struct
def bundle(count, clen):
    index = struct.pack("<Q", count) + b"".join(struct.pack("<QQ", 0x6B76_0000_0000_0000 + i, clen)
                                                for i in range(count))
    return [index] + [os.urandom(clen) for _ in range(count)]
def read_answer(sock, buf, into):
    # One HTTP/1.1 message after the head bytes already in ``buf``: its body into ``into``; the rest.
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            return None, b""
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    got = min(len(buf), length)
    into[:got] = buf[:got]
    while got < length:
        n = sock.recv_into(into[got:length])
        if not n:
            raise ConnectionError("the body ended early")
        got += n
    return head, buf[length:]
"""

RAW_HTTP_SERVER = _BUNDLE + r"""
import socket, sys
count, clen = int(sys.argv[1]), int(sys.argv[2])
parts = bundle(count, clen)
total = sum(len(p) for p in parts)
lsock = socket.create_server(("127.0.0.1", 0))
print(lsock.getsockname()[1], flush=True)
conn, _ = lsock.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
body = memoryview(bytearray(total))  # one buffer for every body: the least a server can do
buf = b""
while True:
    head, buf = read_answer(conn, buf, body)
    if head is None:
        break
    if head.startswith(b"POST /v1/fetch "):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % total)
        for p in parts:
            conn.sendall(p)
    else:
        doc = b'{"published": %d}\n' % count
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(doc), doc))
"""

_BODIES_WORKER = _BUNDLE + r"""
import socket, subprocess, sys, tempfile, time
from pathlib import Path
side, count, clen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
parts = bundle(count, clen)
total = sum(len(p) for p in parts)
if side == "agent":  # the agent's API, through its own client, of whatever tree PYTHONPATH names
    from hostagent.client import AgentClient
    from hostagent.daemon import spawn_agent
    agent = spawn_agent(Path(tempfile.mkdtemp(prefix="kvpool-bench-api-")), "--log-level", "WARNING")
    client = AgentClient(agent.api_url, timeout=600)
    keys = [0x6B76_0000_0000_0000 + i for i in range(count)]
    client.publish_chunks(keys, parts[1:])
    def fetch():
        got = client.fetch_chunks(keys)[1]
        assert len(got) == count and got[-1] == parts[-1], "/v1/fetch answered other chunks"
    def publish():
        client.publish_chunks(keys, parts[1:])
    if hasattr(AgentClient, "fetch_chunks_into"):  # this tree: the bundle into one kept buffer, as views
        from hostagent.client import bundle_space, staging_buffer
        into = staging_buffer(bundle_space([clen] * count))
        def fetch_into():
            got = client.fetch_chunks_into(keys, into)[1]
            assert len(got) == count and got[-1] == parts[-1], "/v1/fetch answered other chunks"
    stop = agent.stop
else:  # the plain-socket peer
    server = subprocess.Popen([sys.executable, "-c", sys.argv[4], str(count), str(clen)], stdout=subprocess.PIPE)
    sock = socket.create_connection(("127.0.0.1", int(server.stdout.readline())))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    into = memoryview(bytearray(total))
    def fetch():
        sock.sendall(b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        read_answer(sock, b"", into)
    def publish():
        sock.sendall(b"POST /v1/publish HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % total)
        for p in parts:
            sock.sendall(p)
        read_answer(sock, b"", into)
    def stop():
        sock.close()
        server.wait(10)
print("ready", flush=True)
try:
    for line in sys.stdin:
        t0 = time.perf_counter()
        {"fetch": fetch, "publish": publish, "fetch_into": globals().get("fetch_into")}[line.strip()]()
        print(time.perf_counter() - t0, flush=True)
finally:
    stop()
"""


def tree_at(rev: str, dest: Path) -> str:
    """Extract ``hostagent`` and ``kvpool`` as of git revision ``rev`` into ``dest``; '' or why not."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "hostagent", "kvpool"],
                             capture_output=True, timeout=60, check=False)
    except OSError as exc:
        return f"git: {exc}"
    if out.returncode != 0:
        return f"git archive {rev}: {out.stderr.decode(errors='replace').strip()[:200]}"
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return ""


class BodiesSide:
    """A client process moving ``count`` chunks of ``chunk_len`` bytes as one bundle per call, on request.

    ``side`` is ``"agent"`` (an agent of ``tree`` and its ``AgentClient``: ``/v1/fetch`` of
    held chunks, ``/v1/publish`` of the same, and in this tree ``"fetch_into"``, the same fetch
    into one kept staging buffer) or ``"raw"`` (the plain-socket HTTP peer).
    """

    def __init__(self, side: str, count: int, chunk_len: int, tree: Path = ROOT) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen([sys.executable, "-c", _BODIES_WORKER, side, str(count), str(chunk_len),
                                      RAW_HTTP_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, cwd=str(tree))
        if self._line() != "ready":
            raise RuntimeError(f"bench: the {side} side of {tree} did not start")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"bench: a bodies side exited with {self.proc.wait(30)}")
        return line

    def seconds(self, op: str) -> float:
        """Time one ``"fetch"``, ``"fetch_into"`` or ``"publish"`` of the whole bundle."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(op + "\n")
        self.proc.stdin.flush()
        return float(self._line())

    def close(self) -> None:
        """End the process (and its agent or peer)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
