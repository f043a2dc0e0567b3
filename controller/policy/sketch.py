"""Popularity sketch for chunks the pool does not hold: a doorkeeper plus a count-min sketch.

The same shape as the data plane's count-min over missed GETs (TinyLFU): the first sighting
of a key only sets the doorkeeper, later ones increment the sketch (conservative update), and
every ``reset_every`` additions all counters halve and the doorkeeper empties, so estimates
are decayed counts with a half-life of ``reset_every`` additions.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1
# Odd 64-bit multipliers (multiply-shift hashing); fixed so estimates are reproducible.
_MULTIPLIERS = (
    0x9E3779B97F4A7C15,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0xD6E8FEB86659FD93,
    0xFF51AFD7ED558CCD,
    0xC4CEB9FE1A85EC53,
)


class FrequencySketch:
    """Decayed frequency estimates for 64-bit keys in bounded memory."""

    def __init__(self, width: int = 1 << 16, depth: int = 4, reset_every: int = 1 << 16) -> None:
        if width <= 0 or width & (width - 1):
            raise ValueError(f"sketch width must be a positive power of two, got {width}")
        if not 1 <= depth <= len(_MULTIPLIERS):
            raise ValueError(f"sketch depth must be within [1, {len(_MULTIPLIERS)}], got {depth}")
        if reset_every <= 0:
            raise ValueError(f"sketch reset period must be positive, got {reset_every}")
        self.width = width
        self.depth = depth
        self.reset_every = reset_every
        self._shift = 64 - (width.bit_length() - 1)
        self._rows: list[list[int]] = [[0] * width for _ in range(depth)]
        self._door: set[int] = set()
        self._additions = 0

    def _cells(self, key: int) -> list[int]:
        k = (key ^ (key >> 29)) & _MASK64
        return [((k * m) & _MASK64) >> self._shift for m in _MULTIPLIERS[: self.depth]]

    def estimate(self, key: int) -> int:
        """Decayed count of ``key`` (doorkeeper bit + sketch minimum)."""
        low = min(row[c] for row, c in zip(self._rows, self._cells(key), strict=True))
        return low + (1 if key in self._door else 0)

    def add(self, key: int) -> int:
        """Count one sighting of ``key``; returns its estimate including this one."""
        self._additions += 1
        if self._additions >= self.reset_every:
            self.halve()
        cells = self._cells(key)
        rows = self._rows
        low = min(row[c] for row, c in zip(rows, cells, strict=True))
        if key not in self._door:
            self._door.add(key)
            return low + 1
        for row, c in zip(rows, cells, strict=True):
            if row[c] == low:  # conservative update: only the minimal counters grow
                row[c] = low + 1
        return low + 2

    def halve(self) -> None:
        """Age all counts by half and empty the doorkeeper."""
        self._rows = [[v >> 1 for v in row] for row in self._rows]
        self._door.clear()
        self._additions = 0
