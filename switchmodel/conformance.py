"""P4Runtime conformance probe: the same P4Info-generated calls to any target, every answer kept.

The model's server (:mod:`switchmodel.p4rt_server`) must answer P4Runtime as BMv2's PI
server does. This module generates, from a P4Info alone, a fixed sequence of calls that
touch every table, counter, digest and multicast group (inserts, duplicates, missing
entries, modifies, deletes, too-wide values, unknown ids, keyless tables, default entries)
and the arbitration rules (a backup, a client with no stream, a second device), sends it
to a target over gRPC, and records one answer per call: the gRPC status code (for a
batched Write, the code of each update), plus what a read returned, decoded with the
shared codec. Two targets agree when every answer is equal.

Every client opens its own connection (``grpc.use_local_subchannel_pool``), as separate
processes would, so "a client that never opened a stream" is a different gRPC peer from
the primary even inside one process.

``python -m switchmodel.conformance --target bmv2 --record tests/data/p4rt_conformance.bmv2.json``
records BMv2's answers (the golden file ``tests/test_p4rt_conformance.py`` compares the
model against when BMv2 is not installed); ``--target model`` prints the model's;
``--compare FILE`` prints the calls on which a target differs from a recorded file.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from kvpool import contract
from kvpool.p4rt import codec
from kvpool.p4rt.p4info import SCOPE_DEFAULT_ONLY, SCOPE_TABLE_ONLY, P4Info, TableInfo
from switchmodel.targets import TargetError, find_simple_switch_grpc, start_bmv2

#: Calls on which the model answers differently from BMv2 on purpose (switchmodel/DIFFERENCES.md):
#: probe name -> why. The conformance test fails on any other difference, and on a listed one
#: that no longer differs (so this list and DIFFERENCES.md cannot go stale).
KNOWN_DIFFERENCES: Mapping[str, str] = {
    "arbitration: Write with no stream open and no election id":
        "PI accepts requests without an election id while no stream is open (FAILED_PRECONDITION here "
        "only because no pipeline is set yet); the model takes writes only from the primary's stream",
    "arbitration: Write from a client with no stream, carrying the primary's election id":
        "PI identifies the primary by election id alone; the model also wants the primary's gRPC connection",
    "arbitration: Write on the backup's connection, carrying the primary's election id":
        "PI identifies the primary by election id alone; the model also wants the primary's gRPC connection",
    "pipeline: RECONCILE_AND_COMMIT with an entry in place":
        "PI replays counter cells as INSERTs, which counters refuse, so BMv2 fails the reconcile (UNKNOWN) "
        "and refuses later pushes; the model keeps the state the spec says a reconcile keeps",
}

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


# ---------------------------------------------------------------------------------------------
# Building entities from the P4Info
# ---------------------------------------------------------------------------------------------


def _update(utype: int, **entity: Any) -> Any:
    u = p4runtime_pb2.Update(type=utype)
    for kind, msg in entity.items():
        getattr(u.entity, kind).CopyFrom(msg)
    return u


def _fill_match(t: TableInfo, seed: int, out: Any) -> None:
    """A valid, distinct match for ``seed`` >= 1 on every key field (full-length lpm, full-mask ternary)."""
    for f in t.match_fields:
        value = codec.encode_int(seed % (1 << f.bitwidth) or 1, f.bitwidth)
        m = out.match.add(field_id=f.id)
        if f.match_type == "exact":
            m.exact.value = value
        elif f.match_type == "lpm":
            m.lpm.value, m.lpm.prefix_len = value, f.bitwidth
        elif f.match_type == "ternary":
            m.ternary.value, m.ternary.mask = value, codec.encode_int((1 << f.bitwidth) - 1, f.bitwidth)
        elif f.match_type == "range":
            m.range.low = m.range.high = value
        else:
            m.optional.value = value
    if t.needs_priority:
        out.priority = 10


def _actions_in_scope(p4info: P4Info, t: TableInfo, excluded_scope: str) -> list[int]:
    """Ids of the table's actions usable outside ``excluded_scope``, those with parameters first."""
    ids = [r.action_id for r in t.action_refs if r.scope != excluded_scope]
    return sorted(ids, key=lambda a: (not p4info.action(a).params, ids.index(a)))


def _fill_action(p4info: P4Info, action_id: int, value: int, out: Any) -> None:
    action = p4info.action(action_id)
    out.action_id = action.id
    for p in action.params:
        out.params.add(param_id=p.id, value=codec.encode_int(value % (1 << p.bitwidth), p.bitwidth))


def _entry(p4info: P4Info, t: TableInfo, seed: int, action_id: int | None, value: int = 1) -> Any:
    te = p4runtime_pb2.TableEntry(table_id=t.id)
    _fill_match(t, seed, te)
    if action_id is not None:
        _fill_action(p4info, action_id, value, te.action.action)
    return te


def _default(p4info: P4Info, t: TableInfo, action_id: int | None, value: int = 1) -> Any:
    te = p4runtime_pb2.TableEntry(table_id=t.id, is_default_action=True)
    if action_id is not None:
        _fill_action(p4info, action_id, value, te.action.action)
    return te


# ---------------------------------------------------------------------------------------------
# Reading answers back as text
# ---------------------------------------------------------------------------------------------


def _describe_entity(p4info: P4Info, e: Any) -> str:
    kind = e.WhichOneof("entity")
    if kind == "table_entry":
        te = e.table_entry
        _, entry = codec.decode_table_entry(p4info, te, require_exact=not te.is_default_action)
        params = ",".join(f"{k}={v:#x}" for k, v in sorted(entry.action.params.items()))
        where = "default" if te.is_default_action else "{" + codec.describe_match(
            {k: codec.match_value(m) for k, m in entry.match.items()}) + "}"
        prio = f" prio {entry.priority}" if entry.priority else ""
        return f"{where}{prio} -> {entry.action.action}({params})"
    if kind == "counter_entry":
        _, index, value = codec.decode_counter_entry(p4info, e.counter_entry)
        return f"[{index}]={value.packets}/{value.bytes}"
    if kind == "packet_replication_engine_entry":
        gid, replicas = codec.decode_multicast_group(e.packet_replication_engine_entry)
        return f"group {gid}: " + " ".join(f"{p}.{r}" for p, r in sorted(replicas))
    if kind == "digest_entry":
        info, config = codec.decode_digest_entry(p4info, e.digest_entry)
        return f"{info.name}: {config.max_timeout_ns}/{config.max_list_size}/{config.ack_timeout_ns}"
    return str(kind)


