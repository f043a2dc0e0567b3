"""ttft: the compute saved, made real on a model that runs.

Every inference host of the Mininet star runs a real transformers model
(``bmv2_topologies.ttft_host``: a random-initialised Llama-style decoder, the same seeded
weights everywhere) and serves requests whose prompts share one hot prefix (a system
prompt) and end with tokens of their own. A request either prefills the whole prompt
(``full``) or asks its local ``kvpool-agent`` for the prefix's KV, which the agent fetches
from the holder ``h0`` through the switch (``plain``: forwarding only; ``multicast``:
coalescing + multicast; ``pool``: plus the switch pool), and prefills only the rest. TTFT
is the time from a request's start to its first token's logits on the host's own clock;
the greedy tokens of every request must be the same either way (a mismatch fails the run).

All requesters of a wave start at the same instant. This machine has two cores for all
hosts, so two compute schemes: ``serial`` (one host computes at a time and the wait for
the compute lock is left out of TTFT: as if every host had its own processor; fetches
still overlap on the network) and ``shared`` (every host computes at once, one torch
thread each, and TTFT is plain wall time: what contention does). A sweep of prefix lengths
at one requester finds where fetching stops paying (the break-even).

``engine="vllm"`` runs vLLM instead on every requester (``bmv2_topologies.vllm_host``, with the
vLLM venv's Python): the same seeded model, saved once for all hosts, and kvpool's KV connector
fetching the prefix through the host's agent; TTFT is then vLLM's own request metric.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bmv2_topologies.experiment.capture import holder_traffic
from bmv2_topologies.experiment.config import DemoConfig
from bmv2_topologies.experiment.report import ModeResult, percentile
from bmv2_topologies.experiment.testbed import SINK_ADDRESS, Testbed, reap
from bmv2_topologies.experiment.ttft_config import ModelSpec, TtftConfig
from bmv2_topologies.experiment.workload import Workload
from bmv2_topologies.network import NetworkError, mininet_available
from bmv2_topologies.ttft_host import build_model, fingerprint, save_model
from controller.sim.experiments.common import md_table, pyplot
from hostagent.chunking import chunk_keys
from hostagent.layouts import chunks_from_hf
from hostagent.serialize import serialize
from kvpool import wire

log = logging.getLogger("kvpool.ttft")

REPO = Path(__file__).resolve().parents[2]
"""The checkout: the vLLM venv lives at its root by default (scripts/setup_vllm.sh)."""

FRAME_OVERHEAD = wire.ETHERNET_HEADER_LEN + wire.IPV4_HEADER_LEN + wire.UDP_HEADER_LEN
"""Bytes around a kvpool datagram on the wire (Ethernet, IPv4, UDP)."""


class TtftError(RuntimeError):
    """The experiment could not run (network, hosts) or a host failed in a way that voids it."""


# ------------------------------------------------------------------------------ prompts and KV
@dataclass
class Prompts:
    """The shared prefix and every request's own tokens, drawn from one seed."""

    prefix: list[int]
    vocab: int
    suffix_tokens: int
    seed: int
    _own: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)

    @classmethod
    def draw(cls, cfg: TtftConfig) -> Prompts:
        """The prefix (the longest any request reads) for ``cfg``."""
        gen = torch.Generator().manual_seed(cfg.seed)
        prefix = torch.randint(0, cfg.model.vocab, (cfg.published_tokens,), generator=gen).tolist()
        return cls(prefix, cfg.model.vocab, cfg.suffix_tokens, cfg.seed)

    def prompt(self, prefix_tokens: int, kind: str, wave: int, requester: int) -> list[int]:
        """``prefix_tokens`` of the prefix and the request's own tokens (the same for every mode and scheme)."""
        key = (kind, wave, requester)
        if key not in self._own:
            # crc32 of the request's name: the same tokens whatever order the requests are drawn in.
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(repr(key).encode()))
            self._own[key] = torch.randint(0, self.vocab, (self.suffix_tokens,), generator=gen).tolist()
        return self.prefix[:prefix_tokens] + self._own[key]


