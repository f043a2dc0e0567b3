"""Writes by P4Info names: entries, default actions, multicast groups, digest configs.

Each write validates against the P4Info, ships batched updates and records what the switch
accepted in the intended state (so a resync restores it). With ``defer_writes`` a write
made while the switch is down, or one the connection drops, only changes the intended
state, and the resync after the reconnect applies it: the owner keeps going through a
switch's restart. A rejected update raises :class:`WriteError`; the others stay applied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2

from controller.p4runtime.entities import UPDATE_NAMES, Entry, _Key, _prebuilt, _Update
from controller.p4runtime.errors import (
    NoPipelineError,
    NotMasterError,
    SwitchUnreachableError,
    UpdateError,
    WriteError,
)
from controller.p4runtime.session import SwitchSession, log
from kvpool.p4rt import codec
from kvpool.p4rt.codec import DigestConfig, MatchValue, TableEntry, Value


class SwitchWrites(SwitchSession):
    """The write half of :class:`~controller.p4runtime.P4RuntimeSwitch`."""

    # --- encoding --------------------------------------------------------------------------------

    def _normalize(self, entry: Entry) -> tuple[_Key, Entry]:
        """Validate an entry against the P4Info; its identity key and a canonical copy (ints)."""
        t = self._table(entry.table)
        match = codec.user_match(t, entry.match)
        action_name, params = "", {}
        if entry.action:
            call = codec.action_call(self.p4info, entry.action, entry.params)
            action_name, params = call.action, dict(call.params)
        canon = Entry(t.name, {k: codec.match_value(m) for k, m in match.items()}, action_name, params,
                      entry.priority)
        return (t.name, codec.entry_key(t, match, entry.priority)), canon

    def _table_entry_pb(self, key: _Key, entry: Entry, out: Any) -> None:
        t = self._table(entry.table)
        match = dict(key[1][0])
        if entry.action:
            call = codec.action_call(self.p4info, entry.action, entry.params)
            codec.encode_table_entry(self.p4info, t, TableEntry(match, call, entry.priority), out)
        else:  # a DELETE: match and priority identify the entry
            codec.encode_entry_key(t, match, entry.priority, out)

    def _action_pb(self, action_name: str, params: Mapping[str, Value], out: Any) -> None:
        codec.encode_action(self.p4info, codec.action_call(self.p4info, action_name, params), out)

    # --- writes ----------------------------------------------------------------------------------

    def _write(self, updates: Sequence[_Update]) -> list[UpdateError]:
        """Send updates in batches; returns the rejected ones (index into ``updates``).

        A write the switch answered was applied by the switch we arbitrated with, whatever
        happens to the connection afterwards (a restarted process refuses our writes: it has
        no stream from us), so unlike a read it needs no session check.
        """
        stub, _ = self._require()
        errors: list[UpdateError] = []
        for start in range(0, len(updates), self.batch_size):
            chunk = updates[start:start + self.batch_size]
            req = p4runtime_pb2.WriteRequest(device_id=self.device_id)
            self._election_msg(req.election_id)
            for update in chunk:
                update.fill(req.updates.add())
            try:
                stub.Write(req, timeout=max(self.timeout_s, 30.0))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNKNOWN:
                    self.write_errors += len(chunk)
                    raise self._rpc_error("Write", e) from None
                errors.extend(self._batch_errors(e, chunk, start))
        self.write_errors += len(errors)
        return errors

    @staticmethod
    def _batch_errors(e: grpc.RpcError, chunk: Sequence[_Update], start: int) -> list[UpdateError]:
        status = None
        for key, value in e.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                status = status_pb2.Status()
                status.ParseFromString(value)
        if status is None or len(status.details) != len(chunk):
            return [UpdateError(start + i, u.desc, "UNKNOWN", str(e.details())) for i, u in enumerate(chunk)]
        out = []
        for i, (detail, u) in enumerate(zip(status.details, chunk, strict=True)):
            err = p4runtime_pb2.Error()
            detail.Unpack(err)
            if err.canonical_code != code_pb2.OK:
                out.append(UpdateError(start + i, u.desc, code_pb2.Code.Name(err.canonical_code), str(err.message)))
        return out

    def write_updates(self, updates: Iterable[Any]) -> list[UpdateError]:
        """Send ``p4.v1.Update`` messages as they are, unchecked; returns the ones the switch rejected.

        For tests and tools that probe what a switch refuses: the updates bypass the P4Info
        checks and the intended state, but go out on this controller's own connection, the
        only one a switch takes writes from while this controller is primary.
        """
        batch = [_prebuilt(u, f"{UPDATE_NAMES[int(u.type)]} {u.entity.WhichOneof('entity')}") for u in updates]
        return self._write(batch)

    def _entry_update(self, utype: int, key: _Key, entry: Entry) -> _Update:
        def fill(u: Any) -> None:
            u.type = utype
            self._table_entry_pb(key, entry, u.entity.table_entry)

        return _Update(utype, fill, f"{UPDATE_NAMES[utype]} {entry.describe()}")

    def _deferred(self) -> bool:
        """With the lock held: True when a write should only change the intended state (switch not ready)."""
        return self.defer_writes and not self._ready.is_set() and self._resync_thread != threading.get_ident()

    def _wait_for_write(self) -> None:
        """Before taking the lock for a write: wait for a reconnect, unless writes are deferred meanwhile."""
        if not self.defer_writes:
            self._wait_ready()

    def _send(self, updates: Sequence[_Update], record: Callable[[set[int]], None]) -> None:
        """Write ``updates`` and ``record`` the accepted ones in the intended state (with the lock held).

        ``record`` gets the indexes the switch rejected. With ``defer_writes``, a switch that
        is down, or one that drops the connection, lost its pipeline or does not take our
        writes during the write, records every update: the resync after the reconnect (or
        after winning arbitration back) applies them.
        """
        if self._deferred():
            record(set())
            self._pending = True
            return
        try:
            errors = self._write(updates)
        except (SwitchUnreachableError, NoPipelineError, NotMasterError) as e:
            # NotMasterError too: a restarted switch refuses our writes until we arbitrate again,
            # and a controller that lost mastership writes its intended state when it wins it back.
            if not self.defer_writes:
                raise
            record(set())
            self._pending = True
            log.debug("switch %s: %d update(s) left for the resync (%s)", self.address, len(updates), e)
            return
        record({err.index for err in errors})
        if errors:
            raise WriteError(self.address, len(updates), errors)

    def _write_entries(self, utype: int, entries: Iterable[Entry]) -> None:
        self._wait_for_write()
        with self._lock:
            normalized = [self._normalize(e) for e in entries]
            for _, e in normalized:
                if utype != p4runtime_pb2.Update.DELETE and not e.action:
                    raise ValueError(f"{e.describe()}: an action is required")

            def record(failed: set[int]) -> None:
                for i, (key, e) in enumerate(normalized):
                    if i in failed:
                        continue
                    if utype == p4runtime_pb2.Update.DELETE:
                        self._intended.entries.pop(key, None)
                    else:
                        self._intended.entries[key] = e

            self._send([self._entry_update(utype, k, e) for k, e in normalized], record)

    def insert_entries(self, entries: Iterable[Entry]) -> None:
        """INSERT table entries in batches; WriteError lists the rejected ones (others stay applied)."""
        self._write_entries(p4runtime_pb2.Update.INSERT, entries)

    def modify_entries(self, entries: Iterable[Entry]) -> None:
        """MODIFY the action of existing entries, in batches."""
        self._write_entries(p4runtime_pb2.Update.MODIFY, entries)

    def delete_entries(self, entries: Iterable[Entry]) -> None:
        """DELETE entries (match + priority identify them; the action is ignored), in batches."""
        self._write_entries(p4runtime_pb2.Update.DELETE, entries)

    def insert_entry(self, table: str, match: Mapping[str, MatchValue], action: str,
                     params: Mapping[str, Value] | None = None, priority: int = 0) -> None:
        """INSERT one entry."""
        self.insert_entries([Entry(table, match, action, dict(params or {}), priority)])

    def modify_entry(self, table: str, match: Mapping[str, MatchValue], action: str,
                     params: Mapping[str, Value] | None = None, priority: int = 0) -> None:
        """MODIFY one entry."""
        self.modify_entries([Entry(table, match, action, dict(params or {}), priority)])

    def delete_entry(self, table: str, match: Mapping[str, MatchValue], priority: int = 0) -> None:
        """DELETE one entry."""
        self.delete_entries([Entry(table, match, priority=priority)])

    def set_default_action(self, table: str, action: str, params: Mapping[str, Value] | None = None) -> None:
        """MODIFY a table's default entry."""
        self._wait_for_write()
        with self._lock:
            t = self._table(table)
            call = codec.action_call(self.p4info, action, params)
            u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
            codec.encode_default_entry(self.p4info, t, call, u.entity.table_entry)

            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.defaults[t.name] = (call.action, dict(call.params))

            self._send([_prebuilt(u, f"MODIFY default of {t.name} -> {call.action}")], record)

    # --- multicast -------------------------------------------------------------------------------

    def _group_update(self, utype: int, gid: int, replicas: Sequence[tuple[int, int]]) -> _Update:
        u = p4runtime_pb2.Update(type=utype)
        codec.encode_multicast_group(gid, replicas, u.entity.packet_replication_engine_entry)
        return _prebuilt(u, f"{UPDATE_NAMES[utype]} multicast group {gid} {list(replicas)}")

    def set_multicast_group(self, group_id: int, replicas: Iterable[tuple[int, int]]) -> None:
        """Create or replace multicast group ``group_id`` with (egress port, replica id) copies."""
        reps = tuple((int(p), int(r)) for p, r in replicas)
        self._wait_for_write()
        with self._lock:
            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.groups[group_id] = reps

            utype = p4runtime_pb2.Update.MODIFY if group_id in self._intended.groups else p4runtime_pb2.Update.INSERT
            try:
                self._send([self._group_update(utype, group_id, reps)], record)
            except WriteError as e:
                if e.errors[0].code not in ("ALREADY_EXISTS", "NOT_FOUND"):
                    raise
                # The switch disagrees with what we believed; take its word and retry the other way.
                other = p4runtime_pb2.Update.INSERT if utype == p4runtime_pb2.Update.MODIFY else \
                    p4runtime_pb2.Update.MODIFY
                self._send([self._group_update(other, group_id, reps)], record)

    def delete_multicast_group(self, group_id: int) -> None:
        """Delete a multicast group."""
        self._wait_for_write()
        with self._lock:
            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.groups.pop(group_id, None)

            self._send([self._group_update(p4runtime_pb2.Update.DELETE, group_id, ())], record)

    # --- digests ---------------------------------------------------------------------------------

    def _digest_update(self, utype: int, name: str, config: DigestConfig) -> _Update:
        u = p4runtime_pb2.Update(type=utype)
        codec.encode_digest_entry(self.p4info.digest(name), config, u.entity.digest_entry)
        return _prebuilt(u, f"{UPDATE_NAMES[utype]} digest {name}")

    def configure_digest(self, name: str, max_timeout_ns: int = 0, max_list_size: int = 1,
                         ack_timeout_ns: int = 1_000_000_000) -> None:
        """Enable (or reconfigure) a digest; its lists arrive in :attr:`digests` or ``on_digest``."""
        info = self.p4info.digest(name)
        config = DigestConfig(max_timeout_ns, max_list_size, ack_timeout_ns)
        self._wait_for_write()
        with self._lock:
            def record(failed: set[int]) -> None:
                if not failed:
                    self._intended.digests[info.name] = config

            utype = p4runtime_pb2.Update.MODIFY if info.name in self._intended.digests else \
                p4runtime_pb2.Update.INSERT
            self._send([self._digest_update(utype, info.name, config)], record)
