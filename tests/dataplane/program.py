"""Control-plane setup the data-plane tests share: routes, guards, writers, pool entries, waiters.

Everything goes through the controller's P4Runtime driver by P4Info names, exactly as
the controller would program either target.  The topology: host i on port i
(``packets.host``), hosts 1..4.
"""

from __future__ import annotations

import itertools

from controller.p4runtime import Entry, P4RuntimeSwitch
from kvpool import contract as n
from kvpool import wire
from kvpool.contract import PoolState

from .packets import Host, host

N_HOSTS = 4
HOSTS = [host(i) for i in range(1, N_HOSTS + 1)]
HOLDER = host(3)
"""The host that holds chunks and answers GETs (a writer in most tests)."""

FILLING = PoolState.FILLING
VALID = PoolState.VALID
DISABLED = PoolState.DISABLED
UPSTREAM = PoolState.UPSTREAM


def routes(sw: P4RuntimeSwitch) -> None:
    """A /32 route and an ARP unicast entry per host."""
    sw.insert_entries([Entry(n.IPV4_ROUTE, {n.KEY_IPV4_DST: (h.ip, 32)}, n.IPV4_FORWARD,
                             {"port": h.port, "dst_mac": h.mac}) for h in HOSTS])
    sw.insert_entries([Entry(n.ARP_FORWARD, {n.KEY_ARP_TPA: (h.ip, 32)}, n.ARP_UNICAST, {"port": h.port})
                       for h in HOSTS])


def writer(sw: P4RuntimeSwitch, h: Host, port: int | None = None) -> None:
    """Put ``h``'s address on the writers ACL, on its own port (or ``port``)."""
    sw.insert_entry(n.WRITERS, {n.KEY_INGRESS_PORT: h.port if port is None else port, n.KEY_WRITER_SRC: h.ip},
                    n.ALLOW_WRITER)


def guard(sw: P4RuntimeSwitch, hosts: list[Host] | None = None) -> None:
    """Host ports admit only their host's source address (every host by default)."""
    sw.insert_entries([Entry(n.HOST_GUARD, {n.KEY_INGRESS_PORT: h.port}, n.GUARD_SOURCE, {"addr": h.ip})
                       for h in (HOSTS if hosts is None else hosts)])


_PLACEMENTS = itertools.count(1)


def placement_id() -> int:
    """A placement id no other admission of this test run used (as the controller's never repeat)."""
    return next(_PLACEMENTS)


def pool_entry(key: int, base_slot: int, chunk_len: int, generation: int = 0, state: PoolState = FILLING,
               placement: int | None = None) -> Entry:
    """The ``pool_lookup`` entry of chunk ``key`` at ``base_slot`` (a fresh placement id unless given)."""
    return Entry(n.POOL_LOOKUP, {n.KEY_CHUNK_KEY: key}, n.POOL_ENTRY,
                 {"base_slot": base_slot, "frag_count": wire.fragment_count(chunk_len), "chunk_len": chunk_len,
                  "generation": generation, "state": state,
                  "placement": placement_id() if placement is None else placement})


def admit(sw: P4RuntimeSwitch, key: int, base_slot: int, chunk_len: int, generation: int = 0,
          state: PoolState = FILLING, placement: int | None = None) -> int:
    """Admit chunk ``key`` at ``base_slot``; returns its placement id."""
    entry = pool_entry(key, base_slot, chunk_len, generation, state, placement)
    sw.insert_entries([entry])
    return int(entry.params["placement"])


def replace(sw: P4RuntimeSwitch, key: int, base_slot: int, chunk_len: int, generation: int = 0,
            state: PoolState = FILLING, placement: int | None = None) -> int:
    """Re-place chunk ``key`` (MODIFY its entry, a new placement unless given), as the controller does."""
    entry = pool_entry(key, base_slot, chunk_len, generation, state, placement)
    sw.modify_entries([entry])
    return int(entry.params["placement"])


def waiters(sw: P4RuntimeSwitch, hosts: list[Host]) -> dict[int, int]:
    """Waiter ids for ``hosts`` (id = index), their egress rewrite and the nested release groups."""
    ids = {h.port: w for w, h in enumerate(hosts)}
    sw.insert_entries([Entry(n.WAITER_LOOKUP, {n.KEY_WAITER_ADDR: h.ip}, n.SET_WAITER_ID, {"waiter_id": w})
                       for w, h in enumerate(hosts)])
    sw.insert_entries([Entry(n.WAITER_EGRESS, {n.KEY_EGRESS_RID: w}, n.REWRITE_WAITER,
                             {"addr": h.ip, "mac": h.mac}) for w, h in enumerate(hosts)])
    replicas = [(h.port, w) for w, h in enumerate(hosts)]
    for top in range(len(replicas)):
        sw.set_multicast_group(n.COALESCE_MCAST_GRP + top, replicas[:top + 1])
    return ids


def pending_timeout(sw: P4RuntimeSwitch, microseconds: int) -> None:
    """How long a pending GET keeps absorbing duplicates."""
    sw.set_default_action(n.COALESCE_CONFIG, n.SET_PENDING_TIMEOUT, {"timeout_us": microseconds})


def popularity(sw: P4RuntimeSwitch, threshold: int, epoch: int) -> None:
    """Hot threshold and sketch epoch."""
    sw.set_default_action(n.POPULARITY_CONFIG, n.SET_POPULARITY, {"threshold": threshold, "epoch": epoch})


def chunk_bytes(length: int, seed: int = 1) -> bytes:
    """Deterministic chunk content of ``length`` bytes."""
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(length))
