"""A scapy layer for kvpool headers, built from ``kvpool.wire.FIELDS``.

For debugging, pcaps and packet tests only: the data path never builds scapy objects.
Importing this module binds the layer to UDP port ``KVPOOL_UDP_PORT`` in both directions.
"""

from __future__ import annotations

from scapy.fields import ByteEnumField, ByteField, Field, FlagsField, IntField, LongField, ShortEnumField, ShortField
from scapy.layers.inet import UDP
from scapy.packet import Packet, Raw, bind_layers

from kvpool import wire


def _field(f: wire.Field) -> Field:  # type: ignore[type-arg]
    """The scapy field for one wire field, with names for enumerated values."""
    default = wire.KVPOOL_VERSION if f.name == "version" else 0
    if f.name == "opcode":
        return ByteEnumField(f.name, int(wire.Opcode.GET), {int(o): o.name for o in wire.Opcode})
    if f.name == "status":
        return ShortEnumField(f.name, 0, {int(s): s.name for s in wire.Status})
    if f.name == "flags":
        names = [wire.Flag(1 << i).name or f"bit{i}" if (1 << i) & wire.KNOWN_FLAGS else f"bit{i}"
                 for i in range(16)]
        return FlagsField(f.name, 0, 16, names)
    if f.name == "frag_count":
        return ShortField(f.name, 1)
    return {8: ByteField, 16: ShortField, 32: IntField, 64: LongField}[f.bits](f.name, default)


class KvPool(Packet):  # type: ignore[misc]
    """The kvpool header; a DATA packet's fixed-size payload follows as ``Raw``."""

    name = "KvPool"
    fields_desc = [_field(f) for f in wire.FIELDS]

    def mysummary(self) -> str:
        """One line: opcode, key, fragment."""
        return self.sprintf("KvPool %opcode% key=%chunk_key% frag=%frag_index%/%frag_count%")


bind_layers(UDP, KvPool, dport=wire.KVPOOL_UDP_PORT)
bind_layers(UDP, KvPool, sport=wire.KVPOOL_UDP_PORT)
bind_layers(KvPool, Raw)

__all__ = ["KvPool"]
