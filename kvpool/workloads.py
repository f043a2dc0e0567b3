"""Seeded workload generators in the Mooncake JSONL format, one per traffic family.

Every generator returns a :class:`~kvpool.trace.Trace` with the semantics of the real
Mooncake traces: ``hash_ids`` holds one id per 512-token block of the prompt (the last one
possibly partial); equal prefixes give equal ids, and an id implies its whole prefix (an id
is never reused at another position or after another parent). A block that was the partial
tail of one prompt is not the same block in a longer prompt (its tokens differ), so a turn
that extends the previous prompt shares only the previous prompt's *full* blocks.

Families (parameters in the spec dataclasses, all with defaults):

- ``tool``: agent and tool traffic. A few long system prompts (tool schemas) with Zipf
  popularity are re-sent by many sessions, which arrive in bursts (a batch job or a
  fan-out launches many agents on the same prompt at once); each session runs a few agent
  steps seconds apart, each step appending a tool result to the previous prompt.
- ``docqa``: document question answering. Shared documents (Zipf popularity, a few to a few
  dozen blocks each) after a one-block instruction; each request asks one short question
  about one document, so the prompt is the document plus a fresh tail block.
- ``chat``: multi-turn chat. Sessions start from one of a few short system prompts; every
  turn re-sends the conversation so far (previous prompt + previous answer + the new
  message); think times of about a minute; the context is capped.
- ``synthetic``: the simulator's older generator (:func:`kvpool.trace.generate`), uniform-ish
  shared prefixes with multi-turn sessions; here with a flat popularity (Zipf exponent 0.3).
- ``sysprompt``: shared system prompts, unsynchronized arrivals. A few long system prompts
  (Zipf popularity); most requests are one of them plus a short unique question, so they share
  exactly the prompt's blocks and nothing else; a fraction bring a prompt no one else uses.
  Requests arrive one by one (Poisson), not in bursts or sessions.

Session-based families generate whole sessions in start order and keep the first
``n_requests`` requests by arrival time, so a trace is a window of a steady state.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kvpool.trace import BLOCK_TOKENS, SyntheticSpec, Trace, TraceError, generate

FAMILIES = ("tool", "docqa", "chat", "synthetic", "sysprompt")


def _blocks(tokens: int) -> int:
    """Blocks (ids) a prompt of ``tokens`` tokens takes: its last block may be partial."""
    return max(1, -(-tokens // BLOCK_TOKENS))


def _check(family: str, checks: tuple[tuple[str, bool], ...], spec: object) -> None:
    for name, ok in checks:
        if not ok:
            raise TraceError(f"{family} workload: invalid {name}={getattr(spec, name)!r}")


@dataclass(frozen=True)
class ToolSpec:
    """Agent/tool traffic: few long system prompts, bursts of sessions, short agent steps."""

    n_requests: int = 20_000
    #: distinct system prompts (tool schemas)
    n_prompts: int = 16
    #: system prompt length in blocks, uniform in [min, max]
    min_prompt_blocks: int = 4
    max_prompt_blocks: int = 24
    #: Zipf exponent of prompt popularity
    zipf_s: float = 1.0
    #: bursts per second; each is a geometric number of sessions (mean ``burst_sessions``)
    #: on one prompt, started within ``burst_window_s``
    burst_rate_per_s: float = 0.5
    burst_sessions: float = 12.0
    burst_window_s: float = 2.0
    #: agent steps per session (geometric mean); tool-result tokens per step (exponential mean);
    #: seconds between steps (exponential mean: a tool call's latency)
    mean_steps: float = 4.0
    step_tokens: float = 600.0
    step_gap_s: float = 3.0
    output_tokens: int = 200
    max_blocks: int = 256
    seed: int = 0

    def validate(self) -> None:
        """Raise :class:`TraceError` naming the first nonsensical option."""
        _check(
            "tool",
            (
                ("n_requests", self.n_requests >= 1),
                ("n_prompts", self.n_prompts >= 1),
                ("min_prompt_blocks", self.min_prompt_blocks >= 1),
                ("max_prompt_blocks", self.max_prompt_blocks >= self.min_prompt_blocks),
                ("zipf_s", self.zipf_s >= 0),
                ("burst_rate_per_s", self.burst_rate_per_s > 0),
                ("burst_sessions", self.burst_sessions >= 1),
                ("burst_window_s", self.burst_window_s >= 0),
                ("mean_steps", self.mean_steps >= 1),
                ("step_tokens", self.step_tokens >= 1),
                ("step_gap_s", self.step_gap_s > 0),
                ("output_tokens", self.output_tokens >= 0),
                ("max_blocks", self.max_blocks > self.max_prompt_blocks),
            ),
            self,
        )


@dataclass(frozen=True)
class DocQASpec:
    """Document QA: shared documents after a shared instruction block, one short question each."""

    n_requests: int = 20_000
    rate_per_s: float = 10.0
    n_docs: int = 2_000
    #: document length in blocks: log-normal with this median, clipped to [1, max_doc_blocks]
    median_doc_blocks: float = 12.0
    doc_sigma: float = 0.8
    max_doc_blocks: int = 96
    #: Zipf exponent of document popularity
    zipf_s: float = 0.9
    #: instruction blocks shared by every request (0: none)
    instruction_blocks: int = 1
    #: question tokens, uniform in [min, max]; they share the fresh last block
    min_question_tokens: int = 16
    max_question_tokens: int = 256
    output_tokens: int = 150
    seed: int = 0

    def validate(self) -> None:
        """Raise :class:`TraceError` naming the first nonsensical option."""
        _check(
            "docqa",
            (
                ("n_requests", self.n_requests >= 1),
                ("rate_per_s", self.rate_per_s > 0),
                ("n_docs", self.n_docs >= 1),
                ("median_doc_blocks", self.median_doc_blocks >= 1),
                ("doc_sigma", self.doc_sigma >= 0),
                ("max_doc_blocks", self.max_doc_blocks >= 1),
                ("zipf_s", self.zipf_s >= 0),
                ("instruction_blocks", self.instruction_blocks >= 0),
                ("min_question_tokens", self.min_question_tokens >= 1),
                ("max_question_tokens", self.max_question_tokens >= self.min_question_tokens),
                ("output_tokens", self.output_tokens >= 0),
            ),
            self,
        )


@dataclass(frozen=True)
class ChatSpec:
    """Multi-turn chat: each turn re-sends the conversation so far plus a new message."""

    n_requests: int = 20_000
    #: requests per second over all sessions (sessions start at rate / mean_turns)
    rate_per_s: float = 5.0
    n_system_prompts: int = 8
    system_blocks: int = 2
    zipf_s: float = 1.2
    #: turns per session: geometric with this mean
    mean_turns: float = 5.0
    #: user message and answer tokens: log-normal with these medians (sigma 1)
    median_message_tokens: float = 250.0
    median_answer_tokens: float = 400.0
    #: seconds between a turn and the next (log-normal median, sigma 1)
    median_think_s: float = 60.0
    max_blocks: int = 256
    seed: int = 0

    def validate(self) -> None:
        """Raise :class:`TraceError` naming the first nonsensical option."""
        _check(
            "chat",
            (
                ("n_requests", self.n_requests >= 1),
                ("rate_per_s", self.rate_per_s > 0),
                ("n_system_prompts", self.n_system_prompts >= 1),
                ("system_blocks", self.system_blocks >= 0),
                ("zipf_s", self.zipf_s >= 0),
                ("mean_turns", self.mean_turns >= 1),
                ("median_message_tokens", self.median_message_tokens >= 1),
                ("median_answer_tokens", self.median_answer_tokens >= 1),
                ("median_think_s", self.median_think_s > 0),
                ("max_blocks", self.max_blocks > self.system_blocks + 1),
            ),
            self,
        )


@dataclass(frozen=True)
class SysPromptSpec:
    """Shared system prompts: each request is a hot prompt plus a unique question, Poisson arrivals."""

    n_requests: int = 20_000
    #: requests per second (Poisson: exponential gaps, no bursts)
    rate_per_s: float = 8.0
    #: distinct system prompts
    n_prompts: int = 6
    #: system prompt length in whole blocks, uniform in [min, max] (8k-24k tokens: with 10% unique
    #: requests the first 48 requests touch about 390 distinct blocks, a median over seeds)
    min_prompt_blocks: int = 16
    max_prompt_blocks: int = 48
    #: Zipf exponent of prompt popularity
    zipf_s: float = 1.0
    #: share of requests without a shared prompt: a prompt of the same length distribution
    #: that no other request uses
    unique_share: float = 0.1
    #: question tokens, uniform in [min, max]; they start fresh blocks after the prompt
    min_question_tokens: int = 50
    max_question_tokens: int = 400
    output_tokens: int = 200
    seed: int = 0

    def validate(self) -> None:
        """Raise :class:`TraceError` naming the first nonsensical option."""
        _check(
            "sysprompt",
            (
                ("n_requests", self.n_requests >= 1),
                ("rate_per_s", math.isfinite(self.rate_per_s) and self.rate_per_s > 0),
                ("n_prompts", self.n_prompts >= 1),
                ("min_prompt_blocks", self.min_prompt_blocks >= 1),
                ("max_prompt_blocks", self.max_prompt_blocks >= self.min_prompt_blocks),
                ("zipf_s", self.zipf_s >= 0),
                ("unique_share", 0 <= self.unique_share <= 1),
                ("min_question_tokens", self.min_question_tokens >= 1),
                ("max_question_tokens", self.max_question_tokens >= self.min_question_tokens),
                ("output_tokens", self.output_tokens >= 0),
            ),
            self,
        )


def _zipf(n: int, s: float) -> npt.NDArray[np.float64]:
    w: npt.NDArray[np.float64] = np.arange(1, n + 1, dtype=np.float64) ** (-s)
    return w / float(w.sum())


class _Ids:
    """Fresh block ids, counted up from ``start``."""

    __slots__ = ("next",)

    def __init__(self, start: int) -> None:
        self.next = start

    def take(self, n: int) -> list[int]:
        a = self.next
        self.next += n
        return list(range(a, a + n))


Request = tuple[float, int, int, list[int]]  # arrival ms, input tokens, output tokens, hash ids


def _extend(prev_ids: list[int], prev_tokens: int, tokens: int, ids: _Ids) -> list[int]:
    """Ids of a prompt of ``tokens`` tokens that extends a prompt of ``prev_tokens`` with ids ``prev_ids``.

    Only the previous prompt's full blocks carry over: its partial tail block now holds more tokens.
    """
    keep = min(prev_tokens // BLOCK_TOKENS, len(prev_ids))
    return prev_ids[:keep] + ids.take(_blocks(tokens) - keep)


def _window(sessions: Iterator[tuple[float, list[Request]]], n: int) -> list[Request]:
    """The first ``n`` requests by arrival of sessions generated in order of a non-decreasing lower
    bound of their start (the yielded time)."""
    reqs: list[Request] = []
    cutoff = math.inf
    check = n
    for start, turns in sessions:
        if start > cutoff:
            break
        reqs.extend(turns)
        if len(reqs) >= check:
            # No later session (starting after the n-th arrival so far) can enter the window.
            times = np.fromiter((r[0] for r in reqs), np.float64, len(reqs))
            cutoff = float(np.partition(times, n - 1)[n - 1])
            check = len(reqs) + max(1, n // 20)
    reqs.sort(key=lambda r: r[0])
    return reqs[:n]


def _trace(reqs: list[Request]) -> Trace:
    n = len(reqs)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(r[3]) for r in reqs], out=offsets[1:])
    return Trace(
        np.floor(np.array([r[0] for r in reqs], dtype=np.float64)),
        np.array([r[1] for r in reqs], dtype=np.int64),
        np.array([r[2] for r in reqs], dtype=np.int64),
        offsets,
        np.fromiter((h for r in reqs for h in r[3]), dtype=np.int64, count=int(offsets[-1])),
    )


def tool(spec: ToolSpec) -> Trace:
    """Agent/tool traffic following ``spec`` (deterministic for a given seed)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    lengths = rng.integers(spec.min_prompt_blocks, spec.max_prompt_blocks + 1, size=spec.n_prompts)
    prompts: list[list[int]] = []
    ids = _Ids(0)
    for n_blocks in lengths.tolist():
        prompts.append(ids.take(n_blocks))
    weights = _zipf(spec.n_prompts, spec.zipf_s)
    p_more = 1.0 - 1.0 / spec.mean_steps

    def sessions() -> Iterator[tuple[float, list[Request]]]:
        t_burst = 0.0
        while True:
            t_burst += rng.exponential(1000.0 / spec.burst_rate_per_s)
            prompt = prompts[int(rng.choice(spec.n_prompts, p=weights))]
            count = int(rng.geometric(1.0 / spec.burst_sessions))
            starts = np.sort(t_burst + rng.uniform(0.0, spec.burst_window_s * 1000.0, size=count))
            for start in starts.tolist():
                t = start
                prev_ids = prompt
                prev_tok = len(prompt) * BLOCK_TOKENS  # whole blocks: shared by every session
                turns: list[Request] = []
                while True:
                    tok = prev_tok + int(rng.exponential(spec.step_tokens)) + 1
                    if _blocks(tok) > spec.max_blocks:
                        break
                    h = _extend(prev_ids, prev_tok, tok, ids)
                    turns.append((t, tok, spec.output_tokens, h))
                    if rng.random() >= p_more:
                        break
                    prev_ids, prev_tok = h, tok + spec.output_tokens
                    t += rng.exponential(spec.step_gap_s * 1000.0)
                yield t_burst, turns  # the burst's start bounds all its sessions' (monotone)

    return _trace(_window(sessions(), spec.n_requests))


