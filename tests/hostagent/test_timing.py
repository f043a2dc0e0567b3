"""Where a transfer's time went: ``FetchTiming`` per request, the holder's answer waits, through the agent's API."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np
import pytest

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from hostagent.holder import Holder
from hostagent.timing import (
    WAIT_EDGES_S,
    AnswerWaits,
    FetchTiming,
    bucket_quantile,
    bytes_by_path,
    merge,
    summarize,
    waits_between,
)
from hostagent.transport import Address, Transport, TransportConfig
from kvpool import wire
from kvpool.hints import Hints
from tests.hostagent.transport_kit import Send, _fake_holder, _fetch_through_proxy, _store, _through_proxy


def _phases_fit(t: FetchTiming) -> None:
    """The phases follow each other inside the total; the waits inside the phases after the queue."""
    assert min(t.queue_s, t.first_byte_s, t.stream_s) >= 0
    assert t.first_byte_s <= t.total_s and t.queue_s + t.first_byte_s + t.stream_s <= t.total_s + 1e-9
    assert t.busy_s <= t.total_s - t.queue_s + 1e-9 and t.rto_s <= t.total_s - t.queue_s + 1e-9


def test_a_clean_transfer_has_phases_and_no_waits() -> None:
    data = {k: os.urandom(100_000 + k) for k in range(1, 4)}
    cfg = TransportConfig(port=0, window_fragments=64, retransmit_timeout_s=5.0, give_up_s=30.0)
    with Transport(TransportConfig(port=0), Holder(_store(data))) as h, Transport(cfg) as r:
        results = r.fetch(list(data), h.address, timeout=30)
    for res in results:
        t = res.timing
        assert res.ok
        _phases_fit(t)
        assert t.fragments == wire.fragment_count(len(data[res.key])) and t.total_s > 0
        assert (t.busy, t.busy_s, t.retransmit_rounds, t.rto_s) == (0, 0.0, 0, 0.0)
        assert (t.coalesced, t.switch_served, t.duplicates, t.shared) == (0, 0, 0, False)
        assert t.as_json()["fragments"] == t.fragments and "t_submit" not in t.as_json()


def test_requests_past_max_active_requests_count_their_wait_as_queue() -> None:
    data = {k: os.urandom(50_000) for k in range(1, 4)}
    cfg = TransportConfig(port=0, max_active_requests=1, retransmit_timeout_s=5.0, give_up_s=30.0)
    with Transport(TransportConfig(port=0), Holder(_store(data))) as h, Transport(cfg) as r:
        first, second, third = (res.timing for res in r.fetch(list(data), h.address, timeout=30))
    # One transfer at a time: each one's first GET goes out only after the one before it ended.
    assert second.t_first_get >= first.t_submit + first.total_s
    assert third.t_first_get >= second.t_submit + second.total_s
    assert second.queue_s > 0 and third.queue_s > second.queue_s
    for t in (first, second, third):
        _phases_fit(t)


def test_busy_refusals_are_timed_from_the_nack_to_the_re_ask() -> None:
    data = {k: os.urandom(30_000) for k in range(1, 13)}  # 12 chunks of 22 fragments
    # A paced holder whose queue holds at most 64 fragments: most GETs are refused (as in test_transport).
    hcfg = TransportConfig(port=0, rate_bytes_per_s=2e6, burst_bytes=16 << 10, max_queue_s=0.01)
    rcfg = TransportConfig(port=0, window_fragments=32, retransmit_timeout_s=5.0, give_up_s=30.0)
    results, _proxy, r = _fetch_through_proxy(data, list(data), rcfg, holder_cfg=hcfg, hints=Hints({}, 60.0, False))
    assert all(res.ok for res in results)
    st = r.stats()
    refused = [res.timing for res in results if res.timing.busy]
    assert refused and sum(t.busy for t in refused) == st["busy_received"] > 0
    # Each refused request waited until the holder's hint (at least 1 ms) before it asked again.
    assert all(t.busy_s > 0 for t in refused)
    assert all(res.timing.busy_s == 0 for res in results if not res.timing.busy)
    for res in results:
        _phases_fit(res.timing)
        assert res.timing.retransmit_rounds == res.retransmit_rounds == 0 and res.timing.rto_s == 0


def test_a_lost_datagram_costs_a_retransmit_round_and_its_silence() -> None:
    payload = os.urandom(200_000)
    cfg = TransportConfig(port=0, window_fragments=64, retransmit_timeout_s=0.2, give_up_s=10.0)
    # The proxy numbers DATA datagrams from 1: drop the last one.  Nothing after it shows it lost,
    # so the retransmit timer finds it (a fragment an answer passed over is a gap re-ask instead).
    last = wire.fragment_count(len(payload))
    res, proxy, _r = _through_proxy({7: payload}, 7, cfg, drop=lambda i: i == last)
    t = res.timing
    assert res.ok and proxy.dropped == 1
    assert t.retransmit_rounds == res.retransmit_rounds >= 1
    # The re-ask waits out the timeout of silence (the timer never fires earlier).
    assert t.rto_s >= cfg.retransmit_timeout_s
    assert t.busy == 0 and t.fragments == wire.fragment_count(len(payload))
    _phases_fit(t)


def test_fragments_are_counted_by_the_flags_they_came_with() -> None:
    payload = os.urandom(20 * wire.FRAG_PAYLOAD)

    def flag(_n: int, pkt: bytes) -> bytes:
        hdr = wire.unpack_header(pkt)
        if hdr.opcode != wire.Opcode.DATA:
            return pkt
        extra = wire.Flag.COALESCED if hdr.frag_index < 3 else wire.Flag.SWITCH_SERVED if hdr.frag_index < 5 else 0
        return replace(hdr, flags=hdr.flags | extra).pack() + pkt[wire.HEADER_LEN:]

    cfg = TransportConfig(port=0, window_fragments=64, retransmit_timeout_s=5.0, give_up_s=30.0)
    res, _proxy, _r = _through_proxy({6: payload}, 6, cfg, mangle=flag)
    assert res.ok and bytes(res.data or b"") == payload
    assert (res.timing.fragments, res.timing.coalesced, res.timing.switch_served) == (20, 3, 2)


def test_duplicates_are_counted_per_request() -> None:
    payload = os.urandom(10 * wire.FRAG_PAYLOAD)
    holder = Holder(_store({9: payload}))

    def twice(get: wire.Header, addr: Address, send: Send) -> None:  # every DATA sent twice in a row
        out = holder.serve(get.chunk_key, get.frag_index, get.frag_count, request_id=get.request_id,
                           generation=get.generation)
        assert not isinstance(out, wire.Status)
        for rec in out:
            send(rec.tobytes(), addr)
            send(rec.tobytes(), addr)

    cfg = TransportConfig(port=0, window_fragments=64, retransmit_timeout_s=5.0, give_up_s=30.0)
    with _fake_holder(twice) as addr, Transport(cfg) as r:
        (res,) = r.fetch([9], addr, timeout=30)
    # The request ends with its last new fragment: the copies of the nine before it came first and count
    # (loopback keeps a socket's order), the last one's copy may come after the request ended.
    assert res.ok and res.timing.fragments == 10 and 9 <= res.timing.duplicates <= 10
    assert res.timing.duplicates <= r.stats()["duplicates"]


def test_a_call_that_takes_another_transfer_says_so() -> None:
    data = {5: os.urandom(40_000)}
    with Transport(TransportConfig(port=0), Holder(_store(data))) as h, Transport(TransportConfig(port=0)) as r:
        own, taken = r.fetch([5, 5], h.address, timeout=30)
    assert own.ok and taken.ok and not own.timing.shared and taken.timing.shared
    assert taken.timing.fragments == own.timing.fragments
    assert summarize([own.timing, taken.timing])["shared"] == 1


def test_a_holder_reports_how_long_its_answers_waited() -> None:
    data = {k: os.urandom(60_000) for k in range(1, 5)}
    with Transport(TransportConfig(port=0), Holder(_store(data))) as h, Transport(TransportConfig(port=0)) as r:
        assert all(res.ok for res in r.fetch(list(data), h.address, timeout=30))
        # The holder notes an answer's wait on its own thread once the send returns, which can
        # be after the requester has the whole chunk: wait for the notes, not for a time.
        deadline = time.monotonic() + 10
        while h.stats()["answer_wait"]["answers"] < len(data) and time.monotonic() < deadline:
            time.sleep(0.01)
        wait = h.stats()["answer_wait"]
        assert "answer_wait" in r.stats() and r.stats()["answer_wait"]["answers"] == 0  # it answered nothing
    # One answer per GET run it served (one range GET per chunk here), none of them held.
    assert wait["answers"] >= len(data) and sum(wait["buckets"]) == wait["answers"]
    assert wait["held"] == 0 and wait["hold_sum_s"] == 0
    assert 0 <= wait["queue_p50_s"] <= wait["queue_p99_s"] <= wait["queue_max_s"]


def test_answer_waits_keep_holds_apart_and_subtract() -> None:
    w = AnswerWaits()
    before = w.summary()
    w.add(0.3, 0.1)  # held 0.1 s of its 0.3 s
    w.add(0.002)
    w.add(0.5, 0.9)  # a hold longer than the wait is the whole wait
    s = w.summary()
    assert s["answers"] == 3 and s["held"] == 2
    assert s["hold_sum_s"] == pytest.approx(0.6) and s["queue_sum_s"] == pytest.approx(0.202)
    assert s["queue_max_s"] == pytest.approx(0.2) and s["queue_p99_s"] == pytest.approx(0.2)
    # p50: the bucket edge at or above the median (0.002 s and 0.0 s and 0.2 s: 0.002), within a quarter-octave.
    assert 0.002 <= s["queue_p50_s"] <= 0.002 * 2 ** 0.25
    diff = waits_between(before, s)
    assert diff["answers"] == 3 and diff["held"] == 2 and diff["buckets"] == s["buckets"]
    w.add(0.01)
    later = waits_between(s, w.summary())
    assert later["answers"] == 1 and later["held"] == 0 and later["queue_sum_s"] == pytest.approx(0.01)
    assert waits_between(None, s)["answers"] == 3
    assert bucket_quantile([0] * (len(WAIT_EDGES_S) + 1), 50) == 0.0


def test_summaries_add_up_over_holders() -> None:
    a, b = FetchTiming(total_s=1.0, queue_s=0.5, fragments=4, busy=1), FetchTiming(total_s=2.0, fragments=6)
    one, two = summarize([a]), summarize([b, b])
    assert one["chunks"] == 1 and one["slowest_s"] == 1.0 and two["fragments"] == 12
    both = merge(merge({}, one), two)
    assert both["chunks"] == 3 and both["fragments"] == 16 and both["busy"] == 1
    assert both["total_s"] == pytest.approx(5.0) and both["slowest_s"] == 2.0 and both["queue_s"] == 0.5


def _agent() -> Agent:
    return Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))


def test_the_agent_api_answers_the_fetched_chunks_timing() -> None:
    a, b = _agent(), _agent()
    a.start()
    b.start()
    try:
        blobs = [os.urandom(20_000 + i) for i in range(3)]
        keys = [21, 22, 23]
        AgentClient(a.api_url).publish_chunks(keys, blobs)
        holder = f"127.0.0.1:{a.transport.port}"
        got, data, stopped, timing = AgentClient(b.api_url).fetch_chunks_timed(keys, holder, local=False)
        assert got == keys and data == blobs and stopped is None and timing is not None
        assert timing["chunks"] == 3 and timing["fragments"] == sum(wire.fragment_count(len(x)) for x in blobs)
        assert 0 < timing["slowest_s"] <= timing["total_s"] and timing["first_byte_s"] <= timing["total_s"]
        assert timing["busy"] == 0 and timing["shared"] == 0
        # The old call is unchanged (three values); /v1/prefetch's JSON has the same object as a field.
        assert AgentClient(b.api_url).fetch_chunks(keys, holder, local=False)[0] == keys
        summary = AgentClient(b.api_url).prefetch(keys[:2], holder)
        assert summary["found"] == 2 and summary["timing"]["chunks"] == 2
        # Held locally now: nothing is fetched, nothing timed.
        assert AgentClient(b.api_url).fetch_chunks_timed(keys[:2])[3] == summarize([])
        assert AgentClient(a.api_url).stats()["transport"]["answer_wait"]["answers"] >= 5
    finally:
        a.stop()
        b.stop()


def test_bytes_by_path_splits_a_chunk_by_how_its_fragments_came() -> None:
    p = wire.FRAG_PAYLOAD
    chunk_len = 3 * p + 10
    flags = np.array([0, wire.Flag.COALESCED, wire.Flag.SWITCH_SERVED, wire.Flag.SWITCH_SERVED], dtype=np.uint16)
    assert bytes_by_path(flags, chunk_len) == (p, p, p + 10)
    assert bytes_by_path(np.zeros(4, dtype=np.uint16), chunk_len) == (chunk_len, 0, 0)
