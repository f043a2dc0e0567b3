"""The transport's integrity checks: damaged fragments caught and asked again; the holder's records built once."""

from __future__ import annotations

import os
import threading

import pytest

from hostagent.holder import Holder
from hostagent.transport import FetchResult, Transport, TransportConfig
from kvpool import wire
from tests.hostagent.transport_kit import _blob, _store, _through_proxy


def _flip_payload_bit(pkt: bytes, bit: int = 77) -> bytes:
    """``pkt`` with one bit of its valid payload flipped (its header and check untouched)."""
    out = bytearray(pkt)
    out[wire.HEADER_LEN + bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(out)


def _set_flags(pkt: bytes, flags: int) -> bytes:
    out = bytearray(pkt)
    off = wire.FIELD_BY_NAME["flags"].offset
    out[off : off + 2] = flags.to_bytes(2, "big")
    return bytes(out)


@pytest.mark.parametrize("kind", ["serialized", "raw"])
def test_corrupted_fragments_are_caught_dropped_and_asked_again(kind: str) -> None:
    payload = _blob(400_000) if kind == "serialized" else os.urandom(400_000)
    frags = wire.fragment_count(len(payload))
    # Nothing is lost: a long retransmit timeout keeps a slow machine from re-asking twice.
    cfg = TransportConfig(port=0, window_fragments=32, max_inflight_fragments=64, retransmit_timeout_s=2.0)
    bad = {n for n in range(1, frags + 1) if n % 23 == 4}  # first pass only: the re-asked copies arrive intact
    res, proxy, r = _through_proxy({7: payload}, 7, cfg,
                                   mangle=lambda n, pkt: _flip_payload_bit(pkt) if n in bad else pkt)
    assert res.ok and bytes(res.data or b"") == payload
    st = r.stats()
    assert st["integrity"]["fragments_check_failed"] == len(bad) == st["drops"]["bad_check"]
    assert st["integrity"]["switch_fragments_check_failed"] == 0 and st["integrity"]["chunks_verified"] == 1
    # Exactly the failed fragments were asked for again; the holder's copies needed no NO_CACHE.
    again = [g for g in proxy.gets if g.flags & wire.Flag.RETRANSMIT]
    assert sum(g.frag_count for g in again) == len(bad)
    assert not any(g.flags & wire.Flag.NO_CACHE for g in proxy.gets)


def test_a_switch_served_fragment_that_fails_is_asked_for_with_no_cache() -> None:
    payload = _blob(100_000)
    cfg = TransportConfig(port=0, retransmit_timeout_s=2.0)
    res, proxy, r = _through_proxy(
        {5: payload}, 5, cfg,
        mangle=lambda n, pkt: _flip_payload_bit(_set_flags(pkt, wire.Flag.SWITCH_SERVED)) if n == 3 else pkt)
    assert res.ok and bytes(res.data or b"") == payload
    assert r.stats()["integrity"]["switch_fragments_check_failed"] == 1
    (again,) = [g for g in proxy.gets if g.flags & wire.Flag.RETRANSMIT]
    assert again.flags & wire.Flag.NO_CACHE and (again.frag_index, again.frag_count) == (2, 1)


def test_a_fragment_corrupted_on_every_try_fails_the_fetch_with_a_clear_error() -> None:
    payload = os.urandom(50_000)
    cfg = TransportConfig(port=0, retransmit_timeout_s=2.0, integrity_retries=2)

    def always_fragment_4(_n: int, pkt: bytes) -> bytes:
        return _flip_payload_bit(pkt, 5) if wire.unpack_header(pkt).frag_index == 4 else pkt

    res, proxy, r = _through_proxy({9: payload}, 9, cfg, mangle=always_fragment_4)
    assert not res.ok and res.data is None and res.integrity
    assert res.error is not None and "chunk 0x0000000000000009" in res.error
    assert "content check failed 3 times" in res.error and "fragment 4" in res.error
    st = r.stats()
    assert st["integrity"]["fragments_check_failed"] == 3 and st["integrity"]["integrity_failures"] == 1
    assert st["requests_failed"] == 1 and st["requests_completed"] == 0
    # First re-ask plain (the holder sent it), the next ones with NO_CACHE.
    again = [g for g in proxy.gets if g.flags & wire.Flag.RETRANSMIT]
    assert [bool(g.flags & wire.Flag.NO_CACHE) for g in again] == [False, True]


def test_a_damaged_holder_copy_is_fetched_again_then_refused() -> None:
    blob = bytearray(_blob(30_000))
    blob[-100] ^= 0x01  # the holder's copy rotted: its fragment checks are computed over the damage
    cfg = TransportConfig(port=0, retransmit_timeout_s=2.0, integrity_retries=2)
    res, proxy, r = _through_proxy({3: bytes(blob)}, 3, cfg)
    assert not res.ok and res.integrity and res.error is not None
    assert "every fragment passed its check but the chunk failed its own checksum" in res.error
    st = r.stats()["integrity"]
    assert st["chunks_check_failed"] == 3 and st["fragments_check_failed"] == 0
    # Each retry asks for the whole chunk again, from the holder.
    firsts = [g for g in proxy.gets if g.frag_index == 0]
    assert len(firsts) == 3 and [bool(g.flags & wire.Flag.NO_CACHE) for g in firsts] == [False, True, True]


def test_holder_computes_checks_once_per_content_and_generation() -> None:
    blob = _blob(20_000)
    store = _store({1: blob})
    holder = Holder(store)
    first = holder.serve(1, 0, 100)
    assert not isinstance(first, wire.Status)
    again = holder.serve(1, 2, 3)
    assert not isinstance(again, wire.Status)
    assert holder.checks_computed == 1
    for rec in first:  # each record is what wire.data_packet sends, check included
        raw = rec.tobytes()
        assert raw == wire.data_packet(1, int(rec["hdr"]["frag_index"]), blob)
    store.put(1, blob, generation=4)  # same bytes, new generation: new checks
    assert not isinstance(holder.serve(1, 0, 1), wire.Status) and holder.checks_computed == 2
    store.put(1, _blob(20_000, seed=1), generation=4)  # new bytes, same generation and size
    out = holder.serve(1, 0, 1)
    assert not isinstance(out, wire.Status) and holder.checks_computed == 3
    raw_store = _store({2: os.urandom(5000)})
    raw_holder = Holder(raw_store)
    raw_holder.serve(2, 0, 4)
    raw_holder.serve(2, 1, 1)
    assert raw_holder.checks_computed == 1


def _answer(holder: Holder, key: int, first: int, count: int, request_id: int) -> list[bytes]:
    out = holder.serve(key, first, count, request_id=request_id)
    assert not isinstance(out, wire.Status)
    return [rec.tobytes() for rec in out]


def test_holder_answers_from_records_it_builds_once_per_content_and_generation() -> None:
    blob = _blob(20_000)
    store = _store({1: blob})
    holder = Holder(store)
    n = wire.fragment_count(len(blob))
    assert _answer(holder, 1, 0, 100, 7) == [wire.data_packet(1, i, blob, request_id=7) for i in range(n)]
    # Another answer of the same chunk: the kept records, with its own request id and flags.
    out = holder.serve(1, 3, 4, request_id=9, flags=wire.Flag.NO_CACHE)
    assert not isinstance(out, wire.Status)
    assert [rec.tobytes() for rec in out] == [
        wire.data_packet(1, i, blob, request_id=9, flags=wire.Flag.NO_CACHE) for i in range(3, 7)]
    assert holder.records_built == 1 and holder.stats()["records_kept_bytes"] == n * wire.DATA_DATAGRAM_LEN
    new_bytes = _blob(20_000, seed=1)
    store.put(1, new_bytes, generation=0)  # new bytes, same size and generation: built again
    assert _answer(holder, 1, 0, n, 1) == [wire.data_packet(1, i, new_bytes, request_id=1) for i in range(n)]
    store.put(1, new_bytes, generation=5)  # new generation: built again
    assert _answer(holder, 1, 0, 1, 2) == [wire.data_packet(1, 0, new_bytes, request_id=2, generation=5)]
    assert holder.records_built == 3


def test_holder_keeps_records_within_its_budget() -> None:
    a, b = _blob(20_000), _blob(20_000, seed=1)
    one_chunk = wire.fragment_count(len(a)) * wire.DATA_DATAGRAM_LEN
    holder = Holder(_store({1: a, 2: b}), record_cache_bytes=one_chunk)
    for key, blob in ((1, a), (2, b), (1, a)):  # the second chunk pushes the first out
        assert _answer(holder, key, 0, 2, 3) == [wire.data_packet(key, i, blob, request_id=3) for i in range(2)]
    assert holder.records_built == 3 and holder.stats()["records_kept_bytes"] == one_chunk
    unkept = Holder(_store({1: a}), record_cache_bytes=one_chunk - 1)  # over budget: built per answer
    assert _answer(unkept, 1, 0, 2, 4) == [wire.data_packet(1, i, a, request_id=4) for i in range(2)]
    assert unkept.records_built == 0 and unkept.stats()["records_kept_bytes"] == 0


def test_interleaved_answers_of_one_chunk_each_carry_their_own_request_id() -> None:
    # Two requesters fetch one chunk at once: the holder sends both answers from the same
    # kept records, a few datagrams of each in turn.  A datagram sent with the other
    # answer's request id would be dropped by its receiver and asked for again.
    blob = _blob(1_000_000)
    hcfg = TransportConfig(port=0, send_quantum=4)
    rcfg = TransportConfig(port=0, window_fragments=1024, max_inflight_fragments=1024,
                           retransmit_timeout_s=5.0, give_up_s=30.0)
    holder = Holder(_store({1: blob}))
    with Transport(hcfg, holder) as h, Transport(rcfg) as r1, Transport(rcfg) as r2:
        results: list[list[FetchResult]] = []
        threads = [threading.Thread(target=lambda r=r: results.append(r.fetch([1], h.address, timeout=30)))
                   for r in (r1, r2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [None if res[0].data is None else bytes(res[0].data) for res in results] == [blob, blob]
        assert holder.records_built == 1
        for r in (r1, r2):
            st = r.stats()
            assert st["retransmit_gets"] == 0 and not st["drops"], st
