"""The one P4Runtime codec: names and values to P4Runtime messages and back, for both ends.

The controller's driver (:mod:`controller.p4runtime`) and the switch model's server
(:mod:`switchmodel.p4rt_server`) both encode and decode with this module, so match
semantics, canonical bytestrings and width checks are written once:

* values: ints (and, from users, IPv4/IPv6/MAC strings, ``0x`` hex, decimal, bytes) to
  canonical bytestrings and back;
* matches: ``exact``, ``lpm``, ``ternary``, ``range`` and ``optional`` as the P4Info allows,
  with the spec's rules (a wildcard is an omitted field; no bits outside a prefix or mask);
* actions, table entries (priority, metadata, direct counter data) and default entries;
* counter entries and data; digest entries, configs and lists; multicast group entries
  (the packet replication engine); packet-in/packet-out metadata.

Bytestrings follow the P4Runtime specification (section "Bytestrings"): a value of a
``bit<W>`` field is sent big-endian; the canonical form is the shortest one (no leading
zero bytes, zero is one ``\\x00`` byte). Like PI (BMv2's server), :func:`decode_bytes`
accepts any length whose value fits in W bits (padded, canonical, even empty = 0).

Errors: an id or name the P4Info does not define raises :class:`P4InfoError` (a
``KeyError``, listing the known names); a value the P4Info does not allow raises
:class:`CodecError` (a ``ValueError``, one line naming the table, field or parameter).
The server answers both as INVALID_ARGUMENT, as PI does.

Messages are passed in to be filled (``out``) rather than returned: the protobuf runtime
here is the pure-Python one, where copying a message costs more than building it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvpool.p4rt.p4info import (
    ActionInfo,
    CounterInfo,
    DigestInfo,
    MatchFieldInfo,
    P4Info,
    P4InfoError,
    PacketMetadataInfo,
    TableInfo,
)

#: A value for a match field or action parameter: an int, big-endian bytes, or a string
#: holding an IPv4/IPv6/MAC address, "0x" hex or decimal digits.
Value = int | bytes | str
#: A match as users write it: a plain value (exact, optional; ternary with a full mask), or a
#: pair: (value, prefix_len) for lpm, (value, mask) for ternary, (low, high) for range.
#: lpm also takes "10.0.0.0/8".
MatchValue = Value | tuple[Value, Value]

MATCH_KINDS = ("exact", "lpm", "ternary", "range", "optional")


class CodecError(ValueError):
    """A value the P4Info does not allow: wrong width, bits outside a prefix or mask, missing field."""


# ---------------------------------------------------------------------------------------------
# Bytestrings and values
# ---------------------------------------------------------------------------------------------


def byte_width(bitwidth: int) -> int:
    """Bytes needed to hold a ``bit<bitwidth>`` value."""
    return max(1, (bitwidth + 7) // 8)


def encode_int(value: int, bitwidth: int) -> bytes:
    """Canonical P4Runtime bytestring of ``value`` for a ``bit<bitwidth>`` field."""
    if value < 0:
        raise CodecError(f"value {value} is negative; bit<{bitwidth}> holds 0..{(1 << bitwidth) - 1}")
    if value >> bitwidth:
        raise CodecError(f"value {value:#x} does not fit in bit<{bitwidth}>")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode_bytes(data: bytes, bitwidth: int) -> int:
    """Integer of a P4Runtime bytestring for a ``bit<bitwidth>`` field (any length whose value fits)."""
    value = int.from_bytes(data, "big") if data else 0
    if value >> bitwidth:
        raise CodecError(f"value {value:#x} does not fit in bit<{bitwidth}>")
    return value


def canonical(data: bytes) -> bytes:
    """Canonical form of a bytestring: leading zero bytes stripped, zero kept as one byte."""
    stripped = data.lstrip(b"\x00")
    return stripped or b"\x00"


def parse_mac(text: str) -> int:
    """Integer of a MAC address written ``aa:bb:cc:dd:ee:ff`` (or with dashes)."""
    parts = text.replace("-", ":").split(":")
    if len(parts) != 6 or not all(len(p) in (1, 2) for p in parts):
        raise CodecError(f"bad MAC address {text!r}; expected aa:bb:cc:dd:ee:ff")
    try:
        return int.from_bytes(bytes(int(p, 16) for p in parts), "big")
    except ValueError:
        raise CodecError(f"bad MAC address {text!r}; expected aa:bb:cc:dd:ee:ff") from None


def to_int(value: Value, bitwidth: int) -> int:
    """Integer of a user-supplied value for a ``bit<bitwidth>`` field, range-checked.

    Accepts ints, big-endian bytes, and strings: IPv4/IPv6 addresses, MAC addresses,
    ``0x``-prefixed hex or decimal digits.
    """
    if isinstance(value, int):
        number = int(value)  # plain int: bools and IntEnums are stored as numbers
    elif isinstance(value, bytes):
        number = int.from_bytes(value, "big") if value else 0
    elif isinstance(value, str):
        number = _parse_text(value.strip())
    else:
        raise TypeError(f"cannot use {type(value).__name__} {value!r} as a bit<{bitwidth}> value")
    if number < 0 or number >> bitwidth:
        raise CodecError(f"value {value!r} does not fit in bit<{bitwidth}>")
    return number


def _parse_text(text: str) -> int:
    if text.count(":") == 5 and "::" not in text and all(len(p) <= 2 for p in text.split(":")):
        return parse_mac(text)
    if "." in text or ":" in text:
        try:
            return int(ipaddress.ip_address(text))
        except ValueError:
            raise CodecError(f"bad address {text!r}; expected IPv4, IPv6 or MAC") from None
    try:
        return int(text, 0)
    except ValueError:
        raise CodecError(f"bad number {text!r}; expected decimal or 0x-hex") from None


def prefix_mask(prefix_len: int, bitwidth: int) -> int:
    """Mask with the top ``prefix_len`` bits of a ``bit<bitwidth>`` field set."""
    return ((1 << prefix_len) - 1) << (bitwidth - prefix_len) if prefix_len else 0


def _decode(data: bytes, bitwidth: int, what: str) -> int:
    try:
        return decode_bytes(data, bitwidth)
    except CodecError as e:
        raise CodecError(f"{what}: {e}") from None


# ---------------------------------------------------------------------------------------------
# The values both ends exchange
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldMatch:
    """A decoded match on one key field.

    ``kind`` is ``exact``, ``lpm``, ``ternary``, ``range`` or ``optional``; ``value`` is the
    value (range: low bound); ``arg`` is the lpm prefix length, the ternary mask or the range
    high bound (0 for exact and optional). A field absent from an entry is a wildcard.
    """

    kind: str
    value: int
    arg: int = 0

    def matches(self, x: int, bitwidth: int) -> bool:
        """True when header/metadata value ``x`` of a ``bit<bitwidth>`` field matches."""
        if self.kind in ("exact", "optional"):
            return x == self.value
        if self.kind == "lpm":
            mask = prefix_mask(self.arg, bitwidth)
            return (x & mask) == self.value
        if self.kind == "ternary":
            return (x & self.arg) == self.value
        if self.kind == "range":
            return self.value <= x <= self.arg
        raise ValueError(f"unsupported match kind {self.kind}")


@dataclass(frozen=True)
class ActionCall:
    """An action name with its parameter values by name."""

    action: str
    params: Mapping[str, int] = field(default_factory=dict)


@dataclass
class TableEntry:
    """One table entry: match (field name -> FieldMatch; absent = wildcard), priority, action.

    ``packets``/``bytes`` are the direct counter of the entry when its table has one.
    """

    match: dict[str, FieldMatch]
    action: ActionCall
    priority: int = 0
    controller_metadata: int = 0
    metadata: bytes = b""
    idle_timeout_ns: int = 0
    is_const: bool = False
    packets: int = 0
    bytes: int = 0


#: Identity of an entry in its table: (match items in key order, priority).
EntryKey = tuple[tuple[tuple[str, FieldMatch], ...], int]


def entry_key(table: TableInfo, match: Mapping[str, FieldMatch], priority: int) -> EntryKey:
    """The identity of an entry (match in key order + priority): equal on both ends for one entry."""
    return tuple((f.name, match[f.name]) for f in table.match_fields if f.name in match), priority


@dataclass(frozen=True)
class CounterValue:
    """Packets and bytes counted in one counter cell."""

    packets: int
    bytes: int


@dataclass(frozen=True)
class DigestConfig:
    """Digest batching as P4Runtime's DigestEntry.Config (all in nanoseconds / entries).

    ``max_timeout_ns``: longest wait before a partial list is sent (0: send at once);
    ``max_list_size``: entries per list (0: unlimited, 1: one per list);
    ``ack_timeout_ns``: how long data in an unacknowledged list is suppressed from new lists.
    """

    max_timeout_ns: int = 0
    max_list_size: int = 1
    ack_timeout_ns: int = 1_000_000_000


class Replica(NamedTuple):
    """One copy of a multicast packet: egress port and replica id (``standard_metadata.egress_rid``)."""

    port: int
    rid: int


# ---------------------------------------------------------------------------------------------
# Matches
# ---------------------------------------------------------------------------------------------


def check_field_match(table: TableInfo, f: MatchFieldInfo, m: FieldMatch) -> None:
    """Raise CodecError unless ``m`` is a valid, non-wildcard match on field ``f`` (spec rules)."""
    what = f"table {table.name} field {f.name}"
    if m.kind != f.match_type:
        raise CodecError(f"table {table.name}: field {f.name} is {f.match_type}, got a {m.kind} match")
    bw = f.bitwidth
    full = (1 << bw) - 1
    for v in (m.value, m.arg if m.kind in ("ternary", "range") else 0):
        if v < 0 or v > full:
            raise CodecError(f"{what}: value {v:#x} does not fit in bit<{bw}>")
    if m.kind == "lpm":
        if not 0 < m.arg <= bw:
            raise CodecError(f"{what}: prefix length {m.arg} not in 1..{bw} (omit the field for a /0 wildcard)")
        if m.value & ~prefix_mask(m.arg, bw):
            raise CodecError(f"{what}: lpm value {m.value:#x} has host bits set beyond /{m.arg}")
    elif m.kind == "ternary":
        if m.arg == 0:
            raise CodecError(f"{what}: ternary mask is 0 (omit the field for a wildcard)")
        if m.value & ~m.arg:
            raise CodecError(f"{what}: ternary value {m.value:#x} has bits outside mask {m.arg:#x}")
    elif m.kind == "range":
        if m.value > m.arg:
            raise CodecError(f"{what}: range low {m.value} > high {m.arg}")
        if m.value == 0 and m.arg == full:
            raise CodecError(f"{what}: full range (omit the field for a wildcard)")
    elif m.kind not in ("exact", "optional"):
        raise CodecError(f"{what}: unsupported match kind {m.kind}")


def _check_exact_present(table: TableInfo, match: Mapping[str, FieldMatch]) -> None:
    missing = [f.name for f in table.match_fields if f.match_type == "exact" and f.name not in match]
    if missing:
        raise CodecError(f"table {table.name}: exact field(s) {', '.join(missing)} missing")


def field_match(table: TableInfo, f: MatchFieldInfo, raw: MatchValue) -> FieldMatch | None:
    """The FieldMatch of a user value for field ``f``; None for a wildcard (the spec omits the field)."""
    kind, bw = f.match_type, f.bitwidth
    where = f"{table.name}.{f.name}"
    if kind in ("exact", "optional"):
        if isinstance(raw, tuple):
            raise CodecError(f"{where} is {kind}: give one value, not {raw!r}")
        m = FieldMatch(kind, to_int(raw, bw))
    elif kind == "lpm":
        if isinstance(raw, str) and "/" in raw:
            addr, plen = raw.split("/", 1)
            value, arg = to_int(addr, bw), int(plen)
        elif isinstance(raw, tuple):
            value, arg = to_int(raw[0], bw), to_int(raw[1], 16)
        else:
            value, arg = to_int(raw, bw), bw
        if not 0 <= arg <= bw:
            raise CodecError(f"{where}: prefix length {arg} not in 0..{bw}")
        if value & ~prefix_mask(arg, bw):
            raise CodecError(f"{where}: {_fmt(raw)} has host bits set beyond /{arg}")
        if arg == 0:
            return None  # /0 is a wildcard: P4Runtime wants the field omitted
        m = FieldMatch(kind, value, arg)
    elif kind == "ternary":
        if isinstance(raw, tuple):
            value, arg = to_int(raw[0], bw), to_int(raw[1], bw)
        else:
            value, arg = to_int(raw, bw), (1 << bw) - 1
        if arg == 0:
            if value:
                raise CodecError(f"{where}: value {value:#x} has bits outside mask 0x0")
            return None
        m = FieldMatch(kind, value, arg)
    elif kind == "range":
        if not isinstance(raw, tuple):
            raise CodecError(f"{where} is a range: give (low, high)")
        value, arg = to_int(raw[0], bw), to_int(raw[1], bw)
        if value == 0 and arg == (1 << bw) - 1:
            return None
        m = FieldMatch(kind, value, arg)
    else:
        raise CodecError(f"{where}: match kind {kind} is not supported")
    check_field_match(table, f, m)
    return m


def user_match(table: TableInfo, match: Mapping[str, MatchValue]) -> dict[str, FieldMatch]:
    """Validated FieldMatches of a user's match (field name -> value), in key order, wildcards left out."""
    out: dict[str, FieldMatch] = {}
    for name, raw in match.items():
        f = table.match_field(name)
        m = field_match(table, f, raw)
        if m is not None:
            out[f.name] = m
    _check_exact_present(table, out)  # exact fields are never wildcards, so all given ones are in
    order = {f.name: i for i, f in enumerate(table.match_fields)}
    return {k: out[k] for k in sorted(out, key=order.__getitem__)}


