"""P4Runtime 1.4 gRPC server of the reference switch model, behaving like BMv2's PI server.

Serves ``p4.v1.P4Runtime`` over a :class:`~switchmodel.state.SwitchState`: pipeline config,
table entries (exact/lpm/ternary/range/optional, default entries, direct counters),
multicast groups, indexed counters (read, MODIFY to set), digest config and delivery with
acks, PacketIn/PacketOut, and master arbitration on the stream. Errors use P4Runtime's
codes; a batched Write that fails answers UNKNOWN with one ``p4.v1.Error`` per update in
the status details (``grpc-status-details-bin``), as PI does, so p4runtime-shell and our
driver read them the same way from either target.  Every message is encoded and decoded by
:mod:`kvpool.p4rt.codec`, the codec the controller's driver uses too.

Codes follow PI (p4lang/PI proto/frontend), not always the spec's wording: an id missing
from the P4Info is INVALID_ARGUMENT ("Invalid P4 id"; digests: NOT_FOUND); bytestrings of
any length are accepted when the value fits; an absent election id is id 0; with no stream
open, requests without an election id are accepted; counter DELETE resets the cell, an
index out of range is UNKNOWN; counters report packets and bytes whatever their unit.

Left out (UNIMPLEMENTED), as far as BMv2 goes too: register and meter entries, action
profiles, clone sessions, ROLLBACK_ON_ERROR/DATAPLANE_ATOMIC batches, named roles.
Known differences from BMv2: Capabilities says "1.4.1" (PI says "1.3.0"); arbitration for
another device id is refused with NOT_FOUND (PI would create an empty device); the device
config is stored without checking that it is BMv2 JSON; replicas are read back with
``egress_port`` even when written with ``port``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from kvpool.p4rt import codec
from kvpool.p4rt.codec import ActionCall, CodecError, CounterValue, FieldMatch, TableEntry
from kvpool.p4rt.p4info import P4Info, P4InfoError, TableInfo
from switchmodel.state import DigestList, PacketIn, StateError, SwitchState

log = logging.getLogger(__name__)

API_VERSION = "1.4.1"

_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_NOT_FOUND = grpc.StatusCode.NOT_FOUND
# PI answers an id missing from the P4Info (table, action, match field, param, counter) with
# INVALID_ARGUMENT "Invalid P4 id"; only digest ids get NOT_FOUND. We answer the same.
_BAD_ID = grpc.StatusCode.INVALID_ARGUMENT
_UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED

#: grpc.StatusCode -> google.rpc.Code number.
_CODE_NUMBER = {c: int(c.value[0]) for c in grpc.StatusCode}


def _election(eid: Any) -> int:
    return (int(eid.high) << 64) | int(eid.low)


def _set_election(msg: Any, value: int) -> None:
    msg.high = value >> 64
    msg.low = value & ((1 << 64) - 1)


# ---------------------------------------------------------------------------------------------
# Protobuf <-> state: kvpool.p4rt.codec, with its errors as P4Runtime status codes
# ---------------------------------------------------------------------------------------------


def _decode_match(t: TableInfo, pb: Any, require_exact: bool = True) -> dict[str, FieldMatch]:
    """Decoded match of a TableEntry; INVALID_ARGUMENT for unknown fields or bad values."""
    try:
        return codec.decode_match(t, pb.match, require_exact=require_exact)
    except (P4InfoError, CodecError) as e:
        raise StateError(_BAD_ID if isinstance(e, P4InfoError) else _INVALID, str(e)) from None


def _decode_action(p4info: P4Info, pb: Any) -> ActionCall:
    """ActionCall of a p4.v1.Action: every parameter present once, values within their widths."""
    try:
        return codec.decode_action(p4info, pb)
    except (P4InfoError, CodecError) as e:
        raise StateError(_BAD_ID if isinstance(e, P4InfoError) else _INVALID, str(e)) from None


# ---------------------------------------------------------------------------------------------
# Arbitration
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Stream:
    """One controller's StreamChannel: its election id and the queue of messages to send it."""

    out: queue.Queue[Any] = field(default_factory=queue.Queue)
    election_id: int | None = None  # None until the stream's first arbitration update


