"""Popularity: missed GETs counted in the count-min sketch, one digest per hot chunk and epoch."""

from __future__ import annotations

import queue

import pytest

from controller.p4runtime import Digest
from kvpool import contract as n
from kvpool import wire
from kvpool.contract import PopularityStat as PopStat
from switchmodel.parser import Kv
from switchmodel.popularity import bloom_indices, sketch_indices

from . import program
from .harness import ModelTarget, Target
from .packets import get_frame, host, with_ttl
from .program import HOLDER

KEY = 0x0B100DF00D
BLOOM_TWIN = 0x1F0CC2
"""Found offline: a key whose two Bloom cells (crc32 and crc16 of {BLOOM_SALT, key}) are KEY's."""


def _kv(key: int) -> Kv:
    """A fragment-0 GET header for ``key`` (the popularity hashes read only the key)."""
    return Kv(wire.KVPOOL_VERSION, int(wire.Opcode.GET), 0, key, 0, 1, 0, 0, 0, 0, 0, 0)


def _get(target: Target, key: int, frag: int = 0, flags: int = 0) -> None:
    frame = get_frame(host(1), HOLDER, key, frag, flags=flags)
    target.send(1, frame)
    target.expect(HOLDER.port, with_ttl(frame, 63))  # counting never stops a GET


def _digests(target: Target, wait_s: float = 0.5) -> list[Digest]:
    out = []
    try:
        out.append(target.sw.digests.get(timeout=wait_s))
        while True:
            out.append(target.sw.digests.get(timeout=0.2))
    except queue.Empty:
        return out


def _setup(target: Target, threshold: int, epoch: int = 1) -> None:
    program.routes(target.sw)
    program.popularity(target.sw, threshold, epoch)
    target.sw.configure_digest(n.HOT_CHUNK)


def test_digest_once_when_crossing_threshold_then_bloom_suppresses(target: Target) -> None:
    _setup(target, threshold=3)
    for _ in range(5):
        _get(target, KEY)
    target.expect_no_other_packets()
    got = _digests(target)
    assert [d.items for d in got] == [[{"chunk_key": KEY, "estimate": 3, "epoch": 1}]]
    assert target.counters(n.POPULARITY_STATS) == {PopStat.COUNTED: 5, PopStat.REPORTED: 1, PopStat.SUPPRESSED: 2}


def test_only_first_fragment_non_retransmit_gets_outside_the_pool_count(target: Target) -> None:
    _setup(target, threshold=1)
    program.admit(target.sw, KEY, 0, 5000)
    _get(target, KEY)  # in the pool: hits are counted in slot_hits, not here
    _get(target, KEY + 1, frag=2)  # not a new fetch of the chunk
    _get(target, KEY + 1, flags=int(wire.Flag.RETRANSMIT))
    target.expect_no_other_packets()
    assert target.counters(n.POPULARITY_STATS) == {}
    assert _digests(target, wait_s=0.3) == []


def test_epoch_change_restarts_counting(target: Target) -> None:
    _setup(target, threshold=2, epoch=1)
    _get(target, KEY)
    _get(target, KEY)
    assert [d.items for d in _digests(target)] == [[{"chunk_key": KEY, "estimate": 2, "epoch": 1}]]
    program.popularity(target.sw, 2, 2)
    _get(target, KEY)  # count 1 in the new epoch: the old cells read as empty
    assert _digests(target, wait_s=0.3) == []
    _get(target, KEY)
    assert [d.items for d in _digests(target)] == [[{"chunk_key": KEY, "estimate": 2, "epoch": 2}]]
    target.expect_no_other_packets()


def test_bloom_false_positive_matches_bmv2_hashes(target: Target) -> None:
    # The model's twin of popularity.p4's Bloom hashes (tied to the build by test_model_vs_build).
    assert bloom_indices(_kv(KEY)) == bloom_indices(_kv(BLOOM_TWIN)), "BLOOM_TWIN was found for another hash"
    _setup(target, threshold=1)
    _get(target, KEY)
    _get(target, BLOOM_TWIN)  # never reported, but both its Bloom cells are set: suppressed
    target.expect_no_other_packets()
    assert [d.items for d in _digests(target)] == [[{"chunk_key": KEY, "estimate": 1, "epoch": 1}]]
    assert target.counters(n.POPULARITY_STATS) == {PopStat.COUNTED: 2, PopStat.REPORTED: 1, PopStat.SUPPRESSED: 1}


def test_sketch_cells_sit_where_bmv2_puts_them(target: Target) -> None:
    if not isinstance(target, ModelTarget):
        pytest.skip("registers are visible in-process only (BMv2's P4Runtime server cannot read them)")
    _setup(target, threshold=100, epoch=5)
    for _ in range(4):
        _get(target, KEY)
    cells = list(zip(n.SKETCH_ROWS, sketch_indices(_kv(KEY)), strict=True))
    tag = 0x80 | 5
    for reg, index in cells:
        assert target.state.register_read(reg, index) == (tag << 24) | 4
    assert sum(1 for i in range(n.SKETCH_COLS) if target.state.register_read(n.SKETCH_ROWS[0], i)) == 1


def test_a_get_from_a_fabric_port_was_counted_where_it_entered(target: Target) -> None:
    # Port 2 faces another switch: the GETs crossing it were counted by that switch already.
    _setup(target, threshold=1)
    target.sw.insert_entry(n.HOST_GUARD, {n.KEY_INGRESS_PORT: 2}, n.FABRIC_PORT)
    frame = get_frame(host(1), HOLDER, KEY)
    target.send(2, frame)  # host 1's GET, arriving through the fabric: forwarded, not counted
    target.expect(HOLDER.port, with_ttl(frame, 63))
    target.expect_no_other_packets()
    assert target.counters(n.POPULARITY_STATS) == {}
    assert _digests(target, wait_s=0.3) == []
    _get(target, KEY)  # the same GET straight from host 1's own port counts
    assert target.counters(n.POPULARITY_STATS) == {PopStat.COUNTED: 1, PopStat.REPORTED: 1}
