"""The kvpool wire format: the one place that defines what a kvpool packet is.

Everything that builds or reads kvpool packets imports this module: the host agent's
data path (``struct`` / numpy views, no per-packet objects), the reference switch model,
the controller, the tests (through the scapy layer built from the same field table) and
the P4 constants, which a test checks against the values here.

A kvpool packet is ``Ethernet / IPv4 / UDP(dport or sport = KVPOOL_UDP_PORT) / header /
payload``.  The header is fixed-size, big-endian (network order)::

     0       1       2               4                               12
    +-------+-------+---------------+-------------------------------+
    |version|opcode |     flags     |           chunk_key           |
    +-------+-------+---------------+-------------------------------+
    12              14              16              20              24
    +---------------+---------------+---------------+---------------+
    |  frag_index   |  frag_count   |  request_id   |  generation   |
    +---------------+---------------+---------------+---------------+
    24              26              28                              32
    +---------------+---------------+-------------------------------+
    |  payload_len  |    status     |           chunk_len           |
    +---------------+---------------+-------------------------------+
    32                                                              40
    +---------------------------------------------------------------+
    |                             check                             |
    +---------------------------------------------------------------+

Opcodes: ``GET`` asks for a range of fragments (single-fragment GETs with *reply room* are
the only ones a switch can coalesce or serve); ``DATA`` is one fragment, its payload padded
to ``FRAG_PAYLOAD``; ``INVALIDATE`` announces a new generation; ``NACK`` answers a GET that
cannot be served and echoes it, so a switch that coalesced GETs can match it. ``check``
(DATA only) is the writer's xxh3-64 over the fragment's identity and valid payload: a
switch stores and returns it, every receiver recomputes it. ``request_id`` is the
requester's and echoed. Field by field, and why: docs/design/notes-wire.md.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
import xxhash

# --------------------------------------------------------------------------------------
# Constants (mirrored in p4/include/constants.p4; tests/kvpool/test_wire.py checks they agree)
# --------------------------------------------------------------------------------------

KVPOOL_VERSION: Final = 2
"""Header version this code speaks; anything else is dropped (2: the 40-byte header with ``check``)."""

KVPOOL_UDP_PORT: Final = 7470
"""UDP port of kvpool traffic (destination for requests, source for responses)."""

HEADER_LEN: Final = 40
"""Bytes in the kvpool header."""

SLICE_BYTES: Final = 128
"""Bytes in one switch register slice (``register<bit<1024>>`` on BMv2)."""

SLICES_PER_FRAGMENT: Final = 11
"""Register slices that make up one fragment payload in switch memory."""

FRAG_PAYLOAD: Final = SLICE_BYTES * SLICES_PER_FRAGMENT
"""Payload bytes of a DATA packet: 1408, so IPv4 + UDP + header + payload = 1476 <= 1500."""

IPV4_HEADER_LEN: Final = 20
UDP_HEADER_LEN: Final = 8
ETHERNET_HEADER_LEN: Final = 14
MTU: Final = 1500

DATA_DATAGRAM_LEN: Final = HEADER_LEN + FRAG_PAYLOAD
"""UDP payload length of every DATA packet."""

GET_WITH_ROOM_LEN: Final = DATA_DATAGRAM_LEN
"""UDP payload length of a GET that carries reply room (header + ``FRAG_PAYLOAD`` zero bytes)."""

MAX_FRAGMENTS: Final = 0xFFFF
"""Most fragments a chunk may have (``frag_count`` is 16 bits)."""

MAX_CHUNK_LEN: Final = MAX_FRAGMENTS * FRAG_PAYLOAD
"""Largest serialized chunk, in bytes (about 92 MB)."""

assert IPV4_HEADER_LEN + UDP_HEADER_LEN + DATA_DATAGRAM_LEN <= MTU


class Opcode(enum.IntEnum):
    """What a kvpool packet asks or carries."""

    GET = 1
    DATA = 2
    INVALIDATE = 3
    NACK = 4


class Flag(enum.IntFlag):
    """Header flag bits."""

    NONE = 0
    SWITCH_SERVED = 0x0001
    """Set by a switch on DATA it answered from its own memory."""
    RETRANSMIT = 0x0002
    """Set by a requester on a GET that re-asks for fragments it already asked for."""
    COALESCED = 0x0004
    """Set by a switch on DATA replicated to a waiter whose GET it absorbed.  On a GET (with
    RETRANSMIT): a requester that joined another's answer in a switch asks for what passed
    before it joined, and the holder may send it inside that answer (``hostagent.transport``)."""
    NO_CACHE = 0x0008
    """Set by a requester that wants the holder's copy, never the switch's."""


KNOWN_FLAGS: Final = int(Flag.SWITCH_SERVED | Flag.RETRANSMIT | Flag.COALESCED | Flag.NO_CACHE)


class Status(enum.IntEnum):
    """Why a NACK was sent (the ``status`` field); 0 on every other opcode."""

    OK = 0
    UNKNOWN_CHUNK = 1
    BAD_RANGE = 2
    STALE_GENERATION = 3
    STORE_ERROR = 4
    BUSY = 5


# --------------------------------------------------------------------------------------
# Field table: the single definition the struct format, numpy dtype and scapy layer use
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One header field: its name, width in bits and byte offset."""

    name: str
    bits: int
    offset: int

    @property
    def max(self) -> int:
        """Largest value the field can hold."""
        return (1 << self.bits) - 1


