"""Workload families: determinism by seed, the Mooncake format, each family's defining statistic, load knobs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvpool.cli import main
from kvpool.trace import BLOCK_TOKENS, Trace, TraceError, overlay, read_jsonl, repeat, speed_up, write_jsonl
from kvpool.workloads import FAMILIES, build, describe, make_spec

N = 3000


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _ids(trace: Trace, i: int) -> list[int]:
    return [int(h) for h in trace.blocks[trace.offsets[i] : trace.offsets[i + 1]]]


def test_same_seed_same_trace_other_seed_other_trace(family: str) -> None:
    a, b = build(family, n_requests=N, seed=1), build(family, n_requests=N, seed=1)
    c = build(family, n_requests=N, seed=2)
    assert len(a) == N
    for x, y in ((a.timestamps, b.timestamps), (a.blocks, b.blocks), (a.input_lengths, b.input_lengths)):
        assert np.array_equal(x, y)
    assert not np.array_equal(a.timestamps, c.timestamps)


def test_the_trace_reader_accepts_it_and_ids_have_prefix_semantics(family: str, tmp_path: Path) -> None:
    t = build(family, n_requests=N, seed=3)
    p = tmp_path / f"{family}.jsonl"
    write_jsonl(t, p)
    back = read_jsonl(p)
    assert len(back) == N and np.array_equal(back.blocks, t.blocks)
    assert np.array_equal(back.timestamps, t.timestamps)
    # one id per 512-token block, the last one possibly partial
    assert np.array_equal(np.diff(t.offsets), -(-t.input_lengths // BLOCK_TOKENS))
    # an id implies its prefix: always the same position and the same parent
    seen: dict[int, tuple[int, int]] = {}
    for i in range(len(t)):
        ids = _ids(t, i)
        for j, h in enumerate(ids):
            key = (j, ids[j - 1] if j else -1)
            assert seen.setdefault(h, key) == key, f"id {h} reused at another position or after another parent"


def test_tool_a_few_system_prompts_cover_most_blocks_and_arrive_in_bursts() -> None:
    t = build("tool", n_requests=N, seed=0)
    stats = describe(t, top=4)
    assert stats["top_roots_share"] >= 0.4  # the 4 hottest system prompts alone: >= 40% of all block references
    # bursts: requests on one prompt cluster in time far more than Poisson arrivals would
    roots = t.blocks[t.offsets[:-1]]
    same_as_previous = float(np.mean(roots[1:] == roots[:-1]))
    _, counts = np.unique(roots, return_counts=True)
    by_chance = float(np.sum((counts / counts.sum()) ** 2))
    assert same_as_previous > by_chance + 0.1


def test_docqa_documents_are_shared_and_questions_are_one_fresh_block() -> None:
    t = build("docqa", n_requests=N, seed=0)
    assert describe(t)["reused_share"] >= 0.75
    counts: dict[int, int] = {}
    for h in t.blocks.tolist():
        counts[h] = counts.get(h, 0) + 1
    last_unique = [counts[_ids(t, i)[-1]] == 1 for i in range(len(t))]
    assert all(last_unique)  # every question is its own block
    assert len(set(t.blocks[t.offsets[:-1]].tolist())) == 1  # one instruction block heads every prompt


def test_chat_turns_extend_the_previous_prompt() -> None:
    spec = make_spec("chat", n_requests=N, seed=0)
    t = build("chat", n_requests=N, seed=0)
    by_prefix: dict[tuple[int, ...], float] = {}
    extends = 0
    sys_len = spec.system_blocks  # type: ignore[union-attr]
    for i in range(len(t)):
        ids = tuple(_ids(t, i))
        full = int(t.input_lengths[i]) // BLOCK_TOKENS
        # a later turn starts with all full blocks of an earlier turn of the same session
        hit = any(ids[:k] in by_prefix for k in range(len(ids) - 1, sys_len, -1))
        extends += hit
        by_prefix[ids[:full]] = float(t.timestamps[i])
    share = extends / len(t)
    assert share >= 0.5  # mean 5 turns: about 4 in 5 requests continue a session (fewer in the warm-up)


def test_synthetic_family_is_flat() -> None:
    t = build("synthetic", n_requests=N, seed=0)
    roots = t.blocks[t.offsets[:-1]]
    _, counts = np.unique(roots, return_counts=True)
    assert counts.max() / len(t) < 0.05  # no prefix dominates (Zipf 0.3 over 500 prefixes)


def _sysprompt_parts(t: Trace) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Each request's shared part (blocks another request also uses) and its own part (the rest)."""
    users: dict[int, int] = {}
    for i in range(len(t)):
        for h in set(_ids(t, i)):
            users[h] = users.get(h, 0) + 1
    shared, own = [], []
    for i in range(len(t)):
        ids = _ids(t, i)
        k = sum(users[h] >= 2 for h in ids)
        assert all(users[h] >= 2 for h in ids[:k])  # the shared blocks are a prefix
        shared.append(tuple(ids[:k]))
        own.append(tuple(ids[k:]))
    return shared, own


