"""Requests a switch joined to another's answer: what they re-ask and what rides that answer."""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import time
from typing import Any

import pytest

from hostagent.hints import FabricHints
from hostagent.holder import Holder
from hostagent.transport import Address, FetchResult, Transport, TransportConfig
from kvpool import wire
from kvpool.hints import Hints
from tests.hostagent.transport_kit import Send, _fake_holder, _store


def _joined_fetch(payload: bytes, joined_at: int, stop_at: int,
                  window: int = 64) -> tuple[FetchResult, list[wire.Header], dict[str, Any]]:
    """A fetch whose first GET a switch joined to another requester's answer at fragment ``joined_at``.

    The fake plays switch and holder: the first GET gets copies (``COALESCED``, as a switch
    rewrites them) of fragments ``joined_at .. stop_at - 1`` and nothing else; every later GET
    (a re-ask) is answered as a holder would, for exactly what it asks.  Once the fetch is done
    the requester counts nothing in flight, in the shared budget or out of it.
    """
    n = wire.fragment_count(len(payload))
    gets: list[wire.Header] = []

    def on_get(g: wire.Header, addr: Address, send: Send) -> None:
        gets.append(g)
        if len(gets) == 1:
            for i in range(joined_at, stop_at):
                send(wire.data_packet(9, i, payload, request_id=g.request_id, flags=wire.Flag.COALESCED), addr)
            return
        for i in range(g.frag_index, min(n, g.frag_index + g.frag_count)):
            send(wire.data_packet(9, i, payload, request_id=g.request_id), addr)

    cfg = TransportConfig(port=0, window_fragments=window, retransmit_timeout_s=0.5, max_queue_s=0.2,
                          give_up_s=30.0)
    with _fake_holder(on_get) as holder, Transport(cfg) as r:
        (res,) = r.fetch([9], holder, timeout=20)
        budget = r._transfers.budget
        assert (budget.inflight, budget.free_inflight) == (0, 0)
        return res, gets, r.stats()


def test_a_request_joined_late_asks_the_holder_only_for_what_passed_before_it_joined() -> None:
    payload = os.urandom(40 * wire.FRAG_PAYLOAD)
    res, gets, st = _joined_fetch(payload, joined_at=12, stop_at=40)
    assert res.ok and bytes(res.data or b"") == payload
    # One GET for its first window (joined at the switch), then one re-ask for fragments 0..11: no
    # window GET for the rest (the answer it joined brought it), no retransmit timeout waited.
    assert [(g.frag_index, g.frag_count, bool(g.flags & wire.Flag.RETRANSMIT)) for g in gets] == [
        (0, 64, False), (0, 12, True)]
    assert st["joined_requests"] == 1 and st["joined_fragments"] == 28 and st["join_reasks"] == 12
    assert res.retransmit_rounds == 0


def test_copies_past_what_a_joined_request_asked_for_leave_its_budget_whole() -> None:
    # Its first window asked for 16 fragments; the answer it joined brings 12..39.  Counted as
    # arrivals of what it asked for, they took the request's count in flight below zero and left
    # the shared budget short for good: a requester's later chunks waited for budget that never
    # came back (20 s without progress in a replay).
    payload = os.urandom(40 * wire.FRAG_PAYLOAD)
    res, gets, st = _joined_fetch(payload, joined_at=12, stop_at=40, window=16)
    assert res.ok and bytes(res.data or b"") == payload
    assert [(g.frag_index, g.frag_count) for g in gets] == [(0, 16), (0, 12)]
    assert st["join_reasks"] == 12 and res.retransmit_rounds == 0


def test_a_joined_request_whose_answer_stops_asks_the_holder_for_the_rest_itself() -> None:
    # The requester it joined stops asking (it failed, or waits for budget): after a
    # retransmit timeout of its own silence the joined request asks for the rest itself, rather
    # than the 4 timeouts a request waits while its holder streams to others.
    payload = os.urandom(40 * wire.FRAG_PAYLOAD)
    res, gets, st = _joined_fetch(payload, joined_at=0, stop_at=10)
    assert res.ok and bytes(res.data or b"") == payload
    assert [(g.frag_index, g.frag_count) for g in gets] == [(0, 64), (10, 30)]
    assert gets[1].flags & wire.Flag.RETRANSMIT
    assert st["joined_requests"] == 1 and st["join_reasks"] == 0 and res.retransmit_rounds == 1