def docqa(spec: DocQASpec) -> Trace:
    """Document QA traffic following ``spec`` (deterministic for a given seed)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    ids = _Ids(0)
    instruction = ids.take(spec.instruction_blocks)
    doc_len = np.clip(np.round(spec.median_doc_blocks * np.exp(spec.doc_sigma * rng.standard_normal(spec.n_docs))), 1,
                      spec.max_doc_blocks).astype(np.int64)
    docs = [instruction + ids.take(int(b)) for b in doc_len]
    n = spec.n_requests
    pick = rng.choice(spec.n_docs, size=n, p=_zipf(spec.n_docs, spec.zipf_s))
    gaps = rng.exponential(1000.0 / spec.rate_per_s, size=n)
    q_tok = rng.integers(spec.min_question_tokens, spec.max_question_tokens + 1, size=n)
    reqs: list[Request] = []
    t = 0.0
    for i in range(n):
        t += float(gaps[i])
        doc = docs[int(pick[i])]
        # The document ends on a block boundary; the question starts a fresh, partial last block.
        reqs.append((t, len(doc) * BLOCK_TOKENS + int(q_tok[i]), spec.output_tokens, doc + ids.take(1)))
    return _trace(reqs)


def chat(spec: ChatSpec) -> Trace:
    """Multi-turn chat traffic following ``spec`` (deterministic for a given seed)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    ids = _Ids(0)
    systems = [ids.take(spec.system_blocks) for _ in range(spec.n_system_prompts)]
    weights = _zipf(spec.n_system_prompts, spec.zipf_s)
    p_more = 1.0 - 1.0 / spec.mean_turns
    session_gap = 1000.0 * spec.mean_turns / spec.rate_per_s

    def lognormal(median: float) -> int:
        return max(1, int(median * math.exp(float(rng.standard_normal()))))

    def sessions() -> Iterator[tuple[float, list[Request]]]:
        t_start = 0.0
        while True:
            t_start += rng.exponential(session_gap)
            prev_ids = systems[int(rng.choice(spec.n_system_prompts, p=weights))]
            prev_tok = spec.system_blocks * BLOCK_TOKENS
            t = t_start
            turns: list[Request] = []
            while True:
                tok = prev_tok + lognormal(spec.median_message_tokens)
                if _blocks(tok) > spec.max_blocks:
                    break
                answer = lognormal(spec.median_answer_tokens)
                h = _extend(prev_ids, prev_tok, tok, ids)
                turns.append((t, tok, answer, h))
                if rng.random() >= p_more:
                    break
                prev_ids, prev_tok = h, tok + answer
                t += spec.median_think_s * 1000.0 * math.exp(float(rng.standard_normal()))
            yield t_start, turns

    return _trace(_window(sessions(), spec.n_requests))