def test_sysprompt_requests_share_exactly_one_of_a_few_prompts_and_nothing_else() -> None:
    t = build("sysprompt", n_requests=N, seed=0)
    shared, own = _sysprompt_parts(t)
    prompts: dict[tuple[int, ...], int] = {}
    for s in shared:
        if s:
            prompts[s] = prompts.get(s, 0) + 1
    assert len(prompts) == 6  # the default's six system prompts, and nothing else is shared
    assert all(16 <= len(p) <= 48 for p in prompts)  # 8k-24k tokens each
    assert all(set(a).isdisjoint(b) for a in prompts for b in prompts if a != b)  # no common head
    no_prompt = sum(not s for s in shared) / N
    assert 0.08 <= no_prompt <= 0.12  # 10% bring a prompt of their own
    # Zipf 1.0 over 6: the hottest prompt heads 1/H(6) = 41% of the requests that use one
    counts = sorted(prompts.values(), reverse=True)
    assert 0.36 <= counts[0] / sum(counts) <= 0.46 and counts[0] > counts[1] > counts[-1]
    for i in range(N):
        tail = int(t.input_lengths[i]) - len(shared[i]) * BLOCK_TOKENS
        if shared[i]:
            # one fresh, partial block: the question (50-400 tokens) right after the prompt's whole blocks
            assert len(own[i]) == 1 and 50 <= tail <= 400
        else:
            assert 16 <= len(own[i]) - 1 <= 48 and 50 <= int(t.input_lengths[i]) % BLOCK_TOKENS <= 400
    assert len({h for o in own for h in o}) == sum(len(o) for o in own)  # no request's own block recurs


def test_sysprompt_arrivals_are_poisson_at_the_rate() -> None:
    t = build("sysprompt", n_requests=N, seed=0)
    gaps = np.diff(t.timestamps)
    assert len(t) / (t.duration_ms / 1e3) == pytest.approx(8.0, rel=0.06)
    assert np.unique(gaps).size > 200  # not a fixed clock
    assert float(gaps.std() / gaps.mean()) == pytest.approx(1.0, abs=0.1)  # exponential gaps
    assert float(np.mean(gaps == 0)) < 0.03  # no bursts: at 8/s two arrivals share a millisecond ~1% of the time
    # the prompt of a request does not depend on the previous one's (unlike tool's bursts)
    roots = t.blocks[t.offsets[:-1]]
    same_as_previous = float(np.mean(roots[1:] == roots[:-1]))
    _, counts = np.unique(roots, return_counts=True)
    by_chance = float(np.sum((counts / counts.sum()) ** 2))
    assert same_as_previous == pytest.approx(by_chance, abs=0.04)
    slow = build("sysprompt", n_requests=N, seed=0, rate_per_s=2.0)
    assert len(slow) / (slow.duration_ms / 1e3) == pytest.approx(2.0, rel=0.06)
    assert np.array_equal(slow.blocks, t.blocks)  # the rate moves the clock only


def test_sysprompt_first_48_requests_touch_a_few_hundred_blocks() -> None:
    first = describe(build("sysprompt", n_requests=48, seed=0))
    assert first["unique_blocks"] == 373  # the held-out trace: 436 over its first 48 requests
    touched = [describe(build("sysprompt", n_requests=48, seed=s))["unique_blocks"] for s in range(20)]
    assert 300 <= float(np.median(touched)) <= 500
    assert describe(build("sysprompt", n_requests=200, seed=0))["unique_blocks"] == 1078


def test_sysprompt_knobs_reach_their_extremes() -> None:
    t = build("sysprompt", n_requests=500, seed=1, unique_share=1.0)
    assert describe(t)["reused_share"] == 0.0
    t = build("sysprompt", n_requests=500, seed=1, unique_share=0.0, n_prompts=1, min_prompt_blocks=4,
              max_prompt_blocks=4)
    assert len(set(t.blocks[t.offsets[:-1]].tolist())) == 1 and describe(t)["top_roots_share"] == pytest.approx(0.8)


def test_sysprompt_bad_parameters_are_named() -> None:
    for bad, name in (
        (dict(unique_share=1.5), "unique_share=1.5"),
        (dict(rate_per_s=0.0), "rate_per_s=0.0"),
        (dict(rate_per_s=float("inf")), "rate_per_s=inf"),
        (dict(n_prompts=0), "n_prompts=0"),
        (dict(min_prompt_blocks=10, max_prompt_blocks=5), "max_prompt_blocks=5"),
        (dict(min_question_tokens=0), "min_question_tokens=0"),
        (dict(min_question_tokens=300, max_question_tokens=200), "max_question_tokens=200"),
        (dict(zipf_s=-1.0), "zipf_s=-1.0"),
    ):
        with pytest.raises(TraceError, match=f"^sysprompt workload: invalid {name}$"):
            make_spec("sysprompt", **bad)


