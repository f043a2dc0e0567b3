"""scripts/bench_replay.py without a network: the grid, the tool trace it writes, how a cell is judged, the last line.

Cells are judged from the JSON ``kvpool demo --json`` prints; ``--resume`` reads results
already in ``--out``, which is how these tests feed the bench without running Mininet.
"""

from __future__ import annotations

import json
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bmv2_topologies.experiment.report import percentile
from kvpool import workloads
from kvpool.trace import read_jsonl
from tests.paths import SCRIPTS

SCRIPT = SCRIPTS / "bench_replay.py"
BENCH = runpy.run_path(str(SCRIPT))


def _mode(p50: float, p99: float, holder: int, ideal: int, failed: int = 0) -> dict[str, Any]:
    return {"deliver_p50_ms": p50, "deliver_p99_ms": p99, "holder_bytes": holder, "ideal_bytes": ideal,
            "requested_bytes": 1000, "failed": failed}


def _doc(mc: dict[str, Any], pool: dict[str, Any], plain_failed: int = 0) -> dict[str, Any]:
    return {"offered": {"mean_bps": 2.0, "capacity_bps": 4.0}, "plain": _mode(100, 200, 1000, 1000, plain_failed),
            "multicast": mc, "pool": pool}


def test_the_grid_is_every_combination_and_a_subset_is_one_flag_away(capsys: pytest.CaptureFixture[str]) -> None:
    assert BENCH["main"](["--list"]) == 0
    cells = capsys.readouterr().out.split()
    assert len(cells) == 48 and "conversation-r48-n4-t0.25-m10" in cells and "tool-r200-n8-t1-m100" in cells
    assert "sysprompt-r48-n4-t0.25-m10" in cells and "sysprompt-r200-n8-t1-m100" in cells
    assert BENCH["main"](["--list", "--traces", "tool", "--requests", "48", "--requesters", "8", "--time-scales", "1",
                          "--mbps", "100"]) == 0
    assert capsys.readouterr().out.split() == ["tool-r48-n8-t1-m100"]
    assert BENCH["main"](["--list", "--traces", "chat"]) == 2
    assert "unknown 'chat'" in capsys.readouterr().err


def test_the_tool_trace_is_the_workload_generators(tmp_path: Path) -> None:
    path = tmp_path / "tool.jsonl"
    BENCH["make_tool_trace"](path, 60, 3)
    got, want = read_jsonl(path), workloads.build("tool", n_requests=60, seed=3)
    assert [r.hash_ids for r in got] == [r.hash_ids for r in want] and len(got) == 60


def test_the_sysprompt_trace_is_the_workload_generators(tmp_path: Path) -> None:
    path = tmp_path / "sysprompt.jsonl"
    BENCH["make_trace"]("sysprompt", path, 48, 0)
    got, want = read_jsonl(path), workloads.build("sysprompt", n_requests=48, seed=0)
    assert [r.hash_ids for r in got] == [r.hash_ids for r in want] and len(got) == 48


def test_a_cell_is_judged_against_plain_in_the_same_run() -> None:
    judge = BENCH["judge"]
    j = judge(_doc(_mode(104, 150, 800, 600), _mode(90, 210, 500, 600, failed=1)))
    assert j["failed"] == 1
    assert j["multicast"]["slowdown"] == pytest.approx(1.04)  # p50: 104 / 100
    assert j["pool"]["slowdown"] == pytest.approx(1.05)  # p99: 210 / 200
    assert j["multicast"]["saved_of_ideal"] == pytest.approx(0.5)  # saved 20% where the ideal saves 40%
    assert j["pool"]["saved_of_ideal"] == pytest.approx(1.25)
    nothing = judge(_doc(_mode(100, 200, 990, 995), _mode(100, 200, 990, 995)))
    assert nothing["multicast"]["saved_of_ideal"] is None  # under 1% to save: not judged on bytes


def test_bytes_are_judged_on_the_holders_data_where_the_run_counted_it() -> None:
    judge = BENCH["judge"]
    # The link's bytes: multicast saved 2 of plain's 40 over the ideal (its single GETs cost the
    # rest); its DATA saved 18 of the 20 the ideal saves.
    plain = {**_mode(100, 200, 1030, 1000), "holder_data_bytes": 1000}
    mc = {**_mode(100, 200, 1028, 990), "holder_data_bytes": 982}
    doc = {"offered": {"mean_bps": 1.0, "capacity_bps": 1.0}, "plain": plain, "multicast": mc, "pool": mc}
    doc["multicast"] = {**mc, "ideal_bytes": 980}
    assert judge(doc)["multicast"]["saved_of_ideal"] == pytest.approx(0.9)
    del plain["holder_data_bytes"]  # a cell run before the demo counted DATA: the link's bytes
    assert judge(doc)["multicast"]["saved_of_ideal"] == pytest.approx(0.04)


