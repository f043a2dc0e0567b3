"""The ``target`` fixture: the switch under test, chosen by ``KVPOOL_TARGET``.

``model`` (default): the reference model in-process (real P4Runtime server, in-memory
ports).  ``model-veth``: the model as a ``kvpool-switch`` process on veth pairs.
``bmv2``: ``simple_switch_grpc`` from PATH on veth pairs.  The veth targets need root
(and BMv2 needs simple_switch_grpc); without them the tests skip and say why.  Every
test gets a freshly pushed pipeline; the veth targets keep one process per session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from switchmodel.targets import bmv2_missing
from switchmodel.vethlab import can_build

from .harness import BMV2_JSON, P4INFO, ModelTarget, Target, VethTarget, target_kind

_SESSION: dict[str, VethTarget] = {}


def _skip_reason(kind: str) -> str | None:
    if not P4INFO.exists():
        return f"{P4INFO} is missing (compile p4/ with `make -C p4`)"
    if kind == "model":
        return None
    reason = can_build()
    if reason is None and kind == "bmv2":
        reason = bmv2_missing()
        if reason is None and not BMV2_JSON.exists():
            reason = f"{BMV2_JSON} is missing (BMv2 needs the compiled program)"
    return reason


@pytest.fixture
def target() -> Iterator[Target]:
    """The switch under test, programmed from scratch, with no frames pending."""
    kind = target_kind()
    reason = _skip_reason(kind)
    if reason:
        pytest.skip(f"target {kind}: {reason}")
    if kind == "model":
        t = ModelTarget()
        try:
            yield t
        finally:
            t.close()
        return
    veth = _SESSION.get(kind)
    if veth is None:
        veth = _SESSION[kind] = VethTarget.start(kind)
    else:
        veth.reset()
    yield veth


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the veth targets' processes and remove their labs."""
    for veth in _SESSION.values():
        veth.close()
    _SESSION.clear()