def _read_answer(p4info: P4Info, client: Client, *entities: Any, summary: bool = False) -> str:
    code, got = client.read(*entities)
    if code != "OK":
        return code
    if summary:  # many cells: count them and the non-zero ones
        texts = [_describe_entity(p4info, e) for e in got]
        nonzero = [t for t in texts if not t.endswith("=0/0")]
        return f"OK {len(texts)} entities, non-zero: {' '.join(nonzero) or 'none'}"
    return f"OK {len(got)}: " + "; ".join(sorted(_describe_entity(p4info, e) for e in got))


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------


Answers = list[tuple[str, str]]


@dataclass
class _Run:
    """The state of one probe run: the target's address, the P4Info, the clients, the answers."""

    address: str
    device_id: int
    p4info: P4Info
    device_config: bytes
    answers: Answers

    def ask(self, name: str, answer: str) -> None:
        if any(n == name for n, _ in self.answers):
            raise ValueError(f"probe name {name!r} used twice")
        self.answers.append((name, answer))

    def client(self, stream: bool = True) -> Client:
        return Client(self.address, self.device_id, stream)


def run_probe(address: str, p4info: P4Info, device_config: bytes, device_id: int = 1) -> Answers:
    """Send the whole call sequence to a fresh target (no pipeline, no controller) at ``address``."""
    run = _Run(address, device_id, p4info, device_config, [])
    primary = _arbitration(run)
    try:
        for t in p4info.tables:
            _table_probes(run, primary, t)
        _table_fill(run, primary)
        _counter_probes(run, primary)
        _digest_probes(run, primary)
        _multicast_probes(run, primary)
        _other_entity_probes(run, primary)
        _handover(run, primary)
    finally:
        primary.close()
    return run.answers


def probe_all(address: str, p4info_path: Path, device_config_path: Path, device_id: int = 1) -> Answers:
    """Everything, in the order a target survives: :func:`run_probe`, the shell probe, the reconcile.

    RECONCILE_AND_COMMIT goes last: BMv2 answers it UNKNOWN and then refuses every later
    pipeline push ("Error in first phase of device update").
    """
    p4info = P4Info.load(p4info_path)
    answers = run_probe(address, p4info, device_config_path.read_bytes(), device_id)
    answers += run_shell_probe(address, p4info_path, device_config_path, device_id)
    run = _Run(address, device_id, p4info, device_config_path.read_bytes(), answers)
    _reconcile(run)
    return run.answers


def _arbitration(run: _Run) -> Client:
    """Pipeline push and the arbitration rules; returns the primary's client (election id 10)."""
    p4info = run.p4info
    nobody = run.client(stream=False)
    counter_reset = _counter_reset(p4info)
    run.ask("capabilities", "OK" if nobody.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=10)
            .p4runtime_api_version else "no version")
    run.ask("read before any pipeline", nobody.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()))[0])
    try:
        nobody.stub.GetForwardingPipelineConfig(p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=run.device_id), timeout=10)
        got = "OK"
    except grpc.RpcError as e:
        got = str(e.code().name)
    run.ask("get pipeline before any pipeline", got)
    run.ask("arbitration: Write with no stream open and an election id",
            nobody.write([counter_reset], election=PRIMARY_ID))
    run.ask("arbitration: Write with no stream open and no election id", nobody.write([counter_reset], election=None))

    primary = run.client()
    primary.arbitrate(PRIMARY_ID)
    run.ask("arbitration: first controller", primary.arbitration_answer())
    run.ask("arbitration: primary writes before any pipeline", primary.write([counter_reset]))
    run.ask("pipeline: UNSPECIFIED action", primary.set_pipeline(_PIPE.UNSPECIFIED, p4info, run.device_config))
    run.ask("pipeline: VERIFY", primary.set_pipeline(_PIPE.VERIFY, p4info, run.device_config))
    run.ask("pipeline: VERIFY_AND_COMMIT", primary.set_pipeline(_PIPE.VERIFY_AND_COMMIT, p4info, run.device_config))
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest
    for rtype in ("COOKIE_ONLY", "P4INFO_AND_COOKIE", "ALL"):
        resp = primary.stub.GetForwardingPipelineConfig(get(device_id=run.device_id,
                                                            response_type=get.ResponseType.Value(rtype)), timeout=10)
        c = resp.config
        same = "same" if c.p4_device_config == run.device_config else "other"
        run.ask(f"pipeline: get {rtype}", f"OK cookie {c.cookie.cookie:#x}, {len(c.p4info.tables)} tables, "
                                          f"device config {same}")
    run.ask("arbitration: primary writes", primary.write([counter_reset]))

    backup = run.client()
    backup.arbitrate(BACKUP_ID)
    run.ask("arbitration: a lower election id joins as backup", backup.arbitration_answer())
    run.ask("arbitration: Write from the backup", backup.write([counter_reset]))
    run.ask("arbitration: SetForwardingPipelineConfig from the backup",
            backup.set_pipeline(_PIPE.VERIFY_AND_COMMIT, p4info, run.device_config))
    run.ask("arbitration: Write on the backup's connection, carrying the primary's election id",
            backup.write([counter_reset], election=PRIMARY_ID))
    run.ask("arbitration: backup reads", _read_answer(p4info, backup, _counter_cell(p4info, 0)))
    run.ask("arbitration: Write from a client with no stream, carrying the primary's election id",
            nobody.write([counter_reset], election=PRIMARY_ID))
    run.ask("arbitration: Write from a client with no stream and no election id",
            nobody.write([counter_reset], election=None))
    run.ask("arbitration: Write from a client with no stream and a made-up election id",
            nobody.write([counter_reset], election=PRIMARY_ID + 1))
    # The same id again is not answered (PI); a new id is: count the answers up to that one.
    backup.arbitrate(BACKUP_ID)
    backup.arbitrate(BACKUP_ID + 1)
    first = backup.arbitration_answer()
    run.ask("arbitration: backup repeats its id, then raises it below the primary's", first)
    duplicate = run.client()
    duplicate.arbitrate(PRIMARY_ID)
    run.ask("arbitration: a second stream with the primary's election id", duplicate.arbitration_answer())
    late = run.client()
    ack = p4runtime_pb2.StreamMessageRequest()
    ack.digest_ack.digest_id = p4info.digests[0].id if p4info.digests else 1
    late.send(ack)  # before any arbitration: PI ignores it and keeps the stream
    late.arbitrate(BACKUP_ID - 1)
    run.ask("arbitration: a stream whose first message is not an arbitration update", late.arbitration_answer())
    late.arbitrate(BACKUP_ID - 1, device_id=OTHER_DEVICE_ID)
    run.ask("arbitration: a stream moves to another device id", late.arbitration_answer())
    other = run.client()
    other.arbitrate(PRIMARY_ID, device_id=OTHER_DEVICE_ID)
    run.ask("arbitration: a controller for another device id", other.arbitration_answer())
    run.ask("arbitration: Write for another device id from its primary",
            other.write([counter_reset], device_id=OTHER_DEVICE_ID))
    code, _ = other.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()), device_id=OTHER_DEVICE_ID)
    run.ask("arbitration: Read for another device id", code)
    for c in (nobody, backup, duplicate, late, other):
        c.close()
    return primary