_STRUCT_CODES: Final = {8: "B", 16: "H", 32: "I", 64: "Q"}

FIELDS: Final[tuple[Field, ...]] = (
    Field("version", 8, 0),
    Field("opcode", 8, 1),
    Field("flags", 16, 2),
    Field("chunk_key", 64, 4),
    Field("frag_index", 16, 12),
    Field("frag_count", 16, 14),
    Field("request_id", 32, 16),
    Field("generation", 32, 20),
    Field("payload_len", 16, 24),
    Field("status", 16, 26),
    Field("chunk_len", 32, 28),
    Field("check", 64, 32),
)
FIELD_BY_NAME: Final = {f.name: f for f in FIELDS}

HEADER_STRUCT: Final = struct.Struct("!" + "".join(_STRUCT_CODES[f.bits] for f in FIELDS))
"""Precompiled struct for one header; ``pack_into`` writes into a caller's buffer."""

HEADER_DTYPE: Final = np.dtype(
    {
        "names": [f.name for f in FIELDS],
        "formats": [f">u{f.bits // 8}" for f in FIELDS],
        "offsets": [f.offset for f in FIELDS],
        "itemsize": HEADER_LEN,
    }
)
"""numpy view of headers, for building or parsing many packets at once."""

DATA_PACKET_DTYPE: Final = np.dtype(
    {
        "names": ["hdr", "payload"],
        "formats": [HEADER_DTYPE, (np.uint8, FRAG_PAYLOAD)],
        "offsets": [0, HEADER_LEN],
        "itemsize": DATA_DATAGRAM_LEN,
    }
)
"""numpy view of whole DATA datagrams (header + fixed payload) laid end to end."""

assert HEADER_STRUCT.size == HEADER_LEN == HEADER_DTYPE.itemsize
assert sum(f.bits for f in FIELDS) == HEADER_LEN * 8


# --------------------------------------------------------------------------------------
# One header at a time (control path, tests, the switch model)
# --------------------------------------------------------------------------------------