def sysprompt(spec: SysPromptSpec) -> Trace:
    """Shared-system-prompt traffic following ``spec`` (deterministic for a given seed)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    ids = _Ids(0)
    lengths = rng.integers(spec.min_prompt_blocks, spec.max_prompt_blocks + 1, size=spec.n_prompts)
    prompts = [ids.take(int(b)) for b in lengths]
    n = spec.n_requests
    gaps = rng.exponential(1000.0 / spec.rate_per_s, size=n)
    unique = rng.random(n) < spec.unique_share
    pick = rng.choice(spec.n_prompts, size=n, p=_zipf(spec.n_prompts, spec.zipf_s))
    own_blocks = rng.integers(spec.min_prompt_blocks, spec.max_prompt_blocks + 1, size=n)
    q_tok = rng.integers(spec.min_question_tokens, spec.max_question_tokens + 1, size=n)
    reqs: list[Request] = []
    t = 0.0
    for i in range(n):
        t += float(gaps[i])
        # A unique request's prompt is fresh blocks; a shared one's is the prompt's own ids.
        prompt = ids.take(int(own_blocks[i])) if unique[i] else prompts[int(pick[i])]
        # The prompt ends on a block boundary: the question starts fresh blocks, the last one partial.
        q = int(q_tok[i])
        reqs.append((t, len(prompt) * BLOCK_TOKENS + q, spec.output_tokens, prompt + ids.take(_blocks(q))))
    return _trace(reqs)


def synthetic(spec: SyntheticSpec) -> Trace:
    """The simulator's synthetic generator (see :class:`kvpool.trace.SyntheticSpec`)."""
    return generate(spec)