def _counter_cell(p4info: P4Info, index: int) -> Any:
    c = p4info.counters[0]
    return p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(counter_id=c.id,
                                                                          index=p4runtime_pb2.Index(index=index)))


def _counter_reset(p4info: P4Info) -> Any:
    """A write that changes nothing on a fresh switch (cell 0 of the first counter set to 0)."""
    cell = _counter_cell(p4info, 0).counter_entry
    cell.data.packet_count = cell.data.byte_count = 0
    return _update(MODIFY, counter_entry=cell)


def _table_probes(run: _Run, sw: Client, t: TableInfo) -> None:
    p4info = run.p4info
    name = t.name
    entry_actions = _actions_in_scope(p4info, t, SCOPE_DEFAULT_ONLY)
    default_actions = _actions_in_scope(p4info, t, SCOPE_TABLE_ONLY)
    every = p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=t.id))
    default_read = p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=t.id, is_default_action=True))

    def ask(what: str, answer: str) -> None:
        run.ask(f"table {name}: {what}", answer)

    ask("read all, empty", _read_answer(p4info, sw, every))
    ask("read the default entry", _read_answer(p4info, sw, default_read))
    act = entry_actions[0] if entry_actions else None
    if not t.match_fields:
        # A table without match fields: only its default entry exists and can be modified.
        ask("INSERT an entry (no match fields)", sw.write([_update(INSERT, table_entry=_entry(p4info, t, 1, act))]))
        ask("MODIFY an entry (no match fields)", sw.write([_update(MODIFY, table_entry=_entry(p4info, t, 1, act))]))
        ask("DELETE an entry (no match fields)", sw.write([_update(DELETE, table_entry=_entry(p4info, t, 1, None))]))
        ask("read all after the refused writes", _read_answer(p4info, sw, every))
    else:
        _keyed_table_probes(run, sw, t, act, every)
    _default_entry_probes(run, sw, t, default_actions, default_read)


