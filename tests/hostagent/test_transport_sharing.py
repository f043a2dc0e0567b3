"""Sharing: one transfer per chunk on a node, and a holder where switches merge (bookings, bursts, pushes, turns)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hostagent.hints import FabricHints
from hostagent.holder import Holder
from hostagent.transport import Address, FetchResult, Transport, TransportConfig
from kvpool import wire
from kvpool.hints import GetPath, Hint, Hints
from tests.hostagent.transport_kit import (
    Send,
    _fake_holder,
    _fetch_through_proxy,
    _settled,
    _store,
    _until_sending,
)

_TOGETHER = {7: 300_000, 8: 50_000, 9: 20_000}


def _fetch_together(share: bool, sent: int) -> tuple[list[list[FetchResult]], dict[str, Any], dict[str, Any],
                                                      dict[int, bytes]]:
    """Four calls on one node ask for overlapping chunks of a paced holder while the first call's transfer runs.

    The holder's stats are read once it counted ``sent`` datagrams.
    """
    data = {k: os.urandom(n) for k, n in _TOGETHER.items()}
    # Paced (about 0.3 s for chunk 7 alone), so the later calls start while the first transfers.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=1e6, burst_bytes=16 << 10, max_queue_s=0)
    rcfg = TransportConfig(port=0, window_fragments=1024, retransmit_timeout_s=5.0, give_up_s=30.0,
                           share_transfers=share)
    with Transport(hcfg, Holder(_store(data))) as h, Transport(rcfg) as r:
        out: list[list[FetchResult]] = [[] for _ in range(4)]
        asks = [[7, 8], [7], [8, 7, 9], [7, 7]]

        def call(i: int) -> None:
            out[i] = r.fetch(asks[i], h.address, timeout=30)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        threads[0].start()
        _until_sending(h)
        for th in threads[1:]:
            th.start()
        for th in threads:
            th.join()
        for i, results in enumerate(out):
            assert [res.key for res in results] == asks[i]
        return out, _settled(h, sent), r.stats(), data


def test_concurrent_fetches_of_one_chunk_on_one_node_share_one_transfer() -> None:
    once = sum(wire.fragment_count(n) for n in _TOGETHER.values())
    out, hs, rs, data = _fetch_together(share=True, sent=once)
    for results in out:
        for res in results:
            assert res.ok and res.data is not None and bytes(res.data) == data[res.key]
            # One buffer behind every call that shared it (the first's too): nobody may write it.
            assert res.data.readonly == (res.key != 9)
    # Each chunk crossed once: 7 and 8 were in flight when the other calls asked, 9 was asked once.
    assert hs["datagrams_sent"] == once
    # Calls 1-3 took 7 four times (call 3 asks twice) and 8 once from the first call's transfers.
    assert rs["shared_transfers"] == 5
    # Turned off, every call transfers its own copy: chunk 7 crosses once per ask.
    each = (5 * wire.fragment_count(_TOGETHER[7]) + 2 * wire.fragment_count(_TOGETHER[8])
            + wire.fragment_count(_TOGETHER[9]))
    out, hs, rs, data = _fetch_together(share=False, sent=each)
    assert all(res.ok and bytes(res.data or b"") == data[res.key] for results in out for res in results)
    assert rs["shared_transfers"] == 0
    assert hs["datagrams_sent"] == each


def test_a_call_sharing_a_transfer_goes_on_when_the_owners_earlier_deadline_ends_it() -> None:
    payload = os.urandom(1_000_000)  # about 1 s at the holder's pace
    hcfg = TransportConfig(port=0, rate_bytes_per_s=1e6, burst_bytes=16 << 10, max_queue_s=0)
    rcfg = TransportConfig(port=0, window_fragments=1024, retransmit_timeout_s=5.0, give_up_s=30.0)
    with Transport(hcfg, Holder(_store({7: payload}))) as h, Transport(rcfg) as r:
        owner: list[FetchResult] = []
        first = threading.Thread(target=lambda: owner.extend(r.fetch([7], h.address, timeout=0.3)))
        first.start()
        _until_sending(h)
        (late,) = r.fetch([7], h.address, timeout=30)
        first.join()
        st = r.stats()
    assert owner[0].error is not None and "deadline passed" in owner[0].error
    assert late.ok and bytes(late.data or b"") == payload
    assert st["shared_transfers"] == 1


def test_a_holder_answers_a_lone_fragment_0_get_before_the_queued_ranges() -> None:
    """A requester that asks fragment 0 alone (its length) is not kept waiting a round of other answers."""
    big = {k: os.urandom(10 * wire.FRAG_PAYLOAD) for k in range(1, 65)}  # 64 chunks of 10 fragments
    small = {99: os.urandom(5 * wire.FRAG_PAYLOAD)}
    # Paced at 1.5 MB/s: the 64 ranges take about 0.6 s, and once the first burst is out the
    # holder sends a fragment or two per turn, round robin over the answers queued.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=1.5e6, burst_bytes=16 << 10, max_queue_s=0)
    with Transport(hcfg, Holder(_store(big | small))) as h:
        ranges = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for s in (ranges, probe):
                s.bind(("127.0.0.1", 0))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                s.settimeout(5)
            for k in big:
                ranges.sendto(wire.get_packet(k, 0, 10, request_id=k), h.address)
            wire.parse(ranges.recvfrom(2048)[0])  # the ranges are being answered
            sent_before = h.stats()["datagrams_sent"]
            probe.sendto(wire.get_packet(99, 0, 1, request_id=99), h.address)
            answer = wire.parse(probe.recvfrom(2048)[0])
            sent_meanwhile = h.stats()["datagrams_sent"] - sent_before
        finally:
            ranges.close()
            probe.close()
    assert (answer.opcode, answer.chunk_key, answer.frag_index) == (wire.Opcode.DATA, 99, 0)
    # Round robin would have put it behind a turn of each of the 64 ranges (64 fragments or
    # more); it went out with the next turn.
    assert sent_meanwhile < 32


def _shared_chunk_asks() -> tuple[list[FetchResult], list[wire.Header], dict[int, bytes]]:
    """A cold chunk's range holds the whole budget while a pooled chunk is fetched: results, GETs, chunks."""
    data = {1: os.urandom(600 * wire.FRAG_PAYLOAD), 2: os.urandom(60 * wire.FRAG_PAYLOAD)}
    hints = Hints({2: Hint(GetPath.SERVABLE)}, 60.0, True)  # no length: fragment 0 first
    # Paced at 1 MB/s, so chunk 1's 32-fragment windows keep the requester's 32 of budget busy.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=1e6, burst_bytes=16 << 10, max_queue_s=0)
    rcfg = TransportConfig(port=0, window_fragments=128, max_inflight_fragments=32, retransmit_timeout_s=5.0,
                           give_up_s=30.0)
    results, proxy, _r = _fetch_through_proxy(data, [1, 2], rcfg, holder_cfg=hcfg, hints=hints)
    return results, proxy.gets, data