#: the uniform-ish default of the ``synthetic`` family (flat prefix popularity)
SYNTHETIC_DEFAULT = SyntheticSpec(n_requests=20_000, rate_per_s=10.0, zipf_s=0.3, n_prefixes=500)

Spec = ToolSpec | DocQASpec | ChatSpec | SysPromptSpec | SyntheticSpec

_GENERATORS: dict[str, tuple[Spec, Callable[..., Trace]]] = {
    "tool": (ToolSpec(), tool),
    "docqa": (DocQASpec(), docqa),
    "chat": (ChatSpec(), chat),
    "sysprompt": (SysPromptSpec(), sysprompt),
    "synthetic": (SYNTHETIC_DEFAULT, synthetic),
}


def default_spec(family: str) -> Spec:
    """The default parameters of ``family``."""
    if family not in _GENERATORS:
        raise TraceError(f"unknown workload family {family!r} (choose from {', '.join(FAMILIES)})")
    return _GENERATORS[family][0]


def make_spec(family: str, **overrides: object) -> Spec:
    """``family``'s default spec with ``overrides`` (field names of its spec); TraceError names a bad field."""
    spec = default_spec(family)
    names = {f.name: f for f in dataclasses.fields(spec)}
    fixed: dict[str, object] = {}
    for key, value in overrides.items():
        f = names.get(key)
        if f is None:
            raise TraceError(f"{family} workload has no parameter {key!r} (parameters: {', '.join(names)})")
        want = type(getattr(spec, key))
        if isinstance(value, str):
            try:
                value = want(value)
            except ValueError:
                raise TraceError(f"{family} workload: {key}={value!r} is not a valid {want.__name__}") from None
        fixed[key] = value
    out = dataclasses.replace(spec, **fixed)  # type: ignore[arg-type]
    out.validate()
    return out


