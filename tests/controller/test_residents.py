"""Residents on their own: pool entries, the placement mark, and adopting a warm switch's pool (no switch)."""

from __future__ import annotations

from collections.abc import Iterable

from controller.catalog import Catalog, ChunkInfo
from controller.p4runtime import Entry
from controller.placement import MARK_KEY
from controller.policy.engine import PolicyConfig, PolicyEngine
from controller.policy.site import Site
from controller.residents import Resident, adopt, int_params, mark_entry, placement_ids, pool_entry, pool_key
from kvpool import contract as n
from kvpool import wire
from kvpool.contract import PoolState

KEY = 0xABCD_0001
NBYTES = 2 * wire.FRAG_PAYLOAD  # 2 fragments


class FakeDriver:
    """A driver as ``adopt`` sees it: records what it is told to intend."""

    def __init__(self) -> None:
        self.intended: list[Entry] = []

    def intend(self, entries: Iterable[Entry] = ()) -> None:
        self.intended.extend(entries)


def _resident(switch: str = "s1", relays: frozenset[str] = frozenset(), placement: int = 7) -> Resident:
    return Resident(ChunkInfo(KEY, None, 0, NBYTES), base_slot=4, placement=placement, generation=2,
                    site=Site(switch, relays))


def test_pool_entry_and_mark_entry_read_back_as_they_were_written() -> None:
    e = pool_entry(_resident(), PoolState.VALID)
    assert e.table == n.POOL_LOOKUP and pool_key(e) == KEY
    assert int_params(e) == {"base_slot": 4, "frag_count": 2, "chunk_len": NBYTES, "generation": 2,
                             "state": PoolState.VALID, "placement": 7}
    m = mark_entry(300)
    assert pool_key(m) == MARK_KEY and int_params(m)["placement"] == 300
    assert placement_ids({"s1": [e, m], "s2": [pool_entry(_resident(placement=9), PoolState.UPSTREAM)]}) == \
        ([7, 9], [300])


def test_adopt_keeps_a_known_chunk_and_its_relay_and_skips_the_unknown() -> None:
    engine = PolicyEngine(PolicyConfig(capacity_bytes=64 * wire.FRAG_PAYLOAD))
    catalog = Catalog([ChunkInfo(KEY, None, 0, NBYTES)])
    held = pool_entry(_resident(relays=frozenset({"s2"})), PoolState.VALID)
    relay = pool_entry(_resident(relays=frozenset({"s2"})), PoolState.UPSTREAM)
    unknown = Entry(held.table, {n.KEY_CHUNK_KEY: KEY + 1}, held.action, dict(held.params) | {"base_slot": 10})
    drivers = {"s1": FakeDriver(), "s2": FakeDriver(), "s3": FakeDriver()}
    residents, refill = adopt({"s1": [held, unknown], "s2": [relay]}, catalog, engine, drivers)
    assert list(residents) == [KEY] and not refill
    res = residents[KEY]
    assert (res.base_slot, res.placement, res.valid, res.site) == (4, 7, True, Site("s1", frozenset({"s2"})))
    assert engine.holds(KEY)
    assert drivers["s1"].intended == [held] and drivers["s2"].intended == [relay] and drivers["s3"].intended == []


def test_adopt_refills_a_site_whose_entry_is_older_than_the_newest_placement() -> None:
    engine = PolicyEngine(PolicyConfig(capacity_bytes=64 * wire.FRAG_PAYLOAD))
    catalog = Catalog([ChunkInfo(KEY, None, 0, NBYTES)])
    old = pool_entry(_resident("s1", placement=3), PoolState.VALID)
    new = pool_entry(_resident("s2", placement=8), PoolState.FILLING)
    drivers = {"s1": FakeDriver(), "s2": FakeDriver()}
    residents, refill = adopt({"s1": [old], "s2": [new]}, catalog, engine, drivers)
    assert residents[KEY].site.switch == "s2" and residents[KEY].placement == 8 and not residents[KEY].valid
    assert drivers["s2"].intended == [new] and drivers["s1"].intended == [] and not refill