def test_where_switches_merge_a_shared_chunk_is_asked_for_whole_once_its_length_is_known() -> None:
    # The switch merges GETs for a fragment only while one is pending: requesters that share a
    # chunk must ask for it together, not a few fragments per round trip as their other
    # transfers free budget (each would then ask for each fragment at its own time).
    results, gets, data = _shared_chunk_asks()
    assert all(res.ok and bytes(res.data or b"") == data[res.key] for res in results)
    hot = [i for i, g in enumerate(gets) if g.chunk_key == 2 and g.frag_index > 0]
    assert len(hot) == 59 and hot == list(range(hot[0], hot[0] + 59)), "asked in one burst, nothing between"


@contextlib.contextmanager
def _merging_holder_and_three_requesters(rate: float = 1e6, max_queue_s: float = 0.05,
                                         ) -> Iterator[tuple[Transport, list[socket.socket]]]:
    """A holder where the switches merge, with chunk 1 (300 fragments), 2 and 3 (40 each), and three raw sockets.

    Paced at ``rate`` (1 MB/s: chunk 1's range fills its queue of ``max_queue_s`` for about 0.4 s).
    """
    chunks = {1: os.urandom(300 * wire.FRAG_PAYLOAD), 2: os.urandom(40 * wire.FRAG_PAYLOAD),
              3: os.urandom(40 * wire.FRAG_PAYLOAD)}
    fabric = FabricHints()
    fabric.update(Hints({}, 60.0, True))
    hcfg = TransportConfig(port=0, rate_bytes_per_s=rate, burst_bytes=16 << 10, max_queue_s=max_queue_s)
    with Transport(hcfg, Holder(_store(chunks)), hints=fabric) as h, contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) for _ in range(3)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.settimeout(5)
        yield h, socks


