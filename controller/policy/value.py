"""Reuse value of a chunk: expected future hits x prefill compute it saves / bytes it occupies.

Expected future hits are a decayed hit count: every fetch adds one and the count halves every
``half_life`` fetches, so the count is the expected number of hits in the next half-life if
the chunk's recent rate persists. Kept in the log domain, ``log2(count) + t / half_life`` does
not change between hits, so chunks can sit in a heap ordered by it.

The compute a chunk saves grows with its position in the prefix: a token at context length
``c`` costs ``2 * n_params`` FLOPs in the dense layers plus ``4 * n_layers * d_model * c`` in
attention, so deep blocks of long prompts are worth more than the first block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """Prefill FLOPs per block of ``block_tokens`` tokens, by block position in the prefix."""

    n_params: float
    n_layers: int
    d_model: int
    block_tokens: int = 512

    def __post_init__(self) -> None:
        if self.n_params <= 0 or self.n_layers <= 0 or self.d_model <= 0 or self.block_tokens <= 0:
            raise ValueError("prefill cost model needs positive n_params, n_layers, d_model and block_tokens")

    def block_flops(self, position: int) -> float:
        """FLOPs to prefill block number ``position`` (0 = the first block of the prompt)."""
        b = self.block_tokens
        mid_context = position * b + b / 2
        return b * (2.0 * self.n_params + 4.0 * self.n_layers * self.d_model * mid_context)

    def prefix_flops(self, n_tokens: int) -> float:
        """FLOPs to prefill the first ``n_tokens`` tokens of a prompt."""
        return n_tokens * (2.0 * self.n_params + 2.0 * self.n_layers * self.d_model * n_tokens)

    def relative(self, position: int) -> float:
        """Compute saved by block ``position`` relative to block 0 (>= 1)."""
        return self.block_flops(position) / self.block_flops(0)


def decayed_log2(log2_count: float, t0: float, now: float, half_life: float) -> float:
    """log2 of a decayed count last updated at ``t0`` to ``log2_count``, seen at ``now``."""
    return log2_count - (now - t0) / half_life


def bump_log2(log2_count: float, t0: float, now: float, half_life: float) -> float:
    """log2 of the decayed count after one more hit at ``now``."""
    decayed = decayed_log2(log2_count, t0, now, half_life)
    # log2(2**d + 1) without overflow for large d
    return decayed + math.log2(1.0 + 2.0 ** (-decayed)) if decayed > -60 else 0.0


def reuse_value(expected_hits: float, saved_flops: float, nbytes: int) -> float:
    """The reuse value itself: expected hits x FLOPs saved per hit / bytes occupied."""
    return expected_hits * saved_flops / max(nbytes, 1)
