"""``kvpool why``: per-request rows a replay writes, the breakdown table per mode, and one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bmv2_topologies.experiment.report import ModeResult
from bmv2_topologies.experiment.why import TIMING_FILE, WhyError, dominant_line, render, request_row, timing_document
from hostagent.timing import FetchTiming, summarize
from kvpool import cli


def _timing(queue: float, first: float, stream: float, *, busy: float = 0.0, rto: float = 0.0, rounds: int = 0,
            fragments: int = 100, coalesced: int = 0, served: int = 0) -> dict[str, Any]:
    t = FetchTiming(total_s=queue + first + stream, queue_s=queue, first_byte_s=first, stream_s=stream, busy_s=busy,
                    busy=2 if busy else 0, rto_s=rto, retransmit_rounds=rounds, fragments=fragments,
                    coalesced=coalesced, switch_served=served)
    return summarize([t])


def _results(tmp_path: Path) -> Path:
    plain = ModeResult("plain")
    plain.request_timing = [request_row(0.0, 0, 1, 110.0, _timing(0.01, 0.02, 0.08)),
                            request_row(0.5, 1, 1, 330.0, _timing(0.03, 0.06, 0.24)),
                            request_row(1.0, 0, 1, float("nan"), {})]
    plain.holder_wait = {"h0": {"answers": 4, "queue_sum_s": 0.2, "queue_p50_s": 0.04, "queue_p99_s": 0.1,
                                "queue_max_s": 0.1, "held": 0, "hold_sum_s": 0.0, "buckets": []}}
    multicast = ModeResult("multicast")
    # The second request spends most of its time refused while it waits for its first byte.
    multicast.request_timing = [request_row(0.0, 0, 2, 200.0, _timing(0.0, 0.15, 0.05, coalesced=50)),
                                request_row(0.5, 1, 2, 900.0, _timing(0.0, 0.8, 0.1, busy=0.7, rto=0.05, rounds=1,
                                                                      coalesced=30, served=10))]
    multicast.holder_wait = {"h0": {"answers": 2, "queue_sum_s": 0.02, "queue_p50_s": 0.01, "queue_p99_s": 0.01,
                                    "queue_max_s": 0.01, "held": 2, "hold_sum_s": 0.2, "buckets": []}}
    (tmp_path / TIMING_FILE).write_text(json.dumps(timing_document([plain, multicast])))
    backlog = {"s1": {"p50_bytes": 2_500_000, "max_bytes": 9_000_000, "samples": 40}}
    (tmp_path / "results.json").write_text(json.dumps({"plain": {"switch_backlog": {}},
                                                       "multicast": {"switch_backlog": backlog}}))
    return tmp_path


def test_a_request_row_carries_its_latency_and_its_chunks_timing() -> None:
    row = request_row(1.23456, 3, 4, 812.345, {"chunks": 4, "total_s": 2.5})
    assert row == {"at_s": 1.235, "requester": 3, "chunks_asked": 4, "ms": 812.35, "failed": False,
                   "chunks": 4, "total_s": 2.5}
    assert request_row(0.0, 0, 1, math.nan, {})["ms"] is None and request_row(0.0, 0, 1, math.nan, {})["failed"]


def test_the_table_has_each_modes_numbers(tmp_path: Path) -> None:
    text = render(_results(tmp_path))
    plain, multicast = text.split("\n\n")
    # plain: two requests done (110 and 330 ms), one failed; p50 and p99 as the demo table ranks them.
    assert plain.startswith("plain: 3 requests, 1 failed; total p50 330.0 ms, p99 330.0 ms")
    lines = {line.split("  ")[1].strip(): line.split() for line in plain.splitlines()[1:] if line.startswith("  ")}
    # Means and p99 (ms) per request; shares of the phases summed (0.04 + 0.08 + 0.32 = 0.44 s).
    assert lines["queue at requester"][-3:] == ["20.0", "30.0", "9%"]
    assert lines["wait for first byte"][-3:] == ["40.0", "60.0", "18%"]
    assert lines["streaming"][-3:] == ["160.0", "240.0", "73%"]
    assert lines["BUSY waits (inside)"][-3:] == ["0.0", "0.0", "0%"]
    assert "holder queue h0: 4 answers waited p50 40.0 ms, p99 100.0 ms, mean 50.0 ms" in plain
    assert "switch backlog" not in plain
    assert "dominant: streaming, 73% of the chunk time (wait for first byte 18%, queue at requester 9%)" in plain
    assert multicast.startswith("multicast: 2 requests, 0 failed; total p50 900.0 ms, p99 900.0 ms")
    mlines = {line.split("  ")[1].strip(): line.split() for line in multicast.splitlines()[1:]
              if line.startswith("  ")}
    assert mlines["BUSY waits (inside)"][-3:] == ["350.0", "700.0", "64%"]
    assert mlines["RTO waits (inside)"][-3:] == ["25.0", "50.0", "5%"]
    assert mlines["retransmit rounds (count)"][-2:] == ["0.50", "1"]
    assert mlines["BUSY NACKs (count)"][-2:] == ["1.00", "2"]
    assert "fragments: 40.0% coalesced replicas, 5.0% switch-served, 0.0% duplicates (of 200 stored)" in multicast
    assert "2 held, 100.0 ms on average" in multicast
    assert "switch backlog s1: p50 2.5 MB, max 9.0 MB at its ports" in multicast
    assert ("dominant: wait for first byte, 86% of the chunk time (streaming 14%, queue at requester 0%); "
            "inside them BUSY waits 64%, RTO waits 5%: mostly BUSY waits") in multicast


def test_the_document_names_a_file_too_and_reads_without_results_json(tmp_path: Path) -> None:
    run = _results(tmp_path)
    assert render(run / TIMING_FILE) == render(run)
    (run / "results.json").unlink()
    assert "switch backlog" not in render(run)
    assert dominant_line([]).startswith("dominant: nothing to say")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_command_prints_the_breakdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli(["why", str(_results(tmp_path))], capsys)
    assert rc == 0 and err == "" and out.startswith("plain: 3 requests") and "multicast: 2 requests" in out
    with pytest.raises(SystemExit) as ex:
        cli.main(["why", "--help"])
    assert ex.value.code == 0
    assert "RESULTS_DIR" in capsys.readouterr().out


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "missing", "no such directory: "),
    (lambda d: (d / "file.txt").write_text("x") and d / "file.txt", "is not a directory"),
    (lambda d: d, f"has no {TIMING_FILE}"),
    (lambda d: (d / TIMING_FILE).write_text("{not json") and d, f"{TIMING_FILE} is not valid JSON: "),
    (lambda d: (d / TIMING_FILE).write_text('{"modes": {}}') and d, "is not valid: no modes"),
    (lambda d: (d / TIMING_FILE).write_text('{"modes": {"plain": {"requests": 3}}}') and d,
     "mode 'plain' has no list of request rows"),
    (lambda d: ((d / TIMING_FILE).write_text('{"modes": {"plain": {"requests": []}}}')
                and (d / "results.json").write_text("[1") and d), "results.json is not valid JSON"),
])
def test_a_bad_directory_is_one_line_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any,
                                               message: str) -> None:
    rc, out, err = _cli(["why", str(make(tmp_path))], capsys)
    assert rc == 1 and out == "" and err.startswith("kvpool why: ") and message in err
    assert err.count("\n") == 1
    with pytest.raises(WhyError):
        render(make(tmp_path))


def test_a_replay_records_each_requests_timing_summed_over_its_holders(monkeypatch: pytest.MonkeyPatch) -> None:
    from bmv2_topologies.experiment import testbed
    from bmv2_topologies.experiment.config import DemoConfig
    from bmv2_topologies.experiment.workload import build_workload

    cfg = DemoConfig(requesters=2, holders=2, waves=1, hot_blocks=3, layers=1, target="model")
    workload = build_workload(cfg)
    asked: list[tuple[str, str]] = []

    class FakeClient:  # the agents' API: each share answered with a timing of its own
        def __init__(self, url: str, timeout: float = 60.0) -> None:
            self.url = url

        def fetch_chunks_timed(self, keys: list[int], holder: str, *, timeout: float,
                               local: bool) -> tuple[list[int], list[bytes], None, dict[str, Any]]:
            asked.append((self.url, holder))
            timings = [FetchTiming(total_s=0.5, queue_s=0.1, first_byte_s=0.2, stream_s=0.2, busy=1, busy_s=0.05,
                                   fragments=7, coalesced=2) for _ in keys]
            return list(keys), [workload.blobs[k] for k in keys], None, summarize(timings)

    monkeypatch.setattr(testbed, "AgentClient", FakeClient)
    bed = testbed.Testbed(cfg, workload)
    result = ModeResult("plain")
    bed._replay(result, None)
    assert result.requests == 2 and result.failed == 0 and len(asked) == 4  # 2 requests x 2 holders
    doc = timing_document([result])
    rows = doc["modes"]["plain"]["requests"]
    assert [row["requester"] for row in rows] == [0, 1]
    for row in rows:
        # Three chunks over two holders (2 + 1): the shares' sums added up.
        assert row["chunks_asked"] == row["chunks"] == 3 and row["fragments"] == 21 and row["coalesced"] == 6
        assert row["total_s"] == pytest.approx(1.5) and row["busy"] == 3 and row["slowest_s"] == 0.5
        assert row["failed"] is False and row["ms"] is not None and row["ms"] >= 0