def test_where_switches_merge_a_full_holder_books_one_return_per_chunk_and_spaces_the_chunks() -> None:
    with _merging_holder_and_three_requesters() as (h, socks):
        def refused(s: socket.socket, key: int, rid: int) -> tuple[float, int]:
            """Ask ``key``'s fragments 0-3 singly: when the NACKs came and their hint in us."""
            for i in range(4):
                s.sendto(wire.get_packet(key, i, 1, request_id=rid), h.address)
            nacks: list[wire.Header] = []
            while len(nacks) < 4:
                hdr = wire.parse(s.recvfrom(2048)[0])
                if hdr.opcode == wire.Opcode.NACK:
                    nacks.append(hdr)
            assert {n.status for n in nacks} == {wire.Status.BUSY}
            hints = [n.chunk_len for n in nacks]  # one booking, told as the time left until it
            assert max(hints) - min(hints) < 20_000, hints
            return time.monotonic(), min(hints)

        socks[0].sendto(wire.get_packet(1, 0, 300, request_id=1), h.address)
        wire.parse(socks[0].recvfrom(2048)[0])  # chunk 1 is being answered, the queue is full
        t_a, hint_a = refused(socks[1], 2, 20)
        t_b, hint_b = refused(socks[2], 2, 21)  # another requester, the same chunk
        t_c, hint_c = refused(socks[2], 3, 30)  # another chunk
        bookings = dict(h._server._rendezvous)
    # Every requester refused for chunk 2 comes back at the same instant (where the switch
    # merges their GETs again): one booking of its four fragments, not one per requester.
    back_a, back_b, back_c = t_a + hint_a / 1e6, t_b + hint_b / 1e6, t_c + hint_c / 1e6
    assert abs(back_a - back_b) < 0.02, (hint_a, hint_b)
    assert bookings[2][1:] == (0, 4) and bookings[3][1:] == (0, 4), bookings
    # Chunk 3 comes back after chunk 2, not with it: booked after the four fragments booked for
    # chunk 2 at the rate the queue drains (1 MB/s at most).  Asserted on the holder's clock: the
    # hints are its bookings less the instant each NACK left, and on a loaded machine the time a
    # NACK waits before the requester reads it moves the requester's estimate by milliseconds,
    # as much as the 5.8 ms asserted here (CI: 1.4 ms apart that way).
    assert bookings[3][0] - bookings[2][0] >= 4 * wire.DATA_DATAGRAM_LEN / 1e6 - 1e-6, bookings
    assert back_c > back_b - 0.02, (hint_b, hint_c)


def test_where_switches_merge_a_chunk_refused_in_two_batches_is_booked_whole() -> None:
    # One requester's GETs refused in two receive batches (fragments 2-3, then 4-5): the booking
    # covers all four, and the chunk refused next comes back after all four, not after two.
    with _merging_holder_and_three_requesters() as (h, socks):
        socks[0].sendto(wire.get_packet(1, 0, 300, request_id=1), h.address)
        wire.parse(socks[0].recvfrom(2048)[0])  # chunk 1 is being answered, the queue is full

        def refuse(s: socket.socket, key: int, frags: range, rid: int) -> None:
            for i in frags:
                s.sendto(wire.get_packet(key, i, 1, request_id=rid), h.address)
            got = 0
            while got < len(frags):
                got += wire.parse(s.recvfrom(2048)[0]).opcode == wire.Opcode.NACK

        refuse(socks[1], 2, range(2, 4), 20)
        refuse(socks[1], 2, range(4, 6), 20)
        refuse(socks[2], 2, range(2, 6), 21)  # another requester, the same fragments: nothing new
        refuse(socks[2], 3, range(2, 4), 30)
        bookings = dict(h._server._rendezvous)
    assert bookings[2][1:] == (2, 6) and bookings[3][1:] == (2, 4), bookings
    assert bookings[3][0] - bookings[2][0] >= 4 * wire.DATA_DATAGRAM_LEN / 1e6 - 1e-6, bookings


