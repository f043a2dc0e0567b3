"""End to end in Mininet: a short Mooncake-format trace replayed in all three modes, nothing failed.

A trace of real-traffic shape (requests spread in time, a shared system prompt of three
blocks, each request with blocks of its own, some overlapping, some alone) goes through
real agents on a star of three requesters behind a 100 Mbit/s holder link.  In every mode
every request must get every chunk, each checked against the holder's bytes by the replay
(a mismatch counts as a failure), with the deadline the demo derives from the work; and the
arithmetic the demo reports (ideal bytes) must be self-consistent.  Needs root and Mininet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bmv2_topologies.network import mininet_available

REASON = mininet_available()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def _trace(path: Path) -> None:
    """12 requests over 3 s: the shared prompt (ids 0-2), then 1-3 blocks of each request's own."""
    from kvpool.trace import Trace, TraceRequest, write_jsonl

    reqs = []
    next_id = 100
    for i, at_ms in enumerate([0, 0, 40, 300, 320, 900, 1500, 1510, 1520, 2200, 2900, 3000]):
        own = tuple(range(next_id, next_id + 1 + i % 3))
        next_id += len(own)
        reqs.append(TraceRequest(at_ms, (3 + len(own)) * 512, 64, (0, 1, 2, *own)))
    write_jsonl(Trace.from_requests(reqs), path)


def test_a_short_trace_replays_in_every_mode_with_no_failure(tmp_path: Path) -> None:
    from bmv2_topologies.experiment.capture import holder_traffic
    from bmv2_topologies.experiment.config import MODES, DemoConfig
    from bmv2_topologies.experiment.load import DATA_FRAME_BYTES
    from bmv2_topologies.experiment.testbed import Testbed
    from bmv2_topologies.experiment.workload import build_workload

    trace = tmp_path / "trace.jsonl"
    _trace(trace)
    cfg = DemoConfig(requesters=3, trace=trace, max_requests=100, holder_mbps=100, out=tmp_path / "out")
    workload = build_workload(cfg)
    assert len(workload.requests) == 12 and len(workload.blobs) == 3 + sum(1 + i % 3 for i in range(12))
    bed = Testbed(cfg, workload)
    # The shared prompt is asked 12 times; what overlaps in time is what a switch can merge.
    assert bed.ideal_bytes < bed.requested_bytes and bed.offered.total_bytes == bed.requested_bytes
    assert bed.deadline_s >= 60
    with bed.running():
        for mode in MODES:
            res = bed.run_mode(mode)
            assert (res.requests, res.failed) == (12, 0), f"{mode}: {res.failed} of {res.requests} failed"
            assert len(res.deliver_ms) == 12 and all(ms > 0 for ms in res.deliver_ms)
            assert res.agents["requests_failed"] == 0
            assert res.ideal_bytes == (bed.requested_bytes if mode == "plain" else bed.ideal_bytes)
            # Plain carries every request's bytes (and a few GETs); no mode carries more than that twice.
            assert 0 < res.holder_bytes < 2 * bed.requested_bytes
            # The holder's own count of its DATA is what crossed its link (the capture agrees).
            captured = sum(holder_traffic(res.pcaps["h0"], bed.holder.address, res.window).data_out.values())
            assert 0 < res.holder_data_bytes < res.holder_bytes
            assert abs(captured * DATA_FRAME_BYTES - res.holder_data_bytes) <= 0.01 * res.holder_data_bytes, mode
            # The switch's port backlog was read from its own packet sockets all through the mode
            # (a sample every 0.1 s of a replay over 3 s).
            backlog = res.switch_backlog["s1"]
            assert backlog.samples >= 20 and 0 <= backlog.p50_bytes <= backlog.max_bytes, backlog
