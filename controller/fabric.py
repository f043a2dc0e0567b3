"""What every switch of a topology must hold before any chunk is admitted (pure).

From a ``Topology`` this computes, per switch, the intended P4Runtime state of the kvpool
program: host routes and ARP forwarding, the source guard of every port that faces a host
(``host_guard``: only that host's address may enter there) and the mark on every port that
faces a switch (``fabric_port``: popularity counts a fetch only where it entered), the
writers ACL (a holder's address on the port towards it may fill and invalidate), a route
to every switch's fill sink (``sink_addresses``), waiter ids for coalescing
(``waiter_lookup`` / ``waiter_egress`` and the multicast group whose replicas egress
prunes by bitmap), the popularity and pending timeout settings, and the hot-chunk and
fill-mismatch digests. Nothing here talks to a switch: the daemon
hands ``SwitchConfig`` to the P4Runtime driver, which ships it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from controller.p4runtime import DigestConfig, Entry
from kvpool import contract as n
from kvpool.contract import COALESCE_MCAST_GRP, MAX_WAITERS
from kvpool.topology import Topology


@dataclass(frozen=True)
class FabricSettings:
    """Knobs of the data plane the controller sets through default actions."""

    popularity_threshold: int = 4
    """Missed GETs (of fragment 0) in one epoch before a chunk is reported hot."""
    popularity_epoch: int = n.DEFAULT_SKETCH_EPOCH
    """Sketch epoch tag (1..127); bumping it resets counting without register writes."""
    pending_timeout_us: int = n.DEFAULT_PENDING_TIMEOUT_US
    """How long an outstanding GET absorbs duplicates before a new one may go upstream."""
    digest_max_timeout_ns: int = 10_000_000
    digest_max_list_size: int = 64
    fill_sink: str = "10.0.0.254"
    """Fill sink of the first switch; switch i (topology order) has this address minus i
    (``sink_addresses``).  A holder pushes a chunk to the sink of the switch that holds it:
    routed toward that switch, filled on pass there, then dropped."""
    fill_sink_mac: str = "02:00:00:00:00:fe"
    """Destination MAC of pushed fills (switches route by IPv4; hosts need a static ARP entry)."""


@dataclass
class SwitchConfig:
    """The intended state of one switch, by P4Info names."""

    name: str
    entries: list[Entry] = field(default_factory=list)
    defaults: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    groups: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    digests: dict[str, DigestConfig] = field(default_factory=dict)


def waiter_ids(topo: Topology, switch: str) -> dict[str, int]:
    """Inference host name -> its waiter id on ``switch``: the switch's own hosts first, then the rest.

    A release goes to the nested multicast group of the highest waiter id in its bitmap
    (``kvpool.contract.coalesce_group``), so the hosts that wait together on a switch
    should have the lowest ids there: on a leaf, its own requesters (GETs from other
    leaves cross it only toward a holder it serves).  Each part in name order.
    """
    hosts = sorted(topo.inference_hosts(),
                   key=lambda h: (topo.attachment(h.name) != switch, len(h.name), h.name))
    if len(hosts) > MAX_WAITERS:
        raise ValueError(f"{len(hosts)} inference hosts, the data plane coalesces at most {MAX_WAITERS}")
    return {h.name: i for i, h in enumerate(hosts)}


def sink_addresses(topo: Topology, settings: FabricSettings | None = None) -> dict[str, str]:
    """Switch -> its fill sink address: ``fill_sink`` for the first switch, one less for each next one."""
    s = settings or FabricSettings()
    base = ipaddress.IPv4Address(s.fill_sink)
    sinks = {sw: str(base - i) for i, sw in enumerate(topo.switches)}
    taken = {h.address: h.name for h in topo.hosts.values()}
    for sw, addr in sinks.items():
        if addr in taken:
            raise ValueError(f"fill sink {addr} of switch {sw} is host {taken[addr]}'s address: "
                             "choose another fill_sink")
    return sinks


def switch_configs(topo: Topology, settings: FabricSettings | None = None) -> dict[str, SwitchConfig]:
    """The intended state of every switch of ``topo``."""
    s = settings or FabricSettings()
    if not 1 <= s.popularity_epoch <= n.EPOCH_MAX:
        raise ValueError(f"popularity_epoch must be 1..{n.EPOCH_MAX}, got {s.popularity_epoch}")
    routes = topo.host_routes()
    sinks = sink_addresses(topo, s)
    sink_hops = {sw: topo.next_hops(sw) for sw in sinks}
    configs: dict[str, SwitchConfig] = {}
    for sw in topo.switches:
        cfg = SwitchConfig(sw)
        port_to: dict[str, int] = {}
        for r in routes:
            if r.switch != sw:
                continue
            port_to[r.host] = r.port
            cfg.entries.append(Entry(n.IPV4_ROUTE, {n.KEY_IPV4_DST: (r.ip, 32)}, n.IPV4_FORWARD,
                                     {"port": r.port, "dst_mac": r.dst_mac}))
            cfg.entries.append(Entry(n.ARP_FORWARD, {n.KEY_ARP_TPA: (r.ip, 32)}, n.ARP_UNICAST,
                                     {"port": r.port}))
        # Pushed fills are addressed to the sink of the switch that holds the chunk: routed
        # toward it, filled on pass there, then dropped (NO_ROUTE).
        for owner, addr in sinks.items():
            if owner == sw:
                cfg.entries.append(Entry(n.IPV4_ROUTE, {n.KEY_IPV4_DST: (addr, 32)}, n.DROP_NO_ROUTE))
            elif sw in sink_hops[owner]:
                cfg.entries.append(Entry(n.IPV4_ROUTE, {n.KEY_IPV4_DST: (addr, 32)}, n.IPV4_FORWARD,
                                         {"port": sink_hops[owner][sw], "dst_mac": s.fill_sink_mac}))
        # A host may send from its own address only: no requester poses as a holder or aims
        # the answer to a GET at someone else.  A port toward a switch is marked instead:
        # a GET arriving there was counted by popularity where it entered the fabric.
        for port, far in topo.switch_ports(sw).items():
            if far.node in topo.hosts:
                cfg.entries.append(Entry(n.HOST_GUARD, {n.KEY_INGRESS_PORT: port}, n.GUARD_SOURCE,
                                         {"addr": topo.hosts[far.node].address}))
            else:
                cfg.entries.append(Entry(n.HOST_GUARD, {n.KEY_INGRESS_PORT: port}, n.FABRIC_PORT))
        # A writer is a holder's address on the port towards that holder, nowhere else.
        for holder in topo.holders():
            if holder.name in port_to:
                cfg.entries.append(Entry(n.WRITERS, {n.KEY_INGRESS_PORT: port_to[holder.name],
                                                     n.KEY_WRITER_SRC: holder.address}, n.ALLOW_WRITER))
        replicas: list[tuple[int, int]] = []
        # Hosts unreachable from this switch can never wait here: ids for the others only.
        reachable = [h for h in waiter_ids(topo, sw) if h in port_to]
        for wid, name in enumerate(reachable):
            host = topo.hosts[name]
            cfg.entries.append(Entry(n.WAITER_LOOKUP, {n.KEY_WAITER_ADDR: host.address}, n.SET_WAITER_ID,
                                     {"waiter_id": wid}))
            cfg.entries.append(Entry(n.WAITER_EGRESS, {n.KEY_EGRESS_RID: wid}, n.REWRITE_WAITER,
                                     {"addr": host.address, "mac": host.mac}))
            replicas.append((port_to[name], wid))
        # Nested release groups: the one for highest waiter id t replicates to waiters 0..t.
        for top in range(len(replicas)):
            cfg.groups[COALESCE_MCAST_GRP + top] = replicas[:top + 1]
        cfg.defaults[n.POPULARITY_CONFIG] = (n.SET_POPULARITY, {"threshold": s.popularity_threshold,
                                                                "epoch": s.popularity_epoch})
        cfg.defaults[n.COALESCE_CONFIG] = (n.SET_PENDING_TIMEOUT, {"timeout_us": s.pending_timeout_us})
        for digest in (n.HOT_CHUNK, n.FILL_MISMATCH):
            cfg.digests[digest] = DigestConfig(max_timeout_ns=s.digest_max_timeout_ns,
                                               max_list_size=s.digest_max_list_size)
        configs[sw] = cfg
    return configs