def _keyed_table_probes(run: _Run, sw: Client, t: TableInfo, act: int | None, every: Any) -> None:
    p4info = run.p4info

    def ask(what: str, answer: str) -> None:
        run.ask(f"table {t.name}: {what}", answer)

    def insert(te: Any) -> str:
        return sw.write([_update(INSERT, table_entry=te)])

    e1 = _entry(p4info, t, 1, act)
    ask("INSERT", insert(e1))
    ask("INSERT the same match again", insert(e1))
    ask("read all", _read_answer(p4info, sw, every))
    ask("read one by its match", _read_answer(p4info, sw, p4runtime_pb2.Entity(table_entry=_entry(p4info, t, 1, None))))
    ask("read one that is not there", _read_answer(p4info, sw,
                                                    p4runtime_pb2.Entity(table_entry=_entry(p4info, t, 2, None))))
    ask("MODIFY", sw.write([_update(MODIFY, table_entry=_entry(p4info, t, 1, act, value=2))]))
    ask("read after MODIFY", _read_answer(p4info, sw, every))
    ask("MODIFY a missing entry", sw.write([_update(MODIFY, table_entry=_entry(p4info, t, 2, act))]))
    ask("DELETE a missing entry", sw.write([_update(DELETE, table_entry=_entry(p4info, t, 2, None))]))
    # Values: one bit too wide, or padded with zero bytes (accepted, as the spec's bytestrings allow).
    f0 = t.match_fields[0]
    wide = _entry(p4info, t, 3, act)
    _set_match_value(wide.match[0], codec.encode_int(1 << f0.bitwidth, f0.bitwidth + 1))
    ask(f"INSERT with {f0.name} one bit too wide", insert(wide))
    padded = _entry(p4info, t, 3, act)
    _set_match_value(padded.match[0], b"\x00\x00" + _match_value(padded.match[0]))
    ask(f"INSERT with {f0.name} padded with zero bytes", insert(padded))
    ask("read the padded entry back", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        table_entry=_entry(p4info, t, 3, None))))
    ask("DELETE the padded entry", sw.write([_update(DELETE, table_entry=_entry(p4info, t, 3, None))]))
    ask("INSERT with no action", insert(_entry(p4info, t, 4, None)))
    unknown_table = _entry(p4info, t, 4, act)
    unknown_table.table_id = (t.id & 0xFF000000) | 0xFFFFFF
    ask("INSERT into an unknown table id", insert(unknown_table))
    unknown_action = _entry(p4info, t, 4, act)
    unknown_action.action.action.action_id = (p4info.actions[0].id & 0xFF000000) | 0xFFFFFF
    ask("INSERT with an unknown action id", insert(unknown_action))
    foreign = [a.id for a in p4info.actions if t.action_scope(a.id) is None]
    if foreign:
        ask("INSERT with another table's action", insert(_entry(p4info, t, 4, foreign[0])))
    default_only = [r.action_id for r in t.action_refs if r.scope == SCOPE_DEFAULT_ONLY]
    if default_only:
        ask("INSERT with a DEFAULT_ONLY action", insert(_entry(p4info, t, 4, default_only[0])))
    if act is not None and p4info.action(act).params:
        p0 = p4info.action(act).params[0]
        too_wide = _entry(p4info, t, 4, act)
        too_wide.action.action.params[0].value = codec.encode_int(1 << p0.bitwidth, p0.bitwidth + 1)
        ask(f"INSERT with parameter {p0.name} one bit too wide", insert(too_wide))
        missing = _entry(p4info, t, 4, act)
        del missing.action.action.params[-1]
        ask("INSERT with a parameter missing", insert(missing))
        extra = _entry(p4info, t, 4, act)
        extra.action.action.params.add(param_id=0xFFFF, value=b"\x01")
        ask("INSERT with an unknown parameter id", insert(extra))
    unknown_field = _entry(p4info, t, 4, act)
    unknown_field.match[0].field_id = 0xFFFF
    ask("INSERT with an unknown match field id", insert(unknown_field))
    exact = [i for i, f in enumerate(t.match_fields) if f.match_type == "exact"]
    if exact:
        no_exact = _entry(p4info, t, 4, act)
        del no_exact.match[exact[0]]
        ask("INSERT with an exact field left out", insert(no_exact))
    wrong_kind = _entry(p4info, t, 4, act)
    value = _match_value(wrong_kind.match[0])
    wrong_kind.match[0].ClearField(wrong_kind.match[0].WhichOneof("field_match_type"))
    if f0.match_type == "exact":
        wrong_kind.match[0].lpm.value, wrong_kind.match[0].lpm.prefix_len = value, f0.bitwidth
    else:
        wrong_kind.match[0].exact.value = value
    ask(f"INSERT with {f0.name} as the wrong match kind", insert(wrong_kind))
    twice = _entry(p4info, t, 4, act)
    twice.match.add().CopyFrom(twice.match[0])
    ask("INSERT with a match field given twice", insert(twice))
    prio = _entry(p4info, t, 4, act)
    prio.priority = 0 if t.needs_priority else 7
    ask("INSERT with the wrong priority", insert(prio))
    lpm = [i for i, f in enumerate(t.match_fields) if f.match_type == "lpm"]
    if lpm:
        i, f = lpm[0], t.match_fields[lpm[0]]
        for what, plen, val in (("prefix length 0", 0, 0), ("prefix length above the width", f.bitwidth + 1, 1 << 4),
                                ("bits beyond the prefix", f.bitwidth - 8, 0xFF)):
            bad = _entry(p4info, t, 4, act)
            bad.match[i].lpm.prefix_len, bad.match[i].lpm.value = plen, codec.encode_int(val, f.bitwidth)
            ask(f"INSERT with an lpm {what}", insert(bad))
    counted = _entry(p4info, t, 4, act)
    counted.counter_data.packet_count = 1
    ask("INSERT with direct counter data", insert(counted))
    ttl = _entry(p4info, t, 4, act)
    ttl.idle_timeout_ns = 10**9
    ask("INSERT with an idle timeout", insert(ttl))
    since = _entry(p4info, t, 4, act)
    since.time_since_last_hit.elapsed_ns = 1
    ask("INSERT with time_since_last_hit", insert(since))
    unspecified = p4runtime_pb2.Update(type=p4runtime_pb2.Update.UNSPECIFIED)
    unspecified.entity.table_entry.CopyFrom(_entry(p4info, t, 4, act))
    ask("update type UNSPECIFIED", sw.write([unspecified]))
    bad_read = p4runtime_pb2.Entity(table_entry=_entry(p4info, t, 4, None))
    bad_read.table_entry.match[0].field_id = 0xFFFF
    ask("read with an unknown match field id", _read_answer(p4info, sw, bad_read))
    ask("read the direct counters", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        direct_counter_entry=p4runtime_pb2.DirectCounterEntry(table_entry=p4runtime_pb2.TableEntry(table_id=t.id)))))
    dc = p4runtime_pb2.DirectCounterEntry(table_entry=_entry(p4info, t, 1, None))
    ask("MODIFY the direct counter of an entry", sw.write([_update(MODIFY, direct_counter_entry=dc)]))
    ask("read all before DELETE", _read_answer(p4info, sw, every))
    ask("DELETE", sw.write([_update(DELETE, table_entry=_entry(p4info, t, 1, None))]))
    ask("DELETE again", sw.write([_update(DELETE, table_entry=_entry(p4info, t, 1, None))]))
    ask("read all, empty again", _read_answer(p4info, sw, every))


def _match_value(m: Any) -> bytes:
    kind = m.WhichOneof("field_match_type")
    return bytes(m.range.low if kind == "range" else getattr(m, kind).value)


def _set_match_value(m: Any, value: bytes) -> None:
    kind = m.WhichOneof("field_match_type")
    if kind == "range":
        m.range.low = m.range.high = value
    else:
        getattr(m, kind).value = value


def _default_entry_probes(run: _Run, sw: Client, t: TableInfo, default_actions: list[int],
                          default_read: Any) -> None:
    p4info = run.p4info

    def ask(what: str, answer: str) -> None:
        run.ask(f"table {t.name}: {what}", answer)

    act = default_actions[0] if default_actions else None
    ask("INSERT the default entry", sw.write([_update(INSERT, table_entry=_default(p4info, t, act))]))
    ask("DELETE the default entry", sw.write([_update(DELETE, table_entry=_default(p4info, t, None))]))
    with_match = _default(p4info, t, act)
    if t.match_fields:
        _fill_match(t, 1, with_match)
    with_match.priority = 3
    ask("MODIFY the default entry with a match or priority", sw.write([_update(MODIFY, table_entry=with_match)]))
    table_only = [r.action_id for r in t.action_refs if r.scope == SCOPE_TABLE_ONLY]
    if table_only:
        ask("MODIFY the default entry to a TABLE_ONLY action",
            sw.write([_update(MODIFY, table_entry=_default(p4info, t, table_only[0]))]))
    if act is not None:
        ask("MODIFY the default entry", sw.write([_update(MODIFY, table_entry=_default(p4info, t, act, value=3))]))
        ask("read the modified default entry", _read_answer(p4info, sw, default_read))
    ask("MODIFY the default entry with no action (reset)", sw.write([_update(MODIFY, table_entry=_default(p4info, t,
                                                                                                          None))]))
    ask("read the reset default entry", _read_answer(p4info, sw, default_read))


