"""The receive hot path on its own: DATA runs by request, the slow path's reasons, GETs read."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from hostagent import receive
from hostagent.receive import DataRing
from hostagent.transport_config import Counters
from kvpool import wire
from kvpool.sockets import enable_gro, gso_cmsg, set_buffers


@contextlib.contextmanager
def _udp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx.connect(rx.getsockname())
        yield tx, rx  # loopback queues a datagram on the receiver before ``send`` returns


@pytest.mark.parametrize("gro", [False, True])
def test_a_batch_is_split_into_runs_of_one_request_and_the_rest_takes_the_slow_path(gro: bool) -> None:
    payload = bytes(3 * wire.FRAG_PAYLOAD)
    runs: list[tuple[int, list[int]]] = []
    nacks: list[wire.Header] = []
    batches = []
    c = Counters()
    ring = DataRing(16, c, lambda rid, recs, now: runs.append((rid, recs["hdr"]["frag_index"].tolist())),
                    nacks.append, lambda: batches.append(1))
    with _udp_pair() as (tx, rx):
        ring.gro = gro and enable_gro(rx)  # uncoalesced datagrams: the same either way
        for i in range(2):
            tx.send(wire.data_packet(7, i, payload, request_id=5))
        tx.send(b"garbage")
        tx.send(wire.data_packet(7, 2, payload, request_id=5))
        for i in range(2):
            tx.send(wire.data_packet(8, i, payload, request_id=6))
        tx.send(wire.nack_packet(8, wire.Status.BUSY, request_id=6))
        tx.send(wire.get_packet(8, 0, 4, request_id=6))  # a GET on the requester socket: not ours to take
        ring.receive_data(rx)
    assert runs == [(5, [0, 1]), (5, [2]), (6, [0, 1])]
    assert [(h.opcode, h.request_id, h.status) for h in nacks] == [(wire.Opcode.NACK, 6, wire.Status.BUSY)]
    assert batches == [1] and c.datagrams_received == 8 and c.recv_batches == 1 and c.data_received == 5
    assert c.drops_copy() == {"truncated": 1, "unexpected_opcode": 1}


@pytest.mark.parametrize("gro", [False, True])
def test_the_holder_socket_yields_well_formed_gets_only_and_counts_the_rest(gro: bool) -> None:
    c = Counters()
    ring = DataRing(4, c, lambda rid, recs, now: None, lambda hdr: None, lambda: None)
    with _udp_pair() as (tx, rx):
        ring.gets_gro = gro and enable_gro(rx)
        tx.send(wire.get_packet(3, 0, 8, request_id=9))
        tx.send(wire.data_packet(3, 0, bytes(10), request_id=9))
        tx.send(bytes(wire.DATA_DATAGRAM_LEN + 1))
        tx.send(wire.get_packet(3, 8, 1, request_id=9))
        gets = ring.receive_gets(rx)
    assert [(h.chunk_key, h.frag_index, h.frag_count) for h, _ in gets] == [(3, 0, 8), (3, 8, 1)]
    drops = c.drops_copy()
    assert drops["unexpected_opcode"] == 1 and drops["oversize"] == 1 and c.datagrams_received == 4
    assert np.all([addr == gets[0][1] for _, addr in gets])


def _gso_send(tx: socket.socket, datagrams: list[bytes]) -> None:
    """Send equal-size datagrams (the last may be shorter) as one segmented send; skip where refused."""
    seg = len(datagrams[0])
    try:
        tx.sendmsg([b"".join(datagrams)], gso_cmsg(seg))
    except OSError as exc:
        pytest.skip(f"the kernel refuses a segmented send here: {exc}")


def _gro_ring(n: int, c: Counters, runs: list[tuple[int, list[int]]], nacks: list[wire.Header]) -> DataRing:
    ring = DataRing(n, c, lambda rid, recs, now: runs.append((rid, recs["hdr"]["frag_index"].tolist())),
                    nacks.append, lambda: None)
    ring.gro = True
    return ring


def test_with_gro_a_coalesced_run_is_split_into_records_in_place_and_checked_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(receive, "GRO_BATCH", 8)  # small batches: a buffer runs past a batch's end
    payload = bytes(60 * wire.FRAG_PAYLOAD)
    runs: list[tuple[int, list[int]]] = []
    nacks: list[wire.Header] = []
    c = Counters()
    ring = _gro_ring(8, c, runs, nacks)
    with _udp_pair() as (tx, rx):
        if not enable_gro(rx):
            pytest.skip("the kernel refuses UDP GRO here")
        set_buffers(rx, 4 << 20)
        _gso_send(tx, [wire.data_packet(7, i, payload, request_id=5) for i in range(3)])  # one buffer of 3
        tx.send(wire.data_packet(7, 3, payload, request_id=5))  # a lone datagram
        # 20 records and a short last one (a cut DATA: the slow path turns it away).
        cut = wire.data_packet(8, 20, payload, request_id=6)[:100]
        _gso_send(tx, [wire.data_packet(8, i, payload, request_id=6) for i in range(20)] + [cut])
        # NACKs a holder sent back to back, coalesced: each one on its own.
        _gso_send(tx, [wire.nack_packet(9, wire.Status.BUSY, request_id=7, frag_index=i) for i in range(3)])
        _gso_send(tx, [wire.data_packet(8, 21 + i, payload, request_id=6) for i in range(30)])
        ring.receive_data(rx)
    # A batch of 8 records takes whole buffers: 4 records, then 21 (past the batch, within the
    # slack); the next one the 3 NACKs on the slow path and 30 records.
    stored = [i for rid, frags in runs if rid == 6 for i in frags]
    assert runs[0] == (5, [0, 1, 2, 3]) and stored == list(range(20)) + list(range(21, 51))
    assert [(h.chunk_key, h.frag_index, h.status) for h in nacks] == [(9, i, wire.Status.BUSY) for i in range(3)]
    assert c.data_received == 54 and c.datagrams_received == 4 + 21 + 3 + 30 and c.recv_batches == 2
    assert c.drops_copy() == {"bad_length": 1}


def test_with_gro_the_holder_socket_splits_coalesced_gets() -> None:
    c = Counters()
    ring = DataRing(4, c, lambda rid, recs, now: None, lambda hdr: None, lambda: None)
    ring.gets_gro = True
    with _udp_pair() as (tx, rx):
        if not enable_gro(rx):
            pytest.skip("the kernel refuses UDP GRO here")
        _gso_send(tx, [wire.get_packet(3, i, 1, request_id=9) for i in range(5)])
        tx.send(bytes(wire.DATA_DATAGRAM_LEN + 1))
        tx.send(wire.get_packet(3, 8, 1, request_id=9))
        gets = ring.receive_gets(rx)
    assert [(h.chunk_key, h.frag_index) for h, _ in gets] == [(3, i) for i in range(5)] + [(3, 8)]
    assert c.datagrams_received == 7 and c.drops_copy() == {"oversize": 1}
