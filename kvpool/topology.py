"""Topologies as data: the p4lang/tutorials JSON shape, validated, plus generators.

A topology file looks like p4lang/tutorials' ``topology.json``::

    {
      "hosts":    {"h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01", "role": "holder"}},
      "switches": {"s1": {}},
      "links":    [["h1", "s1-p1", "0ms", 100], ["s1-p2", "s2-p1"]]
    }

A link end is a host name or ``sN-pK`` (port K of switch sN); the optional third and
fourth items are the latency (``"2ms"``) and the bandwidth in Mbit/s, applied with tc.
Host ``role`` is ``holder`` (serves chunks) or ``inference`` (fetches them; the default).

Nothing here touches Mininet or a switch: the controller computes host routes from the
same objects (``host_routes``) and the Mininet builder only instantiates them.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("holder", "inference")
_PORT_RE = re.compile(r"^(s\d+)-p(\d+)$")
_LATENCY_RE = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")


class TopologyError(ValueError):
    """A topology that cannot be built; the message names the offending entry."""


@dataclass(frozen=True, slots=True)
class Host:
    """An end host: name, IPv4 address with prefix, MAC and role."""

    name: str
    ip: str
    mac: str
    role: str = "inference"

    @property
    def address(self) -> str:
        """The IPv4 address without its prefix length."""
        return self.ip.split("/")[0]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One end of a link: a host, or a switch port."""

    node: str
    port: int | None = None  # None for a host end

    def __str__(self) -> str:
        return self.node if self.port is None else f"{self.node}-p{self.port}"


@dataclass(frozen=True, slots=True)
class Link:
    """A link between two endpoints, with optional latency and bandwidth (Mbit/s)."""

    a: Endpoint
    b: Endpoint
    latency: str = "0ms"
    bandwidth_mbps: float | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """How switch ``switch`` reaches ``host``: out of ``port``, toward next-hop MAC ``dst_mac``."""

    switch: str
    host: str
    ip: str
    port: int
    dst_mac: str