def _table_fill(run: _Run, sw: Client) -> None:
    """Fill the smallest table with exact keys one entry past its size, in one batch."""
    p4info = run.p4info
    tables = [t for t in p4info.tables if t.match_fields and 0 < t.size <= 256
              and all(f.match_type == "exact" and f.bitwidth >= 16 for f in t.match_fields)]
    if not tables:
        return
    t = min(tables, key=lambda x: x.size)
    act = _actions_in_scope(p4info, t, SCOPE_DEFAULT_ONLY)[0]
    seeds = range(1, t.size + 2)
    run.ask(f"table {t.name}: INSERT {t.size + 1} entries into a table of size {t.size}",
            sw.write([_update(INSERT, table_entry=_entry(p4info, t, s, act)) for s in seeds]))
    code, got = sw.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=t.id)))
    run.ask(f"table {t.name}: entries after filling it", f"{code} {len(got)}")
    run.ask(f"table {t.name}: DELETE them all",
            sw.write([_update(DELETE, table_entry=_entry(p4info, t, s, None)) for s in seeds[:len(got)]]))


def _counter_probes(run: _Run, sw: Client) -> None:
    p4info = run.p4info
    for c in p4info.counters:
        def cell(index: int | None, packets: int = 0, nbytes: int = 0, counter: Any = c) -> Any:
            ce = p4runtime_pb2.CounterEntry(counter_id=counter.id)
            if index is not None:
                ce.index.index = index
            ce.data.packet_count, ce.data.byte_count = packets, nbytes
            return ce

        def ask(what: str, answer: str, counter: Any = c) -> None:
            run.ask(f"counter {counter.name}: {what}", answer)

        ask("read all cells", _read_answer(p4info, sw, p4runtime_pb2.Entity(counter_entry=cell(None)), summary=True))
        ask("read cell 0", _read_answer(p4info, sw, p4runtime_pb2.Entity(counter_entry=cell(0))))
        ask("read the cell past the end", _read_answer(p4info, sw, p4runtime_pb2.Entity(counter_entry=cell(c.size))))
        ask("read cell -1", _read_answer(p4info, sw, p4runtime_pb2.Entity(counter_entry=cell(-1))))
        ask("MODIFY the last cell", sw.write([_update(MODIFY, counter_entry=cell(c.size - 1, 5, 100))]))
        ask("read the modified cell", _read_answer(p4info, sw, p4runtime_pb2.Entity(counter_entry=cell(c.size - 1))))
        ask("DELETE the modified cell", sw.write([_update(DELETE, counter_entry=cell(c.size - 1))]))
        ask("read the deleted cell", _read_answer(p4info, sw, p4runtime_pb2.Entity(counter_entry=cell(c.size - 1))))
        ask("MODIFY the cell past the end", sw.write([_update(MODIFY, counter_entry=cell(c.size))]))
        ask("MODIFY cell -1", sw.write([_update(MODIFY, counter_entry=cell(-1))]))
        ask("INSERT a cell", sw.write([_update(INSERT, counter_entry=cell(0))]))
        ask("MODIFY with no index", sw.write([_update(MODIFY, counter_entry=cell(None))]))
    every = p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry())
    run.ask("counters: read every cell of every counter", _read_answer(p4info, sw, every, summary=True))
    unknown = p4runtime_pb2.CounterEntry(counter_id=(p4info.counters[0].id & 0xFF000000) | 0xFFFFFF
                                         if p4info.counters else 0x12FFFFFF)
    run.ask("counters: read an unknown counter id", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        counter_entry=unknown)))
    unknown.index.index = 0
    run.ask("counters: MODIFY an unknown counter id", sw.write([_update(MODIFY, counter_entry=unknown)]))
    run.ask("counters: read direct counters of every table", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        direct_counter_entry=p4runtime_pb2.DirectCounterEntry(table_entry=p4runtime_pb2.TableEntry()))))
    run.ask("counters: read direct counters with no table entry", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        direct_counter_entry=p4runtime_pb2.DirectCounterEntry())))


def _digest_probes(run: _Run, sw: Client) -> None:
    p4info = run.p4info

    def entry(digest_id: int, list_size: int = 1) -> Any:
        d = p4runtime_pb2.DigestEntry(digest_id=digest_id)
        d.config.max_timeout_ns, d.config.max_list_size, d.config.ack_timeout_ns = 1_000_000, list_size, 10**9
        return d

    for d in p4info.digests:
        def ask(what: str, answer: str, digest: Any = d) -> None:
            run.ask(f"digest {digest.name}: {what}", answer)

        read = p4runtime_pb2.Entity(digest_entry=p4runtime_pb2.DigestEntry(digest_id=d.id))
        ask("read, not configured", _read_answer(p4info, sw, read))
        ask("MODIFY, not configured", sw.write([_update(MODIFY, digest_entry=entry(d.id))]))
        ask("DELETE, not configured", sw.write([_update(DELETE, digest_entry=entry(d.id))]))
        ask("INSERT", sw.write([_update(INSERT, digest_entry=entry(d.id))]))
        ask("INSERT again", sw.write([_update(INSERT, digest_entry=entry(d.id))]))
        ask("read", _read_answer(p4info, sw, read))
        ask("MODIFY", sw.write([_update(MODIFY, digest_entry=entry(d.id, list_size=4))]))
        ask("read after MODIFY", _read_answer(p4info, sw, read))
        unspecified = p4runtime_pb2.Update(type=p4runtime_pb2.Update.UNSPECIFIED)
        unspecified.entity.digest_entry.CopyFrom(entry(d.id))
        ask("update type UNSPECIFIED", sw.write([unspecified]))
        ask("DELETE", sw.write([_update(DELETE, digest_entry=entry(d.id))]))
        ask("read after DELETE", _read_answer(p4info, sw, read))
    unknown = 0x17FFFFFF
    run.ask("digests: INSERT an unknown digest id", sw.write([_update(INSERT, digest_entry=entry(unknown))]))
    run.ask("digests: read an unknown digest id", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        digest_entry=p4runtime_pb2.DigestEntry(digest_id=unknown))))
    run.ask("digests: read every digest (digest id 0)", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        digest_entry=p4runtime_pb2.DigestEntry())))


