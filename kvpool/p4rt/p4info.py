"""P4Info reader shared by the switch model and the controller's driver.

Loads a P4Info (protobuf text or binary) and maps names to ids and back for every entity
the kvpool program uses. Callers use names only; ids stay inside this module, the codec
(:mod:`kvpool.p4rt.codec`, which turns names and values into P4Runtime messages and back)
and the wire.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

#: ActionRef scopes, as named in P4Info.
SCOPE_TABLE_AND_DEFAULT = "TABLE_AND_DEFAULT"
SCOPE_TABLE_ONLY = "TABLE_ONLY"
SCOPE_DEFAULT_ONLY = "DEFAULT_ONLY"

#: Match kinds that make a table need an entry priority (P4Runtime spec, TableEntry.priority).
PRIORITY_MATCH_KINDS = frozenset({"ternary", "range", "optional"})

#: Architectures whose compiler (bf-p4c) puts the pipeline's name in front of table and action
#: names (``pipe.MyIngress.pool.pool_lookup``); lookups also answer to the name without it.
PIPE_PREFIXED_ARCHS = frozenset({"tna", "t2na"})


class P4InfoError(KeyError):
    """A name or id that the loaded P4Info does not define (message lists the known names)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "P4Info lookup failed"


# ---------------------------------------------------------------------------------------------
# P4Info entities
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatchFieldInfo:
    """One match field of a table: id, qualified name, width and match kind (``exact``, ``lpm``...)."""

    id: int
    name: str
    bitwidth: int
    match_type: str


@dataclass(frozen=True)
class ParamInfo:
    """One action parameter: id, name and width."""

    id: int
    name: str
    bitwidth: int


@dataclass(frozen=True)
class ActionInfo:
    """An action and its parameters, in declaration order."""

    id: int
    name: str
    alias: str
    params: tuple[ParamInfo, ...]
    _by_name: dict[str, ParamInfo] = field(default_factory=dict, compare=False, repr=False)
    _by_id: dict[int, ParamInfo] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.params})
        self._by_id.update({p.id: p for p in self.params})

    def param(self, key: str | int) -> ParamInfo:
        """The parameter with this name or id."""
        found = self._by_id.get(key) if isinstance(key, int) else self._by_name.get(key)
        if found is None:
            known = ", ".join(p.name for p in self.params) or "none"
            raise P4InfoError(f"action {self.name} has no parameter {key!r} (parameters: {known})")
        return found


@dataclass(frozen=True)
class ActionRefInfo:
    """An action a table may use, and where (``TABLE_AND_DEFAULT``, ``TABLE_ONLY``, ``DEFAULT_ONLY``)."""

    action_id: int
    scope: str


@dataclass(frozen=True)
class TableInfo:
    """A table: key fields in P4Info order, allowed actions, size and properties."""

    id: int
    name: str
    alias: str
    match_fields: tuple[MatchFieldInfo, ...]
    action_refs: tuple[ActionRefInfo, ...]
    size: int
    const_default_action_id: int
    is_const_table: bool
    direct_resource_ids: tuple[int, ...]
    initial_default_action_id: int
    initial_default_args: tuple[tuple[int, bytes], ...]
    _by_name: dict[str, MatchFieldInfo] = field(default_factory=dict, compare=False, repr=False)
    _by_id: dict[int, MatchFieldInfo] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({f.name: f for f in self.match_fields})
        self._by_id.update({f.id: f for f in self.match_fields})

    def match_field(self, key: str | int) -> MatchFieldInfo:
        """The match field with this name or id."""
        found = self._by_id.get(key) if isinstance(key, int) else self._by_name.get(key)
        if found is None:
            known = ", ".join(f.name for f in self.match_fields) or "none (keyless table)"
            raise P4InfoError(f"table {self.name} has no match field {key!r} (fields: {known})")
        return found

    @property
    def needs_priority(self) -> bool:
        """True when entries need a priority (a ternary, range or optional key field)."""
        return any(f.match_type in PRIORITY_MATCH_KINDS for f in self.match_fields)

    def action_scope(self, action_id: int) -> str | None:
        """Scope of the action in this table, or None when the table does not list it."""
        for ref in self.action_refs:
            if ref.action_id == action_id:
                return ref.scope
        return None


