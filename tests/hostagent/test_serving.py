"""The holder's answer policy on its own: runs of GETs, and where a joiner's re-ask rides."""

from __future__ import annotations

import os
import socket
import time

from hostagent.hints import FabricHints
from hostagent.holder import Holder
from hostagent.send_queue import SendQueue
from hostagent.serving import Server, merge_gets
from hostagent.transport_config import Counters, TransportConfig
from kvpool import wire
from kvpool.hints import GetPath, Hint, Hints
from tests.hostagent.transport_kit import _store


def _server(chunks: dict[int, bytes]) -> tuple[Server, SendQueue]:
    """A paced holder's ``Server`` where the switches merge, and its queue (nothing is sent)."""
    fabric = FabricHints()
    fabric.update(Hints({}, 60.0, True))
    cfg = TransportConfig(port=0, rate_bytes_per_s=300e3)
    c = Counters()
    queue = SendQueue(cfg, c)
    return Server(cfg, c, queue, Holder(_store(chunks)), None, fabric), queue


def test_merge_gets_joins_adjacent_gets_of_one_request_and_kind() -> None:
    a, b = ("127.0.0.1", 1000), ("127.0.0.1", 2000)

    def g(idx: int, count: int = 1, rid: int = 1, key: int = 5) -> wire.Header:
        return wire.Header(wire.Opcode.GET, key, idx, count, rid)

    gets = [(g(0), a), (g(1), a), (g(2, 3), a), (g(5, 2), a), (g(7), a), (g(5), b), (g(6, rid=2), a),
            (g(7, rid=2), a), (g(9, rid=2), a), (g(10, key=6, rid=2), a)]
    merged = [(h.request_id, first, count, addr) for h, first, count, addr in merge_gets(gets, cap=100)]
    # Singles with singles, ranges with ranges: never a single into a range (a conversion
    # cancels a range's answers; a single's may be what a switch's pending slot waits for).
    assert merged == [(1, 0, 2, a), (1, 2, 5, a), (1, 7, 1, a), (1, 5, 1, b), (2, 6, 2, a), (2, 9, 1, a),
                      (2, 10, 1, a)]
    capped = [(first, count) for _, first, count, _ in merge_gets([(g(i), a) for i in range(10)], cap=4)]
    assert capped == [(0, 4), (4, 4), (8, 2)]


def test_re_asks_of_two_joiners_ride_the_answer_once() -> None:
    # Two requesters joined a's answer and ask for what they missed, 0..4 and 0..7, before any of
    # it went out: the holder queues 0..7 once inside a's answer, not 0..4 twice.
    chunks = {1: os.urandom(200 * wire.FRAG_PAYLOAD)}
    server, queue = _server(chunks)
    a, b, c = ("127.0.0.1", 5001), ("127.0.0.1", 5002), ("127.0.0.1", 5003)
    server.serve_get(wire.parse(wire.get_packet(1, 0, 200, request_id=1)), 0, 200, a)
    joiner = wire.Flag.RETRANSMIT | wire.Flag.COALESCED
    server.serve_get(wire.parse(wire.get_packet(1, 0, 5, request_id=2, flags=joiner)), 0, 5, b)
    server.serve_get(wire.parse(wire.get_packet(1, 0, 8, request_id=3, flags=joiner)), 0, 8, c)
    lane = queue.lanes.by_owner[(a, 1)]
    assert [(j.first, j.count, j.carried) for j in lane] == [(5, 3, True), (0, 5, True), (0, 200, False)]
    assert server._c.reasks_carried == 8


def test_a_joiners_re_ask_never_rides_another_joiners_re_ask() -> None:
    # The owner's answer has left the holder (it may still be crossing a busy switch): the first
    # joiner's re-ask is answered to it alone.  The second joiner's must not ride that answer:
    # a RETRANSMIT opens no slot at a switch, so its fragments would reach the first joiner only
    # and the second would wait its join patience for them.
    chunks = {1: os.urandom(200 * wire.FRAG_PAYLOAD)}
    server, queue = _server(chunks)
    b, c = ("127.0.0.1", 5002), ("127.0.0.1", 5003)
    joiner = wire.Flag.RETRANSMIT | wire.Flag.COALESCED
    server.serve_get(wire.parse(wire.get_packet(1, 0, 5, request_id=2, flags=joiner)), 0, 5, b)
    server.serve_get(wire.parse(wire.get_packet(1, 0, 8, request_id=3, flags=joiner)), 0, 8, c)
    assert [(j.first, j.count, j.carried) for j in queue.lanes.by_owner[(b, 2)]] == [(0, 5, False)]
    assert [(j.first, j.count, j.carried) for j in queue.lanes.by_owner[(c, 3)]] == [(0, 8, False)]
    assert server._c.reasks_carried == 0