@dataclass
class Topology:
    """Hosts, switches and links; construct with ``load``, ``from_dict`` or a generator."""

    hosts: dict[str, Host]
    switches: dict[str, dict[str, Any]]
    links: list[Link] = field(default_factory=list)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "topology") -> Topology:
        """Build and validate a topology from its JSON form."""
        if not isinstance(data, dict):
            raise TopologyError(f"{source}: expected a JSON object with hosts, switches, links")
        unknown = set(data) - {"hosts", "switches", "links", "description"}
        if unknown:
            raise TopologyError(f"{source}: unknown keys {sorted(unknown)}")
        hosts: dict[str, Host] = {}
        for name, spec in (data.get("hosts") or {}).items():
            hosts[name] = _host(name, spec, source)
        switches = {name: dict(spec or {}) for name, spec in (data.get("switches") or {}).items()}
        for name in switches:
            if not re.fullmatch(r"s\d+", name):
                raise TopologyError(f"{source}: switch name {name!r} must look like s1, s2, ...")
        links = [_link(i, item, source) for i, item in enumerate(data.get("links") or [])]
        topo = cls(hosts, switches, links)
        topo.validate(source)
        return topo

    def validate(self, source: str = "topology") -> None:
        """Raise ``TopologyError`` unless every link end exists and no port is used twice."""
        if not self.switches:
            raise TopologyError(f"{source}: needs at least one switch")
        if not any(h.role == "holder" for h in self.hosts.values()):
            raise TopologyError(f"{source}: needs a host with role 'holder'")
        ips = [h.address for h in self.hosts.values()]
        if len(set(ips)) != len(ips):
            raise TopologyError(f"{source}: duplicate host IP addresses")
        used: set[str] = set()
        for link in self.links:
            for end in (link.a, link.b):
                if end.port is None and end.node not in self.hosts:
                    raise TopologyError(f"{source}: link end {end} is not a host")
                if end.port is not None and end.node not in self.switches:
                    raise TopologyError(f"{source}: link end {end} names an unknown switch")
                if str(end) in used:
                    raise TopologyError(f"{source}: {end} is used by two links")
                used.add(str(end))
        for name in self.hosts:
            if name not in used:
                raise TopologyError(f"{source}: host {name} has no link")

    # ---------------------------------------------------------------- queries
    def holders(self) -> list[Host]:
        """Hosts with role ``holder``."""
        return [h for h in self.hosts.values() if h.role == "holder"]

    def inference_hosts(self) -> list[Host]:
        """Hosts with role ``inference``."""
        return [h for h in self.hosts.values() if h.role == "inference"]

    def switch_ports(self, switch: str) -> dict[int, Endpoint]:
        """Port number -> the endpoint on the other side, for one switch."""
        ports: dict[int, Endpoint] = {}
        for link in self.links:
            for near, far in ((link.a, link.b), (link.b, link.a)):
                if near.node == switch and near.port is not None:
                    ports[near.port] = far
        return dict(sorted(ports.items()))

    def host_link(self, host: str) -> Link:
        """The link that attaches ``host``."""
        for link in self.links:
            if host in (link.a.node, link.b.node) and (link.a.port is None or link.b.port is None):
                return link
        raise TopologyError(f"host {host} has no link")

    def host_routes(self) -> list[Route]:
        """For every switch and host, the egress port on a shortest path (BFS, lowest port wins ties).

        The next-hop MAC is the host's own: switches forward by IP but leave L2 addressing
        end to end, as in p4lang/tutorials' basic exercise with a single subnet.
        """
        routes: list[Route] = []
        for host in self.hosts.values():
            for sw, port in self.next_hops(host.name).items():
                routes.append(Route(sw, host.name, host.address, port, host.mac))
        return routes

    def next_hops(self, node: str) -> dict[str, int]:
        """For every switch that can reach ``node`` (a host or a switch), its egress port toward it.

        A shortest path, the lowest port winning ties; ``node`` itself has no entry.
        Destination-based and deterministic, so the same rule gives the host routes, the
        routes to a switch (the fill sinks) and the paths the controller reasons about.
        """
        dist = self._distances_from(node)
        hops: dict[str, int] = {}
        for sw in self.switches:
            if sw == node or sw not in dist:
                continue
            best = min(((dist.get(ep.node, 1 << 30), port) for port, ep in self.switch_ports(sw).items()),
                       default=None)
            if best is not None and best[0] < dist[sw]:
                hops[sw] = best[1]
        return hops

    def attachment(self, host: str) -> str:
        """The switch ``host`` is linked to."""
        link = self.host_link(host)
        end = link.b if link.a.node == host else link.a
        if end.port is None:
            raise TopologyError(f"host {host} is linked to host {end.node}, not to a switch")
        return end.node

    def path(self, switch: str, node: str) -> list[str]:
        """The switches a packet crosses from ``switch`` toward ``node`` (a host or a switch), both ends included."""
        hops = self.next_hops(node)
        out = [switch]
        while out[-1] in hops:
            far = self.switch_ports(out[-1])[hops[out[-1]]]
            if far.port is None:  # the host itself
                break
            if far.node in out:
                raise TopologyError(f"routes toward {node} loop at {far.node}")
            out.append(far.node)
        if node in self.switches and out[-1] != node:
            raise TopologyError(f"{switch} cannot reach {node}")
        return out

    def asymmetric_pairs(self) -> list[tuple[str, str]]:
        """Host pairs whose two directions cross different switches (each pair once, by name).

        Coalescing across switches needs an answer to retrace its GET: a switch that absorbed
        GETs is released only by a response that passes through it.  Destination-based
        shortest paths with the lowest port winning ties are symmetric in the generated
        topologies; a hand-written file can break that, and the controller warns.
        """
        names = sorted(self.hosts)
        attached = {h: self.attachment(h) for h in names}
        bad: list[tuple[str, str]] = []
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                there = self.path(attached[a], b)
                back = self.path(attached[b], a)
                if there != back[::-1]:
                    bad.append((a, b))
        return bad

    def _distances_from(self, node: str) -> dict[str, int]:
        adj: dict[str, list[str]] = {}
        for link in self.links:
            adj.setdefault(link.a.node, []).append(link.b.node)
            adj.setdefault(link.b.node, []).append(link.a.node)
        dist = {node: 0}
        queue = deque([node])
        while queue:
            cur = queue.popleft()
            for nxt in adj.get(cur, []):
                # Hosts do not forward: only switches extend a path.
                if nxt not in dist and (cur == node or cur in self.switches):
                    dist[nxt] = dist[cur] + 1
                    queue.append(nxt)
        return dist

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (round-trips through ``from_dict``)."""
        links: list[list[Any]] = []
        for link in self.links:
            item: list[Any] = [str(link.a), str(link.b)]
            if link.latency != "0ms" or link.bandwidth_mbps is not None:
                item.append(link.latency)
            if link.bandwidth_mbps is not None:
                item.append(link.bandwidth_mbps)
            links.append(item)
        return {
            "hosts": {h.name: {"ip": h.ip, "mac": h.mac, "role": h.role} for h in self.hosts.values()},
            "switches": self.switches,
            "links": links,
        }


def load(path: str | Path) -> Topology:
    """Read and validate a topology JSON file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise TopologyError(f"{p}: no such topology file") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{p}: not valid JSON ({exc})") from None
    return Topology.from_dict(data, source=str(p))


