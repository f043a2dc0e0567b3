"""The serialized chunk's envelope: its fixed header fields and whole-chunk checksum, without torch.

``hostagent.serialize`` writes and reads chunks (it needs torch); this module holds what
the rest of the agent needs to know about a serialized chunk without decoding it: the
header layout up to the shape, the header length, and the xxh3-64 checksum that covers
the header (minus the checksum field) and the payload.  The transport uses it to check a
fetched chunk as a whole before anything stores or returns it, and the holder to tell
one content from another in O(1) (the embedded checksum).
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
import numpy.typing as npt
import xxhash

MAGIC: Final = b"KVPC"
FORMAT_VERSION: Final = 1
MAX_NDIM: Final = 8
FIXED: Final = struct.Struct("<4sBBBBQQ")
"""magic, version, dtype code, quant mode, ndim, payload_len, checksum."""
FIXED_LEN: Final = FIXED.size
CHECKSUM_OFFSET: Final = 16
ALIGN: Final = 16

assert FIXED_LEN == 24

Buffer = bytes | bytearray | memoryview | npt.NDArray[np.uint8]


def header_len(ndim: int) -> int:
    """Header bytes for a tensor of ``ndim`` dimensions (padded for alignment)."""
    raw = FIXED_LEN + 8 * ndim
    return -(-raw // ALIGN) * ALIGN


def checksum(header: memoryview, payload: memoryview) -> int:
    """xxh3_64 over the header minus its checksum field, then the payload."""
    h = xxhash.xxh3_64()
    h.update(header[:CHECKSUM_OFFSET])
    h.update(header[FIXED_LEN:])
    h.update(payload)
    return int(h.intdigest())


def _view(buf: Buffer) -> memoryview:
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8).data
    return memoryview(buf).cast("B")


def embedded_checksum(buf: Buffer) -> int | None:
    """The checksum a serialized chunk carries, or None if ``buf`` is not shaped like one.

    Shaped like one: magic, format version, ``ndim <= MAX_NDIM`` and a length equal to
    the header length plus the payload length the header states.  Nothing is hashed.
    """
    view = _view(buf)
    if len(view) < FIXED_LEN:
        return None
    magic, version, _dtype, _quant, ndim, plen, check = FIXED.unpack_from(view)
    if magic != MAGIC or version != FORMAT_VERSION or ndim > MAX_NDIM or len(view) != header_len(ndim) + plen:
        return None
    return int(check)


def content_digest(buf: Buffer) -> int:
    """A 64-bit name of ``buf``'s content: a serialized chunk's own checksum (nothing hashed), else xxh3-64.

    The directory issues generations per content with it, and a holder keys its fragment
    checks on it.
    """
    tag = embedded_checksum(buf)
    return tag if tag is not None else int(xxhash.xxh3_64_intdigest(_view(buf)))


def verify(buf: Buffer) -> bool | None:
    """True if ``buf`` is a serialized chunk whose checksum matches its bytes, False if it does
    not match, None if ``buf`` is not shaped like a serialized chunk at all."""
    view = _view(buf)
    want = embedded_checksum(view)
    if want is None:
        return None
    hlen = header_len(view[7])
    return checksum(view[:hlen], view[hlen:]) == want
