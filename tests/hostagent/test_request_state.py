"""The requester's bookkeeping on its own: the shared in-flight budget and the transfers in flight."""

from __future__ import annotations

import threading

from hostagent.fragment import Reassembler
from hostagent.request_state import Budget, Flights, Request
from hostagent.transport_config import FetchResult
from kvpool import wire


def _request(rid: int = 1, key: int = 7) -> Request:
    return Request(rid, key, ("127.0.0.1", 1), 0, FetchResult(key), threading.Event(), deadline=1e9)


def test_free_requests_stay_outside_the_budgets_room() -> None:
    b = Budget(100)
    counted, free = _request(1), _request(2)
    free.free = True
    b.account(counted, 30)
    b.account(free, 50)
    assert (b.inflight, b.free_inflight, b.counted(), b.room()) == (80, 50, 30, 70)
    b.account(free, -50)
    assert b.room() == 70 and b.free_inflight == 0


def test_a_request_that_turns_free_takes_what_it_has_in_flight_out_of_the_budget() -> None:
    b = Budget(100)
    r = _request()
    r.asked_hi = 40
    b.account(r, 40)
    r.reasm = Reassembler(r.key, 64 * wire.FRAG_PAYLOAD, 0)  # nothing received yet: all 40 in flight
    b.free(r)
    b.free(r)  # once only
    assert r.free and b.room() == 100 and b.inflight == 40
    b.account(r, -40)  # its fragments arrive
    assert (b.inflight, b.free_inflight) == (0, 0)


def test_a_flight_lands_only_for_the_request_it_names_and_only_when_shared() -> None:
    f = Flights(enabled=True)
    first, second = _request(1), _request(2)
    f.by_key[(7, first.holder, 0)] = second  # a later transfer of the same chunk took the slot
    f.land(first)
    assert f.by_key == {(7, first.holder, 0): second}
    f.land(second)
    assert f.by_key == {}
    off = Flights(enabled=False)
    off.by_key[(7, first.holder, 0)] = first
    off.land(first)  # sharing off: nothing is registered by fetch, nothing is removed
    assert len(off.by_key) == 1
