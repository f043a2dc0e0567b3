"""Coalescing: duplicate GETs absorbed while one is outstanding, the answer multicast to all."""

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
CHUNK = program.chunk_bytes(3000)
WAITING = [host(1), host(2), host(4)]


def _replica(to: int, request_id: int, dport: int, coalesced: bool, frag: int = 0) -> bytes:
    """What waiter ``to`` receives: the holder's DATA rewritten for it by egress."""
    flags = int(wire.Flag.COALESCED) if coalesced else 0
    datagram = wire.data_packet(KEY, frag, CHUNK, request_id=request_id, flags=flags)
    return kv_frame(HOLDER, host(to), datagram, sport=wire.KVPOOL_UDP_PORT, dport=dport, ttl=63,
                    udp_checksum=0)


def _setup(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.waiters(target.sw, WAITING)

def _hosts_2_and_4_wait(target: Target, first: tuple[int, int], second: tuple[int, int]) -> None:
    """Host 2's GET (request id, UDP port ``first``) goes upstream, host 4's joins it; the answer reaches both."""
    (rid2, port2), (rid4, port4) = first, second
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, request_id=rid2, sport=port2))
    target.expect(HOLDER.port, Mask(with_ttl(get_frame(host(2), HOLDER, KEY, 0, request_id=rid2, sport=port2), 63)))
    target.send(4, get_frame(host(4), HOLDER, KEY, 0, request_id=rid4, sport=port4))
    target.expect_no_other_packets()
    target.send(HOLDER.port, data_frame(HOLDER, host(2), KEY, 0, CHUNK, request_id=rid2, dport=port2))
    target.expect(2, _replica(2, rid2, port2, coalesced=False))
    target.expect(4, _replica(4, rid4, port4, coalesced=True))
    target.expect_no_other_packets()


def _three_wait(target: Target) -> None:
    """Hosts 1, 2 and 4 ask for fragment 0: host 1's GET goes upstream, the other two are absorbed."""
    first = get_frame(host(1), HOLDER, KEY, 0, request_id=11, sport=5001)
    target.send(1, first)
    target.expect(HOLDER.port, with_ttl(first, 63))
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, request_id=22, sport=5002))
    target.send(4, get_frame(host(4), HOLDER, KEY, 0, request_id=44, sport=5004))
    target.expect_no_other_packets()  # both duplicates absorbed: the holder saw one GET


def _answer_reaches_all_three(target: Target) -> None:
    """The holder answers host 1; every waiter gets its own copy, once."""
    target.send(HOLDER.port, data_frame(HOLDER, host(1), KEY, 0, CHUNK, request_id=11, dport=5001))
    target.expect(1, _replica(1, 11, 5001, coalesced=False))
    target.expect(2, _replica(2, 22, 5002, coalesced=True))
    target.expect(4, _replica(4, 44, 5004, coalesced=True))
    target.expect_no_other_packets()


def test_three_gets_one_upstream_and_the_answer_reaches_all_three(target: Target) -> None:
    _setup(target)
    _three_wait(target)
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == 2

    _answer_reaches_all_three(target)
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 1
    assert target.counters(n.WAITER_REPLICAS) == {0: 1, 1: 1, 2: 1}
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 3

    # Released: the next GET for the fragment opens a new round and goes upstream.
    again = get_frame(host(2), HOLDER, KEY, 0, request_id=23, sport=5002)
    target.send(2, again)
    target.expect(HOLDER.port, with_ttl(again, 63))
    target.expect_no_other_packets()


def test_only_waiters_in_the_bitmap_get_a_copy(target: Target) -> None:
    _setup(target)
    # A lone waiter: its answer is forwarded, not multicast, so no replica is made to prune.
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, request_id=1, sport=6000))
    target.expect(HOLDER.port, Mask(with_ttl(get_frame(host(2), HOLDER, KEY, 0, request_id=1, sport=6000), 63)))
    target.send(HOLDER.port, data_frame(HOLDER, host(2), KEY, 0, CHUNK, request_id=1, dport=6000))
    target.expect(2, _replica(2, 1, 6000, coalesced=False))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 1
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 1
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_PRUNED) == 0

    # Two waiters: multicast, and the replica for host 1, which did not ask, is pruned.
    _hosts_2_and_4_wait(target, (2, 6000), (4, 6004))
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 3
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_PRUNED) == 1


def test_a_lone_waiters_answer_carries_its_latest_get(target: Target) -> None:
    # Forwarded rather than multicast, the answer still gets the request id and port of
    # the waiter's latest GET here (one outstanding request per host and fragment).
    _setup(target)
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, request_id=7, sport=6000))
    target.expect(HOLDER.port, Mask(with_ttl(get_frame(host(2), HOLDER, KEY, 0, request_id=7, sport=6000), 63)))
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, request_id=8, sport=6001))
    target.expect_no_other_packets()  # absorbed: the same waiter's newer request
    target.send(HOLDER.port, data_frame(HOLDER, host(2), KEY, 0, CHUNK, request_id=7, dport=6000))
    target.expect(2, _replica(2, 8, 6001, coalesced=False))
    target.expect_no_other_packets()
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_PRUNED) == 0


