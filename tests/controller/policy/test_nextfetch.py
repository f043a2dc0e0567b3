"""The next-fetch expert: evict (or bypass) whatever its gaps say comes back last."""

from __future__ import annotations

import random

import pytest

from controller.policy import Admit, Evict, EvictAction, Expert, PolicyConfig, PolicyEngine, QuotaError, nextfetch
from controller.policy.engine import DEFAULT_EXPERTS
from controller.policy.nextfetch import FIRST_GAP, GAP_WEIGHT, OVERDUE, NextFetchPool

SLOT = 1000
CHUNK = 3 * SLOT


def _engine(chunks: int, leaves_first: bool = False, **kw: object) -> PolicyEngine:
    ex = Expert(256.0, kind="nextfetch", leaves_first=leaves_first)
    return PolicyEngine(PolicyConfig(capacity_bytes=chunks * CHUNK, slot_bytes=SLOT, experts=(ex,), **kw))  # type: ignore[arg-type]


def _pool(e: PolicyEngine) -> NextFetchPool:
    assert isinstance(e.pool, NextFetchPool)
    return e.pool


def test_the_chunk_due_last_is_the_victim() -> None:
    e = _engine(2)
    fresh = iter(range(1000, 2000))
    for _ in range(4):  # 1 comes back every 2 fetches, 2 every 10, one-shots in between
        for k in (1, -1, 1, -1, 1, -1, 1, -1, 1, 2):
            e.access(next(fresh) if k < 0 else k, None, 0, CHUNK)
    assert e.holds(1) and e.holds(2)  # the one-shots were bypassed: each is due in FIRST_GAP
    e.drain()
    for k in (1, 9, 1, 9):  # 9 is due again in 2 fetches, 1 in 1, 2 in 6
        e.access(k, None, 0, CHUNK)
    p = _pool(e)
    assert p.time_left(2) > p.time_left(9) > p.time_left(1)
    changes = e.drain()
    assert [c.key for c in changes if isinstance(c, Evict)] == [2]
    assert [c.key for c in changes if isinstance(c, Admit)] == [9]
    assert e.holds(1) and e.holds(9)


def test_a_chunk_due_after_every_resident_is_not_admitted() -> None:
    e = _engine(2)
    for _ in range(10):
        for k in (1, 2):
            e.access(k, None, 0, CHUNK)
    e.drain()
    assert e.access(7, None, 0, CHUNK) is False  # first sighting: due in FIRST_GAP, residents in 2
    assert not e.holds(7) and e.drain() == []
    assert _pool(e).stats["rejected_value"] == 1


def test_time_left_counts_down_then_grows_once_overdue() -> None:
    e = _engine(4)
    p = _pool(e)
    e.access(1, None, 0, CHUNK)
    assert p.time_left(1) == pytest.approx(FIRST_GAP)
    for _ in range(9):
        e.access(2, None, 0, CHUNK)
    e.access(1, None, 0, CHUNK)  # gap 10
    for _ in range(19):
        e.access(2, None, 0, CHUNK)
    e.access(1, None, 0, CHUNK)  # gap 20: mean GAP_WEIGHT * 20 + (1 - GAP_WEIGHT) * 10
    gap = GAP_WEIGHT * 20 + (1 - GAP_WEIGHT) * 10
    assert p.time_left(1) == pytest.approx(gap)
    for _ in range(5):
        e.access(2, None, 0, CHUNK)
    assert p.time_left(1) == pytest.approx(gap - 5)
    for _ in range(int(gap) + 5):
        e.access(2, None, 0, CHUNK)
    assert p.time_left(1) == pytest.approx(OVERDUE * (int(gap) + 10))  # overdue: OVERDUE x its wait


def test_leaves_first_and_pins_are_kept() -> None:
    e = _engine(3, leaves_first=True)
    e.access(10, None, 0, CHUNK)  # the root is never fetched again: the most overdue chunk
    for _ in range(5):
        for k in (11, 12):
            e.access(k, 10 if k == 11 else 11, k - 10, CHUNK)
    for _ in range(40):
        e.access(50, None, 0, CHUNK)
    evicted = [c.key for c in e.drain() if isinstance(c, Evict)]
    assert 10 not in evicted and e.holds(10)  # a parent of resident chunks waits for its children

    e = _engine(2, pin_fraction=0.5)
    e.pin(1, None, 0, CHUNK)
    for k in range(100, 140):  # everything else comes back sooner than the pinned chunk
        e.access(k, None, 0, CHUNK)
        e.access(k, None, 0, CHUNK)
    assert e.holds(1)
    e.unpin(1)
    with pytest.raises(QuotaError):
        e.experts[0].evict(99, EvictAction.DROP)


def test_history_of_chunks_not_resident_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nextfetch, "HISTORY", 50)
    e = _engine(4)
    for k in range(1000):
        e.access(k, None, 0, CHUNK)
    p = _pool(e)
    assert len(p._history) <= 50 + len(p.residents)
    for k in p.residents:  # a resident whose history went is simply long overdue, not an error
        assert p.time_left(k) > 0


def test_it_is_the_textbook_rule_while_the_pool_is_small_enough_to_scan() -> None:
    """Up to SAMPLE residents nothing is sampled: the hits equal a plain reference implementation."""
    rng = random.Random(3)
    keys = [int(300 * rng.random() ** 3) for _ in range(6000)]
    cap = 20
    e = _engine(cap)
    got = [e.access(k, None, 0, CHUNK) for k in keys]
    last: dict[int, int] = {}
    gap: dict[int, float] = {}
    held: list[int] = []
    want = []

    def left(k: int, now: int) -> float:
        g = gap.get(k, FIRST_GAP)
        age = now - last[k]
        return g - age if age < g else OVERDUE * age

    for now, k in enumerate(keys, 1):
        if k in last:
            g = now - last[k]
            gap[k] = g if k not in gap else GAP_WEIGHT * g + (1 - GAP_WEIGHT) * gap[k]
        last[k] = now
        if k in held:
            want.append(True)
            continue
        want.append(False)
        if len(held) < cap:
            held.append(k)
            continue
        v = max(held, key=lambda x: left(x, now))  # the first of equals, in the pool's array order
        if left(k, now) < left(v, now):
            i, moved = held.index(v), held.pop()  # the array's swap-remove, then the newcomer at its end
            if moved != v:
                held[i] = moved
            held.append(k)
    assert sum(want) > 500  # the stream has reuse to find
    assert got == want


def test_it_is_a_default_expert_and_labels_itself() -> None:
    assert any(x.kind == "nextfetch" for x in DEFAULT_EXPERTS)
    assert Expert(256.0, kind="nextfetch").label() == "next fetch"
    with pytest.raises(ValueError, match="kind"):
        Expert(256.0, kind="belady").validate()
