"""Push back: BUSY and its retry hint, the holder's bounded queue, requesters' budgets."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hostagent.gate import RequesterGate
from hostagent.hints import FabricHints
from hostagent.holder import Holder
from hostagent.transport import Address, DrainMeter, FetchResult, Transport, TransportConfig
from kvpool import wire
from kvpool.hints import GetPath, Hint, Hints
from tests.hostagent.transport_kit import (
    Send,
    _fake_holder,
    _fetch_through_proxy,
    _sender_of_due,
    _store,
    _until_sending,
)


@pytest.mark.parametrize("merge", [False, True])
def test_busy_carries_a_retry_hint_and_the_requester_waits_it_out(merge: bool) -> None:
    data = {k: os.urandom(30_000) for k in range(1, 13)}  # 12 chunks of 22 fragments
    # A paced holder whose queue holds at most 64 fragments (0.01 s of sending): most GETs are refused.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=2e6, burst_bytes=16 << 10, max_queue_s=0.01)
    rcfg = TransportConfig(port=0, window_fragments=32, retransmit_timeout_s=5.0, give_up_s=30.0)
    results, proxy, r = _fetch_through_proxy(data, list(data), rcfg, holder_cfg=hcfg, hints=Hints({}, 60.0, merge))
    assert all(res.ok and bytes(res.data or b"") == data[res.key] for res in results)
    busy = [n for n in proxy.nacks if n.status == wire.Status.BUSY]
    assert busy and all(0 < n.chunk_len <= 10_000_000 for n in busy)  # microseconds until the queue has room
    st = r.stats()
    # Refused, not lost: no retransmit timeout passed (5 s), the hint said when to come back.
    assert st["busy_received"] == len(busy) and st["busy_retries"] > 0 and st["requests_failed"] == 0
    assert st["retransmit_gets"] == sum(1 for g in proxy.gets if g.flags & wire.Flag.RETRANSMIT)
    # A full queue refuses whole ranges; they are asked again as ranges, merging switches or not.
    # Where switches merge, as fresh GETs: the holder booked every requester it refused for the
    # chunk at one instant, and they meet in a switch again (a RETRANSMIT goes past it to the
    # holder); elsewhere with RETRANSMIT, so a switch's popularity count takes no retry for a fetch.
    assert all(n.frag_count > 1 for n in busy) and all(g.frag_count > 1 for g in proxy.gets)
    if merge:
        assert st["retransmit_gets"] == 0
    else:
        assert st["retransmit_gets"] >= st["busy_retries"] > 0


def test_a_holder_that_pushes_back_is_waited_for_until_the_callers_deadline() -> None:
    refuser = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    refuser.bind(("127.0.0.1", 0))
    refuser.settimeout(0.05)
    stop = threading.Event()

    def refuse() -> None:  # answers every GET BUSY, retry in 20 ms
        while not stop.is_set():
            try:
                pkt, addr = refuser.recvfrom(2048)
            except TimeoutError:
                continue
            g = wire.parse(pkt)
            refuser.sendto(wire.nack_packet(g.chunk_key, wire.Status.BUSY, g.request_id, g.frag_index, g.frag_count,
                                            g.generation, retry_us=20_000), addr)

    t = threading.Thread(target=refuse, daemon=True)
    t.start()
    try:
        # Give-up after 0.3 s of silence, but the holder answers: only the 1.5 s deadline ends it.
        with Transport(TransportConfig(port=0, retransmit_timeout_s=0.05, give_up_s=0.3)) as r:
            t0 = time.monotonic()
            (res,) = r.fetch([5], refuser.getsockname(), timeout=1.5)
            elapsed = time.monotonic() - t0
            st = r.stats()
    finally:
        stop.set()
        t.join()
        refuser.close()
    assert res.error is not None and "timed out" in res.error and "reachable" not in res.error
    # Refusals, not losses: re-asked when the hint said, never by the retransmit timer.
    assert elapsed >= 1.5 and st["busy_received"] >= 5 and st["busy_retries"] >= 5 and res.retransmit_rounds == 0
    with pytest.raises(wire.WireError, match="BUSY"):
        wire.nack_packet(5, wire.Status.UNKNOWN_CHUNK, retry_us=1)


def test_a_request_whose_answers_stop_re_asks_even_while_its_holder_streams_to_others() -> None:
    big, small = os.urandom(1_000_000), os.urandom(10 * wire.FRAG_PAYLOAD)
    seen: set[int] = set()

    def first_copy_of_small(pkt: bytes) -> bool:
        # Lose every fragment of the small chunk once, as a switch would that absorbed its GETs
        # into pending slots whose answer went elsewhere; the big one keeps the holder streaming.
        h = wire.unpack_header(pkt)
        if h.chunk_key != 2 or h.opcode != wire.Opcode.DATA or h.frag_index in seen:
            return False
        seen.add(h.frag_index)
        return True

    hcfg = TransportConfig(port=0, rate_bytes_per_s=1e6, burst_bytes=16 << 10, max_queue_s=0)  # about 1 s of DATA
    rcfg = TransportConfig(port=0, window_fragments=1024, max_inflight_fragments=2048, retransmit_timeout_s=0.05,
                           give_up_s=30.0)
    results, _proxy, r = _fetch_through_proxy({1: big, 2: small}, [1, 2], rcfg, holder_cfg=hcfg,
                                              drop_pkt=first_copy_of_small)
    assert [bytes(res.data or b"") for res in results] == [big, small]
    assert r.stats()["stall_retransmits"] >= 1 and len(seen) == 10


def test_nacks_for_a_run_of_single_gets_go_once_per_fragment() -> None:
    # A switch that coalesced single GETs releases each pending slot only on that fragment's answer.
    with Transport(TransportConfig(port=0), Holder(_store({}))) as h, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        for i in range(5):
            s.sendto(wire.get_packet(0xBEEF, i, request_id=4), h.address)
        got = sorted((n.frag_index, n.frag_count, n.status) for n in (wire.parse(s.recv(2048)) for _ in range(5)))
        s.sendto(wire.get_packet(0xBEEF, 0, 5, request_id=5), h.address)
        (rng,) = [wire.parse(s.recv(2048))]
    assert got == [(i, 1, wire.Status.UNKNOWN_CHUNK) for i in range(5)]
    assert (rng.frag_index, rng.frag_count, rng.status) == (0, 5, wire.Status.UNKNOWN_CHUNK)  # a range: one NACK


def _second_requester_meets_the_first(payload: bytes, merge: bool) -> tuple[list[FetchResult], list[dict[str, Any]]]:
    """A asks a paced holder for a chunk; B asks for it once A's answer started: results, (holder, A, B) stats."""
    hints = [FabricHints() for _ in range(3)]
    for fh in hints:
        fh.update(Hints({}, 60.0, merge))
    # Paced (about 0.3 s for 214 fragments), so A's range answer is still queued when B asks.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=1e6, burst_bytes=16 << 10, max_queue_s=0)
    rcfg = TransportConfig(port=0, window_fragments=1024, retransmit_timeout_s=5.0, give_up_s=30.0)
    with Transport(hcfg, Holder(_store({7: payload})), hints=hints[0]) as h, \
            Transport(rcfg, hints=hints[1]) as a, Transport(rcfg, hints=hints[2]) as b:
        out: list[FetchResult] = []
        first = threading.Thread(target=lambda: out.extend(a.fetch([7], h.address, timeout=30)))
        first.start()
        _until_sending(h)
        out.extend(b.fetch([7], h.address, timeout=30))
        first.join()
        return out, [h.stats(), a.stats(), b.stats()]


