"""Headers, metadata, parser and deparser of the kvpool program (p4/include/headers.p4, parser.p4, deparser.p4).

The parsed packet keeps the P4 program's header validity: ``None`` is an invalid header.
``parse`` is ``MyParser`` and :meth:`Packet.deparse` is ``MyDeparser``; :class:`Meta` is
``metadata_t`` plus the ``standard_metadata_t`` fields the program reads and writes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from kvpool import wire
from kvpool.contract import (
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    FRAG_PAYLOAD,
    IPPROTO_UDP,
    KV_HEADER_BYTES,
    KV_UDP_LEN_DATA,
    KVPOOL_UDP_PORT,
    OP_DATA,
    OP_GET,
    SLICE_BYTES,
    SLICES_PER_FRAGMENT,
)

# --------------------------------------------------------------------------------------------
# Headers (headers.p4) and the parsed packet
# --------------------------------------------------------------------------------------------

_ETH: Final = struct.Struct("!6s6sH")
_IPV4: Final = struct.Struct("!BBHHHBBHII")
_UDP: Final = struct.Struct("!HHHH")
_KV: Final = wire.HEADER_STRUCT
_ARP_LEN: Final = 28
ARP_TPA: Final = struct.Struct("!I")
"""``arp_t.tpa`` (the only ARP field the program reads), at byte 24 of the ARP header."""


@dataclass(slots=True)
class Ipv4:
    """``ipv4_t``; ``flags`` and ``frag_offset`` are the 3- and 13-bit fields."""

    version: int
    ihl: int
    diffserv: int
    total_len: int
    identification: int
    flags: int
    frag_offset: int
    ttl: int
    protocol: int
    checksum: int
    src: int
    dst: int

    def pack(self) -> bytes:
        """The 20 header bytes."""
        return _IPV4.pack((self.version << 4) | self.ihl, self.diffserv, self.total_len, self.identification,
                          (self.flags << 13) | self.frag_offset, self.ttl, self.protocol, self.checksum,
                          self.src, self.dst)

    def copy(self) -> Ipv4:
        """An independent copy (multicast replicas own their headers)."""
        return Ipv4(self.version, self.ihl, self.diffserv, self.total_len, self.identification, self.flags,
                    self.frag_offset, self.ttl, self.protocol, self.checksum, self.src, self.dst)


@dataclass(slots=True)
class Kv:
    """``kvpool_t``: the 40-byte kvpool header, fields in wire order."""

    version: int
    opcode: int
    flags: int
    chunk_key: int
    frag_index: int
    frag_count: int
    request_id: int
    generation: int
    payload_len: int
    status: int
    chunk_len: int
    check: int

    def pack(self) -> bytes:
        """The 40 header bytes."""
        return _KV.pack(self.version, self.opcode, self.flags, self.chunk_key, self.frag_index, self.frag_count,
                        self.request_id, self.generation, self.payload_len, self.status, self.chunk_len,
                        self.check)

    def copy(self) -> Kv:
        """An independent copy."""
        return Kv(self.version, self.opcode, self.flags, self.chunk_key, self.frag_index, self.frag_count,
                  self.request_id, self.generation, self.payload_len, self.status, self.chunk_len, self.check)


@dataclass(slots=True)
class Packet:
    """``headers_t`` plus the unparsed rest of the frame; ``None`` means the header is invalid.

    Ethernet is kept as (dst, src, type) ints, ARP as raw bytes (only ``tpa`` is read and
    ARP is never rewritten), UDP as a 4-item list, payload slices as 128-byte strings.
    """

    eth_dst: int = 0
    eth_src: int = 0
    eth_type: int = 0
    eth_valid: bool = False
    arp: bytes | None = None
    ipv4: Ipv4 | None = None
    udp: list[int] | None = None
    kv: Kv | None = None
    payload: list[bytes] | None = None
    rest: bytes = b""
    parser_error: bool = False

    def copy(self) -> Packet:
        """A replica: same field values, independently writable."""
        return Packet(self.eth_dst, self.eth_src, self.eth_type, self.eth_valid, self.arp,
                      self.ipv4.copy() if self.ipv4 else None, list(self.udp) if self.udp else None,
                      self.kv.copy() if self.kv else None, list(self.payload) if self.payload else None,
                      self.rest, self.parser_error)

    def deparse(self) -> bytes:
        """``MyDeparser``: valid headers in wire order, then the unparsed bytes."""
        parts: list[bytes] = []
        if self.eth_valid:
            parts.append(_ETH.pack(self.eth_dst.to_bytes(6, "big"), self.eth_src.to_bytes(6, "big"),
                                   self.eth_type))
        if self.arp is not None:
            parts.append(self.arp)
        if self.ipv4 is not None:
            parts.append(self.ipv4.pack())
        if self.udp is not None:
            parts.append(_UDP.pack(*self.udp))
        if self.kv is not None:
            parts.append(self.kv.pack())
        if self.payload is not None:
            parts.extend(self.payload)
        parts.append(self.rest)
        return b"".join(parts)


def parse(frame: bytes) -> Packet:
    """``MyParser`` (p4/include/parser.p4): Ethernet / (ARP | IPv4 / UDP / kvpool / 11 slices).

    A frame too short for a header that the parser extracts ends with ``parser_error``
    set and that header (and the ones after it) invalid, as BMv2 does.
    """
    pkt = Packet()
    n = len(frame)
    if n < 14:
        pkt.parser_error = True
        pkt.rest = frame
        return pkt
    dst, src, etype = _ETH.unpack_from(frame, 0)
    pkt.eth_dst, pkt.eth_src, pkt.eth_type, pkt.eth_valid = int.from_bytes(dst, "big"), int.from_bytes(
        src, "big"), etype, True
    off = 14
    if etype == ETHERTYPE_ARP:
        if n < off + _ARP_LEN:
            pkt.parser_error = True
        else:
            pkt.arp = frame[off:off + _ARP_LEN]
            off += _ARP_LEN
        pkt.rest = frame[off:]
        return pkt
    if etype != ETHERTYPE_IPV4:
        pkt.rest = frame[off:]
        return pkt
    if n < off + 20:
        pkt.parser_error = True
        pkt.rest = frame[off:]
        return pkt
    vi, tos, tlen, ident, ff, ttl, proto, csum, s, d = _IPV4.unpack_from(frame, off)
    ip = Ipv4(vi >> 4, vi & 0xF, tos, tlen, ident, ff >> 13, ff & 0x1FFF, ttl, proto, csum, s, d)
    pkt.ipv4 = ip
    off += 20
    # Options and fragments are forwarded untouched, never read as kvpool.
    if not (ip.ihl == 5 and ip.frag_offset == 0 and proto == IPPROTO_UDP):
        pkt.rest = frame[off:]
        return pkt
    if n < off + 8:
        pkt.parser_error = True
        pkt.rest = frame[off:]
        return pkt
    udp = list(_UDP.unpack_from(frame, off))
    pkt.udp = udp
    off += 8
    if udp[1] != KVPOOL_UDP_PORT and udp[0] != KVPOOL_UDP_PORT:
        pkt.rest = frame[off:]
        return pkt
    if n < off + KV_HEADER_BYTES:
        pkt.parser_error = True
        pkt.rest = frame[off:]
        return pkt
    pkt.kv = Kv(*_KV.unpack_from(frame, off))
    off += KV_HEADER_BYTES
    # DATA always has its payload; a GET whose UDP length is a DATA's carries reply room.
    if pkt.kv.opcode == OP_DATA or (pkt.kv.opcode == OP_GET and udp[2] == KV_UDP_LEN_DATA):
        # Eleven fixed extracts; less than 1408 bytes fails on the first slice that does
        # not fit (the ones before it stay valid, but ingress drops the packet anyway).
        if n < off + FRAG_PAYLOAD:
            pkt.parser_error = True
            full = (n - off) // SLICE_BYTES
            pkt.payload = [frame[off + i * SLICE_BYTES:off + (i + 1) * SLICE_BYTES] for i in range(full)]
            off += full * SLICE_BYTES
        else:
            pkt.payload = [frame[off + i * SLICE_BYTES:off + (i + 1) * SLICE_BYTES] for i in range(SLICES_PER_FRAGMENT)]
            off += FRAG_PAYLOAD
    pkt.rest = frame[off:]
    return pkt


# --------------------------------------------------------------------------------------------
# Metadata (metadata_t of headers.p4 + the standard_metadata fields the program reads)
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Meta:
    """``metadata_t`` and ``standard_metadata_t``; every field starts at 0 as in BMv2."""

    drop_reason: int = 0
    is_writer: int = 0
    from_fabric: int = 0
    served: int = 0
    flood: int = 0
    pool_found: int = 0
    base_slot: int = 0
    pool_frag_count: int = 0
    pool_chunk_len: int = 0
    pool_generation: int = 0
    pool_state: int = 0
    pool_placement: int = 0
    waiter_addr: int = 0
    has_waiter: int = 0
    waiter_id: int = 0
    pending_idx: int = 0
    record_reply: int = 0
    absorb: int = 0
    release: int = 0
    release_mask: int = 0
    release_dst: int = 0
    # standard_metadata
    ingress_port: int = 0
    egress_spec: int = 0
    egress_port: int = 0
    egress_rid: int = 0
    mcast_grp: int = 0
    ingress_timestamp: int = 0
    packet_length: int = 0
    # control-local state that lives for one packet (set by keyless config tables)
    hot_threshold: int = 0
    cur_epoch: int = 0
    pending_timeout: int = 0

    def copy(self) -> Meta:
        """A replica's copy of user and standard metadata (BMv2 copies the whole PHV).

        Every field by position, as ``Kv.copy``: ``dataclasses.replace`` cost an eighth of
        the model's time on a release to eight waiters (one copy per replica).
        """
        return Meta(self.drop_reason, self.is_writer, self.from_fabric, self.served, self.flood, self.pool_found,
                    self.base_slot, self.pool_frag_count, self.pool_chunk_len, self.pool_generation, self.pool_state,
                    self.pool_placement, self.waiter_addr, self.has_waiter, self.waiter_id, self.pending_idx,
                    self.record_reply, self.absorb, self.release, self.release_mask, self.release_dst,
                    self.ingress_port, self.egress_spec, self.egress_port, self.egress_rid,
                    self.mcast_grp, self.ingress_timestamp, self.packet_length, self.hot_threshold, self.cur_epoch,
                    self.pending_timeout)