def build(family: str, **overrides: object) -> Trace:
    """A trace of ``family`` with its defaults and ``overrides`` (e.g. ``n_requests=5000, seed=3``)."""
    spec = make_spec(family, **overrides)
    return _GENERATORS[family][1](spec)


def describe(trace: Trace, top: int = 4) -> dict[str, float]:
    """Summary statistics of any trace: load, sizes, and how much of it is shared.

    ``reused_share``: block references to a block some other request also references.
    ``top_roots_share``: block references covered by the shared prefixes of the ``top`` most
    requested roots (first block ids), where a root's shared prefix is the longest prefix
    common to all its requests (for the tool family: its system prompt).
    """
    n = len(trace)
    blocks = trace.blocks
    uniq, inverse, counts = np.unique(blocks, return_inverse=True, return_counts=True)
    # references per request of each block: a block referenced by >= 2 requests is shared
    req_of = np.repeat(np.arange(n), np.diff(trace.offsets))
    pairs = np.unique(np.stack([inverse, req_of]), axis=1)
    reqs_per_block = np.bincount(pairs[0], minlength=uniq.size)
    shared = reqs_per_block[inverse] >= 2
    starts = trace.offsets[:-1]
    has = np.diff(trace.offsets) > 0
    roots: dict[int, list[int]] = {}
    for i in np.flatnonzero(has).tolist():
        roots.setdefault(int(blocks[starts[i]]), []).append(i)
    covered = 0
    for _, members in sorted(roots.items(), key=lambda kv: -len(kv[1]))[:top]:
        first = blocks[trace.offsets[members[0]] : trace.offsets[members[0] + 1]]
        lcp = len(first)
        for i in members[1:]:
            other = blocks[trace.offsets[i] : trace.offsets[i + 1]]
            m = min(lcp, len(other))
            diff = np.flatnonzero(first[:m] != other[:m])
            lcp = int(diff[0]) if diff.size else m
        covered += lcp * len(members)
    dur = trace.duration_ms / 1e3
    return {
        "requests": float(n),
        "duration_s": dur,
        "requests_per_s": n / dur if dur > 0 else float("inf"),
        "mean_input_tokens": float(trace.input_lengths.mean()),
        "block_refs": float(trace.n_blocks),
        "unique_blocks": float(uniq.size),
        "reused_share": float(shared.mean()) if shared.size else 0.0,
        "top_roots_share": covered / max(trace.n_blocks, 1),
        "max_refs_per_block": float(counts.max()) if counts.size else 0.0,
    }


