"""Control state of the reference switch model: what P4Runtime writes and the pipeline reads.

One :class:`SwitchState` per switch holds the forwarding pipeline config (P4Info + opaque
device config), table entries keyed by decoded match values, default actions, multicast
groups, indexed and direct counters, register arrays sized from the P4Info, digest
configuration with the queue of digest lists awaiting acks, and packet-in messages.

The P4Runtime server (:mod:`switchmodel.p4rt_server`) writes it from requests decoded by
:mod:`kvpool.p4rt.codec`, whose value types (``TableEntry``, ``FieldMatch``, ``Replica``...)
it stores; the packet pipeline reads tables and groups, adds to counters, reads/writes
registers and emits digests. Everything is addressed by P4Info names (qualified or alias), never ids. All
methods take one lock, so the gRPC threads and the packet thread can share a state. One
concern, kept in one module over 800 lines: the switch's control state under that one lock.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc

from kvpool.p4rt.codec import (
    ActionCall,
    CounterValue,
    DigestConfig,
    EntryKey,
    FieldMatch,
    Replica,
    TableEntry,
    decode_bytes,
    entry_key,
    prefix_mask,
)
from kvpool.p4rt.p4info import SCOPE_DEFAULT_ONLY, SCOPE_TABLE_ONLY, P4Info, P4InfoError, TableInfo


class StateError(Exception):
    """A rejected control operation, with the P4Runtime (gRPC) status code to report."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------------------------------
# Table entries
# ---------------------------------------------------------------------------------------------


class LookupResult(NamedTuple):
    """Outcome of a table lookup: ``hit`` and the action to run (the default on a miss).

    A named tuple, not a frozen dataclass: every packet makes four to six of these, and a
    frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``.
    """

    hit: bool
    action: str
    params: Mapping[str, int]
    entry: TableEntry | None = None


@dataclass
class _Table:
    info: TableInfo
    default: ActionCall
    initial_default: ActionCall
    entries: dict[EntryKey, TableEntry] = field(default_factory=dict)
    # Only for tables whose key is all exact fields: values in key order -> entry.
    exact_index: dict[tuple[int, ...], TableEntry] | None = None
    # Only for tables with one lpm field and otherwise exact ones: (prefix length, values with
    # the lpm value masked) -> entry, probed from the longest prefix length in use down.
    lpm_field: int | None = None
    lpm_index: dict[tuple[int, tuple[int, ...]], TableEntry] = field(default_factory=dict)
    prefix_lengths: dict[int, int] = field(default_factory=dict)
    longest_first: tuple[int, ...] = ()  # the prefix lengths in use, longest first (probe order)
    default_packets: int = 0
    default_bytes: int = 0
    direct_counter: str | None = None


# ---------------------------------------------------------------------------------------------
# Digests, packet-in
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DigestList:
    """A batch of digest data ready for the controller; each item is member values in struct order."""

    digest: str
    list_id: int
    data: tuple[tuple[int, ...], ...]
    timestamp_ns: int


@dataclass(frozen=True)
class PacketIn:
    """A packet sent to the controller with its ``packet_in`` header fields by name."""

    payload: bytes
    metadata: Mapping[str, int]


@dataclass
class _DigestState:
    config: DigestConfig
    buffer: list[tuple[int, ...]] = field(default_factory=list)
    first_ns: int = 0
    next_list_id: int = 1
    # list id -> (data, send time) for lists not yet acknowledged
    outstanding: dict[int, tuple[tuple[tuple[int, ...], ...], int]] = field(default_factory=dict)


@dataclass
class Pipeline:
    """The committed forwarding pipeline: P4Info, opaque device config (BMv2 JSON) and cookie (None: unset)."""

    p4info: P4Info
    device_config: bytes
    cookie: int | None


PacketOutHandler = Callable[[bytes, Mapping[str, int]], None]


