"""The directory of holders: which node holds chunk k, in which tier (pure state, no I/O).

Host agents register (node id, address, role, tier capacities), then publish and withdraw
the chunks they hold, and heartbeat. Requesters ask :meth:`Directory.holders` whom to
address a GET to. A node whose heartbeats stop for ``heartbeat_timeout_s`` is marked down
at the next :meth:`Directory.sweep` and its chunks are no longer offered; they are not
forgotten either, only hidden, so a node that was merely partitioned is not confused with
an empty one. A down node must *register* again (a heartbeat is refused), and registering
starts it from an empty chunk list: the agent republishes what it really holds, so nothing
stale is ever offered after a restart.

Only addresses in the configured node list (normally the topology's hosts) may register.
Registering hands the node a credential (random, per registration); every later call for
the node (heartbeat, publish, withdraw, deregister, and registering it again while it is
live) must present it, so nobody else can speak for a registered node. A method given
``credential=None`` trusts its caller (the controller itself, tests); ``controller.api``
always passes what the request carried.
The clock is injectable so heartbeat expiry is tested without sleeping. Every method takes
one short lock: the API's threads call it, and the controller's epoch loop sweeps it.
"""

from __future__ import annotations

import enum
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Tiers an agent may declare, fastest first (names of ``controller.policy.tiers.Tier``, lower-case).
NODE_TIERS: tuple[str, ...] = ("hbm", "dram", "pool")


class Role(enum.StrEnum):
    """What a node does: serves chunks (holder) or fetches them (inference)."""

    HOLDER = "holder"
    INFERENCE = "inference"