def test_bad_parameters_are_named() -> None:
    with pytest.raises(TraceError, match="no parameter 'bogus'"):
        build("tool", bogus=1)
    with pytest.raises(TraceError, match="invalid max_prompt_blocks"):
        build("tool", min_prompt_blocks=10, max_prompt_blocks=5)
    with pytest.raises(TraceError, match="unknown workload family"):
        build("video")
    with pytest.raises(TraceError, match="not a valid float"):
        make_spec("docqa", zipf_s="steep")


def test_speed_up_and_repeat() -> None:
    t = build("chat", n_requests=500, seed=4)
    fast = speed_up(t, 10.0)
    assert fast.duration_ms == pytest.approx(t.duration_ms / 10)
    assert np.array_equal(fast.blocks, t.blocks)
    r = repeat(fast, 3)
    r.validate()
    assert len(r) == 1500 and r.n_blocks == 3 * t.n_blocks
    first, third = set(r.blocks[: t.n_blocks].tolist()), set(r.blocks[2 * t.n_blocks :].tolist())
    assert not first & third  # fresh ids: copies share nothing
    assert r.duration_ms == pytest.approx(3 * fast.duration_ms, rel=0.01)
    shared = repeat(t, 2, shared_ids=True)
    assert np.array_equal(shared.blocks[t.n_blocks :], t.blocks)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(TraceError, match="speed-up factor"):
            speed_up(t, bad)
    with pytest.raises(TraceError, match="repeat count"):
        repeat(t, 0)


def test_overlay_plays_copies_at_once_with_their_own_pace() -> None:
    t = build("chat", n_requests=800, seed=6)
    o = overlay(t, 4, seed=1)
    o.validate()
    assert len(o) == 4 * len(t) and o.n_blocks == 4 * t.n_blocks
    assert o.duration_ms <= t.duration_ms + 1e-6  # same span: four times the load
    ids = o.blocks.tolist()
    assert len(set(ids)) == 4 * len(set(t.blocks.tolist()))  # fresh ids per copy
    # each copy's requests keep their block ids and lengths (only the clock moved)
    first = sorted(tuple(o.blocks[o.offsets[i] : o.offsets[i + 1]].tolist()) for i in range(len(o))
                   if o.blocks[o.offsets[i]] <= t.blocks.max())
    assert first == sorted(tuple(t.blocks[t.offsets[i] : t.offsets[i + 1]].tolist()) for i in range(len(t)))
    assert overlay(t, 1) is t
    with pytest.raises(TraceError, match="overlay count"):
        overlay(t, 0)


def test_workload_cli_writes_a_readable_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "w.jsonl"
    args = ["workload", "tool", "--requests", "300", "--seed", "5", "--set", "n_prompts=4", "--out", str(out)]
    assert main(args) == 0
    assert len(read_jsonl(out)) == 300
    assert "top_roots_share" in capsys.readouterr().out
    assert main(["workload", "docqa", "--set", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvpool workload: error:") and err.count("\n") == 1
    assert main(["workload", "chat", "--list"]) == 0
    assert "mean_turns=" in capsys.readouterr().out
    out = tmp_path / "s.jsonl"
    assert main(["workload", "sysprompt", "--requests", "1000", "--out", str(out)]) == 0
    back = read_jsonl(out)
    assert len(back) == 1000 and np.array_equal(back.blocks, build("sysprompt", n_requests=1000, seed=0).blocks)
    assert "sysprompt (seed 0)" in capsys.readouterr().out
    assert main(["workload", "sysprompt", "--set", "unique_share=2"]) == 2
    err = capsys.readouterr().err
    assert err == "kvpool workload: error: sysprompt workload: invalid unique_share=2.0\n"
    assert main(["workload", "sysprompt", "--list"]) == 0
    assert "unique_share=0.1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["workload", "sysprompt", "--help"])
    assert done.value.code == 0 and "sysprompt" in capsys.readouterr().out


def test_sim_plays_a_family_faster(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    base = ["sim", "--workload", "docqa", "--requests", "400", "--nodes", "8", "--no-progress", "--json"]
    assert main(base) == 0
    slow = json.loads(capsys.readouterr().out)
    assert main([*base, "--speedup", "4", "--repeat", "2"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["requests"] == 2 * slow["requests"]
    assert fast["duration_s"] == pytest.approx(slow["duration_s"] / 2, rel=0.05)
