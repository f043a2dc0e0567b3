"""kvpool.p4rt.codec: golden encodings, round trips and refusals, for every entity both ends exchange.

The mini P4Info (tests/data/p4rt_mini.p4info.txtpb) has a table of every match kind:
``ipv4_lpm`` (lpm), ``pool`` (exact x2), ``acl`` (ternary, range, optional; a direct counter).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from google.protobuf import text_format
from p4.v1 import p4runtime_pb2

from kvpool.p4rt import codec
from kvpool.p4rt.codec import (
    ActionCall,
    CodecError,
    CounterValue,
    DigestConfig,
    FieldMatch,
    Replica,
    TableEntry,
)
from kvpool.p4rt.p4info import P4Info, P4InfoError
from tests.paths import P4RT_MINI

MINI = P4RT_MINI


@pytest.fixture(scope="module")
def p4info() -> P4Info:
    return P4Info.load(MINI)


def _text(msg: Any) -> str:
    return str(text_format.MessageToString(msg, as_one_line=True))


# ------------------------------------------------------------------------------- values


def test_canonical_bytestrings_and_width_checks() -> None:
    assert [codec.encode_int(v, 9) for v in (0, 1, 255, 256, 511)] == [b"\x00", b"\x01", b"\xff", b"\x01\x00",
                                                                       b"\x01\xff"]
    with pytest.raises(CodecError, match=r"does not fit in bit<9>"):
        codec.encode_int(512, 9)
    with pytest.raises(CodecError, match="negative"):
        codec.encode_int(-1, 9)
    # Decoding accepts padding (PI does), refuses what does not fit.
    assert codec.decode_bytes(b"\x00\x00\x01\xff", 9) == 511
    with pytest.raises(CodecError, match=r"does not fit in bit<9>"):
        codec.decode_bytes(b"\x02\x00", 9)
    assert codec.to_int(True, 1) == 1 and type(codec.to_int(True, 1)) is int


@pytest.mark.parametrize("seed", range(5))
def test_int_round_trip_is_canonical(seed: int) -> None:
    rng = random.Random(seed)
    for bits in (1, 7, 8, 9, 16, 32, 48, 64, 80, 1024):
        v = rng.getrandbits(bits)
        data = codec.encode_int(v, bits)
        assert codec.decode_bytes(data, bits) == v
        assert data == codec.canonical(data) and len(data) <= codec.byte_width(bits)


# ------------------------------------------------------------------------------- matches


def test_golden_match_encodings(p4info: P4Info) -> None:
    lpm = p4runtime_pb2.TableEntry()
    codec.encode_match(p4info.table("ipv4_lpm"), {"hdr.ipv4.dstAddr": FieldMatch("lpm", 0x0A000000, 8)}, lpm.match)
    assert _text(lpm) == 'match { field_id: 1 lpm { value: "\\n\\000\\000\\000" prefix_len: 8 } }'
    acl = p4runtime_pb2.TableEntry()
    codec.encode_match(p4info.table("acl"), {
        "sm.ingress_port": FieldMatch("optional", 0),
        "hdr.udp.dstPort": FieldMatch("range", 0, 0x1FF),
        "hdr.ipv4.srcAddr": FieldMatch("ternary", 0x0A000001, 0xFF0000FF),
    }, acl.match)
    # Key order, not the order given; zero is one byte, no leading zeros.
    assert _text(acl) == ('match { field_id: 1 ternary { value: "\\n\\000\\000\\001" mask: "\\377\\000\\000\\377" } } '
                          'match { field_id: 2 range { low: "\\000" high: "\\001\\377" } } '
                          'match { field_id: 3 optional { value: "\\000" } }')


@pytest.mark.parametrize(("table", "user", "expected"), [
    ("pool", {"hdr.kv.key": "0x10", "sm.ingress_port": 3},
     {"hdr.kv.key": FieldMatch("exact", 16), "sm.ingress_port": FieldMatch("exact", 3)}),
    ("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.1.0.0/16"}, {"hdr.ipv4.dstAddr": FieldMatch("lpm", 0x0A010000, 16)}),
    ("ipv4_lpm", {"hdr.ipv4.dstAddr": ("10.1.2.3", 32)}, {"hdr.ipv4.dstAddr": FieldMatch("lpm", 0x0A010203, 32)}),
    ("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.1.2.3"}, {"hdr.ipv4.dstAddr": FieldMatch("lpm", 0x0A010203, 32)}),
    ("ipv4_lpm", {"hdr.ipv4.dstAddr": "0.0.0.0/0"}, {}),  # a /0 is a wildcard: omitted
    ("acl", {"hdr.udp.dstPort": (0, 0xFFFF), "hdr.ipv4.srcAddr": ("10.0.0.0", "255.0.0.0")},
     {"hdr.ipv4.srcAddr": FieldMatch("ternary", 0x0A000000, 0xFF000000)}),  # full range: omitted
    ("acl", {"hdr.ipv4.srcAddr": "10.0.0.1", "sm.ingress_port": 2},
     {"hdr.ipv4.srcAddr": FieldMatch("ternary", 0x0A000001, 0xFFFFFFFF), "sm.ingress_port": FieldMatch("optional", 2)}),
    ("acl", {"hdr.ipv4.srcAddr": (0, 0)}, {}),  # mask 0: a wildcard
])
def test_user_matches_and_their_round_trip(p4info: P4Info, table: str, user: dict[str, Any],
                                           expected: dict[str, FieldMatch]) -> None:
    t = p4info.table(table)
    match = codec.user_match(t, user)
    assert match == expected and list(match) == [f.name for f in t.match_fields if f.name in match]
    pb = p4runtime_pb2.TableEntry()
    codec.encode_match(t, match, pb.match)
    assert codec.decode_match(t, pb.match) == match
    # The user's form comes back from the decoded match and gives the same match again.
    assert codec.user_match(t, {k: codec.match_value(m) for k, m in match.items()}) == match


@pytest.mark.parametrize(("table", "user", "error"), [
    ("pool", {"hdr.kv.key": 1}, r"exact field\(s\) sm.ingress_port missing"),
    ("pool", {"hdr.kv.key": 1, "sm.ingress_port": 512}, r"does not fit in bit<9>"),
    ("pool", {"hdr.kv.key": (1, 2), "sm.ingress_port": 1}, "give one value"),
    ("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.1.2.3/8"}, "host bits"),
    ("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.0.0.0/33"}, r"prefix length 33 not in 0..32"),
    ("acl", {"hdr.ipv4.srcAddr": ("10.0.0.1", "255.0.0.0")}, "bits outside mask"),
    ("acl", {"hdr.udp.dstPort": (9, 3)}, r"range low 9 > high 3"),
    ("acl", {"hdr.udp.dstPort": 9}, r"give \(low, high\)"),
])
def test_bad_user_matches_are_one_line_errors(p4info: P4Info, table: str, user: dict[str, Any], error: str) -> None:
    with pytest.raises(CodecError, match=error):
        codec.user_match(p4info.table(table), user)


def test_unknown_field_is_a_p4info_error(p4info: P4Info) -> None:
    with pytest.raises(P4InfoError, match=r"no match field 'hdr.kv.kee'"):
        codec.user_match(p4info.table("pool"), {"hdr.kv.kee": 1})


@pytest.mark.parametrize(("table", "text", "error"), [
    ("ipv4_lpm", 'field_id: 1 lpm { value: "\\n\\000\\001\\000" prefix_len: 8 }', "host bits"),
    ("ipv4_lpm", 'field_id: 1 lpm { value: "\\n" prefix_len: 0 }', "omit the field"),
    ("ipv4_lpm", 'field_id: 1 lpm { value: "\\n" prefix_len: 33 }', r"prefix length 33 not in 1..32"),
    ("ipv4_lpm", 'field_id: 1 exact { value: "\\n" }', "is lpm, got a exact"),
    ("ipv4_lpm", 'field_id: 1 lpm { value: "\\001\\000\\000\\000\\000" prefix_len: 8 }', r"does not fit in bit<32>"),
    ("acl", 'field_id: 1 ternary { value: "\\001" mask: "\\000" }', "mask is 0"),
    ("acl", 'field_id: 1 ternary { value: "\\003" mask: "\\001" }', "bits outside mask"),
    ("acl", 'field_id: 2 range { low: "\\000" high: "\\377\\377" }', "full range"),
    ("acl", 'field_id: 2 range { low: "\\005" high: "\\001" }', r"range low 5 > high 1"),
])
def test_bad_wire_matches_are_refused(p4info: P4Info, table: str, text: str, error: str) -> None:
    pb = p4runtime_pb2.TableEntry()
    text_format.Parse(text, pb.match.add())
    with pytest.raises(CodecError, match=error):
        codec.decode_match(p4info.table(table), pb.match)


def test_a_field_twice_and_an_unknown_field_id(p4info: P4Info) -> None:
    t = p4info.table("ipv4_lpm")
    pb = p4runtime_pb2.TableEntry()
    for _ in range(2):
        m = pb.match.add(field_id=1)
        m.lpm.value, m.lpm.prefix_len = b"\x0a\x00\x00\x00", 8
    with pytest.raises(CodecError, match="given twice"):
        codec.decode_match(t, pb.match)
    pb.match[1].field_id = 9
    with pytest.raises(P4InfoError, match="no match field 9"):
        codec.decode_match(t, pb.match)


def test_match_semantics(p4info: P4Info) -> None:
    assert FieldMatch("lpm", 0x0A000000, 8).matches(0x0AFFFFFF, 32)
    assert not FieldMatch("lpm", 0x0A000000, 8).matches(0x0B000000, 32)
    assert FieldMatch("ternary", 0x0A, 0x0F).matches(0xFA, 8)
    assert FieldMatch("range", 3, 5).matches(5, 16) and not FieldMatch("range", 3, 5).matches(6, 16)
    assert FieldMatch("optional", 2).matches(2, 9) and not FieldMatch("exact", 2).matches(3, 9)


# ------------------------------------------------------------------------------- actions, entries


def test_action_round_trip_and_refusals(p4info: P4Info) -> None:
    call = codec.action_call(p4info, "ipv4_forward", {"dstAddr": "00:00:00:00:00:01", "port": 3})
    assert call == ActionCall("MyIngress.ipv4_forward", {"dstAddr": 1, "port": 3})
    pb = p4runtime_pb2.Action()
    codec.encode_action(p4info, call, pb)
    assert _text(pb) == ('action_id: 16777217 params { param_id: 1 value: "\\001" } '
                         'params { param_id: 2 value: "\\003" }')
    assert codec.decode_action(p4info, pb) == call
    with pytest.raises(CodecError, match=r"parameter\(s\) port missing"):
        codec.action_call(p4info, "ipv4_forward", {"dstAddr": 1})
    with pytest.raises(P4InfoError, match=r"no parameter 'x'"):
        codec.action_call(p4info, "ipv4_forward", {"dstAddr": 1, "port": 1, "x": 1})
    with pytest.raises(CodecError, match=r"does not fit in bit<9>"):
        codec.action_call(p4info, "ipv4_forward", {"dstAddr": 1, "port": 512})
    twice = p4runtime_pb2.Action()
    twice.CopyFrom(pb)
    twice.params.add(param_id=2, value=b"\x04")
    with pytest.raises(CodecError, match="given twice"):
        codec.decode_action(p4info, twice)
    wide = p4runtime_pb2.Action()
    wide.CopyFrom(pb)
    wide.params[1].value = b"\x02\x00"
    with pytest.raises(CodecError, match=r"parameter port: value 0x200 does not fit in bit<9>"):
        codec.decode_action(p4info, wide)


def test_table_entry_round_trip_with_priority_metadata_and_counter(p4info: P4Info) -> None:
    t = p4info.table("acl")
    entry = TableEntry({"hdr.ipv4.srcAddr": FieldMatch("ternary", 0x0A000000, 0xFF000000)},
                       ActionCall("MyIngress.allow", {}), priority=7, controller_metadata=5, metadata=b"m",
                       idle_timeout_ns=9, packets=3, bytes=300)
    pb = p4runtime_pb2.TableEntry()
    codec.encode_table_entry(p4info, t, entry, pb, with_counter=True)
    assert pb.counter_data.packet_count == 3 and pb.priority == 7
    got_table, got = codec.decode_table_entry(p4info, pb)
    assert got_table is t and got == entry
    assert codec.entry_key(t, got.match, got.priority) == codec.entry_key(t, entry.match, 7)
    # Without with_counter (or for a table without a direct counter) no counter data is sent.
    plain = p4runtime_pb2.TableEntry()
    codec.encode_table_entry(p4info, t, entry, plain)
    assert not plain.HasField("counter_data")
    key_only = p4runtime_pb2.TableEntry()
    codec.encode_entry_key(t, entry.match, entry.priority, key_only)
    assert codec.decode_entry_key(p4info, key_only) == (t, entry.match, 7)
    with pytest.raises(CodecError, match="only direct actions"):
        codec.decode_table_entry(p4info, key_only)


def test_default_entry(p4info: P4Info) -> None:
    t = p4info.table("acl")
    pb = p4runtime_pb2.TableEntry()
    codec.encode_default_entry(p4info, t, ActionCall("MyIngress.drop", {}), pb, CounterValue(1, 64))
    assert pb.is_default_action and not pb.match and pb.counter_data.byte_count == 64
    _, entry = codec.decode_table_entry(p4info, pb, require_exact=False)
    assert entry.action == ActionCall("MyIngress.drop", {}) and (entry.packets, entry.bytes) == (1, 64)
    reset = p4runtime_pb2.TableEntry()
    codec.encode_default_entry(p4info, t, None, reset)
    assert reset.is_default_action and not reset.HasField("action")


# ------------------------------------------------------------------------------- counters, digests, PRE, packets


def test_counter_entries(p4info: P4Info) -> None:
    info = p4info.counter("hits")
    pb = p4runtime_pb2.CounterEntry()
    codec.encode_counter_entry(info, 3, CounterValue(2, 128), pb)
    assert codec.decode_counter_entry(p4info, pb) == (info, 3, CounterValue(2, 128))
    wildcard = p4runtime_pb2.CounterEntry()
    codec.encode_counter_entry(info, None, None, wildcard)
    assert codec.decode_counter_entry(p4info, wildcard)[1] is None and not wildcard.HasField("data")
    zero = p4runtime_pb2.CounterEntry()
    codec.encode_counter_entry(info, 0, None, zero)
    assert codec.decode_counter_entry(p4info, zero)[1] == 0


def test_digest_entries_and_lists(p4info: P4Info) -> None:
    info = p4info.digest("hot_digest_t")
    pb = p4runtime_pb2.DigestEntry()
    codec.encode_digest_entry(info, DigestConfig(5, 2, 7), pb)
    assert codec.decode_digest_entry(p4info, pb) == (info, DigestConfig(5, 2, 7))
    lst = p4runtime_pb2.DigestList()
    codec.encode_digest_list(info, 4, [(0xAB, 0), ((1 << 64) - 1, 9)], 123, lst)
    assert (lst.list_id, lst.timestamp, lst.data[0].struct.members[1].bitstring) == (4, 123, b"\x00")
    assert codec.decode_digest_list(p4info, lst) == (info, [{"key": 0xAB, "count": 0},
                                                            {"key": (1 << 64) - 1, "count": 9}])
    with pytest.raises(CodecError, match="2 members expected"):
        codec.encode_digest_list(info, 5, [(1,)], 0, p4runtime_pb2.DigestList())
    with pytest.raises(CodecError, match=r"does not fit in bit<32>"):
        codec.encode_digest_list(info, 5, [(1, 1 << 32)], 0, p4runtime_pb2.DigestList())


def test_multicast_groups() -> None:
    pb = p4runtime_pb2.PacketReplicationEngineEntry()
    codec.encode_multicast_group(7, [(1, 0), (2, 1), (2, 2)], pb)
    gid, replicas = codec.decode_multicast_group(pb)
    assert (gid, replicas) == (7, (Replica(1, 0), Replica(2, 1), Replica(2, 2)))
    assert replicas[1] == (2, 1)  # a replica is its (port, rid) pair
    newer = p4runtime_pb2.PacketReplicationEngineEntry()
    newer.multicast_group_entry.multicast_group_id = 3
    newer.multicast_group_entry.replicas.add(port=b"\x01\x00", instance=4)  # P4Runtime 1.4 bytestring port
    assert codec.decode_multicast_group(newer) == (3, (Replica(256, 4),))
    with pytest.raises(CodecError, match="PRE entries are not supported"):
        codec.decode_multicast_group(p4runtime_pb2.PacketReplicationEngineEntry())


def test_packet_metadata(p4info: P4Info) -> None:
    req = p4runtime_pb2.PacketOut()
    codec.encode_packet_metadata(p4info, "packet_out", {"egress_port": 5}, req.metadata)
    assert codec.decode_packet_metadata(p4info, "packet_out", req.metadata) == {"egress_port": 5}
    with pytest.raises(P4InfoError, match="packet_out has no field 'nope'"):
        codec.encode_packet_metadata(p4info, "packet_out", {"nope": 1}, req.metadata)
    with pytest.raises(P4InfoError, match="no other controller header"):
        codec.encode_packet_metadata(p4info, "other", {"x": 1}, req.metadata)
    with pytest.raises(CodecError, match=r"does not fit in bit<9>"):
        codec.encode_packet_metadata(p4info, "packet_out", {"egress_port": 512}, p4runtime_pb2.PacketOut().metadata)
    bad = p4runtime_pb2.PacketIn()
    bad.metadata.add(metadata_id=9, value=b"\x01")
    with pytest.raises(CodecError, match="unknown packet metadata id 9"):
        codec.decode_packet_metadata(p4info, "packet_in", bad.metadata)
