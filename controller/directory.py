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

Generations (docs/design/correctness.md): the directory issues each chunk's generation per
content (:meth:`Directory.issue`): the same bytes (the same content digest) keep their
generation, new bytes get the next one, and a generation is never issued twice for one
key. So a holder that restarts and publishes its bytes again gets the generation every
switch and requester already knows, and a republish with other bytes always moves it.
Copies are published with the generation they hold, and only copies of the current
generation are offered. After a controller restart the directory starts empty and
relearns: agents re-register and republish their copies with their generations and
digests (:meth:`Directory.note`), the first one known for a key becomes current, later
different ones are stale, and nothing below the highest generation seen is issued again.
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


#: Largest generation (the wire's field is 32 bits); 0 is never issued ("no directory").
MAX_GENERATION = 0xFFFF_FFFF

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
    #: chunk key -> generation of the copy this node holds (absent: not said)
    generations: dict[int, int] = field(default_factory=dict)

    def as_dict(self, now: float) -> dict[str, Any]:
        """JSON-friendly summary (no chunk list: that can be long)."""
        return {"node_id": self.node_id, "address": self.address, "role": str(self.role), "up": self.up,
                "capacities": dict(self.capacities), "used": {t: self.used.get(t, 0) for t in self.capacities},
                "chunks": len(self.chunks), "last_seen_s": round(now - self.last_seen, 3)}


@dataclass(frozen=True)
class Version:
    """What the directory says a chunk is now: its generation, content digest and length."""

    generation: int
    digest: int
    nbytes: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (the digest as hex: JSON numbers lose precision past 2**53)."""
        return {"generation": self.generation, "digest": f"{self.digest:#018x}", "nbytes": self.nbytes}


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
        self._versions: dict[int, Version] = {}  # chunk key -> current version
        self._highest: dict[int, int] = {}  # chunk key -> highest generation issued or seen
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

    # ------------------------------------------------------------------ generations
    def issue(self, key: int, digest: int, nbytes: int) -> tuple[Version, Version | None]:
        """The version of ``key`` with content ``digest``: ``(current, previous)``.

        ``previous`` is the version it replaced, or None when the content is unchanged
        (same digest: same generation) or the key is new (generation 1, or one above the
        highest generation seen for it).  The caller moves every switch and copy off
        ``previous`` before it tells the publisher the publish is done.
        """
        if not 0 <= digest <= 0xFFFF_FFFF_FFFF_FFFF or nbytes <= 0:
            raise DirectoryError(BAD_REQUEST, f"digest must be 64 bits and nbytes positive, got {digest}, {nbytes}")
        with self._lock:
            cur = self._versions.get(key)
            if cur is not None and cur.digest == digest and cur.nbytes == nbytes:
                return cur, None
            gen = self._highest.get(key, 0) + 1
            if gen > MAX_GENERATION:
                raise DirectoryError(BAD_REQUEST, f"chunk {key:#x} has used every generation")
            new = Version(gen, digest, nbytes)
            self._versions[key] = new
            self._highest[key] = gen
            return new, cur

    def note(self, key: int, generation: int, digest: int, nbytes: int) -> bool:
        """Learn of a copy at ``generation`` with ``digest`` (an agent republishing after a restart).

        Returns True if that copy is current: the key was unknown (the copy's version
        becomes current) or the copy is exactly the current version.  False means stale:
        its holder must drop it.  Either way no generation up to ``generation`` is issued
        for ``key`` again.
        """
        if not 0 < generation <= MAX_GENERATION:
            raise DirectoryError(BAD_REQUEST, f"generation must be 1..{MAX_GENERATION}, got {generation}")
        with self._lock:
            self._highest[key] = max(self._highest.get(key, 0), generation)
            cur = self._versions.get(key)
            if cur is None:
                self._versions[key] = Version(generation, digest, nbytes)
                return True
            return cur == Version(generation, digest, nbytes)

    def note_generation(self, key: int, generation: int) -> None:
        """A copy at ``generation`` exists somewhere: never issue that generation (or a lower one) for ``key``."""
        if 0 < generation <= MAX_GENERATION:
            with self._lock:
                self._highest[key] = max(self._highest.get(key, 0), generation)

    def role_of(self, node_id: str) -> Role | None:
        """The role ``node_id`` registered with, None when it is not registered."""
        with self._lock:
            node = self._nodes.get(node_id)
            return None if node is None else node.role

    def version(self, key: int) -> Version | None:
        """The current version of ``key``, or None when the directory has issued none."""
        with self._lock:
            return self._versions.get(key)

    def generations(self, keys: Iterable[int]) -> dict[int, int]:
        """Current generation of each of ``keys`` the directory knows (unknown keys left out)."""
        with self._lock:
            return {k: v.generation for k in keys if (v := self._versions.get(k)) is not None}

    # ------------------------------------------------------------------ chunks
    def publish(self, node_id: str, keys: Iterable[int], tier: str, nbytes: int, credential: str | None = None,
                generations: Mapping[int, int] | None = None) -> int:
        """``node_id`` holds each chunk of ``keys`` (``nbytes`` each) in ``tier``; returns how many were new.

        ``generations`` (key -> generation of the copy) lets :meth:`holders` offer only
        copies of the current generation; once the directory has issued one for a key, a
        copy published without a generation is no longer offered.
        """
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
                if generations is not None and k in generations:
                    node.generations[k] = generations[k]
                    if 0 < generations[k] <= MAX_GENERATION:
                        self._highest[k] = max(self._highest.get(k, 0), generations[k])
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
                    node.generations.pop(k, None)
                    self._unindex(k, node_id)
        return removed

    def holders(self, key: int) -> list[Holding]:
        """Copies of ``key`` on nodes that are up and hold the current generation, fastest tier first, then by node id.

        A copy published without a generation counts as current until the directory has
        issued one for the key.
        """
        with self._lock:
            cur = self._versions.get(key)
            out = [Holding(nid, node.address, t, nb, node.role)
                   for nid in self._index.get(key, ())
                   if (node := self._nodes[nid]).up
                   and (cur is None or node.generations.get(key) == cur.generation)
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
        node.generations.clear()

    def _unindex(self, key: int, node_id: str) -> None:
        nids = self._index.get(key)
        if nids is not None:
            nids.discard(node_id)
            if not nids:
                del self._index[key]


def _same(node: Node, credential: str | None) -> bool:
    """Whether ``credential`` is ``node``'s (None: a trusted caller); constant time."""
    return credential is None or hmac.compare_digest(node.credential.encode(), credential.encode())