@dataclass(frozen=True)
class CounterInfo:
    """An indexed counter array: unit (``BYTES``, ``PACKETS``, ``BOTH``) and size."""

    id: int
    name: str
    alias: str
    unit: str
    size: int


@dataclass(frozen=True)
class DirectCounterInfo:
    """A direct counter attached to one table."""

    id: int
    name: str
    alias: str
    unit: str
    table_id: int


@dataclass(frozen=True)
class RegisterInfo:
    """A register array: size and cell width in bits."""

    id: int
    name: str
    alias: str
    size: int
    bitwidth: int


@dataclass(frozen=True)
class DigestInfo:
    """A digest: the struct it carries, as (member name, width) in declaration order."""

    id: int
    name: str
    alias: str
    type_name: str
    members: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class PacketMetadataInfo:
    """A controller packet header (``packet_in``/``packet_out``): its fields as (id, name, width)."""

    id: int
    name: str
    alias: str
    metadata: tuple[tuple[int, str, int], ...]


_E = TypeVar("_E")


class _Registry(dict[str | int, _E]):
    """Entities of one kind, reachable by id, qualified name or alias."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.names: list[str] = []

    def add(self, ident: int, name: str, alias: str, entity: _E) -> None:
        self[ident] = entity
        self[name] = entity
        if alias and alias not in self:
            self[alias] = entity
        self.names.append(name)

    def add_unprefixed(self, prefix: str) -> None:
        """Make every entity named ``prefix + rest`` reachable as ``rest`` too (unless taken)."""
        for name in self.names:
            if name.startswith(prefix) and name[len(prefix):] not in self:
                self[name[len(prefix):]] = self[name]

    def get_entity(self, key: str | int) -> _E:
        try:
            return self[key]
        except KeyError:
            known = ", ".join(sorted(self.names)) or "none"
            raise P4InfoError(f"P4Info has no {self.kind} {key!r} (known: {known})") from None


def pipe_prefix(msg: Any) -> str:
    """``"<pipe>."`` when a TNA P4Info names every table inside one pipeline, else ``""``."""
    if str(msg.pkg_info.arch).lower() not in PIPE_PREFIXED_ARCHS or not msg.tables:
        return ""
    heads = {str(t.preamble.name).split(".", 1)[0] for t in msg.tables}
    if len(heads) != 1 or any(str(t.preamble.name).count(".") < 2 for t in msg.tables):
        return ""
    return heads.pop() + "."


def _bitwidth_of(spec: Any, structs: Any = None) -> int:
    """Width of a P4DataTypeSpec that is a bit<W>, int<W>, bool, or a struct of those (given
    ``structs``, the P4Info's type_info.structs: a TNA register cell such as a pair of halves)."""
    which = spec.WhichOneof("type_spec")
    if which == "struct" and structs is not None and spec.struct.name in structs:
        return sum(_bitwidth_of(m.type_spec, structs) for m in structs[spec.struct.name].members)
    if which == "bitstring":
        kind = spec.bitstring.WhichOneof("type_spec")
        if kind == "bit":
            return int(spec.bitstring.bit.bitwidth)
        if kind == "int":
            return int(spec.bitstring.int.bitwidth)
        raise ValueError(f"unsupported bitstring kind {kind}")
    if which == "bool":
        return 1
    raise ValueError(f"unsupported P4 type {which}")


class P4Info:
    """A parsed P4Info with name/id lookups for tables, actions, counters, registers and digests."""

    def __init__(self, message: Any) -> None:
        self.message: Any = message
        self._tables: _Registry[TableInfo] = _Registry("table")
        self._actions: _Registry[ActionInfo] = _Registry("action")
        self._counters: _Registry[CounterInfo] = _Registry("counter")
        self._direct_counters: _Registry[DirectCounterInfo] = _Registry("direct counter")
        self._registers: _Registry[RegisterInfo] = _Registry("register")
        self._digests: _Registry[DigestInfo] = _Registry("digest")
        self._packet_metadata: _Registry[PacketMetadataInfo] = _Registry("controller packet metadata")
        self.pipe_prefix = ""
        """``"pipe."`` for a TNA P4Info whose names carry the pipeline's (see :func:`pipe_prefix`)."""
        self._build(message)

    # --- loading -------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> P4Info:
        """Load a P4Info file: protobuf text (``.txt``, ``.txtpb``, ``.pb.txt``) or binary."""
        data = Path(path).read_bytes()
        message = p4info_pb2.P4Info()
        try:
            text_format.Parse(data.decode("utf-8"), message)
        except (UnicodeDecodeError, text_format.ParseError) as text_error:
            message = p4info_pb2.P4Info()
            try:
                message.ParseFromString(data)
            except Exception:
                raise ValueError(f"{path}: neither P4Info text nor binary ({text_error})") from None
        return cls(message)

    @classmethod
    def from_text(cls, text: str) -> P4Info:
        """Parse P4Info protobuf text."""
        message = p4info_pb2.P4Info()
        text_format.Parse(text, message)
        return cls(message)

    def _build(self, msg: Any) -> None:
        for a in msg.actions:
            params = tuple(ParamInfo(int(p.id), str(p.name), int(p.bitwidth)) for p in a.params)
            self._actions.add(a.preamble.id, a.preamble.name, a.preamble.alias,
                              ActionInfo(int(a.preamble.id), str(a.preamble.name), str(a.preamble.alias), params))
        match_names = {v: k.lower() for k, v in p4info_pb2.MatchField.MatchType.items()}
        scope_names = {v: k for k, v in p4info_pb2.ActionRef.Scope.items()}
        for t in msg.tables:
            fields = tuple(
                MatchFieldInfo(int(f.id), str(f.name), int(f.bitwidth),
                               match_names.get(f.match_type, "unspecified") if f.HasField("match_type")
                               else str(f.other_match_type))
                for f in t.match_fields
            )
            refs = tuple(ActionRefInfo(int(r.id), scope_names.get(r.scope, SCOPE_TABLE_AND_DEFAULT))
                         for r in t.action_refs)
            init = t.initial_default_action
            info = TableInfo(
                id=int(t.preamble.id), name=str(t.preamble.name), alias=str(t.preamble.alias),
                match_fields=fields, action_refs=refs, size=int(t.size),
                const_default_action_id=int(t.const_default_action_id), is_const_table=bool(t.is_const_table),
                direct_resource_ids=tuple(int(i) for i in t.direct_resource_ids),
                initial_default_action_id=int(init.action_id),
                initial_default_args=tuple((int(a.param_id), bytes(a.value)) for a in init.arguments),
            )
            self._tables.add(info.id, info.name, info.alias, info)
        unit_names = {v: k for k, v in p4info_pb2.CounterSpec.Unit.items()}
        for c in msg.counters:
            self._counters.add(c.preamble.id, c.preamble.name, c.preamble.alias,
                               CounterInfo(int(c.preamble.id), str(c.preamble.name), str(c.preamble.alias),
                                           unit_names.get(c.spec.unit, "BOTH"), int(c.size)))
        for c in msg.direct_counters:
            self._direct_counters.add(
                c.preamble.id, c.preamble.name, c.preamble.alias,
                DirectCounterInfo(int(c.preamble.id), str(c.preamble.name), str(c.preamble.alias),
                                  unit_names.get(c.spec.unit, "BOTH"), int(c.direct_table_id)))
        structs = msg.type_info.structs
        for r in msg.registers:
            self._registers.add(r.preamble.id, r.preamble.name, r.preamble.alias,
                                RegisterInfo(int(r.preamble.id), str(r.preamble.name), str(r.preamble.alias),
                                             int(r.size), _bitwidth_of(r.type_spec, structs)))
        for d in msg.digests:
            members: tuple[tuple[str, int], ...]
            spec = d.type_spec
            if spec.WhichOneof("type_spec") == "struct":
                type_name = str(spec.struct.name)
                if type_name not in structs:
                    raise ValueError(f"digest {d.preamble.name}: struct {type_name} missing from type_info")
                members = tuple((str(m.name), _bitwidth_of(m.type_spec)) for m in structs[type_name].members)
            else:
                type_name = ""
                members = (("value", _bitwidth_of(spec)),)
            self._digests.add(d.preamble.id, d.preamble.name, d.preamble.alias,
                              DigestInfo(int(d.preamble.id), str(d.preamble.name), str(d.preamble.alias),
                                         type_name, members))
        for m in msg.controller_packet_metadata:
            meta = tuple((int(x.id), str(x.name), int(x.bitwidth)) for x in m.metadata)
            self._packet_metadata.add(m.preamble.id, m.preamble.name, m.preamble.alias,
                                      PacketMetadataInfo(int(m.preamble.id), str(m.preamble.name),
                                                         str(m.preamble.alias), meta))
        # One program, two compilers: the v1model names reach the TNA program's entities too.
        self.pipe_prefix = pipe_prefix(msg)
        if self.pipe_prefix:
            for registry in (self._tables, self._actions, self._counters, self._direct_counters,
                             self._registers, self._digests, self._packet_metadata):
                registry.add_unprefixed(self.pipe_prefix)

    # --- lookups -------------------------------------------------------------------------------

    def table(self, key: str | int) -> TableInfo:
        """Table by qualified name, alias or id."""
        return self._tables.get_entity(key)

    def action(self, key: str | int) -> ActionInfo:
        """Action by qualified name, alias or id."""
        return self._actions.get_entity(key)

    def counter(self, key: str | int) -> CounterInfo:
        """Indexed counter by qualified name, alias or id."""
        return self._counters.get_entity(key)

    def direct_counter(self, key: str | int) -> DirectCounterInfo:
        """Direct counter by qualified name, alias or id."""
        return self._direct_counters.get_entity(key)

    def register(self, key: str | int) -> RegisterInfo:
        """Register array by qualified name, alias or id."""
        return self._registers.get_entity(key)

    def digest(self, key: str | int) -> DigestInfo:
        """Digest by qualified name, alias or id."""
        return self._digests.get_entity(key)

    def packet_metadata(self, key: str | int) -> PacketMetadataInfo:
        """Controller packet metadata header (``packet_in``/``packet_out``) by name or id."""
        return self._packet_metadata.get_entity(key)

    def has(self, kind: str, key: str | int) -> bool:
        """True when an entity of ``kind`` (table, action, counter, ...) has this name or id."""
        registry = self._registry(kind)
        return key in registry

    def _registry(self, kind: str) -> _Registry[Any]:
        registries: dict[str, _Registry[Any]] = {
            "table": self._tables, "action": self._actions, "counter": self._counters,
            "direct_counter": self._direct_counters, "register": self._registers, "digest": self._digests,
            "packet_metadata": self._packet_metadata,
        }
        if kind not in registries:
            raise ValueError(f"unknown P4Info entity kind {kind!r} (kinds: {', '.join(registries)})")
        return registries[kind]

    def _unique(self, registry: _Registry[_E]) -> list[_E]:
        return [registry[n] for n in registry.names]

    @property
    def tables(self) -> list[TableInfo]:
        """Every table, in P4Info order."""
        return self._unique(self._tables)

    @property
    def actions(self) -> list[ActionInfo]:
        """Every action, in P4Info order."""
        return self._unique(self._actions)

    @property
    def counters(self) -> list[CounterInfo]:
        """Every indexed counter, in P4Info order."""
        return self._unique(self._counters)

    @property
    def direct_counters(self) -> list[DirectCounterInfo]:
        """Every direct counter, in P4Info order."""
        return self._unique(self._direct_counters)

    @property
    def registers(self) -> list[RegisterInfo]:
        """Every register array, in P4Info order."""
        return self._unique(self._registers)

    @property
    def digests(self) -> list[DigestInfo]:
        """Every digest, in P4Info order."""
        return self._unique(self._digests)

    @property
    def packet_metadata_headers(self) -> list[PacketMetadataInfo]:
        """Every controller packet metadata header, in P4Info order."""
        return self._unique(self._packet_metadata)

    def all_names(self) -> dict[str, set[str]]:
        """Qualified names per entity kind, e.g. ``{"table": {"MyIngress.fwd"}, ...}``."""
        return {kind: set(self._registry(kind).names)
                for kind in ("table", "action", "counter", "direct_counter", "register", "digest",
                             "packet_metadata")}

    def match_field_names(self, table: str | int) -> list[str]:
        """Names of a table's match fields in key order."""
        return [f.name for f in self.table(table).match_fields]


def names_missing(p4info: P4Info, wanted: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (kind, name) pairs of ``wanted`` that ``p4info`` does not define."""
    return [(kind, name) for kind, name in wanted if not p4info.has(kind, name)]
