"""The transport end to end on loopback: windows, NACKs, ranges, loss, give-up, pacing, stop."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from hostagent.backend import BackendError, MemoryBackend
from hostagent.holder import Holder
from hostagent.tiers import BackendTier, HostTier, TieredStore
from hostagent.transport import Address, FetchResult, Transport, TransportConfig
from kvpool import wire
from tests.hostagent.transport_kit import LossyProxy, _fetch_through_proxy, _settled, _store, _through_proxy


@pytest.fixture
def chunks() -> dict[int, bytes]:
    # Sizes around fragment boundaries plus multi-window chunks; random content.
    sizes = [1, wire.FRAG_PAYLOAD, wire.FRAG_PAYLOAD + 1, 5000, 300_000, 1_000_000]
    return {0x1000 + i: os.urandom(n) for i, n in enumerate(sizes)}


@pytest.fixture
def pair(chunks: dict[int, bytes]) -> Iterator[tuple[Transport, Transport]]:
    holder = Transport(TransportConfig(port=0), Holder(_store(chunks)))
    # Loopback loses nothing; a long retransmit timeout keeps a descheduled holder from causing
    # spurious retransmits, so the exact counts below hold on a busy machine too.
    requester = Transport(TransportConfig(port=0, window_fragments=64, max_inflight_fragments=256,
                                          retransmit_timeout_s=5.0, give_up_s=30.0))
    with holder, requester:
        yield holder, requester


def test_fetch_is_bit_identical_with_windows(pair: tuple[Transport, Transport], chunks: dict[int, bytes]) -> None:
    holder, requester = pair
    results = requester.fetch(list(chunks), holder.address, timeout=30)
    assert [r.key for r in results] == list(chunks)
    for r in results:
        assert r.ok and r.error is None and bytes(r.data or b"") == chunks[r.key]
    st = requester.stats()
    frags = sum(wire.fragment_count(len(v)) for v in chunks.values())
    assert st["fragments_stored"] == frags and st["requests_completed"] == len(chunks)
    assert st["goodput_bytes"] == sum(len(v) for v in chunks.values())
    # A 1 MB chunk is 711 fragments: with 64-fragment windows it needs many GETs, each
    # no larger than a window, and the holder never sent more than was asked for.
    assert st["gets_sent"] >= 711 // 32
    hs = _settled(holder, frags)
    assert hs["datagrams_sent"] == frags and hs["holder"]["fragments_served"] == frags
    assert st["drops_total"] == 0 and hs["drops_total"] == 0


def test_intact_runs_take_the_run_path_into_recycled_buffers(pair: tuple[Transport, Transport],
                                                              chunks: dict[int, bytes],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clean path every run of DATA is stored by ``Reassembler.add_run`` (the hot path), none
    record by record, and a fetched chunk's buffer goes back to the pool once the caller drops it."""
    from hostagent.fragment import Reassembler

    holder, requester = pair

    def per_record(*_: object, **__: object) -> int:
        raise AssertionError("an intact run took add_batch")

    monkeypatch.setattr(Reassembler, "add_batch", per_record)
    for rep in range(2):
        results = requester.fetch(list(chunks), holder.address, timeout=30)
        assert all(bytes(r.data or b"") == chunks[r.key] for r in results)
        buffers = requester.stats()["buffers"]
        assert buffers["live"] == len(chunks)  # the results hold them
        del results
        buffers = requester.stats()["buffers"]
        assert buffers["live"] == 0 and buffers["free_bytes"] == buffers["mapped_bytes"]
        if rep:
            assert buffers["reused"] >= len(chunks)  # the second fetch landed in the first one's buffers


def test_unknown_chunk_nack_and_stale_generation(pair: tuple[Transport, Transport], chunks: dict[int, bytes]) -> None:
    holder, requester = pair
    key = next(iter(chunks))
    miss, stale, good = requester.fetch([0xDEAD, key, key], holder.address, timeout=10)
    assert miss.status == wire.Status.UNKNOWN_CHUNK and miss.error and "NACK UNKNOWN_CHUNK" in miss.error
    assert good.ok and stale.ok
    (stale,) = requester.fetch([key], holder.address, generation=7, timeout=10)
    assert stale.status == wire.Status.STALE_GENERATION
    assert requester.stats()["nacks_received"] == 2
    with pytest.raises(ValueError, match="generation"):
        requester.fetch([key], holder.address, generation=1 << 32)
    with pytest.raises(ValueError, match="64 bits"):
        requester.fetch([-1], holder.address)
    assert holder.stats()["holder"]["nacks"] == {"UNKNOWN_CHUNK": 1, "STALE_GENERATION": 1}


