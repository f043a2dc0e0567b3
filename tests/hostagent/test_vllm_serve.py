"""``vllm serve`` with ``--kv-transfer-config`` naming ``KvpoolConnector``: the command a vLLM user runs.

The server (its engine in a process of its own) saves a prompt's chunks to the agent, and a
second request for the prompt, with vLLM's own prefix cache off, takes them from the agent and
answers the same greedy tokens as the first, computed in full.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not in this venv: scripts/test.sh runs these tests in "
                                   "scripts/setup.sh's .venv-vllm")

from hostagent.chunking import chunk_keys
from hostagent.client import AgentClient
from tests.hostagent.vllm_rig import BLOCK, free_port, prompt_tokens, start_agent, tiny_llama

pytestmark = pytest.mark.slow

STARTUP_S = 240.0


def _post(url: str, doc: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        out: dict[str, Any] = json.load(resp)
    return out


def _wait_healthy(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"vllm serve exited {server.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    pytest.fail(f"vllm serve did not answer /health in {STARTUP_S:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def test_vllm_serve_takes_a_prompts_chunks_from_the_agent(tmp_path: Path) -> None:
    vllm_cmd = shutil.which("vllm", path=str(Path(sys.executable).parent))
    assert vllm_cmd is not None, "the vllm command is not in this venv (scripts/setup_vllm.sh installs it)"
    assert importlib.util.find_spec("hostagent.vllm_connector") is not None
    model = tmp_path / "model"
    tiny_llama(model)
    agent_port, api_port = free_port(), free_port()
    agent = start_agent(agent_port)
    model_id = "serve-test"
    transfer = {"kv_connector": "KvpoolConnector", "kv_connector_module_path": "hostagent.vllm_connector",
                "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"agent_url": f"http://127.0.0.1:{agent_port}", "model_id": model_id}}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [vllm_cmd, "serve", str(model), "--host", "127.0.0.1", "--port", str(api_port), "--enforce-eager",
             "--block-size", str(BLOCK), "--max-model-len", "1024", "--no-enable-prefix-caching", "--seed", "0",
             "--kv-transfer-config", json.dumps(transfer)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{api_port}"
        _wait_healthy(url, server, log)
        tokens = prompt_tokens(7, 3 * BLOCK + 5)  # three whole chunks and a partial one
        ask = {"model": str(model), "prompt": tokens, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
        first = _post(url + "/v1/completions", ask)["choices"][0]["text"]
        keys = chunk_keys(model_id, tokens, BLOCK)
        client = AgentClient(agent.api_url)
        deadline = time.monotonic() + 30
        while client.lookup(keys)["local"] < 3:
            assert time.monotonic() < deadline, "the server never saved the prompt's three whole chunks"
            time.sleep(0.1)
        before = int(agent.stats()["agent"]["fetch_local_hits"])
        second = _post(url + "/v1/completions", ask)["choices"][0]["text"]
        assert int(agent.stats()["agent"]["fetch_local_hits"]) - before == 3
        assert second == first
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        agent.stop()