def test_after_the_timeout_a_new_get_goes_through(target: Target) -> None:
    _setup(target)
    program.pending_timeout(target.sw, 50_000)  # 50 ms
    first = get_frame(host(1), HOLDER, KEY, 0, request_id=1)
    target.send(1, first)
    target.expect(HOLDER.port, with_ttl(first, 63))
    time.sleep(0.15)
    late = get_frame(host(2), HOLDER, KEY, 0, request_id=2)
    target.send(2, late)
    target.expect(HOLDER.port, with_ttl(late, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.FIRST) == 2
    assert target.counter(n.COALESCE_STATS, CoStat.EXPIRED_REUSED) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == 0


def test_flood_of_gets_keeps_state_bounded(target: Target) -> None:
    _setup(target)
    program.pending_timeout(target.sw, 30_000_000)  # the whole flood falls inside one round
    rounds = 100
    first = get_frame(host(1), HOLDER, KEY, 0, request_id=0, sport=7000)
    target.send(1, first)
    target.expect(HOLDER.port, with_ttl(first, 63))
    for i in range(1, rounds):
        h = WAITING[i % 3]
        target.send(h.port, get_frame(h, HOLDER, KEY, 0, request_id=i, sport=7000 + h.port))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.ABSORBED) == rounds - 1
    # One answer, one copy per waiting host (not per GET), each with its latest request id.
    target.send(HOLDER.port, data_frame(HOLDER, host(1), KEY, 0, CHUNK, request_id=0, dport=7001))
    last = {h.port: max(i for i in range(rounds) if WAITING[i % 3] is h) for h in WAITING}
    target.expect(1, _replica(1, last[1], 7001, coalesced=False))
    target.expect(2, _replica(2, last[2], 7002, coalesced=True))
    target.expect(4, _replica(4, last[4], 7004, coalesced=True))
    target.expect_no_other_packets()
    assert target.counter(n.EGRESS_STATS, EgStat.REPLICA_SENT) == 3


def test_retransmit_joins_and_also_goes_upstream(target: Target) -> None:
    _setup(target)
    target.send(1, get_frame(host(1), HOLDER, KEY, 0, request_id=1))
    target.expect(HOLDER.port, with_ttl(get_frame(host(1), HOLDER, KEY, 0, request_id=1), 63))
    re = get_frame(host(2), HOLDER, KEY, 0, request_id=2, flags=int(wire.Flag.RETRANSMIT))
    target.send(2, re)
    target.expect(HOLDER.port, with_ttl(re, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.RETRANSMIT) == 1


def test_requester_without_waiter_id_and_non_writer_answers_are_plain_unicast(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.waiters(target.sw, [host(1), host(2)])
    target.send(1, get_frame(host(1), HOLDER, KEY, 0, request_id=1))
    target.expect(HOLDER.port, with_ttl(get_frame(host(1), HOLDER, KEY, 0, request_id=1), 63))
    # Host 4 has no waiter id: its GET is not coalesced.
    g4 = get_frame(host(4), HOLDER, KEY, 0, request_id=4)
    target.send(4, g4)
    target.expect(HOLDER.port, with_ttl(g4, 63))
    # An answer from a non-writer (host 2) to the waiter does not release the slot.
    fake = data_frame(host(2), host(1), KEY, 0, CHUNK, request_id=1)
    target.send(2, fake)
    target.expect(1, with_ttl(fake, 63))
    target.expect_no_other_packets()
    assert target.counter(n.COALESCE_STATS, CoStat.NO_WAITER_ID) == 1
    assert target.counter(n.COALESCE_STATS, CoStat.RELEASE) == 0


def _pending_index(key: int, frag: int) -> int:
    """The pending slot of a fragment, by the model's twin of coalesce.p4's hash.

    tests/switchmodel/test_model_vs_build.py ties that function to the compiled program; here the
    target itself (BMv2 included) must treat the pair it finds as a collision.
    """
    return pending_index(Kv(wire.KVPOOL_VERSION, int(wire.Opcode.GET), 0, key, frag, 1, 0, 0, 0, 0, 0, 0))


def test_colliding_fragments_are_not_coalesced_and_the_hash_matches_bmv2(target: Target) -> None:
    # Two fragments whose pending index collides under the program's hash: the second GET is a
    # COLLISION (forwarded, slot untouched).  A target hashing differently would coalesce
    # nothing here either, but would count FIRST twice instead.
    other = next(k for k in range(1, 1 << 20) if k != KEY and _pending_index(k, 0) == _pending_index(KEY, 0))
    _setup(target)
    a = get_frame(host(1), HOLDER, KEY, 0)
    b = get_frame(host(2), HOLDER, other, 0)
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