@pytest.mark.parametrize("merge", [False, True])
def test_concurrent_range_requests_for_one_chunk_are_each_served_as_ranges(merge: bool) -> None:
    # Switches coalesce range GETs per chunk: a holder answers a duplicate as it came, merging or not.
    payload = os.urandom(300_000)  # 214 fragments
    results, (hs, sa, sb) = _second_requester_meets_the_first(payload, merge)
    assert all(res.ok and bytes(res.data or b"") == payload for res in results) and len(results) == 2
    assert hs["nacks_sent"] == 0 and sa["busy_received"] == sb["busy_received"] == 0
    assert sa["gets_sent"] == sb["gets_sent"] == 1  # one range GET each, for the whole chunk


def test_a_full_queue_refusing_a_one_fragment_range_is_re_asked_as_that_range() -> None:
    # A one-fragment BUSY refuses that fragment's range: re-asked as it was when the hint says,
    # not as single GETs (once read as a holder converting the range: 5x plain's GETs under overload).
    payload = os.urandom(20 * wire.FRAG_PAYLOAD)
    gets: list[wire.Header] = []

    def on_get(g: wire.Header, addr: Address, send: Send) -> None:
        # All but fragment 7 at first; its first re-ask refused BUSY, then answered.
        gets.append(g)
        if len(gets) == 2:
            send(wire.nack_packet(g.chunk_key, wire.Status.BUSY, g.request_id, g.frag_index, 1, g.generation,
                                  retry_us=10_000), addr)
            return
        for i in range(g.frag_index, min(g.frag_index + g.frag_count, 20)):  # clamped, as a holder does
            if i != 7 or len(gets) > 1:
                send(wire.data_packet(g.chunk_key, i, payload, g.request_id, g.generation), addr)

    hints = FabricHints()
    hints.update(Hints({}, 60.0, True))  # the switches merge
    with _fake_holder(on_get) as holder, \
            Transport(TransportConfig(port=0, retransmit_timeout_s=0.05, give_up_s=5.0), hints=hints) as r:
        (res,) = r.fetch([9], holder, timeout=5)
        st = r.stats()
    assert res.ok and bytes(res.data or b"") == payload and st["busy_received"] == 1
    # First GET the whole window; then fragment 7 alone, refused; re-asked as the range it was,
    # a fresh GET (the switches merge: others refused with it come back at the same instant).
    assert [(g.frag_index, min(g.frag_count, 20)) for g in gets] == [(0, 20), (7, 1), (7, 1)]
    assert gets[1].flags & wire.Flag.RETRANSMIT and not gets[2].flags & wire.Flag.RETRANSMIT


