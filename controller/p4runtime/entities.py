"""What the driver sends, receives and keeps, by P4Info names: entries, digests, packet-ins, updates.

An :class:`Entry` is addressed by names and plain values; the codec
(:mod:`kvpool.p4rt.codec`) encodes it to the widths the P4Info gives. ``_Intended`` is the
state a resync makes the switch match.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from p4.v1 import p4runtime_pb2

from kvpool.p4rt import codec
from kvpool.p4rt.codec import DigestConfig, EntryKey, MatchValue, Value

#: Update type number -> its name (INSERT, MODIFY, DELETE), for error texts.
UPDATE_NAMES = {v: k for k, v in p4runtime_pb2.Update.Type.items()}


@dataclass(frozen=True)
class Entry:
    """A table entry by names: table, match field -> value, action and its parameters, priority."""

    table: str
    match: Mapping[str, MatchValue]
    action: str = ""
    params: Mapping[str, Value] = field(default_factory=dict)
    priority: int = 0

    def describe(self) -> str:
        """One-line text form for error messages."""
        match = codec.describe_match(self.match)
        return f"{self.table} {{{match}}}" + (f" prio {self.priority}" if self.priority else "")


@dataclass(frozen=True)
class Digest:
    """One DigestList from the switch: digest name, list id and the items (member name -> value)."""

    name: str
    list_id: int
    items: list[dict[str, int]]
    timestamp_ns: int


@dataclass(frozen=True)
class PacketIn:
    """A packet sent to the controller, with its ``packet_in`` header fields by name."""

    payload: bytes
    metadata: dict[str, int]


# Normalized, hashable identity of a table entry: (table, the codec's entry key).
_Key = tuple[str, EntryKey]


@dataclass(frozen=True)
class _Update:
    """One update to send: its type, how to fill a p4.v1.Update in place, a text for errors.

    Filling in place avoids a copy per update: the protobuf runtime here is the pure-Python
    one (protobuf < 3.21 has no C++ wheel for Python 3.11), where copies dominate batch cost.
    """

    type: int
    fill: Callable[[Any], None]
    desc: str


def _prebuilt(update: Any, desc: str) -> _Update:
    return _Update(int(update.type), lambda target: target.CopyFrom(update), desc)


@dataclass
class _Intended:
    """What the controller wants on the switch; replayed after a reconnect."""

    entries: dict[_Key, Entry] = field(default_factory=dict)
    defaults: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    groups: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    digests: dict[str, DigestConfig] = field(default_factory=dict)
