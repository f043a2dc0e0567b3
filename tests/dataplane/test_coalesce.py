"""Coalescing per chunk: GETs join the answer in progress for their chunk, which is multicast to all."""

from __future__ import annotations

import time

from controller.p4runtime import Entry
from kvpool import contract as n
from kvpool import wire
from kvpool.contract import CoalesceStat as CoStat
from kvpool.contract import EgressStat as EgStat
from switchmodel.coalesce import pending_index
from switchmodel.parser import Kv

from . import program
from .harness import Target
from .packets import Mask, data_frame, get_frame, host, kv_frame, with_ttl
from .program import HOLDER

KEY = 0xC0A1E5CE
CHUNK = program.chunk_bytes(3000)  # three fragments
LAST = 2
WAITING = [host(1), host(2), host(4)]


def _replica(to: int, request_id: int, dport: int, frag: int = 0) -> bytes:
    """What a waiter other than the owner receives: the holder's DATA rewritten for it by egress."""
    datagram = wire.data_packet(KEY, frag, CHUNK, request_id=request_id, flags=int(wire.Flag.COALESCED))
    return kv_frame(HOLDER, host(to), datagram, sport=wire.KVPOOL_UDP_PORT, dport=dport, ttl=63,
                    udp_checksum=0)


def _answer(to: int, request_id: int, dport: int, frag: int = 0) -> bytes:
    """The holder's DATA for fragment ``frag`` to host ``to``, as it enters the switch."""
    return data_frame(HOLDER, host(to), KEY, frag, CHUNK, request_id=request_id, dport=dport)


def _range_get(to: int, request_id: int, sport: int, first: int = 0, count: int = 3, flags: int = 0) -> bytes:
    return get_frame(host(to), HOLDER, KEY, first, count=count, request_id=request_id, sport=sport, flags=flags)


