"""The leader race's bookkeeping: which expert drives the switch, and when the evidence says another.

Every expert sees the same fetches, so two experts' hits are not independent counts: on most
fetches they agree (both hit a hot chunk, both miss a cold one), and only the fetches where
they disagree say anything about which is better. The race therefore tallies, besides each
expert's decayed hits, how often each pair disagreed, and a challenger takes over when its lead
clears ``z`` standard deviations of the lead itself, a paired (McNemar-style) test: with ``a``
fetches where only the challenger hit and ``c`` where only the leader did, the lead is
``a - c`` and its standard deviation, were the two equally good, ``sqrt(a + c)``.

The race before it compared hit totals as if they were independent Poisson counts (standard
deviation ``sqrt(hits_a + hits_b)``). Where two experts agree on most fetches that is far too
wide: at 4 GiB on the tool family the first expert and the best one each score some 10,000
decayed hits and disagree on 160 to 250 of those fetches, so the paired standard deviation is
about 15 hits and a lead of a few dozen is decisive, where the old test asked for some 145.
Over three draws of the generated families (72 cells of scripts/policy_loo.py) the paired test
left 8 cells below the best baseline instead of 11 and raised the mean share of Belady from
0.4625 to 0.4638, and from 0.406 to 0.424 on the held-out conversation trace
(docs/research/README.md). It hands over about twice as often; with the switch following the leader
lazily (image.py) a hand-over writes nothing, which is what made that affordable.

Tallies are decayed by epoch (``half_life`` in fetches), so the race follows a workload that
changes. The tally does not depend on who leads, so races that differ only in their leader (the
leave-one-family-out script runs hundreds) share one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


class RaceTally:
    """Decayed hits per expert and decayed disagreements per ordered pair, folded once per epoch."""

    def __init__(self, n: int, half_life: float, epoch_fetches: int) -> None:
        if n <= 0 or half_life <= 0 or epoch_fetches <= 0:
            raise ValueError("a race needs at least one expert, a positive half-life and a positive epoch")
        self.n = n
        self.decay = 0.5 ** (epoch_fetches / half_life)
        #: decayed hits of each expert
        self.scores = [0.0] * n
        #: ``only[i][j]``: decayed fetches where expert i hit and expert j missed
        self.only = [[0.0] * n for _ in range(n)]

    def fold(self, patterns: Mapping[int, int]) -> None:
        """Fold one epoch in: ``patterns`` maps a bit mask of the experts that hit (bit i: expert i) to its fetches."""
        n, d = self.n, self.decay
        scores = [s * d for s in self.scores]
        only = [[x * d for x in row] for row in self.only]
        full = (1 << n) - 1
        for mask, count in patterns.items():
            if not mask:
                continue
            hit = [i for i in range(n) if mask >> i & 1]
            for i in hit:
                scores[i] += count
            if mask == full:
                continue
            missed = [j for j in range(n) if not mask >> j & 1]
            for i in hit:
                row = only[i]
                for j in missed:
                    row[j] += count
        self.scores, self.only = scores, only

    def challenger(self, leader: int, among: Sequence[int] | None = None, margin: float = 0.0,
                   z: float = 1.0, paired: bool = True) -> int | None:
        """The expert (of ``among``, default all) that is clearly better than ``leader``, or None.

        Clearly: the most hits, more than ``(1 + margin)`` times the leader's, and a lead over the
        leader of more than ``z`` standard deviations of the paired test (``paired=False``: of the
        Poisson test the race ran before, kept to compare the two in scripts/policy_loo.py).
        """
        scores = self.scores
        best = max(among if among is not None else range(self.n), key=scores.__getitem__)
        if best == leader or not scores[best] > scores[leader] * (1.0 + margin):
            return None
        if not paired:
            lead, spread = scores[best] - scores[leader], scores[best] + scores[leader]
        else:
            a, c = self.only[best][leader], self.only[leader][best]
            lead, spread = a - c, a + c
        return best if lead > z * math.sqrt(spread) else None
