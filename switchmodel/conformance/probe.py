"""The probe: a fixed sequence of P4Info-generated calls that touches every P4Runtime rule we rely on.

Every table, counter, digest and multicast group (inserts, duplicates, missing entries,
modifies, deletes, too-wide values, unknown ids, keyless tables, default entries) and the
arbitration rules (a backup, a client with no stream, a second device), one answer
recorded per call. One concern, so one module: the sequence is long because the rules
are many, and a reader follows it top to bottom as the target sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from p4.v1 import p4runtime_pb2

from kvpool import contract
from kvpool.p4rt import codec
from kvpool.p4rt.p4info import SCOPE_DEFAULT_ONLY, SCOPE_TABLE_ONLY, P4Info, TableInfo
from switchmodel.conformance.client import (
    _PIPE,
    BACKUP_ID,
    DELETE,
    INSERT,
    MODIFY,
    OTHER_DEVICE_ID,
    PRIMARY_ID,
    Client,
)
from switchmodel.conformance.entities import (
    _actions_in_scope,
    _default,
    _entry,
    _fill_match,
    _read_answer,
    _update,
)
from switchmodel.conformance.golden import Answers
from switchmodel.conformance.shell import run_shell_probe

# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------



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