# ------------------------------------------------------------------------ generators
def _mac(i: int) -> str:
    return "08:00:00:00:%02x:%02x" % (i >> 8, i & 0xFF)  # noqa: UP031 - fixed-width hex octets


MAX_HOLDERS = 8
"""Holder hosts a generator places: h0 (10.0.0.100), then h101, h102, ... (10.0.0.101, ...)."""


def _holders(holders: int, where: str) -> list[Host]:
    if not 1 <= holders <= MAX_HOLDERS:
        raise TopologyError(f"{where}: holders must be 1..{MAX_HOLDERS}, got {holders}")
    return [Host("h0" if k == 0 else f"h{100 + k}", f"10.0.0.{100 + k}/24", _mac(100 + k), "holder")
            for k in range(holders)]


def star(requesters: int, *, holder_mbps: float | None = None, host_mbps: float | None = None,
         latency: str = "0ms", holders: int = 1) -> Topology:
    """One switch, the holders on ports 1..H and ``requesters`` inference hosts h1..hN on the ports after them."""
    if not 1 <= requesters <= 16:
        raise TopologyError(f"star: requesters must be 1..16, got {requesters}")
    hosts: dict[str, Host] = {}
    links: list[Link] = []
    for port, h in enumerate(_holders(holders, "star"), start=1):
        hosts[h.name] = h
        links.append(Link(Endpoint(h.name), Endpoint("s1", port), latency, holder_mbps))
    for i in range(1, requesters + 1):
        hosts[f"h{i}"] = Host(f"h{i}", f"10.0.0.{i}/24", _mac(i))
        links.append(Link(Endpoint(f"h{i}"), Endpoint("s1", holders + i), latency, host_mbps))
    topo = Topology(hosts, {"s1": {}}, links)
    topo.validate("star")
    return topo