def test_where_switches_merge_a_refused_requester_comes_back_when_the_hint_says_not_jittered() -> None:
    # The holder booked that instant for every requester refused for the chunk: jittered, they
    # would come back apart and the switch could not merge their GETs again.
    fabric = FabricHints()
    fabric.update(Hints({k: Hint(GetPath.SINGLE, 4 * wire.FRAG_PAYLOAD) for k in range(1, 7)}, 60.0, True))
    hint_s = 0.2
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder, \
            Transport(TransportConfig(port=0, retransmit_timeout_s=5.0, give_up_s=30.0), hints=fabric) as r:
        holder.bind(("127.0.0.1", 0))
        holder.settimeout(5)
        addr = ("127.0.0.1", int(holder.getsockname()[1]))
        calls = [threading.Thread(target=r.fetch, args=([k], addr), kwargs={"timeout": 3}) for k in range(1, 7)]
        for t in calls:
            t.start()
        refused_at: dict[int, float] = {}
        back_after: dict[int, float] = {}
        while len(back_after) < 6:
            pkt, src = holder.recvfrom(2048)
            get = wire.parse(pkt)
            now = time.monotonic()
            if get.chunk_key not in refused_at:
                holder.sendto(wire.nack_packet(get.chunk_key, wire.Status.BUSY, get.request_id, get.frag_index,
                                               1, get.generation, retry_us=int(hint_s * 1e6)), src)
                refused_at[get.chunk_key] = now
            elif get.chunk_key not in back_after:
                back_after[get.chunk_key] = now - refused_at[get.chunk_key]
        for t in calls:
            t.join()
    assert all(hint_s * 0.95 <= w <= hint_s + 0.05 for w in back_after.values()), back_after


def test_where_switches_merge_a_chunk_whose_probe_was_answered_is_never_refused_its_rest() -> None:
    # Refused one NACK per fragment, a shared chunk's rest cost as many NACKs as DATA under
    # overload; so the holder admits or refuses a chunk whole, at its length probe.
    with _merging_holder_and_three_requesters() as (h, socks):
        def answers(s: socket.socket, n: int) -> list[wire.Header]:
            return [wire.parse(s.recvfrom(2048)[0]) for _ in range(n)]

        a, b, c = socks
        a.sendto(wire.get_packet(2, 0, 1, request_id=2), h.address)  # chunk 2's probe: admitted
        (probe,) = answers(a, 1)
        b.sendto(wire.get_packet(1, 0, 300, request_id=1), h.address)  # fills the queue
        answers(b, 1)
        for i in range(4):  # another chunk's GETs find the queue full
            c.sendto(wire.get_packet(3, i, 1, request_id=3), h.address)
        other = answers(c, 4)
        for i in range(1, 40):  # chunk 2's rest, asked once the probe told its length
            a.sendto(wire.get_packet(2, i, 1, request_id=2), h.address)
        rest = answers(a, 39)
    assert (probe.opcode, probe.frag_count) == (wire.Opcode.DATA, 40)
    assert {(n.opcode, n.status) for n in other} == {(wire.Opcode.NACK, wire.Status.BUSY)}
    assert {g.opcode for g in rest} == {wire.Opcode.DATA} and sorted(g.frag_index for g in rest) == list(range(1, 40))


def test_where_switches_merge_a_burst_starts_with_one_get_while_its_holder_refuses() -> None:
    # A full holder refuses a burst of single GETs one NACK per fragment; while it refuses, a
    # burst asks for one fragment first, and for the rest once that one is answered (the
    # holder then keeps room for them).  Chunk 1 is refused for long; chunk 2 is answered.
    data = {1: os.urandom(10 * wire.FRAG_PAYLOAD), 2: os.urandom(10 * wire.FRAG_PAYLOAD)}
    records = Holder(_store(data))
    fabric = FabricHints()
    fabric.update(Hints({k: Hint(GetPath.SERVABLE) for k in data}, 60.0, True))  # no length: fragment 0 first
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder, \
            Transport(TransportConfig(port=0, retransmit_timeout_s=5.0, give_up_s=30.0), hints=fabric) as r:
        holder.bind(("127.0.0.1", 0))
        holder.settimeout(5)
        addr = ("127.0.0.1", int(holder.getsockname()[1]))
        busy = threading.Thread(target=r.fetch, args=([1], addr), kwargs={"timeout": 2})
        busy.start()
        pkt, src = holder.recvfrom(2048)
        get = wire.parse(pkt)
        holder.sendto(wire.nack_packet(1, wire.Status.BUSY, get.request_id, get.frag_index, 1, get.generation,
                                       retry_us=5_000_000), src)
        time.sleep(0.05)
        out: list[FetchResult] = []
        fetch = threading.Thread(target=lambda: out.extend(r.fetch([2], addr, timeout=10)))
        fetch.start()
        asked: list[list[int]] = []  # chunk 2's GETs, by the answer they came before
        while not out:
            try:
                pkt, src = holder.recvfrom(2048)
            except TimeoutError:
                break
            get = wire.parse(pkt)
            if get.chunk_key != 2:
                continue
            asked.append([get.frag_index])
            time.sleep(0.05)  # the rest of a burst, sent together, is in by then
            holder.setblocking(False)
            while True:
                try:
                    more = wire.parse(holder.recv(2048))
                except BlockingIOError:
                    break
                if more.chunk_key == 2:
                    asked[-1].append(more.frag_index)
            holder.settimeout(5)
            for i in asked[-1]:
                rec = records.serve(2, i, 1, request_id=get.request_id)
                assert not isinstance(rec, wire.Status)
                holder.sendto(rec.tobytes(), src)
            fetch.join(0.2)
        fetch.join()
        busy.join()
    assert out and out[0].ok and bytes(out[0].data or b"") == data[2]
    # The length probe, then one fragment alone, then the rest together.
    assert asked[:2] == [[0], [1]] and sorted(asked[2]) == list(range(2, 10)), asked


