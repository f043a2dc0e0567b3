"""Path selection and the holder's hold policy, as pure rules: the hints document, what an agent
keeps of it, the holder's memory of duplicates, and what the controller sends and when."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from controller.hints import HintPublisher, HintSchedule, HintSettings, HotChunks, hints_for
from hostagent.hints import DuplicateTracker, FabricHints
from kvpool import hints as kh
from kvpool.hints import GetPath, Hint, HintError, Hints
from kvpool.httpjson import ApiUnreachableError

HOT, POOLED, COLD = 0x10, 0x20, 0x30


def test_document_round_trips_and_bad_documents_name_the_first_bad_item() -> None:
    hints = Hints({HOT: Hint(GetPath.SINGLE, 5000), POOLED: Hint(GetPath.SERVABLE)}, 15.0, True)
    doc = kh.document(hints)
    assert doc["chunks"][0] == {"key": "0x0000000000000010", "path": "single", "nbytes": 5000}
    assert kh.parse(doc) == Hints(dict(hints.chunks), 15.0, True)
    assert kh.parse({"ttl_s": 1, "chunks": []}) == Hints({}, 1.0, False)  # merge defaults to false
    bad: list[tuple[Mapping[str, Any], str]] = [
        ({"chunks": []}, "ttl_s"),
        ({"ttl_s": 0, "chunks": []}, "ttl_s"),
        ({"ttl_s": True, "chunks": []}, "ttl_s"),
        ({"ttl_s": 1}, "chunks must be a list"),
        ({"ttl_s": 1, "merge": "yes", "chunks": []}, "merge"),
        ({"ttl_s": 1, "chunks": [1]}, r"chunks\[0\] must be an object"),
        ({"ttl_s": 1, "chunks": [{"key": "10", "path": "single"}]}, r"chunks\[0\].key"),
        ({"ttl_s": 1, "chunks": [{"key": "0x" + "f" * 17, "path": "single"}]}, r"chunks\[0\].key"),
        ({"ttl_s": 1, "chunks": [{"key": "0xzz", "path": "single"}]}, r"chunks\[0\].key"),
        ({"ttl_s": 1, "chunks": [{"key": "0x1", "path": "range"}]}, "single or servable"),
        ({"ttl_s": 1, "chunks": [{"key": "0x1", "path": "single", "nbytes": -1}]}, "nbytes"),
    ]
    for doc_bad, why in bad:
        with pytest.raises(HintError, match=why):
            kh.parse(doc_bad)


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


def test_controller_hot_set_expires_and_pooled_chunks_are_servable() -> None:
    hot = HotChunks(ttl_s=30.0)
    hot.report(HOT, 0.0)
    hot.report(POOLED, 10.0)
    assert hot.live(20.0) == {HOT, POOLED}
    assert hot.live(35.0) == {POOLED}  # HOT was last reported 35 s ago
    hot.report(HOT, 36.0)
    assert hot.live(36.0) == {HOT, POOLED}
    lengths = {HOT: 100, POOLED: 200}
    got = hints_for({HOT, POOLED}, {POOLED}, lambda k: lengths.get(k, 0))
    assert got == {HOT: Hint(GetPath.SINGLE, 100), POOLED: Hint(GetPath.SERVABLE, 200)}
    assert hints_for(set(), {COLD}, lambda k: 0) == {COLD: Hint(GetPath.SERVABLE, 0)}


def test_hints_are_sent_when_they_change_and_refreshed_before_agents_drop_them() -> None:
    s = HintSchedule(refresh_s=5.0)
    one = {HOT: Hint(GetPath.SINGLE)}
    assert s.due({}, 0.0)  # the first document always goes (it clears what an earlier controller said)
    assert not s.due({}, 1.0)
    assert s.due(one, 1.5) and not s.due(dict(one), 2.0)
    assert s.due(one, 6.6)  # unchanged, but a refresh is due
    settings = HintSettings(refresh_s=5.0)
    assert settings.ttl_s == 15.0  # two lost refreshes are survived
    with pytest.raises(ValueError):
        HintSettings(refresh_s=0)


class _Sink:
    def __init__(self, fail: bool = False) -> None:
        self.docs: list[Mapping[str, Any]] = []
        self.fail = fail
        self.api = "fake"
        self.sent = threading.Event()

    def send(self, doc: Mapping[str, Any]) -> None:
        if self.fail:
            raise ApiUnreachableError("agent down")
        self.docs.append(doc)
        self.sent.set()


def test_publisher_delivers_the_latest_document_to_every_sink_and_counts_failures() -> None:
    good, down = _Sink(), _Sink(fail=True)
    pub = HintPublisher([down, good])
    try:
        pub.publish(Hints({HOT: Hint(GetPath.SINGLE, 9)}, 15.0, True))
        assert pub.flush(5.0) and good.sent.wait(5.0)
        assert kh.parse(good.docs[-1]) == Hints({HOT: Hint(GetPath.SINGLE, 9)}, 15.0, True)
        assert pub.failures >= 1 and pub.sent >= 1
    finally:
        pub.close()
    idle = HintPublisher([])  # no sinks: no thread, publishing is a no-op that never blocks
    idle.publish(Hints({}, 1.0, False))
    idle.close()