def leaf_spine(leaves: int = 4, spines: int = 2, requesters: int = 8, holders: int = 1, *,
               holder_mbps: float | None = None, host_mbps: float | None = None,
               fabric_mbps: float | None = None) -> Topology:
    """A two-tier fabric: leaves s1..sL, spines after them; the holders on leaf s1, requesters on the others.

    Leaf port i (1..spines) goes up to spine i, spine port j down to leaf j; hosts use the
    leaf ports above the spines.  Requesters h1..hN are dealt round-robin over leaves
    s2..sL (over s1 when it is the only leaf), so a hot prefix is wanted behind several
    leaves at once and every fetch crosses a spine to reach a holder.
    """
    if leaves < 1 or spines < 1:
        raise TopologyError("leaf_spine: leaves and spines must be >= 1")
    if not 1 <= requesters <= 32:
        raise TopologyError(f"leaf_spine: requesters must be 1..32, got {requesters}")
    switches = {f"s{i}": {"tier": "leaf" if i <= leaves else "spine"} for i in range(1, leaves + spines + 1)}
    links: list[Link] = []
    for li in range(1, leaves + 1):
        for si in range(1, spines + 1):
            links.append(Link(Endpoint(f"s{li}", si), Endpoint(f"s{leaves + si}", li), "0ms", fabric_mbps))
    hosts: dict[str, Host] = {}
    next_port = dict.fromkeys(range(1, leaves + 1), spines + 1)
    for h in _holders(holders, "leaf_spine"):
        hosts[h.name] = h
        links.append(Link(Endpoint(h.name), Endpoint("s1", next_port[1]), "0ms", holder_mbps))
        next_port[1] += 1
    requester_leaves = list(range(2, leaves + 1)) or [1]
    for n in range(1, requesters + 1):
        leaf = requester_leaves[(n - 1) % len(requester_leaves)]
        hosts[f"h{n}"] = Host(f"h{n}", f"10.0.0.{n}/24", _mac(n))
        links.append(Link(Endpoint(f"h{n}"), Endpoint(f"s{leaf}", next_port[leaf]), "0ms", host_mbps))
        next_port[leaf] += 1
    topo = Topology(hosts, switches, links)
    topo.validate("leaf_spine")
    return topo


# ------------------------------------------------------------------------ parsing helpers
def _host(name: str, spec: Any, source: str) -> Host:
    if not re.fullmatch(r"h\d+", name):
        raise TopologyError(f"{source}: host name {name!r} must look like h1, h2, ...")
    if not isinstance(spec, dict) or "ip" not in spec or "mac" not in spec:
        raise TopologyError(f"{source}: host {name} needs 'ip' and 'mac'")
    try:
        ipaddress.IPv4Interface(spec["ip"])
    except ValueError:
        raise TopologyError(f"{source}: host {name} has bad ip {spec['ip']!r}") from None
    if not re.fullmatch(r"([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}", str(spec["mac"])):
        raise TopologyError(f"{source}: host {name} has bad mac {spec['mac']!r}")
    role = spec.get("role", "inference")
    if role not in ROLES:
        raise TopologyError(f"{source}: host {name} role {role!r} not in {ROLES}")
    return Host(name, spec["ip"], spec["mac"].lower(), role)


def _endpoint(text: Any, where: str) -> Endpoint:
    if not isinstance(text, str):
        raise TopologyError(f"{where}: link end {text!r} must be a string")
    m = _PORT_RE.match(text)
    if m:
        port = int(m.group(2))
        if port < 1:
            raise TopologyError(f"{where}: port numbers start at 1, got {text}")
        return Endpoint(m.group(1), port)
    if text.startswith("s"):
        raise TopologyError(f"{where}: switch end {text!r} must name a port, like s1-p2")
    return Endpoint(text)


def _link(i: int, item: Any, source: str) -> Link:
    where = f"{source}: links[{i}]"
    if not isinstance(item, list) or not 2 <= len(item) <= 4:
        raise TopologyError(f"{where}: expected [end, end, latency?, bandwidth_mbps?]")
    a, b = _endpoint(item[0], where), _endpoint(item[1], where)
    latency = str(item[2]) if len(item) > 2 else "0ms"
    if latency in ("0", ""):
        latency = "0ms"
    if not _LATENCY_RE.match(latency):
        raise TopologyError(f"{where}: latency {latency!r} must look like 2ms")
    bw: float | None = None
    if len(item) > 3 and item[3] is not None:
        if not isinstance(item[3], int | float) or item[3] <= 0:
            raise TopologyError(f"{where}: bandwidth must be a positive number of Mbit/s, got {item[3]!r}")
        bw = float(item[3])
    return Link(a, b, latency, bw)