def test_a_push_waits_for_the_answers_and_skips_what_they_carried_since_it_was_asked_for() -> None:
    # A push (the controller's fill of an admitted chunk) costs the holder's link a copy; the
    # answers that pass the switch after the admission fill it too.  So a push goes only when
    # no answer can, and without the fragments answers carried meanwhile.
    chunks = {1: os.urandom(300 * wire.FRAG_PAYLOAD), 2: os.urandom(40 * wire.FRAG_PAYLOAD)}
    hcfg = TransportConfig(port=0, rate_bytes_per_s=1e6, burst_bytes=16 << 10, max_queue_s=0)
    with Transport(hcfg, Holder(_store(chunks))) as h:
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        try:
            for s in socks:
                s.bind(("127.0.0.1", 0))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                s.settimeout(5)
            requester, sink = socks
            requester.sendto(wire.get_packet(1, 0, 300, request_id=1), h.address)  # keeps the link busy
            wire.parse(requester.recvfrom(2048)[0])
            h.push([2], sink.getsockname())
            requester.sendto(wire.get_packet(2, 0, 20, request_id=2), h.address)
            answered = sorted(hdr.frag_index for hdr in (wire.parse(requester.recvfrom(2048)[0]) for _ in range(319))
                              if hdr.chunk_key == 2)
            pushed = sorted(wire.parse(sink.recvfrom(2048)[0]).frag_index for _ in range(20))
            sink.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sink.recvfrom(2048)
        finally:
            for s in socks:
                s.close()
        st = h.stats()
    assert answered == list(range(20)) and pushed == list(range(20, 40))
    assert st["pushed_fragments"] == 40 and st["skipped_push_fragments"] == 20


def test_a_burst_skips_the_fragments_that_came_before_it_was_asked_for() -> None:
    # Where the switches merge, a requester's GET for a fragment joins the others' pending GETs
    # and the switch's copies of their answers reach it too: fragments it never asked for can
    # arrive before its burst goes out.  While its holder refuses, a burst starts with one GET
    # and waits for its answer (``_burst``); aimed at a fragment that had already come, the answer
    # was a duplicate, stored nothing, and the request waited for it until it gave up (a replay
    # of agent traffic, pool mode: 16/140 fragments, no progress for 20 s).
    n = 12
    payload = os.urandom(n * wire.FRAG_PAYLOAD)
    gets: list[tuple[int, int]] = []

    def on_get(g: wire.Header, addr: Address, send: Send) -> None:
        if g.chunk_key == 1:  # another chunk, refused for long: the holder refuses lately
            send(wire.nack_packet(1, wire.Status.BUSY, g.request_id, g.frag_index, 1, g.generation,
                                  retry_us=5_000_000), addr)
            return
        gets.append((g.frag_index, g.frag_count))
        # Fragment 0 comes with the switch's copies of 1-4, which other requesters asked for.
        last = 5 if g.frag_index == 0 else g.frag_index + g.frag_count
        for i in range(g.frag_index, min(last, n)):
            send(wire.data_packet(2, i, payload, g.request_id, g.generation), addr)

    fabric = FabricHints()
    fabric.update(Hints({1: Hint(GetPath.SERVABLE), 2: Hint(GetPath.SERVABLE)}, 60.0, True))  # fragment 0 first
    cfg = TransportConfig(port=0, retransmit_timeout_s=0.3, give_up_s=2.0)
    with _fake_holder(on_get) as holder, Transport(cfg, hints=fabric) as r:
        refused = threading.Thread(target=r.fetch, args=([1], holder), kwargs={"timeout": 1.0})
        refused.start()
        time.sleep(0.1)  # chunk 1's BUSY is in: the holder refuses until its hint passes
        (res,) = r.fetch([2], holder, timeout=3)
        refused.join()
    assert res.ok and bytes(res.data or b"") == payload, res.error
    assert res.retransmit_rounds == 0  # nothing waited for a timer
    # The probe, then the rest once: what had come is not asked for again (which of 1-4 had
    # come when the first grant went out depends on how the requester's reads batch them).
    later = sorted(i for i, _ in gets[1:])
    assert gets[0] == (0, 1) and later[-(n - 5):] == list(range(5, n)) and len(later) <= n - 1, gets