def _raw_exchange(addr: Address, pkt: bytes) -> wire.Header:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(pkt, addr)
        return wire.parse(s.recv(2048))


def test_bad_range_and_clamped_range(pair: tuple[Transport, Transport], chunks: dict[int, bytes]) -> None:
    holder, _ = pair
    key = 0x1000 + 3  # 5000 bytes: 4 fragments
    nack = _raw_exchange(holder.address, wire.get_packet(key, 4, 1, request_id=9))
    assert (nack.opcode, nack.status, nack.request_id) == (wire.Opcode.NACK, wire.Status.BAD_RANGE, 9)
    # A range that starts inside the chunk is clamped to its end: fragment 3 comes back.
    data = _raw_exchange(holder.address, wire.get_packet(key, 3, 100, request_id=10))
    assert (data.opcode, data.frag_index, data.frag_count, data.request_id) == (wire.Opcode.DATA, 3, 4, 10)


def test_holder_echoes_no_cache_in_data_and_the_asked_generation_in_nacks(
        pair: tuple[Transport, Transport], chunks: dict[int, bytes]) -> None:
    holder, _ = pair
    key = 0x1000 + 3
    data = _raw_exchange(holder.address, wire.get_packet(key, 1, 1, request_id=4, flags=wire.Flag.NO_CACHE))
    assert data.opcode == wire.Opcode.DATA and data.flags == wire.Flag.NO_CACHE
    plain = _raw_exchange(holder.address, wire.get_packet(key, 1, 1, request_id=5))
    assert plain.flags == 0 and plain.check == data.check
    nack = _raw_exchange(holder.address, wire.get_packet(key, 0, 1, request_id=6, generation=9))
    assert (nack.status, nack.generation, nack.request_id) == (wire.Status.STALE_GENERATION, 9, 6)


class _FailingBackend(MemoryBackend):
    def get(self, key: int) -> bytes | None:
        raise BackendError("store unreachable")


def test_store_error_nack() -> None:
    backend = _FailingBackend()
    store = TieredStore([HostTier(10), BackendTier(backend)])
    store.put(1, b"x" * 8)
    store.put(2, b"y" * 8)  # pushes chunk 1 down into the failing backend
    with Transport(TransportConfig(port=0), Holder(store)) as h, Transport(TransportConfig(port=0)) as r:
        (res,) = r.fetch([1], h.address, timeout=10)
    assert res.status == wire.Status.STORE_ERROR


def test_selective_retransmit_through_lossy_link() -> None:
    payload = os.urandom(400_000)  # 285 fragments
    cfg = TransportConfig(port=0, window_fragments=32, max_inflight_fragments=64, retransmit_timeout_s=0.05)
    # Besides every 17th datagram, the first copy of the last fragment: no later fragment shows
    # that loss as a gap, so the retransmit timer must find it (gap re-asks alone had recovered
    # everything in some runs, and the rounds asserted below depended on timing).
    last = wire.fragment_count(len(payload)) - 1
    lost_last: list[bytes] = []

    def first_copy_of_last(pkt: bytes) -> bool:
        if len(pkt) == wire.DATA_DATAGRAM_LEN and not lost_last and wire.parse(pkt).frag_index == last:
            lost_last.append(pkt)
            return True
        return False

    (res,), proxy, r = _fetch_through_proxy({7: payload}, [7], cfg, drop=lambda i: i % 17 == 3,
                                            drop_pkt=first_copy_of_last)
    assert lost_last
    assert res.ok and bytes(res.data or b"") == payload
    assert proxy.dropped > 0 and res.retransmit_rounds > 0
    st = r.stats()
    assert st["retransmit_gets"] > 0 and st["fragments_stored"] == wire.fragment_count(len(payload))
    retx = [g for g in proxy.gets if g.flags & wire.Flag.RETRANSMIT]
    # Selective: retransmit GETs ask for the missing runs, not the whole chunk again.
    assert retx and sum(g.frag_count for g in retx) < 3 * proxy.dropped
    # Windows: no GET ever asked for more than a window.
    assert max(g.frag_count for g in proxy.gets) <= 32


