"""Mooncake JSONL traces: round trip, errors naming the line, the synthetic generator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvpool.trace import SyntheticSpec, Trace, TraceError, TraceRequest, generate, read_jsonl, write_jsonl


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


def test_round_trip(tmp_path: Path) -> None:
    reqs = [
        TraceRequest(0.0, 1000, 10, (0, 1)),
        TraceRequest(5.0, 1500, 20, (0, 1, 2)),
        TraceRequest(5.0, 200, 0, (7,)),
    ]
    trace = Trace.from_requests(reqs)
    p = tmp_path / "rt.jsonl"
    write_jsonl(trace, p)
    back = read_jsonl(p)
    assert list(back) == reqs
    assert back.n_blocks == 6 and back.duration_ms == 5.0
    first = json.loads(p.read_text().splitlines()[0])
    assert first == {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "malformed JSON"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1], "x": 2}', "unknown field"),
        ('{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": [1]}', "negative input_length"),
        ('{"timestamp": 1, "input_length": 5, "output_length": -1, "hash_ids": [1]}', "negative output_length"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1}', "missing field"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "ab"}', "hash_ids must be a list"),
        ('{"timestamp": 1, "input_length": 5.5, "output_length": 1, "hash_ids": [1]}', "must be an integer"),
        ('{"timestamp": -3, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp must be"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [-1]}', "negative hash id"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": Infinity, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp must be"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [9223372036854775808]}', "above 2"),
    ],
)
def test_bad_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}'
    p = _write(tmp_path, [good, line])
    with pytest.raises(TraceError, match=message) as exc:
        read_jsonl(p)
    assert f"{p}:2:" in str(exc.value)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    p = _write(tmp_path, [])
    with pytest.raises(TraceError, match="empty trace"):
        read_jsonl(p)
    with pytest.raises(TraceError, match="cannot open"):
        read_jsonl(tmp_path / "absent.jsonl")


def test_timestamps_going_backwards_are_rejected(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        [
            '{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": [1]}',
            '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [1]}',
        ],
    )
    with pytest.raises(TraceError, match=r":2: timestamp 3 goes backwards"):
        read_jsonl(p)


def test_synthetic_is_deterministic_and_well_formed() -> None:
    spec = SyntheticSpec(n_requests=2000, seed=3)
    a, b = generate(spec), generate(spec)
    assert np.array_equal(a.blocks, b.blocks) and np.array_equal(a.timestamps, b.timestamps)
    assert len(a) == 2000
    a.validate()
    c = generate(SyntheticSpec(n_requests=2000, seed=4))
    assert not np.array_equal(a.blocks[:500], c.blocks[:500])
    # input covers all but part of the last block
    lens = np.diff(a.offsets)
    assert np.all(a.input_lengths <= lens * 512) and np.all(a.input_lengths > (lens - 1) * 512)


def test_synthetic_sessions_extend_their_prefix_and_prefixes_are_skewed() -> None:
    spec = SyntheticSpec(n_requests=3000, n_prefixes=50, zipf_s=1.2, prefix_blocks=2, mean_turns=4.0, seed=1)
    trace = generate(spec)
    reqs = list(trace)
    # multi-turn: many requests start with the full hash_ids of an earlier request and extend it
    seen = {r.hash_ids for r in reqs}
    extended = sum(1 for r in reqs if any(r.hash_ids[:k] in seen for k in range(3, len(r.hash_ids))))
    assert extended > len(reqs) // 3
    # Zipf: the hottest shared prefix is used far more often than the median one
    firsts = np.bincount([r.hash_ids[0] // 2 for r in reqs], minlength=50)
    assert firsts.max() > 5 * np.median(firsts)
    # Poisson-ish arrivals: sorted, spread over roughly n / rate seconds
    assert np.all(np.diff(trace.timestamps) >= 0)
    expected_ms = 3000 / spec.rate_per_s * 1000
    assert 0.5 * expected_ms < trace.duration_ms < 2.0 * expected_ms


@pytest.mark.parametrize("field", ["n_requests", "rate_per_s", "think_s", "mean_turns"])
def test_synthetic_spec_rejects_nonsense(field: str) -> None:
    with pytest.raises(TraceError, match=field):
        generate(SyntheticSpec(**{field: 0}))
