"""A run waits for the controller to reach every switch, and names the one it cannot."""

from __future__ import annotations

from typing import Any, cast

import pytest

from bmv2_topologies.experiment.testbed import wait_switches
from bmv2_topologies.network import NetworkError


class _Driver:
    def __init__(self, address: str, ready: bool) -> None:
        self.address = address
        self.ready = ready
        self.waited: list[float] = []

    def wait_connected(self, timeout_s: float | None = None) -> bool:
        self.waited.append(float(timeout_s or 0.0))
        return self.ready

    def health(self) -> dict[str, Any]:
        return {"last_error": "did not answer within 10.0 s"}


class _Ctl:
    def __init__(self, **switches: _Driver) -> None:
        self.switches = switches


class _Net:
    def switch_state(self, name: str) -> str:
        return f"exited with code 1; log logs/{name}.log ends: kvpool-switch: interface {name}-eth2: no such device"


def test_every_reachable_switch_is_waited_for_within_one_budget() -> None:
    s1, s2 = _Driver("127.0.0.1:50052", True), _Driver("127.0.0.1:50053", True)
    wait_switches(cast(Any, _Ctl(s1=s1, s2=s2)), cast(Any, _Net()), timeout_s=5)
    assert len(s1.waited) == len(s2.waited) == 1
    assert 0 < s2.waited[0] <= s1.waited[0] <= 5


def test_an_unreachable_switch_is_named_with_its_process_state() -> None:
    ctl = _Ctl(s1=_Driver("127.0.0.1:50052", True), s3=_Driver("127.0.0.1:50054", False))
    with pytest.raises(NetworkError, match=r"cannot reach switch s3 at 127\.0\.0\.1:50054 after 5 s "
                                           r"\(did not answer within 10\.0 s\); the switch is exited with code 1"):
        wait_switches(cast(Any, ctl), cast(Any, _Net()), timeout_s=5)
