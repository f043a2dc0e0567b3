"""BMv2's hash algorithms for v1model's ``hash`` extern, bit for bit.

The reference model must put every key in the same register cell as BMv2 does, so
count-min rows, Bloom bits and pending-state slots line up across targets.  The
definitions follow behavioral-model's ``src/bm_sim/calculations.cpp``:

* ``crc16``: poly 0x8005, init 0, input and output reflected, no final xor (CRC-16/ARC).
* ``crc32``: poly 0x04C11DB7, init and final xor 0xFFFFFFFF, reflected (zlib's CRC-32).
* ``crc16_custom`` / ``crc32_custom`` default to the same parameters as the two above.
* ``crcCCITT``: poly 0x1021, init 0xFFFF, not reflected (CRC-16/CCITT-FALSE).
* ``csum16``: the Internet checksum (RFC 1071) of the bytes, zero padded.
* ``identity``: the first eight bytes, big-endian.
* ``xor16``: xor of the bytes taken as big-endian 16-bit words, the tail zero padded.

The input of every algorithm is the field list packed as BMv2's ``BufBuilder`` does:
fields back to back, most significant bit first, the last byte padded with zero bits.
The v1model extern then computes ``base + (algorithm(bytes) % max)``, truncated to the
width of the destination (``modify_field_with_hash_based_offset`` in simple_switch).
"""

from __future__ import annotations

import binascii
import zlib
from collections.abc import Callable, Sequence
from typing import Final


def _reflect(value: int, bits: int) -> int:
    """Mirror the low ``bits`` bits of ``value`` (bit 0 becomes bit ``bits - 1``)."""
    out = 0
    for _ in range(bits):
        out = (out << 1) | (value & 1)
        value >>= 1
    return out


def _crc16_table() -> tuple[int, ...]:
    """The MSB-first table for polynomial 0x8005 that BMv2's ``table_crc16`` holds."""
    table = []
    for dividend in range(256):
        rem = dividend << 8
        for _ in range(8):
            rem = ((rem << 1) ^ 0x8005) if rem & 0x8000 else (rem << 1)
        table.append(rem & 0xFFFF)
    return tuple(table)


_CRC16_TABLE: Final = _crc16_table()
# BMv2 reflects every input byte before indexing its MSB-first table; precompute that.
_REFLECT8: Final = tuple(_reflect(b, 8) for b in range(256))


def crc16_bmv2(data: bytes) -> int:
    """BMv2's ``crc16`` loop transcribed literally (reflect each byte, MSB-first table, reflect result).

    The reference :func:`crc16` is checked against; too slow for the packet path.
    """
    rem = 0
    table = _CRC16_TABLE
    refl = _REFLECT8
    for byte in data:
        rem = table[refl[byte] ^ (rem >> 8)] ^ ((rem << 8) & 0xFFFF)
    return _reflect(rem, 16)


def _crc16_reflected_table() -> tuple[int, ...]:
    """LSB-first table for the reflected polynomial 0xA001: the same CRC without per-byte reflection."""
    table = []
    for byte in range(256):
        rem = byte
        for _ in range(8):
            rem = (rem >> 1) ^ 0xA001 if rem & 1 else rem >> 1
        table.append(rem)
    return tuple(table)


_CRC16_REFLECTED: Final = _crc16_reflected_table()


def crc16(data: bytes) -> int:
    """BMv2's ``crc16`` (CRC-16/ARC), table-driven; ``crc16(b"123456789") == 0xBB3D``."""
    rem = 0
    table = _CRC16_REFLECTED
    for byte in data:
        rem = (rem >> 8) ^ table[(rem ^ byte) & 0xFF]
    return rem


crc32: Final[Callable[[bytes], int]] = zlib.crc32
"""BMv2's ``crc32``: zlib's CRC-32 (unsigned in Python 3); ``crc32(b"123456789") == 0xCBF43926``.

zlib's function itself, not a wrapper: the model calls it for every sketch, Bloom and
pending-slot index, and a Python frame around it costs more than the CRC.
"""


def crc_ccitt(data: bytes) -> int:
    """BMv2's ``crcCCITT`` (CRC-16/CCITT-FALSE); ``crc_ccitt(b"123456789") == 0x29B1``."""
    return binascii.crc_hqx(data, 0xFFFF)


def csum16(data: bytes) -> int:
    """BMv2's ``csum16``: the ones' complement Internet checksum of ``data``."""
    if len(data) % 2:
        data = data + b"\x00"
    total = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def identity(data: bytes) -> int:
    """BMv2's ``identity``: the first eight bytes (or fewer) as a big-endian integer."""
    return int.from_bytes(data[:8], "big")


def xor16(data: bytes) -> int:
    """BMv2's ``xor16``: xor of big-endian 16-bit words, a short tail padded on the right."""
    out = 0
    for i in range(0, len(data), 2):
        word = data[i:i + 2]
        out ^= int.from_bytes(word.ljust(2, b"\x00"), "big")
    return out


ALGORITHMS: Final[dict[str, Callable[[bytes], int]]] = {
    "crc16": crc16,
    "crc16_custom": crc16,
    "crc32": crc32,
    "crc32_custom": crc32,
    "crcCCITT": crc_ccitt,
    "csum16": csum16,
    "identity": identity,
    "xor16": xor16,
}
"""BMv2 algorithm name (as in the compiled JSON's ``calculations``) to function."""


def pack_fields(fields: Sequence[tuple[int, int]]) -> bytes:
    """Pack ``(value, bits)`` pairs the way BMv2 builds a hash input: MSB first, zero padded."""
    acc = 0
    nbits = 0
    for value, bits in fields:
        acc = (acc << bits) | (value & ((1 << bits) - 1))
        nbits += bits
    pad = -nbits % 8
    return (acc << pad).to_bytes((nbits + pad) // 8, "big")


def v1model_hash(algorithm: str, base: int, fields: Sequence[tuple[int, int]], max_value: int,
                 result_bits: int) -> int:
    """v1model ``hash(result, algo, base, {fields}, max)``: ``base + h % max`` cut to the result width.

    BMv2 treats a ``max`` of 0 as 1 (and warns); the model does the same.
    """
    func = ALGORITHMS.get(algorithm)
    if func is None:
        raise ValueError(f"hash algorithm {algorithm!r} is not modelled; known: {sorted(ALGORITHMS)}")
    modulus = max_value if max_value > 0 else 1
    return (base + func(pack_fields(fields)) % modulus) & ((1 << result_bits) - 1)