def vllm_python() -> Path:
    """The vLLM venv's Python (``KVPOOL_VLLM_VENV``, default ``.venv-vllm`` in the checkout)."""
    venv = Path(os.environ.get("KVPOOL_VLLM_VENV", REPO / ".venv-vllm"))
    python = (venv if venv.is_absolute() else REPO / venv) / "bin" / "python"
    if not python.exists():
        raise TtftError(f"--engine vllm: no vLLM venv at {python.parent.parent} (bash scripts/setup_vllm.sh, "
                        "or KVPOOL_VLLM_VENV)")
    return python


def publish_workload(spec: ModelSpec, prefix: list[int], block_tokens: int) -> tuple[Workload, str]:
    """The prefix's KV as the holder publishes it (one serialized chunk per block), and the model's fingerprint."""
    model = build_model(spec)
    with torch.no_grad():
        out = model(torch.tensor([prefix]), use_cache=True, logits_to_keep=1)
    chunks = chunks_from_hf(out.past_key_values, block_tokens)
    keys = chunk_keys(spec.model_id, prefix, block_tokens)
    blobs = {k: bytes(serialize(chunks[i])) for i, k in enumerate(keys)}
    parents: dict[int, int | None] = {k: (keys[i - 1] if i else None) for i, k in enumerate(keys)}
    positions = {k: i for i, k in enumerate(keys)}
    return Workload([], blobs, parents, positions), fingerprint(model)


def vllm_workload(cfg: TtftConfig, prefix: list[int], model_dir: Path) -> Workload:
    """The prefix's KV as vLLM computes it (``vllm_host --publish-prefix``), from the model saved in ``model_dir``."""
    save_model(cfg.model, model_dir)
    tokens = model_dir.parent / "prefix.json"
    tokens.write_text(json.dumps(prefix))
    out = model_dir.parent / "prefix-chunks"
    log_path = model_dir.parent / "publish.log"
    with log_path.open("wb") as err:
        done = subprocess.run(
            [str(vllm_python()), "-m", "bmv2_topologies.vllm_host", "--publish-prefix", str(tokens), "--out", str(out),
             "--model-dir", str(model_dir), "--model-id", cfg.model.model_id, "--block-tokens", str(cfg.block_tokens),
             "--max-model-len", str(len(prefix) + cfg.block_tokens)],
            stdout=subprocess.PIPE, stderr=err, timeout=600, check=False)
    if done.returncode != 0:
        raise TtftError(f"vLLM could not compute the prefix's KV (exit {done.returncode}; log: {log_path})")
    keys = chunk_keys(cfg.model.model_id, prefix, cfg.block_tokens)
    blobs = {k: (out / f"{k:016x}.chunk").read_bytes() for k in keys}
    parents: dict[int, int | None] = {k: (keys[i - 1] if i else None) for i, k in enumerate(keys)}
    return Workload([], blobs, parents, {k: i for i, k in enumerate(keys)})


