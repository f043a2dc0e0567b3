"""The controller on a leaf-spine: each admitted chunk lives on one switch, chosen from where its demand enters.

Six model switches in this process, one per switch of ``leaf_spine(4, 2, 8, 2)`` (holders on
leaf s1, requesters on leaves s2..s4, spines s5 and s6), each with its P4Runtime server;
frames are carried between them by hand, port to port, as the links would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller.catalog import Catalog, ChunkInfo
from controller.daemon import Controller
from controller.fabric import FabricSettings
from controller.overrides import Override
from controller.policy.site import Site
from controller.settings import ControllerSettings, Mode, SwitchEndpoint
from kvpool import contract as n
from kvpool import wire
from kvpool.contract import PoolState
from kvpool.topology import Host, leaf_spine
from tests.ctl_harness import P4INFO, SKIP_REASON, ModelSwitch

pytestmark = pytest.mark.skipif(not P4INFO.exists(), reason=SKIP_REASON)

TOPO = leaf_spine(4, 2, 8, 2)
KEY = 0x0FAB_0001
CHUNK = bytes((i * 7 + 3) % 256 for i in range(2 * wire.FRAG_PAYLOAD + 10))  # 3 fragments


class FakeSink:
    """Records which keys the controller asks to be pushed, to which sink."""

    def __init__(self) -> None:
        self.pushes: list[tuple[list[int], str | None]] = []

    def push(self, keys: list[int], sink: str | None = None) -> None:
        self.pushes.append((list(keys), sink))


@pytest.fixture
def fabric() -> Iterator[dict[str, ModelSwitch]]:
    switches = {name: ModelSwitch() for name in TOPO.switches}
    yield switches
    for sw in switches.values():
        sw.stop()


def _port(host: str) -> int:
    """The leaf port ``host`` hangs off."""
    link = TOPO.host_link(host)
    end = link.b if link.a.node == host else link.a
    assert end.port is not None
    return end.port


def _frame(src: Host, dst: Host, payload: bytes, sport: int = 40000) -> bytes:
    return bytes(Ether(src=src.mac, dst=dst.mac) / IP(src=src.address, dst=dst.address)
                 / UDP(sport=sport, dport=wire.KVPOOL_UDP_PORT) / payload)


def _get(fabric: dict[str, ModelSwitch], host: str, frag: int = 0, room: bool = False,
         request_id: int = 1) -> list[tuple[int, bytes]]:
    """A GET from ``host`` to the holder h0 into its leaf; what the leaf sends out."""
    leaf = TOPO.attachment(host)
    frame = _frame(TOPO.hosts[host], TOPO.hosts["h0"], wire.get_packet(KEY, frag, request_id=request_id, room=room))
    out = fabric[leaf].ports.inject(_port(host), frame)
    fabric[leaf].ports.drain()
    return out


def _controller(fabric: dict[str, ModelSwitch], sink: FakeSink) -> Controller:
    settings = ControllerSettings(mode=Mode.POOL, p4info=P4INFO, bmv2_json=None, epoch_s=0.05,
                                  fabric=FabricSettings(popularity_threshold=2))
    endpoints = [SwitchEndpoint(name, sw.address, 1) for name, sw in fabric.items()]  # one device each
    return Controller(TOPO, endpoints, settings, Catalog([ChunkInfo(KEY, None, 0, len(CHUNK))]), sink)


def _epochs_until(ctl: Controller, done: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, "the controller never got there"
        ctl.run_epoch()
        time.sleep(0.05)


def _states(fabric: dict[str, ModelSwitch]) -> dict[str, int]:
    out = {}
    for name, sw in fabric.items():
        found = sw.state.lookup_exact(n.POOL_LOOKUP, KEY)
        if found.hit:
            out[name] = found.params["state"]
    return out


def test_a_chunk_moves_from_the_leaf_to_the_spine_when_a_second_leaf_wants_it(fabric: dict[str, ModelSwitch]) -> None:
    sink = FakeSink()
    with _controller(fabric, sink) as ctl:
        # Fabric ports are marked on every switch: only a leaf's own requesters count there.
        assert fabric["s5"].state.entry_count(n.HOST_GUARD) == 4
        # Two requesters behind leaf s2 make the chunk hot there: it lives on s2 itself.
        _get(fabric, "h1", request_id=1)
        _get(fabric, "h4", request_id=2)
        _epochs_until(ctl, lambda: KEY in ctl.residents)
        assert ctl.residents[KEY].site == Site("s2")
        assert _states(fabric) == {"s2": PoolState.FILLING}
        assert sink.pushes == []  # admitted: the answers that cross s2 fill it

        # Requesters behind leaf s3 want it too: their paths meet s2's at spine s5, which
        # now holds it (a new placement, pushed to its sink); s2 and s3 relay the room.
        _get(fabric, "h2", request_id=3)
        _get(fabric, "h5", request_id=4)
        _epochs_until(ctl, lambda: ctl.residents[KEY].site.switch == "s5")
        assert ctl.residents[KEY].site == Site("s5", frozenset({"s2", "s3"}))
        assert _states(fabric) == {"s5": PoolState.FILLING, "s2": PoolState.UPSTREAM, "s3": PoolState.UPSTREAM}
        assert sink.pushes == [([KEY], "10.0.0.250")]  # moved: pushed to s5's fill sink

        # The push fills s5 on its way from the holders' leaf (s5's port 1) to the sink.
        for i in range(wire.fragment_count(len(CHUNK))):
            push = _frame(TOPO.hosts["h0"], Host("sink", "10.0.0.250/24", "02:00:00:00:00:fe"),
                          wire.data_packet(KEY, i, CHUNK), sport=wire.KVPOOL_UDP_PORT)
            assert fabric["s5"].ports.inject(1, push) == []  # dropped at its sink
        # A GET with room from h5 crosses s3 with its room and is answered by s5.
        (up,) = _get(fabric, "h5", frag=1, room=True, request_id=9)
        assert up[0] == 1 and len(up[1]) == len(_frame(TOPO.hosts["h5"], TOPO.hosts["h0"],
                                                           wire.get_packet(KEY, 1, room=True)))
        (reply,) = fabric["s5"].ports.inject(3, up[1])  # spine s5's port 3 faces leaf s3
        assert reply[0] == 3
        hdr = wire.unpack_header(reply[1][42:])
        assert (hdr.opcode, hdr.flags, hdr.request_id) == (wire.Opcode.DATA, wire.Flag.SWITCH_SERVED, 9)
        body = reply[1][42 + wire.HEADER_LEN:]
        assert body[:hdr.payload_len] == CHUNK[wire.FRAG_PAYLOAD:wire.FRAG_PAYLOAD + hdr.payload_len]

        # An eviction removes the chunk from every switch of its site.
        done = ctl.submit(Override("evict", KEY, demote=False))
        _epochs_until(ctl, done.done)
        assert done.result()["action"] == "drop"
        assert _states(fabric) == {}
