"""The receive hot path on its own: DATA runs by request, the slow path's reasons, GETs read."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import numpy as np

from hostagent.receive import DataRing
from hostagent.transport_config import Counters
from kvpool import wire


@contextlib.contextmanager
def _udp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx.connect(rx.getsockname())
        yield tx, rx  # loopback queues a datagram on the receiver before ``send`` returns


def test_a_batch_is_split_into_runs_of_one_request_and_the_rest_takes_the_slow_path() -> None:
    payload = bytes(3 * wire.FRAG_PAYLOAD)
    runs: list[tuple[int, list[int]]] = []
    nacks: list[wire.Header] = []
    batches = []
    c = Counters()
    ring = DataRing(16, c, lambda rid, recs, now: runs.append((rid, recs["hdr"]["frag_index"].tolist())),
                    nacks.append, lambda: batches.append(1))
    with _udp_pair() as (tx, rx):
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


def test_the_holder_socket_yields_well_formed_gets_only_and_counts_the_rest() -> None:
    c = Counters()
    ring = DataRing(4, c, lambda rid, recs, now: None, lambda hdr: None, lambda: None)
    with _udp_pair() as (tx, rx):
        tx.send(wire.get_packet(3, 0, 8, request_id=9))
        tx.send(wire.data_packet(3, 0, bytes(10), request_id=9))
        tx.send(bytes(wire.DATA_DATAGRAM_LEN + 1))
        tx.send(wire.get_packet(3, 8, 1, request_id=9))
        gets = ring.receive_gets(rx)
    assert [(h.chunk_key, h.frag_index, h.frag_count) for h, _ in gets] == [(3, 0, 8), (3, 8, 1)]
    drops = c.drops_copy()
    assert drops["unexpected_opcode"] == 1 and drops["oversize"] == 1 and c.datagrams_received == 4
    assert np.all([addr == gets[0][1] for _, addr in gets])