# ------------------------------------------------------------------------ kvpool workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``kvpool workload`` options."""
    parser.add_argument("family", choices=FAMILIES, help="traffic family")
    parser.add_argument("--requests", type=int, help="number of requests (default: the family's, 20000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", type=Path, help="write the JSONL trace here (default: only print its statistics)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a parameter of the family's spec, e.g. --set zipf_s=1.2 (repeatable; see --list)",
    )
    parser.add_argument("--list", action="store_true", help="print the family's parameters and defaults, then exit")
    parser.add_argument("--speedup", type=float, default=1.0, help="compress time by this factor (load x factor)")
    parser.add_argument("--repeat", type=int, default=1, help="tile the trace this many times in time, fresh ids")
    parser.add_argument("--repeat-shared", action="store_true", help="with --repeat: copies keep their ids")
    parser.add_argument("--overlay", type=int, default=1, help="play this many copies at once (fresh ids, own phase)")


def run(args: argparse.Namespace) -> int:
    """Generate, optionally write, and describe a trace; 2 on bad input."""
    from kvpool.trace import overlay, repeat, speed_up, write_jsonl

    try:
        if args.list:
            for f in dataclasses.fields(default_spec(args.family)):
                print(f"{f.name}={getattr(default_spec(args.family), f.name)!r}")
            return 0
        overrides: dict[str, object] = {"seed": args.seed}
        if args.requests is not None:
            overrides["n_requests"] = args.requests
        for item in args.set:
            name, sep, value = item.partition("=")
            if not sep:
                raise TraceError(f"--set {item!r}: expected NAME=VALUE")
            overrides[name.strip()] = value.strip()
        trace = overlay(build(args.family, **overrides), args.overlay, seed=args.seed)
        trace = repeat(speed_up(trace, args.speedup), args.repeat, shared_ids=args.repeat_shared)
        if args.out is not None:
            write_jsonl(trace, args.out)
    except TraceError as exc:
        print(f"kvpool workload: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"kvpool workload: error: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    stats = describe(trace)
    where = f" -> {args.out}" if args.out is not None else ""
    print(f"{args.family} (seed {args.seed}){where}: " + ", ".join(f"{k} {v:.4g}" for k, v in stats.items()))
    return 0
