"""Prefix-reuse request traces in the Mooncake JSONL format: reader, writer, synthetic generator.

One JSON object a line, as in the Mooncake FAST'25 trace release::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}

``timestamp`` is the arrival time in ms, ``input_length``/``output_length`` are token
counts, and ``hash_ids`` are the prefix block ids (one per ``block_tokens`` = 512 tokens):
equal ids at equal positions mean a reusable prefix block. The parent of ``hash_ids[i]``
is ``hash_ids[i - 1]``.

A :class:`Trace` keeps the requests in flat numpy arrays (CSR layout for the block ids)
so that a million-request trace fits in memory without a Python object per block.
This module is standalone (numpy only): the simulator and the Mininet replay share it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

#: tokens per block in the Mooncake traces
BLOCK_TOKENS = 512

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_MAX_ID = (1 << 63) - 1  # ids are stored as int64


class TraceError(ValueError):
    """A trace file or generator spec is invalid; the message names the line or option."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: arrival time (ms), token counts and prefix block ids."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order, stored column-wise; ``hash_ids`` of request i are
    ``blocks[offsets[i]:offsets[i + 1]]``."""

    timestamps: npt.NDArray[np.float64]
    input_lengths: npt.NDArray[np.int64]
    output_lengths: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    blocks: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.timestamps.shape[0])

    def __getitem__(self, i: int) -> TraceRequest:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return TraceRequest(
            float(self.timestamps[i]),
            int(self.input_lengths[i]),
            int(self.output_lengths[i]),
            tuple(int(x) for x in self.blocks[a:b]),
        )

    def __iter__(self) -> Iterator[TraceRequest]:
        for i in range(len(self)):
            yield self[i]

    @property
    def n_blocks(self) -> int:
        """Total number of block references (sum of the ``hash_ids`` lengths)."""
        return int(self.blocks.shape[0])

    @property
    def duration_ms(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.timestamps[-1] - self.timestamps[0]) if len(self) else 0.0

    @classmethod
    def from_requests(cls, requests: list[TraceRequest] | tuple[TraceRequest, ...]) -> Trace:
        """Build a trace from request objects (validated like a file)."""
        lens = [len(r.hash_ids) for r in requests]
        offsets = np.zeros(len(requests) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        blocks = np.fromiter((h for r in requests for h in r.hash_ids), dtype=np.int64, count=int(offsets[-1]))
        trace = cls(
            np.array([r.timestamp for r in requests], dtype=np.float64),
            np.array([r.input_length for r in requests], dtype=np.int64),
            np.array([r.output_length for r in requests], dtype=np.int64),
            offsets,
            blocks,
        )
        trace.validate()
        return trace

    def validate(self, source: str = "trace") -> None:
        """Raise :class:`TraceError` when the arrays are inconsistent or out of range."""
        n = len(self)
        if n == 0:
            raise TraceError(f"{source}: empty trace (no requests)")
        if self.offsets.shape != (n + 1,) or self.offsets[0] != 0 or self.offsets[-1] != self.n_blocks:
            raise TraceError(f"{source}: offsets do not match the block array")
        for name, arr in (("input_length", self.input_lengths), ("output_length", self.output_lengths)):
            bad = np.flatnonzero(arr < 0)
            if bad.size:
                raise TraceError(f"{source}: request {int(bad[0])}: negative {name} {int(arr[bad[0]])}")
        if np.any(np.diff(self.offsets) < 0):
            raise TraceError(f"{source}: offsets go backwards")
        if np.any(self.blocks < 0):
            i = int(np.searchsorted(self.offsets, int(np.flatnonzero(self.blocks < 0)[0]), side="right") - 1)
            raise TraceError(f"{source}: request {i}: negative hash id")
        back = np.flatnonzero(np.diff(self.timestamps) < 0)
        if back.size:
            raise TraceError(f"{source}: request {int(back[0]) + 1}: timestamp goes backwards")


def _parse_line(line: str, where: str) -> tuple[float, int, int, list[int]]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {', '.join(unknown)} (expected {', '.join(_FIELDS)})")
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(missing)}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise TraceError(f"{where}: timestamp must be a non-negative number, got {ts!r}")
    lengths = []
    for name in ("input_length", "output_length"):
        v = obj[name]
        if isinstance(v, bool) or not isinstance(v, int):
            raise TraceError(f"{where}: {name} must be an integer, got {v!r}")
        if v < 0:
            raise TraceError(f"{where}: negative {name} {v}")
        lengths.append(v)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise TraceError(f"{where}: hash_ids must be a list of integers")
    if any(h < 0 for h in ids):
        raise TraceError(f"{where}: negative hash id in hash_ids")
    if any(h > _MAX_ID for h in ids):
        raise TraceError(f"{where}: hash id above 2**63 - 1 in hash_ids")
    return float(ts), lengths[0], lengths[1], ids


def read_jsonl(path: str | Path) -> Trace:
    """Read and validate a Mooncake-format JSONL trace; errors name the file and line."""
    p = Path(path)
    try:
        fh = p.open("r", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{p}: cannot open trace ({exc.strerror})") from None
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    lens: list[int] = []
    blocks: list[int] = []
    prev = -1.0
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            t, i, o, ids = _parse_line(line, where)
            if t < prev:
                raise TraceError(f"{where}: timestamp {t:g} goes backwards (previous {prev:g}); sort the trace")
            prev = t
            ts.append(t)
            ins.append(i)
            outs.append(o)
            lens.append(len(ids))
            blocks.extend(ids)
    if not ts:
        raise TraceError(f"{p}: empty trace (no requests)")
    offsets = np.zeros(len(ts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lens, dtype=np.int64), out=offsets[1:])
    return Trace(
        np.asarray(ts, dtype=np.float64),
        np.asarray(ins, dtype=np.int64),
        np.asarray(outs, dtype=np.int64),
        offsets,
        np.asarray(blocks, dtype=np.int64),
    )


def write_jsonl(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` in the Mooncake JSONL format (integral timestamps written as ints)."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for i in range(len(trace)):
            a, b = int(trace.offsets[i]), int(trace.offsets[i + 1])
            t = float(trace.timestamps[i])
            obj = {
                "timestamp": int(t) if t.is_integer() else t,
                "input_length": int(trace.input_lengths[i]),
                "output_length": int(trace.output_lengths[i]),
                "hash_ids": trace.blocks[a:b].tolist(),
            }
            fh.write(json.dumps(obj) + "\n")


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of a synthetic trace: Zipf-shared prefixes, multi-turn sessions, Poisson arrivals.

    Each session starts from one of ``n_prefixes`` shared prefixes (system prompts, tool
    schemas, documents) drawn with Zipf exponent ``zipf_s``; every turn re-sends the whole
    conversation so far and appends ``turn_blocks`` new blocks (geometric, mean given).
    Sessions have a geometric number of turns (mean ``mean_turns``) and start as a Poisson
    process of rate ``rate_per_s / mean_turns``, so requests arrive at about ``rate_per_s``;
    the next turn of a session follows after an exponential think time of mean ``think_s``.
    """

    n_requests: int = 10_000
    rate_per_s: float = 5.0
    n_prefixes: int = 200
    zipf_s: float = 1.1
    prefix_blocks: int = 4
    mean_turns: float = 3.0
    turn_blocks: float = 3.0
    think_s: float = 60.0
    max_blocks: int = 256
    output_tokens: int = 300
    seed: int = 0

    def validate(self) -> None:
        """Raise :class:`TraceError` naming the first nonsensical option."""
        checks = (
            ("n_requests", self.n_requests >= 1),
            ("rate_per_s", self.rate_per_s > 0),
            ("n_prefixes", self.n_prefixes >= 1),
            ("zipf_s", self.zipf_s >= 0),
            ("prefix_blocks", self.prefix_blocks >= 0),
            ("mean_turns", self.mean_turns >= 1),
            ("turn_blocks", self.turn_blocks >= 1),
            ("think_s", self.think_s > 0),
            ("max_blocks", self.max_blocks >= self.prefix_blocks + 1),
            ("output_tokens", self.output_tokens >= 0),
        )
        for name, ok in checks:
            if not ok:
                raise TraceError(f"synthetic trace: invalid {name}={getattr(self, name)!r}")