def match_value(m: FieldMatch) -> MatchValue:
    """A FieldMatch as users write it: an int for exact and optional, else (value, arg)."""
    return m.value if m.kind in ("exact", "optional") else (m.value, m.arg)


def _fmt(v: MatchValue) -> str:
    if isinstance(v, tuple):
        return "/".join(_fmt(x) for x in v)
    return hex(v) if isinstance(v, int) else str(v)


def describe_match(match: Mapping[str, MatchValue]) -> str:
    """One-line text of a match for messages: ``field=value, ...``."""
    return ", ".join(f"{k}={_fmt(v)}" for k, v in match.items())


def encode_match(table: TableInfo, match: Mapping[str, FieldMatch], out: Any) -> None:
    """Append ``p4.v1.FieldMatch`` messages for ``match`` (key order, canonical bytestrings) to ``out``."""
    for f in table.match_fields:
        m = match.get(f.name)
        if m is None:
            continue
        pb = out.add()
        pb.field_id = f.id
        bw = f.bitwidth
        if m.kind == "exact":
            pb.exact.value = encode_int(m.value, bw)
        elif m.kind == "lpm":
            pb.lpm.value = encode_int(m.value, bw)
            pb.lpm.prefix_len = m.arg
        elif m.kind == "ternary":
            pb.ternary.value = encode_int(m.value, bw)
            pb.ternary.mask = encode_int(m.arg, bw)
        elif m.kind == "range":
            pb.range.low = encode_int(m.value, bw)
            pb.range.high = encode_int(m.arg, bw)
        elif m.kind == "optional":
            pb.optional.value = encode_int(m.value, bw)
        else:
            raise CodecError(f"table {table.name} field {f.name}: unsupported match kind {m.kind}")


