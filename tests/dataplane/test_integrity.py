"""Integrity: what a slot holds is exactly what is served, writers are (port, source) pairs, hosts cannot spoof.

docs/design/correctness.md, "What a switch guarantees", packet by packet: the writer's check is
stored and returned as is; requesters cannot fill, invalidate, poison or aim replies at a
victim; bytes of an older placement or another fragment are never served; DATA a switch
built is never stored as a writer's; a NO_CACHE answer repairs a slot; a waiter that pinned
a generation does not share its NACK with those that did not.
"""

from __future__ import annotations

from kvpool import contract as n
from kvpool import wire
from kvpool.contract import CoalesceStat as CoStat
from kvpool.contract import DropReason as Drop
from kvpool.contract import PoolStat, PoolState
from kvpool.wire import FRAG_PAYLOAD

from . import program
from .harness import Target
from .packets import KV_OFF, data_frame, get_frame, host, kv_frame, served_frame, stripped_get, with_ttl
from .program import HOLDER

KEY = 0x1D1D_0000_0000_0001
OTHER = 0x1D1D_0000_0000_0002
BASE = 10
CHUNK = program.chunk_bytes(2 * FRAG_PAYLOAD + 300, seed=5)  # three fragments
BAD = program.chunk_bytes(2 * FRAG_PAYLOAD + 300, seed=6)  # an attacker's bytes of the same shape
GEN = 7
CHECK_OFF = KV_OFF + wire.FIELD_BY_NAME["check"].offset


def _setup(target: Target, state: PoolState = program.FILLING) -> int:
    program.routes(target.sw)
    program.guard(target.sw)
    program.writer(target.sw, HOLDER)
    return program.admit(target.sw, KEY, BASE, len(CHUNK), generation=GEN, state=state)


def _fill(target: Target, chunk: bytes = CHUNK, key: int = KEY, flags: int = 0, generation: int = GEN) -> None:
    for i in range(wire.fragment_count(len(chunk))):
        frame = data_frame(HOLDER, host(1), key, i, chunk, generation=generation, flags=flags)
        target.send(HOLDER.port, frame)
        target.expect(1, with_ttl(frame, 63))


def _ask(target: Target, frag: int, key: int = KEY, by: int = 2) -> None:
    target.send(by, get_frame(host(by), HOLDER, key, frag, request_id=frag + 1, room=True))


def _served(frag: int, chunk: bytes = CHUNK, key: int = KEY, by: int = 2) -> bytes:
    return served_frame(host(by), HOLDER, key, frag, chunk, request_id=frag + 1, generation=GEN)


def _with_check(frame: bytes, check: int) -> bytes:
    return frame[:CHECK_OFF] + check.to_bytes(8, "big") + frame[CHECK_OFF + 8:]


def test_the_writers_check_is_stored_and_returned_as_is(target: Target) -> None:
    _setup(target)
    good = data_frame(HOLDER, host(1), KEY, 1, CHUNK, generation=GEN)
    odd = _with_check(good, 0x0123_4567_89AB_CDEF)  # whatever the writer says, the switch never recomputes
    target.send(HOLDER.port, odd)
    target.expect(1, with_ttl(odd, 63))
    _ask(target, 1)
    target.expect(2, _with_check(_served(1), 0x0123_4567_89AB_CDEF))
    target.expect_no_other_packets()


