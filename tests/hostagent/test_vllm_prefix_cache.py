"""``KvpoolConnector`` beside vLLM's own prefix cache, with chunks of two vLLM blocks.

Its own module: vLLM keeps one KV connector per process, so this engine must not live beside
test_vllm_connector.py's (module fixtures end with their module).
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

import torch

from hostagent.chunking import chunk_keys
from hostagent.vllm_connector import KvpoolConnector, LoadSpec
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


def test_with_vllm_prefix_cache_and_two_block_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own prefix cache on, chunks of 2 blocks: a local hit of one block is completed from
    kvpool, whose first chunk then overlaps the local hit (its first block is left alone)."""
    tiny_llama(tmp_path / "model")
    loads: list[LoadSpec] = []
    real_load = KvpoolConnector._load

    def spy(self: KvpoolConnector, load: LoadSpec) -> bool:
        loads.append(load)
        return real_load(self, load)

    monkeypatch.setattr(KvpoolConnector, "_load", spy)
    published: list[int] = []
    real_publish = KvpoolConnector._publish

    def spy_publish(self: KvpoolConnector, keys: list[int], chunks: torch.Tensor) -> None:
        published.extend(keys)
        real_publish(self, keys, chunks)

    monkeypatch.setattr(KvpoolConnector, "_publish", spy_publish)

    port = free_port()
    model_id = "tiny-llama-test-prefix-cache"
    rig = Rig(None, start_agent(port), model_id, port)
    try:
        rig.llm = llm = engine(tmp_path / "model", "float32", port, model_id, prefix_caching=True, chunk_blocks=2)
        target = prompt_tokens(10, 5 * BLOCK + 3)
        ref = rig.generate(target, salt="reference")
        assert rig.generate(target) == ref  # a prefill: saves chunks of 2 blocks
        keys = chunk_keys(model_id, target, 2 * BLOCK)
        deadline = time.monotonic() + 20
        while rig.client.lookup(keys)["local"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = rig.fetched()
        saves = len(published)
        assert rig.generate(target) == ref  # vLLM's own cache answers
        assert rig.fetched() == before
        assert len(published) == saves, "chunks vLLM's own cache answered were published again"
        llm.reset_prefix_cache()
        rig.generate(target[:BLOCK] + prompt_tokens(11, 2 * BLOCK))  # vLLM now holds the first block only
        assert rig.generate(target) == ref
        assert rig.fetched() - before == 2
        assert [(len(x.keys), len(x.block_ids), x.skip) for x in loads] == [(2, 4, 1)]
        assert published.count(keys[0]) == 1, "a chunk loaded from kvpool was published again"
    finally:
        close(rig)