def _setup(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.waiters(target.sw, WAITING)

def _hosts_2_and_4_wait(target: Target, first: tuple[int, int], second: tuple[int, int]) -> None:
    """Host 2's GET (request id, UDP port ``first``) goes upstream, host 4's joins it; the answer reaches both."""
    (rid2, port2), (rid4, port4) = first, second
    target.send(2, _range_get(2, rid2, port2))
    target.expect(HOLDER.port, Mask(with_ttl(_range_get(2, rid2, port2), 63)))
    target.send(4, _range_get(4, rid4, port4))
    target.expect_no_other_packets()
    target.send(HOLDER.port, _answer(2, rid2, port2))
    target.expect(2, with_ttl(_answer(2, rid2, port2), 63))
    target.expect(4, _replica(4, rid4, port4))
    target.expect_no_other_packets()


def _three_wait(target: Target) -> None:
    """Hosts 1, 2 and 4 ask for the chunk: host 1's range GET goes upstream, the other two are absorbed."""
    first = _range_get(1, 11, 5001)
    target.send(1, first)
    target.expect(HOLDER.port, with_ttl(first, 63))
    target.send(2, _range_get(2, 22, 5002))
    target.send(4, _range_get(4, 44, 5004, count=2))  # a GET for part of the chunk joins too
    target.expect_no_other_packets()  # both absorbed: the holder saw one GET


def _answer_reaches_all_three(target: Target, frag: int = 0) -> None:
    """The holder answers host 1; every waiter gets its own copy, once."""
    target.send(HOLDER.port, _answer(1, 11, 5001, frag))
    target.expect(1, with_ttl(_answer(1, 11, 5001, frag), 63))
    target.expect(2, _replica(2, 22, 5002, frag))
    target.expect(4, _replica(4, 44, 5004, frag))
    target.expect_no_other_packets()


def test_three_range_gets_one_upstream_and_every_answer_reaches_all_three(target: Target) -> None:
    _setup(target)
    _three_wait(target)
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == 2

    for frag in range(LAST + 1):
        _answer_reaches_all_three(target, frag)
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 3
    assert target.counters(n.WAITER_REPLICAS) == {0: 3, 1: 3, 2: 3}
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 9

    # The chunk's last fragment ended the answer: the next GET for it opens a new one.
    again = _range_get(2, 23, 5002)
    target.send(2, again)
    target.expect(HOLDER.port, with_ttl(again, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 2


def test_the_owners_next_windows_go_upstream_and_a_late_joiner_gets_the_rest(target: Target) -> None:
    _setup(target)
    program.pending_timeout(target.sw, 30_000_000)  # the answer outlives the test's waits on veth targets
    window = _range_get(1, 11, 5001, count=2)
    target.send(1, window)
    target.expect(HOLDER.port, with_ttl(window, 63))
    target.send(HOLDER.port, _answer(1, 11, 5001, 0))
    target.expect(1, with_ttl(_answer(1, 11, 5001, 0), 63))  # alone: forwarded as it came
    # (A single-fragment GET is the pool's: answered by a pool or the holder, it never joins.)
    single = _range_get(4, 44, 5004, count=1)
    target.send(4, single)
    target.expect(HOLDER.port, with_ttl(single, 63))
    # Host 2 joins after fragment 0 passed: absorbed, it gets what follows.
    target.send(2, _range_get(2, 22, 5002))
    target.expect_no_other_packets()
    # The owner's next window is a GET plain forwarding would send too: it goes upstream.
    nxt = _range_get(1, 11, 5001, first=1, count=2)
    target.send(1, nxt)
    target.expect(HOLDER.port, with_ttl(nxt, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.OWNER) == 1
    # What host 2 missed it asks for again with RETRANSMIT: to the holder (it stays a waiter),
    # and the answer, addressed to a waiter that does not own the slot, is forwarded to it alone.
    miss = _range_get(2, 22, 5002, first=0, count=2, flags=int(wire.Flag.RETRANSMIT))
    target.send(2, miss)
    target.expect(HOLDER.port, with_ttl(miss, 63))
    target.send(HOLDER.port, _answer(2, 22, 5002, 0))
    target.expect(2, with_ttl(_answer(2, 22, 5002, 0), 63))
    target.expect_no_other_packets()
    for frag in (1, 2):
        target.send(HOLDER.port, _answer(1, 11, 5001, frag))
        target.expect(1, with_ttl(_answer(1, 11, 5001, frag), 63))
        target.expect(2, _replica(2, 22, 5002, frag))
        target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.RETRANSMIT) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 2  # fragment 0 went to its owner alone


def test_a_nack_to_the_owner_reaches_every_waiter_and_ends_the_answer(target: Target) -> None:
    _setup(target)
    _three_wait(target)
    def nack(request_id: int) -> bytes:
        return wire.nack_packet(KEY, wire.Status.BUSY, request_id=request_id, frag_count=3, retry_us=5000)

    sent = kv_frame(HOLDER, host(1), nack(11), sport=wire.KVPOOL_UDP_PORT, dport=5001)
    target.send(HOLDER.port, sent)
    target.expect(1, with_ttl(sent, 63))
    for to, rid, port in ((2, 22, 5002), (4, 44, 5004)):
        copy = bytearray(nack(rid))
        copy[2:4] = int(wire.Flag.COALESCED).to_bytes(2, "big")
        target.expect(to, kv_frame(HOLDER, host(to), bytes(copy), sport=wire.KVPOOL_UDP_PORT, dport=port, ttl=63,
                                   udp_checksum=0))
    target.expect_no_other_packets()
    # Free again: the next GET (the holder's booked return) opens a new answer.
    again = _range_get(2, 23, 5002)
    target.send(2, again)
    target.expect(HOLDER.port, with_ttl(again, 63))
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 2


def test_only_waiters_in_the_bitmap_get_a_copy(target: Target) -> None:
    _setup(target)
    # A lone waiter: its answer is forwarded, not multicast, so no replica is made to prune.
    target.send(2, _range_get(2, 1, 6000))
    target.expect(HOLDER.port, Mask(with_ttl(_range_get(2, 1, 6000), 63)))
    for frag in range(LAST + 1):
        target.send(HOLDER.port, _answer(2, 1, 6000, frag))
        target.expect(2, with_ttl(_answer(2, 1, 6000, frag), 63))
    target.expect_no_other_packets()
    # Nothing shared: forwarded as in plain forwarding, no release, no replica.
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 0
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 0
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_PRUNED) == 0

    # Two waiters: multicast, and the replica for host 1, which did not ask, is pruned.
    _hosts_2_and_4_wait(target, (2, 6000), (4, 6004))
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 2
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_PRUNED) == 1


def test_a_waiters_copy_carries_its_latest_get(target: Target) -> None:
    # One outstanding request per host and chunk: a waiter's newer GET replaces its reply record.
    _setup(target)
    target.send(1, _range_get(1, 11, 5001))
    target.expect(HOLDER.port, Mask(with_ttl(_range_get(1, 11, 5001), 63)))
    target.send(2, _range_get(2, 7, 6000))
    target.send(2, _range_get(2, 8, 6001))
    target.expect_no_other_packets()
    target.send(HOLDER.port, _answer(1, 11, 5001))
    target.expect(1, with_ttl(_answer(1, 11, 5001), 63))
    target.expect(2, _replica(2, 8, 6001))
    target.expect_no_other_packets()


def test_answers_to_a_host_that_does_not_own_the_slot_are_not_multicast(target: Target) -> None:
    _setup(target)
    target.send(1, _range_get(1, 11, 5001))
    target.expect(HOLDER.port, Mask(with_ttl(_range_get(1, 11, 5001), 63)))
    target.send(2, _range_get(2, 22, 5002))
    target.expect_no_other_packets()
    # Host 2 waits in the slot, but an answer addressed to it (say to an earlier GET of its
    # own) is not the slot's answer: forwarded to host 2 alone, and the slot stays.
    target.send(HOLDER.port, _answer(2, 22, 5002, LAST))
    target.expect(2, with_ttl(_answer(2, 22, 5002, LAST), 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 0
    target.send(HOLDER.port, _answer(1, 11, 5001, 0))
    target.expect(1, with_ttl(_answer(1, 11, 5001, 0), 63))
    target.expect(2, _replica(2, 22, 5002, 0))
    target.expect_no_other_packets()


def test_after_the_timeout_a_new_get_goes_through(target: Target) -> None:
    _setup(target)
    program.pending_timeout(target.sw, 50_000)  # 50 ms
    first = _range_get(1, 1, 40000)
    target.send(1, first)
    target.expect(HOLDER.port, with_ttl(first, 63))
    time.sleep(0.15)
    late = _range_get(2, 2, 40000)
    target.send(2, late)
    target.expect(HOLDER.port, with_ttl(late, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 2
    assert target.counter(n.COALESCE_STATS, CoStat.EXPIRED_REUSED) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == 0


def test_flood_of_gets_keeps_state_bounded(target: Target) -> None:
    _setup(target)
    program.pending_timeout(target.sw, 30_000_000)  # the whole flood falls inside one answer
    rounds = 100
    first = _range_get(1, 0, 7001)
    target.send(1, first)
    target.expect(HOLDER.port, with_ttl(first, 63))
    joined = 0
    for i in range(1, rounds):
        h = WAITING[i % 3]
        target.send(h.port, _range_get(h.port, i, 7000 + h.port))
        joined += h.port != 1
    # The owner's own GETs go upstream (its windows); the others' are absorbed.
    owner_gets = rounds - 1 - joined
    owners = Mask(with_ttl(_range_get(1, 0, 7001), 63)).dont_care("kv", "request_id").dont_care("udp", "chksum")
    for _ in range(owner_gets):
        target.expect(HOLDER.port, owners)
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == joined
    assert target.counter(n.COALESCE_STATS, CoStat.OWNER) == owner_gets
    # One answer, one copy per waiting host (not per GET), each with its latest request id.
    target.send(HOLDER.port, _answer(1, 0, 7001))
    last = {h.port: max(i for i in range(rounds) if WAITING[i % 3] is h) for h in WAITING[1:]}
    target.expect(1, with_ttl(_answer(1, 0, 7001), 63))
    target.expect(2, _replica(2, last[2], 7002))
    target.expect(4, _replica(4, last[4], 7004))
    target.expect_no_other_packets()
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 3


def test_a_retransmit_goes_upstream_and_joins_nothing(target: Target) -> None:
    # A RETRANSMIT asks for what its sender missed.  It must not join the answer in progress:
    # a waiter that joined it at a switch below (a leaf) would then get every fragment twice,
    # once through that switch and once from this one.
    _setup(target)
    target.send(1, _range_get(1, 1, 40000))
    target.expect(HOLDER.port, with_ttl(_range_get(1, 1, 40000), 63))
    re = _range_get(2, 2, 40000, flags=int(wire.Flag.RETRANSMIT))
    target.send(2, re)
    target.expect(HOLDER.port, with_ttl(re, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.RETRANSMIT) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == 0
    # The owner's answer reaches the owner alone.
    target.send(HOLDER.port, _answer(1, 1, 40000))
    target.expect(1, with_ttl(_answer(1, 1, 40000), 63))
    target.expect_no_other_packets()


def test_a_retransmit_opens_no_slot_so_a_later_get_is_not_held_behind_it(target: Target) -> None:
    # A RETRANSMIT asks for a run (what its sender missed), not up to the chunk's last fragment,
    # which is what ends a slot.  Had it opened one, a range GET arriving next would join an
    # answer that never reaches the end of the chunk and wait for the slot's timeout.
    _setup(target)
    re = _range_get(2, 2, 40000, first=0, count=2, flags=int(wire.Flag.RETRANSMIT))
    target.send(2, re)
    target.expect(HOLDER.port, with_ttl(re, 63))
    later = _range_get(4, 4, 40004)
    target.send(4, later)
    target.expect(HOLDER.port, with_ttl(later, 63))  # it opens its own slot: not absorbed
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.RETRANSMIT) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == 0
    # The answer to the RETRANSMIT reaches its sender alone and leaves host 4's slot as it was.
    target.send(HOLDER.port, _answer(2, 2, 40000, frag=1))
    target.expect(2, with_ttl(_answer(2, 2, 40000, frag=1), 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 0


def test_requester_without_waiter_id_and_non_writer_answers_are_plain_unicast(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.waiters(target.sw, [host(1), host(2)])
    target.send(1, get_frame(host(1), HOLDER, KEY, 0, count=2, request_id=1))
    target.expect(HOLDER.port, with_ttl(get_frame(host(1), HOLDER, KEY, 0, count=2, request_id=1), 63))
    # Host 4 has no waiter id: its GET is not coalesced.
    g4 = get_frame(host(4), HOLDER, KEY, 0, count=2, request_id=4)
    target.send(4, g4)
    target.expect(HOLDER.port, with_ttl(g4, 63))
    # An answer from a non-writer (host 2) to the waiter does not release the slot.
    fake = data_frame(host(2), host(1), KEY, 0, CHUNK, request_id=1)
    target.send(2, fake)
    target.expect(1, with_ttl(fake, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.NO_WAITER_ID) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 0


def _pending_index(key: int) -> int:
    """The pending slot of a chunk, by the model's twin of coalesce.p4's hash.

    tests/switchmodel/test_model_vs_build.py ties that function to the compiled program; here the
    target itself (BMv2 included) must treat the pair it finds as a collision.
    """
    return pending_index(Kv(wire.KVPOOL_VERSION, int(wire.Opcode.GET), 0, key, 0, 1, 0, 0, 0, 0, 0, 0))


def test_colliding_chunks_are_not_coalesced_and_the_hash_matches_bmv2(target: Target) -> None:
    # Two chunks whose pending index collides under the program's hash: the second GET is a
    # COLLISION (forwarded, slot untouched).  A target hashing differently would coalesce
    # nothing here either, but would count FIRST twice instead.
    other = next(k for k in range(1, 1 << 22) if k != KEY and _pending_index(k) == _pending_index(KEY))
    _setup(target)
    a = get_frame(host(1), HOLDER, KEY, 0, count=2)
    b = get_frame(host(2), HOLDER, other, 0, count=2)
    target.send(1, a)
    target.send(2, b)
    target.expect(HOLDER.port, with_ttl(a, 63))
    target.expect(HOLDER.port, with_ttl(b, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.COLLISION) == 1


def test_a_release_replicates_up_to_its_highest_waiter_id(target: Target) -> None:
    # Waiter ids 0, 5, 20 and 31 (hosts 1, 2, 4 and the holder's port for id 31), and the
    # nested groups: the one for highest id t has every waiter <= t.  A release to {5, 20}
    # must pick the group for 20 (the P4's binary search over the bitmap): it then makes
    # replicas for 0, 5 and 20 and prunes only 0.  The group for 31 would prune 31 too, and
    # any group below 20 would miss host 4.
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    ids = {0: host(1), 5: host(2), 20: host(4), 31: HOLDER}
    target.sw.insert_entries([Entry(n.WAITER_LOOKUP, {n.KEY_WAITER_ADDR: h.ip}, n.SET_WAITER_ID, {"waiter_id": w})
                              for w, h in ids.items()])
    target.sw.insert_entries([Entry(n.WAITER_EGRESS, {n.KEY_EGRESS_RID: w}, n.REWRITE_WAITER,
                                    {"addr": h.ip, "mac": h.mac}) for w, h in ids.items()])
    for top in range(n.MAX_WAITERS):
        replicas = [(h.port, w) for w, h in ids.items() if w <= top]
        if replicas:
            target.sw.set_multicast_group(n.COALESCE_MCAST_GRP + top, replicas)
    assert n.coalesce_group(1 << 5 | 1 << 20) == n.COALESCE_MCAST_GRP + 20

    _hosts_2_and_4_wait(target, (5, 7005), (20, 7020))
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 2
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_PRUNED) == 1


def test_a_release_after_a_fresh_pipeline_push_makes_one_copy_per_waiter(target: Target) -> None:
    # An experiment's next mode (Controller.clean_slate) pushes the pipeline afresh and writes
    # the release groups back.  Each waiter must still get exactly one copy: replicas the old
    # pipeline's groups left behind would send each waiter one more copy per push.
    _setup(target)
    for _ in range(2):
        target.sw.push_pipeline()
    groups = {g: sorted(r) for g, r in target.sw.read_multicast_groups().items()}
    assert groups == {n.COALESCE_MCAST_GRP + t: [(h.port, w) for w, h in enumerate(WAITING[:t + 1])]
                      for t in range(len(WAITING))}
    _three_wait(target)
    _answer_reaches_all_three(target)
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 3
