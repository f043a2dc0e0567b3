"""P4Runtime 1.4 gRPC server of the reference switch model, answering as BMv2's PI server does.

Serves ``p4.v1.P4Runtime`` over a :class:`~switchmodel.state.SwitchState`: pipeline config,
table entries (exact/lpm/ternary/range/optional, default entries, direct counters),
multicast groups, indexed counters (read, MODIFY to set), digest config and delivery with
acks, PacketIn/PacketOut, and primary arbitration on the stream. Errors use P4Runtime's
codes; a batched Write that fails answers UNKNOWN with one ``p4.v1.Error`` per update in
the status details (``grpc-status-details-bin``), as PI does, so p4runtime-shell and our
driver read them the same way from either target.  Every message is encoded and decoded by
:mod:`kvpool.p4rt.codec`, the codec the controller's driver uses too.

Codes and the order of checks follow PI (p4lang/PI ``proto/frontend/src/device_mgr.cpp``,
``proto/server/pi_server.cpp``) over BMv2, not always the spec's wording; the conformance
probe (:mod:`switchmodel.conformance`) sends the same P4Info-generated calls to both
targets and compares every answer. As PI: an id missing from the P4Info is
INVALID_ARGUMENT ("Invalid P4 id"; digests: NOT_FOUND); an action outside its scope
(a ``DEFAULT_ONLY`` one in an entry, a ``TABLE_ONLY`` one as default) is
PERMISSION_DENIED; bytestrings of any length are accepted when the value fits; a table
without match fields takes no entries (the target refuses them: UNKNOWN), only its default
entry can be modified; a full table, an out-of-range counter index and anything else the
target itself refuses is UNKNOWN; a counter reports and a MODIFY writes only its unit's
value (a PACKETS counter reads 0 bytes; the other value is kept) and DELETE resets the
cell; a wildcard digest read is UNIMPLEMENTED; multicast group ids from 2^15 up are OUT_OF_RANGE; arbitration for
another device id is accepted (PI creates devices lazily; that device has no pipeline).

Stricter than PI, on purpose (``switchmodel/DIFFERENCES.md``): a Write or
SetForwardingPipelineConfig is taken only from the primary's stream, that is, it must
carry the primary's election id *and* arrive on the gRPC connection (peer) that holds the
primary's StreamChannel. PI checks the election id alone, so a client that never opened a
stream but copies the primary's id is accepted there, and with no stream open at all PI
accepts requests that carry no election id.

Left out (UNIMPLEMENTED), as far as BMv2 goes too: register and value-set entries,
ROLLBACK_ON_ERROR/DATAPLANE_ATOMIC batches. Also left out here: meters and action profiles
(the kvpool program has none: an id is checked against the P4Info first, as PI does),
clone sessions, named roles. RECONCILE_AND_COMMIT keeps the state (BMv2's fails with
counters in the program). Capabilities says "1.4.1" (PI says "1.3.0"); the device config
is stored without checking that it is BMv2 JSON; replicas are read back with
``egress_port`` even when written with ``port``. One concern, kept in one module over 800
lines: its checks run in PI's order, so a reader compares them with PI's source top to bottom.
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
from kvpool.p4rt.p4info import SCOPE_DEFAULT_ONLY, SCOPE_TABLE_ONLY, P4Info, P4InfoError, TableInfo
from switchmodel.state import DigestList, PacketIn, StateError, SwitchState

log = logging.getLogger(__name__)

API_VERSION = "1.4.1"

_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_NOT_FOUND = grpc.StatusCode.NOT_FOUND
# PI answers an id missing from the P4Info (table, action, match field, param, counter) with
# INVALID_ARGUMENT "Invalid P4 id"; only digest ids get NOT_FOUND. We answer the same.
_BAD_ID = grpc.StatusCode.INVALID_ARGUMENT
_UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED
_DENIED = grpc.StatusCode.PERMISSION_DENIED
_NO_PIPELINE = "No forwarding pipeline config set for this device"

#: grpc.StatusCode -> google.rpc.Code number.
_CODE_NUMBER = {c: int(c.value[0]) for c in grpc.StatusCode}

#: PI keeps multicast group ids from 2^15 up for its clone sessions (PreMcMgr::first_reserved_group_id).
FIRST_RESERVED_GROUP_ID = 1 << 15

_UPDATE = p4runtime_pb2.Update


def _election(eid: Any) -> int:
    return (int(eid.high) << 64) | int(eid.low)


def _set_election(msg: Any, value: int) -> None:
    msg.high = value >> 64
    msg.low = value & ((1 << 64) - 1)


#: Counter units (P4Info ``CounterSpec.Unit``) that count packets, and those that count bytes.
_COUNTS_PACKETS = ("PACKETS", "BOTH", "UNSPECIFIED")
_COUNTS_BYTES = ("BYTES", "BOTH", "UNSPECIFIED")


def _in_unit(unit: str, value: CounterValue) -> CounterValue:
    """What a read reports of a cell: PI sets only the counter's unit (a PACKETS counter reads 0 bytes)."""
    return CounterValue(value.packets if unit in _COUNTS_PACKETS else 0,
                        value.bytes if unit in _COUNTS_BYTES else 0)


