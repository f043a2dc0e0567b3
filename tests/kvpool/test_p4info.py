"""P4Info helper (names, widths, bytestrings) and the switch model's control state."""

from __future__ import annotations

import random
from pathlib import Path

import grpc
import pytest
from p4.v1 import p4runtime_pb2

from kvpool.p4rt import codec
from kvpool.p4rt.codec import (
    ActionCall,
    CounterValue,
    DigestConfig,
    FieldMatch,
    Replica,
    TableEntry,
    canonical,
    decode_bytes,
    encode_int,
    to_int,
)
from kvpool.p4rt.p4info import P4Info, P4InfoError
from switchmodel.state import DigestList, PacketIn, StateError, SwitchState
from tests.paths import P4RT_MINI

MINI = P4RT_MINI


@pytest.fixture
def p4info() -> P4Info:
    return P4Info.load(MINI)


@pytest.fixture
def state(p4info: P4Info) -> SwitchState:
    s = SwitchState()
    s.set_pipeline(p4info, b"", cookie=7)
    return s


def test_bytestrings_are_canonical_and_range_checked() -> None:
    assert encode_int(0, 9) == b"\x00"
    assert encode_int(1, 9) == b"\x01"
    assert encode_int(511, 9) == b"\x01\xff"
    with pytest.raises(ValueError, match="does not fit"):
        encode_int(512, 9)
    with pytest.raises(ValueError, match="negative"):
        encode_int(-1, 8)
    # Decoding is as lenient as PI: any length whose value fits, empty = 0.
    assert decode_bytes(b"\x00\x05", 16) == 5
    assert decode_bytes(b"\x00\x00\x05", 16) == 5
    assert decode_bytes(b"", 8) == 0
    with pytest.raises(ValueError, match="does not fit"):
        decode_bytes(b"\x02\x00", 9)
    with pytest.raises(ValueError, match="does not fit"):
        decode_bytes(b"\x01\x00\x00", 16)
    assert canonical(b"\x00\x00\x01\x00") == b"\x01\x00"
    assert canonical(b"\x00\x00") == b"\x00"


def test_value_parsing() -> None:
    assert to_int("10.0.1.2", 32) == 0x0A000102
    assert to_int("00:11:22:33:44:ff", 48) == 0x0011223344FF
    assert to_int("0x1ff", 9) == 511
    assert to_int("17", 8) == 17
    assert to_int(b"\x01\x02", 16) == 0x102
    assert to_int("2001:db8::1", 128) == 0x20010DB8000000000000000000000001
    with pytest.raises(ValueError, match="does not fit"):
        to_int("10.0.0.1", 16)
    with pytest.raises(ValueError, match="bad"):
        to_int("nonsense", 8)


def test_names_ids_and_widths(p4info: P4Info) -> None:
    t = p4info.table("MyIngress.pool")
    assert p4info.table("pool") is t
    assert p4info.table(t.id) is t
    assert [f.name for f in t.match_fields] == ["hdr.kv.key", "sm.ingress_port"]
    assert t.match_field("sm.ingress_port").bitwidth == 9
    assert not t.needs_priority and p4info.table("acl").needs_priority
    assert t.action_scope(p4info.action("NoAction").id) == "DEFAULT_ONLY"
    fwd = p4info.action("ipv4_forward")
    assert [(p.name, p.bitwidth) for p in fwd.params] == [("dstAddr", 48), ("port", 9)]
    assert p4info.counter("hits").size == 16
    assert p4info.direct_counter("acl_counter").table_id == p4info.table("acl").id
    assert p4info.register("slots").bitwidth == 1024
    assert p4info.digest("hot_digest_t").members == (("key", 64), ("count", 32))
    assert [m[1] for m in p4info.packet_metadata("packet_in").metadata] == ["ingress_port"]
    action = p4runtime_pb2.Action()
    codec.encode_action(p4info, codec.action_call(p4info, "ipv4_forward", {"dstAddr": "00:00:00:00:00:01", "port": 3}),
                        action)
    assert [(p.param_id, p.value) for p in action.params] == [(1, b"\x01"), (2, b"\x03")]
    assert "MyIngress.pool" in p4info.all_names()["table"]


def test_unknown_names_list_the_known_ones(p4info: P4Info) -> None:
    with pytest.raises(P4InfoError, match=r"no table 'nope'.*MyIngress\.pool"):
        p4info.table("nope")
    with pytest.raises(P4InfoError, match=r"no parameter 'x'.*slot, nfrags"):
        p4info.action("pool_hit").param("x")
    with pytest.raises(ValueError, match=r"parameter\(s\) port missing"):
        codec.action_call(p4info, "ipv4_forward", {"dstAddr": 1})


