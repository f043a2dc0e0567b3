"""Reuse-value arithmetic: prefill cost by position, decayed counts, the frequency sketch."""

from __future__ import annotations

import math

import pytest

from controller.policy.sketch import FrequencySketch
from controller.policy.value import PrefillCost, bump_log2, decayed_log2, reuse_value


def test_block_cost_grows_with_position_and_sums_to_prefix_cost() -> None:
    c = PrefillCost(n_params=1e9, n_layers=24, d_model=1024, block_tokens=512)
    assert c.relative(0) == 1.0
    assert c.relative(10) > c.relative(1) > 1.0
    total = sum(c.block_flops(p) for p in range(8))
    assert total == pytest.approx(c.prefix_flops(8 * 512), rel=1e-9)
    with pytest.raises(ValueError):
        PrefillCost(0, 1, 1)


def test_decayed_count_halves_per_half_life_and_bumps_by_one() -> None:
    log2c = math.log2(8.0)
    assert 2 ** decayed_log2(log2c, 0.0, 100.0, 100.0) == pytest.approx(4.0)
    assert 2 ** bump_log2(log2c, 0.0, 100.0, 100.0) == pytest.approx(5.0)
    assert 2 ** bump_log2(log2c, 0.0, 0.0, 100.0) == pytest.approx(9.0)
    assert reuse_value(2.0, 10.0, 5) == 4.0


def test_sketch_counts_and_halves() -> None:
    s = FrequencySketch(width=1 << 12, depth=4, reset_every=1 << 20)
    for _ in range(10):
        s.add(42)
    s.add(7)
    assert s.estimate(42) == 10 and s.estimate(7) == 1 and s.estimate(99) == 0
    s.halve()
    assert s.estimate(42) == 4  # 9 sketch counts halve to 4; the doorkeeper bit is cleared
    with pytest.raises(ValueError):
        FrequencySketch(width=1000)


def test_sketch_estimates_never_undercount() -> None:
    s = FrequencySketch(width=256, depth=4, reset_every=1 << 20)
    truth: dict[int, int] = {}
    for i in range(3000):
        k = (i * 7919) % 500
        s.add(k)
        truth[k] = truth.get(k, 0) + 1
    assert all(s.estimate(k) >= v for k, v in truth.items())
