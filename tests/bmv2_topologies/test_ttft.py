"""The ttft experiment: its configuration, a model host against real agents, the report, one quick run in Mininet.

The unit tests need nothing; the host test starts two kvpool agents on loopback and runs
the quick model in this process; the Mininet test needs root and Mininet (run it under
``flock /tmp/kvpool-netns.lock``) and skips with the reason otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bmv2_topologies.experiment.ttft_config import QUICK_MODEL, ModelSpec, TtftConfig
from kvpool.cli import main
from tests.paths import REPO


# ---------------------------------------------------------------------------------- configuration
def test_model_spec_round_trips_and_states_its_geometry() -> None:
    spec = ModelSpec()
    assert ModelSpec.from_json(spec.to_json()) == spec
    assert spec.head_dim == 64 and spec.kv_bytes_per_token == 4 * 2 * 1 * 64 * 4
    # Qwen2.5-0.5B: about 716 MFLOP per token over 12 KiB of bf16 KV per token, about 58 k per byte.
    assert 55_000 < spec.flops_per_token / spec.kv_bytes_per_token < 60_000
    assert spec.model_id != replace(spec, seed=1).model_id  # other weights, other chunk keys


@pytest.mark.parametrize(("text", "match"), [
    ('{"layers": 2, "colour": 1}', "not a model spec"),
    ("not json", "not a model spec"),
    ('{"hidden": 100, "heads": 16}', "must divide"),
    ('{"layers": 0}', "must be positive"),
])
def test_bad_model_spec_is_named(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelSpec.from_json(text)


@pytest.mark.parametrize(("changes", "match"), [
    ({"prefix_tokens": 100}, "prefix-tokens: invalid value 100 \\(a multiple of block-tokens 16\\)"),
    ({"requesters": (1, 17)}, "requesters"),
    ({"modes": ("plain", "broadcast")}, "unknown mode 'broadcast'"),
    ({"schemes": ("gpu",)}, "unknown compute scheme 'gpu'"),
    ({"sweep_tokens": (64, 70)}, "sweep-tokens"),
    ({"suffix_tokens": 0}, "suffix-tokens: invalid value 0$"),
    ({"target": "tofino"}, "target: invalid value 'tofino'$"),
])
def test_bad_config_is_named(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(TtftConfig(), **changes).validate()


def test_quick_config_is_small_and_valid() -> None:
    q = TtftConfig.for_quick()
    q.validate()
    TtftConfig().validate()
    assert q.requesters == (1, 2) and q.model == QUICK_MODEL and q.quick
    assert q.target == TtftConfig().target == "model"  # not BMv2 because it is installed: its figures are the model's
    assert q.published_tokens == 128 and TtftConfig().published_tokens == 1024


def test_cli_rejects_bad_ttft_flags_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "ttft", "--requesters", "0,4"]) == 2
    assert capsys.readouterr().err.strip() == "kvpool experiment: error: ttft: requesters: invalid value (0, 4)"
    assert main(["experiment", "ttft", "--requesters", "two"]) == 2
    assert "not comma-separated numbers" in capsys.readouterr().err
    assert main(["experiment", "ttft", "--schemes", "serial,gpu"]) == 2
    assert "unknown compute scheme 'gpu'" in capsys.readouterr().err


def test_host_rejects_a_bad_model_spec() -> None:
    r = subprocess.run([sys.executable, "-m", "bmv2_topologies.ttft_host", "--name", "h1", "--model", "{}x",
                        "--block-tokens", "16", "--agent", "unix:/nonexistent", "--holder", "10.0.0.1:7470",
                        "--lock-file", "/tmp/x.lock"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and "--model: not a model spec" in r.stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------- break-even and report
def _point(p: int, full: float, kv: float, fetch: float, rep: int = 0) -> dict[str, Any]:
    return {"prefix_tokens": p, "rep": rep, "full_ms": full, "kvpool_ms": kv, "fetch_ms": fetch, "rest_ms": kv - fetch,
            "wire_bytes": p * 2048, "saved_tokens": p, "prefix_bytes": p * 2048, "tokens_identical": True}


def test_break_even_interpolates_the_crossing_and_extrapolates_the_link() -> None:
    from bmv2_topologies.experiment.ttft import break_even

    # Fetch: 100 ms + 1 ms per 2048 bytes (16.4 Mbit/s); prefill 2 ms per token; the rest always 10 ms.
    pts = [_point(p, 2.0 * p, 110.0 + p, 100.0 + p) for p in (32, 64, 128, 256)]
    be = break_even(pts, 256)
    # kvpool - full = 110 - P: +78 at 32, +46 at 64, -18 at 128: the lines cross at 110 tokens.
    assert be["crossing_tokens"] == pytest.approx(64 + 64 * 46 / 64)
    assert be["kvpool_wins_from"] == 128
    assert be["fixed_ms"] == pytest.approx(100.0) and be["effective_mbps"] == pytest.approx(2048 * 8 / 1e3)
    # At 256 tokens: 512 ms of prefill - 10 ms of rest - 100 ms fixed leaves 402 ms for 512 KiB.
    assert be["break_even_mbps"] == pytest.approx(256 * 2048 * 8 / 402 / 1e3)
    assert break_even([_point(64, 10.0, 200.0, 190.0)], 64)["kvpool_wins_from"] is None
    assert break_even([_point(64, 500.0, 200.0, 190.0), _point(64, 500.0, 300.0, 290.0, 1)], 64)["medians"]["64"][
        "kvpool_ms"] == 250.0


def _doc() -> dict[str, Any]:
    from bmv2_topologies.experiment.ttft import Cell, break_even

    def answer(ttft: float, cached: int) -> dict[str, Any]:
        return {"ttft_ms": ttft, "fetch_ms": ttft - 20 if cached else 0.0, "prefill_ms": 20.0, "wait_ms": 0.0,
                "cached_tokens": cached, "prefill_tokens": 552 - cached, "tokens": [1, 2], "top_logit": 3.0}

    cells = []
    for mode, ttft, cached in (("full", 800.0, 0), ("plain", 900.0, 512), ("multicast", 400.0, 512)):
        c = Cell("serial", 3, mode)
        c.add(0, [answer(ttft, cached), answer(ttft + 10, cached), answer(ttft + 20, cached)])
        c.holder_data = {"full": 0, "plain": 3 * 768, "multicast": 768}[mode]
        cells.append(c.summary(512, 768, 1))
    pts = [_point(p, 1.6 * p, 200.0 + 0.9 * p, 190.0 + 0.9 * p) for p in (64, 512)]
    return {"target": "model", "holder_mbps": 20.0, "threads_per_host": 1, "prefix_tokens": 512,
            "suffix_tokens": 40, "prefix_bytes": 1 << 20, "prefix_fragments": 768, "waves": 1,
            "model": {"layers": 4, "hidden": 1024, "kv_bytes_per_token": 2048, "flops_per_kv_byte": 57_900.0},
            "cells": cells, "sweep": {"points": pts, "errors": [], **break_even(pts, 512)}, "mismatches": [],
            "config": {"sweep_reps": 1}}


def test_cell_summary_counts_copies_and_tokens_saved() -> None:
    doc = _doc()
    full, plain, multi = doc["cells"]
    assert (plain["copies_per_wave"], multi["copies_per_wave"], full["copies_per_wave"]) == (3.0, 1.0, 0.0)
    assert plain["saved_tokens_all_equal_prefix"] and not full["saved_tokens_all_equal_prefix"]
    assert (multi["ttft_p50_ms"], multi["ttft_p99_ms"], multi["requests"], multi["failed"]) == (410.0, 420.0, 3, 0)
    assert multi["saved_tokens"] == [512] * 3 and multi["prefill_tokens_per_request"] == 40


def test_table_and_plot(tmp_path: Path) -> None:
    from bmv2_topologies.experiment.ttft import plot, table

    doc = _doc()
    text = table(doc)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    rows = [r for r in cells if r[0] == "serial"]
    assert [r[2] for r in rows] == ["full", "plain", "multicast"]
    assert rows[2][3:6] == ["410", "420", f"{810 / 410:.2f}x"] and rows[2][-3] == "1.00"  # p50, p99, vs full; copies
    assert "identical to full prefill" in text
    assert "cross at about" in text
    plot(doc, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc["mismatches"] = ["serial N=2 plain wave 0 h1: [1] != [2]"]
    assert "TOKEN MISMATCHES: 1" in table(doc)


# ---------------------------------------------------------------------------------- a model host, real agents
@pytest.mark.slow
def test_host_gets_the_same_tokens_from_fetched_kv(tmp_path: Path) -> None:
    """Agents on loopback: the prefix's KV crosses UDP, the rest is prefilled, the tokens are full prefill's."""
    from bmv2_topologies.experiment.ttft import Prompts, publish_workload
    from bmv2_topologies.ttft_host import InferenceHost, fingerprint
    from hostagent.client import AgentClient
    from hostagent.daemon import spawn_agent

    cfg = TtftConfig.for_quick()
    prompts = Prompts.draw(cfg)
    workload, print_ = publish_workload(cfg.model, prompts.prefix, cfg.block_tokens)
    assert len(workload.blobs) == cfg.published_tokens // cfg.block_tokens
    holder = spawn_agent(tmp_path / "holder")
    requester = spawn_agent(tmp_path / "requester", "--retransmit-timeout", "5", "--give-up", "30")
    try:
        AgentClient(holder.api_url).publish_chunks(list(workload.blobs), list(workload.blobs.values()))
        host = InferenceHost(cfg.model, cfg.block_tokens, AgentClient(requester.api_url), holder.udp_address,
                             tmp_path / "lock")
        assert fingerprint(host.model) == print_  # the same seeded weights as the holder's model
        for p in (32, 128):
            prompt = prompts.prompt(p, "test", 0, p)
            full = host.request(prompt, fetch=False, serial=True, steps=6, timeout=30)
            kv = host.request(prompt, fetch=True, serial=True, steps=6, timeout=30)
            assert (full["cached_tokens"], full["prefill_tokens"]) == (0, p + cfg.suffix_tokens)
            assert (kv["cached_tokens"], kv["prefill_tokens"], kv["stopped"]) == (p, cfg.suffix_tokens, None)
            assert kv["tokens"] == full["tokens"] and len(full["tokens"]) == 6
            assert kv["ttft_ms"] > 0 and full["ttft_ms"] > 0 and kv["fetch_ms"] > 0
        # A prompt whose own tokens fill a whole block asks for it too; the holder has none: longest prefix only.
        long_own = prompts.prefix[:32] + list(range(cfg.block_tokens + 3))
        kv = host.request(long_own, fetch=True, serial=False, steps=1, timeout=30)
        assert kv["cached_tokens"] == 32 and "UNKNOWN_CHUNK" in (kv["stopped"] or "")
        # A prompt that is all prefix still prefills its last token to get logits.
        kv = host.request(prompts.prefix[:32], fetch=True, serial=False, steps=2, timeout=30)
        full = host.request(prompts.prefix[:32], fetch=False, serial=False, steps=2, timeout=30)
        assert (kv["cached_tokens"], kv["prefill_tokens"]) == (31, 1) and kv["tokens"] == full["tokens"]
    finally:
        assert (holder.stop(), requester.stop()) == (0, 0)


# ---------------------------------------------------------------------------------- Mininet
@pytest.mark.root
@pytest.mark.slow
def test_quick_run_on_a_star(tmp_path: Path) -> None:
    from bmv2_topologies.network import mininet_available

    reason = mininet_available()
    if reason:
        pytest.skip(reason)
    from bmv2_topologies.experiment.ttft import execute

    cfg = TtftConfig.for_quick()
    res = execute(cfg, tmp_path)
    folder = tmp_path / "ttft"
    assert json.loads((folder / "result.json").read_text())["question"] == "ttft"
    assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG" and "serial" in (folder / "table.txt").read_text()
    assert res["errors"] == [] and res["mismatches"] == []
    frags = res["prefix_fragments"]
    cells = {(c["requesters"], c["mode"]): c for c in res["cells"]}
    assert set(cells) == {(n, m) for n in (1, 2) for m in ("full", "plain", "multicast")}
    for (n, mode), c in cells.items():
        assert len(c["ttft_ms"]) == n * cfg.waves and all(t > 0 for t in c["ttft_ms"])
        want = 0 if mode == "full" else cfg.prefix_tokens
        assert c["saved_tokens"] == [want] * n  # every requester skipped exactly the prefix
        assert c["prefill_tokens_per_request"] == cfg.prefix_tokens + cfg.suffix_tokens - want
    assert cells[1, "full"]["holder_bytes"] == 0  # no fetch, no traffic
    # Plain forwarding: the holder sends the prefix once per requester (retransmissions aside).
    # Multicast (issue 16): a chunk no hint names is asked for by range, which switches coalesce
    # per chunk; the quick run's one cold wave, whose two model
    # hosts start tens of ms apart, costs no more than plain (measured: about 2 prefixes, as
    # plain), the switch merges only what overlaps.
    for n in (1, 2):
        assert n * frags <= cells[n, "plain"]["holder_data_fragments"] <= 1.5 * n * frags
    assert frags <= cells[2, "multicast"]["holder_data_fragments"] <= 1.5 * 2 * frags
    assert cells[2, "multicast"]["holder_bytes"] >= frags * 1468  # at least the prefix's DATA datagrams
    points = res["sweep"]["points"]
    assert [p["prefix_tokens"] for p in points] == list(cfg.sweep_tokens)
    assert all(p["saved_tokens"] == p["prefix_tokens"] and p["tokens_identical"] for p in points)


@pytest.mark.root
@pytest.mark.slow
def test_quick_run_on_a_star_with_vllm(tmp_path: Path) -> None:
    """``--engine vllm``: vLLM engines with kvpool's connector on the requesters, the same tokens as a prefill."""
    from bmv2_topologies.network import mininet_available

    reason = mininet_available()
    if reason:
        pytest.skip(reason)
    from bmv2_topologies.experiment.ttft import TtftError, execute, vllm_python

    try:
        vllm_python()
    except TtftError as exc:
        pytest.skip(str(exc))
    cfg = TtftConfig.for_quick(engine="vllm", block_tokens=32, sweep_tokens=(32, 128))
    res = execute(cfg, tmp_path)
    assert res["engine"] == "vllm" and res["errors"] == [] and res["mismatches"] == []
    cells = {(c["requesters"], c["mode"]): c for c in res["cells"]}
    assert set(cells) == {(n, m) for n in (1, 2) for m in ("full", "plain", "multicast")}
    for (n, mode), c in cells.items():
        assert len(c["ttft_ms"]) == n * cfg.waves and all(t > 0 for t in c["ttft_ms"])
        assert c["saved_tokens"] == [0 if mode == "full" else cfg.prefix_tokens] * n
    frags = res["prefix_fragments"]
    assert frags <= cells[1, "plain"]["holder_data_fragments"] <= 1.5 * frags  # the prefix crossed the switch
    assert "vLLM" in (tmp_path / "ttft" / "table.txt").read_text()