class WireError(ValueError):
    """A datagram that is not a valid kvpool packet; ``reason`` names the check it failed."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Header:
    """A decoded kvpool header (for control paths and tests, not the bulk data path)."""

    opcode: int
    chunk_key: int
    frag_index: int = 0
    frag_count: int = 1
    request_id: int = 0
    generation: int = 0
    payload_len: int = 0
    status: int = 0
    chunk_len: int = 0
    flags: int = 0
    version: int = KVPOOL_VERSION
    check: int = 0

    def pack(self) -> bytes:
        """Encode this header; raises ``WireError`` for a value that does not fit."""
        values = self.as_tuple()
        for field, value in zip(FIELDS, values, strict=True):
            if not 0 <= value <= field.max:
                raise WireError("out_of_range", f"{field.name}={value} outside 0..{field.max}")
        return HEADER_STRUCT.pack(*values)

    def as_tuple(self) -> tuple[int, ...]:
        """Field values in wire order."""
        return (
            self.version,
            self.opcode,
            self.flags,
            self.chunk_key,
            self.frag_index,
            self.frag_count,
            self.request_id,
            self.generation,
            self.payload_len,
            self.status,
            self.chunk_len,
            self.check,
        )


def unpack_header(datagram: bytes | bytearray | memoryview) -> Header:
    """Decode the header at the start of ``datagram`` without validating it."""
    if len(datagram) < HEADER_LEN:
        raise WireError("truncated", f"{len(datagram)} bytes, a header needs {HEADER_LEN}")
    v, op, fl, key, idx, cnt, rid, gen, plen, st, clen, check = HEADER_STRUCT.unpack_from(datagram)
    return Header(
        version=v,
        opcode=op,
        flags=fl,
        chunk_key=key,
        frag_index=idx,
        frag_count=cnt,
        request_id=rid,
        generation=gen,
        payload_len=plen,
        status=st,
        chunk_len=clen,
        check=check,
    )


def validate(hdr: Header, datagram_len: int) -> None:
    """Raise ``WireError`` unless ``hdr`` is a well-formed header of a datagram that long.

    The checks are the ones the switch makes (and counts by reason) plus the length
    checks only an end host can make.  Reasons: ``bad_version``, ``bad_opcode``,
    ``bad_flags``, ``bad_range``, ``bad_length``, ``bad_status``.
    """
    if hdr.version != KVPOOL_VERSION:
        raise WireError("bad_version", f"version {hdr.version}, expected {KVPOOL_VERSION}")
    if hdr.opcode not in _OPCODES:
        raise WireError("bad_opcode", f"unknown opcode {hdr.opcode}")
    if hdr.flags & ~KNOWN_FLAGS:
        raise WireError("bad_flags", f"unknown flag bits {hdr.flags & ~KNOWN_FLAGS:#x}")
    if hdr.frag_count == 0 or hdr.frag_index >= MAX_FRAGMENTS:
        raise WireError("bad_range", f"fragment {hdr.frag_index} of {hdr.frag_count}")
    op = hdr.opcode
    if op == Opcode.DATA:
        if hdr.frag_index >= hdr.frag_count:
            raise WireError("bad_range", f"fragment {hdr.frag_index} of {hdr.frag_count}")
        if datagram_len != DATA_DATAGRAM_LEN:
            raise WireError("bad_length", f"DATA datagram of {datagram_len} bytes, expected {DATA_DATAGRAM_LEN}")
        if not 0 < hdr.payload_len <= FRAG_PAYLOAD:
            raise WireError("bad_length", f"payload_len {hdr.payload_len} not in 1..{FRAG_PAYLOAD}")
        expect = expected_payload_len(hdr.chunk_len, hdr.frag_index)
        if hdr.frag_count != fragment_count(hdr.chunk_len) or hdr.payload_len != expect:
            raise WireError(
                "bad_length",
                f"chunk_len {hdr.chunk_len} does not fit fragment {hdr.frag_index}/"
                f"{hdr.frag_count} with payload_len {hdr.payload_len}",
            )
    elif op == Opcode.GET and datagram_len == GET_WITH_ROOM_LEN and hdr.payload_len == 0:
        if hdr.frag_index + hdr.frag_count > MAX_FRAGMENTS:
            raise WireError("bad_range", f"GET for fragments {hdr.frag_index}+{hdr.frag_count}")
    else:
        if datagram_len != HEADER_LEN or hdr.payload_len != 0:
            extra = datagram_len - HEADER_LEN
            raise WireError("bad_length", f"{Opcode(op).name} carries no payload, got {extra} bytes")
        if op == Opcode.GET and hdr.frag_index + hdr.frag_count > MAX_FRAGMENTS:
            raise WireError("bad_range", f"GET for fragments {hdr.frag_index}+{hdr.frag_count}")
    if op == Opcode.NACK:
        if hdr.status not in _STATUSES or hdr.status == Status.OK:
            raise WireError("bad_status", f"NACK with status {hdr.status}")
    elif hdr.status != Status.OK:
        raise WireError("bad_status", f"{Opcode(op).name} with status {hdr.status}")


def parse(datagram: bytes | bytearray | memoryview) -> Header:
    """Decode and validate one datagram's header; raises ``WireError`` with a reason."""
    hdr = unpack_header(datagram)
    validate(hdr, len(datagram))
    return hdr


_OPCODES: Final = frozenset(int(o) for o in Opcode)
_STATUSES: Final = frozenset(int(s) for s in Status)


