"""The experiment harness without Mininet: holder-link captures (scapy), the wave stream, topologies, tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.utils import wrpcap

from bmv2_topologies.experiment.capture import (
    INCAST_WINDOW_S,
    fabric_links,
    holder_links,
    holder_traffic,
    kvpool_packets,
    peak_gets,
)
from bmv2_topologies.experiment.config import DemoConfig
from bmv2_topologies.experiment.report import ModeResult, SwitchCounts, demo_table
from bmv2_topologies.experiment.testbed import build_topology, describe
from bmv2_topologies.experiment.workload import build_workload
from kvpool import wire
from kvpool.topology import leaf_spine

HOLDER, SINK = "10.0.0.100", "10.0.0.254"
KEY = 0xABCD_0000_0000_0001
CHUNK = bytes(range(256)) * 11  # 2 fragments


def _frame(src: str, dst: str, payload: bytes, t: float, sport: int = 40000,
           dport: int = wire.KVPOOL_UDP_PORT) -> Ether:
    pkt = Ether() / IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) / payload
    pkt.time = t
    return pkt


def _capture(path: Path) -> Path:
    frames = [
        # Three requesters ask for fragment 0 within one pending window, one of them again later.
        *(_frame(f"10.0.0.{i}", HOLDER, wire.get_packet(KEY, 0, 2, request_id=i), 100.0 + 0.01 * i)
          for i in (1, 2, 3)),
        _frame("10.0.0.1", HOLDER, wire.get_packet(KEY, 0, 2, request_id=9), 100.0 + 2 * INCAST_WINDOW_S),
        _frame("10.0.0.1", HOLDER, wire.get_packet(KEY, 1, 2, request_id=1), 100.05),
        # The holder answers h1 twice (fragments 0 and 1) and pushes fragment 0 to the sink.
        _frame(HOLDER, "10.0.0.1", wire.data_packet(KEY, 0, CHUNK, request_id=1), 100.1, wire.KVPOOL_UDP_PORT,
               40000),
        _frame(HOLDER, "10.0.0.1", wire.data_packet(KEY, 1, CHUNK, request_id=1), 100.1, wire.KVPOOL_UDP_PORT,
               40000),
        _frame(HOLDER, SINK, wire.data_packet(KEY, 0, CHUNK), 100.2, wire.KVPOOL_UDP_PORT, wire.KVPOOL_UDP_PORT),
        # Not kvpool: other UDP, TCP, ARP; and a GET outside the window asked for below.
        _frame("10.0.0.1", HOLDER, b"x" * 40, 100.3, 5000, 5001),
        Ether() / IP(src="10.0.0.1", dst=HOLDER) / TCP(sport=1, dport=wire.KVPOOL_UDP_PORT),
        Ether() / ARP(),
        _frame("10.0.0.2", HOLDER, wire.get_packet(KEY, 0, 2), 500.0),
    ]
    for f in frames[-3:-1]:
        f.time = 100.3
    path = path / "link.pcap"
    wrpcap(str(path), frames)
    return path


def test_capture_is_read_as_kvpool_packets(tmp_path: Path) -> None:
    pcap = _capture(tmp_path)
    packets = list(kvpool_packets(pcap))
    assert len(packets) == 9  # 6 GETs + 3 DATA; the other UDP, the TCP and the ARP frames are not kvpool
    assert packets[0].src == "10.0.0.1" and packets[0].dst == HOLDER and packets[0].time == pytest.approx(100.01)
    assert packets[0].header.opcode == wire.Opcode.GET and packets[0].header.chunk_key == KEY

    window = (99.0, 101.0)
    assert peak_gets(pcap, HOLDER, window) == 3  # the late re-ask falls in a new window
    traffic = holder_traffic(pcap, HOLDER, window)
    assert traffic.gets_in == 5
    assert traffic.data_out == {(KEY, 0, "10.0.0.1"): 1, (KEY, 1, "10.0.0.1"): 1, (KEY, 0, SINK): 1}
    assert holder_traffic(pcap, HOLDER, (499.0, 501.0)).gets_in == 1


def test_wave_workload_and_table() -> None:
    cfg = DemoConfig(requesters=3, waves=2, hot_blocks=2, tail_blocks=1, wave_gap_ms=1000, layers=2)
    wl = build_workload(cfg)
    waves = wl.waves()
    assert [len(w) for w in waves] == [3, 3] and [w[0].at_s for w in waves] == [0.0, 1.0]
    prefixes = {r.keys[:2] for r in wl.requests}
    assert len(prefixes) == 1 and len({r.keys for r in wl.requests}) == 6  # shared prefix, own tails
    assert wl.parents[wl.requests[0].keys[1]] == wl.requests[0].keys[0]
    assert wl.fragments == sum(wire.fragment_count(len(wl.blobs[k])) for r in wl.requests for k in r.keys)
    plain = ModeResult("plain", requests=6, deliver_ms=[10.0, 20.0], holder_bytes=2_000_000)
    pool = ModeResult("pool", requests=6, deliver_ms=[5.0], holder_bytes=500_000, fragments=10, switch_served=5)
    text = demo_table([plain, pool]).splitlines()
    assert text[0].split()[0] == "mode" and "0.250" in text[2] and "50.0%" in text[2]


def test_saved_of_ideal_holds_the_holders_data_against_the_ideal_not_the_gets_beside_it() -> None:
    # Plain: 1,000 kB of DATA and 30 kB of GETs; the ideal 980 kB; multicast 982 kB of DATA but
    # 45 kB of single GETs.  Counted with the GETs it saved 3 of plain's 50 kB over the ideal;
    # the ideal counts chunks crossing, and on the DATA multicast saved 18 of the 20 it could.
    plain = ModeResult("plain", deliver_ms=[10.0], holder_bytes=1_030_000, holder_data_bytes=1_000_000,
                       ideal_bytes=1_000_000)
    mc = ModeResult("multicast", deliver_ms=[10.0], holder_bytes=1_027_000, holder_data_bytes=982_000,
                    ideal_bytes=980_000)
    row = demo_table([plain, mc]).splitlines()[2].split()
    assert row[0] == "multicast" and row[4] == "0.997" and row[6] == "0.90"
    assert mc.summary()["holder_data_bytes"] == 982_000
    # A run that did not count the holders' DATA (no agents) judges nothing on bytes.
    assert demo_table([ModeResult("plain", deliver_ms=[1.0], holder_bytes=5), ModeResult(
        "multicast", deliver_ms=[1.0], holder_bytes=4, ideal_bytes=1)]).splitlines()[2].split()[6] == "-"


def test_a_fabric_table_shows_where_the_switches_helped() -> None:
    counts = {"s1": SwitchCounts(), "s2": SwitchCounts(absorbed=40), "s5": SwitchCounts(absorbed=7, served=30,
                                                                                          fills=10, expired=2)}
    pool = ModeResult("pool", requests=4, deliver_ms=[5.0], holder_bytes=100, fabric_bytes=3_000_000,
                      switches=counts)
    lines = demo_table([pool]).splitlines()
    assert "fabric MB" in lines[0] and "3.00" in lines[1]
    assert lines[3] == "where the switches helped (counters per switch)"
    assert lines[6].split() == ["pool", "s2", "40", "0", "0", "0"]
    assert lines[7].split() == ["pool", "s5", "7", "30", "10", "0"]
    assert pool.summary()["switches"]["s5"] == {"absorbed_gets": 7, "served_hits": 30, "fills": 10,
                                                "pending_collisions": 0, "pending_expired": 2}
    star = ModeResult("pool", switches={"s1": SwitchCounts(served=3)})
    assert "where the switches" not in demo_table([star]) and "fabric MB" not in demo_table([star])


def test_topologies_of_the_demo_and_their_links(tmp_path: Path) -> None:
    topo = build_topology(DemoConfig(topology="leaf-spine", requesters=5))
    assert (len(topo.holders()), len(topo.inference_hosts()), len(topo.switches)) == (2, 5, 6)
    assert describe(topo) == "leaf-spine of 4 leaves and 2 spines (2 holder(s), 5 requesters)"
    assert holder_links(topo) == {"h0": "s1-eth3", "h101": "s1-eth4"}
    assert fabric_links(topo) == [f"s{leaf}-eth{spine}" for leaf in range(1, 5) for spine in (1, 2)]
    star = build_topology(DemoConfig(requesters=2))
    assert describe(star) == "star (1 holder(s), 2 requesters)" and fabric_links(star) == []
    path = tmp_path / "fabric.json"
    path.write_text(json.dumps(leaf_spine(2, 1, 3).to_dict()))
    assert build_topology(DemoConfig(topology=str(path))).to_dict() == leaf_spine(2, 1, 3).to_dict()


@pytest.mark.parametrize(("changes", "match"), [
    ({"topology": "ring"}, "--topology: 'ring' is neither star nor leaf-spine nor a topology JSON file"),
    ({"topology": "leaf-spine", "requesters": 33}, "--requesters"),
    ({"requesters": 17}, "--requesters"),
    ({"holders": 0}, "--holders"),
    ({"leaves": 0}, "--leaves"),
])
def test_bad_demo_config_is_named(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DemoConfig(**changes).validate()  # type: ignore[arg-type]
    DemoConfig(topology="leaf-spine", requesters=32).validate()
