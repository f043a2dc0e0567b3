"""The ttft experiment's vLLM host (``bmv2_topologies.vllm_host``) against real agents on loopback.

Runs in the vLLM venv (``scripts/test.sh`` runs it there; elsewhere it skips): the prefix's
KV is computed as the experiment computes it (``vllm_host --publish-prefix``) and published on a
holder agent; the host process fetches it through its own agent with ``KvpoolConnector`` and
must answer a full prefill's greedy tokens.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not in this venv: scripts/test.sh runs these tests in scripts/setup.sh's .venv-vllm",
                allow_module_level=True)

import torch

from bmv2_topologies.experiment.ttft_config import QUICK_MODEL, VLLM_BLOCK_TOKENS
from bmv2_topologies.ttft_host import save_model
from hostagent.chunking import chunk_keys
from hostagent.client import AgentClient
from hostagent.daemon import spawn_agent

pytestmark = pytest.mark.slow


def _ask(proc: subprocess.Popen[str], cmd: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    answer: dict[str, Any] = json.loads(proc.stdout.readline())
    return answer


def test_vllm_host_answers_full_prefill_tokens_from_fetched_kv(tmp_path: Path) -> None:
    spec, block = QUICK_MODEL, VLLM_BLOCK_TOKENS
    save_model(spec, tmp_path / "model")
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, spec.vocab, (4 * block,), generator=gen).tolist()
    (tmp_path / "prefix.json").write_text(json.dumps(prefix))
    published = subprocess.run(
        [sys.executable, "-m", "bmv2_topologies.vllm_host", "--publish-prefix", str(tmp_path / "prefix.json"),
         "--out", str(tmp_path / "chunks"), "--model-dir", str(tmp_path / "model"), "--model-id", spec.model_id,
         "--block-tokens", str(block), "--max-model-len", "512"],
        capture_output=True, text=True, timeout=300, check=False)
    assert published.returncode == 0, published.stderr[-2000:]
    assert json.loads(published.stdout) == {"published": 4}
    keys = chunk_keys(spec.model_id, prefix, block)
    blobs = [(tmp_path / "chunks" / f"{k:016x}.chunk").read_bytes() for k in keys]
    holder = spawn_agent(tmp_path / "holder", "--log-level", "WARNING")
    requester = spawn_agent(tmp_path / "requester", "--log-level", "WARNING")
    proc: subprocess.Popen[str] | None = None
    try:
        AgentClient(holder.api_url).publish_chunks(keys, blobs)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bmv2_topologies.vllm_host", "--name", "h1", "--model-dir", str(tmp_path / "model"),
             "--model-id", spec.model_id, "--block-tokens", str(block), "--agent", requester.api_url,
             "--lookup", holder.api_url, "--holder", holder.udp_address, "--lock-file", str(tmp_path / "lock"),
             "--max-model-len", "512"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=(tmp_path / "host.err").open("w"), text=True)
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("ready") == "h1", (tmp_path / "host.err").read_text()[-2000:]
        prompt = [*prefix, *torch.randint(0, spec.vocab, (8,), generator=gen).tolist()]
        go = {"go": time.time(), "prompt": prompt, "serial": True, "steps": 4, "timeout": 30}
        full = _ask(proc, {**go, "fetch": False})
        kv = _ask(proc, {**go, "fetch": True})
        assert "error" not in full and "error" not in kv, (full, kv)
        assert (full["cached_tokens"], kv["cached_tokens"]) == (0, len(prefix))
        assert kv["prefill_tokens"] == 8 and kv["stopped"] is None
        assert kv["tokens"] == full["tokens"] and len(kv["tokens"]) == 4
        assert full["fetch_ms"] == 0 < kv["fetch_ms"] < kv["ttft_ms"]
        # keep: false: the prefix crossed UDP and nothing stayed on the requester.
        assert AgentClient(requester.api_url).lookup(keys)["local"] == 0
        assert AgentClient(requester.api_url).stats()["agent"]["fetch_remote"] == len(keys)
    finally:
        if proc is not None:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write('{"quit": true}\n')
                proc.stdin.close()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        holder.stop()
        requester.stop()