def _multicast_probes(run: _Run, sw: Client) -> None:
    p4info = run.p4info
    gid = contract.COALESCE_MCAST_GRP

    def group(group_id: int, *replicas: tuple[int, int]) -> Any:
        pre = p4runtime_pb2.PacketReplicationEngineEntry()
        codec.encode_multicast_group(group_id, replicas, pre)
        return pre

    def write(utype: int, pre: Any) -> str:
        return sw.write([_update(utype, packet_replication_engine_entry=pre)])

    def read(group_id: int) -> str:
        return _read_answer(p4info, sw, p4runtime_pb2.Entity(packet_replication_engine_entry=group(group_id)))

    def ask(what: str, answer: str) -> None:
        run.ask(f"multicast: {what}", answer)

    other = gid + 1
    ask("read every group, none yet", read(0))
    ask(f"INSERT group {gid}", write(INSERT, group(gid, (1, 0), (2, 0), (1, 1))))
    ask(f"INSERT group {gid} again", write(INSERT, group(gid, (3, 0))))
    ask(f"read group {gid}", read(gid))
    ask(f"MODIFY group {gid}", write(MODIFY, group(gid, (2, 5), (4, 0))))
    ask(f"read group {gid} after MODIFY", read(gid))
    ask(f"MODIFY missing group {other}", write(MODIFY, group(other, (1, 0))))
    ask(f"DELETE missing group {other}", write(DELETE, group(other)))
    ask(f"read missing group {other}", read(other))
    ask("INSERT group 0", write(INSERT, group(0, (1, 0))))
    ask("INSERT group 32768", write(INSERT, group(1 << 15, (1, 0))))
    ask("read group 32768", read(1 << 15))
    ask("INSERT a group listing a replica twice", write(INSERT, group(other, (1, 0), (1, 0))))
    no_port = group(other)
    no_port.multicast_group_entry.replicas.add(instance=1)
    ask("INSERT a replica with no port", write(INSERT, no_port))
    as_bytes = group(other)
    as_bytes.multicast_group_entry.replicas.add(port=b"\x03", instance=2)
    ask("INSERT a replica given as a port bytestring", write(INSERT, as_bytes))
    ask("read the bytestring-port group", read(other))
    ask("read every group", read(0))
    ask(f"DELETE group {other}", write(DELETE, group(other)))
    ask("INSERT an empty group", write(INSERT, group(other)))
    ask("read the empty group", read(other))
    ask(f"DELETE group {gid} and the empty group",
        sw.write([_update(DELETE, packet_replication_engine_entry=group(g)) for g in (gid, other)]))
    ask("read every group, none left", read(0))
    unspecified = p4runtime_pb2.Update(type=p4runtime_pb2.Update.UNSPECIFIED)
    unspecified.entity.packet_replication_engine_entry.CopyFrom(group(gid, (1, 0)))
    ask("update type UNSPECIFIED", sw.write([unspecified]))
    ask("an empty PRE entity", write(INSERT, p4runtime_pb2.PacketReplicationEngineEntry()))
    clones = p4runtime_pb2.PacketReplicationEngineEntry()
    clones.clone_session_entry.session_id = 0
    ask("read every clone session", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        packet_replication_engine_entry=clones)))


def _other_entity_probes(run: _Run, sw: Client) -> None:
    p4info = run.p4info

    def ask(what: str, answer: str) -> None:
        run.ask(f"entities: {what}", answer)

    ask("Write a register entry", sw.write([_update(MODIFY, register_entry=p4runtime_pb2.RegisterEntry(
        register_id=p4info.registers[0].id if p4info.registers else 0x16FFFFFF))]))
    ask("read every register entry", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        register_entry=p4runtime_pb2.RegisterEntry())))
    ask("Write an unknown meter id", sw.write([_update(MODIFY, meter_entry=p4runtime_pb2.MeterEntry(
        meter_id=0x14FFFFFF, index=p4runtime_pb2.Index(index=0)))]))
    ask("read every meter", _read_answer(p4info, sw, p4runtime_pb2.Entity(meter_entry=p4runtime_pb2.MeterEntry())))
    ask("read an unknown meter id", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        meter_entry=p4runtime_pb2.MeterEntry(meter_id=0x14FFFFFF))))
    ask("Write an unknown action profile member", sw.write([_update(INSERT, action_profile_member=(
        p4runtime_pb2.ActionProfileMember(action_profile_id=0x11FFFFFF, member_id=1)))]))
    ask("read every action profile member", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        action_profile_member=p4runtime_pb2.ActionProfileMember())))
    ask("Write a direct meter entry with no table entry", sw.write([_update(
        MODIFY, direct_meter_entry=p4runtime_pb2.DirectMeterEntry())]))
    ask("Write an empty entity", sw.write([p4runtime_pb2.Update(type=INSERT)]))
    ask("read an empty entity", _read_answer(p4info, sw, p4runtime_pb2.Entity()))
    ask("read every table entry of every table", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        table_entry=p4runtime_pb2.TableEntry())))
    ask("read every default entry", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        table_entry=p4runtime_pb2.TableEntry(is_default_action=True))))
    ask("read an unknown table id", _read_answer(p4info, sw, p4runtime_pb2.Entity(
        table_entry=p4runtime_pb2.TableEntry(table_id=0x02FFFFFF))))
    ask("an empty Write", sw.write([]))
    ask("a ROLLBACK_ON_ERROR Write", sw.write([_counter_reset(p4info)],
                                              atomicity=p4runtime_pb2.WriteRequest.ROLLBACK_ON_ERROR))
    keyed = [t for t in p4info.tables if t.match_fields]
    if keyed:
        t = keyed[0]
        act = _actions_in_scope(p4info, t, SCOPE_DEFAULT_ONLY)[0]
        batch = [_update(INSERT, table_entry=_entry(p4info, t, 5, act)),
                 _update(INSERT, table_entry=_entry(p4info, t, 5, act)),
                 _update(DELETE, table_entry=_entry(p4info, t, 6, None)),
                 _update(INSERT, table_entry=_entry(p4info, t, 6, act)),
                 _update(DELETE, table_entry=_entry(p4info, t, 5, None)),
                 _update(DELETE, table_entry=_entry(p4info, t, 6, None))]
        ask(f"a batch of good and bad updates on {t.name}", sw.write(batch))