def test_a_busy_retry_asks_again_only_what_was_refused_not_the_answers_still_on_their_way() -> None:
    # The holder admits the first window and sends its second half late (a queue ahead of it),
    # and refuses the next window BUSY.  Re-asking every missing fragment at the hint asked again
    # for the admitted ones still on their way, and a holder sends those twice (replayed agent
    # traffic at 17x the holder link: 4% of plain's DATA frames went twice to one node).
    n = 40
    payload = os.urandom(n * wire.FRAG_PAYLOAD)
    gets: list[wire.Header] = []
    late: list[tuple[float, bytes, Address]] = []
    lock = threading.Lock()

    def on_get(g: wire.Header, addr: Address, send: Send) -> None:
        gets.append(g)
        frags = range(g.frag_index, min(g.frag_index + g.frag_count, n))
        if len(gets) == 1:  # the first window: half now, half from the queue 80-130 ms later
            for i in frags:
                pkt = wire.data_packet(g.chunk_key, i, payload, g.request_id, g.generation)
                if i < 10:
                    send(pkt, addr)
                else:
                    with lock:
                        late.append((time.monotonic() + 0.08 + 0.005 * (i - 10), pkt, addr))
        elif len(gets) == 2:  # the next window: the queue is full, come back in 20 ms
            send(wire.nack_packet(g.chunk_key, wire.Status.BUSY, g.request_id, g.frag_index, g.frag_count,
                                  g.generation, retry_us=20_000), addr)
        else:
            for i in frags:
                send(wire.data_packet(g.chunk_key, i, payload, g.request_id, g.generation), addr)

    on_idle = _sender_of_due(late, lock)

    cfg = TransportConfig(port=0, window_fragments=20, retransmit_timeout_s=1.0, give_up_s=5.0)
    with _fake_holder(on_get, on_idle) as holder, Transport(cfg) as r:
        (res,) = r.fetch([5], holder, timeout=5)
        st = r.stats()
    assert res.ok and bytes(res.data or b"") == payload, res.error
    assert st["busy_received"] == 1 and st["busy_retries"] == 1 and res.retransmit_rounds == 0
    asked = np.zeros(n, int)
    for g in gets:
        asked[g.frag_index:min(g.frag_index + g.frag_count, n)] += 1
    # The refused window twice (refused, then re-asked); every other fragment once.
    assert (gets[1].frag_index, gets[1].frag_count) == (20, 10)
    assert asked[20:30].tolist() == [2] * 10 and asked[:20].tolist() == [1] * 20, asked.tolist()


