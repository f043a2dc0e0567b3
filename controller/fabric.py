"""What every switch of a topology must hold before any chunk is admitted (pure).

From a ``Topology`` this computes, per switch, the intended P4Runtime state of the kvpool
program: host routes and ARP forwarding, the source guard of every port that faces a host
(``host_guard``: only that host's address may enter there), the writers ACL (a holder's
address on the port towards it may fill and invalidate), waiter ids for coalescing
(``waiter_lookup`` / ``waiter_egress`` and the multicast group whose replicas egress
prunes by bitmap), the popularity and pending timeout settings, and the hot-chunk and
fill-mismatch digests. Nothing here talks to a switch: the daemon
hands ``SwitchConfig`` to the P4Runtime driver, which ships it.
"""

from __future__ import annotations

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
    """Address holders send pushed chunks to: the switches fill on pass, then drop them here."""


@dataclass
class SwitchConfig:
    """The intended state of one switch, by P4Info names."""

    name: str
    entries: list[Entry] = field(default_factory=list)
    defaults: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    groups: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    digests: dict[str, DigestConfig] = field(default_factory=dict)


def waiter_ids(topo: Topology) -> dict[str, int]:
    """Inference host name -> waiter id, the same on every switch (hosts in name order)."""
    hosts = sorted(topo.inference_hosts(), key=lambda h: (len(h.name), h.name))
    if len(hosts) > MAX_WAITERS:
        raise ValueError(f"{len(hosts)} inference hosts, the data plane coalesces at most {MAX_WAITERS}")
    return {h.name: i for i, h in enumerate(hosts)}


def switch_configs(topo: Topology, settings: FabricSettings | None = None) -> dict[str, SwitchConfig]:
    """The intended state of every switch of ``topo``."""
    s = settings or FabricSettings()
    if not 1 <= s.popularity_epoch <= n.EPOCH_MAX:
        raise ValueError(f"popularity_epoch must be 1..{n.EPOCH_MAX}, got {s.popularity_epoch}")
    waiters = waiter_ids(topo)
    routes = topo.host_routes()
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
        # Pushed fills are addressed to the sink: filled on pass, then dropped (NO_ROUTE).
        cfg.entries.append(Entry(n.IPV4_ROUTE, {n.KEY_IPV4_DST: (s.fill_sink, 32)}, n.DROP_NO_ROUTE))
        # A host may send from its own address only: no requester poses as a holder or aims
        # the answer to a GET at someone else.
        for port, far in topo.switch_ports(sw).items():
            if far.node in topo.hosts:
                cfg.entries.append(Entry(n.HOST_GUARD, {n.KEY_INGRESS_PORT: port}, n.GUARD_SOURCE,
                                         {"addr": topo.hosts[far.node].address}))
        # A writer is a holder's address on the port towards that holder, nowhere else.
        for holder in topo.holders():
            if holder.name in port_to:
                cfg.entries.append(Entry(n.WRITERS, {n.KEY_INGRESS_PORT: port_to[holder.name],
                                                     n.KEY_WRITER_SRC: holder.address}, n.ALLOW_WRITER))
        replicas: list[tuple[int, int]] = []
        for name, wid in waiters.items():
            host = topo.hosts[name]
            if name not in port_to:
                continue  # unreachable from this switch: it can never wait here
            cfg.entries.append(Entry(n.WAITER_LOOKUP, {n.KEY_WAITER_ADDR: host.address}, n.SET_WAITER_ID,
                                     {"waiter_id": wid}))
            cfg.entries.append(Entry(n.WAITER_EGRESS, {n.KEY_EGRESS_RID: wid}, n.REWRITE_WAITER,
                                     {"addr": host.address, "mac": host.mac}))
            replicas.append((port_to[name], wid))
        if replicas:
            cfg.groups[COALESCE_MCAST_GRP] = replicas
        cfg.defaults[n.POPULARITY_CONFIG] = (n.SET_POPULARITY, {"threshold": s.popularity_threshold,
                                                                "epoch": s.popularity_epoch})
        cfg.defaults[n.COALESCE_CONFIG] = (n.SET_PENDING_TIMEOUT, {"timeout_us": s.pending_timeout_us})
        for digest in (n.HOT_CHUNK, n.FILL_MISMATCH):
            cfg.digests[digest] = DigestConfig(max_timeout_ns=s.digest_max_timeout_ns,
                                               max_list_size=s.digest_max_list_size)
        configs[sw] = cfg
    return configs
