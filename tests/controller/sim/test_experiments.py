"""``kvpool experiment``: every question's quick run writes its files, and its numbers behave."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from controller.sim.experiments.cli import execute
from kvpool.cli import main

pytestmark = pytest.mark.slow


def _files(out: Path, q: str) -> dict[str, Any]:
    folder = out / q
    assert (folder / "table.txt").read_text().count("|") > 10
    assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
    res: dict[str, Any] = json.loads((folder / "result.json").read_text())
    assert res["question"] == q and res["quick"] is True
    return res


def test_q1_admission(tmp_path: Path) -> None:
    res = execute("q1", True, tmp_path)
    _files(tmp_path, "q1")
    cells: dict[tuple[str, float], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in res["rows"]:
        assert 0.0 <= r["hit_ratio"] <= 1.0 and r["gib_off_holders"] >= -1e-9
        cells[r["family"], r["switch_mib"]][r["policy"]] = r
    assert {f for f, _ in cells} >= {"tool", "docqa", "chat", "synthetic"}
    for at in cells.values():
        bel = at["belady"]["hit_ratio"]
        assert all(at[p]["hit_ratio"] <= bel + 1e-12 for p in at)  # Belady bounds every online policy
        assert bel == pytest.approx(at["value"]["belady_hit_ratio"])
    for fam in {f for f, _ in cells}:
        lru = [cells[fam, m]["lru"]["hit_ratio"] for m in sorted(m for f, m in cells if f == fam)]
        assert lru == sorted(lru)  # a bigger pool never hurts LRU
    assert len(res["target"]) == len(cells)


def test_q2_tier_flow(tmp_path: Path) -> None:
    res = execute("q2", True, tmp_path)
    _files(tmp_path, "q2")
    at = {(r["family"], r["load"], r["strategy"]): r for r in res["rows"]}
    assert {s for _, _, s in at} == {"drop", "demote", "promote-2nd", "prefetch", "affinity"}
    for r in res["rows"]:
        shares = r["hbm"] + r["dram"] + r["switch"] + r["holders"] + r["recompute"]
        assert shares == pytest.approx(1.0)
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
    for fam, load, s in at:
        if s == "drop":
            assert at[fam, load, s]["dram"] == 0.0 and at[fam, load, s]["gib_hbm_to_dram"] == 0.0
            assert at[fam, load, "demote"]["gib_hbm_to_dram"] > 0.0
            assert at[fam, load, "affinity"]["hbm"] >= at[fam, load, "demote"]["hbm"]


def test_q3_value_recovery(tmp_path: Path) -> None:
    res = execute("q3", True, tmp_path)
    _files(tmp_path, "q3")
    rows = {(r["family"], r["pool"], r["dram_gib"], r["demote"]): r for r in res["rows"]}
    for (fam, pool, dram, mode), r in rows.items():
        if mode == "none":
            assert r["demoted_blocks"] == 0 and r["dram_hits"] == 0
        else:
            assert r["demoted_blocks"] <= rows[fam, pool, dram, "all"]["demoted_blocks"]
            assert r["dram_hits"] <= r["demoted_blocks"]
    for s in res["summary"]:
        assert s["recovered_blocks"] >= 0
        if not s["pool"]:
            assert s["prefill_mtokens_saved"] >= 0  # alone, a DRAM hit is prefill not redone
        else:
            assert s["network_gib_saved"] >= 0  # with a pool, a DRAM hit is a fetch not made


def test_q4_scale(tmp_path: Path) -> None:
    res = execute("q4", True, tmp_path)
    _files(tmp_path, "q4")
    for p in res["points"] + res["map"] + res["switch_map"]:
        assert p["coalesce"]["holder_gib"] <= p["holder"]["holder_gib"] + 1e-9  # coalescing only removes bytes
        assert p["pool"]["holder_gib"] <= p["holder"]["holder_gib"] + 1e-9
        assert p["none"]["holder_gib"] == 0.0
        assert p["holder"]["coalesced"] == 0
    for p in res["points"] + res["switch_map"]:  # a Tofino 1 pipe's coalescing: bounded, still only removes bytes
        assert p["tofino1"]["holder_gib"] <= p["holder"]["holder_gib"] + 1e-9
        assert p["tofino1"]["switch_hit_ratio"] == 0.0  # no pool memory for KV chunks
    assert len(res["map"]) == len({g["load"] for g in res["map"]}) * len({g["gbps"] for g in res["map"]})
    # against one slow holder, coalescing (and more so a pool) takes bytes off its link
    slow = [g for g in res["switch_map"] if g["gbps"] == min(x["gbps"] for x in res["switch_map"])]
    assert all(g["coalesce"]["coalesced"] > 0 for g in slow)
    nodes = sorted((p for p in res["points"] if p["sweep"] == "nodes"), key=lambda p: p["nodes"])
    assert nodes[-1]["requests_per_s"] > nodes[0]["requests_per_s"]  # load grows with the cluster


def test_fig9_capacity_curve(tmp_path: Path) -> None:
    res = execute("fig9", True, tmp_path)
    _files(tmp_path, "fig9")
    lru = sorted((p for p in res["points"] if p["policy"] == "lru"), key=lambda p: p["capacity_mtokens"])
    shares = [p["of_max"] for p in lru]
    assert all(0.0 <= s <= 1.0 + 1e-12 for s in shares)
    assert shares == sorted(shares)
    big = lru[-1]
    if big["capacity_mtokens"] >= res["unique_mtokens"]:
        assert big["of_max"] == pytest.approx(1.0)  # room for every block: the theoretical maximum


def test_cli_prints_the_table_and_rejects_a_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "fig9", "--quick", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fig9" in out and "| cache capacity" in out
    assert main(["experiment", "q1", "--trace", str(tmp_path / "nope.jsonl")]) == 2
    assert "is not a file" in capsys.readouterr().err
