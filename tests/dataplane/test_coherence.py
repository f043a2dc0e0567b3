"""Coherence: generations and placements live in the controller's entries; stale bytes are never served.

The controller moves a chunk to a new generation (a republish) by installing a new
placement id with it; slots tagged with the old placement are never served again, and
only the holder's DATA of the new generation refills them.  No packet moves a generation:
INVALIDATE from a writer is forwarded and counted, from anyone else dropped.
"""

from __future__ import annotations

import queue

from kvpool import contract as n
from kvpool import wire
from kvpool.contract import DropReason as Drop
from kvpool.contract import PoolStat

from . import program
from .harness import Target
from .packets import data_frame, get_frame, host, kv_frame, served_frame, stripped_get, with_ttl
from .program import HOLDER

KEY = 0x5EED
BASE = 100
OLD = program.chunk_bytes(2000, seed=1)
NEW = program.chunk_bytes(2000, seed=2)


def _fill(target: Target, chunk: bytes, generation: int, *, flags: int = 0) -> None:
    for i in range(wire.fragment_count(len(chunk))):
        frame = data_frame(HOLDER, host(1), KEY, i, chunk, generation=generation, flags=flags)
        target.send(HOLDER.port, frame)
        target.expect(1, with_ttl(frame, 63))


def _invalidate(src: int, generation: int) -> bytes:
    return kv_frame(host(src), host(1), wire.invalidate_packet(KEY, generation))


def _get(target: Target, frag: int = 0, generation: int = 0) -> bytes:
    """Host 2 asks (with reply room); returns what the holder gets if the switch does not answer."""
    target.send(2, get_frame(host(2), HOLDER, KEY, frag, request_id=frag + 1, generation=generation, room=True))
    return stripped_get(host(2), HOLDER, KEY, frag, request_id=frag + 1, generation=generation)


def _setup(target: Target, generation: int = 1) -> int:
    program.routes(target.sw)
    program.guard(target.sw)
    program.writer(target.sw, HOLDER)
    target.sw.configure_digest(n.FILL_MISMATCH)
    return program.admit(target.sw, KEY, BASE, len(OLD), generation=generation)


def _mismatches(target: Target) -> list[dict[str, int]]:
    items: list[dict[str, int]] = []
    try:
        while True:
            items.extend(target.sw.digests.get(timeout=0.5).items)
    except queue.Empty:
        return items


def test_a_republish_moves_the_chunk_to_a_new_placement_and_old_bytes_are_never_served(target: Target) -> None:
    _setup(target, generation=1)
    _fill(target, OLD, 1)
    _get(target)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, OLD, request_id=1, generation=1))

    # The controller re-places the chunk at generation 2 (same base slot, new placement).
    program.replace(target.sw, KEY, BASE, len(NEW), generation=2)
    for frag in (0, 1):  # nothing stale is served: both fragments go to the holder
        target.expect(HOLDER.port, _get(target, frag))
    _fill(target, OLD, 1)  # a late DATA of the old generation is not stored, only reported
    assert target.counter(n.POOL_STATS, PoolStat.FILL_MISMATCH) == 2
    target.expect(HOLDER.port, _get(target))

    _fill(target, NEW, 2)
    for frag in (0, 1):
        _get(target, frag)
        target.expect(2, served_frame(host(2), HOLDER, KEY, frag, NEW, request_id=frag + 1, generation=2))
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.MISS_UNFILLED) == 3
    # One report per change: the same stale DATA twice is one digest.
    assert _mismatches(target) == [{"chunk_key": KEY, "generation": 1, "frag_count": 2, "chunk_len": 2000}]


def test_the_same_generation_republished_under_a_new_placement_is_refilled_not_served_stale(target: Target) -> None:
    _setup(target, generation=3)
    _fill(target, OLD, 3)
    # The same generation number with new bytes (a holder that restarted without a directory):
    # the controller still installs a new placement, so the old slots are dead.
    program.replace(target.sw, KEY, BASE, len(NEW), generation=3)
    target.expect(HOLDER.port, _get(target, 0))
    _fill(target, NEW, 3)
    _get(target, 1)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 1, NEW, request_id=2, generation=3))
    target.expect_no_other_packets()


def test_newer_writer_data_is_forwarded_reported_and_not_stored(target: Target) -> None:
    _setup(target, generation=1)
    _fill(target, OLD, 1)
    frame = data_frame(HOLDER, host(1), KEY, 0, NEW, generation=4)
    target.send(HOLDER.port, frame)
    target.expect(1, with_ttl(frame, 63))  # neither dropped nor stored
    _get(target, 0)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, OLD, request_id=1, generation=1))
    target.expect_no_other_packets()
    assert _mismatches(target) == [{"chunk_key": KEY, "generation": 4, "frag_count": 2, "chunk_len": 2000}]
    assert target.counter(n.POOL_STATS, PoolStat.MISMATCH_REPORTED) == 1


def test_invalidate_from_a_writer_is_forwarded_and_changes_nothing(target: Target) -> None:
    _setup(target, generation=1)
    _fill(target, OLD, 1)
    for generation in (2, 0xFFFFFFFF, 0):
        inv = _invalidate(HOLDER.port, generation)
        target.send(HOLDER.port, inv)
        target.expect(1, with_ttl(inv, 63))  # holders and agents see it
    assert target.counter(n.POOL_STATS, PoolStat.INVALIDATE) == 3
    for frag in (0, 1):  # the chunk is served as before: no packet froze or disabled it
        _get(target, frag)
        target.expect(2, served_frame(host(2), HOLDER, KEY, frag, OLD, request_id=frag + 1, generation=1))
    target.expect_no_other_packets()


def test_invalidate_from_non_writer_is_dropped_and_changes_nothing(target: Target) -> None:
    _setup(target, generation=1)
    _fill(target, OLD, 1)
    target.send(4, _invalidate(4, 9))
    target.send(4, _invalidate(4, 0xFFFFFFFF))
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {Drop.NOT_WRITER: 2}
    _get(target)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, OLD, request_id=1, generation=1))
    target.expect_no_other_packets()


def test_a_get_pinned_to_another_generation_goes_to_the_holder(target: Target) -> None:
    _setup(target, generation=5)
    _fill(target, OLD, 5)
    target.expect(HOLDER.port, _get(target, 0, generation=4))
    _get(target, 0, generation=5)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, OLD, request_id=1, generation=5))
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.BYPASS) == 1
