"""Each part of the P4Runtime driver on its own, with no switch: errors, entities, session, writes.

The driver against a switch (the model's P4Runtime server) is ``tests/controller/test_p4rt_driver.py``.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2

import controller.p4runtime as p4rt
from controller.p4runtime.entities import UPDATE_NAMES, _prebuilt
from controller.p4runtime.errors import UpdateError, WriteError
from controller.p4runtime.reads import SwitchReads
from controller.p4runtime.session import NONCE_BITS, SwitchSession, channel_options, make_cookie, pipeline_id
from controller.p4runtime.writes import SwitchWrites
from tests.paths import P4RT_MINI


def test_the_package_exports_what_callers_import() -> None:
    for name in p4rt.__all__:
        assert hasattr(p4rt, name), name
    assert p4rt.P4RuntimeSwitch.__mro__[1:3] == (SwitchWrites, SwitchReads)


def test_write_error_lists_every_rejected_update() -> None:
    errors = [UpdateError(0, "INSERT t {a}", "ALREADY_EXISTS", "dup"), UpdateError(3, "DELETE t {b}", "NOT_FOUND", "")]
    e = WriteError("sw:1", 4, errors)
    assert isinstance(e, p4rt.P4RuntimeError)
    assert e.codes == ["ALREADY_EXISTS", "NOT_FOUND"]
    assert e.code == "ALREADY_EXISTS" and e.address == "sw:1"
    assert "rejected 2 of 4" in str(e) and "#3 DELETE t {b}: NOT_FOUND" in str(e)


def test_entry_describes_itself_by_names() -> None:
    e = p4rt.Entry("MyIngress.t", {"hdr.x": 5}, "MyIngress.a", {"p": 1}, priority=7)
    assert e.describe().startswith("MyIngress.t {") and e.describe().endswith("prio 7")
    assert UPDATE_NAMES[p4runtime_pb2.Update.INSERT] == "INSERT"


def test_cookie_is_pipeline_then_nonce() -> None:
    pid = pipeline_id(b"info", b"json")
    assert pid < 1 << 40 and pid == pipeline_id(b"info", b"json") != pipeline_id(b"info", b"other")
    cookie = make_cookie(pid, nonce=5)
    assert cookie >> NONCE_BITS == pid and cookie & ((1 << NONCE_BITS) - 1) == 5 and cookie < 1 << 63


def test_channel_options_back_off_at_the_drivers_pace() -> None:
    opts = dict(channel_options(2.0))
    assert opts["grpc.max_reconnect_backoff_ms"] == 2000 and opts["grpc.use_local_subchannel_pool"] == 1
    assert dict(channel_options(0.0))["grpc.max_reconnect_backoff_ms"] == 100


def test_a_session_never_connected_is_down_and_refuses_calls_at_once() -> None:
    s = SwitchSession("127.0.0.1:1", P4RT_MINI, wait_ready_s=0, reconnect=False)
    assert s.health()["state"] == "down" and not s.connected and not s.ready
    with pytest.raises(p4rt.SwitchUnreachableError, match="not connected"):
        s.switch_cookie()
    assert s.runs_our_pipeline(make_cookie(s.pipeline_id)) and not s.runs_our_pipeline(None)
    with pytest.raises(NotImplementedError):
        s.resync()


class _RejectedBatch(grpc.RpcError):  # type: ignore[misc]  # grpc ships no stubs
    """A Write answered UNKNOWN with one p4.v1.Error per update, as P4Runtime servers do."""

    def __init__(self, codes: list[int]) -> None:
        status = status_pb2.Status(code=code_pb2.UNKNOWN)
        for c in codes:
            status.details.add().Pack(p4runtime_pb2.Error(canonical_code=c, message=f"code {c}"))
        self._status = status

    def trailing_metadata(self) -> Any:
        return [("grpc-status-details-bin", self._status.SerializeToString())]

    def details(self) -> str:
        return "batch failed"


def test_batch_errors_name_only_the_rejected_updates() -> None:
    chunk = [_prebuilt(p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT), f"u{i}") for i in range(3)]
    got = SwitchWrites._batch_errors(_RejectedBatch([code_pb2.OK, code_pb2.ALREADY_EXISTS, code_pb2.OK]), chunk, 10)
    assert got == [UpdateError(11, "u1", "ALREADY_EXISTS", "code 6")]
    # Details that do not match the batch: every update is reported, with the call's text.
    got = SwitchWrites._batch_errors(_RejectedBatch([code_pb2.OK]), chunk, 0)
    assert [(e.index, e.code) for e in got] == [(0, "UNKNOWN"), (1, "UNKNOWN"), (2, "UNKNOWN")]
