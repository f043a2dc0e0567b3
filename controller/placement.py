"""Placement ids for pool admissions: never 0, never reused while a switch runs (pure).

A switch serves a fragment only from a slot tagged ``{placement, frag_index}`` equal to
the chunk's ``pool_lookup`` entry (p4/include/pool.p4).  So every admission, re-admission
(another base slot, another length) and republish (another generation) gets a fresh
placement id: bytes written under an older one are never served, and nothing has to be
cleared (BMv2's P4Runtime server cannot write registers).  An id must therefore never be
given twice while a switch runs, also across a controller restart.

The controller keeps its high-water mark *in the switches*, as a table entry it can read
back: ``pool_lookup`` holds one entry under the reserved key ``MARK_KEY`` (state
DISABLED, so it is never filled or served) whose ``placement`` parameter is the highest
id the controller may have used.  Ids are reserved in blocks: before the first id of a
new block is used, the mark entry on every switch is moved to the block's end.  After a
restart the controller reads the entries back and continues above the largest placement
and mark it finds (:meth:`Placements.recover`), so an id used just before the restart,
whose entry may already be gone (an eviction), is still never given again.  A switch that
restarted has fresh registers, and any id is safe on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

MARK_KEY: Final = 0xFFFF_FFFF_FFFF_FFFF
"""Chunk key reserved for the placement mark entry (a real chunk key equal to it is refused)."""

MAX_PLACEMENT: Final = 0xFFFF_FFFF
"""Placement ids are the 32-bit ``placement`` parameter of ``pool_entry``."""


class PlacementError(RuntimeError):
    """Every placement id has been used (re-admit on a freshly started switch)."""


class Placements:
    """Hands out placement ids; says when the mark entry must move first."""

    def __init__(self, block: int = 256) -> None:
        if block < 1:
            raise ValueError(f"block must be positive, got {block}")
        self.block = block
        self.last = 0
        """The last id handed out (0: none yet)."""
        self.mark = 0
        """The highest id the switches' mark entries allow."""

    def recover(self, placements: Iterable[int], marks: Iterable[int]) -> None:
        """Continue above every placement and mark read back from the switches."""
        top = max([self.last, self.mark, *placements, *marks])
        if top > MAX_PLACEMENT:
            raise PlacementError(f"placement {top} read back does not fit 32 bits")
        self.last = self.mark = top

    def reserve(self) -> int | None:
        """Make sure the next id lies under the mark: the new mark to write first, or None if it already does."""
        if self.last + 1 > MAX_PLACEMENT:
            raise PlacementError("every 32-bit placement id has been used")
        if self.last + 1 <= self.mark:
            return None
        self.mark = min(MAX_PLACEMENT, self.mark + self.block)
        return self.mark

    def next(self) -> tuple[int, int | None]:
        """A fresh id, and the new mark to write on every switch before using it (None: no move needed)."""
        new_mark = self.reserve()
        self.last += 1
        return self.last, new_mark
