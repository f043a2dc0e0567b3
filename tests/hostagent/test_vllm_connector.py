"""vLLM serves from kvpool: ``KvpoolConnector`` end to end on a tiny random Llama, CPU, offline.

A ``vllm.LLM`` with the connector talks to a real ``kvpool-agent`` (in this process, on
loopback).  vLLM's own prefix cache is off, so a prefix comes either from kvpool or from a
prefill.  The reference for each prompt is a full prefill: the same prompt under a salt
nothing was saved under.  Greedy tokens with the prefix loaded from kvpool must equal it,
in fp32 and bf16, for prompts sharing 0, 1 and many chunks with what was saved, with a
partial or a full last chunk; a different ``cache_salt`` misses; with the agent down, slow
or serving a chunk that does not fit, the blocks are recomputed and the tokens are the same.

Needs the ``kvpool[vllm]`` extra (skips without it); the engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its environment
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
vllm = pytest.importorskip("vllm", reason="vLLM is not in this venv: scripts/test.sh runs these tests in "
                                          "scripts/setup.sh's .venv-vllm")

import torch  # noqa: E402

from hostagent.client import AgentClient  # noqa: E402
from hostagent.serialize import serialize  # noqa: E402
from tests.hostagent.vllm_rig import BLOCK, Rig, close, engine, free_port, start_agent, tiny_llama  # noqa: E402
from tests.hostagent.vllm_rig import prompt_tokens as _prompt  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(path)
    return path


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def rig(request: pytest.FixtureRequest, model_dir: Path) -> Iterator[Rig]:
    dtype: Any = request.param
    port = free_port()
    model_id = f"tiny-llama-test-{dtype}"
    r = Rig(None, start_agent(port), model_id, port)
    try:
        r.llm = engine(model_dir, dtype, port, model_id, lookup_timeout_s=0.5, fetch_timeout_s=2.0,
                       retry_after_s=0.0)
        yield r
    finally:
        close(r)


def test_many_chunks_and_a_partial_last_one(rig: Rig) -> None:
    prompt = _prompt(1, 5 * BLOCK + 7)
    first = rig.generate(prompt)  # nothing in kvpool yet: a prefill, whose chunks are saved
    assert first == rig.reference(prompt)
    rig.wait_saved(prompt, 5)
    before = rig.fetched()
    assert rig.generate(prompt) == first
    assert rig.fetched() - before == 5, "the prefix was not taken from kvpool"


def test_full_last_chunk_is_recomputed(rig: Rig) -> None:
    prompt = _prompt(2, 4 * BLOCK)
    ref = rig.reference(prompt)
    rig.generate(prompt)
    rig.wait_saved(prompt, 4)
    before = rig.fetched()
    assert rig.generate(prompt) == ref
    assert rig.fetched() - before == 3, "the engine must compute the last token, so the last chunk is not loaded"


def test_shared_one_chunk_then_none(rig: Rig) -> None:
    base = _prompt(3, 4 * BLOCK + 1)
    rig.generate(base)
    rig.wait_saved(base, 4)
    one = base[:BLOCK] + _prompt(4, 3 * BLOCK + 5)  # shares exactly the first chunk
    none = [base[0] ^ 1, *base[1:]]  # differs in its first token: shares nothing
    ref_one, ref_none = rig.reference(one), rig.reference(none)
    before = rig.fetched()
    assert rig.generate(one) == ref_one
    assert rig.fetched() - before == 1
    assert rig.generate(none) == ref_none
    assert rig.fetched() - before == 1


def test_cache_salt_separates_tenants(rig: Rig) -> None:
    prompt = _prompt(5, 3 * BLOCK + 3)
    ref = rig.reference(prompt)
    assert rig.generate(prompt, salt="tenant-a") == ref
    rig.wait_saved(prompt, 3, salt="tenant-a")
    before = rig.fetched()
    assert rig.generate(prompt, salt="tenant-b") == ref
    assert rig.fetched() == before, "tenant b was served tenant a's chunks"
    assert rig.client.lookup(rig.keys(prompt))["local"] == 0, "salted chunks answer an unsalted prompt"
    assert rig.generate(prompt, salt="tenant-a") == ref
    assert rig.fetched() - before == 3


def test_chunk_that_does_not_fit_is_recomputed(rig: Rig) -> None:
    prompt = _prompt(6, 3 * BLOCK + 2)
    ref = rig.reference(prompt)
    wrong = serialize(torch.zeros(2, 2, 2, BLOCK, 16))  # a chunk of another shape under the prompt's keys
    rig.client.publish_chunks(rig.keys(prompt), [wrong] * 3)
    before = rig.fetched()
    assert rig.generate(prompt) == ref
    assert rig.fetched() - before == 3  # fetched, refused, recomputed


def test_agent_slow_then_down_then_restarted(rig: Rig) -> None:
    prompt = _prompt(7, 4 * BLOCK + 9)
    ref = rig.reference(prompt)
    rig.generate(prompt)
    rig.wait_saved(prompt, 4)
    rig.agent.stop()

    # Slow: something listens on the agent's port and never answers; the lookup times out.
    with socket.socket() as mute:
        mute.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        mute.bind(("127.0.0.1", rig.port))
        mute.listen(16)
        t0 = time.monotonic()
        assert rig.generate(prompt) == ref
        assert time.monotonic() - t0 < 20

    # Down: nothing listens.
    t0 = time.monotonic()
    assert rig.generate(prompt) == ref
    assert time.monotonic() - t0 < 20

    # Restarted (empty): a miss, then the prompt's chunks are saved again and load.
    rig.settle()  # the down step's save fails against the down agent, not later against the new one
    rig.agent = start_agent(rig.port)
    assert rig.generate(prompt) == ref
    assert rig.fetched() == 0
    rig.wait_saved(prompt, 4)
    assert rig.generate(prompt) == ref
    assert rig.fetched() == 4


def test_agent_dies_between_lookup_and_fetch(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler was told the chunks exist; the fetch then fails: blocks recompute, tokens agree."""
    prompt = _prompt(8, 3 * BLOCK + 4)
    ref = rig.reference(prompt)
    rig.generate(prompt)
    rig.wait_saved(prompt, 3)
    failed = threading.Event()

    def broken_fetch(self: AgentClient, *args: Any, **kwargs: Any) -> Any:
        failed.set()
        raise OSError("connection reset by a test")

    monkeypatch.setattr(AgentClient, "fetch_chunks_into", broken_fetch)
    assert rig.generate(prompt) == ref
    assert failed.is_set()


def test_loaded_kv_is_what_the_engine_attends_to(rig: Rig) -> None:
    """Control: chunks of the right shape and dtype but other values change the tokens, so the
    tests above compare KV that really came from kvpool, not a silent recompute."""
    prompt = _prompt(9, 4 * BLOCK + 3)
    ref = rig.reference(prompt)
    dtype = rig.llm.llm_engine.model_config.dtype
    gen = torch.Generator().manual_seed(0)
    noise = [serialize(torch.randn(2, 2, 2, BLOCK, 32, generator=gen).mul(30).to(dtype)) for _ in range(4)]
    rig.client.publish_chunks(rig.keys(prompt), noise)
    before = rig.fetched()
    assert rig.generate(prompt) != ref
    assert rig.fetched() - before == 4

