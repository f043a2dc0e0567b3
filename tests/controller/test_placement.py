"""Placement ids: never 0, never given twice, recovered above everything read back from the switches."""

from __future__ import annotations

import pytest

from controller.placement import MAX_PLACEMENT, PlacementError, Placements


def test_ids_start_at_one_and_the_mark_moves_a_block_ahead() -> None:
    p = Placements(block=3)
    assert p.next() == (1, 3)  # the mark entry must say 3 before id 1 is used
    assert p.next() == (2, None)
    assert p.next() == (3, None)
    assert p.next() == (4, 6)
    assert (p.last, p.mark) == (4, 6)


def test_recover_continues_above_placements_and_marks_read_back() -> None:
    p = Placements(block=10)
    # Entries left on the switches use 4 and 9; the mark says 20: ids up to 20 may have been
    # used (and their entries evicted) before the restart.
    p.recover(placements=[4, 9], marks=[20])
    assert p.next() == (21, 30)
    q = Placements(block=10)
    q.recover(placements=[], marks=[])  # fresh switches: start at 1
    assert q.next() == (1, 10)
    r = Placements(block=10)
    r.next()
    r.recover([2], [5])  # never below what this process already handed out or reserved
    assert r.next() == (11, 20)


def test_ids_run_out_loudly() -> None:
    p = Placements(block=1000)
    p.recover([MAX_PLACEMENT - 1], [])
    assert p.next() == (MAX_PLACEMENT, MAX_PLACEMENT)
    with pytest.raises(PlacementError, match="every 32-bit placement id"):
        p.next()
    with pytest.raises(PlacementError):
        Placements().recover([MAX_PLACEMENT + 1], [])
    with pytest.raises(ValueError):
        Placements(block=0)


def test_reserve_moves_the_mark_only_when_the_block_is_used_up() -> None:
    p = Placements(block=2)
    assert p.reserve() == 2 and p.reserve() is None
    assert p.next() == (1, None) and p.next() == (2, None)
    assert p.reserve() == 4 and p.next() == (3, None)
