"""Coherence: INVALIDATE moves a chunk's generation; stale bytes are never served again."""

from __future__ import annotations

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


def _fill(target: Target, chunk: bytes, generation: int) -> None:
    for i in range(wire.fragment_count(len(chunk))):
        frame = data_frame(HOLDER, host(1), KEY, i, chunk, generation=generation)
        target.send(HOLDER.port, frame)
        target.expect(1, with_ttl(frame, 63))


def _invalidate(src: int, generation: int) -> bytes:
    return kv_frame(host(src), host(1), wire.invalidate_packet(KEY, generation))


def _get(target: Target, frag: int = 0) -> bytes:
    """Host 2 asks (with reply room); returns what the holder gets if the switch does not answer."""
    target.send(2, get_frame(host(2), HOLDER, KEY, frag, request_id=frag + 1, room=True))
    return stripped_get(host(2), HOLDER, KEY, frag, request_id=frag + 1)


def _setup(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(OLD))


def test_invalidate_then_refill_with_new_generation(target: Target) -> None:
    _setup(target)
    _fill(target, OLD, 0)
    _get(target)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, OLD, request_id=1))

    inv = _invalidate(HOLDER.port, 1)
    target.send(HOLDER.port, inv)
    target.expect(1, with_ttl(inv, 63))  # holders and agents see the INVALIDATE too
    assert target.counter(n.POOL_STATS, PoolStat.INVALIDATE) == 1

    for frag in (0, 1):  # nothing stale is served: both fragments go to the holder
        get = _get(target, frag)
        target.expect(HOLDER.port, get)
    _fill(target, OLD, 0)  # a late DATA of the old generation is not stored
    assert target.counter(n.POOL_STATS, PoolStat.FILL_STALE) == 2
    get = _get(target)
    target.expect(HOLDER.port, get)

    _fill(target, NEW, 1)
    for frag in (0, 1):
        _get(target, frag)
        target.expect(2, served_frame(host(2), HOLDER, KEY, frag, NEW, request_id=frag + 1, generation=1))
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.MISS_UNFILLED) == 3


def test_newer_data_advances_the_generation_like_an_invalidate(target: Target) -> None:
    _setup(target)
    _fill(target, OLD, 0)
    frame = data_frame(HOLDER, host(1), KEY, 0, NEW, generation=4)
    target.send(HOLDER.port, frame)
    target.expect(1, with_ttl(frame, 63))
    _get(target, 0)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, NEW, request_id=1, generation=4))
    get = _get(target, 1)  # fragment 1 still holds generation 0: not served
    target.expect(HOLDER.port, get)
    target.expect_no_other_packets()


def test_invalidate_from_non_writer_is_dropped_and_changes_nothing(target: Target) -> None:
    _setup(target)
    _fill(target, OLD, 0)
    target.send(4, _invalidate(4, 9))
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {Drop.NOT_WRITER: 1}
    _get(target)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, OLD, request_id=1))
    target.expect_no_other_packets()


def test_invalidate_not_newer_is_stale(target: Target) -> None:
    _setup(target)
    target.send(HOLDER.port, _invalidate(HOLDER.port, 2))
    target.send(HOLDER.port, _invalidate(HOLDER.port, 2))
    target.send(HOLDER.port, _invalidate(HOLDER.port, 1))
    for generation in (2, 2, 1):
        target.expect(1, with_ttl(_invalidate(HOLDER.port, generation), 63))
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.INVALIDATE) == 1
    assert target.counter(n.POOL_STATS, PoolStat.INVALIDATE_STALE) == 2