def test_binary_p4info_loads(tmp_path: Path, p4info: P4Info) -> None:
    path = tmp_path / "p.bin"
    path.write_bytes(p4info.message.SerializeToString())
    assert P4Info.load(path).table("pool").size == 4


def _pool(key: int, port: int, slot: int) -> TableEntry:
    return TableEntry({"hdr.kv.key": FieldMatch("exact", key), "sm.ingress_port": FieldMatch("exact", port)},
                      ActionCall("MyIngress.pool_hit", {"slot": slot, "nfrags": 4}))


def test_exact_table_insert_lookup_modify_delete(state: SwitchState) -> None:
    assert state.lookup("pool", [5, 1]).hit is False
    assert state.lookup("pool", [5, 1]).action == "NoAction"
    state.insert_entry("pool", _pool(5, 1, 10))
    res = state.lookup_exact("pool", 5, 1)
    assert res.hit and res.action == "MyIngress.pool_hit" and res.params == {"slot": 10, "nfrags": 4}
    assert state.lookup("MyIngress.pool", {"hdr.kv.key": 5, "sm.ingress_port": 1}).params["slot"] == 10
    with pytest.raises(StateError) as e:
        state.insert_entry("pool", _pool(5, 1, 11))
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    state.modify_entry("pool", _pool(5, 1, 12))
    assert state.lookup_exact("pool", 5, 1).params["slot"] == 12
    state.delete_entry("pool", _pool(5, 1, 0).match)
    assert not state.lookup_exact("pool", 5, 1).hit
    with pytest.raises(StateError) as e:
        state.delete_entry("pool", _pool(5, 1, 0).match)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    for k in range(4):
        state.insert_entry("pool", _pool(k, 0, k))
    with pytest.raises(StateError) as e:
        state.insert_entry("pool", _pool(9, 0, 9))
    # What BMv2 answers through PI: the target's TABLE_FULL is "Error when adding match entry to target".
    assert e.value.code == grpc.StatusCode.UNKNOWN and "is full" in e.value.message


def test_lpm_longest_prefix_and_default(state: SwitchState) -> None:
    def route(prefix: int, plen: int, port: int) -> TableEntry:
        return TableEntry({"hdr.ipv4.dstAddr": FieldMatch("lpm", prefix, plen)},
                          ActionCall("MyIngress.ipv4_forward", {"dstAddr": port, "port": port}))
    state.insert_entry("ipv4_lpm", route(0x0A000000, 8, 1))
    state.insert_entry("ipv4_lpm", route(0x0A000100, 24, 2))
    assert state.lookup_exact("ipv4_lpm", 0x0A000105).params["port"] == 2
    assert state.lookup_exact("ipv4_lpm", 0x0A020105).params["port"] == 1
    state.set_default_action("ipv4_lpm", "MyIngress.drop")
    miss = state.lookup_exact("ipv4_lpm", 0x0B000001)
    assert not miss.hit and miss.action == "MyIngress.drop"
    state.reset_default_action("ipv4_lpm")
    assert state.default_action("ipv4_lpm") == ActionCall("NoAction", {})


def test_ternary_priority_and_direct_counter(state: SwitchState) -> None:
    low = TableEntry({"hdr.ipv4.srcAddr": FieldMatch("ternary", 0x0A000000, 0xFF000000)},
                     ActionCall("MyIngress.allow"), priority=10)
    high = TableEntry({"hdr.ipv4.srcAddr": FieldMatch("ternary", 0x0A000001, 0xFFFFFFFF),
                       "hdr.udp.dstPort": FieldMatch("range", 7000, 8000)},
                      ActionCall("MyIngress.drop"), priority=20)
    state.insert_entry("acl", low)
    state.insert_entry("acl", high)
    assert state.lookup("acl", [0x0A000001, 7470, 3], packet_len=100).action == "MyIngress.drop"
    assert state.lookup("acl", [0x0A000001, 9000, 3], packet_len=50).action == "MyIngress.allow"
    assert state.lookup("acl", [0x0B000001, 7470, 3], packet_len=10).hit is False
    assert (high.packets, high.bytes, low.packets, low.bytes) == (1, 100, 1, 50)
    assert state.default_counter("acl") == CounterValue(1, 10)


def test_default_only_action_cannot_be_an_entry(state: SwitchState) -> None:
    bad = TableEntry(_pool(1, 1, 1).match, ActionCall("NoAction"))
    with pytest.raises(StateError, match="default-only") as e:
        state.insert_entry("pool", bad)
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED  # the spec's code, and PI's