def test_a_long_re_ask_rides_the_answer_only_once_a_second_joiner_re_asks() -> None:
    # A joiner that came alone mid-answer is answered alone: a copy for every waiter would be
    # fragments the others have.  A second joiner's long re-ask rides a's answer (what both miss
    # goes once, copied to both), and a short one always rides.
    chunks = {1: os.urandom(100 * wire.FRAG_PAYLOAD)}
    server, queue = _server(chunks)
    a, b, c, d = (("127.0.0.1", port) for port in (5001, 5002, 5003, 5004))
    server.serve_get(wire.parse(wire.get_packet(1, 0, 100, request_id=1)), 0, 100, a)
    joiner = wire.Flag.RETRANSMIT | wire.Flag.COALESCED
    server.serve_get(wire.parse(wire.get_packet(1, 0, 30, request_id=2, flags=joiner)), 0, 30, b)
    assert [(j.first, j.count, j.carried) for j in queue.lanes.by_owner[(b, 2)]] == [(0, 30, False)]
    assert server._c.reasks_carried == 0
    server.serve_get(wire.parse(wire.get_packet(1, 0, 35, request_id=3, flags=joiner)), 0, 35, c)
    assert (c, 3) not in queue.lanes.by_owner
    assert [(j.first, j.count, j.carried) for j in queue.lanes.by_owner[(a, 1)]] == [(0, 35, True), (0, 100, False)]
    server.serve_get(wire.parse(wire.get_packet(1, 0, 40, request_id=4, flags=joiner)), 0, 40, d)
    assert [(j.first, j.count, j.carried) for j in queue.lanes.by_owner[(a, 1)]] == [
        (35, 5, True), (0, 35, True), (0, 100, False)]
    assert server._c.reasks_carried == 40


def _gathering_server() -> tuple[Server, SendQueue]:
    """An unpaced holder's ``Server`` with a 50 ms gather where the switches merge and chunk 1 is hot (2 is not)."""
    chunks = {1: os.urandom(50 * wire.FRAG_PAYLOAD), 2: os.urandom(50 * wire.FRAG_PAYLOAD)}
    fabric = FabricHints()
    fabric.update(Hints({1: Hint(GetPath.SINGLE, len(chunks[1]))}, 60.0, True))
    cfg = TransportConfig(port=0, gather_s=0.05)
    c = Counters()
    queue = SendQueue(cfg, c)
    return Server(cfg, c, queue, Holder(_store(chunks)), None, fabric), queue


def test_the_head_of_a_hot_chunk_waits_its_gather_and_nothing_else_does() -> None:
    # Where the switches merge, the answer to a range GET for the head of a chunk the hints call
    # hot starts after the gather, so the other requesters of its wave join it at a switch before
    # its first fragment leaves; any other answer goes at once.
    server, queue = _gathering_server()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sink.bind(("127.0.0.1", 0))
        a = sink.getsockname()
        before = time.monotonic()
        server.serve_get(wire.parse(wire.get_packet(1, 0, 50, request_id=1)), 0, 50, a)
        server.serve_get(wire.parse(wire.get_packet(1, 10, 40, request_id=2)), 10, 40, a)  # not the head
        server.serve_get(wire.parse(wire.get_packet(2, 0, 50, request_id=3)), 0, 50, a)  # not hot
        again = wire.Flag.RETRANSMIT
        server.serve_get(wire.parse(wire.get_packet(1, 0, 50, request_id=4, flags=again)), 0, 50, a)
        gathering = {owner[1]: lane[0].not_before for owner, lane in queue.lanes.by_owner.items() if owner}
        assert gathering[1] >= before + 0.05 and gathering[2] == gathering[3] == gathering[4] == 0.0
        queue.sock = sock
        queue.send()  # the others go; the head of the hot chunk waits
        assert list(queue.lanes.by_owner) == [(a, 1)] and queue.lanes.by_owner[(a, 1)][0].pos == 0
        assert 1 <= queue.pace_wait_ms() <= 51  # the loop sleeps until the gather ends
        time.sleep(max(0.0, gathering[1] - time.monotonic()) + 0.002)
        queue.send()
        assert not queue.lanes  # the whole answer went once the gather ended


def test_a_busy_holder_gathers_nothing() -> None:
    # A holder with answers queued for longer than the gather sends a hot chunk's head in its
    # turn: its round already delays the answer, and a gather on top would delay every hot chunk.
    server, queue = _gathering_server()
    a = ("127.0.0.1", 5001)
    server.serve_get(wire.parse(wire.get_packet(2, 0, 50, request_id=1)), 0, 50, a)  # not hot: at once
    time.sleep(0.06)  # busy for longer than the gather
    server.serve_get(wire.parse(wire.get_packet(1, 0, 50, request_id=2)), 0, 50, a)
    assert queue.lanes.by_owner[(a, 2)][0].not_before <= time.monotonic()