def test_where_switches_merge_a_full_queue_of_shared_answers_still_admits_a_range() -> None:
    # A range GET is what plain forwarding asks with, and there its requesters' budgets keep the
    # holder's queue short: it is refused only when range answers alone fill the queue.  Refused
    # for the room shared chunks took, an unshared chunk came a crumb of its requester's budget
    # per refusal (replayed agent traffic at 3x the holder link: 10-13 s a chunk, plain 2-6 s).
    # Paced at 100 kB/s, the 80 queued answers stay above the 34-fragment bound for 0.7 s, so the
    # single GET below finds the queue full however late a busy machine runs it.
    with _merging_holder_and_three_requesters(rate=1e5, max_queue_s=0.5) as (h, socks):
        a, b, c = socks
        for i in range(220, 300):  # chunk 1's last 80 singly: 80 answers in a 64-fragment queue
            a.sendto(wire.get_packet(1, i, 1, request_id=1), h.address)
        assert wire.parse(a.recvfrom(2048)[0]).opcode == wire.Opcode.DATA
        c.sendto(wire.get_packet(3, 1, 1, request_id=3), h.address)
        full = wire.parse(c.recvfrom(2048)[0])
        b.sendto(wire.get_packet(2, 0, 40, request_id=2), h.address)
        got = [wire.parse(b.recvfrom(2048)[0])]
        assert (full.opcode, full.status) == (wire.Opcode.NACK, wire.Status.BUSY)  # the queue is full for singles
        assert got[0].opcode == wire.Opcode.DATA, f"the range was refused: {got[0]}"
        got += [wire.parse(b.recvfrom(2048)[0]) for _ in range(39)]
    assert {g.opcode for g in got} == {wire.Opcode.DATA} and sorted(g.frag_index for g in got) == list(range(40))


def test_a_holder_sends_a_turn_per_request_not_per_queued_answer() -> None:
    # Where the switches merge, a chunk's single GETs reach the holder spread over time, one
    # small job each: sent a turn per job, a request with 100 of them took 100 turns for every
    # one of another request's range (a replay of agent traffic: unshared chunks' p90 10 s
    # against plain's 5 s).  Each request gets a turn of ``send_quantum`` in the round.
    chunks = {1: os.urandom(200 * wire.FRAG_PAYLOAD), 2: os.urandom(40 * wire.FRAG_PAYLOAD)}
    hcfg = TransportConfig(port=0, rate_bytes_per_s=300e3, burst_bytes=4 << 10, send_quantum=4)
    with Transport(hcfg, Holder(_store(chunks))) as h, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        for i in range(1, 200, 2):  # 100 single GETs, none adjacent: 100 jobs
            a.sendto(wire.get_packet(1, i, 1, request_id=1), h.address)
            time.sleep(0.0005)  # spread, as a switch forwards them
        b.sendto(wire.get_packet(2, 0, 40, request_id=2), h.address)
        a.settimeout(5)
        b.settimeout(5)
        order: list[str] = []
        socks = {a: "a", b: "b"}
        while order.count("b") < 40:
            for s in select.select([a, b], [], [], 5)[0]:
                wire.parse(s.recvfrom(2048)[0])
                order.append(socks[s])
    # From b's first answer on, b's 40 go out a turn of 4 for every turn of a's, not one for every
    # 100 of a's jobs.  (Counted from there, not from the start: how many of a's went before b's
    # GET arrived depends on how busy the machine is.)
    during = order[order.index("b"):]
    assert during.count("a") <= 40 + 8, f"{during.count('a')} of a's answers while b's 40 went"