def decode_match(table: TableInfo, pbs: Iterable[Any], require_exact: bool = True) -> dict[str, FieldMatch]:
    """FieldMatches of ``p4.v1.FieldMatch`` messages: known fields, each once, valid per the spec."""
    match: dict[str, FieldMatch] = {}
    for pb in pbs:
        f = table.match_field(int(pb.field_id))
        if f.name in match:
            raise CodecError(f"table {table.name}: match field {f.name} given twice")
        kind = pb.WhichOneof("field_match_type")
        if kind != f.match_type:
            raise CodecError(f"table {table.name}: field {f.name} is {f.match_type}, got a {kind} match")
        what = f"table {table.name} field {f.name}"
        bw = f.bitwidth
        if kind == "exact":
            m = FieldMatch(kind, _decode(pb.exact.value, bw, what))
        elif kind == "lpm":
            m = FieldMatch(kind, _decode(pb.lpm.value, bw, what), int(pb.lpm.prefix_len))
        elif kind == "ternary":
            m = FieldMatch(kind, _decode(pb.ternary.value, bw, what), _decode(pb.ternary.mask, bw, what + " mask"))
        elif kind == "range":
            m = FieldMatch(kind, _decode(pb.range.low, bw, what + " low"), _decode(pb.range.high, bw, what + " high"))
        elif kind == "optional":
            m = FieldMatch(kind, _decode(pb.optional.value, bw, what))
        else:
            raise CodecError(f"{what}: unsupported match kind {kind}")
        check_field_match(table, f, m)
        match[f.name] = m
    if require_exact:
        _check_exact_present(table, match)
    return match