def test_gives_up_with_a_clear_error_when_holder_is_silent() -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))  # swallows GETs and never answers
    cfg = TransportConfig(port=0, retransmit_timeout_s=0.05, give_up_s=0.5)
    try:
        with Transport(cfg) as r:
            t0 = time.monotonic()
            (res,) = r.fetch([42], silent.getsockname(), timeout=30)
            elapsed = time.monotonic() - t0
            st = r.stats()
    finally:
        silent.close()
    assert not res.ok and res.error is not None
    assert "no progress for" in res.error and "0x000000000000002a" in res.error and "reachable" in res.error
    assert res.retransmit_rounds >= 2 and st["retransmit_gets"] >= 2 and st["requests_failed"] == 1
    assert elapsed >= 0.5  # it did wait for the configured silence before giving up


def test_overall_timeout() -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        with Transport(TransportConfig(port=0, give_up_s=30)) as r:
            (res,) = r.fetch([1], silent.getsockname(), timeout=0.3)
    finally:
        silent.close()
    assert res.error is not None and "timed out" in res.error


def test_pacing_limits_the_send_rate() -> None:
    payload = os.urandom(600_000)
    rate = 2_000_000.0  # bytes/s of datagrams
    burst = 64 << 10
    cfg = TransportConfig(port=0, rate_bytes_per_s=rate, burst_bytes=burst)
    with Transport(cfg, Holder(_store({5: payload}))) as h, Transport(TransportConfig(port=0)) as r:
        t0 = time.monotonic()
        got = r.fetch_one(5, h.address, timeout=30)
        elapsed = time.monotonic() - t0
    assert got == payload
    sent = wire.fragment_count(len(payload)) * wire.DATA_DATAGRAM_LEN
    # A token bucket can only be slower than its rate, never faster (minus the initial burst).
    assert elapsed >= (sent - burst) / rate * 0.95


def test_a_pacing_bucket_holds_at_least_a_wake_up_of_sending() -> None:
    # The loop sleeps whole milliseconds and wakes late: a bucket of two datagrams at 11.25 MB/s
    # (the demo's holders) let out two per wake-up, 2.9 MB/s.  It is deepened to 2 ms of sending.
    two = 2 * wire.DATA_DATAGRAM_LEN
    fast = TransportConfig(port=0, rate_bytes_per_s=11.25e6, burst_bytes=two)
    assert fast.pace_depth_bytes == pytest.approx(11.25e6 * 0.002) and fast.pace_depth_bytes > 15 * two / 2
    slow = TransportConfig(port=0, rate_bytes_per_s=1.125e6, burst_bytes=two)  # 10 Mbit/s: as asked
    assert slow.pace_depth_bytes == two
    assert TransportConfig(port=0, burst_bytes=two).pace_depth_bytes == two  # unpaced: irrelevant, unchanged


def test_a_backlogged_holder_makes_up_for_a_late_loop_but_an_idle_one_starts_shallow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Between sends the loop receives GETs and wakes late: replayed single GETs on a 2-core
    # machine brought a backlogged holder back 2-20 ms later, and with only the bucket's 2 ms of
    # sending it lost a tenth of its rate over a whole replay.  Here it comes back every 6 ms
    # with a full queue.  An idle holder still starts with the shallow bucket: a burst from idle
    # goes out before the loop has read the GETs that came with the one it answers.
    rate = 11.25e6
    cfg = TransportConfig(port=0, rate_bytes_per_s=rate, burst_bytes=2 * wire.DATA_DATAGRAM_LEN)
    t = Transport(cfg, Holder(_store({1: os.urandom(1000 * wire.FRAG_PAYLOAD)})))
    clock = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with contextlib.ExitStack() as stack:
        hsock, a = (stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) for _ in range(2))
        for s in (hsock, a):
            s.bind(("127.0.0.1", 0))
        t._queue.sock = hsock
        clock[0] += 1.0  # idle a second: the bucket is as full as it gets
        t._server.serve_get(wire.parse(wire.get_packet(1, 0, 1000, request_id=1)), 0, 1000, a.getsockname())
        t._queue.send()
        first = t._c.datagrams_sent
        assert first == int(cfg.pace_depth_bytes // wire.DATA_DATAGRAM_LEN)  # 15: 2 ms of sending
        for _ in range(10):
            clock[0] += 0.006
            t._queue.send()
    owed = rate * 0.060 / wire.DATA_DATAGRAM_LEN  # 466 datagrams in the 60 ms
    assert t._c.datagrams_sent - first >= 0.95 * owed  # with the bucket's 2 ms alone: 150
    assert t._c.datagrams_sent - first <= owed + 1  # and never faster than the rate


def test_many_requests_share_the_inflight_budget() -> None:
    data = {k: os.urandom(20_000 + k) for k in range(1, 41)}  # 40 chunks of 15 fragments
    cfg = TransportConfig(port=0, window_fragments=16, max_inflight_fragments=48, max_active_requests=8)
    with Transport(TransportConfig(port=0), Holder(_store(data))) as h, Transport(cfg) as r:
        results = r.fetch(list(data), h.address, timeout=30)
        assert r.stats()["requests_active"] == 0
    assert all(res.ok and bytes(res.data or b"") == data[res.key] for res in results)


def test_stop_fails_pending_fetches_and_closes_sockets() -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    r = Transport(TransportConfig(port=0, give_up_s=30))
    r.start()
    out: list[str | None] = []
    t = threading.Thread(target=lambda: out.append(r.fetch([3], silent.getsockname())[0].error))
    t.start()
    time.sleep(0.2)
    r.stop()
    t.join(5)
    silent.close()
    assert out and out[0] is not None and "transport stopped" in out[0]
    with pytest.raises(RuntimeError, match="not started"):
        _ = r.port


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="window_fragments"):
        TransportConfig(window_fragments=1)
    with pytest.raises(ValueError, match="servable_window_fragments"):
        TransportConfig(servable_window_fragments=1)
    with pytest.raises(ValueError, match="rate_bytes_per_s"):
        TransportConfig(rate_bytes_per_s=-1)