class DirectoryError(ValueError):
    """A directory request that cannot be honoured; ``code`` says which kind (the API maps it to a status)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


#: DirectoryError codes.
REFUSED = "refused"  # address not in the node list, or role differs from the configured one
UNKNOWN_NODE = "unknown_node"
NODE_DOWN = "node_down"  # heartbeat or publish from a node marked down: register again
BAD_REQUEST = "bad_request"
OVER_CAPACITY = "over_capacity"
NODE_LIVE = "node_live"  # registering a node id that is registered and up, without its credential
BAD_CREDENTIAL = "bad_credential"  # a call for a node without the credential its registration got


@dataclass
class Node:
    """One registered agent and what it holds."""

    node_id: str
    address: str
    role: Role
    capacities: dict[str, int]
    registered_at: float
    last_seen: float
    up: bool = True
    #: chunk key -> tier -> bytes
    chunks: dict[int, dict[str, int]] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    #: what every call for this node must present (see the module docstring)
    credential: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)

    def as_dict(self, now: float) -> dict[str, Any]:
        """JSON-friendly summary (no chunk list: that can be long)."""
        return {"node_id": self.node_id, "address": self.address, "role": str(self.role), "up": self.up,
                "capacities": dict(self.capacities), "used": {t: self.used.get(t, 0) for t in self.capacities},
                "chunks": len(self.chunks), "last_seen_s": round(now - self.last_seen, 3)}


@dataclass(frozen=True)
class Holding:
    """One copy of a chunk: on which node (and its role), at which address, in which tier, how many bytes."""

    node_id: str
    address: str
    tier: str
    nbytes: int
    role: Role = Role.HOLDER

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"node_id": self.node_id, "address": self.address, "tier": self.tier, "nbytes": self.nbytes,
                "role": str(self.role)}


class Directory:
    """Chunk key -> holders and tier, for the nodes of the configured node list (see the module docstring)."""

    def __init__(self, allowed: Mapping[str, Role | None], heartbeat_timeout_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat timeout must be positive, got {heartbeat_timeout_s}")
        #: address -> the role configured for it (None: either role)
        self.allowed = dict(allowed)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.clock = clock
        self._nodes: dict[str, Node] = {}
        self._index: dict[int, set[str]] = {}  # chunk key -> node ids that published it
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ membership
    def register(self, node_id: str, address: str, role: str, capacities: Mapping[str, int],
                 credential: str | None = None) -> Node:
        """Register (or re-register) a node; it starts up with no chunks and a new ``credential``.

        Refused outside the node list, and for a node id that is up unless ``credential`` is its own.
        """
        if not node_id or len(node_id) > 64 or not node_id.isprintable():
            raise DirectoryError(BAD_REQUEST, f"node id {node_id!r}: expected 1..64 printable characters")
        try:
            r = Role(role)
        except ValueError:
            raise DirectoryError(BAD_REQUEST, f"role {role!r}: expected holder or inference") from None
        caps: dict[str, int] = {}
        for tier, cap in capacities.items():
            if tier not in NODE_TIERS:
                raise DirectoryError(BAD_REQUEST, f"tier {tier!r}: expected one of {', '.join(NODE_TIERS)}")
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
                raise DirectoryError(BAD_REQUEST, f"capacity of tier {tier}: expected bytes >= 0, got {cap!r}")
            caps[tier] = cap
        if address not in self.allowed:
            raise DirectoryError(REFUSED, f"address {address} is not in the configured node list")
        want = self.allowed[address]
        if want is not None and want is not r:
            raise DirectoryError(REFUSED, f"address {address} is configured as {want}, not {r}")
        with self._lock:
            for other in self._nodes.values():
                if other.address == address and other.node_id != node_id and other.up:
                    raise DirectoryError(REFUSED, f"address {address} is already registered as node "
                                                  f"{other.node_id!r}")
            old = self._nodes.get(node_id)
            if old is not None and old.up and not _same(old, credential):
                raise DirectoryError(NODE_LIVE, f"node {node_id!r} is registered and live: only it can register "
                                                f"again; else wait until it misses its heartbeats "
                                                f"({self.heartbeat_timeout_s:g} s)")
            if old is not None:
                self._drop_chunks(old)
            now = self.clock()
            node = Node(node_id, address, r, caps, now, now)
            self._nodes[node_id] = node
            return node

    def heartbeat(self, node_id: str, credential: str | None = None) -> None:
        """Note that ``node_id`` is alive; a down node is told to register again."""
        with self._lock:
            node = self._live(node_id, credential)
            node.last_seen = self.clock()

    def deregister(self, node_id: str, credential: str | None = None) -> None:
        """Remove a node and its chunks (clean shutdown of an agent)."""
        with self._lock:
            node = self._known(node_id, credential)
            del self._nodes[node_id]
            self._drop_chunks(node)

    def sweep(self) -> list[str]:
        """Mark nodes silent for longer than the heartbeat timeout as down; returns their ids."""
        now = self.clock()
        gone: list[str] = []
        with self._lock:
            for node in self._nodes.values():
                if node.up and now - node.last_seen > self.heartbeat_timeout_s:
                    node.up = False
                    gone.append(node.node_id)
        return gone

    # ------------------------------------------------------------------ chunks
    def publish(self, node_id: str, keys: Iterable[int], tier: str, nbytes: int, credential: str | None = None) -> int:
        """``node_id`` holds each chunk of ``keys`` (``nbytes`` each) in ``tier``; returns how many were new."""
        keys = list(keys)
        if nbytes < 0:
            raise DirectoryError(BAD_REQUEST, f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            node = self._live(node_id, credential)
            if tier not in node.capacities:
                raise DirectoryError(BAD_REQUEST, f"node {node_id!r} declared no {tier!r} tier "
                                                  f"(it has {', '.join(node.capacities) or 'none'})")
            grow = sum(nbytes - node.chunks.get(k, {}).get(tier, 0) for k in dict.fromkeys(keys))
            if node.used.get(tier, 0) + grow > node.capacities[tier]:
                raise DirectoryError(OVER_CAPACITY, f"node {node_id!r}: {tier} would hold "
                                                    f"{node.used.get(tier, 0) + grow} of "
                                                    f"{node.capacities[tier]} bytes")
            new = 0
            for k in keys:
                tiers = node.chunks.setdefault(k, {})
                new += tier not in tiers
                node.used[tier] = node.used.get(tier, 0) + nbytes - tiers.get(tier, 0)
                tiers[tier] = nbytes
                self._index.setdefault(k, set()).add(node_id)
            return new

    def withdraw(self, node_id: str, keys: Iterable[int], tier: str | None = None,
                 credential: str | None = None) -> int:
        """``node_id`` no longer holds ``keys`` (in ``tier``, or in any tier); returns copies removed."""
        removed = 0
        with self._lock:
            node = self._known(node_id, credential)
            for k in keys:
                tiers = node.chunks.get(k)
                if not tiers:
                    continue
                for t in [tier] if tier is not None else list(tiers):
                    if t in tiers:
                        node.used[t] -= tiers.pop(t)
                        removed += 1
                if not tiers:
                    del node.chunks[k]
                    self._unindex(k, node_id)
        return removed

    def holders(self, key: int) -> list[Holding]:
        """Copies of ``key`` on nodes that are up, fastest tier first, then by node id."""
        with self._lock:
            out = [Holding(nid, node.address, t, nb, node.role)
                   for nid in self._index.get(key, ())
                   if (node := self._nodes[nid]).up
                   for t, nb in node.chunks[key].items()]
        return sorted(out, key=lambda h: (NODE_TIERS.index(h.tier), h.node_id))

    # ------------------------------------------------------------------ views
    def address_of(self, node_id: str) -> str | None:
        """The address ``node_id`` registered with, None when it is not registered."""
        with self._lock:
            node = self._nodes.get(node_id)
            return None if node is None else node.address

    def nodes(self) -> list[dict[str, Any]]:
        """Every registered node, up or down, by id."""
        now = self.clock()
        with self._lock:
            return [self._nodes[k].as_dict(now) for k in sorted(self._nodes)]

    def counts(self) -> dict[str, int]:
        """Nodes up and down."""
        with self._lock:
            up = sum(n.up for n in self._nodes.values())
            return {"up": up, "down": len(self._nodes) - up}

    def tiers(self) -> dict[str, dict[str, int]]:
        """Per tier, over nodes that are up: capacity, bytes used, chunk copies, nodes declaring it."""
        out = {t: {"capacity": 0, "used": 0, "chunks": 0, "nodes": 0} for t in NODE_TIERS}
        with self._lock:
            for node in self._nodes.values():
                if not node.up:
                    continue
                for t, cap in node.capacities.items():
                    out[t]["capacity"] += cap
                    out[t]["used"] += node.used.get(t, 0)
                    out[t]["nodes"] += 1
                for tiers in node.chunks.values():
                    for t in tiers:
                        out[t]["chunks"] += 1
        return out

    def chunk_tiers(self) -> dict[int, list[tuple[str, str]]]:
        """Every chunk offered by an up node -> [(node id, tier)], for the ``top`` view."""
        with self._lock:
            out: dict[int, list[tuple[str, str]]] = {}
            for k, nids in self._index.items():
                places = [(nid, t) for nid in sorted(nids) if self._nodes[nid].up for t in self._nodes[nid].chunks[k]]
                if places:
                    out[k] = places
            return out

    # ------------------------------------------------------------------ internals (lock held)
    def _known(self, node_id: str, credential: str | None) -> Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise DirectoryError(UNKNOWN_NODE, f"node {node_id!r} is not registered")
        if not _same(node, credential):
            raise DirectoryError(BAD_CREDENTIAL, f"node {node_id!r}: missing or wrong node credential (only the "
                                                 "agent that registered it may speak for it)")
        return node

    def _live(self, node_id: str, credential: str | None = None) -> Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise DirectoryError(UNKNOWN_NODE, f"node {node_id!r} is not registered")
        if not node.up:
            raise DirectoryError(NODE_DOWN, f"node {node_id!r} was marked down (no heartbeat for "
                                            f"{self.heartbeat_timeout_s:g} s): register again")
        return self._known(node_id, credential)

    def _drop_chunks(self, node: Node) -> None:
        for k in node.chunks:
            self._unindex(k, node.node_id)
        node.chunks.clear()
        node.used.clear()

    def _unindex(self, key: int, node_id: str) -> None:
        nids = self._index.get(key)
        if nids is not None:
            nids.discard(node_id)
            if not nids:
                del self._index[key]


def _same(node: Node, credential: str | None) -> bool:
    """Whether ``credential`` is ``node``'s (None: a trusted caller); constant time."""
    return credential is None or hmac.compare_digest(node.credential.encode(), credential.encode())
