"""``kvpool report``: result files in, the docs' tables out, and a check that they agree."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bmv2_topologies.experiment.report import ModeResult, SwitchCounts, demo_table
from kvpool import report
from kvpool.report import saved_of_ideal

ROOT = Path(__file__).resolve().parents[2]


def test_saved_of_ideal_compares_measured_savings_with_the_ideal_ones_against_plain() -> None:
    # Plain carried 1000, the ideal 600: the mode saved 300 of the 400 it could, 0.75 of the ideal.
    assert saved_of_ideal(700, 1000, 600) == pytest.approx(0.75)
    assert saved_of_ideal(1000, 1000, 600) == 0.0
    assert saved_of_ideal(1100, 1000, 600) == pytest.approx(-0.25)  # it cost bytes
    assert saved_of_ideal(600, 1000, 600) == 1.0
    # Plain already carries less than was asked (each node fetched a shared chunk once): only
    # what is left between plain and the ideal is the switch's to save.
    assert saved_of_ideal(350, 400, 300) == pytest.approx(0.5)
    assert saved_of_ideal(900, 1000, 995) is None  # nothing worth saving
    assert saved_of_ideal(290, 280, 300) is None  # plain is already at the ideal
    assert saved_of_ideal(900, 0, 50) is None


def _modes(fabric: bool) -> list[ModeResult]:
    """Three modes as a demo run ends them (with per-switch counters on a fabric)."""
    sw = {"s1": SwitchCounts(), "s5": SwitchCounts(absorbed=8, served=13440, fills=638)} if fabric else {}
    return [
        ModeResult("plain", requests=32, deliver_ms=[5500.0, 5800.0], holder_bytes=26_770_000,
                   holder_data_bytes=26_000_000, ideal_bytes=26_700_000, fragments=100, peak_incast=8,
                   fabric_bytes=53_000_000 if fabric else 0, switches=dict.fromkeys(sw, SwitchCounts())),
        ModeResult("multicast", requests=32, deliver_ms=[755.5, 762.7], holder_bytes=3_440_000,
                   holder_data_bytes=3_300_000, ideal_bytes=3_340_000, fragments=100, peak_incast=8,
                   fabric_bytes=15_000_000 if fabric else 0, switches=sw),
        ModeResult("pool", requests=32, deliver_ms=[555.9, 746.0], holder_bytes=1_400_000, holder_data_bytes=1_200_000,
                   ideal_bytes=3_340_000, fragments=100, switch_served=73, peak_incast=6, failed=1,
                   fabric_bytes=44_000_000 if fabric else 0, switches=sw),
    ]


def _run_dir(tmp: Path, results: list[ModeResult], run: dict[str, Any] | None = None, topology: str = "star") -> Path:
    """A results directory shaped as ``kvpool demo`` writes it (``experiment.testbed.run_demo``)."""
    switches = sorted({name for r in results for name in r.switches}) or ["s1"]
    doc: dict[str, Any] = {"target": "model", "topology": topology, "requesters": 8, "holders": 1,
                           "switches": switches, "config": {"modes": [r.mode for r in results], "holder_mbps": 10.0,
                                                            "trace": None},
                           "offered": {"mean_bps": 1e6, "capacity_bps": 1.25e6},
                           **({"run": run} if run else {}), **{r.mode: r.summary() for r in results}}
    out = tmp / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(doc))
    return out


def _args(root: Path, **kw: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    ns = p.parse_args(["--root", str(root)])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize("fabric", [False, True])
def test_a_demo_run_renders_the_figures_its_own_table_printed(tmp_path: Path, fabric: bool) -> None:
    results = _modes(fabric)
    doc = report.from_run_dir(_run_dir(tmp_path, results, topology="leaf-spine" if fabric else "star"))
    assert doc["kind"] == "demo"
    text = report.render("x", doc, "results/x.json")
    printed = demo_table(results).splitlines()
    for mode_line in printed[1:4]:  # the demo's own rows: every figure appears in the rendered row
        cells = mode_line.split()
        row = next(line for line in text.splitlines() if line.startswith(f"| {cells[0]} |"))
        assert [c.strip() for c in row.strip("|").split("|")] == cells
    if fabric:
        assert "| multicast | s5 | 8 | 13440 | 638 | 0 |" in text
        assert "| s1 |" not in text  # a switch whose counters never moved is left out


def test_add_keeps_the_run_then_check_fails_naming_a_table_edited_by_hand(tmp_path: Path) -> None:
    run = {"commit": "a" * 40, "dirty": False, "date": "2026-12-06T10:00:00+00:00", "machine": {"cpus": 2},
           "command": "kvpool demo --requesters 8 --target model"}
    run_dir = _run_dir(tmp_path, _modes(False), run=run)
    (tmp_path / "docs").mkdir()
    doc_md = tmp_path / "docs" / "guide.md"
    doc_md.write_text("# Guide\n\n<!-- report:demo-star -->\n<!-- /report:demo-star -->\n\nafter\n")
    assert report.run(_args(tmp_path, add=run_dir, name="demo-star", machine="2-core VM")) == 0
    kept = json.loads((tmp_path / "results" / "demo-star.json").read_text())
    assert kept["commit"] == "a" * 40 and kept["date"].startswith("2026-12-06")
    assert kept["machine"] == {"cpus": 2, "description": "2-core VM"}
    assert kept["command"] == run["command"]
    assert kept["figures"]["modes"]["pool"]["failed"] == 1
    text = doc_md.read_text()
    assert "`kvpool demo --requesters 8 --target model` on 2-core VM ([demo-star.json](../results/demo-star.json))" \
        in text
    assert text.endswith("<!-- /report:demo-star -->\n\nafter\n")
    assert report.run(_args(tmp_path, check=True)) == 0

    doc_md.write_text(text.replace("| pool | 746.0 |", "| pool | 745.0 |").replace("555.9", "555.0"))
    assert report.write_all(tmp_path, check=True) == ["docs/guide.md: demo-star"]
    assert report.run(_args(tmp_path, check=True)) == 1
    assert report.run(_args(tmp_path)) == 0  # rendered again
    assert doc_md.read_text() == text


def test_a_run_that_recorded_no_run_says_so(tmp_path: Path) -> None:
    doc = report.from_run_dir(_run_dir(tmp_path, _modes(False)))
    assert "no run" in doc["note"]
    assert doc["command"].startswith("kvpool demo --target model --topology star --requesters 8")


def test_a_block_naming_a_missing_result_fails(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("<!-- report:nothing -->\n<!-- /report:nothing -->\n")
    assert report.run(_args(tmp_path, check=True)) == 1


def test_every_committed_table_is_what_its_results_file_renders() -> None:
    assert report.write_all(ROOT, check=True) == []
    for path in sorted((ROOT / report.RESULTS_DIR).glob("*.json")):
        doc = report.load_result(ROOT, path.stem)
        assert doc["kind"] in report.KINDS, path


def test_a_side_by_side_run_renders_per_n_and_system(tmp_path: Path) -> None:
    from bmv2_topologies.experiment.config import VsConfig
    from bmv2_topologies.experiment.report import SystemResult, vs_document, vs_table

    by_n = {8: {"mooncake": SystemResult("mooncake", 8, all_done_ms=[5348.0, 5376.0], storage_link_bytes=33_650_000),
                "kvpool_pool": SystemResult("kvpool_pool", 8, all_done_ms=[204.0, 818.0], storage_link_bytes=1_140_000,
                                            switch_served_fraction=0.74)}}
    run = {"commit": "b" * 40, "dirty": True, "date": "2026-12-06T11:00:00+00:00", "machine": {"cpus": 16},
           "command": "bench_vs_mooncake.py --requesters 8 --json"}
    out = tmp_path / "vs"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({**vs_document(VsConfig(target="model"), by_n, 786_432), "run": run}))
    doc = report.from_run_dir(out)
    assert doc["kind"] == "vs_mooncake" and doc["dirty"] is True
    text = report.render("vs", doc, "vs.json")
    assert "on 16 CPUs" in text
    for line in vs_table(by_n).splitlines()[1:]:  # the script's own rows, figure for figure
        cells = line.split()
        assert "| " + " | ".join(cells) + " |" in text


def test_a_saved_benchmark_table_records_the_command_that_measured_it(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    path = report.save_table(tmp_path, "bench-x", "scripts/bench_x.py",
                             ["--mib", "256", "--save", "--machine", "a quiet VM", "--reps", "6"], "x: a title",
                             ["path", "MB/s"], [["a", "1"], ["b", "2"]], ["a note"], "a quiet VM", {"x_vs_y": 0.12345})
    doc = json.loads(path.read_text())
    assert path == tmp_path / "results" / "bench-x.json"
    assert doc["command"] == "scripts/bench_x.py --mib 256 --reps 6"  # where it went is not what it measured
    assert doc["machine"]["description"] == "a quiet VM"
    assert doc["summary"] == {"x_vs_y": 0.1235} and doc["note"] == "x: a title. a note"
    block = report.render("bench-x", doc, "../results/bench-x.json")
    assert block.startswith("`scripts/bench_x.py --mib 256 --reps 6` on a quiet VM")
    assert "| a | 1 |" in block
