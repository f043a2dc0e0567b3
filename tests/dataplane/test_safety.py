"""Safety: malformed kvpool headers dropped and counted by reason, writers ACL, bad P4Runtime writes.

Every malformed packet is followed by a good one, which the switch must still forward.
The drop reasons follow ``kvpool.wire.validate``'s order, which the test checks too.
"""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest
from p4.v1 import p4runtime_pb2

from kvpool import contract as n
from kvpool import wire
from kvpool.contract import DropReason as Drop
from kvpool.contract import PoolStat
from kvpool.wire import FRAG_PAYLOAD, Header, Opcode, WireError

from . import program
from .harness import Target
from .packets import data_frame, get_frame, host, kv_frame, with_ttl
from .program import HOLDER

KEY = 0xBAD5EED
CHUNK = program.chunk_bytes(FRAG_PAYLOAD + 10)

_REASONS = {"bad_version": Drop.BAD_VERSION, "bad_opcode": Drop.BAD_OPCODE, "bad_flags": Drop.BAD_FLAGS,
            "bad_range": Drop.BAD_RANGE, "bad_length": Drop.BAD_LENGTH, "bad_status": Drop.BAD_STATUS,
            "truncated": Drop.PARSE_ERROR}


def _data(frag_index: int = 0, frag_count: int = 2, payload_len: int = FRAG_PAYLOAD,
          chunk_len: int = FRAG_PAYLOAD + 10) -> bytes:
    hdr = Header(Opcode.DATA, KEY, frag_index, frag_count, payload_len=payload_len, chunk_len=chunk_len)
    return hdr.pack() + bytes(FRAG_PAYLOAD)


MALFORMED: dict[str, bytes] = {
    "truncated_header": wire.get_packet(KEY, 0)[:20],
    "truncated_payload": _data()[:wire.HEADER_LEN + 1000],
    "wrong_version": Header(Opcode.GET, KEY, version=1).pack(),
    "opcode_zero": Header(0, KEY).pack(),
    "opcode_unknown": Header(9, KEY).pack(),
    "unknown_flag": Header(Opcode.GET, KEY, flags=0x100).pack(),
    "frag_count_zero": Header(Opcode.GET, KEY, frag_count=0).pack(),
    "frag_index_max": Header(Opcode.GET, KEY, frag_index=0xFFFF).pack(),
    "get_range_overflow": Header(Opcode.GET, KEY, frag_index=0xFFF0, frag_count=0x20).pack(),
    "data_index_beyond_chunk": _data(frag_index=2),
    "data_payload_len_zero": _data(payload_len=0),
    "data_payload_len_inconsistent": _data(frag_index=1, payload_len=11),
    "data_chunk_len_inconsistent": _data(chunk_len=3 * FRAG_PAYLOAD),
    "get_with_payload": wire.get_packet(KEY, 0) + b"extra",
    "get_payload_len": Header(Opcode.GET, KEY, payload_len=4).pack(),
    "get_room_short": wire.get_packet(KEY, 0, room=True)[:wire.HEADER_LEN + 1000],
    "invalidate_with_room": wire.invalidate_packet(KEY, 2) + bytes(FRAG_PAYLOAD),
    "get_room_with_payload_len": Header(Opcode.GET, KEY, payload_len=FRAG_PAYLOAD).pack() + bytes(FRAG_PAYLOAD),
    "nack_status_ok": Header(Opcode.NACK, KEY).pack(),
    "nack_status_unknown": Header(Opcode.NACK, KEY, status=77).pack(),
    "get_with_status": Header(Opcode.GET, KEY, status=1).pack(),
}


# A DATA shorter than its fixed payload fails the switch's parser before any length check.
_PARSER_FIRST = {"truncated_payload": Drop.PARSE_ERROR}


def _expected_reason(case: str) -> int:
    try:
        wire.parse(MALFORMED[case])
    except WireError as e:
        return _PARSER_FIRST.get(case, _REASONS[e.reason])
    raise AssertionError(f"{case}: the wire module accepts it")


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_header_dropped_with_its_reason(target: Target, case: str) -> None:
    program.routes(target.sw)
    datagram = MALFORMED[case]
    reason = _expected_reason(case)  # the switch agrees with the wire module
    target.send(1, kv_frame(host(1), HOLDER, datagram))
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {reason: 1}
    assert target.counters(n.POOL_STATS) == {}  # never reached the pool
    ok = get_frame(host(1), HOLDER, KEY, 0)
    target.send(1, ok)
    target.expect(HOLDER.port, with_ttl(ok, 63))
    target.expect_no_other_packets()


def test_valid_nack_is_forwarded(target: Target) -> None:
    program.routes(target.sw)
    nack = kv_frame(HOLDER, host(1), wire.nack_packet(KEY, wire.Status.UNKNOWN_CHUNK, request_id=3),
                    sport=wire.KVPOOL_UDP_PORT, dport=40000)
    target.send(HOLDER.port, nack)
    target.expect(1, with_ttl(nack, 63))
    target.expect_no_other_packets()


def test_data_from_non_writer_passes_without_filling(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, 0, len(CHUNK))
    rogue = data_frame(host(4), host(1), KEY, 0, program.chunk_bytes(len(CHUNK), seed=9))
    target.send(4, rogue)
    target.expect(1, with_ttl(rogue, 63))
    get = get_frame(host(2), HOLDER, KEY, 0)
    target.send(2, get)
    target.expect(HOLDER.port, with_ttl(get, 63))  # nothing was stored to serve
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.FILL_UNAUTH) == 1
    assert target.counters(n.SLOT_FILLS) == {}


