"""Switch-pool baselines and Belady on fetch sequences: optimality and monotonicity."""

from __future__ import annotations

import random

import numpy as np
import pytest

from controller.policy.value import PrefillCost
from controller.sim.caches import POLICIES, replay

COST = PrefillCost(0.5e9, 24, 896)


def _seq(n: int, universe: int, seed: int, skew: float = 1.1) -> list[int]:
    rng = np.random.default_rng(seed)
    w = np.arange(1, universe + 1, dtype=np.float64) ** -skew
    return [int(x) for x in rng.choice(universe, size=n, p=w / w.sum())]


def _run(policy: str, keys: list[int], cap: int) -> float:
    par = [-1] * len(keys)
    pos = [0] * len(keys)
    return float(replay(policy, keys, par, pos, cap, 3000, 1000, COST).hits.mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cap", [4, 32, 128])
def test_belady_bounds_every_online_policy(seed: int, cap: int) -> None:
    keys = _seq(4000, 600, seed)
    best = _run("belady", keys, cap)
    for pol in POLICIES:
        assert _run(pol, keys, cap) <= best + 1e-12, pol


def test_lru_hit_ratio_never_drops_with_a_bigger_pool() -> None:
    keys = _seq(5000, 800, 3)
    ratios = [_run("lru", keys, c) for c in (1, 2, 8, 32, 64, 256, 1024)]
    assert ratios == sorted(ratios)
    assert ratios[-1] > ratios[0]


def test_textbook_behaviour_on_small_sequences() -> None:
    loop = [1, 2, 3] * 10
    assert _run("lru", loop, 2) == 0.0  # LRU thrashes on a loop one larger than the pool
    assert _run("belady", loop, 2) > 0.4
    assert _run("lfu", [1, 1, 1, 2, 3, 1, 4, 1], 2) == pytest.approx(4 / 8)  # the frequent key stays
    # S3-FIFO: a one-hit scan does not flush a key that was hit in the main queue
    seq = [7, 7, 7, *list(range(100, 140)), 7]
    assert replay("s3fifo", seq, [-1] * len(seq), [0] * len(seq), 10, 1, 1, COST).hits[-1]


def test_value_policy_beats_lru_under_scans() -> None:
    rng = random.Random(5)
    hot = list(range(20))
    keys: list[int] = []
    fresh = 1000
    for _ in range(400):
        keys.extend(rng.sample(hot, 5))
        keys.extend(range(fresh, fresh + 10))  # one-shot prefixes
        fresh += 10
    assert _run("value", keys, 24) > _run("lru", keys, 24) + 0.1


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        replay("fifo", [1], [-1], [0], 4, 1, 1, COST)
