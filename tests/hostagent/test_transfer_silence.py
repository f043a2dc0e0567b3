"""A request that hears nothing of its own while its holder streams to others (``Transfers.timers``).

Driven on a fake clock, with the holder's progress refreshed at every check as a holder
streaming to other requesters would: only the request's own silence counts.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from hostagent.hints import FabricHints
from hostagent.request_state import Flights, Request
from hostagent.transfer import Transfers
from hostagent.transport_config import Counters, FetchResult, TransportConfig
from kvpool import wire


@pytest.fixture
def sink() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(1)
        yield s


def _gets(s: socket.socket) -> list[wire.Header]:
    out = []
    s.setblocking(False)
    try:
        while True:
            out.append(wire.unpack_header(s.recv(2048)))
    except BlockingIOError:
        return out
    finally:
        s.setblocking(True)


@pytest.mark.parametrize(("rto", "max_queue", "patience"), [(2.0, 1.0, 2.0), (0.2, 1.0, 1.0)])
def test_a_request_silent_while_its_holder_streams_re_asks_after_a_timeout_never_under_the_queue_bound(
        sink: socket.socket, monkeypatch: pytest.MonkeyPatch, rto: float, max_queue: float, patience: float) -> None:
    # A holder sends its queued answers in turns, so a request that hears nothing for the queue
    # bound (and a retransmit timeout) was lost: a GET a switch absorbed into an answer whose
    # last fragment never came hears nothing at all.  Its holder's progress says nothing.
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    cfg = TransportConfig(port=0, retransmit_timeout_s=rto, max_queue_s=max_queue)
    c = Counters()
    tr = Transfers(cfg, c, FabricHints(), Flights(False))
    assert tr.own_silence_s == patience
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
        tr.sock = out
        r = Request(rid=7, key=42, holder=sink.getsockname(), generation=0, result=FetchResult(42),
                    done=threading.Event(), deadline=clock[0] + 60)
        tr.begin(r, 16, clock[0])
        assert [(h.frag_index, h.frag_count, h.flags) for h in _gets(sink)] == [(0, 16, 0)]
        start = clock[0]
        while clock[0] < start + 0.95 * patience:
            clock[0] += 0.05
            tr._holder_progress[r.holder] = clock[0]  # it streams to others
            tr.timers()
        assert c.retransmit_gets == 0 and not _gets(sink)
        clock[0] = start + patience + 0.01
        tr._holder_progress[r.holder] = clock[0]
        tr.timers()
    again = _gets(sink)
    assert [(h.frag_index, h.frag_count) for h in again] == [(0, 16)]
    assert again[0].flags & wire.Flag.RETRANSMIT
    assert c.stall_retransmits == 1 and r.result.retransmit_rounds == 1