def _handover(run: _Run, primary: Client) -> None:
    """The primary leaves while a backup waits: the backup is told it is primary now, and writes."""
    backup = run.client()
    backup.arbitrate(BACKUP_ID)
    run.ask("handover: a backup joins", backup.arbitration_answer())
    primary.close()
    run.ask("handover: the primary leaves, the backup is told", backup.arbitration_answer())
    run.ask("handover: the promoted backup writes", backup.write([_counter_reset(run.p4info)]))
    run.ask("handover: the promoted backup reads the pipeline's cookie", _cookie(backup))
    backup.close()


def _reconcile(run: _Run) -> None:
    """RECONCILE_AND_COMMIT with an entry in place, last: it may leave a target half updated."""
    p4info = run.p4info
    keyed = [t for t in p4info.tables if t.match_fields]
    owner = run.client()
    owner.arbitrate(PRIMARY_ID + 5)  # above every id of the earlier steps, in case one lingers
    owner.arbitration_answer()
    try:
        if keyed:
            t = keyed[0]
            act = _actions_in_scope(p4info, t, SCOPE_DEFAULT_ONLY)[0]
            owner.write([_update(INSERT, table_entry=_entry(p4info, t, 7, act))])
        run.ask("pipeline: RECONCILE_AND_COMMIT with an entry in place",
                owner.set_pipeline(_PIPE.RECONCILE_AND_COMMIT, p4info, run.device_config))
        if keyed:
            code, got = owner.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=keyed[0].id)))
            run.ask("pipeline: entries after RECONCILE_AND_COMMIT", f"{code} {len(got)}")
    finally:
        owner.close()


def _cookie(client: Client) -> str:
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest
    try:
        resp = client.stub.GetForwardingPipelineConfig(get(device_id=client.device_id, response_type=get.COOKIE_ONLY),
                                                       timeout=10)
    except grpc.RpcError as e:
        return str(e.code().name)
    return f"OK cookie {resp.config.cookie.cookie:#x}"


# ---------------------------------------------------------------------------------------------
# The same kind of calls through p4runtime-shell, as a reviewer drives a switch
# ---------------------------------------------------------------------------------------------


def _shell_value(f: Any, seed: int) -> str:
    value = seed % (1 << f.bitwidth) or 1
    if f.match_type == "lpm":
        return f"{value}/{f.bitwidth}"
    if f.match_type == "ternary":
        return f"{value}&&&{(1 << f.bitwidth) - 1}"
    if f.match_type == "range":
        return f"{value}..{value}"
    return str(value)


def run_shell_probe(address: str, p4info_path: Path, device_config_path: Path, device_id: int = 1) -> Answers:
    """Insert, read, modify and delete through p4runtime-shell on every table, group and digest.

    The shell pushes the pipeline itself (clearing the target), so this runs after
    :func:`run_probe` on the same target. Answers are the codes the shell reports.
    """
    from p4runtime_sh import shell as sh

    probe = _ShellProbe(sh, P4Info.load(p4info_path))
    sh.setup(device_id=device_id, grpc_addr=address, election_id=(0, PRIMARY_ID),
             config=sh.FwdPipeConfig(str(p4info_path), str(device_config_path)), verbose=False)
    try:
        for t in probe.p4info.tables:
            probe.table(t)
        for c in probe.p4info.counters[:2]:
            probe.attempt(f"{c.name}: read every cell", lambda: len(list(sh.CounterEntry(c.name).read())))  # noqa: B023
        probe.multicast(contract.COALESCE_MCAST_GRP)
        for d in probe.p4info.digests:
            probe.digest(d.name)
    finally:
        sh.teardown()
    return probe.answers


class _ShellProbe:
    """Calls made through p4runtime-shell's entity API, answers as the codes it reports."""

    def __init__(self, sh: Any, p4info: P4Info) -> None:
        self.sh = sh
        self.p4info = p4info
        self.answers: Answers = []

    def attempt(self, name: str, call: Callable[[], Any]) -> None:
        from p4runtime_sh.p4runtime import P4RuntimeException, P4RuntimeWriteException
        from p4runtime_sh.utils import UserError

        try:
            got = call()
            answer = "OK" if got is None else f"OK {got}"
        except P4RuntimeWriteException as e:
            answer = _squeeze([_code_name(err.canonical_code) for _, err in e.errors])
        except P4RuntimeException as e:
            answer = str(e.grpc_error.code().name)
        except UserError as e:
            answer = f"refused by the shell: {str(e).splitlines()[0]}"
        self.answers.append((f"shell: {name}", answer))

    def _entry(self, t: TableInfo, seed: int, value: int = 1) -> Any:
        acts = _actions_in_scope(self.p4info, t, SCOPE_DEFAULT_ONLY)
        action = self.p4info.action(acts[0]) if acts else None
        te = self.sh.TableEntry(t.name)(action=action.name) if action else self.sh.TableEntry(t.name)
        for f in t.match_fields:
            te.match[f.name] = _shell_value(f, seed)
        if action is not None:
            for prm in action.params:
                te.action[prm.name] = str(value % (1 << prm.bitwidth))
        if t.needs_priority:
            te.priority = 10
        return te

    def _set_default(self, t: TableInfo, action_id: int) -> None:
        action = self.p4info.action(action_id)
        te = self.sh.TableEntry(t.name)(action=action.name, is_default=True)
        for prm in action.params:
            te.action[prm.name] = "1"
        te.modify()

    def table(self, t: TableInfo) -> None:
        sh, n = self.sh, t.name
        self.attempt(f"{n}: INSERT", lambda: self._entry(t, 1).insert())
        self.attempt(f"{n}: INSERT again", lambda: self._entry(t, 1).insert())
        self.attempt(f"{n}: read", lambda: len(list(sh.TableEntry(n).read())))
        self.attempt(f"{n}: MODIFY", lambda: self._entry(t, 1, value=2).modify())
        self.attempt(f"{n}: MODIFY a missing entry", lambda: self._entry(t, 2).modify())
        self.attempt(f"{n}: DELETE", lambda: self._entry(t, 1).delete())
        self.attempt(f"{n}: DELETE again", lambda: self._entry(t, 1).delete())
        defaults = _actions_in_scope(self.p4info, t, SCOPE_TABLE_ONLY)
        if defaults:
            self.attempt(f"{n}: MODIFY the default entry", lambda: self._set_default(t, defaults[0]))
        self.attempt(f"{n}: read the default entry",
                     lambda: [e.action.action_name for e in sh.TableEntry(n)(is_default=True).read()])

    def multicast(self, gid: int) -> None:
        group = self.sh.MulticastGroupEntry
        self.attempt(f"multicast group {gid}: INSERT", lambda: group(gid).add(1, 0).add(2, 1).insert())
        self.attempt(f"multicast group {gid}: INSERT again", lambda: group(gid).add(3, 0).insert())
        self.attempt(f"multicast group {gid}: read",
                     lambda: sorted((r.egress_port, r.instance) for g in group(gid).read() for r in g.replicas))
        self.attempt(f"multicast group {gid}: DELETE", lambda: group(gid).delete())
        self.attempt(f"multicast group {gid}: DELETE again", lambda: group(gid).delete())

    def _digest_entry(self, name: str) -> Any:
        de = self.sh.DigestEntry(name)
        de.max_list_size, de.max_timeout_ns, de.ack_timeout_ns = 1, 0, 10**9
        return de

    def digest(self, name: str) -> None:
        self.attempt(f"digest {name}: INSERT", lambda: self._digest_entry(name).insert())
        self.attempt(f"digest {name}: INSERT again", lambda: self._digest_entry(name).insert())
        self.attempt(f"digest {name}: read", lambda: len(list(self.sh.DigestEntry(name).read())))
        self.attempt(f"digest {name}: DELETE", lambda: self._digest_entry(name).delete())


