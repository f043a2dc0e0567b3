"""Forwarding: kvpool and ordinary IPv4 by host route, ARP by target IP, and what is dropped."""

from __future__ import annotations

from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from kvpool import contract as n
from kvpool import wire
from kvpool.contract import DropReason as Drop
from kvpool.contract import PoolStat

from . import program
from .harness import Target
from .packets import arp_request, get_frame, host, kv_frame, stripped_get, udp_frame, with_ttl
from .program import HOLDER


def test_kvpool_get_for_unknown_chunk_goes_to_holder(target: Target) -> None:
    program.routes(target.sw)
    get = kv_frame(host(1), HOLDER, wire.get_packet(0xABC, 0, request_id=5))
    target.send(1, get)
    target.expect(HOLDER.port, with_ttl(get, 63))
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.LOOKUP_MISS) == 1
    assert target.counters(n.DROP_REASON) == {}


def test_reply_room_is_stripped_from_a_get_the_switch_does_not_answer(target: Target) -> None:
    program.routes(target.sw)
    target.send(1, get_frame(host(1), HOLDER, 0xABC, 0, request_id=5, room=True))
    target.expect(HOLDER.port, stripped_get(host(1), HOLDER, 0xABC, 0, request_id=5))
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {}


def test_ordinary_udp_forwarded_with_ttl_decremented(target: Target) -> None:
    program.routes(target.sw)
    frame = udp_frame(host(2), host(4), b"not kvpool" * 10, ttl=9)
    target.send(2, frame)
    out = target.expect(4, with_ttl(frame, 8))
    assert Ether(out)[IP].chksum == IP(bytes(Ether(out)[IP]))[IP].chksum  # valid checksum recomputed
    target.expect_no_other_packets()
    assert target.counters(n.POOL_STATS) == {}  # not parsed as kvpool


def test_arp_unicast_by_target_ip_and_flood_prunes_ingress(target: Target) -> None:
    program.routes(target.sw)
    req = arp_request(host(1), host(2).ip)
    target.send(1, req)
    target.expect(2, req)
    target.expect_no_other_packets()
    # Flooding through a multicast group: every port but the one it came in on.
    target.sw.set_multicast_group(9, [(p, 0) for p in range(1, 5)])
    target.sw.modify_entry(n.ARP_FORWARD, {n.KEY_ARP_TPA: (host(2).ip, 32)}, n.ARP_FLOOD, {"mcast_grp": 9})
    target.send(1, req)
    for port in (2, 3, 4):
        target.expect(port, req)
    target.expect_no_other_packets()


def test_no_route_ttl_expired_unhandled_and_bad_checksum_are_counted(target: Target) -> None:
    program.routes(target.sw)
    target.send(1, udp_frame(host(1), host(9), b"x" * 20))  # 10.0.0.9 has no route
    target.send(1, udp_frame(host(1), host(2), b"x" * 20, ttl=1))
    target.send(1, bytes(Ether(src=host(1).mac, dst=host(2).mac) / IPv6()))
    bad = bytearray(udp_frame(host(1), host(2), b"x" * 20))
    bad[24] ^= 0xFF  # IPv4 header checksum
    target.send(1, bytes(bad))
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {Drop.NO_ROUTE: 1, Drop.TTL_EXPIRED: 1, Drop.UNHANDLED: 1,
                                               Drop.BAD_CHECKSUM: 1}
    # The switch keeps forwarding everything else.
    ok = udp_frame(host(1), host(2), b"fine")
    target.send(1, ok)
    target.expect(2, with_ttl(ok, 63))
    target.expect_no_other_packets()
