"""One inference host of the ttft experiment: a real transformers model that prefills or fetches.

Runs inside a Mininet host (``python -m bmv2_topologies.ttft_host``). It builds a
random-initialised Llama-style model from ``--model`` (a ``ModelSpec`` as JSON; the seed
in it makes every host's weights identical, and the ready line carries a fingerprint of
them so the caller can check), prints ``{"ready": ...}`` and answers commands on stdin,
one JSON line each:

- ``{"go": T, "prompt": [...], "fetch": bool, "serial": bool, "steps": k, "timeout": s}``:
  at wall-clock time ``T`` (hosts share the kernel clock) start the request. With
  ``fetch`` the host first asks its local ``kvpool-agent`` for the KV of the prompt's
  longest published prefix (every full block of the prompt is asked for, as an engine that
  does not know what is cached; the agent fetches from the holder over the switch, nothing
  is kept locally), rebuilds a ``DynamicCache`` from it and prefills only the rest;
  without, it prefills the whole prompt. The first token is the argmax of the last
  position's logits: TTFT is the time from the request's start to those logits, on this
  process's clock. Then ``k - 1`` more tokens are decoded greedily (not timed). With
  ``serial`` the model computes only while holding ``--lock-file`` (one host computes at a
  time) and the time spent waiting for it is left out of TTFT: as if every host had its
  own processor. The answer is one line: ``{"start", "ttft_ms", "fetch_ms", "prefill_ms",
  "wait_ms", "cached_tokens", "prefill_tokens", "tokens", "top_logit", "stopped"}`` or
  ``{"error": "..."}``;
- ``{"quit": true}`` or end of input: exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bmv2_topologies.experiment.ttft_config import ModelSpec
from hostagent.chunking import chunk_keys
from hostagent.client import AgentClient
from hostagent.layouts import hf_cache_from_chunks
from hostagent.serialize import deserialize
from kvpool import auth
from kvpool.http_api import ApiError


def build_model(spec: ModelSpec) -> Any:
    """The model of ``spec`` in eval mode, its weights drawn from ``spec.seed`` (the same on every host)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # heavy import, only where a model is built

    torch.manual_seed(spec.seed)
    cfg = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                      num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                      num_key_value_heads=spec.kv_heads, max_position_embeddings=8192, tie_word_embeddings=False)
    model: Any = LlamaForCausalLM(cfg)
    model.eval()
    return model


def save_model(spec: ModelSpec, path: Path) -> None:
    """``spec``'s model (``build_model``'s weights) and a word-level tokenizer, saved where vLLM loads them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    build_model(spec).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(spec.vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0")  # type: ignore[no-untyped-call]
    fast.save_pretrained(path)


def fingerprint(model: Any) -> str:
    """A digest of every weight's bytes: equal on two hosts exactly when their models are."""
    h = hashlib.blake2b(digest_size=8)
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def first_token(model: Any, ids: torch.Tensor, cache: Any = None) -> tuple[int, float, Any]:
    """Prefill ``ids`` (after ``cache``'s tokens); the greedy first token, its logit, and the cache."""
    out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[0, -1]
    tok = int(logits.argmax())
    return tok, float(logits[tok]), out.past_key_values


@torch.no_grad()
def decode(model: Any, first: int, cache: Any, steps: int) -> list[int]:
    """``first`` followed by ``steps - 1`` greedily decoded tokens."""
    tokens = [first]
    while len(tokens) < steps:
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


