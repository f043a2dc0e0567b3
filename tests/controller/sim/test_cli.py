"""``kvpool sim``: --json keys, sweeps, table, outputs, and clear errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.cli import main

KEYS = {
    "policy",
    "switch_hit_ratio",
    "belady_hit_ratio",
    "prefill_tokens_saved",
    "holder_bytes",
    "ttft_p50_ms",
    "ttft_p99_ms",
}
SMALL = ["--requests", "600", "--nodes", "8", "--no-progress"]


def test_json_single_config_prints_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *SMALL, "--switch-mib", "96", "--policy", "value", "--json"]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1
    obj = json.loads(out)
    assert isinstance(obj, dict) and set(obj) >= KEYS
    assert obj["policy"] == "value" and 0.0 <= obj["switch_hit_ratio"] <= obj["belady_hit_ratio"] <= 1.0


def test_the_tofino1_preset_runs_a_switch_without_kv_pool_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *SMALL, "--switch-mib", "96", "--switch-preset", "tofino1", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["switch_hit_ratio"] == 0.0  # the preset's pool holds no KV chunk, whatever --switch-mib says


@pytest.mark.parametrize("policy", ["value", "lru", "lfu", "gdsf", "s3fifo", "belady"])
def test_every_policy_name_is_accepted(policy: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *SMALL, "--policy", policy, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == policy


def test_sweep_prints_a_json_list_and_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *SMALL, "--switch-mib", "48,96", "--policy", "value,lru", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) == 4
    assert {(r["switch_mib"], r["policy"]) for r in rows} == {
        (48.0, "value"),
        (48.0, "lru"),
        (96.0, "value"),
        (96.0, "lru"),
    }
    assert main(["sim", *SMALL, "--switch-mib", "48", "--policy", "value,belady", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "of Belady" in out and "belady" in out
    assert (tmp_path / "results.csv").read_text().startswith("policy,")
    assert len(json.loads((tmp_path / "results.json").read_text())) == 2
    assert list(tmp_path.glob("*.png"))


def test_trace_file_and_its_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(
        "".join(
            json.dumps({"timestamp": i * 10, "input_length": 2000, "output_length": 5, "hash_ids": [0, 1, 2, 3 + i]})
            + "\n"
            for i in range(50)
        )
    )
    assert main(["sim", "--trace", str(good), "--nodes", "4", "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 50
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text().splitlines()[0] + "\n{oops\n")
    assert main(["sim", "--trace", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: malformed JSON" in err and err.count("\n") == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["sim", "--trace", str(empty), "--no-progress"]) == 2
    assert "empty trace" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--holder-gbps", "-1"], "--holder-gbps must be positive"),
        (["--hbm-gib", "0"], "--hbm-gib must be positive"),
        (["--holders", "0"], "--holders must be a positive integer"),
        (["--requests", "0"], "invalid --requests 0"),
        (["--model", "qwen2.5-0.5b,llama3-70b", "--hbm-gib", "0.05"], "--hbm-gib 0.05 holds not even one"),
        (["--rate", "-2"], "invalid --rate -2"),
    ],
)
def test_nonsensical_options_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *SMALL, *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fifo"], "unknown policy"),
        (["--switch-mib", "-4"], "must be non-negative"),
        (["--nodes", "0"], "must be positive"),
        (["--model", "gpt9"], "unknown model"),
        (["--nodes", "x"], "not a valid number"),
    ],
)
def test_bad_arguments_are_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_unwritable_out_dir_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["sim", *SMALL, "--out", str(blocker / "sub")]) == 2
    assert "cannot write results" in capsys.readouterr().err
