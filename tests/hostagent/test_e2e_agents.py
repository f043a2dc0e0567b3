"""End to end: a real transformers decoder's prefix KV goes through two kvpool-agent processes over UDP.

Agent 1 (a subprocess) receives the prefix KV from the "engine" through its HTTP API;
agent 2 (another subprocess) fetches it from agent 1 over real UDP sockets on loopback;
the engine rebuilds a ``DynamicCache`` from what agent 2 returns and generates from it.
The logits must be exactly (``torch.equal``) those of generating from the original cache.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from hostagent.client import AgentClient
from hostagent.daemon import spawn_agent

BLOCK = 16
MODEL_ID = "tiny-llama-random-seed0"


def _model() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model: Any = LlamaForCausalLM(cfg)
    model.eval()
    return model


@torch.no_grad()
def _continue(model: Any, cache: Any, rest: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[int]]:
    """Feed the prompt tokens the cache does not cover, then decode greedily; all logits and tokens."""
    out = model(rest, past_key_values=cache, use_cache=True)
    logits = [out.logits]
    tokens: list[int] = []
    for _ in range(steps):
        nxt = out.logits[:, -1:].argmax(-1)
        tokens.append(int(nxt))
        out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits)
    return torch.cat(logits, dim=1), tokens


@pytest.mark.slow
def test_generation_from_fetched_kv_is_bit_identical(tmp_path: Path) -> None:
    model = _model()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 128, (1, 3 * BLOCK + 5), generator=gen)  # 3 full blocks + a 5-token remainder
    with torch.no_grad():
        prefill = model(prompt, use_cache=True)
    cached = 3 * BLOCK

    holder = spawn_agent(tmp_path / "a1")
    # A long retransmit timeout keeps the fragment counts below exact on a busy machine.
    requester = spawn_agent(tmp_path / "a2", "--retransmit-timeout", "5", "--give-up", "30")
    try:
        keys = AgentClient(holder.api_url).publish_prefix(MODEL_ID, prompt[0].tolist(), prefill.past_key_values,
                                                          block_size=BLOCK)
        assert len(keys) == 3
        client = AgentClient(requester.api_url)
        fetched = client.fetch_prefix(MODEL_ID, prompt[0].tolist(), block_size=BLOCK, holder=holder.udp_address)
        assert fetched.keys == keys and fetched.num_tokens == cached and fetched.stopped is None

        # The chunks crossed real UDP: agent 2 reassembled DATA fragments that agent 1 served.
        rs, hs = client.stats(), AgentClient(holder.api_url).stats()
        assert rs["agent"]["fetch_remote"] == 3 and rs["transport"]["requests_completed"] == 3
        assert rs["transport"]["fragments_stored"] > 3 and rs["transport"]["drops_total"] == 0
        assert hs["transport"]["holder"]["fragments_served"] == rs["transport"]["fragments_stored"]

        # A prompt that shares no block with the published one finds nothing.
        other = client.fetch_prefix(MODEL_ID, [1] * 20, block_size=BLOCK, holder=holder.udp_address)
        assert other.keys == [] and other.stopped is not None and "UNKNOWN_CHUNK" in other.stopped
    finally:
        codes = (holder.stop(), requester.stop())  # SIGTERM by PID
    assert codes == (0, 0)

    original = copy.deepcopy(prefill.past_key_values)
    original.crop(cached - prompt.shape[1])  # transformers 5: a negative count of tokens to drop
    rebuilt = fetched.to_cache(config=model.config)
    for layer in range(2):
        assert torch.equal(rebuilt.layers[layer].keys, original.layers[layer].keys)
        assert torch.equal(rebuilt.layers[layer].values, original.layers[layer].values)

    rest = prompt[:, cached:]
    want_logits, want_tokens = _continue(model, original, rest, steps=8)
    got_logits, got_tokens = _continue(model, rebuilt, rest, steps=8)
    assert want_logits.shape == (1, 5 + 8, 128)
    assert torch.equal(got_logits, want_logits) and got_tokens == want_tokens
    # Sanity: the logits depend on the KV (a wrong prefix would not pass by accident).
    zeroed = fetched.to_cache(config=model.config)
    zeroed.layers[0].keys.zero_()
    assert not torch.equal(_continue(model, zeroed, rest, steps=0)[0], want_logits[:, :5])