# ---------------------------------------------------------------------------------------------
# Targets, golden files, comparison
# ---------------------------------------------------------------------------------------------


def p4info_digest(p4info: P4Info) -> str:
    """SHA-256 of the P4Info's deterministic serialization: which program a golden file was recorded for."""
    return hashlib.sha256(p4info.message.SerializeToString(deterministic=True)).hexdigest()


@contextlib.contextmanager
def model_target(device_id: int = 1) -> Iterator[str]:
    """The model's P4Runtime server in this process, fresh; yields its address."""
    from switchmodel.p4rt_server import P4RuntimeServer
    from switchmodel.state import SwitchState

    server = P4RuntimeServer(SwitchState(device_id=device_id), "127.0.0.1:0").start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop(grace=0)


@contextlib.contextmanager
def bmv2_target(binary: str, log_dir: Path, device_id: int = 1) -> Iterator[str]:
    """``simple_switch_grpc`` with no ports and no program, fresh; yields its address."""
    proc = start_bmv2([], log_dir, device_id=device_id, binary=binary)
    try:
        yield proc.grpc_addr
    finally:
        proc.stop()


def bmv2_version(binary: str) -> str:
    """What ``simple_switch_grpc --version`` prints (first line), for the golden file."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "unknown"


def load_golden(path: Path) -> dict[str, Any]:
    """A recorded answer file: ``target``, ``recorded``, ``p4info_sha256``, ``answers`` ([name, answer] pairs)."""
    doc: dict[str, Any] = json.loads(path.read_text())
    if not isinstance(doc.get("answers"), list):
        raise ValueError(f"{path}: no 'answers' list (not a conformance golden file)")
    return doc


def save_golden(path: Path, answers: Answers, p4info: P4Info, target: str) -> None:
    """Write a golden file of ``answers`` recorded on ``target``."""
    head = {"target": target, "recorded": datetime.date.today().isoformat(), "p4info_sha256": p4info_digest(p4info)}
    # One call per line, so a re-recording diffs call by call.
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    pairs = ",\n".join(f"    {json.dumps(list(a))}" for a in answers)
    path.write_text("{\n" + "\n".join(lines) + '\n  "answers": [\n' + pairs + "\n  ]\n}\n")


@dataclass(frozen=True)
class Difference:
    """One call answered differently: by the reference target and by the one under test."""

    name: str
    reference: str
    got: str

    def __str__(self) -> str:
        return f"{self.name}: reference {self.reference!r}, got {self.got!r}"


def compare(reference: Sequence[tuple[str, str]], got: Sequence[tuple[str, str]]) -> tuple[list[Difference],
                                                                                            list[str]]:
    """(calls answered differently, calls the reference has no answer for), in call order."""
    ref = dict(reference)
    diffs = [Difference(name, ref[name], answer) for name, answer in got if name in ref and ref[name] != answer]
    missing = [name for name, _ in got if name not in ref]
    return diffs, missing


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchmodel.conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("model", "bmv2"), default="model")
    parser.add_argument("--p4info", type=Path, default=contract.P4INFO_PATH)
    parser.add_argument("--device-config", type=Path, default=contract.BMV2_JSON_PATH)
    parser.add_argument("--record", type=Path, metavar="FILE", help="write the answers to FILE (a golden file)")
    parser.add_argument("--compare", type=Path, metavar="FILE", help="print the calls answered unlike FILE")
    args = parser.parse_args(argv)
    p4info = P4Info.load(args.p4info)
    target: Callable[[], contextlib.AbstractContextManager[str]]
    if args.target == "bmv2":
        binary = find_simple_switch_grpc()
        if binary is None:
            print("simple_switch_grpc is neither on PATH nor in /opt/bmv2/bin", file=sys.stderr)
            return 2
        logs = Path(tempfile.mkdtemp(prefix="kvpool-conformance-"))
        label = f"bmv2 ({bmv2_version(binary)})"

        def target() -> contextlib.AbstractContextManager[str]:
            return bmv2_target(binary, logs)
    else:
        label = "model"
        target = model_target
    try:
        with target() as address:
            answers = probe_all(address, args.p4info, args.device_config)
    except (OSError, TargetError) as e:
        print(f"cannot start {args.target}: {e}", file=sys.stderr)
        return 2
    if args.record:
        save_golden(args.record, answers, p4info, label)
        print(f"recorded {len(answers)} answers of {label} in {args.record}")
    if args.compare:
        diffs, missing = compare(load_golden(args.compare)["answers"], answers)
        for d in diffs:
            print(f"DIFFERS {'(known) ' if d.name in KNOWN_DIFFERENCES else ''}{d}")
        for name in missing:
            print(f"NO REFERENCE {name}")
        print(f"{len(answers)} calls, {len(diffs)} answered differently, {len(missing)} without a reference")
        return 1 if missing or any(d.name not in KNOWN_DIFFERENCES for d in diffs) else 0
    if not args.record:
        for name, answer in answers:
            print(f"{name}: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