def test_busy_holder_nacks_and_requester_retries() -> None:
    data = {k: os.urandom(30_000) for k in range(1, 13)}  # 12 chunks of 22 fragments
    # Paced, so the queue cannot drain between the GETs however the threads are scheduled.
    hcfg = TransportConfig(port=0, max_queued_fragments=50, rate_bytes_per_s=2e6, burst_bytes=16 << 10)
    rcfg = TransportConfig(port=0, window_fragments=32, retransmit_timeout_s=0.02)
    with Transport(hcfg, Holder(_store(data))) as h, Transport(rcfg) as r:
        results = r.fetch(list(data), h.address, timeout=30)
        st = r.stats()
        # Re-asked ranges may still be leaving the paced holder: its queue accounting must drain to 0.
        deadline = time.monotonic() + 20
        while h.stats()["send_queue_fragments"] and time.monotonic() < deadline:
            time.sleep(0.01)
        hs = h.stats()
    assert all(res.ok and bytes(res.data or b"") == data[res.key] for res in results)
    # Twelve GETs arrive at once; the holder queues a few and refuses the rest with BUSY,
    # which the requester treats as "later", not as a failure.
    assert 0 < st["busy_received"] <= hs["nacks_sent"] and st["requests_failed"] == 0
    assert hs["send_queue_fragments"] == 0


def test_single_fragment_gets_mode_through_a_lossy_link() -> None:
    payload = os.urandom(200_000)  # 143 fragments
    cfg = TransportConfig(port=0, window_fragments=32, retransmit_timeout_s=0.05, single_fragment_gets=True)
    res, proxy, r = _through_proxy({9: payload}, 9, cfg, drop=lambda i: i % 13 == 5)
    assert res.ok and bytes(res.data or b"") == payload
    # Every GET asks for exactly one fragment (what a switch can serve or coalesce); the
    # first asks only for fragment 0, whose DATA tells the chunk's length.
    assert proxy.gets and all(g.frag_count == 1 for g in proxy.gets)
    assert proxy.gets[0].frag_index == 0 and proxy.gets[1].frag_index == 1
    plain = [g for g in proxy.gets if not g.flags & wire.Flag.RETRANSMIT]
    assert sorted(g.frag_index for g in plain) == list(range(143))
    assert proxy.dropped > 0 and r.stats()["retransmit_gets"] >= proxy.dropped


