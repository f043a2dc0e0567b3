"""The holder's send side on its own: what goes first, a turn per request, pushes last, pooled arrays."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from hostagent.send_queue import Lanes, RecordPool, SendJob, SendQueue
from hostagent.transport_config import Address, Counters, TransportConfig
from kvpool import wire
from kvpool.sockets import set_buffers


def _job(addr: Address, rid: int, first: int, count: int, *, push: bool = False) -> SendJob:
    recs = np.zeros(count, dtype=wire.DATA_PACKET_DTYPE)
    recs["hdr"]["request_id"] = rid
    recs["hdr"]["frag_index"] = np.arange(first, first + count)
    get = None if push else wire.parse(wire.get_packet(1, first, count, request_id=rid))
    return SendJob(recs, recs.view(np.uint8).data, addr, 0, count, None, 1, get, first)


@contextlib.contextmanager
def _queue(**knobs: float) -> Iterator[tuple[SendQueue, socket.socket]]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        tx.bind(("127.0.0.1", 0))
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        q = SendQueue(TransportConfig(port=0, **knobs), Counters())  # type: ignore[arg-type]
        q.sock = tx
        yield q, rx


def _received(rx: socket.socket) -> list[tuple[int, int]]:
    """``(request id, fragment)`` of each DATA on ``rx``, in order."""
    out = []
    with contextlib.suppress(BlockingIOError):
        while True:
            hdr = np.frombuffer(rx.recv(wire.DATA_DATAGRAM_LEN), dtype=wire.DATA_PACKET_DTYPE)["hdr"][0]
            out.append((int(hdr["request_id"]), int(hdr["frag_index"])))
    return out


def test_a_probe_goes_first_requests_take_turns_and_a_push_waits_for_idle_time() -> None:
    with _queue(send_quantum=2) as (q, rx):
        to = rx.getsockname()
        q.add_job(_job(to, 9, 0, 3, push=True))
        q.add_job(_job(to, 1, 0, 4))
        q.add_job(_job(to, 2, 10, 3))
        q.add_job(_job(to, 3, 0, 1))  # a lone fragment 0: a length probe
        assert len(q) == 4 and q.queued == 11 and q.answers_queued() == 8 and q.range_queued == 7
        assert not q.send()
        got = _received(rx)
        assert got[0] == (3, 0)  # the probe before the queued answers
        assert got[1:8] == [(1, 0), (1, 1), (2, 10), (2, 11), (1, 2), (1, 3), (2, 12)]  # turns of 2
        assert got[8:] == [(9, 0), (9, 1), (9, 2)]  # the push only once no answer could go
        assert q.queued == 0 and not q.pending() and q._c.datagrams_sent == 11


def test_pacing_sends_no_more_than_the_bucket_holds() -> None:
    rate = 1e6
    with _queue(rate_bytes_per_s=rate, burst_bytes=4 * wire.DATA_DATAGRAM_LEN) as (q, rx):
        q.add_job(_job(rx.getsockname(), 1, 0, 50))
        q.send()
        assert len(_received(rx)) == 4  # the bucket's depth, no more
        assert q.pending() and q.pace_wait_ms() >= 1


def test_lanes_keep_each_requests_answers_in_order_and_leave_the_round_when_empty() -> None:
    lanes = Lanes()
    a, b = ("127.0.0.1", 1), ("127.0.0.1", 2)
    j1, j2, j3 = _job(a, 1, 0, 2), _job(b, 2, 0, 2), _job(a, 1, 2, 2)
    for j in (j1, j2, j3):
        lanes.append(j)
    assert list(lanes.order) == [(a, 1), (b, 2)] and len(lanes) == 3
    carried = _job(a, 1, 9, 1)
    lanes.append(carried, front=True)
    assert list(lanes.by_owner[(a, 1)]) == [carried, j1, j3]
    for j in (carried, j1, j3):
        lanes.remove(j)
    assert list(lanes.order) == [(b, 2)] and bool(lanes)


def test_the_record_pool_gives_a_finished_jobs_array_to_the_next_of_its_size() -> None:
    pool = RecordPool()
    first = pool.alloc(100)
    assert first.size == 128 and pool.last is first
    job = SendJob(first[:100], first[:100].view(np.uint8).data, ("127.0.0.1", 1), 0, 100, first)
    pool.release(job)
    assert job.base is None
    assert pool.alloc(120) is first  # reused, not fresh pages
    assert pool.alloc(120) is not first


def test_with_gso_runs_go_as_segmented_sends_of_the_same_datagrams_in_the_same_order() -> None:
    with _queue(send_quantum=64) as (q, rx):
        q.use_gso(q.sock)  # type: ignore[arg-type]
        if q.gso_segments == 1:
            pytest.skip(f"the kernel refuses UDP GSO here: {q.gso_fallback}")
        set_buffers(rx, 4 << 20)  # 103 datagrams at once overflow a default receive buffer
        to = rx.getsockname()
        q.add_job(_job(to, 1, 0, 100))
        q.add_job(_job(to, 2, 5, 3))
        assert not q.send()
        got = _received(rx)  # rx has no GRO: the kernel hands it the datagrams one by one
        assert got == ([(1, i) for i in range(64)] + [(2, 5), (2, 6), (2, 7)] + [(1, i) for i in range(64, 100)])
        c = q._c
        assert c.datagrams_sent == 103 and c.bytes_sent == 103 * wire.DATA_DATAGRAM_LEN
        assert c.send_calls == 2 + 1 + 1  # 64 as 32 + 32, the 3 in one send, the last 36 in one
        assert q.gso_fallback == ""


def test_pacing_bounds_a_segmented_send_too() -> None:
    with _queue(rate_bytes_per_s=1e6, burst_bytes=4 * wire.DATA_DATAGRAM_LEN) as (q, rx):
        q.use_gso(q.sock)  # type: ignore[arg-type]
        q.add_job(_job(rx.getsockname(), 1, 0, 50))
        q.send()
        assert len(_received(rx)) == 4 and q._c.send_calls <= 1 + (q.gso_segments == 1) * 3


class _RefusingSocket:
    """A socket whose segmented sends fail as a path that cannot take them makes them fail."""

    def __init__(self, sock: socket.socket, err: int) -> None:
        self._sock, self._err, self.refused = sock, err, 0

    def sendto(self, data: memoryview, addr: Address) -> int:
        return self._sock.sendto(data, addr)

    def sendmsg(self, buffers: list[memoryview], ancdata: object, flags: int, addr: Address) -> int:
        self.refused += 1
        raise OSError(self._err, os.strerror(self._err))


@pytest.mark.parametrize("err", [errno.EIO, errno.EINVAL, errno.EMSGSIZE])
def test_a_refused_segmented_send_falls_back_to_one_send_per_datagram_once_and_loses_nothing(
        err: int, caplog: pytest.LogCaptureFixture) -> None:
    with _queue(send_quantum=16) as (q, rx):
        q.gso_segments = 44  # as ``use_gso`` leaves it where the kernel takes the option
        fake = _RefusingSocket(q.sock, err)  # type: ignore[arg-type]
        q.sock = fake  # type: ignore[assignment]
        set_buffers(rx, 4 << 20)
        to = rx.getsockname()
        q.add_job(_job(to, 1, 0, 40))
        q.add_job(_job(to, 2, 0, 40))
        with caplog.at_level(logging.WARNING, logger="kvpool.transport"):
            assert not q.send()
        got = _received(rx)
        assert sorted(got) == sorted([(1, i) for i in range(40)] + [(2, i) for i in range(40)])
        assert fake.refused == 1 and q.gso_segments == 1 and os.strerror(err) in q.gso_fallback
        assert q._c.send_errors == 0 and q._c.datagrams_sent == 80 and q._c.send_calls == 80
        assert sum("UDP GSO off" in r.message for r in caplog.records) == 1


def test_a_send_that_fails_for_one_datagram_too_is_the_peers_fault_and_keeps_gso_on() -> None:
    with _queue(send_quantum=16) as (q, _rx):
        q.gso_segments = 44
        q.add_job(_job(("127.0.0.1", 0), 1, 0, 10))  # port 0: every send fails with EINVAL
        q.send()
        assert q.gso_segments == 44 and q.gso_fallback == "" and q._c.send_errors == 1
        assert q.queued == 0 and q._c.datagrams_sent == 0  # the job abandoned, as one to an unreachable peer