@pytest.mark.parametrize("flags", [wire.Flag.RETRANSMIT | wire.Flag.COALESCED, wire.Flag.RETRANSMIT])
def test_a_joiners_re_ask_rides_the_answer_it_joined(flags: int) -> None:
    # Requester a's range GET opened the switch's pending slot for chunk 1; b joined it late and
    # asks for the 5 fragments that passed before (RETRANSMIT | COALESCED).  Where switches merge,
    # the holder sends them inside a's answer, to a and first in a's lane, so the switch copies
    # them to every requester that joined; any other re-ask is answered to its sender.
    chunks = {1: os.urandom(200 * wire.FRAG_PAYLOAD)}
    fabric = FabricHints()
    fabric.update(Hints({}, 60.0, True))
    hcfg = TransportConfig(port=0, rate_bytes_per_s=300e3, burst_bytes=4 << 10)
    with Transport(hcfg, Holder(_store(chunks)), hints=fabric) as h, contextlib.ExitStack() as stack:
        a, b = (stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) for _ in range(2))
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.settimeout(5)
        a.sendto(wire.get_packet(1, 0, 200, request_id=1), h.address)
        assert wire.parse(a.recvfrom(2048)[0]).frag_index == 0  # a's answer is sending
        b.sendto(wire.get_packet(1, 0, 5, request_id=2, flags=flags), h.address)
        if flags & wire.Flag.COALESCED:
            got = [wire.parse(a.recvfrom(2048)[0]) for _ in range(20)]
            seen = collections.Counter(g.frag_index for g in got)
            # 0..4 twice: once in a's own answer (its 0 read above), once carried, ahead of a's next turn.
            assert [seen[i] for i in range(5)] == [1, 2, 2, 2, 2] and {g.request_id for g in got} == {1}
            b.settimeout(0.3)
            with pytest.raises(TimeoutError):
                b.recvfrom(2048)
            assert h.stats()["reasks_carried"] == 5
        else:
            got = [wire.parse(b.recvfrom(2048)[0]) for _ in range(5)]
            assert [g.frag_index for g in got] == list(range(5)) and {g.request_id for g in got} == {2}
            assert h.stats()["reasks_carried"] == 0


def test_a_joiner_that_first_sees_another_joiners_re_ask_still_asks_for_what_it_missed() -> None:
    # The first copies a late joiner gets can be another joiner's re-ask riding the answer
    # (fragments 0..2), the answer's own (20..39) only after: what it lacks below the answer's
    # fragments (3..19) passed before it joined, and it asks for them then, not a timeout later.
    payload = os.urandom(40 * wire.FRAG_PAYLOAD)
    gets: list[wire.Header] = []

    def on_get(g: wire.Header, addr: Address, send: Send) -> None:
        gets.append(g)
        if len(gets) == 1:
            for i in (*range(3), *range(20, 40)):
                send(wire.data_packet(9, i, payload, request_id=g.request_id, flags=wire.Flag.COALESCED), addr)
                if i == 2:
                    time.sleep(0.05)  # the two parts in separate receive batches
            return
        for i in range(g.frag_index, min(40, g.frag_index + g.frag_count)):
            send(wire.data_packet(9, i, payload, request_id=g.request_id), addr)

    cfg = TransportConfig(port=0, window_fragments=64, retransmit_timeout_s=5.0, give_up_s=30.0)
    with _fake_holder(on_get) as holder, Transport(cfg) as r:
        (res,) = r.fetch([9], holder, timeout=20)
        assert res.ok and bytes(res.data or b"") == payload
        budget = r._transfers.budget
        assert res.retransmit_rounds == 0 and (budget.inflight, budget.free_inflight) == (0, 0)
    assert [(g.frag_index, g.frag_count) for g in gets] == [(0, 64), (3, 17)]