# ---------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------


def _check_params(action: ActionInfo, given: Iterable[str]) -> None:
    missing = [p.name for p in action.params if p.name not in set(given)]
    if missing:
        raise CodecError(f"action {action.name}: parameter(s) {', '.join(missing)} missing")


def action_call(p4info: P4Info, action: str | int, params: Mapping[str, Value] | None = None) -> ActionCall:
    """The ActionCall of a user's action and parameters: every parameter given, values within widths."""
    info = p4info.action(action)
    values = {info.param(k).name: to_int(v, info.param(k).bitwidth) for k, v in (params or {}).items()}
    _check_params(info, values)
    return ActionCall(info.name, values)


def encode_action(p4info: P4Info, call: ActionCall, out: Any) -> None:
    """Fill a ``p4.v1.Action`` from an ActionCall (every parameter, canonical bytestrings)."""
    action = p4info.action(call.action)
    _check_params(action, call.params)
    out.action_id = action.id
    for p in action.params:
        out.params.add(param_id=p.id, value=encode_int(call.params[p.name], p.bitwidth))


def decode_action(p4info: P4Info, pb: Any) -> ActionCall:
    """ActionCall of a ``p4.v1.Action``: every parameter present once, values within their widths."""
    action = p4info.action(int(pb.action_id))
    params: dict[str, int] = {}
    for p in pb.params:
        info = action.param(int(p.param_id))
        if info.name in params:
            raise CodecError(f"action {action.name}: parameter {info.name} given twice")
        params[info.name] = _decode(p.value, info.bitwidth, f"action {action.name} parameter {info.name}")
    _check_params(action, params)
    return ActionCall(action.name, params)


