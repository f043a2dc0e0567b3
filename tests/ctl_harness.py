"""A real controller daemon with its API, against the model switch in this process (for the ctl/API tests).

The star(3) topology (holder h0 on port 1, requesters h1..h3 on ports 2..4) in one model
switch with a real P4Runtime gRPC server; the controller's epoch loop runs in a thread
(0.05 s epochs), the API serves on an ephemeral loopback port and a Unix socket. The pool
is limited to 32 slots so "no space" and the pin bound (25 %: 8 slots) are easy to reach.

``KVPOOL_P4_BUILD`` points at another build directory (as in tests/dataplane).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from kvpool import contract, wire
from kvpool.topology import Host, star

BUILD = contract.build_dir()
P4INFO = BUILD / contract.P4INFO_FILE
SKIP_REASON = f"{P4INFO} is missing (compile p4/ with make -C p4, or set KVPOOL_P4_BUILD)"

TOPO = star(3)
PORT = {"h0": 1, "h1": 2, "h2": 3, "h3": 4}
POOL_SLOTS = 32
#: Catalog: key -> slots. SMALL/TWO fit anywhere; BIG fills the pin bound; HUGE is larger than the pool.
SMALL, TWO, BIG, OTHER, HUGE, CHILD = 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000
SLOTS = {SMALL: 1, TWO: 2, BIG: 8, OTHER: 1, HUGE: 33, CHILD: 1}
UNKNOWN = 0xDEAD


class FakeSink:
    """Records the keys the controller asks the holder to push (the push itself is tested elsewhere)."""

    def __init__(self) -> None:
        self.pushed: list[int] = []
        self.sinks: list[str | None] = []

    def push(self, keys: list[int], sink: str | None = None) -> None:
        """Record ``keys`` and the fill sink they were pushed to."""
        self.pushed.extend(keys)
        self.sinks.append(sink)


class ModelSwitch:
    """The model switch in this process: state, pipeline, in-memory ports and its gRPC server."""

    def __init__(self, port: int = 0) -> None:
        """A fresh switch (no pipeline); ``port`` 0 picks a free gRPC port, another one restarts a switch there."""
        from switchmodel.p4rt_server import P4RuntimeServer
        from switchmodel.pipeline import KvpoolPipeline
        from switchmodel.ports import MemoryPorts
        from switchmodel.state import SwitchState

        self.state = SwitchState(device_id=1)
        self.ports = MemoryPorts(KvpoolPipeline(self.state))
        self.server = P4RuntimeServer(self.state, f"127.0.0.1:{port}").start()
        self.address = f"127.0.0.1:{self.server.port}"

    def send(self, src: Host, dst: Host, payload: bytes, sport: int = 40000) -> list[tuple[int, bytes]]:
        """Inject one UDP frame on ``src``'s port (star(3) ports); the frames the switch sent out."""
        frame = bytes(Ether(src=src.mac, dst=dst.mac) / IP(src=src.address, dst=dst.address)
                      / UDP(sport=sport, dport=wire.KVPOOL_UDP_PORT) / payload)
        out = self.ports.inject(PORT[src.name], frame)
        self.ports.drain()
        return out

    def stop(self) -> None:
        """Stop the gRPC server."""
        self.server.stop(0)


class Daemon:
    """Model switch + Controller (looping) + ControllerAPI, torn down by ``close``."""

    def __init__(self, tmp: Path, heartbeat_timeout_s: float = 3.0, switch: bool = True) -> None:
        from controller.api import ControllerAPI
        from controller.catalog import Catalog, ChunkInfo
        from controller.daemon import Controller
        from controller.settings import ControllerSettings, Mode, SwitchEndpoint

        self.switch = ModelSwitch()
        self.state, self.ports, self.server = self.switch.state, self.switch.ports, self.switch.server
        # Without a switch (directory-only tests, no P4Info needed) the controller is never
        # started: its epoch loop runs over no switch connections.
        self.switch_address = f"127.0.0.1:{self.server.port}" if switch else "127.0.0.1:1"
        settings = ControllerSettings(mode=Mode.POOL, p4info=P4INFO, bmv2_json=None, epoch_s=0.05,
                                      pool_slots=POOL_SLOTS, heartbeat_timeout_s=heartbeat_timeout_s,
                                      target="model", connect_timeout_s=1.5)
        catalog = Catalog([ChunkInfo(SMALL, None, 0, 1000), ChunkInfo(TWO, None, 0, 2 * wire.FRAG_PAYLOAD),
                           ChunkInfo(BIG, None, 0, 8 * wire.FRAG_PAYLOAD), ChunkInfo(OTHER, None, 0, 500),
                           ChunkInfo(HUGE, None, 0, 33 * wire.FRAG_PAYLOAD), ChunkInfo(CHILD, SMALL, 1, 700)])
        self.controller = Controller(TOPO, [SwitchEndpoint("s1", self.switch_address, 1)], settings, catalog)
        if switch:
            self.controller.start()
        else:
            self.controller.publish_snapshot()
        self.stop_event = threading.Event()
        self.loop = threading.Thread(target=self.controller.run, args=(self.stop_event,), daemon=True)
        self.loop.start()
        self.socket = tmp / "ctl.sock"
        self.api = ControllerAPI(self.controller, "127.0.0.1", 0, self.socket).start()
        self.url = self.api.url

    def pool_entry(self, key: int) -> dict[str, int] | None:
        """The switch's pool_lookup entry parameters for ``key`` (read from the switch's own state)."""
        from kvpool import contract as n

        found = self.state.lookup_exact(n.POOL_LOOKUP, key)
        return dict(found.params) if found.hit else None

    def send(self, src: Host, dst: Host, payload: bytes, sport: int = 40000) -> list[tuple[int, bytes]]:
        """Inject one UDP frame on ``src``'s port; the frames the switch sent out."""
        return self.switch.send(src, dst, payload, sport)

    def close(self) -> None:
        """Stop the API, the loop, the controller's connections and the switch."""
        self.api.stop()
        self.stop_event.set()
        self.loop.join(timeout=10)
        self.controller.close()
        self.server.stop(0)


@contextmanager
def running(tmp: Path, heartbeat_timeout_s: float = 3.0, switch: bool = True) -> Iterator[Daemon]:
    """A Daemon for the duration of a ``with`` block (``switch=False``: directory only, no P4Info needed)."""
    if switch and not P4INFO.exists():
        pytest.skip(SKIP_REASON)
    d = Daemon(tmp, heartbeat_timeout_s, switch)
    try:
        yield d
    finally:
        d.close()