def test_a_requester_cannot_fill_invalidate_or_aim_replies_at_a_victim(target: Target) -> None:
    _setup(target)
    _fill(target)
    attacker, victim = host(4), host(1)
    spoofs = [
        # DATA and INVALIDATE posing as the holder, with any generation.
        kv_frame(HOLDER, host(2), wire.data_packet(KEY, 0, BAD, generation=GEN), sport=wire.KVPOOL_UDP_PORT),
        kv_frame(HOLDER, host(2), wire.data_packet(KEY, 0, BAD, generation=0xFFFFFFFF), sport=wire.KVPOOL_UDP_PORT),
        kv_frame(HOLDER, host(2), wire.invalidate_packet(KEY, 0xFFFFFFFF)),
        kv_frame(HOLDER, host(2), wire.invalidate_packet(KEY, GEN + 1)),
        # A GET posing as the victim, for a chunk the switch would answer, and a range GET.
        get_frame(victim, HOLDER, KEY, 0, room=True),
        get_frame(victim, HOLDER, KEY, 0, count=3),
    ]
    for frame in spoofs:
        target.send(attacker.port, frame)
    target.expect_no_other_packets()  # nothing reached the holder, the victim or anyone
    assert target.counters(n.DROP_REASON) == {Drop.SPOOFED: len(spoofs)}
    # With its own address it is just not a writer: its DATA goes where it was sent, unstored.
    own = kv_frame(attacker, host(2), wire.data_packet(KEY, 0, BAD, generation=GEN), sport=wire.KVPOOL_UDP_PORT)
    target.send(attacker.port, own)
    target.expect(2, with_ttl(own, 63))
    assert target.counter(n.POOL_STATS, PoolStat.FILL_UNAUTH) == 1
    inv = kv_frame(attacker, HOLDER, wire.invalidate_packet(KEY, 0xFFFFFFFF))
    target.send(attacker.port, inv)
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {Drop.SPOOFED: len(spoofs), Drop.NOT_WRITER: 1}
    # The holder's bytes are still what the switch serves.
    for frag in range(3):
        _ask(target, frag)
        target.expect(2, _served(frag))
    target.expect_no_other_packets()


def test_a_writer_is_its_address_on_its_port_only(target: Target) -> None:
    program.routes(target.sw)
    program.guard(target.sw, [host(1), host(2), HOLDER])  # port 4 faces another switch: not guarded
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK), generation=GEN)
    frame = data_frame(HOLDER, host(1), KEY, 0, BAD, generation=GEN)
    target.send(4, frame)  # the holder's address, but not from the holder's port
    target.expect(1, with_ttl(frame, 63))
    assert target.counter(n.POOL_STATS, PoolStat.FILL_UNAUTH) == 1
    assert target.counters(n.SLOT_FILLS) == {}


def test_data_a_switch_built_or_replicated_is_never_stored(target: Target) -> None:
    _setup(target)
    for flags in (wire.Flag.SWITCH_SERVED, wire.Flag.COALESCED, wire.Flag.SWITCH_SERVED | wire.Flag.COALESCED):
        frame = data_frame(HOLDER, host(1), KEY, 0, CHUNK, generation=GEN, flags=int(flags))
        target.send(HOLDER.port, frame)
        target.expect(1, with_ttl(frame, 63))
    assert target.counter(n.POOL_STATS, PoolStat.FILL_REPLICA) == 3
    assert target.counters(n.SLOT_FILLS) == {}
    _ask(target, 0)
    target.expect(HOLDER.port, stripped_get(host(2), HOLDER, KEY, 0, request_id=1))
    target.expect_no_other_packets()


def test_bytes_of_an_older_placement_or_another_fragment_are_never_served(target: Target) -> None:
    _setup(target)
    _fill(target)
    # Evicted, then admitted again one slot lower: slot 10 still holds the old fragment 0
    # where the new fragment 1 sits, slot 11 the old fragment 1 where the new fragment 2
    # sits (same key, same generation: only the placement tells them apart).
    target.sw.delete_entry(n.POOL_LOOKUP, {n.KEY_CHUNK_KEY: KEY})
    program.admit(target.sw, KEY, BASE - 1, len(CHUNK), generation=GEN)
    for frag in range(3):
        _ask(target, frag)
        target.expect(HOLDER.port, stripped_get(host(2), HOLDER, KEY, frag, request_id=frag + 1))
    # Another chunk placed over the old slots is not served the old bytes either.
    program.admit(target.sw, OTHER, BASE + 1, len(CHUNK), generation=GEN)
    for frag in range(2):
        _ask(target, frag, key=OTHER)
        target.expect(HOLDER.port, stripped_get(host(2), HOLDER, OTHER, frag, request_id=frag + 1))
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.MISS_UNFILLED) == 5
    assert target.counter(n.POOL_STATS, PoolStat.HIT) == 0


