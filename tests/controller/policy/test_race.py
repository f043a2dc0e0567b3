"""The leader race's tally and its paired test (controller/policy/race.py)."""

from __future__ import annotations

import pytest

from controller.policy.race import RaceTally

BOTH, ONLY_0, ONLY_1, NONE = 0b11, 0b01, 0b10, 0b00


def test_fold_counts_hits_and_one_sided_disagreements_by_bit() -> None:
    t = RaceTally(3, half_life=1e12, epoch_fetches=1)  # no decay to speak of
    t.fold({0b111: 5, 0b101: 3, 0b010: 2, 0b000: 7})
    assert t.scores == pytest.approx([8.0, 7.0, 8.0])
    assert t.only[0][1] == pytest.approx(3.0)  # 0 and 2 hit, 1 missed
    assert t.only[1][0] == pytest.approx(2.0)  # only 1 hit
    assert t.only[0][2] == 0.0 and t.only[2][0] == 0.0  # 0 and 2 always agreed
    assert t.only[1][2] == pytest.approx(2.0) and t.only[2][1] == pytest.approx(3.0)
    assert all(t.only[i][i] == 0.0 for i in range(3))


def test_fold_decays_by_half_every_half_life() -> None:
    t = RaceTally(2, half_life=256.0, epoch_fetches=128)
    t.fold({ONLY_0: 100})
    t.fold({})
    t.fold({})
    assert t.scores[0] == pytest.approx(50.0)  # two epochs of 128 fetches: one half-life
    assert t.only[0][1] == pytest.approx(50.0)


def test_a_small_steady_lead_of_experts_that_agree_on_most_fetches_wins_the_paired_test() -> None:
    # Both hit 1,000 fetches; the challenger hits 30 more. Hit totals as independent Poisson counts
    # would ask for a lead of sqrt(2,030) = 45; where they disagreed, 30 against 0 is decisive.
    t = RaceTally(2, half_life=1e12, epoch_fetches=1)
    t.fold({BOTH: 1000, ONLY_1: 30, NONE: 500})
    assert t.challenger(0, paired=False) is None
    assert t.challenger(0) == 1
    assert t.challenger(1) is None  # the leader itself is never its own challenger


def test_a_lead_within_the_noise_of_the_disagreements_does_not_hand_over() -> None:
    t = RaceTally(2, half_life=1e12, epoch_fetches=1)
    t.fold({BOTH: 1000, ONLY_1: 30, ONLY_0: 25})  # lead 5, one standard deviation sqrt(55) = 7.4
    assert t.challenger(0) is None
    assert t.challenger(0, z=0.5) == 1  # 5 > 0.5 * sqrt(55): a laxer threshold would


def test_challenger_honours_the_margin_and_the_subset() -> None:
    t = RaceTally(3, half_life=1e12, epoch_fetches=1)
    t.fold({0b111: 100, 0b010: 40, 0b100: 12})
    # hits: expert 0 100, expert 1 140, expert 2 112; 2 differs from 0 on 12 fetches only, all its own
    assert t.challenger(0) == 1
    assert t.challenger(0, margin=0.5) is None  # 140 is not 1.5 x 100
    assert t.challenger(0, among=[0, 2]) == 2  # 12 > sqrt(12)
    assert t.challenger(0, among=[0, 2], z=4.0) is None  # 12 < 4 x sqrt(12)


def test_bad_sizes_are_refused() -> None:
    for n, hl, ep in ((0, 1.0, 1), (2, 0.0, 1), (2, 1.0, 0)):
        with pytest.raises(ValueError, match="race needs"):
            RaceTally(n, hl, ep)
