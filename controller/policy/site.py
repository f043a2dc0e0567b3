"""Which switch of a fabric holds a chunk's bytes (pure: a topology and counts in, a site out).

Every switch has a pool, and a chunk admitted to "the pool" lives on one of them.  Where
it lives decides what it saves.  With coalescing, a wave of fetches for a chunk carries
one copy over every link of the union of the requesters' paths to the holder (each
switch sends one GET per fragment upstream and replicates the answer down); a copy on
switch ``X`` answers the GETs that reach ``X`` and so removes the copies on every link
between ``X`` and the holder, the holder's own link included.  Of the switches every
demand path crosses, the one nearest the requesters removes the most of them; a switch
below it would answer only its own branch and leave the others' copies on the spine and
holder links.  So one copy goes to the *meeting point*: the switch, common to the paths
from every switch where demand enters the fabric toward the chunk's holders, that lies
farthest from the holders (``choose_site``).  With requesters behind one leaf that is the
leaf itself (every link is saved); behind several leaves under one spine, the spine
(holder and spine-to-holder links saved, each leaf's uplink carries one copy a wave,
which the leaf multicasts).  The docs walk through it (docs/guide/operations.md).

Demand is where the switches saw it: popularity counts a fetch once, at the switch where
it entered the fabric (p4/README.md, step 4), so the hot-chunk reports name exactly the
first-hop switches of the chunk's requesters.  A chunk admitted without reports (an
operator's admission) is placed for every switch that has requesters attached.

A GET is answered only where it still carries reply room, and a switch strips the room of
every GET it does not answer.  So the switches between the demand and the meeting point
(``Site.relays``) hold the chunk's entry in state UPSTREAM, which lets its GETs keep
their room for the switch above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvpool.topology import Topology


@dataclass(frozen=True, slots=True)
class Site:
    """Where one chunk lives: ``switch`` holds and serves its bytes; ``relays`` pass its GETs on with their room."""

    switch: str
    relays: frozenset[str] = frozenset()

    @property
    def switches(self) -> frozenset[str]:
        """Every switch that holds an entry for the chunk."""
        return self.relays | {self.switch}


def edge_switches(topo: Topology) -> dict[str, int]:
    """Switches with inference hosts attached -> how many (where demand enters the fabric)."""
    out: dict[str, int] = {}
    for h in topo.inference_hosts():
        sw = topo.attachment(h.name)
        out[sw] = out.get(sw, 0) + 1
    return out


def choose_site(topo: Topology, holders: Iterable[str], demand: Mapping[str, int]) -> Site:
    """The switch one copy of a chunk saves the most bytes on, given where its fetches enter the fabric.

    ``holders`` are the host names that serve the chunk (every path to any of them must
    cross the site); ``demand`` maps switches to fetches counted there (empty: every edge
    switch, weighted by its requesters).  Ties go to the lower-named switch.  When the
    demand paths share no switch at all (holders in different places), the switch with
    the most demand holds it and serves its own branch.
    """
    targets = sorted(set(holders))
    if not targets:
        raise ValueError("choose_site: a chunk needs at least one holder")
    weights = {sw: n for sw, n in demand.items() if n > 0 and sw in topo.switches} or edge_switches(topo)
    if not weights:
        raise ValueError("choose_site: no switch with demand or requesters")
    paths = {(sw, h): topo.path(sw, h) for sw in sorted(weights) for h in targets}
    common = set.intersection(*(set(p) for p in paths.values()))
    if not common:
        top = min(weights, key=lambda sw: (-weights[sw], sw))
        return Site(top)
    # Farthest from the holders: the most hops left on its way to them, summed over the holders.
    hops = {sw: sum(len(topo.path(sw, h)) for h in targets) for sw in common}
    site = min(common, key=lambda sw: (-hops[sw], sw))
    relays: set[str] = set()
    for p in paths.values():
        relays.update(p[:p.index(site)])
    return Site(site, frozenset(relays))