# ------------------------------------------------------------------------------ the hosts
class Hosts:
    """The model process in every requester host, spoken to over its stdin/stdout (one JSON line each way)."""

    def __init__(self, bed: Testbed, cfg: TtftConfig, model_dir: Path | None = None) -> None:
        self.bed = bed
        self.cfg = cfg
        self.model_dir = model_dir
        """The saved model vLLM hosts load (``engine="vllm"``)."""
        self.procs: list[subprocess.Popen[bytes]] = []
        self.lines: list[queue.Queue[bytes]] = []
        self.ready: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def running(self, timeout_s: float = 300.0) -> Iterator[Hosts]:
        """Start a model process in every requester host and wait for all to be ready; end them by PID."""
        bed, cfg = self.bed, self.cfg
        holder = f"{bed.holder.address}:{wire.KVPOOL_UDP_PORT}"
        lock = (bed.run_dir / "compute.lock").resolve()
        assert bed.token is not None  # the testbed is running
        if cfg.engine == "vllm":
            assert self.model_dir is not None
            exe = [str(vllm_python()), "-m", "bmv2_topologies.vllm_host", "--model-dir", str(self.model_dir.resolve()),
                   "--model-id", cfg.model.model_id, "--lookup", bed.api(bed.holder.name),
                   "--max-model-len", str(cfg.published_tokens + cfg.suffix_tokens + cfg.steps + cfg.block_tokens),
                   "--fetch-timeout", str(cfg.fetch_timeout_s)]
        else:
            exe = [sys.executable, "-m", "bmv2_topologies.ttft_host", "--model", cfg.model.to_json()]
        try:
            for h in bed.requesters():
                with (bed.run_dir / f"{h.name}.{cfg.engine}_host.log").open("wb") as err:
                    proc = bed.popen(h.name, [
                        *exe, "--name", h.name, "--block-tokens", str(cfg.block_tokens),
                        "--agent", bed.api(h.name), "--holder", holder, "--lock-file", str(lock),
                        "--token-file", str(bed.token.path), "--threads", str(cfg.threads)],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
                self.procs.append(proc)
                lines: queue.Queue[bytes] = queue.Queue()
                threading.Thread(target=self._pump, args=(proc, lines), daemon=True).start()
                self.lines.append(lines)
            deadline = time.monotonic() + timeout_s
            for i, h in enumerate(bed.requesters()):
                answer = self._read(i, max(1.0, deadline - time.monotonic()))
                if "ready" not in answer:
                    raise TtftError(f"model host on {h.name} did not start: {answer.get('error', answer)} "
                                    f"(log: {bed.run_dir / h.name}.{cfg.engine}_host.log)")
                self.ready.append(answer)
            yield self
        finally:
            self._stop()

    @staticmethod
    def _pump(proc: subprocess.Popen[bytes], lines: queue.Queue[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(b"")  # end of output: the process exited

    def _read(self, i: int, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines[i].get(timeout=timeout)
        except queue.Empty:
            return {"error": f"no answer within {timeout:.0f} s"}
        if not line:
            return {"error": f"the process exited with code {self.procs[i].wait()}"}
        out: dict[str, Any] = json.loads(line)
        return out

    def _stop(self) -> None:
        for p in self.procs:
            if p.poll() is None and p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.write(b'{"quit": true}\n')
                    p.stdin.close()
        reap(self.procs)

    def wave(self, prompts: list[list[int]], *, fetch: bool, serial: bool) -> list[dict[str, Any]]:
        """Requesters 0..len(prompts)-1 start their request at the same instant; their answers in order."""
        go = time.time() + 0.3
        cfg = self.cfg
        for i, prompt in enumerate(prompts):
            cmd = {"go": go, "prompt": prompt, "fetch": fetch, "serial": serial, "steps": cfg.steps,
                   "timeout": cfg.fetch_timeout_s}
            pipe = self.procs[i].stdin
            assert pipe is not None
            pipe.write((json.dumps(cmd) + "\n").encode())
            pipe.flush()
        # Serial compute queues the hosts' prefills one after another: allow for all of them.
        return [self._read(i, cfg.fetch_timeout_s + 60.0 * len(prompts)) for i in range(len(prompts))]


# ------------------------------------------------------------------------------ one cell
@dataclass
class Cell:
    """Every request of one (compute scheme, requester count, mode), with what the network saw."""

    scheme: str
    requesters: int
    mode: str
    """``full`` (prefill everything) or the switch mode the prefix was fetched in."""
    answers: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    holder_bytes: int = 0
    holder_data: int = 0
    """DATA fragments the holder sent to requesters (from the capture)."""
    pushed: int = 0
    """DATA fragments the holder pushed towards the switch pool (pool mode's fills)."""
    switch_served: int = 0
    coalesced: int = 0
    peak_incast: int = 0
    seconds: float = 0.0

    def add(self, wave: int, answers: list[dict[str, Any]]) -> None:
        """Keep a wave's answers (tagged with wave and requester); a host's error is kept as text."""
        for r, a in enumerate(answers):
            if "error" in a:
                self.errors.append(f"{self.scheme} N={self.requesters} {self.mode} wave {wave} h{r + 1}: {a['error']}")
            else:
                self.answers.append({"wave": wave, "requester": r, **a})

    def tokens(self) -> dict[tuple[int, int], list[int]]:
        """(wave, requester) -> the greedy tokens."""
        return {(a["wave"], a["requester"]): a["tokens"] for a in self.answers}

    def summary(self, prefix_tokens: int, prefix_fragments: int, waves: int) -> dict[str, Any]:
        """The cell as result.json holds it (percentiles, tokens saved, bytes, and the raw per-request numbers)."""
        ttft = [a["ttft_ms"] for a in self.answers]
        saved = [a["cached_tokens"] for a in self.answers]
        requests = self.requesters * waves
        return {
            "scheme": self.scheme, "requesters": self.requesters, "mode": self.mode, "requests": requests,
            "failed": len(self.errors),
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "ttft_p50_ms_by_wave": [percentile([a["ttft_ms"] for a in self.answers if a["wave"] == w], 50)
                                    for w in range(waves)],
            "fetch_p50_ms": percentile([a["fetch_ms"] for a in self.answers], 50),
            "prefill_p50_ms": percentile([a["prefill_ms"] for a in self.answers], 50),
            "wait_p50_ms": percentile([a["wait_ms"] for a in self.answers], 50),
            "prefill_tokens_per_request": statistics.fmean(a["prefill_tokens"] for a in self.answers)
            if self.answers else float("nan"),
            "saved_tokens_per_request": statistics.fmean(saved) if saved else float("nan"),
            "saved_tokens_all_equal_prefix": bool(saved) and all(s == prefix_tokens for s in saved),
            "holder_bytes": self.holder_bytes,
            "holder_data_fragments": self.holder_data,
            "copies_per_wave": self.holder_data / (prefix_fragments * waves) if self.mode != "full" else 0.0,
            "pushed_fragments": self.pushed,
            "switch_served_fraction": self.switch_served / (prefix_fragments * requests)
            if self.mode != "full" else 0.0,
            "coalesced_gets": self.coalesced,
            "peak_incast": self.peak_incast,
            "seconds": self.seconds,
            "ttft_ms": ttft,
            "saved_tokens": saved,
            "top_logits": [a["top_logit"] for a in self.answers],
            "errors": self.errors,
        }


# ------------------------------------------------------------------------------ the run
class TtftRun:
    """The testbed, the hosts and the prompts of one ttft run; ``run()`` fills the result document."""

    def __init__(self, cfg: TtftConfig, out: Path, log_fn: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.log = log_fn
        self.prompts = Prompts.draw(cfg)
        t = time.perf_counter()
        model_dir: Path | None = None
        self.fingerprint: str | None = None
        if cfg.engine == "vllm":
            model_dir = out / "model"
            self.workload = vllm_workload(cfg, self.prompts.prefix, model_dir)
        else:
            self.workload, self.fingerprint = publish_workload(cfg.model, self.prompts.prefix, cfg.block_tokens)
        self.log(f"ttft: prefix KV of {cfg.published_tokens} tokens computed by {cfg.engine} in "
                 f"{time.perf_counter() - t:.1f} s")
        demo = DemoConfig(requesters=max(cfg.requesters), target=cfg.target, modes=cfg.modes,
                          block_tokens=cfg.block_tokens, holder_mbps=cfg.holder_mbps, out=out,
                          deadline_s=cfg.fetch_timeout_s, seed=cfg.seed)
        self.bed = Testbed(demo, self.workload)
        self.hosts = Hosts(self.bed, cfg, model_dir)
        self.keys = list(self.workload.blobs)

    def fragments(self, prefix_tokens: int) -> int:
        """Fragments of the first ``prefix_tokens`` tokens' chunks (one copy of that prefix)."""
        n = prefix_tokens // self.cfg.block_tokens
        return sum(wire.fragment_count(len(self.workload.blobs[k])) for k in self.keys[:n])

    def prefix_bytes(self, prefix_tokens: int) -> int:
        """Serialized bytes of the first ``prefix_tokens`` tokens' chunks."""
        return sum(len(self.workload.blobs[k]) for k in self.keys[: prefix_tokens // self.cfg.block_tokens])

    def run(self) -> dict[str, Any]:
        """Bring the star up, run every cell and the sweep, bring it down; the result document."""
        cfg = self.cfg
        cells: list[Cell] = []
        with self.bed.running(), self.hosts.running():
            # vLLM hosts all load the one directory saved from this model (nothing to compare).
            prints = {a["fingerprint"] for a in self.hosts.ready if a["fingerprint"] is not None}
            if prints - {self.fingerprint}:
                raise TtftError(f"the hosts' models differ from the holder's ({sorted(prints)} vs {self.fingerprint})")
            self.log(f"ttft: {len(self.hosts.ready)} model hosts ready "
                     f"(load {max(a['load_s'] for a in self.hosts.ready):.1f} s)")
            for scheme in cfg.schemes:
                for n in cfg.requesters:
                    cells.append(self._full_cell(scheme, n))
                    for mode in cfg.modes:
                        cells.append(self._kvpool_cell(scheme, n, mode))
            sweep = self._sweep()
        return self._document(cells, sweep)

    def _prompts(self, n: int, wave: int) -> list[list[int]]:
        return [self.prompts.prompt(self.cfg.prefix_tokens, "main", wave, r) for r in range(n)]

    def _done(self, cell: Cell) -> Cell:
        s = cell.summary(self.cfg.prefix_tokens, self.fragments(self.cfg.prefix_tokens), self.cfg.waves)
        self.log(f"ttft: {cell.scheme:6s} N={cell.requesters:<2d} {cell.mode:9s} TTFT p50 {s['ttft_p50_ms']:7.0f} ms "
                 f"p99 {s['ttft_p99_ms']:7.0f} ms  holder {cell.holder_bytes / 1e6:6.2f} MB  failed {s['failed']}")
        return cell

    def _full_cell(self, scheme: str, n: int) -> Cell:
        cell = Cell(scheme, n, "full")
        t = time.monotonic()
        for w in range(self.cfg.waves):
            cell.add(w, self.hosts.wave(self._prompts(n, w), fetch=False, serial=scheme == "serial"))
        cell.seconds = time.monotonic() - t
        return self._done(cell)

    def _kvpool_cell(self, scheme: str, n: int, mode: str) -> Cell:
        cell = Cell(scheme, n, mode)

        def waves(_result: ModeResult, _progress: object) -> None:
            for w in range(self.cfg.waves):
                if w:
                    time.sleep(self.cfg.settle_s)
                cell.add(w, self.hosts.wave(self._prompts(n, w), fetch=True, serial=scheme == "serial"))

        res = self.bed.run_mode(mode, None, waves)
        self._network(cell, res)
        return self._done(cell)

    def _network(self, cell: Cell, res: ModeResult) -> None:
        cell.holder_bytes, cell.seconds = res.holder_bytes, res.seconds
        cell.switch_served, cell.coalesced, cell.peak_incast = res.switch_served, res.coalesced, res.peak_incast
        pcap = res.pcaps.get(self.bed.holder.name)
        if pcap is not None:
            traffic = holder_traffic(pcap, self.bed.holder.address, res.window)
            for (_key, _frag, dst), count in traffic.data_out.items():
                if dst == SINK_ADDRESS:
                    cell.pushed += count
                else:
                    cell.holder_data += count

    def _sweep(self) -> dict[str, Any]:
        """One requester, serial compute, plain forwarding: full prefill vs fetch + the rest, per prefix length."""
        cfg = self.cfg
        points: list[dict[str, Any]] = []
        errors: list[str] = []

        def run_points(_result: ModeResult, _progress: object) -> None:
            for p in cfg.sweep_tokens:
                for rep in range(cfg.sweep_reps):
                    prompt = self.prompts.prompt(p, "sweep", rep, p)
                    full, kv = (self.hosts.wave([prompt], fetch=f, serial=True)[0] for f in (False, True))
                    if "error" in full or "error" in kv:
                        errors.append(f"sweep P={p} rep {rep}: {full.get('error') or kv.get('error')}")
                        continue
                    points.append({"prefix_tokens": p, "rep": rep, "full_ms": full["ttft_ms"],
                                   "kvpool_ms": kv["ttft_ms"], "fetch_ms": kv["fetch_ms"], "rest_ms": kv["prefill_ms"],
                                   "saved_tokens": kv["cached_tokens"], "prefix_bytes": self.prefix_bytes(p),
                                   "wire_bytes": self.fragments(p) * (wire.DATA_DATAGRAM_LEN + FRAME_OVERHEAD),
                                   "tokens_identical": full["tokens"] == kv["tokens"]})
                    self.log(f"ttft: sweep P={p:5d} full {full['ttft_ms']:7.0f} ms  kvpool {kv['ttft_ms']:7.0f} ms")

        self.bed.run_mode("plain", None, run_points)
        return {"points": points, "errors": errors, **break_even(points, cfg.prefix_tokens)}

    def _document(self, cells: list[Cell], sweep: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        frags = self.fragments(cfg.prefix_tokens)
        mismatches: list[str] = []
        full = {(c.scheme, c.requesters): c.tokens() for c in cells if c.mode == "full"}
        for c in cells:
            if c.mode == "full":
                continue
            want = full.get((c.scheme, c.requesters), {})
            for at, tokens in c.tokens().items():
                if at in want and want[at] != tokens:
                    mismatches.append(f"{c.scheme} N={c.requesters} {c.mode} wave {at[0]} h{at[1] + 1}: "
                                      f"{tokens} != full prefill's {want[at]}")
        mismatches += [f"sweep P={p['prefix_tokens']} rep {p['rep']}" for p in sweep["points"]
                       if not p["tokens_identical"]]
        spec = cfg.model
        return {
            "question": "ttft",
            "engine": cfg.engine,
            "target": self.bed.cfg.target,
            "model": {**json.loads(spec.to_json()), "model_id": spec.model_id, "kv_bytes_per_token":
                      spec.kv_bytes_per_token, "flops_per_token": spec.flops_per_token,
                      "flops_per_kv_byte": spec.flops_per_token / spec.kv_bytes_per_token},
            "holder_mbps": cfg.holder_mbps,
            "prefix_tokens": cfg.prefix_tokens,
            "suffix_tokens": cfg.suffix_tokens,
            "prefix_bytes": self.prefix_bytes(cfg.prefix_tokens),
            "prefix_fragments": frags,
            "waves": cfg.waves,
            "threads_per_host": cfg.threads,
            "host_load_s": [a["load_s"] for a in self.hosts.ready],
            "cells": [c.summary(cfg.prefix_tokens, frags, cfg.waves) for c in cells],
            "sweep": sweep,
            "mismatches": mismatches,
            "errors": [e for c in cells for e in c.errors] + sweep["errors"],
            "config": cfg.jsonable(),
        }


def break_even(points: list[dict[str, Any]], prefix_tokens: int) -> dict[str, Any]:
    """Where fetching the prefix's KV stops beating recomputing it, from the sweep's medians.

    ``crossing_tokens``: the prefix length where the two TTFT lines cross (linear
    interpolation between the sweep's points; None when they do not cross inside it,
    ``kvpool_wins_from`` says which side). ``fixed_ms`` and ``per_byte_ms``: a least-squares
    line of fetch time against bytes on the wire; ``break_even_mbps`` extrapolates it to the
    link rate at which fetching ``prefix_tokens`` would take as long as recomputing it,
    assuming the per-byte time scales with the link (true while the link is the bottleneck).
    """
    by_p: dict[int, list[dict[str, Any]]] = {}
    for pt in points:
        by_p.setdefault(pt["prefix_tokens"], []).append(pt)
    ps = sorted(by_p)
    med = {p: {k: statistics.median(x[k] for x in by_p[p]) for k in ("full_ms", "kvpool_ms", "fetch_ms", "rest_ms",
                                                                       "wire_bytes")} for p in ps}
    out: dict[str, Any] = {"medians": {str(p): med[p] for p in ps}, "crossing_tokens": None,
                           "kvpool_wins_from": None, "fixed_ms": None, "per_byte_ms": None,
                           "effective_mbps": None, "break_even_mbps": None}
    diff = [med[p]["kvpool_ms"] - med[p]["full_ms"] for p in ps]
    for i in range(1, len(ps)):
        if diff[i - 1] > 0 >= diff[i]:
            out["crossing_tokens"] = ps[i - 1] + (ps[i] - ps[i - 1]) * diff[i - 1] / (diff[i - 1] - diff[i])
            break
    if diff:
        wins = [p for p, d in zip(ps, diff, strict=True) if d <= 0]
        out["kvpool_wins_from"] = min(wins) if wins else None
    if len(ps) >= 2:
        xs = [med[p]["wire_bytes"] for p in ps]
        ys = [med[p]["fetch_ms"] for p in ps]
        slope, intercept = statistics.linear_regression(xs, ys)
        out["fixed_ms"], out["per_byte_ms"] = intercept, slope
        if slope > 0:
            out["effective_mbps"] = 8 / slope / 1e3
        at = med.get(prefix_tokens)
        if at is not None and slope > 0:
            budget = at["full_ms"] - at["rest_ms"] - intercept
            out["break_even_mbps"] = at["wire_bytes"] * 8 / budget / 1e3 if budget > 0 else None
    return out


# ------------------------------------------------------------------------------ table, plot, CLI
def table(res: dict[str, Any]) -> str:
    """The cells (per scheme, requester count and mode) and the sweep, as markdown tables."""
    m = res["model"]
    engine = res.get("engine", "transformers")
    how = ("vLLM with kvpool's KV connector (TTFT: vLLM's request metric)" if engine == "vllm"
           else "transformers")
    head = (f"ttft: {how} on every requester; {res['target']} switch, holder link {res['holder_mbps']:g} Mbit/s; "
            f"model {m['layers']} layers x "
            f"{m['hidden']} (KV {m['kv_bytes_per_token']} B/token, {m['flops_per_kv_byte'] / 1e3:.0f} kFLOP per KV "
            f"byte), fp32, {res['threads_per_host']} torch thread per host; prompts = {res['prefix_tokens']}-token "
            f"shared prefix ({res['prefix_bytes'] / 2**20:.2f} MiB of KV, {res['prefix_fragments']} fragments) + "
            f"{res['suffix_tokens']} own tokens; {res['waves']} wave(s) per row, all requesters at once.\n\n")
    base = {(c["scheme"], c["requesters"]): c for c in res["cells"] if c["mode"] == "full"}
    rows = []
    for c in res["cells"]:
        full = base.get((c["scheme"], c["requesters"]))
        ratio = f"{full['ttft_p50_ms'] / c['ttft_p50_ms']:.2f}x" if full and c["ttft_p50_ms"] > 0 else "-"
        rows.append([c["scheme"], str(c["requesters"]), c["mode"], f"{c['ttft_p50_ms']:.0f}", f"{c['ttft_p99_ms']:.0f}",
                     ratio, f"{c['fetch_p50_ms']:.0f}" if c["mode"] != "full" else "-",
                     f"{c['fetch_p50_ms'] / c['ttft_p50_ms']:.0%}" if c["mode"] != "full" and c["ttft_p50_ms"] > 0
                     else "-",
                     f"{c['prefill_tokens_per_request']:.0f}", f"{c['saved_tokens_per_request']:.0f}",
                     f"{c['holder_bytes'] / 1e6:.2f}", f"{c['copies_per_wave']:.2f}" if c["mode"] != "full" else "-",
                     f"{c['switch_served_fraction']:.0%}" if c["mode"] != "full" else "-", str(c["failed"])])
    main = md_table(["compute", "N", "mode", "TTFT p50 ms", "TTFT p99 ms", "faster than full", "fetch p50 ms",
                     "fetch share", "prefill tokens", "tokens saved", "holder MB", "copies / wave", "switch-served",
                     "failed"], rows)
    sw = res["sweep"]
    srows = [[p, f"{v['full_ms']:.0f}", f"{v['kvpool_ms']:.0f}", f"{v['fetch_ms']:.0f}", f"{v['rest_ms']:.0f}",
              f"{v['wire_bytes'] / 2**20:.2f}", "kvpool" if v["kvpool_ms"] < v["full_ms"] else "full"]
             for p, v in sw["medians"].items()]
    sweep = md_table(["prefix tokens", "full prefill ms", "fetch + rest ms", "fetch ms", "rest ms", "wire MiB",
                      "faster"], srows)
    cross = sw["crossing_tokens"]
    lines = [f"\n\nBreak-even sweep (1 requester, serial compute, plain forwarding; medians of "
             f"{res['config']['sweep_reps']}):\n\n{sweep}\n"]
    if cross is not None:
        lines.append(f"The lines cross at about {cross:.0f} prefix tokens.")
    elif sw["kvpool_wins_from"] is not None:
        lines.append(f"Fetching wins from {sw['kvpool_wins_from']} prefix tokens on (no crossing inside the sweep).")
    else:
        lines.append("Recomputing wins at every prefix length of the sweep.")
    if sw["fixed_ms"] is not None:
        be = sw["break_even_mbps"]
        lines.append(f" Fetch time ~ {sw['fixed_ms']:.0f} ms + bytes at {sw['effective_mbps']:.1f} Mbit/s; "
                     + (f"for the {res['prefix_tokens']}-token prefix fetching stops paying below about {be:.1f} "
                        "Mbit/s of holder link (extrapolated)." if be is not None else
                        f"for the {res['prefix_tokens']}-token prefix the fixed cost alone exceeds the prefill."))
    tail = "".join(lines)
    verdict = ("\n\nGreedy tokens identical to full prefill in every request." if not res["mismatches"] else
               f"\n\nTOKEN MISMATCHES: {len(res['mismatches'])}")
    return head + main + tail + verdict


def plot(res: dict[str, Any], path: Path) -> None:
    """TTFT p50 (and p99) against requesters per mode, one panel per compute scheme, and the break-even sweep."""
    plt = pyplot()
    schemes = [s for s in ("serial", "shared") if any(c["scheme"] == s for c in res["cells"])]
    fig, axes = plt.subplots(1, len(schemes) + 1, figsize=(4.6 * (len(schemes) + 1), 4.2))
    colors = {"full": "black", "plain": "tab:red", "multicast": "tab:blue", "pool": "tab:green"}
    ns = sorted({c["requesters"] for c in res["cells"]})
    top = max(c["ttft_p99_ms"] for c in res["cells"]) * 1.05
    for ax, scheme in zip(axes, schemes, strict=False):
        for mode, color in colors.items():
            cs = sorted((c for c in res["cells"] if c["scheme"] == scheme and c["mode"] == mode),
                        key=lambda c: c["requesters"])
            if cs:
                have = [c["requesters"] for c in cs]
                ax.plot(have, [c["ttft_p50_ms"] for c in cs], marker="o", color=color,
                        label="full prefill" if mode == "full" else f"fetch via kvpool, {mode}")
                ax.scatter(have, [c["ttft_p99_ms"] for c in cs], marker="_", s=160, color=color)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_ylim(0, top)
        ax.set_xlabel("simultaneous requesters (same prefix)")
        ax.set_ylabel("TTFT ms (dot: p50, dash: p99)")
        what = "one host computes at a time" if scheme == "serial" else "all hosts compute at once on 2 cores"
        ax.set_title(f"{scheme}: {what}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    b = axes[-1]
    med = res["sweep"]["medians"]
    ps = sorted(int(p) for p in med)
    b.plot(ps, [med[str(p)]["full_ms"] for p in ps], marker="o", color="black", label="full prefill")
    b.plot(ps, [med[str(p)]["kvpool_ms"] for p in ps], marker="o", color="tab:red", label="fetch KV + prefill rest")
    b.plot(ps, [med[str(p)]["fetch_ms"] for p in ps], ":", color="tab:red", label="of which fetch")
    if res["sweep"]["crossing_tokens"] is not None:
        b.axvline(res["sweep"]["crossing_tokens"], color="grey", linestyle="--", label="break-even")
    b.set_xscale("log", base=2)
    b.set_xticks(ps, [str(p) for p in ps])
    b.set_xlabel("shared prefix tokens (1 requester, serial)")
    b.set_ylabel("TTFT ms (median)")
    b.set_title("break-even: recompute vs fetch", fontsize=9)
    b.grid(True, alpha=0.3)
    b.legend(fontsize=7)
    m = res["model"]
    engine = " (vLLM)" if res.get("engine") == "vllm" else ""
    fig.suptitle(f"ttft: a {m['layers']}-layer, {m['hidden']}-wide Llama{engine} on every host; "
                 f"{res['prefix_tokens']}-token "
                 f"shared prefix, {res['holder_mbps']:g} Mbit/s holder link", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def execute(cfg: TtftConfig, out: Path, log_fn: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Run ttft for a validated ``cfg``; write ``out/ttft/{table.txt,result.json,plot.png}``; return the result.

    Raises ``TtftError`` when the run cannot happen (no Mininet, a host that does not start).
    """
    reason = mininet_available()
    if reason:
        raise TtftError(reason)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    folder = out / "ttft"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        res = TtftRun(cfg, folder, log_fn).run()
    except TtftError:
        raise
    except (NetworkError, RuntimeError, OSError) as exc:  # the testbed's: a switch or agent did not come up
        raise TtftError(str(exc)) from exc
    res["quick"] = cfg.quick
    res["runtime_s"] = time.perf_counter() - t0
    (folder / "table.txt").write_text(table(res) + "\n")
    (folder / "result.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, folder / "plot.png")
    return res