# ---------------------------------------------------------------------------------------------
# Table entries
# ---------------------------------------------------------------------------------------------


def encode_counter_data(value: CounterValue, out: Any) -> None:
    """Fill a ``p4.v1.CounterData``."""
    out.packet_count = value.packets
    out.byte_count = value.bytes


def decode_counter_data(pb: Any) -> CounterValue:
    """CounterValue of a ``p4.v1.CounterData``."""
    return CounterValue(int(pb.packet_count), int(pb.byte_count))


def encode_entry_key(table: TableInfo, match: Mapping[str, FieldMatch], priority: int, out: Any) -> None:
    """Fill what identifies an entry in a ``p4.v1.TableEntry``: table id, match, priority (DELETE, reads)."""
    out.table_id = table.id
    encode_match(table, match, out.match)
    out.priority = priority


def encode_table_entry(p4info: P4Info, table: TableInfo, entry: TableEntry, out: Any,
                       with_counter: bool = False) -> None:
    """Fill a ``p4.v1.TableEntry``; ``with_counter`` adds the direct counter when the table has one."""
    encode_entry_key(table, entry.match, entry.priority, out)
    encode_action(p4info, entry.action, out.action.action)
    out.controller_metadata = entry.controller_metadata
    out.metadata = entry.metadata
    out.idle_timeout_ns = entry.idle_timeout_ns
    if with_counter and table.direct_resource_ids:
        encode_counter_data(CounterValue(entry.packets, entry.bytes), out.counter_data)


