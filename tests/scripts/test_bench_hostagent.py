"""Smoke test of scripts/bench_hostagent.py on a small data set (no timing asserted)."""

from __future__ import annotations

import runpy

import pytest

from tests.paths import SCRIPTS

SCRIPT = SCRIPTS / "bench_hostagent.py"


def test_bench_runs_and_prints_summary(capsys: pytest.CaptureFixture[str]) -> None:
    mod = runpy.run_path(str(SCRIPT))
    argv = ["--mib", "2", "--chunk-kib", "256", "--reps", "1", "--sections", "serialize,pipeline,fragment"]
    assert mod["main"](argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)
    want = {"fragment_reassemble_vs_memcpy", "memcpy_gbps", "serialize_vs_memcpy", "int8_size_ratio",
            "pipeline_vs_memcpy"}
    assert want <= set(summary)
    assert float(summary["fragment_reassemble_vs_memcpy"]) > 0
    # int8 + one float32 scale per 64-value row, against 2-byte bf16: (64 + 4) / 128.
    assert float(summary["int8_size_ratio"]) == pytest.approx(68 / 128, rel=1e-3)
    assert lines[-1].startswith("fragment_reassemble_vs_memcpy=")


def test_bench_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    mod = runpy.run_path(str(SCRIPT))
    with pytest.raises(SystemExit) as err:
        mod["main"](["--sections", "nope"])
    assert err.value.code == 2
    assert "unknown section" in capsys.readouterr().err
