"""Path selection and the holder's hold policy as pure rules: what an agent keeps of the fabric's hints,
and the holder's short memory of who asked for what (holds, conversions)."""

from __future__ import annotations

import pytest

from hostagent.hints import DuplicateTracker, FabricHints
from kvpool.hints import GetPath, Hint, Hints

HOT, POOLED, COLD = 0x10, 0x20, 0x30


def test_requester_path_is_range_unless_the_fabric_named_the_chunk_and_hints_expire() -> None:
    fh = FabricHints()
    assert fh.path(HOT, now=0.0) is GetPath.RANGE and not fh.merging(now=0.0)  # no controller: the cheap path
    fh.update(Hints({HOT: Hint(GetPath.SINGLE, 1), POOLED: Hint(GetPath.SERVABLE)}, 10.0, True), now=100.0)
    assert [fh.path(k, now=105.0) for k in (HOT, POOLED, COLD)] == [GetPath.SINGLE, GetPath.SERVABLE, GetPath.RANGE]
    assert fh.merging(now=105.0) and fh.hint(HOT, now=105.0) == Hint(GetPath.SINGLE, 1)
    assert fh.stats(now=105.0)["chunks"] == {"single": 1, "servable": 1}
    # A controller that stops sending cannot leave agents on the expensive path.
    assert fh.path(HOT, now=110.0) is GetPath.RANGE and not fh.merging(now=110.0) and list(fh.keys(now=110.0)) == []
    # A new document replaces the old one as a whole.
    fh.update(Hints({COLD: Hint(GetPath.SINGLE)}, 10.0, False), now=111.0)
    assert fh.path(HOT, now=112.0) is GetPath.RANGE and fh.path(COLD, now=112.0) is GetPath.SINGLE
    assert not fh.merging(now=112.0) and fh.updates == 2


def test_holder_sees_a_duplicate_only_from_another_request_within_the_hold() -> None:
    t = DuplicateTracker(hold_s=0.1)
    a, b = (("10.0.0.1", 5), 7), (("10.0.0.2", 5), 9)
    assert not t.asked(HOT, a, 0.0)  # alone
    assert not t.asked(HOT, a, 0.05)  # the same request asking more is no duplicate
    assert t.asked(HOT, b, 0.08)  # another request within 0.1 s of the last ask
    assert not t.asked(HOT, a, 0.5)  # long after: the chunk is no longer in flight for anyone
    assert not t.asked(COLD, b, 0.5)


def test_holds_are_bounded_so_late_requesters_cannot_starve_a_chunk() -> None:
    t = DuplicateTracker(hold_s=0.1)
    assert t.hold(HOT, 1.0) and t.held_until(HOT) == pytest.approx(1.1)
    assert not t.hold(HOT, 1.05)  # already held: not extended
    assert not t.hold(HOT, 1.15)  # ended under a hold time ago: the chunk is sent for a while first
    assert t.hold(HOT, 1.21) and t.holds == 2
    assert t.next_release(1.22) == pytest.approx(1.31) and t.next_release(1.4) is None
    assert t.held_until(COLD) == 0.0
    t.convert(HOT, 2.0)
    assert t.converting(HOT, 2.19) and not t.converting(HOT, 2.21) and t.conversions == 1
    with pytest.raises(ValueError):
        DuplicateTracker(hold_s=0)


def test_tracker_memory_is_bounded() -> None:
    t = DuplicateTracker(hold_s=1.0, max_keys=4)
    owner = (("10.0.0.1", 1), 1)
    for k in range(10):
        t.asked(k, owner, 0.0)
    assert not t.asked(0, (("10.0.0.2", 1), 1), 0.1)  # forgotten: the least recently asked went first
    assert t.asked(9, (("10.0.0.2", 1), 1), 0.1)