def test_a_shared_chunks_window_does_not_starve_range_requests() -> None:
    # A pooled chunk's GETs go out a whole window at once, past the budget; counted against
    # it, they starved every range request until they were answered (replayed agent traffic in
    # pool mode: the holder link half idle while a requester's range chunks waited seconds).
    hot, cold = os.urandom(200 * wire.FRAG_PAYLOAD), os.urandom(10 * wire.FRAG_PAYLOAD)
    cold_asked: list[float] = []
    late: list[tuple[float, bytes, Address]] = []

    def on_get(g: wire.Header, addr: Address, send: Send) -> None:
        # The hot chunk's answers come 0.5 s late (a pending slot, a booking); the cold one's at once.
        data = hot if g.chunk_key == 1 else cold
        for i in range(g.frag_index, min(g.frag_index + g.frag_count, wire.fragment_count(len(data)))):
            out = wire.data_packet(g.chunk_key, i, data, g.request_id, g.generation)
            if g.chunk_key == 1:
                late.append((time.monotonic() + 0.5, out, addr))
            else:
                send(out, addr)
        if g.chunk_key == 2:
            cold_asked.append(time.monotonic())

    def on_idle(send: Send) -> None:
        now = time.monotonic()
        for item in [x for x in late if x[0] <= now]:
            send(item[1], item[2])
            late.remove(item)

    hints = FabricHints()
    hints.update(Hints({1: Hint(GetPath.SERVABLE, len(hot))}, 60.0, True))  # the whole chunk asked at once
    cfg = TransportConfig(port=0, window_fragments=256, max_inflight_fragments=32, retransmit_timeout_s=2.0,
                          give_up_s=10.0)
    with _fake_holder(on_get, on_idle) as holder, Transport(cfg, hints=hints) as r:
        t0 = time.monotonic()
        got = r.fetch([1, 2], holder, timeout=10)
    assert [bytes(x.data or b"") for x in got] == [hot, cold]
    # The cold chunk was asked for while the hot one's answers were still on their way, not after.
    assert cold_asked and cold_asked[0] - t0 < 0.4, f"cold chunk first asked {cold_asked[0] - t0:.2f} s in"


@contextlib.contextmanager
def _paused_merging_holder(data: dict[int, bytes], cfg: TransportConfig,
                           gate: RequesterGate | None = None) -> Iterator[tuple[Transport, threading.Event]]:
    """A holder where the switches merge, its loop stopped inside serving chunk 1 until the event is set.

    GETs sent before the event is set are read in one batch.
    """
    resume, entered = threading.Event(), threading.Event()

    class Paused(Holder):
        def serve(self, chunk_key: int, *args: Any, **kwargs: Any) -> Any:
            if chunk_key == 1 and not resume.is_set():
                entered.set()
                resume.wait(5)  # the loop thread waits here while the GETs queue up
            return super().serve(chunk_key, *args, **kwargs)

    hints = FabricHints()
    hints.update(Hints({}, 60.0, True))
    with Transport(cfg, Paused(_store({1: os.urandom(1000), **data})), gate, hints) as h, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as first:
        first.sendto(wire.get_packet(1, 0, 1, request_id=9), h.address)
        assert entered.wait(5)
        yield h, resume


@pytest.mark.parametrize("n_gets", [80, 24])
def test_single_gets_past_a_sources_budget_are_refused_not_left_unanswered(n_gets: int) -> None:
    # A requester's 80 single GETs for one chunk read in one batch, merged into one run; its
    # budget held 24 fragments (23 after the helper's first GET).  The rest got neither DATA nor
    # NACK: a switch's pending slots for them, with other requesters' GETs absorbed, waited out
    # their timeout and every waiter its stall timer (9-11 s on replayed agent traffic at
    # 10 Mbit/s).  With 24 GETs one is refused alone: its NACK must name it, not the run's first.
    gate = RequesterGate(window_fragments=600, rate_fragments_per_s=0.1, burst_fragments=24, trust_loopback=False,
                         allow=["127.0.0.1"])
    with _paused_merging_holder({7: os.urandom(100 * wire.FRAG_PAYLOAD)}, TransportConfig(port=0), gate) \
            as (h, gate_open), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a:
        a.settimeout(1.0)
        for i in range(n_gets):
            a.sendto(wire.get_packet(7, i, 1, request_id=5), h.address)
        time.sleep(0.05)
        gate_open.set()
        data: set[int] = set()
        busy: dict[int, int] = {}
        with contextlib.suppress(TimeoutError):
            while len(data) + len(busy) < n_gets:
                got = wire.parse(a.recv(4096))
                if got.opcode == wire.Opcode.DATA:
                    data.add(got.frag_index)
                elif got.status == wire.Status.BUSY:
                    busy[got.frag_index] = got.chunk_len
    unanswered = set(range(n_gets)) - data - set(busy)
    assert len(data) <= 24 and not unanswered, f"unanswered: {unanswered}"
    assert all(hint >= 1_000_000 for hint in busy.values())  # back when the budget refilled (0.1 fragments/s)


