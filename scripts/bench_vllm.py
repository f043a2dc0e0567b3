"""vLLM with kvpool: the connector's load path against the agent's raw fetch, and TTFT with a hit against a prefill.

Runs in the vLLM venv (``scripts/setup_vllm.sh``)::

    .venv-vllm/bin/python scripts/bench_vllm.py            # --help for the knobs

Two kvpool-agent processes on loopback, as ``scripts/bench_hostagent.py`` starts them: a
holder, and the requester beside one in-process ``vllm.LLM`` (CPU build, one process) whose
``KvpoolConnector`` talks to the requester and fetches from the holder over kvpool UDP.
The model is a randomly initialised Qwen2-architecture config saved with ``save_pretrained``
(no downloads); by default Qwen2.5-0.5B's geometry, ``--layers`` to cut it down.

* **load**: the connector's load path (``KvpoolConnector._load``: fetch through the requester
  agent from the holder, check, write into every layer of vLLM's paged KV cache) against the
  agent's raw fetch of the same chunks (``AgentClient.fetch_chunks``, bytes handed back and
  nothing else), paired and interleaved; ``load_vs_raw_fetch`` is the median of raw time /
  load time, i.e. the load path's share of the raw fetch's goodput (target >= 0.8).
* **ttft**: per prompt length, ``generate(max_tokens=1)`` wall time of a full prefill (a
  fresh ``cache_salt``: kvpool misses) against a kvpool hit (every full chunk of the shared
  prefix fetched from the holder), interleaved; the first tokens must agree.

The holder agent answers the scheduler's lookup (the connector's ``lookup_url``): in a
deployment the controller's directory tells the requester agent that the holder has the
chunks, and there is no controller here.  ``keep: false``: the requester keeps no fetched
chunk, so every hit crosses UDP (the raw fetch too).  Saves are off while timing; one run per
prompt length publishes its chunks first, straight to the holder.  Ratios of one run only: the
machine's load moves the absolute times.  ``--save`` writes both tables as
``results/bench-vllm-{load,ttft}.json`` (``kvpool report``'s ``table`` kind).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.report import save_table

MIB = 1 << 20
SUFFIX = 16
"""Tokens of a prompt after its shared prefix (the question): always computed."""
VOCAB = 32768
"""Qwen2.5's vocabulary is 151,936 tokens; the prefill's cost is the layers', so a smaller one saves memory."""


def _progress(msg: str) -> None:
    """Progress to stderr so stdout stays a clean table."""
    print(f"[bench-vllm] {msg}", file=sys.stderr, flush=True)