@contextlib.contextmanager
def compute_slot(lock_file: Path | None) -> Iterator[None]:
    """Hold the machine-wide compute lock (``flock``) when given one; nothing otherwise."""
    if lock_file is None:
        yield
        return
    with lock_file.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class InferenceHost:
    """The model, the agent client and the request logic of one host (usable without a network)."""

    def __init__(self, spec: ModelSpec, block_tokens: int, agent: AgentClient | None = None,
                 holder: str | None = None, lock_file: Path | None = None) -> None:
        self.spec = spec
        self.block_tokens = block_tokens
        self.agent = agent
        self.holder = holder
        self.lock_file = lock_file
        self.model = build_model(spec)
        # The first forward pass initialises kernels and caches: not part of any request.
        first_token(self.model, torch.zeros((1, 2 * block_tokens), dtype=torch.long))

    def fetch(self, prompt: list[int], timeout: float) -> tuple[Any, int, str | None]:
        """The KV of the prompt's longest published prefix via the agent: (cache or None, tokens, why it stopped)."""
        if self.agent is None:
            raise RuntimeError("this host has no agent to fetch from")
        keys = chunk_keys(self.spec.model_id, prompt, self.block_tokens)
        got, blobs, stopped = self.agent.fetch_chunks(keys, self.holder, timeout=timeout, local=False)
        if not got:
            return None, 0, stopped
        chunks = torch.stack([deserialize(bytearray(b)) for b in blobs])
        return hf_cache_from_chunks(chunks, config=self.model.config), len(got) * self.block_tokens, stopped

    def request(self, prompt: list[int], *, fetch: bool, serial: bool, steps: int, timeout: float) -> dict[str, Any]:
        """One request from its start to its greedy tokens, timed on this process's clock."""
        start_wall, t0 = time.time(), time.perf_counter()
        cache: Any = None
        cached, stopped = 0, None
        if fetch:
            cache, cached, stopped = self.fetch(prompt, timeout)
        if cached >= len(prompt):
            # A fully cached prompt still needs its last token's logits: recompute that one token.
            cache.crop(-1)  # transformers 5: a negative count of tokens to drop
            cached = len(prompt) - 1
        t_fetched = time.perf_counter()
        with compute_slot(self.lock_file if serial else None):
            t_slot = time.perf_counter()
            tok, top, cache = first_token(self.model, torch.tensor([prompt[cached:]]), cache)
            t_first = time.perf_counter()
            tokens = decode(self.model, tok, cache, steps)
        wait = t_slot - t_fetched
        return {"start": start_wall, "ttft_ms": (t_first - t0 - wait) * 1e3, "fetch_ms": (t_fetched - t0) * 1e3,
                "prefill_ms": (t_first - t_slot) * 1e3, "wait_ms": wait * 1e3, "cached_tokens": cached,
                "prefill_tokens": len(prompt) - cached, "tokens": tokens, "top_logit": top, "stopped": stopped}


def _say(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Serve ``go`` commands until ``quit``; 2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="python -m bmv2_topologies.ttft_host",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--name", required=True, help="this host's name (echoed in the ready line)")
    ap.add_argument("--model", required=True, help="the model spec as JSON (ModelSpec.to_json)")
    ap.add_argument("--block-tokens", type=int, required=True, help="tokens per chunk")
    ap.add_argument("--agent", required=True, help="the local agent's API (unix:/path or http://host:port)")
    ap.add_argument("--holder", required=True, help="the holder's kvpool address host:port")
    ap.add_argument("--lock-file", type=Path, required=True, help="the machine-wide compute lock for serial requests")
    ap.add_argument("--token-file", type=Path, help="the operator's token file (default: kvpool.auth's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for this host (default 1)")
    args = ap.parse_args(argv)
    try:
        spec = ModelSpec.from_json(args.model)
    except ValueError as exc:
        ap.error(str(exc))
    if args.block_tokens < 1 or args.threads < 1:
        ap.error("--block-tokens and --threads must be positive")
    torch.set_num_threads(args.threads)
    t = time.perf_counter()
    agent = AgentClient(args.agent, timeout=300, token=auth.secret(args.token_file))
    host = InferenceHost(spec, args.block_tokens, agent, args.holder, args.lock_file)
    _say({"ready": args.name, "fingerprint": fingerprint(host.model), "threads": torch.get_num_threads(),
          "load_s": round(time.perf_counter() - t, 2)})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        time.sleep(max(0.0, float(cmd["go"]) - time.time()))
        try:
            answer = host.request([int(x) for x in cmd["prompt"]], fetch=bool(cmd["fetch"]),
                                  serial=bool(cmd["serial"]), steps=int(cmd["steps"]), timeout=float(cmd["timeout"]))
        except (ApiError, ValueError, RuntimeError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        _say(answer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
