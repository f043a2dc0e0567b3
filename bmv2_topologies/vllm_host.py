"""One inference host of the ttft experiment with vLLM: a ``vllm.LLM`` whose prefix KV comes from kvpool.

Runs inside a Mininet host with the vLLM venv's Python (``scripts/setup_vllm.sh``):
``python -m bmv2_topologies.vllm_host``. It speaks ``bmv2_topologies.ttft_host``'s protocol
(a ready line, then one JSON command per stdin line, one JSON answer per stdout line), so the
experiment drives either engine the same way. The engine is vLLM's CPU build in one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), loading the model directory the experiment saved (the
same seeded Llama as ``ttft_host.build_model``), with ``KvpoolConnector``:

- ``fetch``: the prompt goes in as it is; the connector's scheduler half asks the holder's
  agent API (``lookup_url``: the holder stands in for the controller's directory, which the
  testbed does not run) how many leading chunks exist, and its worker half fetches them through
  this host's agent from the holder, across the switch, keeping none (``keep: false``, as
  ``ttft_host`` fetches with ``local=False``), then vLLM prefills the rest;
- no ``fetch``: the request carries a ``cache_salt`` of its own, so its chunk keys are new and
  vLLM prefills the whole prompt (the lookup still happens and misses).

TTFT is vLLM's own request metric (``RequestOutput.metrics.first_token_latency``: from the
request's arrival in the engine to its first token); ``fetch_ms`` is the connector's load time
in that request (fetch, integrity check, copy into the paged cache). With ``serial`` the host
takes ``--lock-file`` once its fetch is done (in the first engine step, after the connector's
load) and holds it until the request ends; the wait is left out of TTFT, so fetches still
overlap on the network while one host computes at a time. Nothing is published: the holder has
the prefix. The answer has ``ttft_host``'s fields (``top_logit`` is the first token's log-probability).

``--publish-prefix TOKENS.json --out DIR`` (outside Mininet, before the run) is the other use:
vLLM prefills the prefix with the connector saving to an agent in this process, and every
chunk it saved is written to ``DIR/<key>.chunk``: what the holder publishes, computed by the
engine that will read it (transformers' KV of the same weights differs in the last bits, enough
to flip a greedy token of a random model now and then).
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

SALTS = itertools.count()


class ComputeLock:
    """The machine-wide compute lock (``flock``), taken once per request after its loads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: TextIO | None = None
        self.wanted = False
        self.wait_s = 0.0

    def take(self) -> None:
        """Take the lock if this request wants it and does not hold it yet; count the wait."""
        if not self.wanted or self.file is not None:
            return
        t0 = time.perf_counter()
        self.file = self.path.open("a")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        self.wait_s += time.perf_counter() - t0

    def release(self) -> None:
        """Give the lock back (if held) and forget the request."""
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None
        self.wanted = False


