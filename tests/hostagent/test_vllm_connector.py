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

import gc
import importlib.util
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its environment
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm]'; scripts/setup.sh "
                                          "with KVPOOL_WITH_VLLM=1)")

import torch  # noqa: E402

from hostagent.chunking import chunk_keys  # noqa: E402
from hostagent.client import AgentClient  # noqa: E402
from hostagent.daemon import Agent, AgentConfig  # noqa: E402
from hostagent.serialize import serialize  # noqa: E402

pytestmark = pytest.mark.slow

BLOCK = 32  # vLLM's CPU attention wants blocks of a multiple of 32 tokens
VOCAB = 256
STEPS = 8
_salts = itertools.count()


def _tiny_llama(path: Path) -> None:
    """A randomly initialised Llama and a word-level tokenizer, saved where vLLM loads them (no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(path)  # type: ignore[no-untyped-call]
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",  # type: ignore[no-untyped-call]
                                   eos_token="t2")
    fast.save_pretrained(path)


@dataclass
class Rig:
    """An engine with the connector, the agent it talks to, and the model id it keys chunks by."""

    llm: Any
    agent: Agent
    model_id: str
    port: int

    @property
    def client(self) -> AgentClient:
        return AgentClient(self.agent.api_url)

    def generate(self, tokens: list[int], salt: str | None = None) -> list[int]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=tokens)
        if salt is not None:
            prompt["cache_salt"] = salt
        out = self.llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True),
                                use_tqdm=False)
        return list(out[0].outputs[0].token_ids)

    def reference(self, tokens: list[int]) -> list[int]:
        """Greedy tokens of a full prefill: under a fresh salt, nothing is found in kvpool."""
        before = self.fetched()
        out = self.generate(tokens, salt=f"reference-{next(_salts)}")
        assert self.fetched() == before, "a fresh salt found chunks"
        return out

    def keys(self, tokens: list[int], salt: str | None = None) -> list[int]:
        return chunk_keys(self.model_id, tokens, BLOCK, salt=salt)

    def wait_saved(self, tokens: list[int], n: int, salt: str | None = None, timeout: float = 20.0) -> None:
        """The connector publishes in the background: wait until the agent holds ``n`` leading chunks."""
        keys = self.keys(tokens, salt)
        deadline = time.monotonic() + timeout
        while self.client.lookup(keys)["local"] < n:
            assert time.monotonic() < deadline, f"the agent never held {n} chunks of the prompt"
            time.sleep(0.05)

    def fetched(self) -> int:
        """Chunks the agent answered a fetch with (all from its tiers here)."""
        return int(self.agent.stats()["agent"]["fetch_local_hits"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_agent(port: int) -> Agent:
    agent = Agent(AgentConfig(udp_port=0, api_port=port, log_level="WARNING"))
    agent.start()
    return agent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    _tiny_llama(path)
    return path


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def rig(request: pytest.FixtureRequest, model_dir: Path) -> Iterator[Rig]:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    dtype: Any = request.param
    port = _free_port()
    agent = _start_agent(port)
    model_id = f"tiny-llama-test-{dtype}"
    transfer = KVTransferConfig(
        kv_connector="KvpoolConnector", kv_connector_module_path="hostagent.vllm_connector", kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"agent_url": f"http://127.0.0.1:{port}", "model_id": model_id,
                                   "lookup_timeout_s": 0.5, "fetch_timeout_s": 2.0, "retry_after_s": 0.0})
    llm = LLM(model=str(model_dir), dtype=dtype, enforce_eager=True, block_size=BLOCK, enable_prefix_caching=False,
              max_model_len=1024, seed=0, kv_transfer_config=transfer)
    r = Rig(llm, agent, model_id, port)
    try:
        yield r
    finally:
        r.agent.stop()
        del llm, r
        gc.collect()


def _prompt(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=gen).tolist()


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
    rig.agent = _start_agent(rig.port)
    assert rig.generate(prompt) == ref
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

    monkeypatch.setattr(AgentClient, "fetch_chunks", broken_fetch)
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


def test_with_vllm_prefix_cache_and_two_block_chunks(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own prefix cache on, chunks of 2 blocks: a local hit of one block is completed from
    kvpool, whose first chunk then overlaps the local hit (its first block is left alone)."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    from hostagent.vllm_connector import KvpoolConnector, LoadSpec

    loads: list[LoadSpec] = []
    real_load = KvpoolConnector._load

    def spy(self: KvpoolConnector, load: LoadSpec) -> bool:
        loads.append(load)
        return real_load(self, load)

    monkeypatch.setattr(KvpoolConnector, "_load", spy)

    port = _free_port()
    agent = _start_agent(port)
    model_id = "tiny-llama-test-prefix-cache"
    transfer = KVTransferConfig(
        kv_connector="KvpoolConnector", kv_connector_module_path="hostagent.vllm_connector", kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"agent_url": f"http://127.0.0.1:{port}", "model_id": model_id, "chunk_blocks": 2})
    llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, block_size=BLOCK, enable_prefix_caching=True,
              max_model_len=1024, seed=0, kv_transfer_config=transfer)
    rig = Rig(llm, agent, model_id, port)
    try:
        target = _prompt(10, 5 * BLOCK + 3)
        ref = rig.generate(target, salt="reference")
        assert rig.generate(target) == ref  # a prefill: saves chunks of 2 blocks
        keys = chunk_keys(model_id, target, 2 * BLOCK)
        deadline = time.monotonic() + 20
        while rig.client.lookup(keys)["local"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = rig.fetched()
        assert rig.generate(target) == ref  # vLLM's own cache answers
        assert rig.fetched() == before
        llm.reset_prefix_cache()
        rig.generate(target[:BLOCK] + _prompt(11, 2 * BLOCK))  # vLLM now holds the first block only
        assert rig.generate(target) == ref
        assert rig.fetched() - before == 2
        assert [(len(x.keys), len(x.block_ids), x.skip) for x in loads] == [(2, 4, 1)]
    finally:
        agent.stop()
        del llm, rig
        gc.collect()