@pytest.mark.parametrize("burst", [24, 79])
def test_a_range_past_a_sources_budget_is_answered_in_part_and_refused_for_the_rest(burst: int) -> None:
    # A range GET for 80 fragments from a source whose budget holds fewer.  The rest got neither
    # DATA nor NACK, and its requester waited for its stall timer (9 s on replayed agent traffic
    # at 100 Mbit/s, 200 requests: p99 3.6x plain's).  A BUSY for one fragment of a range is a
    # conversion on the wire, so the refused part is never one fragment.
    gate = RequesterGate(window_fragments=600, rate_fragments_per_s=0.1, burst_fragments=burst,
                         trust_loopback=False, allow=["127.0.0.1"])
    chunk = os.urandom(100 * wire.FRAG_PAYLOAD)
    with Transport(TransportConfig(port=0), Holder(_store({7: chunk})), gate) as h, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a:
        a.settimeout(1.0)
        a.sendto(wire.get_packet(7, 0, 80, request_id=5), h.address)
        data: set[int] = set()
        nacks: list[wire.Header] = []
        with contextlib.suppress(TimeoutError):
            while not nacks or len(data) < nacks[0].frag_index:
                got = wire.parse(a.recv(4096))
                if got.opcode == wire.Opcode.DATA:
                    data.add(got.frag_index)
                else:
                    nacks.append(got)
    (nack,) = nacks
    assert nack.status == wire.Status.BUSY and nack.chunk_len >= 1_000_000  # the budget refills at 0.1/s
    assert nack.frag_count >= 2 and data == set(range(nack.frag_index))
    assert nack.frag_index + nack.frag_count == 80 and len(data) == min(burst, 78)


def test_a_full_queue_refusing_adjacent_ranges_of_a_request_names_them_all() -> None:
    # Two adjacent range GETs of one request read in one batch are served, or refused, as one
    # run.  The BUSY named only the first GET's fragments: the requester re-asks what a BUSY
    # names, and the second GET's waited for its stall timer (17 s in a replay of agent traffic).
    with _paused_merging_holder({7: os.urandom(40 * wire.FRAG_PAYLOAD), 8: os.urandom(40 * wire.FRAG_PAYLOAD)},
                                TransportConfig(port=0, max_queued_fragments=8)) as (h, resume), \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a:
        a.settimeout(1.0)
        a.sendto(wire.get_packet(8, 0, 20, request_id=4), h.address)  # fills the queue
        a.sendto(wire.get_packet(7, 0, 2, request_id=5), h.address)
        a.sendto(wire.get_packet(7, 2, 14, request_id=5), h.address)
        time.sleep(0.05)
        resume.set()
        nacks: list[wire.Header] = []
        with contextlib.suppress(TimeoutError):
            while True:
                got = wire.parse(a.recv(4096))
                if got.opcode == wire.Opcode.NACK:
                    nacks.append(got)
    assert [(n.chunk_key, n.status, n.frag_index, n.frag_count) for n in nacks] == [(7, wire.Status.BUSY, 0, 16)]


def test_a_requester_over_its_budget_comes_back_for_the_rest_of_a_range_when_told() -> None:
    gate = RequesterGate(window_fragments=600, rate_fragments_per_s=400, burst_fragments=24,
                         trust_loopback=False, allow=["127.0.0.1"])
    chunk = os.urandom(100 * wire.FRAG_PAYLOAD)
    rcfg = TransportConfig(port=0, window_fragments=80, retransmit_timeout_s=2.0, give_up_s=30.0)
    with Transport(TransportConfig(port=0), Holder(_store({7: chunk})), gate) as h, Transport(rcfg) as r:
        (res,) = r.fetch([7], h.address, timeout=30)
        st = r.stats()
    assert res.ok and bytes(res.data or b"") == chunk, res.error
    # Refused and re-asked at the budget's hint, not found missing by a stall timer (8 s here).
    assert st["busy_retries"] >= 1 and res.retransmit_rounds == 0 and st["stall_retransmits"] == 0