class VllmHost:
    """The engine, its connector's worker half and the request logic of one host."""

    def __init__(self, model_dir: Path, model_id: str, block_tokens: int, agent: str, lookup: str, holder: str,
                 token_file: Path | None, lock: ComputeLock, max_model_len: int, fetch_timeout_s: float) -> None:
        from vllm import LLM
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        extra: dict[str, Any] = {"agent_url": agent, "lookup_url": lookup, "holder": holder, "keep": False,
                                 "save": False, "model_id": model_id, "fetch_timeout_s": fetch_timeout_s,
                                 "lookup_timeout_s": 10.0}
        if token_file is not None:  # the file, not the token: vLLM logs this config
            extra["token_file"] = str(token_file)
        transfer = KVTransferConfig(kv_connector="KvpoolConnector", kv_connector_module_path="hostagent.vllm_connector",
                                    kv_role="kv_both", kv_load_failure_policy="recompute",
                                    kv_connector_extra_config=extra)
        self.llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, block_size=block_tokens,
                       enable_prefix_caching=False, max_model_len=max_model_len, seed=0, disable_log_stats=False,
                       kv_transfer_config=transfer)
        self.connector: Any = get_kv_transfer_group()
        self.block_tokens = block_tokens
        self.lock = lock
        # Serial compute: the lock is taken at the end of the connector's load, in the engine step.
        load = self.connector.start_load_kv

        def load_then_lock(*args: Any, **kwargs: Any) -> None:
            load(*args, **kwargs)
            lock.take()

        self.connector.start_load_kv = load_then_lock
        self.generate([3] * (2 * block_tokens), fetch=False, steps=1)  # kernels and caches warm, not timed

    def generate(self, prompt: list[int], *, fetch: bool, steps: int) -> Any:
        """One request through the engine; its ``RequestOutput``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        tp = TokensPrompt(prompt_token_ids=prompt)
        if not fetch:
            tp["cache_salt"] = f"full-prefill-{os.getpid()}-{next(SALTS)}"
        params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=0)
        return self.llm.generate([tp], params, use_tqdm=False)[0]

    def request(self, prompt: list[int], *, fetch: bool, serial: bool, steps: int) -> dict[str, Any]:
        """One request from its start to its greedy tokens; TTFT from vLLM's metrics."""
        c = self.connector
        loaded, failed, load_s = c.counters["loaded_chunks"], c.counters["load_failed_chunks"], c.load_seconds
        self.lock.wanted, self.lock.wait_s = serial, 0.0
        start_wall, t0 = time.time(), time.perf_counter()
        try:
            out = self.generate(prompt, fetch=fetch, steps=steps)
        finally:
            self.lock.release()
        wall = time.perf_counter() - t0
        metrics = out.metrics
        ttft = float(metrics.first_token_latency) if metrics is not None and metrics.first_token_latency else wall
        wait = self.lock.wait_s
        fetch_s = c.load_seconds - load_s
        cached = (c.counters["loaded_chunks"] - loaded) * self.block_tokens
        completion = out.outputs[0]
        top = completion.logprobs[0][completion.token_ids[0]].logprob if completion.logprobs else float("nan")
        lost = c.counters["load_failed_chunks"] - failed
        return {"start": start_wall, "ttft_ms": (ttft - wait) * 1e3, "fetch_ms": fetch_s * 1e3,
                "prefill_ms": (ttft - wait - fetch_s) * 1e3, "wait_ms": wait * 1e3, "cached_tokens": cached,
                "prefill_tokens": len(prompt) - cached, "tokens": list(completion.token_ids), "top_logit": top,
                "stopped": f"{lost} chunks failed to load: recomputed" if lost else None}


_ANSWERS: TextIO = sys.stdout
"""Where answers go: the process's stdout, which nothing else may write to (``main`` sees to it)."""