def test_multicast_counters_registers(state: SwitchState) -> None:
    state.insert_group(1, [Replica(1, 0), Replica(1, 1), Replica(2, 0)])
    assert state.multicast_group(1) == (Replica(1, 0), Replica(1, 1), Replica(2, 0))
    assert state.multicast_group(99) == ()
    with pytest.raises(StateError, match="twice"):
        state.modify_group(1, [Replica(1, 0), Replica(1, 0)])
    state.counter_add("hits", 3, 1500)
    state.counter_add("MyIngress.hits", 3, 500)
    assert state.counter_read("hits", 3) == CounterValue(2, 2000)
    with pytest.raises(IndexError):
        state.counter_add("hits", 16, 1)
    big = (1 << 1024) - 1
    state.register_write("slots", 7, big + 1 + 5)  # truncated to the register's width, as in P4
    assert state.register_read("slots", 7) == 5
    assert state.register_size("slots") == 8


def test_digest_batching_dedup_and_ack() -> None:
    now = [0]
    s = SwitchState(clock_ns=lambda: now[0])
    s.set_pipeline(P4Info.load(MINI))
    assert s.emit_digest("hot_digest_t", {"key": 1, "count": 2}) is False  # not configured: dropped
    s.configure_digest("hot_digest_t", DigestConfig(max_timeout_ns=1000, max_list_size=2, ack_timeout_ns=10**6))
    assert s.emit_digest("hot_digest_t", [1, 2])
    assert s.emit_digest("hot_digest_t", [1, 2]) is False  # same data already queued
    assert s.next_messages(0) == []  # one item, list size 2, timeout not reached
    now[0] = 1000
    (lst,) = s.next_messages(0)
    assert isinstance(lst, DigestList) and lst.data == ((1, 2),) and lst.list_id == 1
    assert s.emit_digest("hot_digest_t", [1, 2]) is False  # in an unacked list
    assert s.ack_digest("hot_digest_t", 1)
    assert s.emit_digest("hot_digest_t", [1, 2])
    assert s.emit_digest("hot_digest_t", [3, 4])
    (lst2,) = s.next_messages(0)  # full list goes out at once
    assert isinstance(lst2, DigestList) and lst2.data == ((1, 2), (3, 4)) and lst2.list_id == 2
    now[0] += 10**6  # ack timeout passes: the data may be reported again
    assert s.emit_digest("hot_digest_t", [3, 4])
    s.remove_digest("hot_digest_t")
    s.configure_digest("hot_digest_t", DigestConfig(max_timeout_ns=0, max_list_size=1, ack_timeout_ns=0))
    assert s.emit_digest("hot_digest_t", [9, 9]) and s.emit_digest("hot_digest_t", [9, 9])  # no cache at 0
    lists = s.next_messages(0)
    assert [m.list_id for m in lists if isinstance(m, DigestList)] == [3, 4]  # ids go on after DELETE + INSERT
    assert s.outstanding_digest_lists("hot_digest_t") == []
    s.send_packet_in(b"abc", {"ingress_port": 3})
    msgs = s.next_messages(0)
    assert PacketIn(b"abc", {"ingress_port": 3}) in msgs


def test_reconcile_keeps_state_and_commit_clears(state: SwitchState, p4info: P4Info) -> None:
    state.insert_entry("pool", _pool(1, 1, 1))
    state.insert_group(3, [Replica(4, 0)])
    state.counter_add("hits", 0, 10)
    state.reconcile_pipeline(p4info, b"", 8)
    assert state.entry_count("pool") == 1 and state.multicast_group(3) == (Replica(4, 0),)
    assert state.counter_read("hits", 0) == CounterValue(1, 10)
    state.set_pipeline(p4info, b"", 9)
    assert state.entry_count("pool") == 0 and state.multicast_groups() == {}


def test_defaults_from_bmv2_json(p4info: P4Info) -> None:
    doc = (b'{"actions": [{"name": "MyIngress.drop", "id": 3, "runtime_data": []}],'
           b' "pipelines": [{"tables": [{"name": "MyIngress.ipv4_lpm",'
           b' "default_entry": {"action_id": 3, "action_data": []}}]}]}')
    s = SwitchState()
    s.set_pipeline(p4info, doc)
    assert s.default_action("ipv4_lpm").action == "MyIngress.drop"