def test_a_no_cache_answer_repairs_a_corrupted_slot(target: Target) -> None:
    _setup(target, state=program.VALID)
    good = data_frame(HOLDER, host(1), KEY, 1, CHUNK, generation=GEN)
    flipped = bytearray(good)
    flipped[KV_OFF + wire.HEADER_LEN + 99] ^= 0x08  # a bit flipped between the holder and the switch
    target.send(HOLDER.port, bytes(flipped))
    target.expect(1, with_ttl(bytes(flipped), 63))
    _ask(target, 1)
    stored = bytearray(_served(1))
    stored[KV_OFF + wire.HEADER_LEN + 99] ^= 0x08
    target.expect(2, bytes(stored))  # the switch serves what it stored; the receiver's check catches it
    # The same DATA again changes nothing in VALID state: the slot looks current.
    target.send(HOLDER.port, good)
    target.expect(1, with_ttl(good, 63))
    assert target.counter(n.POOL_STATS, PoolStat.FILL_SKIPPED) == 1
    # The requester asks again with NO_CACHE; the holder's answer carries it and rewrites the slot.
    repair = data_frame(HOLDER, host(1), KEY, 1, CHUNK, generation=GEN, flags=int(wire.Flag.NO_CACHE))
    target.send(HOLDER.port, repair)
    target.expect(1, with_ttl(repair, 63))
    assert target.counter(n.POOL_STATS, PoolStat.REPAIR) == 1
    _ask(target, 1)
    target.expect(2, _served(1))
    target.expect_no_other_packets()


def test_a_waiter_pinned_to_a_generation_does_not_share_its_nack(target: Target) -> None:
    program.routes(target.sw)
    program.guard(target.sw)
    program.writer(target.sw, HOLDER)
    program.waiters(target.sw, [host(1), host(2), host(4)])
    first = get_frame(host(1), HOLDER, KEY, 0, count=2, request_id=11, sport=5001)
    target.send(1, first)
    target.expect(HOLDER.port, with_ttl(first, 63))
    pinned = get_frame(host(2), HOLDER, KEY, 0, count=2, request_id=22, sport=5002, generation=5)
    target.send(2, pinned)
    target.expect(HOLDER.port, with_ttl(pinned, 63))  # another generation asked for: not absorbed
    target.send(4, get_frame(host(4), HOLDER, KEY, 0, count=2, request_id=44, sport=5004))
    target.expect_no_other_packets()  # the same question as host 1's: absorbed
    assert target.counter(n.COALESCE_STATS, CoStat.OTHER_GENERATION) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == 1
    # The holder has moved on: host 2's pinned GET gets STALE_GENERATION, and only host 2.
    stale = wire.nack_packet(KEY, wire.Status.STALE_GENERATION, 22, frag_count=2, generation=5)
    nack = kv_frame(HOLDER, host(2), stale, sport=wire.KVPOOL_UDP_PORT, dport=5002)
    target.send(HOLDER.port, nack)
    target.expect(2, with_ttl(nack, 63))
    target.expect_no_other_packets()
    # Host 1's question gets DATA, and host 4, which asked the same, gets a copy of it.
    target.send(HOLDER.port, data_frame(HOLDER, host(1), KEY, 0, CHUNK, generation=GEN, request_id=11, dport=5001))
    for to, rid, port, coalesced in ((1, 11, 5001, False), (4, 44, 5004, True)):
        flags = int(wire.Flag.COALESCED) if coalesced else 0
        datagram = wire.data_packet(KEY, 0, CHUNK, request_id=rid, generation=GEN, flags=flags)
        # The owner's copy leaves as the holder sent it; the other waiter's is rewritten.
        target.expect(to, kv_frame(HOLDER, host(to), datagram, sport=wire.KVPOOL_UDP_PORT, dport=port, ttl=63,
                                   udp_checksum=0 if coalesced else None))
    target.expect_no_other_packets()
