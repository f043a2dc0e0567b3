"""What the controller tells agents and when: the hot set expires, pooled chunks are servable, changes go
out at once and unchanged hints are refreshed, the publisher delivers the latest document to every agent."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from controller.hints import HintPublisher, HintSchedule, HintSettings, HotChunks, hints_for
from kvpool import hints as kh
from kvpool.hints import GetPath, Hint, Hints
from kvpool.http_api import ApiUnreachableError

HOT, POOLED, COLD = 0x10, 0x20, 0x30


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