def qwen_like(path: Path, layers: int) -> dict[str, Any]:
    """A randomly initialised Qwen2.5-0.5B-shaped model (``layers`` of its 24) and a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    geometry: dict[str, Any] = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": layers,
                                "num_attention_heads": 14, "num_key_value_heads": 2}
    cfg = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=32768, rope_theta=1_000_000.0,  # type: ignore[call-arg]
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, **geometry)
    Qwen2ForCausalLM(cfg).save_pretrained(path)  # type: ignore[no-untyped-call]
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",  # type: ignore[no-untyped-call]
                                   eos_token="t2")
    fast.save_pretrained(path)
    return geometry


class Bench:
    """The agents, the engine and the two connector halves of one run."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        from vllm import LLM
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        from hostagent.client import AgentClient
        from hostagent.daemon import spawn_agent

        self.args = args
        _progress(f"model: Qwen2.5-0.5B shape, {args.layers} layers, {args.dtype}")
        self.geometry = qwen_like(tmp / "model", args.layers)
        self.holder = spawn_agent(tmp / "holder", "--log-level", "WARNING")
        self.requester = spawn_agent(tmp / "requester", "--log-level", "WARNING")
        self.hc, self.rc = AgentClient(self.holder.api_url), AgentClient(self.requester.api_url)
        self.model_id = f"bench-vllm-qwen2.5-0.5b-shape-{args.layers}l-{args.dtype}"
        extra = {"agent_url": self.requester.api_url, "holder": self.holder.udp_address,
                 "lookup_url": self.holder.api_url, "keep": False, "model_id": self.model_id,
                 "lookup_timeout_s": 10.0, "fetch_timeout_s": 300.0, "save_timeout_s": 300.0, "save": False}
        transfer = KVTransferConfig(kv_connector="KvpoolConnector", kv_connector_module_path="hostagent.vllm_connector",
                                    kv_role="kv_both", kv_load_failure_policy="recompute",
                                    kv_connector_extra_config=extra)
        max_len = max(args.lengths) + SUFFIX + 8
        _progress("engine")
        self.llm = LLM(model=str(tmp / "model"), dtype=args.dtype, enforce_eager=True, block_size=args.block,
                       enable_prefix_caching=False, max_model_len=max_len, max_num_batched_tokens=max_len,
                       seed=0, kv_transfer_config=transfer)
        self.worker = get_kv_transfer_group()
        self.scheduler = self.llm.llm_engine.engine_core.engine_core.scheduler.connector
        self.chunk_tokens: int = self.worker.chunk_tokens
        self.chunk_shape, self.chunk_bytes = self._chunk_geometry()

    def _chunk_geometry(self) -> tuple[tuple[int, ...], int]:
        """A chunk's tensor shape ``[L, 2, H, T, D]`` in this engine, and its serialized size."""
        import torch

        from hostagent.serialize import serialized_size

        first = self.worker._layers[0]  # [blocks, 2, block_size, kv_heads, head_dim] views
        shape = (len(self.worker._layers), 2, first.shape[3], self.chunk_tokens, first.shape[4])
        return shape, serialized_size(torch.empty(shape, dtype=first.dtype))

    def close(self) -> None:
        """Stop the agents and let the engine go."""
        self.holder.stop()
        self.requester.stop()

    # -------------------------------------------------------------------------------- load
    def bench_load(self) -> tuple[list[list[str]], dict[str, float], list[str]]:
        """The connector's load path against the agent's raw fetch of the same chunks."""
        import torch

        from hostagent.layouts import chunks_from_paged, write_chunks_to_paged
        from hostagent.serialize import deserialize, serialize
        from hostagent.vllm_connector import LoadSpec

        layers = self.worker._layers
        first = layers[0]
        heads, dim = first.shape[3], first.shape[4]
        n = max(1, self.args.load_tokens // self.chunk_tokens)
        gen = torch.Generator().manual_seed(1)
        chunks = torch.randn((n, *self.chunk_shape), generator=gen).to(first.dtype)
        blobs = [bytes(serialize(chunks[i])) for i in range(n)]
        keys = [0x6B76_7600_0000_0000 + i for i in range(n)]
        total = sum(len(b) for b in blobs)
        self.hc.publish_chunks(keys, blobs)
        block_ids = list(range(1, n * self.worker.settings.chunk_blocks + 1))  # block 0 is vLLM's null block
        holder = self.holder.udp_address
        _progress(f"load: {n} chunks of {len(blobs[0])} B ({total / MIB:.0f} MiB), {self.args.reps} paired reps")

        def raw() -> None:
            got, _, stopped = self.rc.fetch_chunks(keys, holder, timeout=300, local=False)
            if len(got) != n:
                raise RuntimeError(f"raw fetch got {len(got)}/{n} chunks: {stopped}")

        def load() -> None:
            if not self.worker._load(LoadSpec("bench", keys, block_ids)):
                raise RuntimeError(f"the connector's load failed: {self.worker.counters}")

        fetched: list[memoryview] = []

        def copy_only() -> None:
            for blob in fetched:  # what _load does after the fetch, from chunks already in writable memory
                chunk = deserialize(blob)  # a view: no copy, the checksum checked
                blocks = self.worker._blocks_of(chunk, self.worker.settings.chunk_blocks)
                write_chunks_to_paged(layers, block_ids[: len(blocks)], blocks)

        times: dict[str, list[float]] = {"raw": [], "load": [], "copy": []}
        for rep in range(-1, self.args.reps):  # rep -1: untimed warm-up
            for name, fn in (("raw", raw), ("load", load)):
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                if rep >= 0:
                    times[name].append(dt)
            if rep >= 0:
                _progress(f"load rep {rep}: raw {total / times['raw'][-1] / 1e6:.0f} MB/s, "
                          f"load {total / times['load'][-1] / 1e6:.0f} MB/s")
        # The load path wrote what the holder was given: compare every layer of every block.
        back = chunks_from_paged(layers, block_ids)
        cb = self.worker.settings.chunk_blocks
        want = chunks.view(n, len(layers), 2, heads, cb, self.worker.block_size, dim).permute(0, 4, 1, 2, 3, 5, 6)
        if not torch.equal(back, want.reshape(back.shape)):
            raise RuntimeError("the paged cache does not hold the chunks the holder was given")
        fetched.extend(memoryview(bytearray(b)) for b in blobs[: max(1, n // 4)])
        copy_times = []
        for _ in range(self.args.reps):
            t0 = time.perf_counter()
            copy_only()
            copy_times.append((time.perf_counter() - t0) * n / len(fetched))
        times["copy"] = copy_times
        ratios = [r / ld for r, ld in zip(times["raw"], times["load"], strict=True)]
        headline = statistics.median(ratios)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows = [["agent's raw fetch (AgentClient.fetch_chunks)", f"{med['raw'] * 1e3:.0f}",
                 f"{total / med['raw'] / 1e6:.0f}", "1.00"],
                ["connector load path (KvpoolConnector._load)", f"{med['load'] * 1e3:.0f}",
                 f"{total / med['load'] / 1e6:.0f}", f"{headline:.2f}"],
                ["  of which check + copy into the paged cache", f"{med['copy'] * 1e3:.0f}",
                 f"{total / med['copy'] / 1e6:.0f}", "-"]]
        notes = [
            f"{n} chunks of {self.chunk_tokens} tokens ({len(blobs[0]) / MIB:.2f} MiB each, {total / MIB:.0f} MiB), "
            f"holder agent -> requester agent over kvpool UDP on 127.0.0.1, {self.args.reps} paired reps (medians)",
            "load: the fetch plus the integrity check and the copy into every layer's blocks, checked afterwards; "
            f"the check and copy alone (from chunks already fetched) take {med['copy'] / med['load']:.0%} of it",
            "goodput vs raw fetch: the median of the paired raw/load time ratios: "
            + ", ".join(f"{r:.2f}" for r in ratios),
        ]
        return rows, {"load_vs_raw_fetch": headline}, notes

    # -------------------------------------------------------------------------------- ttft
    def generate(self, tokens: list[int], salt: str) -> tuple[float, int]:
        """Wall time of one ``generate(max_tokens=1)`` (its TTFT) and the token."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=tokens)
        prompt["cache_salt"] = salt
        t0 = time.perf_counter()
        out = self.llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        return time.perf_counter() - t0, int(out[0].outputs[0].token_ids[0])

    def bench_ttft(self) -> tuple[list[list[str]], dict[str, float], list[str]]:
        """TTFT of a kvpool hit against a full prefill, per prompt length."""
        import torch

        from hostagent.chunking import chunk_keys

        rows: list[list[str]] = []
        summary: dict[str, float] = {}
        fresh = iter(range(1 << 30))
        worker_settings, scheduler_settings = self.worker.settings, self.scheduler.settings
        for length in self.args.lengths:
            gen = torch.Generator().manual_seed(length)
            tokens = torch.randint(3, VOCAB, (length + SUFFIX,), generator=gen).tolist()
            salt = f"hit-{length}"
            keys = chunk_keys(self.model_id, tokens, self.chunk_tokens, salt=salt)
            _progress(f"ttft {length}: publishing {len(keys)} chunks to the holder (one prefill, saved there)")
            # One prefill whose chunks the worker's half publishes straight to the holder.
            # (The scheduler's half decides what a step saves, the worker's half publishes it.)
            self.worker.settings = dataclasses.replace(worker_settings, save=True, agent_url=self.holder.api_url)
            self.scheduler.settings = dataclasses.replace(scheduler_settings, save=True)
            _, first = self.generate(tokens, salt)
            self.worker.flush(300)
            self.worker.settings, self.scheduler.settings = worker_settings, scheduler_settings
            if int(self.hc.lookup(keys)["local"]) != len(keys):
                raise RuntimeError(f"the holder holds {self.hc.lookup(keys)} of {len(keys)} chunks")
            pre: list[float] = []
            hit: list[float] = []
            for rep in range(self.args.reps):  # the run that published the chunks warmed this length up
                t_pre, tok_pre = self.generate(tokens, f"miss-{next(fresh)}")
                loaded = self.worker.counters["loaded_chunks"]
                t_hit, tok_hit = self.generate(tokens, salt)
                got = self.worker.counters["loaded_chunks"] - loaded
                if got != len(keys) or tok_hit != tok_pre or tok_pre != first:
                    raise RuntimeError(f"ttft {length}: the hit loaded {got}/{len(keys)} chunks; "
                                       f"first tokens {tok_pre} (prefill), {tok_hit} (hit), {first} (first run)")
                pre.append(t_pre)
                hit.append(t_hit)
                _progress(f"ttft {length} rep {rep}: prefill {t_pre * 1e3:.0f} ms, hit {t_hit * 1e3:.0f} ms")
            ratio = statistics.median(h / p for h, p in zip(hit, pre, strict=True))
            summary[f"ttft_hit_vs_prefill_{length}"] = ratio
            mib = len(keys) * self.chunk_bytes / MIB
            rows.append([f"{length} + {SUFFIX}", f"{len(keys) * self.chunk_tokens}", f"{mib:.1f}",
                         f"{statistics.median(pre) * 1e3:.0f}", f"{statistics.median(hit) * 1e3:.0f}", f"{ratio:.2f}"])
        notes = [
            f"a prompt is a shared prefix of n tokens and a {SUFFIX}-token question; a hit loads every full "
            f"{self.chunk_tokens}-token chunk of it from the holder (over UDP) and prefills the rest",
            "TTFT: wall time of LLM.generate(max_tokens=1), vLLM in one process; prefill: a fresh cache_salt "
            "(kvpool misses, vLLM's prefix cache off); first tokens equal in every pair",
            f"{self.args.reps} interleaved pairs per length (medians; ratio: median of the paired ratios)",
        ]
        return rows, summary, notes


def _print_table(title: str, columns: list[str], rows: list[list[str]], notes: list[str]) -> None:
    """One aligned table with its notes."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print(f"\n## {title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    for note in notes:
        print(f"  {note}")


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--lengths", default="512,1024,2048,4096,8192",
                   help="prompt lengths (shared-prefix tokens) for the TTFT table (default 512 to 8192)")
    p.add_argument("--layers", type=int, default=24, help="layers of the Qwen2.5-0.5B shape (default all 24)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="model and KV dtype (default float32: this CPU has no bf16 matrix units)")
    p.add_argument("--block", type=int, default=128, help="vLLM block size in tokens = one kvpool chunk (default 128)")
    p.add_argument("--load-tokens", type=int, default=4096, help="tokens of KV the load section moves (default 4096)")
    p.add_argument("--reps", type=int, default=3, help="timed pairs per measurement (default 3)")
    p.add_argument("--sections", default="load,ttft", help="comma-separated, from load, ttft (default both)")
    p.add_argument("--kv-cache-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE, whole GiB (default 4)")
    p.add_argument("--save", action="store_true", help="write results/bench-vllm-{load,ttft}.json")
    p.add_argument("--machine", help="a description of the machine for --save (default: CPUs and arch)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the sections, print their tables, then the summary lines."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.lengths = sorted({int(x) for x in args.lengths.split(",") if x.strip()})
    except ValueError:
        parser.error("--lengths: comma-separated integers")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not sections or set(sections) - {"load", "ttft"}:
        parser.error("--sections: from load, ttft")
    if not args.lengths or min(args.lengths) < args.block or args.reps < 1 or args.layers < 1:
        parser.error("--lengths must be at least one block, --reps and --layers positive")
    # vLLM reads these when imported: one process (no engine-core subprocess), a bounded KV cache.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    root = Path(__file__).resolve().parent.parent
    results: list[tuple[str, str, list[str], list[list[str]], dict[str, float], list[str]]] = []
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-vllm-") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            runs: list[tuple[str, str, list[str], Callable[[], tuple[list[list[str]], dict[str, float], list[str]]]]]
            runs = [("bench-vllm-load", "load: the connector's load path vs the agent's raw fetch",
                     ["path", "median ms", "MB/s", "goodput vs raw fetch"], bench.bench_load),
                    ("bench-vllm-ttft", f"TTFT: kvpool hit vs full prefill (Qwen2.5-0.5B shape, {args.layers} "
                     f"layers, {args.dtype}, random weights)",
                     ["prompt tokens", "from kvpool", "MiB fetched", "prefill ms", "hit ms", "hit / prefill"],
                     bench.bench_ttft)]
            for name, title, columns, fn in runs:
                if name.removeprefix("bench-vllm-") in sections:
                    rows, summary, notes = fn()
                    results.append((name, title, columns, rows, summary, notes))
        finally:
            bench.close()
    for name, title, columns, rows, _summary, notes in results:
        _print_table(title, columns, rows, notes)
        if args.save:
            saved = save_table(root, name, "scripts/bench_vllm.py", sys.argv[1:] if argv is None else argv, title,
                               columns, rows, notes, args.machine)
            print(f"  saved: {saved}")
    print(f"\nload average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          "compare ratios of one run only")
    print()
    for *_, summary, _notes in results:
        for key, value in summary.items():
            print(f"{key}={value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