def test_answers_to_single_gets_that_waited_the_queue_bound_go_before_the_round() -> None:
    # A switch keeps a merged GET pending only so long (twice the queue bound in the demo); a
    # turn per request bounds a request's share, not how long its last answer waits, as
    # later requests join the round.  8 requesters at 3x the holder link: single GETs waited up to
    # 4.1 s at the holder and 32 pending slots expired.  The scheduler is driven by hand here.
    chunks = {1: os.urandom(60 * wire.FRAG_PAYLOAD), 2: os.urandom(8 * wire.FRAG_PAYLOAD)}
    t = Transport(TransportConfig(port=0, send_quantum=4, max_queue_s=1.0), Holder(_store(chunks)))
    with contextlib.ExitStack() as stack:
        hsock, a, b = (stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) for _ in range(3))
        for s in (hsock, a, b):
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        t._queue.sock = hsock
        singles = wire.parse(wire.get_packet(1, 1, 1, request_id=1))
        t._server.serve_get(singles, 1, 40, a.getsockname())  # a run of singles
        for rid in range(10, 20):  # ten other requests' ranges, queued after it
            t._server.serve_get(wire.parse(wire.get_packet(2, 0, 8, request_id=rid)), 0, 8, b.getsockname())
        now = time.monotonic()
        t._queue._send_lanes(t._queue.lanes, 40, now)  # a round: the singles' request gets one turn of 4
        t._queue._send_lanes(t._queue.lanes, 40, now + 1.5)  # they have waited past the bound: all of them first

        def count(s: socket.socket) -> int:
            s.setblocking(False)
            n = 0
            with contextlib.suppress(BlockingIOError):
                while s.recv(2048):
                    n += 1
            return n

        assert (count(a), count(b)) == (40, 40)


def test_a_request_whose_chunk_turns_pooled_keeps_asking_by_range() -> None:
    # Another requester's GET may have joined this request's answer at a switch, and that answer
    # ends only with the chunk's last fragment from the holder: asked for singly and served by a
    # pool, the rest would leave the joiners waiting until their slot expired (replayed sysprompt
    # trace, BMv2, pool mode).  So a request that asked by range keeps asking by range, within
    # the budget, however its chunk's hints change.
    data = {1: os.urandom(128 * wire.FRAG_PAYLOAD), 2: os.urandom(20 * wire.FRAG_PAYLOAD)}
    hints = FabricHints()
    hints.update(Hints({}, 60.0, True))  # the switches merge
    gets: list[wire.Header] = []

    def on_get(g: wire.Header, addr: Address, send: Send) -> None:
        gets.append(g)
        n = len(data[g.chunk_key]) // wire.FRAG_PAYLOAD
        if g.chunk_key == 1 and g.frag_index == 0:  # its first range: the chunk turns pooled while it is answered
            hints.update(Hints({1: Hint(GetPath.SERVABLE, len(data[1]))}, 60.0, True))
        for i in range(g.frag_index, min(g.frag_index + g.frag_count, n)):
            send(wire.data_packet(g.chunk_key, i, data[g.chunk_key], g.request_id, g.generation), addr)

    cfg = TransportConfig(port=0, max_inflight_fragments=32, retransmit_timeout_s=2.0, give_up_s=5.0)
    with _fake_holder(on_get, lambda send: None) as holder, Transport(cfg, hints=hints) as r:
        (res1,) = r.fetch([1], holder, timeout=5)
        (res2,) = r.fetch([2], holder, timeout=5)
    assert res1.ok and bytes(res1.data or b"") == data[1] and res2.ok and bytes(res2.data or b"") == data[2]
    asked1 = [(g.frag_index, g.frag_count) for g in gets if g.chunk_key == 1]
    assert asked1[0] == (0, 32) and all(n > 1 for _, n in asked1)  # ranges only, first the budget's 32
    assert sum(n for _, n in asked1) == 128 and r.stats()["retransmit_gets"] == 0
    assert r.stats()["requests_by_path"]["range"] == 2  # each counted on the path it ended on
