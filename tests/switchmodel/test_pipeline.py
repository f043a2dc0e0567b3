"""The pipeline's parser/deparser and its behaviour without (or with a foreign) pipeline config."""

from __future__ import annotations

import dataclasses
import random

import pytest
from p4.config.v1 import p4info_pb2
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from kvpool import wire
from kvpool.p4rt.p4info import P4Info
from switchmodel import checksum
from switchmodel.checksum import ipv4_csum16
from switchmodel.parser import Meta, parse
from switchmodel.pipeline import KvpoolPipeline
from switchmodel.state import SwitchState
from switchmodel.v1model import DROP_PORT, mark_to_drop

ETH = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
IPV4 = IP(src="10.0.0.1", dst="10.0.0.2")


def _kv(datagram: bytes, dport: int = wire.KVPOOL_UDP_PORT, sport: int = 1234) -> bytes:
    return bytes(ETH / IPV4 / UDP(sport=sport, dport=dport) / Raw(datagram))


FRAMES = {
    "get": _kv(wire.get_packet(7, 3, request_id=9)),
    "get_with_room": _kv(wire.get_packet(7, 3, room=True)),
    "data": _kv(wire.data_packet(7, 0, b"x" * 2000), dport=40000, sport=wire.KVPOOL_UDP_PORT),
    "data_padded": _kv(wire.data_packet(7, 1, b"x" * 2000)) + b"\x00" * 6,
    "udp": bytes(ETH / IPV4 / UDP(sport=1, dport=2) / Raw(b"hello")),
    "ipv4_options": bytes(ETH / IP(src="10.0.0.1", dst="10.0.0.2", options=b"\x01\x01\x01\x00") / UDP() / b"z"),
    "fragment": bytes(ETH / IP(src="10.0.0.1", dst="10.0.0.2", frag=5) / Raw(b"rest")),
    "arp": bytes(Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.0.0.2")),
    "ipv6": bytes(ETH / IPv6()),
    "runt": b"\x01\x02\x03",
    "short_kv": _kv(wire.get_packet(7, 0)[:20]),
    "short_data": _kv(wire.data_packet(7, 0, b"x" * 10)[:wire.HEADER_LEN + 700]),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_parse_then_deparse_gives_the_frame_back(name: str) -> None:
    frame = FRAMES[name]
    assert parse(frame).deparse() == frame


def test_parser_extracts_what_the_p4_parser_extracts() -> None:
    get = parse(FRAMES["get"])
    assert get.kv is not None and get.kv.opcode == wire.Opcode.GET and get.payload is None and not get.parser_error
    room = parse(FRAMES["get_with_room"])
    assert room.payload is not None and len(room.payload) == wire.SLICES_PER_FRAGMENT and room.rest == b""
    data = parse(FRAMES["data_padded"])
    assert data.payload is not None and len(data.payload) == wire.SLICES_PER_FRAGMENT
    assert data.rest == b"\x00" * 6  # Ethernet padding stays unparsed and is re-emitted
    assert parse(FRAMES["udp"]).kv is None  # other UDP ports are not kvpool
    opts = parse(FRAMES["ipv4_options"])
    assert opts.ipv4 is not None and opts.ipv4.ihl == 6 and opts.udp is None  # options: forwarded only
    assert parse(FRAMES["fragment"]).udp is None
    assert parse(FRAMES["ipv6"]).ipv4 is None
    short = parse(FRAMES["short_data"])
    assert short.parser_error and short.payload is not None and len(short.payload) == 5  # 700 // 128
    assert parse(FRAMES["short_kv"]).parser_error and parse(FRAMES["runt"]).parser_error


@pytest.mark.parametrize("seed", range(20))
def test_field_checksum_equals_header_checksum(seed: int) -> None:
    rng = random.Random(seed)
    frame = bytes(Ether() / IP(src=f"10.{rng.randrange(256)}.0.{rng.randrange(256)}", dst="192.168.255.254",
                               ttl=rng.randrange(256), id=rng.randrange(65536), tos=rng.randrange(256),
                               flags=rng.randrange(8), frag=rng.randrange(8192)) / Raw(b"p" * rng.randrange(50)))
    ip = parse(frame).ipv4
    assert ip is not None
    assert ipv4_csum16(ip) == checksum.ipv4_header_checksum(frame[14:34]) == ip.checksum


def test_mark_to_drop_also_cancels_multicast() -> None:
    meta = Meta(mcast_grp=1, egress_spec=3)
    mark_to_drop(meta)
    assert (meta.egress_spec, meta.mcast_grp) == (DROP_PORT, 0)


def test_replica_metadata_is_a_copy() -> None:
    meta = Meta(release_mask=0b101, egress_rid=0)
    copy = meta.copy()
    copy.egress_rid = 2
    assert (meta.egress_rid, copy.release_mask) == (0, 0b101)


def test_replica_metadata_copies_every_field() -> None:
    # Meta.copy lists the fields by position: a field added to Meta but not to copy, or two
    # swapped, must fail here (each field gets a value no other has).
    names = [f.name for f in dataclasses.fields(Meta)]
    meta = Meta(**{name: 1000 + i for i, name in enumerate(names)})
    assert dataclasses.asdict(meta.copy()) == dataclasses.asdict(meta)


def test_no_pipeline_means_nothing_is_forwarded() -> None:
    pipe = KvpoolPipeline(SwitchState())
    assert pipe.process(1, FRAMES["udp"]) == []
    assert pipe.stats.dropped_no_pipeline == 1


def test_a_foreign_program_is_not_run() -> None:
    info = p4info_pb2.P4Info()
    t = info.tables.add()
    t.preamble.id, t.preamble.name, t.size = 0x02000001, "MyIngress.other", 4
    state = SwitchState()
    state.set_pipeline(P4Info(info))
    pipe = KvpoolPipeline(state)
    assert not pipe.ready()
    assert pipe.process(1, FRAMES["get"]) == []


def test_reconcile_keeps_register_cells_and_masks_them_only_when_narrowed() -> None:
    def program(bitwidth: int) -> P4Info:
        info = p4info_pb2.P4Info()
        r = info.registers.add()
        r.preamble.id, r.preamble.name, r.size = 0x13000001, "MyIngress.cells", 4
        r.type_spec.bitstring.bit.bitwidth = bitwidth
        return P4Info(info)

    state = SwitchState()
    state.set_pipeline(program(16))
    state.register_write("MyIngress.cells", 2, 0xABCD)
    state.reconcile_pipeline(program(16))  # the same program: the cell as it was
    assert state.register_read("MyIngress.cells", 2) == 0xABCD
    state.reconcile_pipeline(program(32))  # wider: nothing to cut
    assert state.register_read("MyIngress.cells", 2) == 0xABCD
    state.reconcile_pipeline(program(8))  # narrower: cut to the new width, as a write would be
    assert state.register_read("MyIngress.cells", 2) == 0xCD
    state.set_pipeline(program(8))  # a plain commit clears it
    assert state.register_read("MyIngress.cells", 2) == 0


def test_longest_prefix_wins_as_routes_come_and_go() -> None:
    # The probe order is kept sorted when routes change, not sorted per packet: a prefix
    # length added must join it in its place (one left over after a delete only costs a probe).
    from kvpool import contract
    from kvpool.p4rt.codec import ActionCall, FieldMatch, TableEntry

    state = SwitchState()
    state.set_pipeline(P4Info.load(contract.build_dir() / contract.P4INFO_FILE))

    def match(plen: int) -> dict[str, FieldMatch]:
        return {contract.KEY_IPV4_DST: FieldMatch("lpm", 0x0A000000, plen)}

    def route(plen: int) -> None:
        state.insert_entry(contract.IPV4_ROUTE, TableEntry(match(plen), ActionCall(
            contract.IPV4_FORWARD, {"port": plen, "dst_mac": 0})))

    def port_for(addr: int) -> object:
        res = state.lookup(contract.IPV4_ROUTE, (addr,))
        return res.params["port"] if res.hit else None

    for plen in (8, 32, 24):
        route(plen)
    assert [port_for(a) for a in (0x0A000000, 0x0A000001, 0x0A010000)] == [32, 24, 8]
    state.delete_entry(contract.IPV4_ROUTE, match(32))
    assert port_for(0x0A000000) == 24
    state.delete_entry(contract.IPV4_ROUTE, match(24))
    assert port_for(0x0A000000) == 8
    state.delete_entry(contract.IPV4_ROUTE, match(8))
    assert port_for(0x0A000000) is None
