"""Shared pieces of the transport tests: stores, fake holders and lossy links on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hostagent.hints import FabricHints
from hostagent.holder import Holder
from hostagent.tiers import HostTier, TieredStore
from hostagent.transport import Address, FetchResult, Transport, TransportConfig
from kvpool import wire
from kvpool.hints import Hints


def _store(chunks: dict[int, bytes], generation: int = 0) -> TieredStore:
    s = TieredStore([HostTier(1 << 30)])
    for k, v in chunks.items():
        s.put(k, v, generation=generation)
    return s


def _settled(h: Transport, sent: int) -> dict[str, Any]:
    """``h``'s stats once it counted ``sent`` datagrams (up to 2 s): a sender counts a quantum
    after sending it, so a requester can finish before the holder's count does."""
    deadline = time.monotonic() + 2
    st = h.stats()
    while st["datagrams_sent"] < sent and time.monotonic() < deadline:
        time.sleep(0.005)
        st = h.stats()
    return st


class LossyProxy:
    """A UDP relay between one requester and one holder that drops DATA datagrams picked by ``drop``
    (or by ``drop_pkt`` on their bytes) and rewrites the others with ``mangle(n, datagram)`` (n counts
    from 1).  It records every GET (``gets``, ``get_lens``) and every NACK coming back (``nacks``), and
    the most fragments asked for and not yet answered when a GET came (``peak_outstanding``).
    With ``hold_until_gets`` it passes no answer on until that many GETs came (or 2 s after the
    first), so what a requester sends before any answer does not depend on how fast it runs."""

    def __init__(self, holder: Address, drop: Callable[[int], bool],
                 mangle: Callable[[int, bytes], bytes] | None = None,
                 drop_pkt: Callable[[bytes], bool] | None = None, hold_until_gets: int = 0) -> None:
        self.holder = holder
        self.hold_until_gets = hold_until_gets
        self._first_get_at: float | None = None
        self.drop = drop
        self.drop_pkt = drop_pkt
        self.get_lens: list[int] = []
        self.nacks: list[wire.Header] = []
        self.mangle = mangle
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.1", 0))
        for s in (self.front, self.back):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.settimeout(0.05)
        self.client: Address | None = None
        self.gets: list[wire.Header] = []
        self.data_seen = 0
        self.asked = 0
        self.peak_outstanding = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._up, self._down)]
        for t in self._threads:
            t.start()

    @property
    def address(self) -> Address:
        """Where the requester should send its GETs."""
        return ("127.0.0.1", int(self.front.getsockname()[1]))

    def _up(self) -> None:
        while not self._stop.is_set():
            try:
                pkt, self.client = self.front.recvfrom(2048)
            except TimeoutError:
                continue
            if self._first_get_at is None:
                self._first_get_at = time.monotonic()
            self.gets.append(wire.parse(pkt))
            self.get_lens.append(len(pkt))
            self.asked += self.gets[-1].frag_count
            self.peak_outstanding = max(self.peak_outstanding, self.asked - self.data_seen)
            self.back.sendto(pkt, self.holder)

    def _holding(self) -> bool:
        if len(self.gets) >= self.hold_until_gets:
            return False
        return self._first_get_at is None or time.monotonic() - self._first_get_at < 2.0

    def _down(self) -> None:
        while self._holding() and not self._stop.is_set():
            time.sleep(0.001)
        while not self._stop.is_set():
            try:
                pkt = self.back.recv(2048)
            except TimeoutError:
                continue
            self.data_seen += 1
            if len(pkt) == wire.HEADER_LEN:
                self.nacks.append(wire.parse(pkt))
            if self.drop(self.data_seen) or (self.drop_pkt is not None and self.drop_pkt(pkt)):
                self.dropped += 1
                continue
            assert self.client is not None
            if self.mangle is not None:
                pkt = self.mangle(self.data_seen, pkt)
            self.front.sendto(pkt, self.client)

    def close(self) -> None:
        """Stop the relay threads and close its sockets."""
        self._stop.set()
        for t in self._threads:
            t.join()
        self.front.close()
        self.back.close()


def _through_proxy(chunks: dict[int, bytes], key: int, cfg: TransportConfig, *,
                   drop: Callable[[int], bool] = lambda i: False,
                   mangle: Callable[[int, bytes], bytes] | None = None) -> tuple[FetchResult, LossyProxy, Transport]:
    """Fetch ``key`` from a holder of ``chunks`` through a ``LossyProxy``: the result, the proxy, the requester."""
    results, proxy, r = _fetch_through_proxy(chunks, [key], cfg, drop=drop, mangle=mangle)
    return results[0], proxy, r


def _fetch_through_proxy(chunks: dict[int, bytes], keys: list[int], cfg: TransportConfig, *,
                         holder_cfg: TransportConfig | None = None, hints: Hints | None = None,
                         drop: Callable[[int], bool] = lambda i: False,
                         mangle: Callable[[int, bytes], bytes] | None = None,
                         drop_pkt: Callable[[bytes], bool] | None = None,
                         hold_until_gets: int = 0,
                         ) -> tuple[list[FetchResult], LossyProxy, Transport]:
    """Fetch ``keys`` through a ``LossyProxy`` from a holder of ``chunks``, both told ``hints``."""
    fabric = FabricHints()
    if hints is not None:
        fabric.update(hints)
    with Transport(holder_cfg or TransportConfig(port=0), Holder(_store(chunks)), hints=fabric) as h, \
            Transport(cfg, hints=fabric) as r:
        proxy = LossyProxy(h.address, drop=drop, mangle=mangle, drop_pkt=drop_pkt,
                           hold_until_gets=hold_until_gets)
        try:
            results = r.fetch(keys, proxy.address, timeout=30)
        finally:
            proxy.close()
    return results, proxy, r


def _blob(nbytes: int, seed: int = 0) -> bytes:
    """A serialized chunk (what agents carry) of about ``nbytes`` bytes."""
    import torch

    from hostagent.serialize import serialize

    gen = torch.Generator().manual_seed(seed)
    return bytes(serialize(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)))


def _until_sending(h: Transport) -> None:
    """Wait (up to 10 s) until holder ``h`` has sent its first datagram."""
    deadline = time.monotonic() + 10
    while h.stats()["datagrams_sent"] == 0 and time.monotonic() < deadline:
        time.sleep(0.002)


Send = Callable[[bytes, Address], object]


@contextlib.contextmanager
def _fake_holder(on_get: Callable[[wire.Header, Address, Send], None],
                 on_idle: Callable[[Send], None] | None = None) -> Iterator[Address]:
    """A scripted holder on a socket of its own: ``on_get`` answers each GET, ``on_idle`` runs between reads."""
    fake = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fake.bind(("127.0.0.1", 0))
    fake.settimeout(0.01)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if on_idle is not None:
                on_idle(fake.sendto)
            try:
                pkt, addr = fake.recvfrom(4096)
            except TimeoutError:
                continue
            on_get(wire.parse(pkt), addr, fake.sendto)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield fake.getsockname()
    finally:
        stop.set()
        t.join()
        fake.close()


def _sender_of_due(late: list[tuple[float, bytes, Address]], lock: threading.Lock) -> Callable[[Send], None]:
    """A fake holder's ``on_idle``: send each ``(when, packet, to)`` of ``late`` once its time has come."""
    def on_idle(send: Send) -> None:
        with lock:
            due = [x for x in late if x[0] <= time.monotonic()]
            for x in due:
                late.remove(x)
                send(x[1], x[2])
    return on_idle
