"""``KvpoolConnector`` fetching from a holder agent: ``lookup_url`` (the holder answers the scheduler,
standing in for the controller's directory) and ``keep: false`` (every load crosses UDP); the agent's
token named by ``token_file`` (vLLM logs its config: the token itself stays out of it).

Its own module: vLLM keeps one KV connector per process (see test_vllm_prefix_cache.py).
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its environment
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm", reason="vLLM is not in this venv: scripts/test.sh runs these tests in "
                                   "scripts/setup.sh's .venv-vllm")

from kvpool import auth
from tests.hostagent.vllm_rig import (
    BLOCK,
    Rig,
    close,
    engine,
    free_port,
    prompt_tokens,
    start_agent,
    tiny_llama,
)

pytestmark = pytest.mark.slow


def test_fetch_from_a_holder_named_by_lookup_url(tmp_path: Path) -> None:
    """Chunks only the holder agent has: the scheduler learns of them from ``lookup_url``, the local
    agent fetches them over UDP and (``keep: false``) keeps none; the tokens are a prefill's."""
    tiny_llama(tmp_path / "model")
    port = free_port()
    holder = start_agent(free_port())
    model_id = "tiny-llama-test-remote"
    rig = Rig(None, start_agent(port), model_id, port)
    try:
        udp = f"{holder.config.host}:{holder.transport.port}"
        rig.llm = engine(tmp_path / "model", "float32", port, model_id, lookup_url=holder.api_url, holder=udp,
                         keep=False, token_file=str(auth.default_path()))
        target = prompt_tokens(20, 3 * BLOCK + 5)
        ref = rig.reference(target)
        # A prefill saves to the local agent (agent_url); the chunks move to the holder.
        assert rig.generate(target, salt="remote") == ref
        keys = rig.keys(target, "remote")
        rig.wait_saved(target, 3, salt="remote")
        local, remote = rig.client, rig.client.__class__(holder.api_url)
        remote.publish_chunks(keys, [local.get_chunk(k) for k in keys])
        for k in keys:
            assert local.delete_chunk(k)
        assert local.lookup(keys)["available"] == 0
        before = rig.agent.stats()["agent"]["fetch_remote"]
        assert rig.generate(target, salt="remote") == ref
        assert rig.agent.stats()["agent"]["fetch_remote"] - before == 3, "the chunks did not come from the holder"
        time.sleep(0.2)  # the step's saves, if any, are published in the background
        assert local.lookup(keys)["local"] == 0, "keep: false left fetched chunks in the local agent"
    finally:
        holder.stop()
        close(rig)


def test_token_and_token_file_are_exclusive() -> None:
    from hostagent.vllm_connector import ConnectorSettings

    with pytest.raises(ValueError, match="token or token_file"):
        ConnectorSettings.from_extra({"token": "x" * 32, "token_file": "/nonexistent"})
    assert ConnectorSettings.from_extra({"token_file": "/t"}).token_file == "/t"