def test_results_in_out_are_reused_and_the_last_line_sums_the_grid(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cell = ["--traces", "conversation", "--requests", "48", "--requesters", "4", "--time-scales", "1", "--mbps",
            "10,100", "--out", str(tmp_path), "--resume", "--conversation", str(SCRIPT)]
    good = _doc(_mode(100, 200, 700, 600), _mode(95, 190, 650, 600))
    (tmp_path / "conversation-r48-n4-t1-m10.json").write_text(json.dumps(good))
    slow = _doc(_mode(120, 200, 900, 600), _mode(100, 200, 700, 600), plain_failed=2)
    (tmp_path / "conversation-r48-n4-t1-m100.json").write_text(json.dumps(slow))
    assert BENCH["main"](cell) == 1  # 1.2x slower somewhere and 2 failed: not done
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("trace") and len(lines) == 4
    assert lines[-1] == "worst_slowdown_vs_plain=1.200 failed=2 bytes_saved_of_ideal=0.250"
    (tmp_path / "conversation-r48-n4-t1-m100.json").write_text(json.dumps(good))
    assert BENCH["main"](cell) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "worst_slowdown_vs_plain=1.000 failed=0 bytes_saved_of_ideal=0.750")


def _timed(times: list[float | None], holder: int = 1000) -> dict[str, Any]:
    done = [t for t in times if t is not None]
    return {**_mode(percentile(done, 50), percentile(done, 99), holder, 600, failed=len(times) - len(done)),
            "timeline": [[float(i), 0, t] for i, t in enumerate(times)]}