def fragment_count(chunk_len: int) -> int:
    """Fragments needed for a serialized chunk of ``chunk_len`` bytes (at least one)."""
    if not 0 < chunk_len <= MAX_CHUNK_LEN:
        raise WireError("bad_length", f"chunk of {chunk_len} bytes, allowed 1..{MAX_CHUNK_LEN}")
    return -(-chunk_len // FRAG_PAYLOAD)


def expected_payload_len(chunk_len: int, frag_index: int) -> int:
    """Valid payload bytes in fragment ``frag_index`` of a chunk of ``chunk_len`` bytes."""
    return max(0, min(FRAG_PAYLOAD, chunk_len - frag_index * FRAG_PAYLOAD))


def get_packet(chunk_key: int, frag_index: int, frag_count: int = 1, request_id: int = 0,
               generation: int = 0, flags: int = 0, room: bool = False) -> bytes:
    """Encode a GET for ``frag_count`` fragments from ``frag_index``; ``room`` adds reply room."""
    hdr = Header(Opcode.GET, chunk_key, frag_index, frag_count, request_id, generation, flags=flags).pack()
    return hdr + _ROOM if room else hdr


_ROOM: Final = bytes(FRAG_PAYLOAD)


def nack_packet(chunk_key: int, status: Status, request_id: int = 0, frag_index: int = 0,
                frag_count: int = 1, generation: int = 0, retry_us: int = 0) -> bytes:
    """Encode a NACK for a request that cannot be served (``generation`` echoes the GET's).

    ``retry_us`` (``BUSY`` only) is the holder's retry hint, carried in ``chunk_len``.
    """
    if retry_us and status != Status.BUSY:
        raise WireError("bad_status", f"a retry hint belongs on a BUSY NACK, not {status.name}")
    return Header(Opcode.NACK, chunk_key, frag_index, frag_count, request_id, generation,
                  status=int(status), chunk_len=retry_us).pack()


def invalidate_packet(chunk_key: int, generation: int) -> bytes:
    """Encode an INVALIDATE announcing the chunk's new ``generation``."""
    return Header(Opcode.INVALIDATE, chunk_key, generation=generation).pack()


CHECK_SEED: Final = 0x6B76_706F_6F6C_0002
"""xxh3-64 seed of ``fragment_check`` ("kvpool" and the version): part of the wire format."""

IDENTITY_STRUCT: Final = struct.Struct("!QIHHIH")
"""What ``fragment_check`` hashes before the payload: chunk_key, generation, frag_index,
frag_count, chunk_len, payload_len (22 bytes, big-endian)."""
IDENTITY_DTYPE: Final = np.dtype([("chunk_key", ">u8"), ("generation", ">u4"), ("frag_index", ">u2"),
                                   ("frag_count", ">u2"), ("chunk_len", ">u4"), ("payload_len", ">u2")])
"""``IDENTITY_STRUCT`` as a record, for filling many fragments' identities at once."""
assert IDENTITY_DTYPE.itemsize == IDENTITY_STRUCT.size


def fragment_check(chunk_key: int, generation: int, frag_index: int, frag_count: int, chunk_len: int,
                   payload: bytes | bytearray | memoryview) -> int:
    """The writer's check of one DATA fragment: xxh3-64 (``CHECK_SEED``) of its identity, then its payload.

    ``payload`` is exactly the fragment's valid bytes (``payload_len`` of them), not the
    zero padding.  Receivers recompute it and drop a fragment whose ``check`` differs.
    """
    ident = IDENTITY_STRUCT.pack(chunk_key, generation, frag_index, frag_count, chunk_len, len(payload))
    h = xxhash.xxh3_64(ident, seed=CHECK_SEED)
    h.update(payload)
    return int(h.intdigest())


def data_packet(chunk_key: int, frag_index: int, chunk: bytes | memoryview, request_id: int = 0,
                generation: int = 0, flags: int = 0) -> bytes:
    """Encode fragment ``frag_index`` of serialized ``chunk`` as one padded DATA datagram (with its check)."""
    chunk_len = len(chunk)
    count = fragment_count(chunk_len)
    plen = expected_payload_len(chunk_len, frag_index)
    if plen == 0:
        raise WireError("bad_range", f"fragment {frag_index} of {count}")
    start = frag_index * FRAG_PAYLOAD
    payload = bytes(chunk[start:start + plen])
    check = fragment_check(chunk_key, generation, frag_index, count, chunk_len, payload)
    hdr = Header(Opcode.DATA, chunk_key, frag_index, count, request_id, generation, plen,
                 chunk_len=chunk_len, flags=flags, check=check).pack()
    return hdr + payload + bytes(FRAG_PAYLOAD - plen)