def _bmv2_defaults(device_config: bytes, p4info: P4Info) -> dict[str, ActionCall]:
    """Default actions per table from a BMv2 JSON (where p4c records them); {} if not BMv2 JSON."""
    try:
        doc = json.loads(device_config.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    actions: dict[int, tuple[str, list[str]]] = {}
    for a in doc.get("actions", []):
        actions[int(a["id"])] = (str(a["name"]), [str(r["name"]) for r in a.get("runtime_data", [])])
    out: dict[str, ActionCall] = {}
    for pipe in doc.get("pipelines", []):
        for t in pipe.get("tables", []):
            entry = t.get("default_entry")
            name = str(t.get("name", ""))
            if not entry or not p4info.has("table", name) or int(entry.get("action_id", -1)) not in actions:
                continue
            action_name, param_names = actions[int(entry["action_id"])]
            if not p4info.has("action", action_name):
                continue
            data = [int(str(v), 16) for v in entry.get("action_data", [])]
            params = dict(zip(param_names, data, strict=False))
            out[p4info.table(name).name] = ActionCall(p4info.action(action_name).name, params)
    return out


class SwitchState:
    """Thread-safe control state of one model switch (see the module docstring)."""

    def __init__(self, device_id: int = 1, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.device_id = device_id
        self._clock = clock_ns
        self._lock = threading.RLock()
        self._outbox = threading.Condition(self._lock)
        self._pipeline: Pipeline | None = None
        self._saved: Pipeline | None = None
        self._tables: dict[str, _Table] = {}
        self._groups: dict[int, tuple[Replica, ...]] = {}
        self._counters: dict[str, list[list[int]]] = {}
        self._registers: dict[str, list[int]] = {}
        self._register_masks: dict[str, int] = {}
        self._digests: dict[str, _DigestState] = {}
        self._list_ids: dict[str, int] = {}  # next list id of digests configured before
        self._packet_ins: list[PacketIn] = []
        self._generation = 0
        self._pipeline_listeners: list[Callable[[SwitchState], None]] = []
        #: Called with (payload, packet_out metadata by name) for each PacketOut; set by the pipeline.
        self.packet_out_handler: PacketOutHandler | None = None
        #: Event counts for tests and status (digests dropped, suppressed, ...).
        self.stats: dict[str, int] = {}

    # --- pipeline --------------------------------------------------------------------------------

    @property
    def pipeline(self) -> Pipeline | None:
        """The committed pipeline, or None before the first SetForwardingPipelineConfig."""
        with self._lock:
            return self._pipeline

    @property
    def p4info(self) -> P4Info:
        """P4Info of the committed pipeline; FAILED_PRECONDITION when there is none."""
        with self._lock:
            if self._pipeline is None:
                raise StateError(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
            return self._pipeline.p4info

    @property
    def generation(self) -> int:
        """Bumped on every pipeline commit, so the packet pipeline can notice a reload.

        Read without the lock: the packet path asks for every packet, and reading one int
        attribute is atomic; a commit in progress is noticed by the next packet.
        """
        return self._generation

    def add_pipeline_listener(self, callback: Callable[[SwitchState], None]) -> None:
        """Call ``callback(state)`` after every pipeline commit (under the state lock)."""
        with self._lock:
            self._pipeline_listeners.append(callback)

    def set_pipeline(self, p4info: P4Info, device_config: bytes = b"", cookie: int | None = None) -> None:
        """Commit a new pipeline and clear all forwarding state (VERIFY_AND_COMMIT)."""
        with self._lock:
            self._commit(Pipeline(p4info, device_config, cookie), keep=False)

    def save_pipeline(self, p4info: P4Info, device_config: bytes = b"", cookie: int | None = None) -> None:
        """Stage a pipeline for a later :meth:`commit_saved` (VERIFY_AND_SAVE)."""
        with self._lock:
            self._saved = Pipeline(p4info, device_config, cookie)

    def commit_saved(self) -> None:
        """Commit the pipeline staged by :meth:`save_pipeline` (COMMIT)."""
        with self._lock:
            if self._saved is None:
                raise StateError(grpc.StatusCode.FAILED_PRECONDITION, "COMMIT without a saved pipeline config")
            saved, self._saved = self._saved, None
            self._commit(saved, keep=False)

    def reconcile_pipeline(self, p4info: P4Info, device_config: bytes = b"", cookie: int | None = None) -> None:
        """Commit a pipeline keeping every entry, group, counter and digest config still valid in it."""
        with self._lock:
            self._commit(Pipeline(p4info, device_config, cookie), keep=True)

    def _commit(self, pipe: Pipeline, keep: bool) -> None:
        old_tables, old_groups, old_counters = self._tables, self._groups, self._counters
        old_registers, old_digests, old_masks = self._registers, self._digests, self._register_masks
        p4info = pipe.p4info
        defaults = _bmv2_defaults(pipe.device_config, p4info)
        direct = {d.table_id: d.name for d in p4info.direct_counters}
        tables: dict[str, _Table] = {}
        for t in p4info.tables:
            initial = self._initial_default(t, p4info, defaults)
            all_exact = all(f.match_type == "exact" for f in t.match_fields)
            kinds = [f.match_type for f in t.match_fields]
            one_lpm = kinds.count("lpm") == 1 and all(k in ("exact", "lpm") for k in kinds)
            tables[t.name] = _Table(t, initial, initial, exact_index={} if all_exact else None,
                                    lpm_field=kinds.index("lpm") if one_lpm else None,
                                    direct_counter=direct.get(t.id))
        counters = {c.name: [[0, 0] for _ in range(c.size)] for c in p4info.counters}
        registers = {r.name: [0] * r.size for r in p4info.registers}
        self._register_masks = {r.name: (1 << r.bitwidth) - 1 for r in p4info.registers}
        self._tables, self._counters, self._registers = tables, counters, registers
        self._groups, self._digests, self._packet_ins = {}, {}, []
        self._list_ids = {}
        self._pipeline = pipe
        if keep:
            self._migrate(old_tables, old_groups, old_counters, old_registers, old_masks, old_digests)
        self._generation += 1
        for listener in self._pipeline_listeners:
            listener(self)

    @staticmethod
    def _initial_default(t: TableInfo, p4info: P4Info, bmv2: Mapping[str, ActionCall]) -> ActionCall:
        if t.initial_default_action_id:
            action = p4info.action(t.initial_default_action_id)
            params = {action.param(pid).name: decode_bytes(v, action.param(pid).bitwidth)
                      for pid, v in t.initial_default_args}
            return ActionCall(action.name, params)
        if t.name in bmv2:
            return bmv2[t.name]
        if t.const_default_action_id:
            return ActionCall(p4info.action(t.const_default_action_id).name, {})
        # p4c's implicit default is NoAction (BMv2 does the same for a table without one).
        return ActionCall("NoAction", {})

    def _migrate(self, tables: dict[str, _Table], groups: dict[int, tuple[Replica, ...]],
                 counters: dict[str, list[list[int]]], registers: dict[str, list[int]],
                 masks: dict[str, int], digests: dict[str, _DigestState]) -> None:
        p4info = self.p4info
        for name, old in tables.items():
            new = self._tables.get(name)
            if new is None or [(f.name, f.match_type, f.bitwidth) for f in old.info.match_fields] != [
                    (f.name, f.match_type, f.bitwidth) for f in new.info.match_fields]:
                continue
            for entry in old.entries.values():
                if self._action_fits(new.info, p4info, entry.action, default=False):
                    self._store(new, entry)
            if self._action_fits(new.info, p4info, old.default, default=True) and not new.info.const_default_action_id:
                new.default = old.default
        self._groups = dict(groups)
        for name, cells in counters.items():
            if name in self._counters and len(self._counters[name]) == len(cells):
                self._counters[name] = cells
        for name, regs in registers.items():
            if name in self._registers and len(self._registers[name]) == len(regs):
                mask = self._register_masks[name]
                # Cells already fit a mask the new one covers: kept as they are (a pass over
                # the 2M reply records took 0.1 s of every reconcile).
                self._registers[name] = regs if masks[name] & ~mask == 0 else [v & mask for v in regs]
        for name, dig in digests.items():
            if p4info.has("digest", name):
                self._digests[name] = _DigestState(dig.config, next_list_id=dig.next_list_id)

    @staticmethod
    def _action_fits(t: TableInfo, p4info: P4Info, call: ActionCall, default: bool) -> bool:
        if not p4info.has("action", call.action):
            return False
        action = p4info.action(call.action)
        scope = t.action_scope(action.id)
        if scope is None and not (default and call.action == "NoAction"):
            return False
        params = {p.name: p.bitwidth for p in action.params}
        return set(params) == set(call.params) and all(v >> params[k] == 0 for k, v in call.params.items())

    # --- tables ----------------------------------------------------------------------------------

    def _table(self, name: str) -> _Table:
        try:
            return self._tables[self.p4info.table(name).name]
        except P4InfoError as e:
            raise StateError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

    def _store(self, table: _Table, entry: TableEntry) -> None:
        table.entries[entry_key(table.info, entry.match, entry.priority)] = entry
        if table.exact_index is not None:
            table.exact_index[tuple(entry.match[f.name].value for f in table.info.match_fields)] = entry
        elif table.lpm_field is not None:
            key = self._lpm_key(table, entry)
            if key not in table.lpm_index:
                table.prefix_lengths[key[0]] = table.prefix_lengths.get(key[0], 0) + 1
                table.longest_first = tuple(sorted(table.prefix_lengths, reverse=True))
            table.lpm_index[key] = entry

    @staticmethod
    def _lpm_key(table: _Table, entry: TableEntry) -> tuple[int, tuple[int, ...]]:
        plen = 0
        values = []
        for f in table.info.match_fields:
            m = entry.match.get(f.name)  # only the lpm field may be absent (a /0 wildcard)
            if m is not None and m.kind == "lpm":
                plen = m.arg
            values.append(m.value if m is not None else 0)
        return plen, tuple(values)

    def _check_entry(self, table: _Table, entry: TableEntry) -> None:
        info = table.info
        if info.is_const_table:
            raise StateError(grpc.StatusCode.PERMISSION_DENIED, f"table {info.name} is const")
        action = self.p4info.action(entry.action.action)
        scope = info.action_scope(action.id)
        if scope is None:
            raise StateError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"action {action.name} is not an action of table {info.name}")
        if scope == SCOPE_DEFAULT_ONLY:  # the spec's code, and PI's
            raise StateError(grpc.StatusCode.PERMISSION_DENIED,
                             f"action {action.name} is default-only in table {info.name}")

    def insert_entry(self, table: str, entry: TableEntry) -> None:
        """Add an entry; ALREADY_EXISTS when its match+priority is present.

        What BMv2 itself refuses is UNKNOWN, as PI reports a target's failure ("Error when
        adding match entry to target"): an entry in a table without match fields (only its
        default entry exists) and one more entry than the table's size.
        """
        with self._lock:
            t = self._table(table)
            self._check_entry(t, entry)
            key = entry_key(t.info, entry.match, entry.priority)
            if key in t.entries:
                raise StateError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"Match entry already exists in table {t.info.name} (use MODIFY to change its action)")
            if not t.info.match_fields:
                raise StateError(grpc.StatusCode.UNKNOWN,
                                 f"Error when adding match entry to target: table {t.info.name} has no match "
                                 "fields (only its default entry can be modified)")
            if t.info.size and len(t.entries) >= t.info.size:
                raise StateError(grpc.StatusCode.UNKNOWN,
                                 f"Error when adding match entry to target: table {t.info.name} is full "
                                 f"({t.info.size} entries)")
            self._store(t, entry)

    def modify_entry(self, table: str, entry: TableEntry) -> None:
        """Replace the action (and metadata) of an existing entry; NOT_FOUND when absent."""
        with self._lock:
            t = self._table(table)
            self._check_entry(t, entry)
            key = entry_key(t.info, entry.match, entry.priority)
            old = t.entries.get(key)
            if old is None:
                raise StateError(grpc.StatusCode.NOT_FOUND, f"no such entry in table {t.info.name}")
            entry.packets, entry.bytes = old.packets, old.bytes
            self._store(t, entry)

    def delete_entry(self, table: str, match: Mapping[str, FieldMatch], priority: int = 0) -> None:
        """Remove the entry with this match and priority; NOT_FOUND when absent."""
        with self._lock:
            t = self._table(table)
            if t.info.is_const_table:
                raise StateError(grpc.StatusCode.PERMISSION_DENIED, f"table {t.info.name} is const")
            key = entry_key(t.info, match, priority)
            entry = t.entries.pop(key, None)
            if entry is None:
                raise StateError(grpc.StatusCode.NOT_FOUND, f"no such entry in table {t.info.name}")
            if t.exact_index is not None:
                t.exact_index.pop(tuple(entry.match[f.name].value for f in t.info.match_fields), None)
            elif t.lpm_field is not None:
                lpm_key = self._lpm_key(t, entry)
                del t.lpm_index[lpm_key]
                t.prefix_lengths[lpm_key[0]] -= 1
                if not t.prefix_lengths[lpm_key[0]]:
                    del t.prefix_lengths[lpm_key[0]]
                    t.longest_first = tuple(sorted(t.prefix_lengths, reverse=True))

    def get_entry(self, table: str, match: Mapping[str, FieldMatch], priority: int = 0) -> TableEntry | None:
        """The entry with exactly this match and priority, or None."""
        with self._lock:
            t = self._table(table)
            return t.entries.get(entry_key(t.info, match, priority))

    def entries(self, table: str) -> list[TableEntry]:
        """Snapshot of a table's entries, in insertion order."""
        with self._lock:
            return list(self._table(table).entries.values())

    def entry_count(self, table: str) -> int:
        """Number of entries in a table."""
        with self._lock:
            return len(self._table(table).entries)

    def set_default_action(self, table: str, action: str, params: Mapping[str, int] | None = None) -> None:
        """Set a table's default action (MODIFY of the default entry)."""
        with self._lock:
            t = self._table(table)
            p4info = self.p4info
            info = p4info.action(action)
            if t.info.const_default_action_id:
                raise StateError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"table {t.info.name} has a const default action")
            scope = t.info.action_scope(info.id)
            if scope is None:
                raise StateError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"action {info.name} is not an action of table {t.info.name}")
            if scope == SCOPE_TABLE_ONLY:  # the spec's code, and PI's
                raise StateError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"action {info.name} cannot be the default of table {t.info.name} (table-only)")
            t.default = ActionCall(info.name, dict(params or {}))

    def reset_default_action(self, table: str) -> None:
        """Restore the table's initial default action (PERMISSION_DENIED when the default is const)."""
        with self._lock:
            t = self._table(table)
            if t.info.const_default_action_id:
                raise StateError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"table {t.info.name} has a const default action")
            t.default = t.initial_default

    def default_action(self, table: str) -> ActionCall:
        """The action a miss in ``table`` runs."""
        with self._lock:
            return self._table(table).default

    def set_default_counter(self, table: str, value: CounterValue) -> None:
        """Set the direct-counter value of a table's default entry (DirectCounterEntry MODIFY)."""
        with self._lock:
            t = self._table(table)
            t.default_packets, t.default_bytes = value.packets, value.bytes

    def default_counter(self, table: str) -> CounterValue:
        """Direct-counter value of the default entry (misses) of a table."""
        with self._lock:
            t = self._table(table)
            return CounterValue(t.default_packets, t.default_bytes)

    def lookup(self, table: str, key: Mapping[str, int] | Sequence[int],
               packet_len: int | None = None) -> LookupResult:
        """Match ``key`` (field name -> value, or values in key order) against ``table``.

        Exact-only tables use a hash lookup; others pick the matching entry with the highest
        priority (ternary/range/optional) or the longest prefix (lpm). With ``packet_len``
        the table's direct counter (if any) counts the packet on the hit entry or default.
        """
        with self._lock:
            # The pipeline's per-packet path: a qualified name and a tuple of ints, looked up
            # directly; anything else (an alias, an id, a mapping) takes the general way.
            t = self._tables.get(table) if self._pipeline is not None else None
            if t is None:
                t = self._table(table)
            fields = t.info.match_fields
            if type(key) is tuple and len(key) == len(fields):
                values: tuple[int, ...] = key
            elif isinstance(key, Mapping):
                try:
                    values = tuple(int(key[f.name]) for f in fields)
                except KeyError as e:
                    raise KeyError(f"lookup in {t.info.name}: key field {e.args[0]!r} missing") from None
            else:
                values = tuple(int(v) for v in key)
                if len(values) != len(fields):
                    raise ValueError(f"lookup in {t.info.name}: {len(fields)} key values expected, got {len(values)}")
            if t.exact_index is not None:
                found = t.exact_index.get(values)
            elif t.lpm_field is not None:
                found = self._lpm_probe(t, values)
            else:
                found = self._scan(t, values)
            if packet_len is not None and t.direct_counter is not None:
                if found is not None:
                    found.packets += 1
                    found.bytes += packet_len
                else:
                    t.default_packets += 1
                    t.default_bytes += packet_len
            if found is None:
                return LookupResult(False, t.default.action, t.default.params)
            return LookupResult(True, found.action.action, found.action.params, found)

    def lookup_exact(self, table: str, *values: int) -> LookupResult:
        """Lookup with the key values given positionally (any table; fast path for exact ones)."""
        return self.lookup(table, values)

    @staticmethod
    def _lpm_probe(t: _Table, values: tuple[int, ...]) -> TableEntry | None:
        assert t.lpm_field is not None
        i = t.lpm_field
        width = t.info.match_fields[i].bitwidth
        probe = list(values)
        for plen in t.longest_first:
            probe[i] = values[i] & prefix_mask(plen, width)
            found = t.lpm_index.get((plen, tuple(probe)))
            if found is not None:
                return found
        return None

    @staticmethod
    def _scan(t: _Table, values: tuple[int, ...]) -> TableEntry | None:
        fields = t.info.match_fields
        by_priority = t.info.needs_priority
        best: TableEntry | None = None
        best_rank = -1
        for entry in t.entries.values():
            rank = 0
            for f, x in zip(fields, values, strict=True):
                m = entry.match.get(f.name)
                if m is None:
                    continue
                if not m.matches(x, f.bitwidth):
                    break
                if m.kind == "lpm":
                    rank += m.arg
            else:
                if by_priority:
                    rank = entry.priority
                if rank > best_rank:
                    best, best_rank = entry, rank
        return best

    # --- multicast -------------------------------------------------------------------------------

    def _check_group(self, group_id: int, replicas: Sequence[Replica]) -> None:
        self.p4info  # noqa: B018 -- raises FAILED_PRECONDITION before a pipeline exists
        if group_id <= 0:
            raise StateError(grpc.StatusCode.INVALID_ARGUMENT, f"multicast group id must be > 0, got {group_id}")
        if len(set(replicas)) != len(replicas):
            raise StateError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"multicast group {group_id} lists the same (port, rid) twice")

    def insert_group(self, group_id: int, replicas: Sequence[Replica]) -> None:
        """Create a multicast group; ALREADY_EXISTS when it exists."""
        with self._lock:
            self._check_group(group_id, replicas)
            if group_id in self._groups:
                raise StateError(grpc.StatusCode.ALREADY_EXISTS, f"multicast group {group_id} already exists")
            self._groups[group_id] = tuple(replicas)

    def modify_group(self, group_id: int, replicas: Sequence[Replica]) -> None:
        """Replace a multicast group's replicas; NOT_FOUND when absent."""
        with self._lock:
            self._check_group(group_id, replicas)
            if group_id not in self._groups:
                raise StateError(grpc.StatusCode.NOT_FOUND, f"multicast group {group_id} does not exist")
            self._groups[group_id] = tuple(replicas)

    def delete_group(self, group_id: int) -> None:
        """Delete a multicast group; NOT_FOUND when absent."""
        with self._lock:
            self.p4info  # noqa: B018 -- raises FAILED_PRECONDITION before a pipeline exists
            if self._groups.pop(group_id, None) is None:
                raise StateError(grpc.StatusCode.NOT_FOUND, f"multicast group {group_id} does not exist")

    def multicast_group(self, group_id: int) -> tuple[Replica, ...]:
        """Replicas of a group; empty when the group does not exist (the packet is dropped)."""
        with self._lock:
            return self._groups.get(group_id, ())

    def multicast_groups(self) -> dict[int, tuple[Replica, ...]]:
        """Snapshot of every multicast group."""
        with self._lock:
            return dict(self._groups)

    # --- counters --------------------------------------------------------------------------------

    def _counter_cells(self, name: str) -> tuple[str, list[list[int]]]:
        try:
            qualified = self.p4info.counter(name).name
        except P4InfoError as e:
            raise StateError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return qualified, self._counters[qualified]

    def counter_add(self, name: str, index: int, nbytes: int, packets: int = 1) -> None:
        """Count ``packets`` packets of ``nbytes`` bytes in total in cell ``index`` (IndexError if out of range)."""
        with self._lock:
            qualified, cells = self._counter_cells(name)
            if not 0 <= index < len(cells):
                raise IndexError(f"counter {qualified} index {index} out of range 0..{len(cells) - 1}")
            cell = cells[index]
            cell[0] += packets
            cell[1] += nbytes

    def counter_read(self, name: str, index: int) -> CounterValue:
        """The value of one counter cell; UNKNOWN (as PI) when the index is out of range."""
        with self._lock:
            qualified, cells = self._counter_cells(name)
            if not 0 <= index < len(cells):
                # PI reports the target's failure as UNKNOWN ("Error when ... counter").
                raise StateError(grpc.StatusCode.UNKNOWN,
                                 f"counter {qualified} index {index} out of range 0..{len(cells) - 1}")
            return CounterValue(cells[index][0], cells[index][1])

    def counter_values(self, name: str) -> list[CounterValue]:
        """Every cell of a counter array, by index."""
        with self._lock:
            _, cells = self._counter_cells(name)
            return [CounterValue(p, b) for p, b in cells]

    def counter_write(self, name: str, index: int, value: CounterValue) -> None:
        """Set one counter cell (P4Runtime CounterEntry MODIFY)."""
        with self._lock:
            qualified, cells = self._counter_cells(name)
            if not 0 <= index < len(cells):
                # PI reports the target's failure as UNKNOWN ("Error when ... counter").
                raise StateError(grpc.StatusCode.UNKNOWN,
                                 f"counter {qualified} index {index} out of range 0..{len(cells) - 1}")
            cells[index] = [value.packets, value.bytes]

    # --- registers (data plane only: BMv2's P4Runtime server does not expose them) ---------------

    def _register(self, name: str) -> tuple[str, list[int]]:
        qualified = self.p4info.register(name).name
        return qualified, self._registers[qualified]

    def register_read(self, name: str, index: int) -> int:
        """Value of one register cell (IndexError when out of range)."""
        with self._lock:
            qualified, cells = self._register(name)
            if not 0 <= index < len(cells):
                raise IndexError(f"register {qualified} index {index} out of range 0..{len(cells) - 1}")
            return cells[index]

    def register_write(self, name: str, index: int, value: int) -> None:
        """Store ``value`` truncated to the register's width, as a P4 assignment does."""
        with self._lock:
            qualified, cells = self._register(name)
            if not 0 <= index < len(cells):
                raise IndexError(f"register {qualified} index {index} out of range 0..{len(cells) - 1}")
            cells[index] = value & self._register_masks[qualified]

    def register_size(self, name: str) -> int:
        """Number of cells of a register array."""
        with self._lock:
            return len(self._register(name)[1])

    # --- live arrays for the packet pipeline's fast path ------------------------------------------

    def register_cells(self, name: str) -> list[int]:
        """The live cell list of a register array, valid until the next pipeline commit.

        For the packet pipeline only: it writes values already cut to the register's width
        and re-fetches the list when :attr:`generation` changes.
        """
        with self._lock:
            return self._register(name)[1]

    def counter_cells(self, name: str) -> list[list[int]]:
        """The live ``[packets, bytes]`` cells of a counter array, valid until the next pipeline commit."""
        with self._lock:
            return self._counter_cells(name)[1]

    # --- digests ---------------------------------------------------------------------------------

    def _digest_name(self, name: str) -> str:
        try:
            return self.p4info.digest(name).name
        except P4InfoError as e:
            raise StateError(grpc.StatusCode.NOT_FOUND, str(e)) from None

    def configure_digest(self, name: str, config: DigestConfig, insert: bool | None = None) -> None:
        """Enable or reconfigure a digest; ``insert`` True/False checks absence/presence as INSERT/MODIFY do."""
        with self._lock:
            qualified = self._digest_name(name)
            present = qualified in self._digests
            if insert is True and present:
                raise StateError(grpc.StatusCode.ALREADY_EXISTS, f"digest {qualified} already configured")
            if insert is False and not present:
                raise StateError(grpc.StatusCode.NOT_FOUND, f"digest {qualified} is not configured")
            if present:
                self._digests[qualified].config = config
            else:
                # As PI, list ids keep counting across a DELETE + INSERT of the config.
                self._digests[qualified] = _DigestState(config, next_list_id=self._list_ids.get(qualified, 1))

    def remove_digest(self, name: str) -> None:
        """Disable a digest; pending data is dropped. NOT_FOUND when it is not configured."""
        with self._lock:
            qualified = self._digest_name(name)
            dig = self._digests.pop(qualified, None)
            if dig is None:
                raise StateError(grpc.StatusCode.NOT_FOUND, f"digest {qualified} is not configured")
            self._list_ids[qualified] = dig.next_list_id

    def digest_config(self, name: str) -> DigestConfig | None:
        """The digest's config, or None when the controller has not enabled it."""
        with self._lock:
            dig = self._digests.get(self._digest_name(name))
            return dig.config if dig else None

    def digest_configs(self) -> dict[str, DigestConfig]:
        """Every configured digest."""
        with self._lock:
            return {name: d.config for name, d in self._digests.items()}

    def emit_digest(self, name: str, members: Mapping[str, int] | Sequence[int]) -> bool:
        """Queue one digest (struct members by name or in order) from the pipeline.

        Returns False when the digest is not configured (BMv2 drops it) or the same data is
        already queued or sits in a list not yet acknowledged (within ``ack_timeout_ns``).
        """
        with self._lock:
            info = self.p4info.digest(name)
            if isinstance(members, Mapping):
                missing = [m for m, _ in info.members if m not in members]
                if missing:
                    raise KeyError(f"digest {info.name}: member(s) {', '.join(missing)} missing")
                data = tuple(int(members[m]) & ((1 << w) - 1) for m, w in info.members)
            else:
                if len(members) != len(info.members):
                    raise ValueError(f"digest {info.name}: {len(info.members)} members expected, got {len(members)}")
                data = tuple(int(v) & ((1 << w) - 1) for v, (_, w) in zip(members, info.members, strict=True))
            dig = self._digests.get(info.name)
            if dig is None:
                self._count("digest_not_configured")
                return False
            now = self._clock()
            self._expire(dig, now)
            # ack_timeout_ns == 0 turns the duplicate cache off (PI does the same).
            if dig.config.ack_timeout_ns and (data in dig.buffer or
                                              any(data in d for d, _ in dig.outstanding.values())):
                self._count("digest_suppressed")
                return False
            if not dig.buffer:
                dig.first_ns = now
            dig.buffer.append(data)
            self._count("digest_emitted")
            self._outbox.notify_all()
            return True

    def _expire(self, dig: _DigestState, now: int) -> None:
        timeout = dig.config.ack_timeout_ns
        for list_id in [i for i, (_, sent) in dig.outstanding.items() if now - sent >= timeout]:
            del dig.outstanding[list_id]

    def ack_digest(self, name: str, list_id: int) -> bool:
        """Acknowledge a digest list (DigestListAck); False when the id is not outstanding."""
        with self._lock:
            dig = self._digests.get(self._digest_name(name))
            return dig is not None and dig.outstanding.pop(list_id, None) is not None

    def outstanding_digest_lists(self, name: str) -> list[int]:
        """Ids of digest lists sent but not acknowledged (and not expired)."""
        with self._lock:
            dig = self._digests.get(self._digest_name(name))
            if dig is None:
                return []
            self._expire(dig, self._clock())
            return sorted(dig.outstanding)

    def _ready_lists(self, now: int) -> tuple[list[DigestList], int | None]:
        ready: list[DigestList] = []
        wake: int | None = None
        for name, dig in self._digests.items():
            size = dig.config.max_list_size
            while dig.buffer:
                full = size > 0 and len(dig.buffer) >= size
                due = now - dig.first_ns >= dig.config.max_timeout_ns
                if not (full or due):
                    deadline = dig.first_ns + dig.config.max_timeout_ns
                    wake = deadline if wake is None else min(wake, deadline)
                    break
                take = dig.buffer[:size] if size > 0 else list(dig.buffer)
                del dig.buffer[:len(take)]
                list_id = dig.next_list_id
                dig.next_list_id += 1
                if dig.config.ack_timeout_ns:
                    dig.outstanding[list_id] = (tuple(take), now)
                ready.append(DigestList(name, list_id, tuple(take), time.time_ns()))
                dig.first_ns = now
        return ready, wake

    # --- packet-in and the outbox the P4Runtime stream drains -----------------------------------------

    def send_packet_in(self, payload: bytes, metadata: Mapping[str, int] | None = None) -> None:
        """Queue a packet for the controller (PacketIn on the master's stream)."""
        with self._lock:
            self._packet_ins.append(PacketIn(bytes(payload), dict(metadata or {})))
            self._outbox.notify_all()

    def next_messages(self, timeout_s: float) -> list[DigestList | PacketIn]:
        """Block up to ``timeout_s`` for digest lists due (batching rules applied) and packet-ins."""
        deadline = time.monotonic() + timeout_s
        with self._outbox:
            while True:
                ready, wake = self._ready_lists(self._clock())
                out: list[DigestList | PacketIn] = [*ready, *self._packet_ins]
                self._packet_ins = []
                if out:
                    return out
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                if wake is not None:
                    remaining = min(remaining, max(0.0, (wake - self._clock()) / 1e9))
                self._outbox.wait(remaining)

    def wake(self) -> None:
        """Wake any thread blocked in :meth:`next_messages` (used on shutdown)."""
        with self._outbox:
            self._outbox.notify_all()

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to the named event count in :attr:`stats`."""
        with self._lock:
            self.stats[what] = self.stats.get(what, 0) + n

    def snapshot(self) -> dict[str, Any]:
        """A plain-data summary (entry counts per table, groups, digests) for status output."""
        with self._lock:
            return {
                "device_id": self.device_id,
                "pipeline": self._pipeline is not None,
                "tables": {name: len(t.entries) for name, t in self._tables.items()},
                "multicast_groups": len(self._groups),
                "digests": sorted(self._digests),
                "stats": dict(self.stats),
            }