def test_repeats_are_judged_over_every_replays_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A p50 at a gap: in the first run one multicast request lands above it (3x slower there),
    # in the second one of plain's does; over both runs' requests the modes' p50s are alike.
    run1 = {"offered": {"mean_bps": 1.0, "capacity_bps": 4.0}, "plain": _timed([100, 100, 300, 300]),
            "multicast": _timed([100, 300, 300, 300], 800), "pool": _timed([100, 100, 300, None], 700)}
    run2 = {"offered": {"mean_bps": 1.0, "capacity_bps": 4.0}, "plain": _timed([100, 300, 300, 300]),
            "multicast": _timed([100, 100, 300, 300], 800), "pool": _timed([100, 100, 300, 300], 700)}
    pooled = BENCH["pool_runs"]([run1, run2])
    assert pooled["plain"]["deliver_p50_ms"] == pooled["multicast"]["deliver_p50_ms"] == 300
    assert pooled["pool"]["deliver_p50_ms"] == 100  # 7 delivered: 100 x4, 300 x3
    assert pooled["pool"]["failed"] == 1 and pooled["multicast"]["holder_bytes"] == 1600
    assert [r["multicast"]["slowdown"] for r in pooled["runs"]] == [3.0, 1.0]  # p99 alike
    j = BENCH["judge"](pooled)
    assert j["multicast"]["slowdown"] == 1.0 and j["failed"] == 1
    assert j["multicast"]["saved_of_ideal"] == pytest.approx(0.5)  # 1600 of 2000 against 1200 of 2000
    # The bench reads both replays back (--resume), prints one pooled row and keeps it.
    (tmp_path / "conversation-r48-n4-t1-m100.json").write_text(json.dumps(run1))
    (tmp_path / "conversation-r48-n4-t1-m100-k1.json").write_text(json.dumps(run2))
    cell = ["--traces", "conversation", "--requests", "48", "--requesters", "4", "--time-scales", "1", "--mbps",
            "100", "--out", str(tmp_path), "--resume", "--conversation", str(SCRIPT), "--repeats", "2"]
    assert BENCH["main"](cell) == 1  # the pool failed one request
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].split()[-2] == "2" and lines[-1].startswith("worst_slowdown_vs_plain=1.000 failed=1 ")
    assert json.loads((tmp_path / "conversation-r48-n4-t1-m100-pooled.json").read_text())["repeats"] == 2
    assert lines[1].split()[-4] == "-"  # neither replay sampled the switch backlog
    run1["multicast"]["switch_backlog"] = {"s1": {"p50_bytes": 3_000_000, "max_bytes": 9_000_000, "samples": 5}}
    run2["multicast"]["switch_backlog"] = {"s1": {"p50_bytes": 7_000_000, "max_bytes": 8_000_000, "samples": 5}}
    assert BENCH["pool_runs"]([run1, run2])["multicast"]["switch_backlog"] == {"s1": {"p50_bytes": 7_000_000}}
    assert BENCH["main"]([*cell[:-1], "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_the_row_shows_the_largest_switch_backlog_of_the_cell(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(_mode(100, 200, 700, 600), _mode(95, 190, 650, 600))
    doc["plain"]["switch_backlog"] = {"s1": {"p50_bytes": 0, "max_bytes": 40_000, "samples": 9}}
    doc["multicast"]["switch_backlog"] = {"s1": {"p50_bytes": 18_700_000, "max_bytes": 25_000_000, "samples": 9}}
    doc["pool"]["switch_backlog"] = {"s1": {"p50_bytes": 2_000_000, "max_bytes": 9_000_000, "samples": 9}}
    (tmp_path / "conversation-r48-n4-t1-m100.json").write_text(json.dumps(doc))
    cell = ["--traces", "conversation", "--requests", "48", "--requesters", "4", "--time-scales", "1", "--mbps",
            "100", "--out", str(tmp_path), "--resume", "--conversation", str(SCRIPT)]
    assert BENCH["main"](cell) == 0
    fields = capsys.readouterr().out.splitlines()[1].split()
    assert fields[-4:] == ["18.7", "0", "1", "-"]  # sw MB, failed, runs, code (not recorded)
    del doc["pool"]["switch_backlog"], doc["multicast"]["switch_backlog"], doc["plain"]["switch_backlog"]
    (tmp_path / "conversation-r48-n4-t1-m100.json").write_text(json.dumps(doc))
    assert BENCH["main"](cell) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[-4:-1] == ["-", "0", "1"]  # a cell run before it sampled


def test_pair_is_the_median_of_request_by_request_ratios() -> None:
    judge, pool_runs = BENCH["judge"], BENCH["pool_runs"]
    run = {"offered": {"mean_bps": 1.0, "capacity_bps": 4.0}, "plain": _timed([100, 200, 400, 800]),
           "multicast": _timed([110, 220, 440, 880], 800), "pool": _timed([50, 200, 800, None], 700)}
    j = judge(run)
    assert j["multicast"]["paired_median"] == pytest.approx(1.1)  # every request 10% slower
    assert j["pool"]["paired_median"] == pytest.approx(1.0)  # 0.5, 1, 2 (the failed one is not paired)
    # Two replays whose p50s sit on either side of a gap: the pairs pool, 1.0 at the median.
    run1 = {**run, "multicast": _timed([100, 300, 300, 300]), "plain": _timed([100, 100, 300, 300])}
    run2 = {**run, "multicast": _timed([100, 100, 300, 300]), "plain": _timed([100, 300, 300, 300])}
    pooled = pool_runs([run1, run2])
    assert sorted(pooled["multicast"]["paired_ratios"]) == pytest.approx([1 / 3, 1, 1, 1, 1, 1, 1, 3])
    assert judge(pooled)["multicast"]["paired_median"] == 1.0
    # Timelines that do not list the same requests are not paired.
    other = {**run, "multicast": {**run["multicast"], "timeline": [[9.0, 0, 100.0]] * 4}}
    assert judge(other)["multicast"]["paired_median"] is None
    del run["plain"]["timeline"]
    assert judge(run)["multicast"]["paired_median"] is None


def test_an_interrupted_run_ends_its_cell_cleanly_not_with_sigkill(tmp_path: Path) -> None:
    # The cell (here a stand-in for `kvpool demo`) cleans up on SIGTERM; `subprocess.run` killed
    # it with SIGKILL on Ctrl-C, which left a real cell's nine agents and its Mininet links behind.
    cell = tmp_path / "cell.py"
    cell.write_text(
        "import pathlib, signal, sys, time\n"
        f"out = pathlib.Path({str(tmp_path)!r})\n"
        "def bye(*_):\n"
        "    time.sleep(0.3)  # stopping a network takes a while\n"
        "    (out / 'cleaned').write_text('yes'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "(out / 'up').write_text('yes')\n"
        "time.sleep(60)\n")
    driver = tmp_path / "driver.py"
    # Ctrl-C raises KeyboardInterrupt in a runner started from a terminal; a suite started in the
    # background by a shell without job control inherits SIGINT ignored, so say it outright.
    driver.write_text(
        "import runpy, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"bench = runpy.run_path({str(SCRIPT)!r})\n"
        f"bench['run_to_end']([sys.executable, {str(cell)!r}])\n")
    proc = subprocess.Popen([sys.executable, str(driver)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "up").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the cell did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # Ctrl-C to the runner alone
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err  # the interrupt still ends the runner
    assert (tmp_path / "cleaned").read_text() == "yes"  # but only after the cell cleaned up


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_grid_spread_over_sittings_reruns_the_cells_measured_before_a_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for i in range(3):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "f")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", str(i))
    old, fix, head = _git(repo, "rev-list", "--reverse", "HEAD").split()
    code_version, measured_since = BENCH["code_version"], BENCH["measured_since"]
    assert code_version(repo) == head[:7]
    (repo / "f").write_text("edited")
    assert code_version(repo) == head[:7] + "-dirty"
    assert code_version(tmp_path / "nowhere") is None
    assert measured_since(head[:7], fix, repo) and measured_since(fix[:7], fix, repo)
    assert not measured_since(old[:7], fix, repo)
    assert not measured_since(head[:7] + "-dirty", fix, repo) and not measured_since(None, fix, repo)

    # Three cells in --out: one ran on the fix's descendant, one before it, one unrecorded.
    live = BENCH["main"].__globals__  # run_path hands back a copy of the script's globals
    monkeypatch.setitem(live, "ROOT", repo)
    out = tmp_path / "out"
    out.mkdir()
    good = _doc(_mode(100, 200, 700, 600), _mode(95, 190, 650, 600))
    names = ["conversation-r48-n4-t1-m10", "conversation-r48-n4-t1-m100", "conversation-r48-n8-t1-m10"]
    for name, code in zip(names, [head[:7], old[:7], None], strict=True):
        (out / f"{name}.json").write_text(json.dumps({**good, "code": code}))
    ran: list[str] = []

    def fake_run(cell: Any, args: Any, trace: Path, k: int = 0) -> dict[str, Any]:
        ran.append(cell.name)
        return {**good, "code": head[:7]}

    monkeypatch.setitem(live, "run_cell", fake_run)
    args = ["--traces", "conversation", "--requests", "48", "--requesters", "4,8", "--time-scales", "1",
            "--mbps", "10,100", "--out", str(out), "--conversation", str(SCRIPT), "--resume"]
    assert BENCH["main"]([*args, "--resume-since", fix]) == 0
    assert ran == [*names[1:], "conversation-r48-n8-t1-m100"]  # stale, unrecorded, missing
    captured = capsys.readouterr()
    assert "conversation-r48-n4-t1-m100.json ran on " + old[:7] in captured.err
    assert all(line.split()[-1] == head[:7] for line in captured.out.splitlines()[1:-1])
    assert json.loads((out / f"{names[1]}.json").read_text())["code"] == head[:7]
    assert BENCH["main"]([*args, "--resume-since", "nosuchcommit"]) == 2
    assert "not a commit" in capsys.readouterr().err
    assert BENCH["main"]([*args[:-1], "--resume-since", fix]) == 2
    assert "needs --resume" in capsys.readouterr().err


def test_save_keeps_the_printed_table_as_a_result_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "results").mkdir()
    monkeypatch.setitem(BENCH["main"].__globals__, "ROOT", tmp_path)  # results/NAME.json lands under it
    good = _doc(_mode(100, 200, 700, 600), _mode(95, 190, 650, 600))
    (out / "conversation-r48-n4-t1-m10.json").write_text(json.dumps(good))
    cell = ["--traces", "conversation", "--requests", "48", "--requesters", "4", "--time-scales", "1", "--mbps",
            "10", "--out", str(out), "--resume", "--conversation", str(SCRIPT), "--save", "grid-x",
            "--machine", "a test"]
    assert BENCH["main"](cell) == 0
    doc = json.loads((tmp_path / "results" / "grid-x.json").read_text())
    assert doc["kind"] == "table" and doc["machine"]["description"] == "a test"
    assert doc["command"].endswith("--conversation " + str(SCRIPT))  # not where results went or came from
    (values,) = doc["figures"]["rows"]
    assert len(values) == len(doc["figures"]["columns"]) == len(BENCH["COLUMNS"])
    assert values[:6] == ["conversation", "48", "4", "1", "10", "0.50x"] and values[9] == "1.00"
    assert doc["summary"] == {"worst_slowdown_vs_plain": 1.0, "failed": 0, "bytes_saved_of_ideal": 0.75}
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].split()[:6] == values[:6]  # the same values as the printed row