def encode_default_entry(p4info: P4Info, table: TableInfo, call: ActionCall | None, out: Any,
                         counter: CounterValue | None = None) -> None:
    """Fill a default-entry ``p4.v1.TableEntry``; ``call`` None (MODIFY) resets the initial default."""
    out.table_id = table.id
    out.is_default_action = True
    if call is not None:
        encode_action(p4info, call, out.action.action)
    if counter is not None:
        encode_counter_data(counter, out.counter_data)


def decode_entry_key(p4info: P4Info, pb: Any,
                     require_exact: bool = True) -> tuple[TableInfo, dict[str, FieldMatch], int]:
    """(table, match, priority): what identifies the entry of a ``p4.v1.TableEntry`` (no action needed)."""
    table = p4info.table(int(pb.table_id))
    return table, decode_match(table, pb.match, require_exact=require_exact), int(pb.priority)


def decode_table_entry(p4info: P4Info, pb: Any, require_exact: bool = True) -> tuple[TableInfo, TableEntry]:
    """Table and entry of a ``p4.v1.TableEntry`` with a direct action (as a switch returns it)."""
    table, match, _ = decode_entry_key(p4info, pb, require_exact)
    which = pb.action.WhichOneof("type")
    if which != "action":
        raise CodecError(f"table {table.name}: {which or 'no'} action; only direct actions are supported")
    return table, table_entry_of(pb, match, decode_action(p4info, pb.action.action))


def table_entry_of(pb: Any, match: dict[str, FieldMatch], call: ActionCall) -> TableEntry:
    """The entry a ``p4.v1.TableEntry`` describes, its match and action decoded already."""
    entry = TableEntry(match, call, int(pb.priority), int(pb.controller_metadata), bytes(pb.metadata),
                       int(pb.idle_timeout_ns))
    if pb.HasField("counter_data"):
        value = decode_counter_data(pb.counter_data)
        entry.packets, entry.bytes = value.packets, value.bytes
    return entry


# ---------------------------------------------------------------------------------------------
# Counter entries
# ---------------------------------------------------------------------------------------------


def encode_counter_entry(info: CounterInfo, index: int | None, value: CounterValue | None, out: Any) -> None:
    """Fill a ``p4.v1.CounterEntry``: one cell (``index``) or all (None, a read), with data if given."""
    out.counter_id = info.id
    if index is not None:
        out.index.index = index
    if value is not None:
        encode_counter_data(value, out.data)


def decode_counter_entry(p4info: P4Info, pb: Any) -> tuple[CounterInfo, int | None, CounterValue]:
    """(counter, index or None for a wildcard, data) of a ``p4.v1.CounterEntry``."""
    info = p4info.counter(int(pb.counter_id))
    index = int(pb.index.index) if pb.HasField("index") else None
    return info, index, decode_counter_data(pb.data)


# ---------------------------------------------------------------------------------------------
# Digests
# ---------------------------------------------------------------------------------------------


def encode_digest_entry(info: DigestInfo, config: DigestConfig | None, out: Any) -> None:
    """Fill a ``p4.v1.DigestEntry`` (no config: a read or a DELETE)."""
    out.digest_id = info.id
    if config is not None:
        out.config.max_timeout_ns = config.max_timeout_ns
        out.config.max_list_size = config.max_list_size
        out.config.ack_timeout_ns = config.ack_timeout_ns


def decode_digest_entry(p4info: P4Info, pb: Any) -> tuple[DigestInfo, DigestConfig]:
    """(digest, config) of a ``p4.v1.DigestEntry``."""
    c = pb.config
    return p4info.digest(int(pb.digest_id)), DigestConfig(int(c.max_timeout_ns), int(c.max_list_size),
                                                          int(c.ack_timeout_ns))


