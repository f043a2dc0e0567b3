"""Residents: the chunks the switches hold, their ``pool_lookup`` entries, and adopting a warm pool.

A :class:`Resident` is one chunk in the switch pool: which switch holds its bytes and which
relay its GETs (its :class:`~controller.policy.site.Site`), its base slot (the same on all
of them: one slot space for the fabric), placement id, generation and state. Every
placement gets a fresh placement id (``controller.placement``): slots tagged with an older
one are never served. The ids' high-water mark lives in a reserved ``pool_lookup`` entry
(:func:`mark_entry`).

A new controller on a warm switch adopts its pool (:func:`adopt`): the entries a switch
running this pipeline holds are read back and kept, chunk by chunk, as long as the catalog
knows the chunk and the policy has room for it where it is; the policy takes them as
residents and hits go on without a cold wave. Entries it cannot keep are removed by the
resync.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.catalog import Catalog, ChunkInfo
from controller.p4runtime import Entry
from controller.placement import MARK_KEY
from controller.policy.engine import PolicyEngine
from controller.policy.site import Site
from controller.settings import ControllerError
from kvpool import contract as n
from kvpool.contract import PoolState

log = logging.getLogger("kvpool.controller")


@dataclass
class Resident:
    """A chunk the switches hold: where, under which placement id, generation and state.

    ``site`` says which switch holds its bytes and which relay its GETs (``controller.policy.site``);
    ``base_slot`` is the same on all of them (one slot space for the fabric).
    """

    info: ChunkInfo
    base_slot: int
    placement: int = 0
    generation: int = 0
    valid: bool = False
    site: Site = field(default_factory=lambda: Site(""))


def pool_entry(res: Resident, state: int) -> Entry:
    """The ``pool_lookup`` entry for ``res`` in ``state`` (its switch: FILLING or VALID; a relay: UPSTREAM)."""
    return Entry(n.POOL_LOOKUP, {n.KEY_CHUNK_KEY: res.info.key}, n.POOL_ENTRY,
                 {"base_slot": res.base_slot, "frag_count": res.info.frag_count, "chunk_len": res.info.nbytes,
                  "generation": res.generation, "state": state, "placement": res.placement})


def mark_entry(mark: int) -> Entry:
    """The reserved entry that keeps the placement high-water mark on a switch (never served)."""
    return Entry(n.POOL_LOOKUP, {n.KEY_CHUNK_KEY: MARK_KEY}, n.POOL_ENTRY,
                 {"base_slot": 0, "frag_count": 1, "chunk_len": 1, "generation": 0,
                  "state": PoolState.DISABLED, "placement": mark})


def pool_key(e: Entry) -> int:
    """The chunk key of a ``pool_lookup`` entry read back from a switch."""
    key = e.match.get(n.KEY_CHUNK_KEY)
    if not isinstance(key, int):
        raise ControllerError(f"pool entry {e.describe()} has no exact chunk key")
    return key


def int_params(e: Entry) -> dict[str, int]:
    """The action parameters of an entry read back from a switch (decoded: ints)."""
    return {k: v for k, v in e.params.items() if isinstance(v, int)}


def placement_ids(warm: Mapping[str, list[Entry]]) -> tuple[list[int], list[int]]:
    """(placement ids, marks) the warm switches' pool entries hold: ids continue above all of them."""
    placements: list[int] = []
    marks: list[int] = []
    for entries in warm.values():
        for e in entries:
            pid = int_params(e).get("placement", 0)
            (marks if pool_key(e) == MARK_KEY else placements).append(pid)
    return placements, marks


class Intends(Protocol):
    """What :func:`adopt` needs of a switch's driver: adding to its intended state."""

    def intend(self, entries: Iterable[Entry] = ()) -> None:
        """Add ``entries`` to what the next resync makes the switch hold."""


def adopt(warm: Mapping[str, list[Entry]], catalog: Catalog, engine: PolicyEngine,
          switches: Mapping[str, Intends]) -> tuple[dict[int, Resident], set[int]]:
    """Keep the pool entries warm switches hold: residents for the policy, intended entries for the drivers.

    One resident per chunk, at the switch whose entry holds its bytes (FILLING or VALID);
    where switches disagree, the newest placement wins.  Its site's relays are the
    switches holding an UPSTREAM entry of that same placement.  Entries that match are
    kept as they are (filled, no write); a site switch whose entry differs gets it in
    state FILLING and the holder is asked to push the chunk there; entries outside the
    adopted sites are removed by the resync.  Returns the residents (restored in
    ``engine``) and the keys to refill.
    """
    residents: dict[int, Resident] = {}
    refill: set[int] = set()
    found: dict[int, tuple[Entry, str]] = {}
    relays: dict[tuple[int, int], set[str]] = {}
    for name, entries in warm.items():
        for e in entries:
            key, params = pool_key(e), int_params(e)
            if key == MARK_KEY:
                continue
            if params.get("state") == PoolState.UPSTREAM:
                relays.setdefault((key, params.get("placement", 0)), set()).add(name)
                continue
            if params.get("state") not in (PoolState.FILLING, PoolState.VALID):
                continue
            if key not in found or params["placement"] > int_params(found[key][0])["placement"]:
                found[key] = (e, name)
    kept: dict[int, Entry] = {}
    for key, (e, name) in sorted(found.items(), key=lambda kv: int_params(kv[1][0])["base_slot"]):
        params = int_params(e)
        info = catalog.get(key)
        if info is None:
            log.info("switch %s: chunk %#x is not in the catalog: not adopted", name, key)
            continue
        info = ChunkInfo(key, info.parent, info.position, params["chunk_len"])
        if info.frag_count != params["frag_count"] or not engine.can_restore(info.nbytes, params["base_slot"]):
            log.info("switch %s: chunk %#x does not fit the pool where it is: not adopted", name, key)
            continue
        engine.restore(info.key, info.parent, info.position, info.nbytes, params["base_slot"])
        site = Site(name, frozenset(relays.get((key, params["placement"]), set()) - {name}))
        residents[key] = Resident(info, params["base_slot"], params["placement"], params["generation"],
                                  params["state"] == PoolState.VALID, site=site)
        kept[key] = e
    for name, sw in switches.items():
        held = {pool_key(e): e for e in warm.get(name, [])}
        mine: list[Entry] = []
        for key, e in kept.items():
            res = residents[key]
            if name == res.site.switch:
                if held.get(key) == e:
                    mine.append(e)  # this switch holds exactly that placement: keep it as it is
                else:
                    mine.append(pool_entry(res, PoolState.FILLING))
                    refill.add(key)
            elif name in res.site.relays:
                mine.append(held[key])  # an UPSTREAM entry of the same placement, read back
        sw.intend(mine)
    if kept:
        log.info("adopted %d chunk(s) from the pool of %s: hits go on", len(kept), ", ".join(sorted(warm)))
    return residents, refill