def publish_prefix(model_dir: Path, model_id: str, block_tokens: int, prefix: list[int], out: Path,
                   max_model_len: int) -> int:
    """Prefill ``prefix`` with the connector saving to an in-process agent; write its chunks to ``out``."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.inputs import TokensPrompt

    from hostagent.chunking import chunk_keys
    from hostagent.daemon import Agent, AgentConfig

    agent = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))
    agent.start()
    try:
        extra = {"agent_url": agent.api_url, "model_id": model_id, "load": False, "save": True}
        transfer = KVTransferConfig(kv_connector="KvpoolConnector", kv_connector_module_path="hostagent.vllm_connector",
                                    kv_role="kv_both", kv_load_failure_policy="recompute",
                                    kv_connector_extra_config=extra)
        llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, block_size=block_tokens,
                  enable_prefix_caching=False, max_model_len=max_model_len, seed=0, kv_transfer_config=transfer)
        llm.generate([TokensPrompt(prompt_token_ids=prefix)], SamplingParams(temperature=0.0, max_tokens=1),
                     use_tqdm=False)
        get_kv_transfer_group().flush()
        out.mkdir(parents=True, exist_ok=True)
        keys = chunk_keys(model_id, prefix, block_tokens)
        for key in keys:
            blob = agent.chunk(key)
            if blob is None:
                raise RuntimeError(f"the connector saved no chunk {key:#018x} of the prefix")
            (out / f"{key:016x}.chunk").write_bytes(bytes(blob))
        return len(keys)
    finally:
        agent.stop()


def _say(obj: object) -> None:
    print(json.dumps(obj), file=_ANSWERS, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Serve ``go`` commands until ``quit``; 2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="python -m bmv2_topologies.vllm_host",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--publish-prefix", type=Path, metavar="TOKENS_JSON",
                    help="instead of serving: prefill these tokens, write the chunks to --out, exit")
    ap.add_argument("--out", type=Path, help="where --publish-prefix writes <key>.chunk files")
    ap.add_argument("--name", help="this host's name (echoed in the ready line)")
    ap.add_argument("--model-dir", type=Path, required=True, help="the saved model (config, weights, tokenizer)")
    ap.add_argument("--model-id", required=True, help="the model id of the chunk keys (the holder's)")
    ap.add_argument("--block-tokens", type=int, required=True, help="tokens per chunk = vLLM's block size")
    ap.add_argument("--agent", help="the local agent's API (unix:/path or http://host:port)")
    ap.add_argument("--lookup", help="the API of the agent that answers lookups (the holder's)")
    ap.add_argument("--holder", help="the holder's kvpool address host:port")
    ap.add_argument("--lock-file", type=Path, help="the machine-wide compute lock for serial requests")
    ap.add_argument("--token-file", type=Path, help="the operator's token file (default: kvpool.auth's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for this host (default 1)")
    ap.add_argument("--max-model-len", type=int, default=2048, help="longest prompt + output (default 2048)")
    ap.add_argument("--fetch-timeout", type=float, default=60.0, help="bound on one load (default 60 s)")
    args = ap.parse_args(argv)
    if args.block_tokens < 1 or args.block_tokens % 32 or args.threads < 1:
        ap.error("--block-tokens must be a positive multiple of 32 (vLLM's CPU attention), --threads positive")
    needed = {"--out": args.out} if args.publish_prefix else {
        "--name": args.name, "--agent": args.agent, "--lookup": args.lookup, "--holder": args.holder,
        "--lock-file": args.lock_file}
    missing = [flag for flag, value in needed.items() if value is None]
    if missing:
        ap.error(f"missing {', '.join(missing)}")
    # The answers keep stdout to themselves: vLLM logs to stdout, so everything else written to
    # file descriptor 1 (Python or C) goes to stderr from here on.
    global _ANSWERS
    sys.stdout.flush()
    _ANSWERS = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    # vLLM reads these at import: one process, a small KV cache, this host's own thread count.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    if args.publish_prefix is not None:
        prefix = [int(x) for x in json.loads(args.publish_prefix.read_text())]
        n = publish_prefix(args.model_dir, args.model_id, args.block_tokens, prefix, args.out, args.max_model_len)
        _say({"published": n})
        return 0
    t = time.perf_counter()
    host = VllmHost(args.model_dir, args.model_id, args.block_tokens, args.agent, args.lookup, args.holder,
                    args.token_file.resolve() if args.token_file else None,
                    ComputeLock(args.lock_file), args.max_model_len, args.fetch_timeout)
    _say({"ready": args.name, "fingerprint": None, "threads": torch.get_num_threads(),
          "load_s": round(time.perf_counter() - t, 2)})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        time.sleep(max(0.0, float(cmd["go"]) - time.time()))
        try:
            answer = host.request([int(x) for x in cmd["prompt"]], fetch=bool(cmd["fetch"]),
                                  serial=bool(cmd["serial"]), steps=int(cmd["steps"]))
        except (ValueError, RuntimeError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        _say(answer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