class _Arbiter:
    """Master election among the streams of one device (default role only)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.streams: list[_Stream] = []

    def master(self) -> _Stream | None:
        candidates = [s for s in self.streams if s.election_id is not None]
        return max(candidates, key=lambda s: s.election_id or 0, default=None)

    def highest(self) -> int | None:
        m = self.master()
        return m.election_id if m else None

    def is_master_election(self, election_id: int) -> bool:
        with self.lock:
            m = self.master()
            return m is not None and m.election_id == election_id


# ---------------------------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------------------------


class P4RuntimeService(p4runtime_pb2_grpc.P4RuntimeServicer):  # type: ignore[misc]
    """The ``p4.v1.P4Runtime`` service over one switch state."""

    def __init__(self, state: SwitchState) -> None:
        self.state = state
        self.arbiter = _Arbiter()
        self._stop = threading.Event()
        self._pump = threading.Thread(target=self._pump_loop, name="p4rt-stream-pump", daemon=True)
        self._pump.start()

    def close(self) -> None:
        """Stop the stream pump and end every open stream."""
        self._stop.set()
        self.state.wake()
        with self.arbiter.lock:
            for s in self.arbiter.streams:
                s.out.put(None)
        self._pump.join(timeout=2)

    # --- helpers ---------------------------------------------------------------------------------

    def _check_device(self, device_id: int, context: grpc.ServicerContext) -> None:
        # PI creates device state lazily, so another device id is a device without a pipeline.
        if device_id != self.state.device_id:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"No forwarding pipeline config set for this device (device {device_id}; "
                          f"this switch is device {self.state.device_id})")

    def _check_master(self, request: Any, context: grpc.ServicerContext) -> None:
        if request.role:
            context.abort(_UNIMPLEMENTED, f"role {request.role!r}: only the default role is supported")
        with self.arbiter.lock:
            no_streams = not self.arbiter.streams
        # As PI: with no controller connected, a request without an election id is accepted
        # (handy for grpc_cli-style debugging); otherwise it must carry the master's id.
        if no_streams and not request.HasField("election_id"):
            return
        if not self.arbiter.is_master_election(_election(request.election_id)):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          "not master: the election id does not match the master's (open a stream and win "
                          "arbitration first)")

    def _p4info(self, context: grpc.ServicerContext) -> P4Info:
        pipe = self.state.pipeline
        if pipe is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
            raise AssertionError("unreachable")
        return pipe.p4info

    # --- capabilities and pipeline ---------------------------------------------------------------

    def Capabilities(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Report the P4Runtime API version."""
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    def SetForwardingPipelineConfig(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Verify, save or commit a P4Info + device config (master only)."""
        self._check_device(request.device_id, context)
        self._check_master(request, context)
        actions = p4runtime_pb2.SetForwardingPipelineConfigRequest
        action = request.action
        if action == actions.COMMIT:
            try:
                self.state.commit_saved()
            except StateError as e:
                context.abort(e.code, e.message)
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        if action == actions.UNSPECIFIED:
            context.abort(_INVALID, "SetForwardingPipelineConfig: action is UNSPECIFIED")
        if not request.HasField("config") or not request.config.HasField("p4info"):
            context.abort(_INVALID, "SetForwardingPipelineConfig: config with a P4Info is required")
        try:
            p4info = P4Info(request.config.p4info)
        except (ValueError, KeyError) as e:
            context.abort(_INVALID, f"bad P4Info: {e}")
            raise AssertionError("unreachable") from None
        device_config = bytes(request.config.p4_device_config)
        cookie = int(request.config.cookie.cookie) if request.config.HasField("cookie") else None
        if action == actions.VERIFY_AND_SAVE:
            self.state.save_pipeline(p4info, device_config, cookie)
        elif action == actions.VERIFY_AND_COMMIT:
            self.state.set_pipeline(p4info, device_config, cookie)
        elif action == actions.RECONCILE_AND_COMMIT:
            self.state.reconcile_pipeline(p4info, device_config, cookie)
        elif action != actions.VERIFY:
            context.abort(_INVALID, f"SetForwardingPipelineConfig: unknown action {action}")
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Return the committed config, in the parts the response type asks for."""
        self._check_device(request.device_id, context)
        pipe = self.state.pipeline
        if pipe is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
            raise AssertionError("unreachable")
        types = p4runtime_pb2.GetForwardingPipelineConfigRequest
        rtype = request.response_type
        response = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        config = response.config
        if pipe.cookie is not None:  # PI returns the cookie only when one was set
            config.cookie.cookie = pipe.cookie
        if rtype in (types.ALL, types.P4INFO_AND_COOKIE):
            config.p4info.CopyFrom(pipe.p4info.message)
        if rtype in (types.ALL, types.DEVICE_CONFIG_AND_COOKIE):
            config.p4_device_config = pipe.device_config
        return response

    # --- Write -----------------------------------------------------------------------------------

    def Write(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Apply a batch of updates (master only); per-update errors go in the status details."""
        self._check_device(request.device_id, context)
        self._check_master(request, context)
        p4info = self._p4info(context)
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            context.abort(_UNIMPLEMENTED, "only CONTINUE_ON_ERROR atomicity is supported")
        errors: list[tuple[grpc.StatusCode, str]] = []
        for update in request.updates:
            try:
                self._apply(p4info, update)
                errors.append((grpc.StatusCode.OK, ""))
            except StateError as e:
                errors.append((e.code, e.message))
                self.state.count("write_rejected")
        if any(code != grpc.StatusCode.OK for code, _ in errors):
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
            for code, message in errors:
                err = p4runtime_pb2.Error(canonical_code=_CODE_NUMBER[code], message=message)
                detail = any_pb2.Any()
                detail.Pack(err)
                status.details.append(detail)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(grpc.StatusCode.UNKNOWN, "Write failure.")
        return p4runtime_pb2.WriteResponse()

    def _apply(self, p4info: P4Info, update: Any) -> None:
        kind = update.entity.WhichOneof("entity")
        utype = update.type
        types = p4runtime_pb2.Update
        if utype == types.UNSPECIFIED:
            raise StateError(_INVALID, "update type is UNSPECIFIED")
        if kind == "table_entry":
            self._write_table_entry(p4info, utype, update.entity.table_entry)
        elif kind == "packet_replication_engine_entry":
            self._write_pre(utype, update.entity.packet_replication_engine_entry)
        elif kind == "digest_entry":
            self._write_digest(p4info, utype, update.entity.digest_entry)
        elif kind == "counter_entry":
            self._write_counter(p4info, utype, update.entity.counter_entry)
        elif kind == "direct_counter_entry":
            self._write_direct_counter(p4info, utype, update.entity.direct_counter_entry)
        elif kind in ("register_entry", "meter_entry", "direct_meter_entry"):
            raise StateError(_UNIMPLEMENTED, f"{kind} writes are not supported (as in BMv2's P4Runtime server)")
        else:
            raise StateError(_UNIMPLEMENTED, f"{kind or 'empty entity'} writes are not supported")

    def _table(self, p4info: P4Info, table_id: int) -> TableInfo:
        try:
            return p4info.table(int(table_id))
        except P4InfoError as e:
            raise StateError(_BAD_ID, str(e)) from None

    def _write_table_entry(self, p4info: P4Info, utype: int, pb: Any) -> None:
        types = p4runtime_pb2.Update
        t = self._table(p4info, pb.table_id)
        if pb.is_default_action:
            if utype != types.MODIFY:
                raise StateError(_INVALID, f"table {t.name}: the default entry can only be modified")
            if len(pb.match) or pb.priority:
                raise StateError(_INVALID, f"table {t.name}: a default entry has no match and no priority")
            if pb.HasField("action"):
                call = self._table_action(p4info, t, pb)
                self.state.set_default_action(t.name, call.action, call.params)
            else:
                self.state.reset_default_action(t.name)
            return
        match = _decode_match(t, pb)
        priority = int(pb.priority)
        if t.needs_priority and priority <= 0:
            raise StateError(_INVALID, f"table {t.name} has ternary/range/optional keys: priority must be > 0")
        if not t.needs_priority and priority != 0:
            raise StateError(_INVALID, f"table {t.name} has no ternary/range/optional key: priority must be 0")
        if utype == types.DELETE:
            self.state.delete_entry(t.name, match, priority)
            return
        if not pb.HasField("action"):
            raise StateError(_INVALID, f"table {t.name}: an action is required")
        entry = codec.table_entry_of(pb, match, self._table_action(p4info, t, pb))
        if utype == types.INSERT:
            self.state.insert_entry(t.name, entry)
        elif utype == types.MODIFY:
            self.state.modify_entry(t.name, entry)
        else:
            raise StateError(_INVALID, f"unknown update type {utype}")

    @staticmethod
    def _table_action(p4info: P4Info, t: TableInfo, pb: Any) -> ActionCall:
        which = pb.action.WhichOneof("type")
        if which != "action":
            raise StateError(_UNIMPLEMENTED, f"table {t.name}: {which or 'empty'} actions are not supported "
                                             "(no action profiles)")
        return _decode_action(p4info, pb.action.action)

    def _write_pre(self, utype: int, pb: Any) -> None:
        types = p4runtime_pb2.Update
        which = pb.WhichOneof("type")
        if which != "multicast_group_entry":
            raise StateError(_UNIMPLEMENTED, f"{which or 'empty'} PRE entries are not supported")
        try:
            gid, replicas = codec.decode_multicast_group(pb)
        except CodecError as e:
            raise StateError(_INVALID, str(e)) from None
        if utype == types.DELETE:
            self.state.delete_group(gid)
            return
        if utype == types.INSERT:
            self.state.insert_group(gid, replicas)
        else:
            self.state.modify_group(gid, replicas)

    def _write_digest(self, p4info: P4Info, utype: int, pb: Any) -> None:
        types = p4runtime_pb2.Update
        try:
            info, config = codec.decode_digest_entry(p4info, pb)
        except P4InfoError as e:
            raise StateError(_NOT_FOUND, str(e)) from None
        if utype == types.DELETE:
            self.state.remove_digest(info.name)
            return
        self.state.configure_digest(info.name, config, insert=utype == types.INSERT)

    def _write_counter(self, p4info: P4Info, utype: int, pb: Any) -> None:
        try:
            info, index, data = codec.decode_counter_entry(p4info, pb)
        except P4InfoError as e:
            raise StateError(_BAD_ID, str(e)) from None
        name = info.name
        types = p4runtime_pb2.Update
        if utype not in (types.MODIFY, types.DELETE):
            raise StateError(_INVALID, f"counter {name}: INSERT update type not supported for counters")
        if index is None:
            raise StateError(_UNIMPLEMENTED, f"counter {name}: wildcard write is not supported for indirect counters")
        # As PI, DELETE resets the cell to zero.
        self.state.counter_write(name, index, CounterValue(0, 0) if utype == types.DELETE else data)

    def _write_direct_counter(self, p4info: P4Info, utype: int, pb: Any) -> None:
        if utype != p4runtime_pb2.Update.MODIFY:
            raise StateError(_INVALID, "only MODIFY is allowed on direct counter entries")
        t = self._table(p4info, pb.table_entry.table_id)
        entry = self.state.get_entry(t.name, _decode_match(t, pb.table_entry), int(pb.table_entry.priority))
        if entry is None:
            raise StateError(_NOT_FOUND, f"no such entry in table {t.name}")
        value = codec.decode_counter_data(pb.data)
        entry.packets, entry.bytes = value.packets, value.bytes

    # --- Read ------------------------------------------------------------------------------------

    def Read(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        """Stream the entities matching each (possibly wildcard) entity of the request."""
        self._check_device(request.device_id, context)
        p4info = self._p4info(context)
        response = p4runtime_pb2.ReadResponse()
        try:
            for entity in request.entities:
                for out in self._read(p4info, entity):
                    response.entities.append(out)
        except StateError as e:
            context.abort(e.code, e.message)
        yield response

    def _read(self, p4info: P4Info, entity: Any) -> Iterable[Any]:
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            return self._read_table_entries(p4info, entity.table_entry)
        if kind == "counter_entry":
            return self._read_counters(p4info, entity.counter_entry)
        if kind == "direct_counter_entry":
            return self._read_direct_counters(p4info, entity.direct_counter_entry)
        if kind == "packet_replication_engine_entry":
            return self._read_groups(entity.packet_replication_engine_entry)
        if kind == "digest_entry":
            return self._read_digests(p4info, entity.digest_entry)
        if kind in ("register_entry", "meter_entry", "direct_meter_entry"):
            raise StateError(_UNIMPLEMENTED, f"{kind} reads are not supported (as in BMv2's P4Runtime server)")
        raise StateError(_UNIMPLEMENTED, f"{kind or 'empty entity'} reads are not supported")

    def _entry_pb(self, p4info: P4Info, t: TableInfo, entry: TableEntry, with_counter: bool) -> Any:
        out = p4runtime_pb2.Entity()
        codec.encode_table_entry(p4info, t, entry, out.table_entry, with_counter=with_counter)
        return out

    def _read_table_entries(self, p4info: P4Info, pb: Any) -> list[Any]:
        tables = [self._table(p4info, pb.table_id)] if pb.table_id else p4info.tables
        with_counter = pb.HasField("counter_data")
        out: list[Any] = []
        for t in tables:
            if pb.is_default_action:
                e = p4runtime_pb2.Entity()
                counter = self.state.default_counter(t.name) if with_counter and t.direct_resource_ids else None
                codec.encode_default_entry(p4info, t, self.state.default_action(t.name), e.table_entry, counter)
                out.append(e)
                continue
            if len(pb.match):
                entry = self.state.get_entry(t.name, _decode_match(t, pb, require_exact=False), int(pb.priority))
                entries = [entry] if entry is not None else []
            else:
                entries = self.state.entries(t.name)
            out.extend(self._entry_pb(p4info, t, e, with_counter) for e in entries)
        return out

    def _read_counters(self, p4info: P4Info, pb: Any) -> list[Any]:
        if pb.counter_id:
            try:
                counters = [p4info.counter(int(pb.counter_id))]
            except P4InfoError as e:
                raise StateError(_BAD_ID, str(e)) from None
        else:
            counters = p4info.counters
        out: list[Any] = []
        for c in counters:
            if pb.HasField("index"):
                cells = [(int(pb.index.index), self.state.counter_read(c.name, int(pb.index.index)))]
            else:
                cells = list(enumerate(self.state.counter_values(c.name)))
            for index, value in cells:
                ent = p4runtime_pb2.Entity()
                codec.encode_counter_entry(c, index, value, ent.counter_entry)
                out.append(ent)
        return out

    def _read_direct_counters(self, p4info: P4Info, pb: Any) -> list[Any]:
        te = pb.table_entry
        tables = [self._table(p4info, te.table_id)] if te.table_id else p4info.tables
        out: list[Any] = []
        for t in tables:
            if not t.direct_resource_ids:
                if te.table_id:
                    raise StateError(_INVALID, f"table {t.name} has no direct counter")
                continue
            if len(te.match):
                entry = self.state.get_entry(t.name, _decode_match(t, te, require_exact=False), int(te.priority))
                entries = [entry] if entry is not None else []
            else:
                entries = self.state.entries(t.name)
            for entry in entries:
                e = p4runtime_pb2.Entity()
                d = e.direct_counter_entry
                codec.encode_entry_key(t, entry.match, entry.priority, d.table_entry)
                codec.encode_counter_data(CounterValue(entry.packets, entry.bytes), d.data)
                out.append(e)
        return out

    def _read_groups(self, pb: Any) -> list[Any]:
        if pb.WhichOneof("type") != "multicast_group_entry":
            raise StateError(_UNIMPLEMENTED, "only multicast group entries can be read")
        gid = int(pb.multicast_group_entry.multicast_group_id)
        groups = self.state.multicast_groups()
        if gid:
            if gid not in groups:
                raise StateError(_NOT_FOUND, f"multicast group {gid} does not exist")
            groups = {gid: groups[gid]}
        out: list[Any] = []
        for group_id, replicas in sorted(groups.items()):
            e = p4runtime_pb2.Entity()
            codec.encode_multicast_group(group_id, replicas, e.packet_replication_engine_entry)
            out.append(e)
        return out

    def _read_digests(self, p4info: P4Info, pb: Any) -> list[Any]:
        configs = self.state.digest_configs()
        if pb.digest_id:
            try:
                name = p4info.digest(int(pb.digest_id)).name
            except P4InfoError as e:
                raise StateError(_NOT_FOUND, str(e)) from None
            if name not in configs:
                raise StateError(_NOT_FOUND, f"digest {name} is not configured")
            configs = {name: configs[name]}
        out: list[Any] = []
        for name, c in configs.items():
            ent = p4runtime_pb2.Entity()
            codec.encode_digest_entry(p4info.digest(name), c, ent.digest_entry)
            out.append(ent)
        return out

    # --- StreamChannel ---------------------------------------------------------------------------

    def StreamChannel(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        """Arbitration, digests, acks and packets for one controller."""
        stream = _Stream()
        with self.arbiter.lock:
            self.arbiter.streams.append(stream)
        reader = threading.Thread(target=self._read_stream, args=(request_iterator, stream),
                                  name="p4rt-stream-reader", daemon=True)
        reader.start()
        context.add_callback(lambda: stream.out.put(None))
        try:
            while True:
                msg = stream.out.get()
                if msg is None:
                    return
                if isinstance(msg, StateError):
                    context.abort(msg.code, msg.message)
                yield msg
        finally:
            self._leave(stream)

    def _read_stream(self, requests: Iterator[Any], stream: _Stream) -> None:
        try:
            for req in requests:
                kind = req.WhichOneof("update")
                if kind == "arbitration":
                    error = self._arbitrate(stream, req.arbitration)
                    if error is not None:
                        stream.out.put(error)
                        return
                elif stream.election_id is None:
                    stream.out.put(StateError(_INVALID, "the first stream message must be an arbitration update"))
                    return
                elif kind == "digest_ack":
                    self._digest_ack(req.digest_ack)
                elif kind == "packet":
                    self._packet_out(stream, req.packet)
        except grpc.RpcError:
            pass  # the client went away; the handler's finally does the cleanup
        except Exception:  # a bug must not leave the stream half open
            log.exception("P4Runtime stream reader failed")
        finally:
            stream.out.put(None)

    def _arbitrate(self, stream: _Stream, arb: Any) -> StateError | None:
        if arb.device_id != self.state.device_id:
            return StateError(_NOT_FOUND, f"unknown device id {arb.device_id} (this switch is {self.state.device_id})")
        if arb.HasField("role") and (arb.role.name or arb.role.id):
            return StateError(_UNIMPLEMENTED, "only the default role is supported")
        # An absent election id is 0, a valid id, as in PI.
        eid = _election(arb.election_id)
        with self.arbiter.lock:
            if any(s is not stream and s.election_id == eid for s in self.arbiter.streams):
                return StateError(_INVALID, f"Election id already exists ({eid})")
            old_master = self.arbiter.master()
            stream.election_id = eid
            new_master = self.arbiter.master()
            notify = list(self.arbiter.streams) if new_master is not old_master else [stream]
            if stream not in notify:
                notify.append(stream)
            for s in notify:
                s.out.put(self._arbitration_reply(s, new_master))
        return None

    def _arbitration_reply(self, stream: _Stream, master: _Stream | None) -> Any:
        resp = p4runtime_pb2.StreamMessageResponse()
        arb = resp.arbitration
        arb.device_id = self.state.device_id
        if master is not None and master.election_id is not None:
            _set_election(arb.election_id, master.election_id)
        if master is stream:
            arb.status.code = code_pb2.OK
            arb.status.message = "Is primary"
        elif master is not None:
            arb.status.code = code_pb2.ALREADY_EXISTS
            arb.status.message = "Is backup: a controller with a higher election id is primary"
        else:
            arb.status.code = code_pb2.NOT_FOUND
            arb.status.message = "is not master: no master connected"
        return resp

    def _leave(self, stream: _Stream) -> None:
        with self.arbiter.lock:
            if stream not in self.arbiter.streams:
                return
            old_master = self.arbiter.master()
            self.arbiter.streams.remove(stream)
            new_master = self.arbiter.master()
            if old_master is stream:
                for s in self.arbiter.streams:
                    if s.election_id is not None:
                        s.out.put(self._arbitration_reply(s, new_master))

    def _digest_ack(self, ack: Any) -> None:
        pipe = self.state.pipeline
        if pipe is None or not pipe.p4info.has("digest", int(ack.digest_id)):
            self.state.count("digest_ack_unknown")
            return
        if not self.state.ack_digest(pipe.p4info.digest(int(ack.digest_id)).name, int(ack.list_id)):
            self.state.count("digest_ack_unknown")

    def _packet_out(self, stream: _Stream, packet: Any) -> None:
        with self.arbiter.lock:
            is_master = self.arbiter.master() is stream
        pipe = self.state.pipeline
        handler = self.state.packet_out_handler
        if not is_master or pipe is None or handler is None:
            self.state.count("packet_out_dropped")
            return
        try:
            metadata = codec.decode_packet_metadata(pipe.p4info, "packet_out", packet.metadata)
        except CodecError:  # an id the P4Info does not define, or a value too wide: as PI, drop it
            self.state.count("packet_out_dropped")
            return
        handler(bytes(packet.payload), metadata)

    def _pump_loop(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self.state.next_messages(0.2)
            except Exception:  # keep delivering even if one message is bad
                log.exception("digest/packet-in pump failed")
                continue
            for msg in messages:
                self._deliver(msg)

    def _deliver(self, msg: DigestList | PacketIn) -> None:
        pipe = self.state.pipeline
        with self.arbiter.lock:
            master = self.arbiter.master()
        if master is None or pipe is None:
            self.state.count("digest_dropped_no_master" if isinstance(msg, DigestList) else "packet_in_dropped")
            return
        resp = p4runtime_pb2.StreamMessageResponse()
        if isinstance(msg, DigestList):
            codec.encode_digest_list(pipe.p4info.digest(msg.digest), msg.list_id, msg.data, msg.timestamp_ns,
                                     resp.digest)
        else:
            resp.packet.payload = msg.payload
            # Fields the P4Info's packet_in header does not have are not sent (the pipeline's business).
            header = codec.packet_header(pipe.p4info, "packet_in")
            known = {name for _, name, _ in header.metadata} if header else set()
            codec.encode_packet_metadata(pipe.p4info, "packet_in",
                                         {k: v for k, v in msg.metadata.items() if k in known}, resp.packet.metadata)
        master.out.put(resp)


class P4RuntimeServer:
    """A gRPC server running :class:`P4RuntimeService` for one switch state."""

    def __init__(self, state: SwitchState, address: str = "127.0.0.1:9559", max_workers: int = 32) -> None:
        self.state = state
        self.address = address
        self.service = P4RuntimeService(state)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="p4rt"),
                                   options=[("grpc.max_receive_message_length", 256 << 20),
                                            ("grpc.max_send_message_length", 256 << 20),
                                            ("grpc.so_reuseport", 0)])
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(self.service, self._server)
        self.port = int(self._server.add_insecure_port(address))
        if self.port == 0:
            raise OSError(f"cannot listen on {address} (address in use?)")

    def start(self) -> P4RuntimeServer:
        """Start serving; returns self."""
        self._server.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving (cancelling open RPCs after ``grace`` seconds) and end the streams.

        The listener goes first so a client that sees its stream end cannot reconnect to a
        server that is about to disappear.
        """
        self._server.stop(grace).wait()
        self.service.close()

    def wait(self) -> None:
        """Block until the server stops."""
        self._server.wait_for_termination()

