"""Pool lookup, fill on pass and hits served from switch memory."""

from __future__ import annotations

import pytest

from kvpool import contract as n
from kvpool import wire
from kvpool.contract import PoolStat
from kvpool.wire import FRAG_PAYLOAD

from . import program
from .harness import ModelTarget, Target
from .packets import data_frame, get_frame, host, served_frame, stripped_get, with_ttl
from .program import HOLDER

KEY = 0x1122334455667788
BASE = 40
CHUNK = program.chunk_bytes(2 * FRAG_PAYLOAD + 300)  # three fragments, the last one partial


def _fill(target: Target, chunk: bytes = CHUNK, to: int = 1, generation: int = 0) -> None:
    """The holder answers host ``to`` with every fragment; each passes the switch."""
    for i in range(wire.fragment_count(len(chunk))):
        frame = data_frame(HOLDER, host(to), KEY, i, chunk, generation=generation)
        target.send(HOLDER.port, frame)
        target.expect(to, with_ttl(frame, 63))


def test_fill_on_pass_then_hits_are_served_by_the_switch(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK))
    _fill(target)
    target.expect_no_other_packets()
    assert target.counters(n.SLOT_FILLS) == {BASE: 1, BASE + 1: 1, BASE + 2: 1}
    assert target.counter(n.POOL_STATS, PoolStat.FILL) == 3

    # Host 2 asks for each fragment: the switch answers, the holder sees nothing.
    for i in (2, 0, 1, 2):
        get = get_frame(host(2), HOLDER, KEY, i, request_id=100 + i, sport=41000 + i, ip_id=7 + i, room=True)
        target.send(2, get)
        target.expect(2, served_frame(host(2), HOLDER, KEY, i, CHUNK, request_id=100 + i, sport=41000 + i,
                                      ip_id=7 + i))
    target.expect_no_other_packets()
    assert target.counters(n.SLOT_HITS) == {BASE: 1, BASE + 1: 1, BASE + 2: 2}
    assert target.counter(n.POOL_STATS, PoolStat.HIT) == 4
    assert target.counters(n.DROP_REASON) == {}
    if isinstance(target, ModelTarget):  # each reply filled its GET's room: nothing grew
        assert target.pipeline.stats.beyond_bmv2_headroom == 0


def test_upstream_entry_passes_the_get_on_with_its_room_and_stores_nothing(target: Target) -> None:
    # The chunk lives on a switch nearer the holder: this one lets the GET keep its room
    # for it, and the holder's DATA passing on the way back is not written here.
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK), state=program.UPSTREAM)
    get = get_frame(host(2), HOLDER, KEY, 1, request_id=5, room=True)
    target.send(2, get)
    target.expect(HOLDER.port, with_ttl(get, 63))  # DATA-sized: the room is still there
    _fill(target)
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.UPSTREAM) == 1
    assert target.counters(n.SLOT_FILLS) == {}
    assert target.counters(n.SLOT_HITS) == {}
    # The switch above (here: the same switch, its entry now holding the bytes) answers it.
    program.replace(target.sw, KEY, BASE, len(CHUNK))
    _fill(target)
    target.send(4, get)
    target.expect(2, served_frame(host(2), HOLDER, KEY, 1, CHUNK, request_id=5))
    target.expect_no_other_packets()


def test_non_writer_data_is_forwarded_but_not_stored(target: Target) -> None:
    program.routes(target.sw)
    program.admit(target.sw, KEY, BASE, len(CHUNK))  # no writer on the ACL
    _fill(target)
    assert target.counter(n.POOL_STATS, PoolStat.FILL_UNAUTH) == 3
    assert target.counters(n.SLOT_FILLS) == {}
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, room=True))
    target.expect(HOLDER.port, stripped_get(host(2), HOLDER, KEY, 0))  # not in switch memory: the holder answers
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.MISS_UNFILLED) == 1


@pytest.mark.parametrize("why", ["range", "no_cache", "pinned_generation", "disabled", "beyond_chunk"])
def test_gets_the_switch_must_not_answer_go_to_the_holder(target: Target, why: str) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK), generation=3,
                  state=program.DISABLED if why == "disabled" else program.FILLING)
    _fill(target, generation=3)
    kwargs = {"range": {"count": 2}, "no_cache": {"flags": int(wire.Flag.NO_CACHE)},
              "pinned_generation": {"generation": 2}, "disabled": {}, "beyond_chunk": {}}[why]
    frag = 5 if why == "beyond_chunk" else 0
    target.send(2, get_frame(host(2), HOLDER, KEY, frag, room=True, **kwargs))
    target.expect(HOLDER.port, stripped_get(host(2), HOLDER, KEY, frag, **kwargs))  # room stripped
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.BYPASS) == 1
    assert target.counters(n.SLOT_HITS) == {}


def test_get_pinned_to_the_current_generation_is_served(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK), generation=3)
    _fill(target, generation=3)
    target.send(4, get_frame(host(4), HOLDER, KEY, 1, generation=3, request_id=9, room=True))
    target.expect(4, served_frame(host(4), HOLDER, KEY, 1, CHUNK, generation=3, request_id=9))
    target.expect_no_other_packets()


def test_valid_state_skips_rewriting_current_slots(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK), state=program.VALID)
    _fill(target)
    _fill(target)  # the same fragments pass again: already current, nothing written
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.FILL) == 3
    assert target.counter(n.POOL_STATS, PoolStat.FILL_SKIPPED) == 3


def test_writer_data_with_other_geometry_is_forwarded_not_stored(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK))
    other = program.chunk_bytes(len(CHUNK) + 5000)  # four fragments, not three
    for frag in (3, 0):
        frame = data_frame(HOLDER, host(1), KEY, frag, other)
        target.send(HOLDER.port, frame)
        target.expect(1, with_ttl(frame, 63))  # the holder's answer still reaches its requester
    target.expect_no_other_packets()
    assert target.counters(n.DROP_REASON) == {}
    assert target.counter(n.POOL_STATS, PoolStat.FILL_MISMATCH) == 2
    assert target.counters(n.SLOT_FILLS) == {}
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, room=True))  # nothing of it is served
    target.expect(HOLDER.port, stripped_get(host(2), HOLDER, KEY, 0))
    target.expect_no_other_packets()


def test_slot_beyond_pool_is_not_read_or_written(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, 1023, len(CHUNK))  # fragments 1 and 2 fall off the pool
    _fill(target)
    assert target.counters(n.SLOT_FILLS) == {1023: 1}
    assert target.counter(n.POOL_STATS, PoolStat.SLOT_RANGE) == 2
    target.send(2, get_frame(host(2), HOLDER, KEY, 2, room=True))
    target.expect(HOLDER.port, stripped_get(host(2), HOLDER, KEY, 2))
    target.send(2, get_frame(host(2), HOLDER, KEY, 0, room=True))
    target.expect(2, served_frame(host(2), HOLDER, KEY, 0, CHUNK))
    target.expect_no_other_packets()


def test_plain_get_without_reply_room_goes_to_the_holder_untouched(target: Target) -> None:
    program.routes(target.sw)
    program.writer(target.sw, HOLDER)
    program.admit(target.sw, KEY, BASE, len(CHUNK))
    _fill(target)
    plain = get_frame(host(2), HOLDER, KEY, 0)
    target.send(2, plain)
    target.expect(HOLDER.port, with_ttl(plain, 63))  # UDP checksum kept: nothing above IPv4 changed
    target.expect_no_other_packets()
    assert target.counter(n.POOL_STATS, PoolStat.NO_ROOM) == 1
    assert target.counters(n.SLOT_HITS) == {}