def test_a_single_get_overtaken_by_later_ones_is_re_asked_while_the_holder_streams() -> None:
    # The lost answer of fragment 3 of a small chunk, while the holder streams a big one to the
    # same requester: the retransmit timeout never fires (the holder is busy), and the small
    # chunk waited for the big one to end and a timeout more (3.7 s here before the rule).
    # Fragments asked after 3 arrive, so after half a retransmit timeout 3 is re-asked.
    small, big = os.urandom(50 * wire.FRAG_PAYLOAD), os.urandom(2000 * wire.FRAG_PAYLOAD)
    dropped: list[int] = []

    def drop_once(pkt: bytes) -> bool:
        if len(pkt) == wire.HEADER_LEN or dropped:
            return False
        hdr = wire.parse(pkt)
        if hdr.chunk_key == 1 and hdr.frag_index == 3:
            dropped.append(3)
            return True
        return False

    # The holder's queue is bounded at 0.3 s (and the requester knows it): re-asked after 0.5 s.
    cfg = TransportConfig(port=0, window_fragments=32, retransmit_timeout_s=1.0, single_fragment_gets=True,
                          max_queue_s=0.3)
    holder_cfg = TransportConfig(port=0, rate_bytes_per_s=1_000_000, max_queue_s=0.3)  # big chunk: about 3 s
    took: dict[int, float] = {}
    with Transport(holder_cfg, Holder(_store({1: small, 2: big}))) as h, Transport(cfg) as r:
        proxy = LossyProxy(h.address, drop=lambda i: False, drop_pkt=drop_once)
        try:
            def fetch(key: int) -> None:
                start = time.monotonic()
                res = r.fetch([key], proxy.address, timeout=30)[0]
                assert res.ok and bytes(res.data or b"") == (small if key == 1 else big)
                took[key] = time.monotonic() - start

            threads = [threading.Thread(target=fetch, args=(k,)) for k in (2, 1)]
            for t in threads:
                t.start()
                time.sleep(0.05)  # the big one streams first
            for t in threads:
                t.join()
        finally:
            proxy.close()
        st = r.stats()
    assert dropped == [3] and st["overtaken_retransmits"] == 1 and st["retransmit_gets"] == 1
    assert took[2] > 2.5  # the holder streamed all along
    assert took[1] < 1.5, took  # half a timeout after fragment 4 came, not after the big chunk


def test_an_overtaken_get_waits_out_the_holders_queue_bound_first() -> None:
    # The agent's default timeout is 0.2 s, but a holder may queue an answer for 1 s
    # (--max-queue) behind others' answers: an answer that late is not lost yet.
    from hostagent.fragment import Reassembler
    from hostagent.transport import _Request

    t = Transport(TransportConfig(port=0, retransmit_timeout_s=0.2, max_queue_s=1.0))
    sent: list[tuple[int, int, int]] = []
    t._transfers.send_get = lambda r, first, count, flags: sent.append((first, count, flags))  # type: ignore[method-assign]
    r = _Request(rid=1, key=7, holder=("127.0.0.1", 1), generation=0, result=FetchResult(7),
                 done=threading.Event(), deadline=1e9)
    r.reasm = Reassembler(7, 10 * wire.FRAG_PAYLOAD)
    r.asked_hi = 10
    r.asked_at = np.zeros(wire.MAX_FRAGMENTS)
    r.asked_at[:10] = 100.0 + np.arange(10) * 0.01  # fragment i asked at 100 + i/100
    r.reasm.received[5:] = True  # 5..9 came at 100.2; 0..4 did not
    r.answered_ask = float(r.asked_at[9])
    r.overtaken.append((100.2, r.answered_ask))
    t._transfers.resend_overtaken(r, 100.9)  # past half the timeout, within the queue bound
    assert sent == []
    t._transfers.resend_overtaken(r, 101.3)
    assert sent == [(0, 5, wire.Flag.RETRANSMIT)] and t.stats()["overtaken_retransmits"] == 5
    t._transfers.resend_overtaken(r, 102.0)  # nothing new arrived: nothing asked twice
    assert len(sent) == 1


def test_what_the_holders_answer_passed_over_is_re_asked_after_a_reorder_window() -> None:
    # The holder sends a request's answer in order: fragments 5..9 missing once 10..59 came were
    # lost on the way.  They are re-asked a quarter of a retransmit timeout later, not after the
    # timeout of silence (which a holder streaming to other requesters never gives).
    payload = os.urandom(60 * wire.FRAG_PAYLOAD)
    cfg = TransportConfig(port=0, window_fragments=64, retransmit_timeout_s=2.0, give_up_s=20.0)
    res, proxy, r = _through_proxy({3: payload}, 3, cfg, drop=lambda n: 6 <= n <= 10)
    assert res.ok and bytes(res.data or b"") == payload and proxy.dropped == 5
    st = r.stats()
    assert st["gap_retransmits"] == 5 and res.retransmit_rounds == 0
    (again,) = [g for g in proxy.gets if g.flags & wire.Flag.RETRANSMIT]
    assert (again.frag_index, again.frag_count) == (5, 5)