def generate(spec: SyntheticSpec) -> Trace:
    """A synthetic trace following ``spec`` (deterministic for a given seed)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    n = spec.n_requests
    ranks = np.arange(1, spec.n_prefixes + 1, dtype=np.float64)
    weights = ranks ** (-spec.zipf_s)
    weights /= weights.sum()
    # Shared prefix p owns ids [p * prefix_blocks, (p + 1) * prefix_blocks); session blocks follow.
    next_id = spec.n_prefixes * spec.prefix_blocks
    # Draw in bulk: per-request random numbers are the slow part of a 1e6-request trace.
    # Sessions start at rate / mean_turns so that all turns together arrive at about rate_per_s.
    new_sessions = rng.exponential(1000.0 * spec.mean_turns / spec.rate_per_s, size=n)
    p_continue = 1.0 - 1.0 / spec.mean_turns
    cont = rng.random(n)
    turn_new = rng.geometric(1.0 / spec.turn_blocks, size=n)
    think = rng.exponential(spec.think_s * 1000.0, size=n)
    prefix_pick = rng.choice(spec.n_prefixes, size=n, p=weights)
    partial = rng.integers(0, BLOCK_TOKENS, size=n)

    import heapq  # local: only the generator needs a heap of pending follow-up turns

    pending: list[tuple[float, int, list[int]]] = []  # (arrival, tie, hash_ids of the previous turn)
    ts = np.empty(n, dtype=np.float64)
    ins = np.empty(n, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    blocks: list[int] = []
    t_new = new_sessions[0]
    tie = 0
    for i in range(n):
        if pending and pending[0][0] <= t_new:
            t, _, ids = heapq.heappop(pending)
        else:
            t = t_new
            t_new += new_sessions[i]
            p = int(prefix_pick[i])
            ids = list(range(p * spec.prefix_blocks, (p + 1) * spec.prefix_blocks))
        take = min(int(turn_new[i]), spec.max_blocks - len(ids))
        if take <= 0:  # the conversation hit the context limit: start over from its prefix
            ids = ids[: spec.prefix_blocks]
            take = int(turn_new[i])
        ids = ids + list(range(next_id, next_id + take))
        next_id += take
        ts[i] = t
        # The last block may be partial: input covers all but a random tail of it.
        ins[i] = len(ids) * BLOCK_TOKENS - int(partial[i])
        blocks.extend(ids)
        offsets[i + 1] = len(blocks)
        if cont[i] < p_continue:
            tie += 1
            heapq.heappush(pending, (t + float(think[i]), tie, ids))
    return Trace(
        np.floor(ts),
        ins,
        np.full(n, spec.output_tokens, dtype=np.int64),
        offsets,
        np.asarray(blocks, dtype=np.int64),
    )


def speed_up(trace: Trace, factor: float) -> Trace:
    """``trace`` played ``factor`` times faster: arrival times divided by ``factor`` (same requests).

    Load (requests per second) scales by ``factor``; what requests share does not change.
    """
    if not factor > 0 or not math.isfinite(factor):
        raise TraceError(f"speed-up factor must be a positive number, got {factor!r}")
    t0 = float(trace.timestamps[0]) if len(trace) else 0.0
    return Trace(
        t0 + (trace.timestamps - t0) / factor,
        trace.input_lengths,
        trace.output_lengths,
        trace.offsets,
        trace.blocks,
    )


def repeat(trace: Trace, copies: int, *, shared_ids: bool = False) -> Trace:
    """``copies`` back-to-back copies of ``trace`` in time, each shifted by the trace's span.

    Copy ``k`` starts one mean inter-arrival gap after copy ``k - 1`` ends. With
    ``shared_ids=False`` (the default) copy ``k`` gets fresh block ids (``id + k * (max id + 1)``),
    so copies share nothing: the same traffic shape from new users, which keeps hit ratios
    comparable while the trace gets longer. With ``shared_ids=True`` copies keep the ids, as if
    the same users came back: everything the first copy computed is reusable by the next.
    Combined with :func:`speed_up` by the same factor, a repeated trace keeps its duration
    and carries ``copies`` times the load.
    """
    if copies < 1:
        raise TraceError(f"repeat count must be at least 1, got {copies}")
    if copies == 1:
        return trace
    n = len(trace)
    span = trace.duration_ms
    gap = span / (n - 1) if n > 1 else 1.0
    stride = span + gap
    id_stride = int(trace.blocks.max()) + 1 if trace.n_blocks else 1
    if not shared_ids and id_stride * copies - 1 > _MAX_ID:
        raise TraceError(f"repeat: {copies} copies of ids up to {id_stride - 1} overflow 64-bit ids; use fewer copies")
    ts = np.concatenate([trace.timestamps + k * stride for k in range(copies)])
    blocks = np.concatenate([trace.blocks + (0 if shared_ids else k * id_stride) for k in range(copies)])
    nb = trace.n_blocks
    offsets = np.concatenate([trace.offsets[:-1] + k * nb for k in range(copies)] + [np.array([copies * nb])])
    return Trace(
        ts,
        np.tile(trace.input_lengths, copies),
        np.tile(trace.output_lengths, copies),
        offsets.astype(np.int64),
        blocks.astype(np.int64),
    )


def overlay(trace: Trace, copies: int, *, seed: int = 0) -> Trace:
    """``copies`` copies of ``trace`` played at once, each with fresh block ids and its own phase.

    Copy ``k > 0`` is shifted by a random offset within the trace's span and wrapped around it,
    so the load is ``copies`` times the original over the same span while every session keeps
    its own pace (think times are not compressed, unlike :func:`speed_up`). A session that
    straddles a copy's wrap point has its later turns moved to the start of the span.
    """
    if copies < 1:
        raise TraceError(f"overlay count must be at least 1, got {copies}")
    if copies == 1:
        return trace
    span = trace.duration_ms
    if span <= 0:
        raise TraceError("overlay: the trace spans no time; use repeat instead")
    rng = np.random.default_rng(seed)
    t0 = float(trace.timestamps[0])
    id_stride = int(trace.blocks.max()) + 1 if trace.n_blocks else 1
    if id_stride * copies - 1 > _MAX_ID:
        raise TraceError(f"overlay: {copies} copies of ids up to {id_stride - 1} overflow 64-bit ids")
    offsets = [0.0, *rng.uniform(0.0, span, size=copies - 1).tolist()]
    ts = np.concatenate([t0 + np.mod(trace.timestamps - t0 + off, span + 1e-9) for off in offsets])
    req_len = np.diff(trace.offsets)
    lens = np.tile(req_len, copies)
    blocks_per_copy = [trace.blocks + k * id_stride for k in range(copies)]
    order = np.argsort(ts, kind="stable")
    starts = np.concatenate([trace.offsets[:-1] + k * trace.n_blocks for k in range(copies)])
    all_blocks = np.concatenate(blocks_per_copy)
    new_lens = lens[order]
    new_off = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(new_lens, out=new_off[1:])
    idx = np.concatenate([np.arange(starts[i], starts[i] + lens[i]) for i in order.tolist()]) if new_off[-1] else (
        np.zeros(0, dtype=np.int64))
    return Trace(
        ts[order],
        np.tile(trace.input_lengths, copies)[order],
        np.tile(trace.output_lengths, copies)[order],
        new_off,
        all_blocks[idx].astype(np.int64),
    )


# --------------------------------------------------------------------------------------
# The shared real trace (never copied into the repository)
# --------------------------------------------------------------------------------------

SHARED_TRACE_NAME: Final = "conversation_trace_first_half.jsonl"
"""The real prefix-reuse trace in ``../shared/data/mooncake/`` beside the checkout."""
SHARED_TRACE_ENV: Final = "KVPOOL_MOONCAKE_TRACE"
"""Names the trace file when it is not in ``shared/data/mooncake/`` beside or above the checkout."""


def shared_trace_path() -> Path:
    """Where the shared trace is expected: ``$KVPOOL_MOONCAKE_TRACE``, else the first
    ``shared/data/mooncake/`` beside the checkout or above it (a git worktree lives deeper)."""
    env = os.environ.get(SHARED_TRACE_ENV)
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[1]
    for parent in checkout.parents:
        candidate = parent / "shared" / "data" / "mooncake" / SHARED_TRACE_NAME
        if candidate.is_file():
            return candidate
    return checkout.parent / "shared" / "data" / "mooncake" / SHARED_TRACE_NAME


def find_shared_trace() -> Path | None:
    """The shared trace, or None when it is not on this machine."""
    path = shared_trace_path()
    return path if path.is_file() else None