def _merged(unit: str, written: CounterValue, current: CounterValue) -> CounterValue:
    """A counter MODIFY as PI does it over BMv2: the counter's unit is written, the other value stays."""
    return CounterValue(written.packets if unit in _COUNTS_PACKETS else current.packets,
                        written.bytes if unit in _COUNTS_BYTES else current.bytes)


def _direct_unit(p4info: P4Info, t: TableInfo) -> str:
    """Unit of the table's direct counter (BOTH when the P4Info names none)."""
    return next((d.unit for d in p4info.direct_counters if d.table_id == t.id), "BOTH")


def _invalid_id(kind: str, ident: int) -> StateError:
    return StateError(_BAD_ID, f"Invalid P4 id: {ident:#x} is not a {kind} of the P4Info")


# ---------------------------------------------------------------------------------------------
# Arbitration
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Stream:
    """One controller's StreamChannel: its gRPC peer, device, election id and outgoing queue."""

    peer: str
    out: queue.Queue[Any] = field(default_factory=queue.Queue)
    device_id: int | None = None  # set by the stream's first arbitration update, as PI does
    election_id: int | None = None


class _Arbiter:
    """Primary election per device id (default role only): the arbitrated stream with the highest id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.devices: dict[int, list[_Stream]] = {}

    def streams(self, device_id: int) -> list[_Stream]:
        """Arbitrated streams of a device (call with the lock held)."""
        return self.devices.get(device_id, [])

    def all_streams(self) -> list[_Stream]:
        """Every arbitrated stream (call with the lock held)."""
        return [s for streams in self.devices.values() for s in streams]

    def primary(self, device_id: int) -> _Stream | None:
        """The device's primary (call with the lock held)."""
        return max(self.streams(device_id), key=lambda s: s.election_id or 0, default=None)


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
            for s in self.arbiter.all_streams():
                s.out.put(None)
        self._pump.join(timeout=2)

    # --- helpers ---------------------------------------------------------------------------------

    def _check_primary(self, request: Any, context: grpc.ServicerContext) -> None:
        """PERMISSION_DENIED unless the request comes from the primary's stream of its device.

        The spec names the primary by election id; PI checks that alone. A unary call carries
        no stream, so the model also wants it on the gRPC connection (peer) that opened the
        primary's StreamChannel: a client that never opened one cannot borrow the primary's id.
        """
        role = getattr(request, "role", "")
        if role:
            context.abort(_DENIED, f"Not primary: there is no primary for role {role!r} (this switch "
                                   "supports the default role only)")
        with self.arbiter.lock:
            primary = self.arbiter.primary(int(request.device_id))
            primary_id, primary_peer = (primary.election_id, primary.peer) if primary else (None, "")
        if primary is None:
            context.abort(_DENIED, f"Not primary: no controller holds an arbitrated StreamChannel for device "
                                   f"{request.device_id} (open one and win arbitration first)")
        if _election(request.election_id) != primary_id:
            context.abort(_DENIED, f"Not primary: election id {_election(request.election_id)} is not the "
                                   "primary's")
        if context.peer() != primary_peer:
            context.abort(_DENIED, "Not primary: writes are taken only on the gRPC connection that holds the "
                                   "primary's StreamChannel")

    def _p4info(self, device_id: int, context: grpc.ServicerContext) -> P4Info:
        pipe = self.state.pipeline
        if pipe is None or device_id != self.state.device_id:
            # PI creates device state lazily, so another device id is a device without a pipeline.
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, _NO_PIPELINE if device_id == self.state.device_id
                          else f"{_NO_PIPELINE} (device {device_id}; this switch is device {self.state.device_id})")
            raise AssertionError("unreachable")
        return pipe.p4info

    # --- capabilities and pipeline ---------------------------------------------------------------

    def Capabilities(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Report the P4Runtime API version."""
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    def SetForwardingPipelineConfig(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Verify, save or commit a P4Info + device config (primary only)."""
        self._check_primary(request, context)
        if request.device_id != self.state.device_id:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"device {request.device_id}: this switch is device {self.state.device_id}")
        actions = p4runtime_pb2.SetForwardingPipelineConfigRequest
        action = request.action
        if action == actions.COMMIT:
            try:
                self.state.commit_saved()
            except StateError as e:
                context.abort(e.code, e.message)
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        if action == actions.UNSPECIFIED:
            context.abort(_INVALID, "Invalid SetForwardingPipeline action")
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
        self._p4info(int(request.device_id), context)
        pipe = self.state.pipeline
        assert pipe is not None
        types = p4runtime_pb2.GetForwardingPipelineConfigRequest
        rtype = request.response_type
        response = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        config = response.config
        if rtype not in (types.ALL, types.COOKIE_ONLY, types.P4INFO_AND_COOKIE, types.DEVICE_CONFIG_AND_COOKIE):
            context.abort(_INVALID, "Invalid response_type in GetForwardingPipelineConfigRequest")
        if pipe.cookie is not None:  # PI returns the cookie only when one was set
            config.cookie.cookie = pipe.cookie
        if rtype in (types.ALL, types.P4INFO_AND_COOKIE):
            config.p4info.CopyFrom(pipe.p4info.message)
        if rtype in (types.ALL, types.DEVICE_CONFIG_AND_COOKIE):
            config.p4_device_config = pipe.device_config
        return response

    # --- Write -----------------------------------------------------------------------------------

    def Write(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Apply a batch of updates (primary only); per-update errors go in the status details."""
        self._check_primary(request, context)
        p4info = self._p4info(int(request.device_id), context)
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            context.abort(_UNIMPLEMENTED, "Support for atomic write modes has not been implemented yet")
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
        # Each entity checks its ids before the update type, as PI does: the first failing
        # check decides the code.
        kind = update.entity.WhichOneof("entity")
        utype = int(update.type)
        entity = update.entity
        if kind == "table_entry":
            self._write_table_entry(p4info, utype, entity.table_entry)
        elif kind == "packet_replication_engine_entry":
            self._write_pre(utype, entity.packet_replication_engine_entry)
        elif kind == "digest_entry":
            self._write_digest(p4info, utype, entity.digest_entry)
        elif kind == "counter_entry":
            self._write_counter(p4info, utype, entity.counter_entry)
        elif kind == "direct_counter_entry":
            self._write_direct_counter(p4info, utype, entity.direct_counter_entry)
        elif kind == "meter_entry":
            self._check_extern_id(p4info, "meters", int(entity.meter_entry.meter_id), "meter")
            raise StateError(_UNIMPLEMENTED, "meter writes are not supported by the model")
        elif kind == "direct_meter_entry":
            te = self._direct_resource_entry(p4info, entity.direct_meter_entry, "DirectMeterEntry")
            raise StateError(_INVALID, f"Table has no direct meters ({te.name})")
        elif kind in ("action_profile_member", "action_profile_group"):
            self._check_extern_id(p4info, "action_profiles", int(getattr(entity, kind).action_profile_id),
                                  "action profile")
            raise StateError(_UNIMPLEMENTED, "action profiles are not supported by the model")
        elif kind in ("register_entry", "value_set_entry"):
            what = "Register" if kind == "register_entry" else "ValueSet"
            raise StateError(_UNIMPLEMENTED, f"{what} writes are not supported yet (as in BMv2's P4Runtime server)")
        elif kind == "extern_entry":
            raise StateError(_UNIMPLEMENTED, "No extern support yet")
        else:
            raise StateError(grpc.StatusCode.UNKNOWN, "Incorrect entity type")

    @staticmethod
    def _check_extern_id(p4info: P4Info, collection: str, ident: int, kind: str) -> None:
        """INVALID_ARGUMENT unless ``ident`` names one of the P4Info's ``collection`` (meters, ...)."""
        if not any(int(x.preamble.id) == ident for x in getattr(p4info.message, collection)):
            raise _invalid_id(kind, ident)

    def _table(self, p4info: P4Info, table_id: int) -> TableInfo:
        try:
            return p4info.table(int(table_id))
        except P4InfoError:
            raise _invalid_id("table", int(table_id)) from None

    # --- table entries (PI: table_insert / table_modify / table_delete) -----------------------------

    def _write_table_entry(self, p4info: P4Info, utype: int, pb: Any) -> None:
        t = self._table(p4info, pb.table_id)
        if pb.HasField("time_since_last_hit"):
            raise StateError(_INVALID, "has_time_since_last_hit must not be set in WriteRequest")
        if utype == _UPDATE.INSERT:
            self._insert_entry(p4info, t, pb)
        elif utype == _UPDATE.MODIFY:
            self._modify_entry(p4info, t, pb)
        elif utype == _UPDATE.DELETE:
            self._delete_entry(t, pb)
        elif utype == _UPDATE.UNSPECIFIED:
            raise StateError(_INVALID, "Update type is not set")
        else:
            raise StateError(_INVALID, "Invalid update type")

    def _insert_entry(self, p4info: P4Info, t: TableInfo, pb: Any) -> None:
        if pb.is_default_action:
            raise StateError(_INVALID, "Cannot use INSERT for default entry")
        if not pb.HasField("action"):
            raise StateError(_INVALID, "'action' field must be set")
        match, _ = self._match_key(t, pb)
        call = self._entry_action(p4info, t, pb)
        assert call is not None
        self._check_entry_extras(t, pb)
        self.state.insert_entry(t.name, codec.table_entry_of(pb, match, call))

    def _modify_entry(self, p4info: P4Info, t: TableInfo, pb: Any) -> None:
        match, _ = self._match_key(t, pb)
        call = self._entry_action(p4info, t, pb)
        if call is None and not pb.is_default_action:
            raise StateError(_INVALID, "'action' field must be set for non-default entries")
        self._check_entry_extras(t, pb)
        if pb.is_default_action:
            if call is None:
                self.state.reset_default_action(t.name)
            else:
                self.state.set_default_action(t.name, call.action, call.params)
            return
        assert call is not None
        self.state.modify_entry(t.name, codec.table_entry_of(pb, match, call))

    def _delete_entry(self, t: TableInfo, pb: Any) -> None:
        if pb.is_default_action:
            raise StateError(_INVALID, "Cannot use DELETE for default entry")
        match, priority = self._match_key(t, pb)
        self.state.delete_entry(t.name, match, priority)

    def _match_key(self, t: TableInfo, pb: Any) -> tuple[dict[str, FieldMatch], int]:
        """Match and priority of an entry, checked as PI's construct_match_key does (INVALID_ARGUMENT)."""
        if pb.is_default_action:
            if len(pb.match):
                raise StateError(_INVALID, f"table {t.name}: Non-empty key for default entry")
            if pb.priority:
                raise StateError(_INVALID, f"table {t.name}: Non-zero priority for default entry")
            return {}, 0
        if len(pb.match) > len(t.match_fields):
            raise StateError(_INVALID, f"table {t.name}: Too many fields in match key")
        try:
            match = codec.decode_match(t, pb.match)
        except (P4InfoError, CodecError) as e:
            raise StateError(_INVALID, str(e)) from None
        priority = int(pb.priority)
        if not t.needs_priority:
            if priority > 0:
                raise StateError(_INVALID, f"table {t.name}: Non-zero priority for non-ternary match")
            priority = 0  # PI keeps no priority for such tables: a negative one is dropped, not refused
        elif priority == 0:
            raise StateError(_INVALID, f"table {t.name}: Zero priority for ternary match")
        return match, priority

    def _entry_action(self, p4info: P4Info, t: TableInfo, pb: Any) -> ActionCall | None:
        """The entry's action, checked as PI's validate_action + construct_action_data; None if unset."""
        default = bool(pb.is_default_action)
        if default and t.const_default_action_id:
            raise StateError(_DENIED, f"Cannot set / reset default action for table {t.name} which has a const "
                                      "default action")
        if not pb.HasField("action"):
            return None
        which = pb.action.WhichOneof("type")
        if which != "action":
            raise StateError(_INVALID, f"Cannot provide indirect action for direct table {t.name}")
        action_id = int(pb.action.action.action_id)
        if not p4info.has("action", action_id):
            raise _invalid_id("action", action_id)
        scope = t.action_scope(action_id)
        name = p4info.action(action_id).name
        if scope is None:
            raise StateError(_INVALID, f"Invalid action for table: {name} is not an action of {t.name}")
        if scope == SCOPE_TABLE_ONLY and default:
            raise StateError(_DENIED, f"Cannot use TABLE_ONLY action {name} as default action of {t.name}")
        if scope == SCOPE_DEFAULT_ONLY and not default:
            raise StateError(_DENIED, f"Cannot use DEFAULT_ONLY action {name} in a table entry of {t.name}")
        try:
            return codec.decode_action(p4info, pb.action.action)
        except (P4InfoError, CodecError) as e:
            raise StateError(_INVALID, str(e)) from None

    @staticmethod
    def _check_entry_extras(t: TableInfo, pb: Any) -> None:
        """Direct resources and idle timeout of an entry, checked as PI does."""
        if pb.HasField("meter_config"):
            raise StateError(_INVALID, f"Table has no direct meters ({t.name})")
        if pb.HasField("counter_data") and not t.direct_resource_ids:
            raise StateError(_INVALID, f"Table has no direct counters ({t.name})")
        if pb.idle_timeout_ns < 0:
            raise StateError(_INVALID, "idle_timeout_ns must be a positive value")
        if pb.idle_timeout_ns > 0:  # no table of the model supports idle timeout
            raise StateError(_INVALID, "idle_timeout_ns must be set to 0 for tables which do not support "
                                       "idle timeout")

    # --- multicast groups (PI: pre_mc_write, PreMcMgr) ------------------------------------------------

    def _write_pre(self, utype: int, pb: Any) -> None:
        which = pb.WhichOneof("type")
        if which == "clone_session_entry":
            if not pb.clone_session_entry.session_id:
                raise StateError(_INVALID, "0 is not a valid session id")
            raise StateError(_UNIMPLEMENTED, "clone sessions are not supported by the model")
        if which != "multicast_group_entry":
            raise StateError(_INVALID, "Invalid PRE operation")
        gid = int(pb.multicast_group_entry.multicast_group_id)
        if gid == 0:
            raise StateError(_INVALID, "0 is not a valid group id")
        if gid >= FIRST_RESERVED_GROUP_ID:
            raise StateError(grpc.StatusCode.OUT_OF_RANGE, "Group id value is too high")
        if utype == _UPDATE.DELETE:
            self.state.delete_group(gid)
            return
        if utype not in (_UPDATE.INSERT, _UPDATE.MODIFY):
            raise StateError(_INVALID, "Update type is not set" if utype == _UPDATE.UNSPECIFIED
                             else "Invalid update type")
        groups = self.state.multicast_groups()
        if utype == _UPDATE.INSERT and gid in groups:
            raise StateError(grpc.StatusCode.ALREADY_EXISTS, "Multicast group already exists")
        if utype == _UPDATE.MODIFY and gid not in groups:
            raise StateError(_NOT_FOUND, "Multicast group does not exist")
        for r in pb.multicast_group_entry.replicas:
            kind = r.WhichOneof("port_kind")
            if kind is None:
                raise StateError(_INVALID, "Missing port in multicast group replica")
            if kind == "port" and not r.port:
                raise StateError(_INVALID, "Port must not be the empty string")
            if kind == "port" and len(r.port) > 4:
                raise StateError(_UNIMPLEMENTED, f"Got port of {len(r.port)} bytes, but only 4 bytes are supported")
        try:
            _, replicas = codec.decode_multicast_group(pb)
        except CodecError as e:
            raise StateError(_INVALID, str(e)) from None
        if len(set(replicas)) != len(replicas):
            raise StateError(_INVALID, "Duplicate replica in multicast group (the same port and rid twice)")
        if utype == _UPDATE.INSERT:
            self.state.insert_group(gid, replicas)
        else:
            self.state.modify_group(gid, replicas)

    # --- digests (PI: DigestMgr::config_write) -----------------------------------------------------

    def _write_digest(self, p4info: P4Info, utype: int, pb: Any) -> None:
        try:
            info, config = codec.decode_digest_entry(p4info, pb)
        except P4InfoError:
            raise StateError(_NOT_FOUND, f"{pb.digest_id} is not a valid digest id") from None
        if utype == _UPDATE.DELETE:
            self.state.remove_digest(info.name)
        elif utype in (_UPDATE.INSERT, _UPDATE.MODIFY):
            self.state.configure_digest(info.name, config, insert=utype == _UPDATE.INSERT)
        else:
            raise StateError(_INVALID, "Invalid update type for DigestEntry")

    # --- counters (PI: counter_write / direct_counter_write) ----------------------------------------

    def _write_counter(self, p4info: P4Info, utype: int, pb: Any) -> None:
        try:
            info, index, data = codec.decode_counter_entry(p4info, pb)
        except P4InfoError:
            raise _invalid_id("counter", int(pb.counter_id)) from None
        if index is None:
            raise StateError(_UNIMPLEMENTED, "Wildcard write is not supported for indirect counters yet")
        if index < 0:
            raise StateError(_INVALID, "A negative number is not a valid index value")
        if utype == _UPDATE.MODIFY:
            self.state.counter_write(info.name, index,
                                     _merged(info.unit, data, self.state.counter_read(info.name, index)))
        elif utype == _UPDATE.DELETE:  # as PI: DELETE resets the cell
            self.state.counter_write(info.name, index, CounterValue(0, 0))
        elif utype == _UPDATE.INSERT:
            raise StateError(_INVALID, "INSERT update type not supported for counters")
        else:
            raise StateError(_INVALID, "Update type is not set" if utype == _UPDATE.UNSPECIFIED
                             else "Invalid update type")

    def _direct_resource_entry(self, p4info: P4Info, pb: Any, what: str) -> TableInfo:
        """The table of a Direct{Counter,Meter}Entry whose entry exists (PI: entry_handle_from_table_entry)."""
        if not pb.HasField("table_entry"):
            raise StateError(_INVALID, f"Missing table_entry field in {what}")
        t = self._table(p4info, pb.table_entry.table_id)
        match, priority = self._match_key(t, pb.table_entry)
        if not pb.table_entry.is_default_action and self.state.get_entry(t.name, match, priority) is None:
            raise StateError(_INVALID, f"Cannot map table entry to handle (no such entry in {t.name})")
        return t

    def _write_direct_counter(self, p4info: P4Info, utype: int, pb: Any) -> None:
        t = self._direct_resource_entry(p4info, pb, "DirectCounterEntry")
        if not t.direct_resource_ids:
            raise StateError(_INVALID, f"Table has no direct counters ({t.name})")
        if utype not in (_UPDATE.MODIFY, _UPDATE.DELETE):
            raise StateError(_INVALID, "INSERT update type not supported for counters" if utype == _UPDATE.INSERT
                             else "Update type is not set")
        data = codec.decode_counter_data(pb.data) if utype == _UPDATE.MODIFY else CounterValue(0, 0)
        unit = _direct_unit(p4info, t) if utype == _UPDATE.MODIFY else "BOTH"
        te = pb.table_entry
        if te.is_default_action:
            current = self.state.default_counter(t.name)
            self.state.set_default_counter(t.name, _merged(unit, data, current))
            return
        match, priority = self._match_key(t, te)
        entry = self.state.get_entry(t.name, match, priority)
        assert entry is not None
        value = _merged(unit, data, CounterValue(entry.packets, entry.bytes))
        entry.packets, entry.bytes = value.packets, value.bytes

    # --- Read ------------------------------------------------------------------------------------

    def Read(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        """Stream the entities matching each (possibly wildcard) entity of the request."""
        p4info = self._p4info(int(request.device_id), context)
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
            return self._read_pre(entity.packet_replication_engine_entry)
        if kind == "digest_entry":
            return self._read_digests(p4info, entity.digest_entry)
        if kind == "meter_entry":
            meter_id = int(entity.meter_entry.meter_id)
            if meter_id:
                self._check_extern_id(p4info, "meters", meter_id, "meter")
                raise StateError(_UNIMPLEMENTED, "meter reads are not supported by the model")
            return []  # every meter of a program without meters
        if kind == "direct_meter_entry":
            pb = entity.direct_meter_entry
            if not pb.HasField("table_entry"):
                raise StateError(_INVALID, "Missing table_entry field in DirectMeterEntry")
            if not pb.table_entry.table_id:
                raise StateError(_UNIMPLEMENTED, "Reading all direct meters for ALL tables is not supported yet")
            t = self._table(p4info, pb.table_entry.table_id)
            raise StateError(_INVALID, f"Table has no direct meters ({t.name})")
        if kind in ("action_profile_member", "action_profile_group"):
            prof_id = int(getattr(entity, kind).action_profile_id)
            if prof_id:
                self._check_extern_id(p4info, "action_profiles", prof_id, "action profile")
                raise StateError(_UNIMPLEMENTED, "action profiles are not supported by the model")
            return []
        if kind in ("register_entry", "value_set_entry"):
            what = "Register" if kind == "register_entry" else "ValueSet"
            raise StateError(_UNIMPLEMENTED, f"{what} reads are not supported yet (as in BMv2's P4Runtime server)")
        raise StateError(grpc.StatusCode.UNKNOWN, "Incorrect entity type")

    def _entry_pb(self, p4info: P4Info, t: TableInfo, entry: TableEntry, with_counter: bool) -> Any:
        out = p4runtime_pb2.Entity()
        codec.encode_table_entry(p4info, t, entry, out.table_entry, with_counter=with_counter)
        if with_counter and t.direct_resource_ids:
            value = _in_unit(_direct_unit(p4info, t), CounterValue(entry.packets, entry.bytes))
            codec.encode_counter_data(value, out.table_entry.counter_data)
        return out

    def _read_table_entries(self, p4info: P4Info, pb: Any) -> list[Any]:
        tables = [self._table(p4info, pb.table_id)] if pb.table_id else p4info.tables
        with_counter = pb.HasField("counter_data")
        out: list[Any] = []
        for t in tables:
            if pb.is_default_action:
                if pb.HasField("time_since_last_hit"):
                    raise StateError(_INVALID, "Default table entries do not support entry ageing, do not set "
                                               "'time_since_last_hit' in your ReadRequest")
                e = p4runtime_pb2.Entity()
                counter = _in_unit(_direct_unit(p4info, t), self.state.default_counter(t.name)) \
                    if with_counter and t.direct_resource_ids else None
                codec.encode_default_entry(p4info, t, self.state.default_action(t.name), e.table_entry, counter)
                out.append(e)
                continue
            if pb.HasField("time_since_last_hit"):
                raise StateError(_INVALID, "Do not set time_since_last_hit for a ReadRequest if the table does "
                                           "not support idle timeout; yes, that includes wildcard reads")
            if len(pb.match):
                match, priority = self._match_key(t, pb)
                entry = self.state.get_entry(t.name, match, priority)
                entries = [entry] if entry is not None else []
            else:
                entries = self.state.entries(t.name)
            out.extend(self._entry_pb(p4info, t, e, with_counter) for e in entries)
        return out

    def _read_counters(self, p4info: P4Info, pb: Any) -> list[Any]:
        if pb.counter_id:
            try:
                counters = [p4info.counter(int(pb.counter_id))]
            except P4InfoError:
                raise _invalid_id("counter", int(pb.counter_id)) from None
        else:
            counters = p4info.counters
        out: list[Any] = []
        for c in counters:
            if pb.HasField("index"):
                index = int(pb.index.index)
                if index < 0:
                    raise StateError(_INVALID, "A negative number is not a valid index value")
                cells = [(index, self.state.counter_read(c.name, index))]
            else:
                cells = list(enumerate(self.state.counter_values(c.name)))
            for i, value in cells:
                ent = p4runtime_pb2.Entity()
                codec.encode_counter_entry(c, i, _in_unit(c.unit, value), ent.counter_entry)
                out.append(ent)
        return out

    def _read_direct_counters(self, p4info: P4Info, pb: Any) -> list[Any]:
        if not pb.HasField("table_entry"):
            raise StateError(_INVALID, "Missing table_entry field in DirectCounterEntry")
        te = pb.table_entry
        if not te.table_id:
            raise StateError(_UNIMPLEMENTED, "Reading all direct counters for ALL tables is not supported yet")
        t = self._table(p4info, te.table_id)
        if not t.direct_resource_ids:
            raise StateError(_INVALID, f"Table has no direct counters ({t.name})")
        unit = _direct_unit(p4info, t)
        out: list[Any] = []
        if len(te.match) or te.is_default_action:
            self._direct_resource_entry(p4info, pb, "DirectCounterEntry")
            if te.is_default_action:
                value = self.state.default_counter(t.name)
            else:
                match, priority = self._match_key(t, te)
                entry = self.state.get_entry(t.name, match, priority)
                assert entry is not None
                value = CounterValue(entry.packets, entry.bytes)
            e = p4runtime_pb2.Entity()
            e.direct_counter_entry.table_entry.CopyFrom(te)
            codec.encode_counter_data(_in_unit(unit, value), e.direct_counter_entry.data)
            return [e]
        for entry in self.state.entries(t.name):
            e = p4runtime_pb2.Entity()
            d = e.direct_counter_entry
            codec.encode_entry_key(t, entry.match, entry.priority, d.table_entry)
            codec.encode_counter_data(_in_unit(unit, CounterValue(entry.packets, entry.bytes)), d.data)
            out.append(e)
        return out

    def _read_pre(self, pb: Any) -> list[Any]:
        which = pb.WhichOneof("type")
        if which == "clone_session_entry":
            if pb.clone_session_entry.session_id:  # the model has none
                raise StateError(_NOT_FOUND, "Clone session id does not exist")
            return []
        if which != "multicast_group_entry":
            raise StateError(_INVALID, "Invalid PRE operation")
        gid = int(pb.multicast_group_entry.multicast_group_id)
        if gid >= FIRST_RESERVED_GROUP_ID:
            raise StateError(grpc.StatusCode.OUT_OF_RANGE, "Group id value is too high")
        groups = self.state.multicast_groups()
        if gid:
            if gid not in groups:
                raise StateError(_NOT_FOUND, "Multicast group does not exist")
            groups = {gid: groups[gid]}
        out: list[Any] = []
        for group_id, replicas in sorted(groups.items()):
            e = p4runtime_pb2.Entity()
            codec.encode_multicast_group(group_id, replicas, e.packet_replication_engine_entry)
            out.append(e)
        return out

    def _read_digests(self, p4info: P4Info, pb: Any) -> list[Any]:
        if not pb.digest_id:
            raise StateError(_UNIMPLEMENTED, "digest_id must be set when reading DigestEntry")
        try:
            name = p4info.digest(int(pb.digest_id)).name
        except P4InfoError:
            raise StateError(_NOT_FOUND, f"{pb.digest_id} is not a valid digest id") from None
        config = self.state.digest_configs().get(name)
        if config is None:
            raise StateError(_NOT_FOUND, f"Digest {pb.digest_id} not configured")
        ent = p4runtime_pb2.Entity()
        codec.encode_digest_entry(p4info.digest(name), config, ent.digest_entry)
        return [ent]

    # --- StreamChannel ---------------------------------------------------------------------------

    def StreamChannel(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        """Arbitration, digests, acks and packets for one controller."""
        stream = _Stream(peer=context.peer())
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
                    continue  # as PI: packets and acks before arbitration are ignored
                elif kind == "digest_ack":
                    self._digest_ack(stream, req.digest_ack)
                elif kind == "packet":
                    self._packet_out(stream, req.packet)
        except grpc.RpcError:
            pass  # the client went away; the handler's finally does the cleanup
        except Exception:  # a bug must not leave the stream half open
            log.exception("P4Runtime stream reader failed")
        finally:
            stream.out.put(None)

    def _arbitrate(self, stream: _Stream, arb: Any) -> StateError | None:
        """Join or update ``stream``'s arbitration as PI does; an error ends the stream."""
        device_id = int(arb.device_id)
        if arb.HasField("role") and (arb.role.name or arb.role.id):
            return StateError(_UNIMPLEMENTED, "only the default role is supported")
        if stream.device_id is not None and stream.device_id != device_id:
            return StateError(grpc.StatusCode.FAILED_PRECONDITION, "Invalid device id")
        # An absent election id is 0, a valid id, as in PI.
        eid = _election(arb.election_id)
        with self.arbiter.lock:
            if stream.election_id == eid:
                return None  # PI: the same id again changes nothing and is not answered
            streams = self.arbiter.devices.setdefault(device_id, [])
            if any(s is not stream and s.election_id == eid for s in streams):
                if stream in streams:
                    streams.remove(stream)
                    self._notify_after_leave(device_id, stream)
                return StateError(_INVALID, f"Election id already exists ({eid})")
            old_primary = self.arbiter.primary(device_id)
            stream.election_id = eid
            stream.device_id = device_id
            if stream not in streams:
                streams.append(stream)
            new_primary = self.arbiter.primary(device_id)
            # PI: a change of primary is told to every stream of the device, anything else
            # only to the stream that sent the update.
            notify = list(streams) if new_primary is not old_primary else [stream]
            for s in notify:
                s.out.put(self._arbitration_reply(device_id, s, new_primary))
        return None

    def _arbitration_reply(self, device_id: int, stream: _Stream, primary: _Stream | None) -> Any:
        resp = p4runtime_pb2.StreamMessageResponse()
        arb = resp.arbitration
        arb.device_id = device_id
        if primary is not None and primary.election_id is not None:
            _set_election(arb.election_id, primary.election_id)
        if primary is stream:
            arb.status.code = code_pb2.OK
            arb.status.message = "Is primary"
        else:
            arb.status.code = code_pb2.ALREADY_EXISTS
            arb.status.message = "Is backup"
        return resp

    def _notify_after_leave(self, device_id: int, left: _Stream) -> None:
        """Tell the remaining streams of a device who is primary now (call with the lock held)."""
        primary = self.arbiter.primary(device_id)
        for s in self.arbiter.streams(device_id):
            s.out.put(self._arbitration_reply(device_id, s, primary))

    def _leave(self, stream: _Stream) -> None:
        with self.arbiter.lock:
            if stream.device_id is None:
                return
            streams = self.arbiter.streams(stream.device_id)
            if stream not in streams:
                return
            was_primary = self.arbiter.primary(stream.device_id) is stream
            streams.remove(stream)
            if was_primary:
                self._notify_after_leave(stream.device_id, stream)

    def _is_primary(self, stream: _Stream) -> bool:
        with self.arbiter.lock:
            return stream.device_id is not None and self.arbiter.primary(stream.device_id) is stream

    def _digest_ack(self, stream: _Stream, ack: Any) -> None:
        pipe = self.state.pipeline
        if not self._is_primary(stream) or stream.device_id != self.state.device_id:
            return  # as PI: only the primary's stream messages are handled
        if pipe is None or not pipe.p4info.has("digest", int(ack.digest_id)):
            self.state.count("digest_ack_unknown")
            return
        if not self.state.ack_digest(pipe.p4info.digest(int(ack.digest_id)).name, int(ack.list_id)):
            self.state.count("digest_ack_unknown")

    def _packet_out(self, stream: _Stream, packet: Any) -> None:
        pipe = self.state.pipeline
        handler = self.state.packet_out_handler
        if not self._is_primary(stream) or stream.device_id != self.state.device_id or pipe is None \
                or handler is None:
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
            primary = self.arbiter.primary(self.state.device_id)
        if primary is None or pipe is None:
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
        primary.out.put(resp)


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

