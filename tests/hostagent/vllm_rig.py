"""Helpers of the vLLM connector's tests: a tiny random Llama on disk, an agent, an engine with the
connector (``Rig``).  vLLM is imported inside the functions: test modules skip first without it.

vLLM keeps one KV connector per process (``ensure_kv_transfer_initialized``): one engine with a
connector at a time, and ``close`` releases it before the next.
"""

from __future__ import annotations

import gc
import itertools
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hostagent.chunking import chunk_keys
from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig

BLOCK = 32  # vLLM's CPU attention wants blocks of a multiple of 32 tokens
VOCAB = 256
STEPS = 8
_salts = itertools.count()


def tiny_llama(path: Path) -> None:
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

    def settle(self) -> None:
        """Wait for the connector's background saves: a save still in flight when the agent restarts
        would land in the new agent, and the next prompt would hit instead of miss."""
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        get_kv_transfer_group().flush()

    def fetched(self) -> int:
        """Chunks the agent answered a fetch with (all from its tiers here)."""
        return int(self.agent.stats()["agent"]["fetch_local_hits"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agent(port: int) -> Agent:
    agent = Agent(AgentConfig(udp_port=0, api_port=port, log_level="WARNING"))
    agent.start()
    return agent


def prompt_tokens(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=gen).tolist()


def engine(model_dir: Path, dtype: Any, port: int, model_id: str, *, prefix_caching: bool = False,
           **extra: Any) -> Any:
    """A ``vllm.LLM`` whose connector talks to the agent on ``port``."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    transfer = KVTransferConfig(
        kv_connector="KvpoolConnector", kv_connector_module_path="hostagent.vllm_connector", kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"agent_url": f"http://127.0.0.1:{port}", "model_id": model_id, **extra})
    return LLM(model=str(model_dir), dtype=dtype, enforce_eager=True, block_size=BLOCK,
               enable_prefix_caching=prefix_caching, max_model_len=1024, seed=0, kv_transfer_config=transfer)


def close(rig: Rig) -> None:
    """Stop the agent and the engine, and release the process's connector."""
    from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

    rig.agent.stop()
    rig.llm = None
    gc.collect()
    ensure_kv_transfer_shutdown()
