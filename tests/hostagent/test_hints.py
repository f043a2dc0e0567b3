"""Path selection as pure rules: what an agent keeps of the fabric's hints, and for how long."""

from __future__ import annotations

from hostagent.hints import FabricHints
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