# --- P4Runtime writes the switch must refuse -----------------------------------------------------


def _raw_write(target: Target, update: Any) -> str:
    """Send one update as built (no client-side checks) on the controller's connection; its code."""
    errors = target.sw.write_updates([update])
    return errors[0].code if errors else "OK"


def _pool_update(target: Target, key: bytes, params: list[tuple[int, bytes]], table_id: int | None = None) -> Any:
    info = target.sw.p4info
    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    te = u.entity.table_entry
    te.table_id = info.table(n.POOL_LOOKUP).id if table_id is None else table_id
    m = te.match.add()
    m.field_id = info.table(n.POOL_LOOKUP).match_field(n.KEY_CHUNK_KEY).id
    m.exact.value = key
    te.action.action.action_id = info.action(n.POOL_ENTRY).id
    for pid, value in params:
        te.action.action.params.add(param_id=pid, value=value)
    return u


def test_p4runtime_writes_with_wrong_ids_or_widths_are_rejected(target: Target) -> None:
    program.routes(target.sw)
    good = [(1, b"\x01"), (2, b"\x02"), (3, b"\x0b\xb8"), (4, b"\x00"), (5, b"\x01"), (6, b"\x07")]
    cases = {
        "unknown table id": _pool_update(target, b"\x01", good, table_id=0x02FFFFFF),
        "key wider than 64 bits": _pool_update(target, b"\x01" * 9, good),
        "param wider than its 16 bits": _pool_update(target, b"\x01", [*good[:1], (2, b"\x01\x00\x00"), *good[2:]]),
        "unknown param id": _pool_update(target, b"\x01", [*good, (9, b"\x01")]),
        "param missing": _pool_update(target, b"\x01", good[:5]),
    }
    codes = {name: _raw_write(target, u) for name, u in cases.items()}
    assert all(code in ("INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE") for code in codes.values()), codes
    # A port value that does not fit bit<9> (0x200) through the driver's own check fails too.
    with pytest.raises(ValueError, match="bit<9>"):
        target.sw.insert_entry(n.IPV4_ROUTE, {n.KEY_IPV4_DST: ("10.9.9.9", 32)}, n.IPV4_FORWARD,
                               {"port": 0x200, "dst_mac": 1})
    assert target.sw.read_entries(n.POOL_LOOKUP) == []
    # The accepted form of the same entry works, and forwarding never stopped.
    assert _raw_write(target, _pool_update(target, b"\x01", good)) == "OK"
    assert len(target.sw.read_entries(n.POOL_LOOKUP)) == 1
    ok = get_frame(host(1), HOLDER, KEY, 0)
    target.send(1, ok)
    target.expect(HOLDER.port, with_ttl(ok, 63))
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {}  # rejected writes touch no packet


def _mutated(rng: random.Random) -> bytes:
    """A kvpool datagram: a valid one of a random opcode with one or two fields set to edge values."""
    op = rng.choice(list(Opcode))
    chunk_len = rng.choice([1, 1408, 1409, 5000, 3 * FRAG_PAYLOAD])
    count = wire.fragment_count(chunk_len)
    frag = rng.randrange(count)
    fields = {"opcode": int(op), "chunk_key": rng.getrandbits(64), "frag_index": frag, "frag_count": 1,
              "request_id": rng.getrandbits(32), "status": int(wire.Status.BUSY) if op == Opcode.NACK else 0}
    if op == Opcode.DATA:
        fields.update(frag_count=count, chunk_len=chunk_len, payload_len=wire.expected_payload_len(chunk_len, frag))
    edges = {"version": [0, 1, 3, 255], "opcode": [0, 5, 255], "flags": [0x10, 0x8000, 0xF],
             "frag_index": [0, count, 0xFFFE, 0xFFFF], "frag_count": [0, 1, count + 1, 0xFFFF],
             "payload_len": [0, 1, 1407, 1408, 1409], "status": [0, 1, 5, 6], "chunk_len": [0, 1, chunk_len + 1408]}
    for name in rng.sample(sorted(edges), rng.choice([0, 1, 1, 2])):
        fields[name] = rng.choice(edges[name])
    hdr = Header(**fields).pack()
    body = bytes(FRAG_PAYLOAD) if fields["opcode"] == Opcode.DATA else b""
    if rng.random() < 0.1:
        body += b"\x00" * rng.choice([1, 4])  # a datagram longer than its opcode allows
    return hdr + body


def test_random_headers_are_judged_like_kvpool_wire_validate(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, host(1))  # so valid INVALIDATEs pass too
    rng = random.Random(20261122)
    expected_drops: collections.Counter[int] = collections.Counter()
    forwarded = []
    for _ in range(300):
        datagram = _mutated(rng)
        frame = kv_frame(host(1), HOLDER, datagram)
        try:
            wire.parse(datagram)
            forwarded.append(frame)
        except WireError as e:
            expected_drops[_REASONS[e.reason]] += 1
        target.send(1, frame)
    for frame in forwarded:
        target.expect(HOLDER.port, with_ttl(frame, 63))
    target.expect_no_other_packets()
    assert len(expected_drops) >= 5  # the sample covers most reasons
    assert target.counters(n.DROP_REASON) == dict(expected_drops)
