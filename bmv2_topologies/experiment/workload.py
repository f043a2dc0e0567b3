"""The request stream an experiment replays and the chunks it reads.

The default stream is synthetic: waves in which every requester asks at the same moment
for a shared hot prefix (a system prompt), followed by ``tail_blocks`` blocks of its own;
a Mooncake-format trace can be replayed instead. Chunk keys are the real hash chain
(``hostagent.chunking``); chunk bytes are random fp16 KV of the configured geometry,
serialized as the agents store them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bmv2_topologies.experiment.config import DemoConfig
from hostagent.chunking import ROOT_KEY, block_key
from hostagent.serialize import serialize
from kvpool import wire
from kvpool.trace import Trace, TraceRequest, read_jsonl

MODEL_ID = "kvpool-demo/qwen2.5-0.5b-geometry"
"""Model id in the chunk keys (the KV geometry defaults are Qwen2.5-0.5B's)."""


@dataclass(frozen=True)
class Request:
    """One replayed request: when (s after start), which requester, which chunks (prefix order)."""

    at_s: float
    requester: int
    keys: tuple[int, ...]


@dataclass
class Workload:
    """The stream, the chunks the holder serves, and what the controller's catalog says of them."""

    requests: list[Request]
    blobs: dict[int, bytes]
    parents: dict[int, int | None]
    positions: dict[int, int]

    @property
    def fragments(self) -> int:
        """Fragments all requests fetch together."""
        return sum(wire.fragment_count(len(self.blobs[k])) for r in self.requests for k in r.keys)

    def waves(self) -> list[list[Request]]:
        """The requests grouped by start time (a wave: every request that starts at once)."""
        by_time: dict[float, list[Request]] = {}
        for r in self.requests:
            by_time.setdefault(r.at_s, []).append(r)
        return [by_time[t] for t in sorted(by_time)]


def wave_trace(cfg: DemoConfig) -> Trace:
    """The default stream (Mooncake format): waves where every requester wants the hot prefix at once.

    Hot prefix blocks are ids 0..hot_blocks-1; each request then has ``tail_blocks`` ids
    of its own (0 by default), so only the prefix is shared, as with a common system prompt.
    """
    reqs: list[TraceRequest] = []
    next_id = cfg.hot_blocks
    for w in range(cfg.waves):
        for _ in range(cfg.requesters):
            tail = tuple(range(next_id, next_id + cfg.tail_blocks))
            next_id += cfg.tail_blocks
            n_blocks = cfg.hot_blocks + cfg.tail_blocks
            reqs.append(TraceRequest(w * cfg.wave_gap_ms, n_blocks * cfg.block_tokens, 16,
                                     tuple(range(cfg.hot_blocks)) + tail))
    return Trace.from_requests(reqs)


def build_workload(cfg: DemoConfig) -> Workload:
    """Chunk keys, KV bytes and replay schedule for the stream (synthetic or ``cfg.trace``)."""
    trace = read_jsonl(cfg.trace) if cfg.trace is not None else wave_trace(cfg)
    n = min(len(trace), cfg.max_requests) if cfg.trace is not None else len(trace)
    if n == 0:
        raise ValueError("the trace has no requests")
    t0 = float(trace.timestamps[0])
    keys_of: dict[tuple[int, ...], int] = {}
    blobs: dict[int, bytes] = {}
    parents: dict[int, int | None] = {}
    positions: dict[int, int] = {}
    requests: list[Request] = []
    gen = torch.Generator().manual_seed(cfg.seed)
    for i in range(n):
        req = trace[i]
        keys: list[int] = []
        parent = ROOT_KEY
        for pos in range(len(req.hash_ids)):
            path = req.hash_ids[: pos + 1]
            key = keys_of.get(path)
            if key is None:
                # Token ids stand in for the block's text: the key chain is the real one.
                hid = path[-1]
                tokens = [(hid * cfg.block_tokens + j) % 151_936 for j in range(cfg.block_tokens)]
                key = block_key(MODEL_ID, parent, tokens)
                keys_of[path] = key
                kv = torch.randn(cfg.chunk_shape, generator=gen, dtype=torch.float32).to(torch.float16)
                blobs[key] = bytes(serialize(kv))
                parents[key] = None if pos == 0 else parent
                positions[key] = pos
            keys.append(key)
            parent = key
        at = (float(trace.timestamps[i]) - t0) / 1000.0 / cfg.time_scale
        requests.append(Request(at, i % cfg.requesters, tuple(keys)))
    return Workload(requests, blobs, parents, positions)
