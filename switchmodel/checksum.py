"""Internet checksums for the frames the model reads and writes (p4/include/checksum.p4 and the ports).

Two jobs: the IPv4 header checksum the program verifies and recomputes
(``MyVerifyChecksum`` / ``MyComputeChecksum``: v1model ``verify_checksum`` and
``update_checksum`` with ``csum16``, :func:`ipv4_csum16`), and completing UDP/TCP
checksums that the sending kernel left for hardware.  A veth with TX checksum offload on hands a frame
to an AF_PACKET reader with ``CHECKSUM_PARTIAL``: the L4 checksum field holds only
the pseudo-header sum.  BMv2 forwards such frames untouched and the receiver drops
them silently (the trap DESIGN.md describes); the model completes them instead, when
the kernel flags the frame as ``TP_STATUS_CSUMNOTREADY``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final

from kvpool.contract import ETHERTYPE_IPV4, IPPROTO_UDP

if TYPE_CHECKING:
    from switchmodel.parser import Ipv4

IPPROTO_TCP: Final = 6
_TCP_CSUM_OFFSET: Final = 16
_UDP_CSUM_OFFSET: Final = 6


def ones_sum(data: bytes | bytearray | memoryview) -> int:
    """Ones' complement sum of big-endian 16-bit words (odd tail zero padded), folded to 16 bits."""
    buf = bytes(data)
    if len(buf) % 2:
        buf += b"\x00"
    total = int(sum(struct.unpack(f"!{len(buf) // 2}H", buf)))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def ipv4_header_checksum(header: bytes | bytearray | memoryview) -> int:
    """Checksum of an IPv4 header, computed with its checksum field taken as zero."""
    hdr = bytearray(header)
    hdr[10:12] = b"\x00\x00"
    return ~ones_sum(hdr) & 0xFFFF


def l4_checksum(src: bytes, dst: bytes, proto: int, segment: bytes | bytearray | memoryview) -> int:
    """UDP/TCP checksum of ``segment`` (checksum field zeroed) under the IPv4 pseudo-header."""
    seg = bytearray(segment)
    off = _UDP_CSUM_OFFSET if proto == IPPROTO_UDP else _TCP_CSUM_OFFSET
    seg[off:off + 2] = b"\x00\x00"
    pseudo = src + dst + struct.pack("!BBH", 0, proto, len(seg))
    value = ~ones_sum(pseudo + bytes(seg)) & 0xFFFF
    # UDP sends a computed zero as 0xFFFF because 0 means "no checksum".
    if proto == IPPROTO_UDP and value == 0:
        value = 0xFFFF
    return value


def complete_l4_checksum(frame: bytes) -> bytes:
    """Return ``frame`` with its IPv4 UDP/TCP checksum filled in; other frames come back unchanged.

    Used only on frames the kernel marked checksum-not-ready, whose L4 checksum field
    holds a partial sum rather than the real checksum.
    """
    if len(frame) < 34 or int.from_bytes(frame[12:14], "big") != ETHERTYPE_IPV4:
        return frame
    ihl = (frame[14] & 0x0F) * 4
    total_len = int.from_bytes(frame[16:18], "big")
    proto = frame[23]
    if proto not in (IPPROTO_UDP, IPPROTO_TCP) or ihl < 20:
        return frame
    l4_start = 14 + ihl
    l4_end = min(len(frame), 14 + total_len)
    off = _UDP_CSUM_OFFSET if proto == IPPROTO_UDP else _TCP_CSUM_OFFSET
    if l4_end - l4_start < off + 2:
        return frame
    out = bytearray(frame)
    csum = l4_checksum(bytes(frame[26:30]), bytes(frame[30:34]), proto, out[l4_start:l4_end])
    out[l4_start + off:l4_start + off + 2] = csum.to_bytes(2, "big")
    return bytes(out)


def ipv4_csum16(ip: Ipv4) -> int:
    """csum16 over the IPv4 header fields except the checksum (``MyVerifyChecksum`` field list).

    Summed from the field values, without packing bytes: the same ones' complement sum
    as :func:`ipv4_header_checksum` on the packed header.
    """
    total = (((ip.version << 12) | (ip.ihl << 8) | ip.diffserv) + ip.total_len + ip.identification
             + ((ip.flags << 13) | ip.frag_offset) + ((ip.ttl << 8) | ip.protocol)
             + (ip.src >> 16) + (ip.src & 0xFFFF) + (ip.dst >> 16) + (ip.dst & 0xFFFF))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
