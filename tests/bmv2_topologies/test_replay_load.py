"""Offered load, overlapping windows, ideal bytes and the replay's deadline: the arithmetic the demo prints."""

from __future__ import annotations

import pytest

from bmv2_topologies.experiment import load
from bmv2_topologies.experiment.workload import Request
from kvpool import wire

FRAME = 1490  # Ethernet + IPv4 + UDP + 40-byte header + 1408 payload bytes
A, B, C = 1, 2, 3
LEN = {A: 10 * wire.FRAG_PAYLOAD, B: 5 * wire.FRAG_PAYLOAD + 1, C: 1}  # 10, 6 and 1 fragments


def test_wire_bytes_count_data_frames() -> None:
    assert load.DATA_FRAME_BYTES == FRAME
    assert [load.wire_bytes(LEN[k]) for k in (A, B, C)] == [10 * FRAME, 6 * FRAME, FRAME]
    assert load.request_bytes(Request(0.0, 0, (A, B)), LEN) == 16 * FRAME


def test_offered_load_mean_and_busiest_window_against_capacity() -> None:
    reqs = [Request(0.0, 0, (A,)), Request(0.5, 1, (A,)), Request(0.9, 0, (B,)), Request(4.0, 1, (C,))]
    cap = 10 * FRAME  # bytes/s: one chunk A per second
    off = load.offered_load(reqs, LEN, cap, holder="h0", window_s=1.0)
    assert off.total_bytes == 27 * FRAME and off.span_s == 4.0
    assert off.mean_bps == pytest.approx(27 * FRAME / 4.0)
    assert off.peak_bytes == 26 * FRAME  # the first three arrive within one second
    assert off.peak_bps / cap == pytest.approx(2.6) and off.work_s == pytest.approx(2.7)
    line = off.line()
    assert "h0" in line and "2.60x" in line and "0.68x" in line
    # Everything at once: the mean is over one window, not over a zero span.
    once = load.offered_load([Request(3.0, 0, (A,)), Request(3.0, 1, (A,))], LEN, cap)
    assert once.span_s == 0.0 and once.mean_bps == once.peak_bps == 20 * FRAME
    with pytest.raises(ValueError):
        load.offered_load(reqs, LEN, 0.0)


def test_overlapping_windows_chain_and_split() -> None:
    assert load.overlapping_windows([]) == 0
    assert load.overlapping_windows([(0, 1), (0.5, 2), (1.9, 3)]) == 1  # a chain is one window
    assert load.overlapping_windows([(0, 1), (1.5, 2), (1.8, 2.5), (3, 4)]) == 3
    assert load.overlapping_windows([(2, 3), (0, 1)]) == 2  # order of the input does not matter


def test_ideal_bytes_carry_each_chunk_once_per_overlapping_window() -> None:
    cap = 10 * FRAME  # request for A alone: a 1 s window
    reqs = [
        Request(0.0, 0, (A,)),  # window [0, 1]
        Request(0.5, 1, (A,)),  # [0.5, 1.5]: overlaps the first, A crosses once for both
        Request(2.0, 0, (A, B)),  # [2, 3.6]: a new window for A; B's first
        Request(3.0, 1, (B,)),  # [3, 3.6]: inside the last one, B shared
        Request(9.0, 0, (C,)),
    ]
    start, end = load.windows(reqs, LEN, cap)[2]
    assert (start, end) == pytest.approx((2.0, 3.6))
    ideal = load.ideal_bytes(reqs, LEN, cap)
    assert ideal == 2 * 10 * FRAME + 6 * FRAME + FRAME
    requested = load.requested_bytes(reqs, LEN)
    assert requested == 3 * 10 * FRAME + 2 * 6 * FRAME + FRAME
    assert load.ideal_for_mode("plain", requested, ideal) == requested  # the switch merges nothing
    assert load.ideal_for_mode("multicast", requested, ideal) == ideal == load.ideal_for_mode("pool", requested, ideal)
    # A chunk listed twice by one request still costs that request once.
    assert load.ideal_bytes([Request(0.0, 0, (C, C))], LEN, cap) == FRAME


def test_default_deadline_is_far_beyond_the_work_and_within_the_api_limit() -> None:
    assert load.default_deadline_s(0, 1e6, 0.0) == load.MIN_DEADLINE_S
    assert load.default_deadline_s(20_000_000, 1e6, 15.0) == pytest.approx(215.0)  # 10 x 20 s + the span
    assert load.default_deadline_s(10**12, 1e6, 0.0) == load.MAX_DEADLINE_S


def test_shares_split_each_request_by_holder_and_the_ideal_is_per_link() -> None:
    reqs = [Request(0.0, 0, (A, B)), Request(0.1, 1, (A, C)), Request(9.0, 0, (B,))]
    holder = {A: "h0", B: "h1", C: "h0"}
    parts = load.shares(reqs, holder.__getitem__)
    assert parts == {"h0": [load.Share(0.0, (A,)), load.Share(0.1, (A, C))],
                     "h1": [load.Share(0.0, (B,)), load.Share(9.0, (B,))]}
    cap = 10 * FRAME
    per = {h: load.offered_load(p, LEN, cap, holder=h) for h, p in parts.items()}
    assert sum(o.total_bytes for o in per.values()) == load.requested_bytes(reqs, LEN)
    # h0: A once (the two requests overlap) and C; h1: B twice (9 s apart, far beyond its window).
    assert load.ideal_bytes(parts["h0"], LEN, cap) == 11 * FRAME
    assert load.ideal_bytes(parts["h1"], LEN, cap) == 12 * FRAME