def encode_digest_list(info: DigestInfo, list_id: int, data: Iterable[Sequence[int]], timestamp_ns: int,
                       out: Any) -> None:
    """Fill a ``p4.v1.DigestList``: each item's struct members in declaration order."""
    out.digest_id = info.id
    out.list_id = list_id
    out.timestamp = timestamp_ns
    for values in data:
        if len(values) != len(info.members):
            raise CodecError(f"digest {info.name}: {len(info.members)} members expected, got {len(values)}")
        members = out.data.add().struct.members
        for (_, width), v in zip(info.members, values, strict=True):
            members.add().bitstring = encode_int(v, width)


def decode_digest_list(p4info: P4Info, pb: Any) -> tuple[DigestInfo, list[dict[str, int]]]:
    """(digest, items as member name -> value) of a ``p4.v1.DigestList``."""
    info = p4info.digest(int(pb.digest_id))
    items = []
    for data in pb.data:
        members = data.struct.members
        if len(members) != len(info.members):
            raise CodecError(f"digest {info.name}: {len(info.members)} members expected, got {len(members)}")
        items.append({name: _decode(m.bitstring, width, f"digest {info.name} member {name}")
                      for (name, width), m in zip(info.members, members, strict=True)})
    return info, items


# ---------------------------------------------------------------------------------------------
# Multicast groups (packet replication engine)
# ---------------------------------------------------------------------------------------------


def encode_multicast_group(group_id: int, replicas: Iterable[tuple[int, int]], out: Any) -> None:
    """Fill a ``p4.v1.PacketReplicationEngineEntry`` with a multicast group of (port, rid) replicas."""
    g = out.multicast_group_entry
    g.multicast_group_id = group_id
    for port, rid in replicas:
        g.replicas.add(egress_port=port, instance=rid)


def decode_multicast_group(pb: Any) -> tuple[int, tuple[Replica, ...]]:
    """(group id, replicas) of a ``p4.v1.PacketReplicationEngineEntry`` holding a multicast group."""
    which = pb.WhichOneof("type")
    if which != "multicast_group_entry":
        raise CodecError(f"{which or 'empty'} PRE entries are not supported (multicast groups only)")
    g = pb.multicast_group_entry
    replicas = []
    for r in g.replicas:
        # P4Runtime 1.4 adds a bytestring `port`; `egress_port` is the 32-bit original.
        port = _decode(r.port, 32, "replica port") if r.WhichOneof("port_kind") == "port" else int(r.egress_port)
        replicas.append(Replica(port, int(r.instance)))
    return int(g.multicast_group_id), tuple(replicas)


# ---------------------------------------------------------------------------------------------
# Packet-in / packet-out metadata
# ---------------------------------------------------------------------------------------------


def encode_packet_metadata(p4info: P4Info, header: str, values: Mapping[str, int], out: Any) -> None:
    """Append ``p4.v1.PacketMetadata`` for ``values`` (field name -> value) of controller header ``header``."""
    if not values:
        return
    info = packet_header(p4info, header)
    if info is None:
        raise P4InfoError(f"P4Info has no {header} controller header")
    fields = {name: (fid, width) for fid, name, width in info.metadata}
    for name, value in values.items():
        if name not in fields:
            raise P4InfoError(f"{header} has no field {name!r} (fields: {', '.join(fields)})")
        fid, width = fields[name]
        out.add(metadata_id=fid, value=encode_int(value, width))


def decode_packet_metadata(p4info: P4Info, header: str, pbs: Iterable[Any]) -> dict[str, int]:
    """Field name -> value of ``p4.v1.PacketMetadata`` of ``header``; an unknown id is a CodecError."""
    info = packet_header(p4info, header)
    fields = {fid: (name, width) for fid, name, width in info.metadata} if info else {}
    out: dict[str, int] = {}
    for m in pbs:
        if int(m.metadata_id) not in fields:
            raise CodecError(f"unknown packet metadata id {m.metadata_id}")
        name, width = fields[int(m.metadata_id)]
        out[name] = _decode(m.value, width, f"packet metadata {name}")
    return out


def packet_header(p4info: P4Info, name: str) -> PacketMetadataInfo | None:
    """The controller header ``name`` (``packet_in`` or ``packet_out``) of the P4Info, or None."""
    found = [h for h in p4info.packet_metadata_headers if h.name == name]
    return found[0] if found else None
