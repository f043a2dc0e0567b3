"""The wire format: round trips, every validation reason, numpy and scapy views agree."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool import wire
from kvpool.wire import FRAG_PAYLOAD, HEADER_LEN, Header, Opcode, Status, WireError


def test_geometry_fits_mtu() -> None:
    assert HEADER_LEN == 40
    assert FRAG_PAYLOAD == 1408
    assert wire.IPV4_HEADER_LEN + wire.UDP_HEADER_LEN + wire.DATA_DATAGRAM_LEN == 1476


def test_header_round_trip_all_fields_at_max() -> None:
    values = {f.name: f.max for f in wire.FIELDS}
    hdr = Header(**values)
    raw = hdr.pack()
    assert len(raw) == HEADER_LEN
    assert wire.unpack_header(raw) == hdr
    assert raw[4:12] == b"\xff" * 8  # chunk_key at its documented offset, big-endian


def test_header_layout_is_network_order() -> None:
    raw = Header(Opcode.GET, chunk_key=0x0102030405060708, frag_index=0x0A0B, request_id=0xDEADBEEF).pack()
    assert raw[0] == wire.KVPOOL_VERSION and raw[1] == Opcode.GET
    assert raw[4:12] == bytes(range(1, 9))
    assert raw[12:14] == b"\x0a\x0b"
    assert raw[16:20] == b"\xde\xad\xbe\xef"


def test_check_covers_identity_and_valid_payload_bytes() -> None:
    chunk = bytes(range(256)) * 20  # 5120 bytes: 4 fragments, the last 896 bytes long
    pkt = wire.data_packet(7, 3, chunk, generation=5)
    hdr = wire.parse(pkt)
    payload = pkt[HEADER_LEN : HEADER_LEN + hdr.payload_len]
    assert hdr.check == wire.fragment_check(7, 5, 3, 4, len(chunk), payload)
    assert int.from_bytes(pkt[32:40], "big") == hdr.check  # at its documented offset
    # Every identity field and every valid byte matters; padding and request id do not.
    n = len(chunk)
    others = [wire.fragment_check(8, 5, 3, 4, n, payload), wire.fragment_check(7, 6, 3, 4, n, payload),
              wire.fragment_check(7, 5, 2, 4, n, payload), wire.fragment_check(7, 5, 3, 5, n, payload),
              wire.fragment_check(7, 5, 3, 4, n + 1, payload), wire.fragment_check(7, 5, 3, 4, n, payload[:-1]),
              wire.fragment_check(7, 5, 3, 4, n, bytes([payload[0] ^ 1]) + payload[1:])]
    assert hdr.check not in others and len(set(others)) == len(others)
    assert wire.parse(wire.data_packet(7, 3, chunk, generation=5, request_id=99)).check == hdr.check
    assert wire.parse(wire.get_packet(7, 0)).check == 0


def test_every_single_bit_flip_of_a_fragment_changes_its_check() -> None:
    chunk = bytes((i * 31 + 7) % 256 for i in range(300))
    hdr = wire.parse(wire.data_packet(0x1234, 0, chunk, generation=2))
    for bit in range(len(chunk) * 8):
        flipped = bytearray(chunk)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        assert wire.fragment_check(0x1234, 2, 0, 1, len(chunk), flipped) != hdr.check


def test_pack_rejects_out_of_range_value() -> None:
    with pytest.raises(WireError, match="frag_index"):
        Header(Opcode.GET, 1, frag_index=1 << 16).pack()
    with pytest.raises(WireError, match="chunk_key"):
        Header(Opcode.GET, -1).pack()


def test_numpy_dtype_matches_struct() -> None:
    hdr = Header(Opcode.DATA, 0xABCDEF, 3, 9, 77, 5, 100, 0, 12_000, flags=1)
    arr = np.frombuffer(hdr.pack(), dtype=wire.HEADER_DTYPE)
    for field, value in zip(wire.FIELDS, hdr.as_tuple(), strict=True):
        assert int(arr[field.name][0]) == value


@pytest.mark.parametrize("chunk_len", [1, FRAG_PAYLOAD - 1, FRAG_PAYLOAD, FRAG_PAYLOAD + 1, 10 * FRAG_PAYLOAD + 7])
def test_data_packets_cover_chunk_exactly(chunk_len: int) -> None:
    chunk = bytes((i * 7) % 251 for i in range(chunk_len))
    count = wire.fragment_count(chunk_len)
    out = bytearray()
    for i in range(count):
        pkt = wire.data_packet(42, i, chunk, request_id=9)
        hdr = wire.parse(pkt)
        assert len(pkt) == wire.DATA_DATAGRAM_LEN
        assert (hdr.frag_index, hdr.frag_count, hdr.chunk_len) == (i, count, chunk_len)
        out += pkt[HEADER_LEN:HEADER_LEN + hdr.payload_len]
        assert pkt[HEADER_LEN + hdr.payload_len:] == bytes(FRAG_PAYLOAD - hdr.payload_len)
    assert bytes(out) == chunk


def _data(**changes: int) -> bytearray:
    good = bytearray(wire.data_packet(7, 1, bytes(3 * FRAG_PAYLOAD)))
    hdr = wire.unpack_header(good)
    fields = {f.name: v for f, v in zip(wire.FIELDS, hdr.as_tuple(), strict=True)} | changes
    good[:HEADER_LEN] = wire.HEADER_STRUCT.pack(*(fields[f.name] for f in wire.FIELDS))
    return good


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [
        (b"\x01\x01", "truncated"),
        (bytes(_data(version=1)), "bad_version"),
        (bytes(_data(opcode=99)), "bad_opcode"),
        (bytes(_data(flags=0x8000)), "bad_flags"),
        (bytes(_data(frag_index=3)), "bad_range"),
        (bytes(_data(frag_count=0)), "bad_range"),
        (bytes(_data(payload_len=FRAG_PAYLOAD + 1)), "bad_length"),
        (bytes(_data(chunk_len=2 * FRAG_PAYLOAD)), "bad_length"),
        (bytes(_data(status=Status.BUSY)), "bad_status"),
        (bytes(_data())[:-1], "bad_length"),
        (wire.get_packet(1, 0) + b"x", "bad_length"),
        (wire.get_packet(1, 0xFFFE, 2), "bad_range"),
        (Header(Opcode.NACK, 1).pack(), "bad_status"),
    ],
)
def test_validation_reasons(datagram: bytes, reason: str) -> None:
    with pytest.raises(WireError) as err:
        wire.parse(datagram)
    assert err.value.reason == reason


def test_get_with_reply_room() -> None:
    pkt = wire.get_packet(5, 2, request_id=3, room=True)
    assert len(pkt) == wire.GET_WITH_ROOM_LEN == wire.DATA_DATAGRAM_LEN
    assert pkt[wire.HEADER_LEN:] == bytes(wire.FRAG_PAYLOAD)
    hdr = wire.parse(pkt)
    assert (hdr.opcode, hdr.payload_len, hdr.frag_index) == (Opcode.GET, 0, 2)
    for bad in (pkt[:-1], pkt + b"\0"):
        with pytest.raises(WireError) as err:
            wire.parse(bad)
        assert err.value.reason == "bad_length"
    # Room is for GETs only.
    inv = wire.invalidate_packet(5, 1) + bytes(wire.FRAG_PAYLOAD)
    with pytest.raises(WireError, match="carries no payload"):
        wire.parse(inv)


def test_valid_control_packets_parse() -> None:
    assert wire.parse(wire.get_packet(5, 2, 4, request_id=3)).frag_count == 4
    assert wire.parse(wire.invalidate_packet(5, 8)).generation == 8
    assert wire.parse(wire.nack_packet(5, Status.UNKNOWN_CHUNK)).status == Status.UNKNOWN_CHUNK


def test_fragment_count_limits() -> None:
    assert wire.fragment_count(wire.MAX_CHUNK_LEN) == wire.MAX_FRAGMENTS
    for bad in (0, wire.MAX_CHUNK_LEN + 1):
        with pytest.raises(WireError):
            wire.fragment_count(bad)


def test_scapy_layer_matches_wire() -> None:
    from scapy.layers.inet import IP, UDP

    from kvpool.scapy_layer import KvPool

    raw = wire.data_packet(0x1122334455667788, 0, b"hello", request_id=4, flags=wire.Flag.SWITCH_SERVED)
    pkt = IP(bytes(IP(dst="10.0.0.1") / UDP(sport=1234, dport=wire.KVPOOL_UDP_PORT) / raw))
    kv = pkt[KvPool]
    assert kv.chunk_key == 0x1122334455667788 and kv.opcode == Opcode.DATA and kv.payload_len == 5
    assert bytes(kv) == raw
    assert bytes(KvPool(opcode=Opcode.GET, chunk_key=9, frag_index=2)) == wire.get_packet(9, 2)