def test_range_requests_under_a_tight_budget_ask_for_windows_not_crumbs() -> None:
    data = {k: os.urandom(40 * wire.FRAG_PAYLOAD) for k in range(1, 25)}  # 24 chunks of 40 fragments
    cfg = TransportConfig(port=0, window_fragments=64, max_inflight_fragments=96, max_active_requests=8,
                          retransmit_timeout_s=5.0, give_up_s=30.0)
    # A paced holder: DATA arrives one datagram at a time, freeing budget one fragment at a time.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=2e6, burst_bytes=16 << 10, max_queue_s=0)
    results, proxy, _r = _fetch_through_proxy(data, list(data), cfg, holder_cfg=hcfg)
    assert all(res.ok and bytes(res.data or b"") == data[res.key] for res in results)
    # Every freed fragment of budget could be asked for on its own (one GET per DATA); a request
    # whose fragments still arrive waits for a window worth a GET instead.
    frags = 24 * 40
    assert len(proxy.gets) <= frags // 8, f"{len(proxy.gets)} GETs for {frags} fragments"


def test_refused_fragments_are_re_asked_at_the_hint_while_the_rest_of_the_request_streams() -> None:
    payload = os.urandom(200 * wire.FRAG_PAYLOAD)
    # A pooled chunk, its length unknown: fragment 0, then single GETs a half window at a time (no
    # merging fabric: where one merges, the holder keeps room for a chunk's rest once its first
    # fragment is asked for, and nothing is refused).
    hints = Hints({3: Hint(GetPath.SERVABLE)}, 60.0, False)
    # The holder takes 32-fragment runs until 64 are queued and refuses the rest: the first runs'
    # DATA keeps arriving while the refused ones wait for the hint (tens of ms).  They must be
    # re-asked then, not a retransmit timeout after the last DATA: the give-up (2 s of silence)
    # comes first, so waiting for the 5 s timeout would fail the fetch.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=2e6, burst_bytes=16 << 10, max_queue_s=0.016,
                           max_fragments_per_get=32)
    rcfg = TransportConfig(port=0, window_fragments=256, retransmit_timeout_s=5.0, give_up_s=2.0)
    (res,), proxy, r = _fetch_through_proxy({3: payload}, [3], rcfg, holder_cfg=hcfg, hints=hints)
    assert res.ok and bytes(res.data or b"") == payload, res.error
    st = r.stats()
    assert st["busy_received"] > 0 and st["busy_retries"] > 0 and res.retransmit_rounds == 0
    assert all(g.frag_count == 1 for g in proxy.gets)


def test_a_holder_bounds_its_queue_by_the_rate_it_drains_at_not_only_the_rate_it_paces_at() -> None:
    m = DrainMeter(window_s=0.25)
    m.sample(10.0, True, 0)
    m.sample(10.1, True, 100_000)
    assert m.rate == 0.0  # not a whole window yet
    m.sample(10.5, True, 500_000)  # 500 kB in 0.5 s of backlog
    assert m.rate == pytest.approx(1e6)
    m.sample(11.0, False, 600_000)  # ran empty: the idle time is no drain
    m.sample(20.0, True, 600_000)
    m.sample(20.5, True, 850_000)  # 250 kB in 0.5 s
    assert m.rate == pytest.approx(0.7 * 1e6 + 0.3 * 5e5)
    # A holder paced at 10 MB/s whose host sends 1 MB/s: one second of queue is 1 MB, not 10.
    t = Transport(TransportConfig(port=0, rate_bytes_per_s=10e6, max_queue_s=1.0))
    unmeasured = t._server.queue_limit()
    assert unmeasured == int(10e6 / wire.DATA_DATAGRAM_LEN)
    t._queue.drain.rate = 1e6
    assert t._server.queue_limit() == int(1e6 / wire.DATA_DATAGRAM_LEN)
    t._queue.drain.rate = 1e3  # never below a twentieth of the pacing rate
    assert t._server.queue_limit() == int(0.5e6 / wire.DATA_DATAGRAM_LEN)
