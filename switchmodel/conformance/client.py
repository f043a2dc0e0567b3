"""A conformance client: its own gRPC connection, optionally a stream, every answer as text.

Every client opens its own connection (``grpc.use_local_subchannel_pool``), as separate
processes would, so "a client that never opened a stream" is a different gRPC peer from
the primary even inside one process. An answer is the gRPC status code (for a batched
Write, the code of each update, squeezed: ``[OK*3, UNKNOWN]``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from kvpool.p4rt.p4info import P4Info

INSERT, MODIFY, DELETE = p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE
_PIPE = p4runtime_pb2.SetForwardingPipelineConfigRequest
_WAIT_S = 10.0  # how long to wait for an arbitration message the server must send
PRIMARY_ID, BACKUP_ID = 10, 5
OTHER_DEVICE_ID = 42
COOKIE = 0x6B76706F6F6C  # "kvpool"


def _code_name(code: int) -> str:
    return str(code_pb2.Code.Name(code))


def _rpc_answer(e: grpc.RpcError) -> str:
    """The answer of a failed RPC: per-update codes for a batched Write, else the RPC's code."""
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            codes = []
            for detail in status.details:
                err = p4runtime_pb2.Error()
                detail.Unpack(err)
                codes.append(_code_name(err.canonical_code))
            if codes:
                return _squeeze(codes)
    return str(e.code().name)


def _squeeze(codes: Sequence[str]) -> str:
    """``OK*3, UNKNOWN`` for ``[OK, OK, OK, UNKNOWN]``: short answers for long batches."""
    if len(codes) == 1:
        return codes[0]
    runs: list[list[Any]] = []
    for c in codes:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return "[" + ", ".join(c if n == 1 else f"{c}*{n}" for c, n in runs) + "]"


# ---------------------------------------------------------------------------------------------
# A client: its own connection, optionally a stream
# ---------------------------------------------------------------------------------------------


class Client:
    """One P4Runtime client on its own gRPC connection; ``stream`` opens a StreamChannel."""

    def __init__(self, address: str, device_id: int, stream: bool) -> None:
        self.device_id = device_id
        self.channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1),
                                                               ("grpc.max_receive_message_length", 64 << 20)])
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.election: int | None = None
        self.arbitrations: queue.Queue[Any] = queue.Queue()
        self._requests: queue.Queue[Any] | None = None
        if stream:
            requests: queue.Queue[Any] = queue.Queue()
            self._requests = requests

            def pending() -> Iterator[Any]:
                while (msg := requests.get()) is not None:
                    yield msg

            call = self.stub.StreamChannel(pending())
            threading.Thread(target=self._receive, args=(call,), daemon=True).start()

    def _receive(self, call: Any) -> None:
        try:
            for msg in call:
                if msg.HasField("arbitration"):
                    self.arbitrations.put(msg.arbitration)
        except grpc.RpcError as e:
            self.arbitrations.put(e)
        self.arbitrations.put(None)

    def send(self, msg: Any) -> None:
        """Queue a StreamMessageRequest on this client's stream."""
        assert self._requests is not None, "this client has no stream"
        self._requests.put(msg)

    def arbitrate(self, election: int | None, device_id: int | None = None) -> None:
        """Send an arbitration update (``election`` None: no election id field)."""
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id if device_id is None else device_id
        if election is not None:
            req.arbitration.election_id.low = election
            self.election = election
        self.send(req)

    def arbitration_answer(self) -> str:
        """The next arbitration message on the stream, as text (or how the stream ended)."""
        try:
            msg = self.arbitrations.get(timeout=_WAIT_S)
        except queue.Empty:
            return "no answer"
        if msg is None:
            return "stream ended"
        if isinstance(msg, grpc.RpcError):
            return f"stream closed: {msg.code().name}"
        role = "primary" if msg.status.code == code_pb2.OK else "backup"
        return f"{_code_name(msg.status.code)} {role}, primary id {msg.election_id.low}, device {msg.device_id}"

    def _election_of(self, req: Any, election: int | str | None) -> None:
        value = self.election if election == "own" else election
        if isinstance(value, int):
            req.election_id.low = value

    def write(self, updates: Sequence[Any], election: int | str | None = "own", device_id: int | None = None,
              atomicity: int = p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR) -> str:
        """Send one WriteRequest; OK, the RPC's code, or each update's code."""
        req = p4runtime_pb2.WriteRequest(device_id=self.device_id if device_id is None else device_id,
                                         atomicity=atomicity)
        self._election_of(req, election)
        req.updates.extend(updates)
        try:
            self.stub.Write(req, timeout=30)
        except grpc.RpcError as e:
            return _rpc_answer(e)
        return "OK"

    def read(self, *entities: Any, device_id: int | None = None) -> tuple[str, list[Any]]:
        """Send one ReadRequest; (OK or the code, the entities returned)."""
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id if device_id is None else device_id)
        req.entities.extend(entities)
        try:
            got = [e for resp in self.stub.Read(req, timeout=30) for e in resp.entities]
        except grpc.RpcError as e:
            return str(e.code().name), []
        return "OK", got

    def set_pipeline(self, action: int, p4info: P4Info | None, device_config: bytes = b"",
                     election: int | str | None = "own") -> str:
        """SetForwardingPipelineConfig; OK or the code."""
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=self.device_id, action=action)
        self._election_of(req, election)
        if p4info is not None:
            req.config.p4info.CopyFrom(p4info.message)
            req.config.p4_device_config = device_config
            req.config.cookie.cookie = COOKIE
        try:
            self.stub.SetForwardingPipelineConfig(req, timeout=60)
        except grpc.RpcError as e:
            return str(e.code().name)
        return "OK"

    def close(self) -> None:
        """End the stream and the connection."""
        if self._requests is not None:
            self._requests.put(None)
        self.channel.close()