def test_no_pipeline_is_failed_precondition() -> None:
    s = SwitchState()
    with pytest.raises(StateError) as e:
        s.insert_group(1, [])
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_lpm_index_agrees_with_brute_force(state: SwitchState) -> None:
    rng = random.Random(7)
    prefixes: dict[tuple[int, int], int] = {}
    while len(prefixes) < 300:
        plen = rng.choice([0, 1, 8, 16, 20, 24, 31, 32])
        value = rng.getrandbits(32) & (((1 << plen) - 1) << (32 - plen)) if plen else 0
        prefixes.setdefault((value, plen), len(prefixes))
    for (value, plen), port in prefixes.items():
        match = {"hdr.ipv4.dstAddr": FieldMatch("lpm", value, plen)} if plen else {}
        state.insert_entry("ipv4_lpm", TableEntry(match, ActionCall("MyIngress.ipv4_forward",
                                                                    {"dstAddr": 0, "port": port % 512})))
    for (value, plen), _ in list(prefixes.items())[::3]:  # deletes keep the index consistent
        state.delete_entry("ipv4_lpm", {"hdr.ipv4.dstAddr": FieldMatch("lpm", value, plen)} if plen else {})
        del prefixes[(value, plen)]
    for _ in range(2000):
        addr = rng.getrandbits(32) if rng.random() < 0.5 else rng.choice(list(prefixes))[0] | rng.getrandbits(8)
        best = max(((plen, port) for (value, plen), port in prefixes.items()
                    if plen == 0 or addr >> (32 - plen) == value >> (32 - plen)), default=None)
        res = state.lookup_exact("ipv4_lpm", addr)
        if best is None:
            assert not res.hit
        else:
            assert res.hit and res.params["port"] == best[1] % 512


def test_reconcile_with_a_changed_program_keeps_what_still_fits(state: SwitchState, p4info: P4Info) -> None:
    state.insert_entry("pool", _pool(1, 1, 1))
    state.insert_entry("ipv4_lpm", TableEntry({"hdr.ipv4.dstAddr": FieldMatch("lpm", 0x0A000000, 8)},
                                              ActionCall("MyIngress.drop")))
    state.insert_entry("acl", TableEntry({"sm.ingress_port": FieldMatch("optional", 3)}, ActionCall("MyIngress.allow"),
                                         priority=1))
    changed = p4info.message.__class__()
    changed.CopyFrom(p4info.message)
    del changed.tables[1]  # the pool table is gone
    changed.actions[2].preamble.name = "MyIngress.drop_renamed"  # so is the action of the route
    state.reconcile_pipeline(P4Info(changed))
    assert state.entry_count("ipv4_lpm") == 0  # its action no longer exists
    assert state.lookup("acl", [0, 0, 3]).action == "MyIngress.allow"  # still valid: kept
    with pytest.raises(StateError):
        state.entry_count("pool")
    assert state.counter_read("hits", 0) == CounterValue(0, 0)


TNA_P4INFO = """
pkg_info { arch: "tna" }
tables {
  preamble { id: 33554433 name: "pipe.MyIngress.pool.pool_lookup" alias: "pool_lookup" }
  match_fields { id: 1 name: "hdr.kv.chunk_key" bitwidth: 64 match_type: EXACT }
  action_refs { id: 16777217 }
  size: 16385
}
actions { preamble { id: 16777217 name: "pipe.MyIngress.pool.pool_entry" alias: "pool_entry" } }
counters { preamble { id: 302055425 name: "MyIngress.pool.pool_stats" alias: "pool_stats" } size: 16 }
registers {
  preamble { id: 369098753 name: "MyIngress.pool.slot_tag" alias: "slot_tag" }
  type_spec { struct { name: "pair32_t" } }
  size: 16384
}
type_info {
  structs {
    key: "pair32_t"
    value {
      members { name: "hi" type_spec { bitstring { bit { bitwidth: 32 } } } }
      members { name: "lo" type_spec { bitstring { bit { bitwidth: 32 } } } }
    }
  }
}
"""


def test_a_tna_p4info_answers_to_the_v1model_names() -> None:
    """bf-p4c names tables and actions ``pipe.<control>...``; the contract's names reach them."""
    info = P4Info.from_text(TNA_P4INFO)
    assert info.pipe_prefix == "pipe."
    assert info.table("MyIngress.pool.pool_lookup") is info.table("pipe.MyIngress.pool.pool_lookup")
    assert info.action("MyIngress.pool.pool_entry").id == 16777217
    assert info.counter("MyIngress.pool.pool_stats").size == 16
    # A register of pairs of 32-bit halves is 64 bits wide.
    assert (info.register("MyIngress.pool.slot_tag").size, info.register("MyIngress.pool.slot_tag").bitwidth) == (
        16384, 64)
    assert [t.name for t in info.tables] == ["pipe.MyIngress.pool.pool_lookup"]


def test_a_v1model_p4info_is_not_unprefixed() -> None:
    info = P4Info.from_text(TNA_P4INFO.replace('arch: "tna"', 'arch: "v1model"'))
    assert info.pipe_prefix == ""
    assert not info.has("table", "MyIngress.pool.pool_lookup")
