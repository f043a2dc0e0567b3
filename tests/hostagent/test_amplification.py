"""Amplification by a holder: bytes it sends for one GET whose source it cannot verify, before and after the gate.

A GET names where its answer goes (its UDP source), and UDP does not check that: the issue's
fault test made a holder send 207,480 bytes to another host for one 74-byte range GET with
a forged source. Here the holder's ``Transport`` on loopback answers a range GET for 4096
fragments of a large chunk; the socket that sent it stands for the victim the source
names. Loopback is normally trusted (it cannot be forged from elsewhere), so the gate here
trusts it not, to play the forged source. Printed: bytes to the victim per byte of GET,
without the gate (as before), with it for a source it cannot verify (nothing), and for a
registered source (one window), then a flood from a registered source (its budget).
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from hostagent.gate import RequesterGate
from hostagent.holder import Holder
from hostagent.tiers import HostTier, TieredStore
from hostagent.transport import Transport, TransportConfig
from kvpool import wire

KEY = 0xA3_0000_0001
CHUNK = os.urandom(4096 * wire.FRAG_PAYLOAD)  # 4096 fragments, the largest range one GET may ask
WINDOW = 64


def _holder(gate: RequesterGate | None) -> Transport:
    store = TieredStore([HostTier(1 << 30)])
    store.put(KEY, CHUNK)
    return Transport(TransportConfig(port=0, max_fragments_per_get=4096), Holder(store), gate)


def _victim_bytes(holder: Transport, gets: int = 1, quiet_s: float = 1.0) -> tuple[int, int, int, float]:
    """Send ``gets`` range GETs from a fresh socket: (bytes of GETs, DATA bytes and NACKs that socket got, seconds
    from the first GET to the last answer).

    Receives until the socket has been quiet for ``quiet_s``: the end of the answer, not a timing test.
    """
    get = wire.get_packet(KEY, 0, 4096, request_id=1)
    data = nacks = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        s.bind(("127.0.0.1", 0))
        start = last = time.monotonic()
        for _ in range(gets):
            s.sendto(get, holder.address)
        s.settimeout(quiet_s)
        while True:
            try:
                pkt = s.recv(4096)
            except TimeoutError:
                break
            last = time.monotonic()
            if wire.parse(pkt).opcode == wire.Opcode.NACK:
                nacks += 1
            else:
                data += len(pkt)
    return gets * len(get), data, nacks, last - start


def test_a_forged_get_is_not_amplified(capsys: pytest.CaptureFixture[str]) -> None:
    with _holder(None) as open_holder:
        sent, before, _, _ = _victim_bytes(open_holder)
    rate = 10.0  # fragments per second per source
    gate = RequesterGate(window_fragments=WINDOW, rate_fragments_per_s=rate, burst_fragments=2 * WINDOW,
                         trust_loopback=False)
    with _holder(gate) as holder:
        _, unverified, nacks, _ = _victim_bytes(holder)
        assert (unverified, nacks) == (0, 0)  # a source it cannot verify gets nothing, not even a NACK
        assert holder.stats()["drops"].get("unverified_source") == 1
        gate.set_registered(["127.0.0.1"])
        _, registered, _, _ = _victim_bytes(holder)
        _, flood, busy, took = _victim_bytes(holder, gets=50)
    assert before == 4096 * wire.DATA_DATAGRAM_LEN  # without a gate: every fragment asked for
    assert registered == WINDOW * wire.DATA_DATAGRAM_LEN  # a registered source: one window
    # A flood from a registered source: the burst (refilled during the quiet second before) and
    # what the rate adds while it lasts, the rest answered BUSY (one small NACK each).
    budget = 2 * WINDOW + int(rate * (took + 1.0)) + 1
    assert flood <= budget * wire.DATA_DATAGRAM_LEN and busy > 0
    with capsys.disabled():
        print(f"\namplification of one {sent}-byte range GET for 4096 fragments (bytes sent to its source / "
              f"bytes of the GET):\n  before (no gate): {before / sent:,.0f}x ({before:,} bytes)\n"
              f"  after, forged or unregistered source: {unverified / sent:,.0f}x ({unverified} bytes)\n"
              f"  after, registered source: {registered / sent:,.0f}x (one window of {WINDOW} fragments)\n"
              f"  after, 50 GETs from a registered source: {flood / (50 * sent):,.1f}x "
              f"({busy} answered BUSY: its budget of {2 * WINDOW} fragments)")


def test_a_get_over_its_sources_budget_is_told_when_to_come_back() -> None:
    # Without a retry hint the requester waits a whole retransmit timeout (2.2 s in the demo),
    # and so does every GET a switch merged into the refused one.
    rate = 0.2  # one fragment in 5 s: the budget stays spent however slowly the window goes out
    gate = RequesterGate(window_fragments=WINDOW, rate_fragments_per_s=rate, burst_fragments=WINDOW,
                         allow=["127.0.0.1"], trust_loopback=False)
    with _holder(gate) as holder, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        s.bind(("127.0.0.1", 0))
        s.settimeout(5.0)
        s.sendto(wire.get_packet(KEY, 0, WINDOW, request_id=1), holder.address)  # spends the burst
        # Not adjacent to the first: the holder would merge the two into one run, clamped to the window.
        s.sendto(wire.get_packet(KEY, 2 * WINDOW, 1, request_id=1), holder.address)
        nacks: list[wire.Header] = []
        while not nacks:
            hdr = wire.parse(s.recv(4096))
            if hdr.opcode == wire.Opcode.NACK:
                nacks.append(hdr)
    assert nacks[0].status == wire.Status.BUSY and nacks[0].frag_index == 2 * WINDOW
    # One fragment at 0.2/s: back in 5 s, less what refilled while the window went out.
    assert 1_000_000 <= nacks[0].chunk_len <= 5_000_000


def test_a_range_cut_short_of_one_fragment_costs_only_what_was_sent() -> None:
    # A range GET granted all but one fragment is cut by one more (one refused fragment reads as a
    # conversion on the wire); the fragment cut goes back to the budget. Kept, every such GET cost
    # a fragment for nothing, so a source whose 2-fragment GETs kept coming back spent its refill on them.
    gate = RequesterGate(window_fragments=WINDOW, rate_fragments_per_s=0.01, burst_fragments=WINDOW,
                         allow=["127.0.0.1"], trust_loopback=False)
    with _holder(gate) as holder, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        s.bind(("127.0.0.1", 0))
        s.settimeout(5.0)

        def ask(first: int, count: int) -> tuple[int, list[wire.Header]]:
            """DATA and NACKs for one range GET, read until its ``count`` fragments are accounted for."""
            s.sendto(wire.get_packet(KEY, first, count, request_id=1), holder.address)
            data, nacks = 0, list[wire.Header]()
            while data + sum(n.frag_count for n in nacks) < count:
                hdr = wire.parse(s.recv(4096))
                if hdr.opcode == wire.Opcode.NACK:
                    nacks.append(hdr)
                else:
                    data += 1
            return data, nacks

        assert ask(0, WINDOW - 4) == (WINDOW - 4, [])  # 4 fragments of budget left
        data, nacks = ask(1000, 5)  # 4 granted, cut to 3: 2 refused
        assert data == 3 and [(n.status, n.frag_index, n.frag_count) for n in nacks] == [(wire.Status.BUSY, 1003, 2)]
        assert ask(2000, 1) == (1, [])  # the fragment cut was given back
