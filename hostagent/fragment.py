"""Serialized chunks to kvpool DATA records and back, vectorised over whole chunks.

A chunk of ``chunk_len`` bytes becomes ``wire.fragment_count(chunk_len)`` DATA datagrams,
each exactly ``wire.DATA_DATAGRAM_LEN`` bytes (``wire.HEADER_LEN``-byte header +
``FRAG_PAYLOAD`` bytes of payload, the last one zero-padded), each with its writer's
``check`` (``wire.fragment_check``).  Both directions work on numpy arrays of
``wire.DATA_PACKET_DTYPE`` records laid end to end, so a transport can hand the array's
buffer to ``sendmmsg`` / receive into one and no Python object is created per packet:

* ``fragment`` / ``fragment_into`` copy the payloads as opaque 1408-byte items and fill
  the records' headers with a few array-wide assignments; the checks come from
  ``fragment_checks``, which a holder computes once per chunk and keeps.
* ``Reassembler.add_batch`` takes a whole array of received records: an in-order run
  into empty slots (the common case) has its payloads and headers copied into place
  and is validated with a few flat ops over the copied header words; anything else is
  validated first, de-duplicated and scattered with fancy indexing.
  ``Reassembler.add`` does the same for one datagram (control path, tests).

Per chunk, each numpy call costs about a microsecond whatever its size, and a 2-D
operation with a short last axis (a header's five 64-bit words) costs several: the
hot paths use few calls, opaque items for copies and contiguous blocks for masks
(``_run_blocks``) instead of broadcast rows.

The reassembler never writes outside its buffer, never changes a fragment it has
stored and never marks as received a fragment whose record failed validation.  It keeps
each stored fragment's ``check`` (and flags); ``bad_fragments`` recomputes the checks
and ``forget`` un-stores the fragments that failed, so a receiver can ask for exactly
those again.  Content integrity is checked by the receiver once the chunk is complete
(``hostagent.transfer``): the whole serialized chunk against its own checksum, and
fragment by fragment where that fails or the chunk is not a serialized one.
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import xxhash

from kvpool import wire

BufferLike = bytes | bytearray | memoryview | npt.NDArray[Any]
"""Contiguous bytes: a bytes-like object, or a C-contiguous numpy array taken as its raw bytes."""

_HEADER_WORDS: Final = wire.HEADER_LEN // 8
_RECORD_WORDS: Final = wire.DATA_DATAGRAM_LEN // 8
assert wire.DATA_DATAGRAM_LEN % 8 == 0 and wire.HEADER_LEN % 8 == 0
_CMP_WORDS: Final = 4
"""Header words validation compares: the fifth holds only ``check``, which varies per fragment."""
assert wire.FIELD_BY_NAME["check"].offset == 8 * _CMP_WORDS and _HEADER_WORDS == _CMP_WORDS + 1
_SWITCH_SERVED: Final = int(wire.Flag.SWITCH_SERVED)
_ROW: Final = np.dtype((np.void, wire.FRAG_PAYLOAD))
"""One fragment's payload as one opaque item."""
_HDR: Final = np.dtype((np.void, wire.HEADER_LEN))
"""One header as one opaque item."""


def _as_u8(data: BufferLike) -> npt.NDArray[np.uint8]:
    """A flat uint8 view of ``data`` without copying (read-only if the source is)."""
    if isinstance(data, np.ndarray):
        # A strided array would make reshape() copy, and writes to a reassembly buffer
        # would then land in that copy: refuse it.
        if not data.flags.c_contiguous:
            raise ValueError("a numpy array passed as bytes must be C-contiguous")
        if data.dtype == np.uint8 and data.ndim == 1:
            return data
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _fragment_range(chunk_len: int, first: int, count: int | None) -> tuple[int, int]:
    """Total fragments of the chunk and the number selected; validates the range."""
    total = wire.fragment_count(chunk_len)
    if count is None:
        count = total - first
    if first < 0 or count <= 0 or first + count > total:
        raise wire.WireError("bad_range", f"fragments {first}+{count} of a {total}-fragment chunk")
    return total, count


_KEY_MAX: Final = wire.FIELD_BY_NAME["chunk_key"].max
_U32_MAX: Final = wire.FIELD_BY_NAME["generation"].max
assert wire.FIELD_BY_NAME["request_id"].max == _U32_MAX


def _check_header_values(chunk_key: int, generation: int, request_id: int, flags: int) -> None:
    """Reject header values that do not fit their fields before any record is written."""
    # Plain comparisons: this runs once per chunk on the hot path.
    if not (0 <= chunk_key <= _KEY_MAX and 0 <= generation <= _U32_MAX and 0 <= request_id <= _U32_MAX):
        for name, value in (("chunk_key", chunk_key), ("generation", generation), ("request_id", request_id)):
            field = wire.FIELD_BY_NAME[name]
            if not 0 <= value <= field.max:
                raise wire.WireError("out_of_range", f"{name}={value} outside 0..{field.max}")
    if flags < 0 or flags & ~wire.KNOWN_FLAGS:
        raise wire.WireError("bad_flags", f"unknown flag bits {flags & ~wire.KNOWN_FLAGS:#x}")


def _template_header(chunk_key: int, frag_count: int, chunk_len: int, generation: int,
                     request_id: int, flags: int) -> npt.NDArray[np.void]:
    """The header shared by the full fragments of a chunk (frag_index and check zero), as one opaque item.

    Values must have been range-checked (``_check_header_values``, ``fragment_count``).
    """
    return np.frombuffer(wire.HEADER_STRUCT.pack(
        wire.KVPOOL_VERSION, wire.Opcode.DATA, flags, chunk_key, 0, frag_count, request_id,
        generation, wire.FRAG_PAYLOAD, wire.Status.OK, chunk_len, 0), dtype=_HDR)


_PAYLOAD_LEN: Final = struct.Struct("!H")
_PAYLOAD_LEN_AT: Final = wire.FIELD_BY_NAME["payload_len"].offset
assert wire.FIELD_BY_NAME["payload_len"].bits == 16


def _validation_mask() -> npt.NDArray[np.uint64]:
    """Header words mask: every bit must match except frag_index, request_id, check and known flags."""
    mask = np.full(wire.HEADER_LEN, 0xFF, dtype=np.uint8)
    for name in ("frag_index", "request_id", "check"):
        f = wire.FIELD_BY_NAME[name]
        mask[f.offset : f.offset + f.bits // 8] = 0
    flags = wire.FIELD_BY_NAME["flags"]
    # Unknown flag bits stay in the mask and must be zero; known ones may take any value.
    mask[flags.offset : flags.offset + 2] = np.frombuffer((~wire.KNOWN_FLAGS & 0xFFFF).to_bytes(2, "big"),
                                                          dtype=np.uint8)
    return mask.view(np.uint64)


_MASK_WORDS: Final = _validation_mask()
_MASK_BYTES: Final = _MASK_WORDS.view(np.uint8)
assert not _MASK_WORDS[_CMP_WORDS:].any()
_INDEX: Final = np.arange(wire.MAX_FRAGMENTS, dtype=np.intp)
_BE_INDEX: Final = _INDEX.astype(">u2")
"""Every fragment index in wire byte order: a slice of it fills frag_index without a cast."""


def _index_words() -> tuple[int, npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Header word holding frag_index, that word's value for every index, and the run mask."""
    f = wire.FIELD_BY_NAME["frag_index"]
    word, offset = divmod(f.offset, 8)
    raw = np.zeros((wire.MAX_FRAGMENTS, 8), dtype=np.uint8)
    raw[:, offset : offset + 2] = _BE_INDEX.view(np.uint8).reshape(-1, 2)
    run_mask = _MASK_BYTES.copy()
    run_mask[f.offset : f.offset + 2] = 0xFF  # in a run, frag_index is checked too
    return word, raw.view(np.uint64).reshape(-1), run_mask.view(np.uint64)[:_CMP_WORDS]


_INDEX_WORD, _INDEX_WORDS, _MASK_RUN_WORDS = _index_words()
"""For validating an in-order run with one compare: see ``Reassembler.add_batch``."""


def _flags_run_mask() -> npt.NDArray[np.uint64]:
    """``_MASK_RUN_WORDS`` with every flag bit compared too: a run whose records all carry the same flags."""
    f = wire.FIELD_BY_NAME["flags"]
    raw = _MASK_RUN_WORDS.view(np.uint8).copy()
    raw[f.offset : f.offset + 2] = 0xFF
    return raw.view(np.uint64)


_MASK_FLAGS_RUN_WORDS: Final = _flags_run_mask()
_FLAGS_SHIFT: Final = 8 * (wire.HEADER_LEN - wire.FIELD_BY_NAME["flags"].offset - 2)
"""Where the flags sit in a header read as one big-endian integer."""
_UNKNOWN_FLAGS: Final = 0xFFFF & ~wire.KNOWN_FLAGS


_HEADER_PAIR: Final = struct.Struct("!" + 2 * wire.HEADER_STRUCT.format.lstrip("!"))
"""Two headers back to back (a transfer's full and tail fragment expectations)."""
_HEADER_BITS: Final = 8 * wire.HEADER_LEN
_HEADER_ONES: Final = (1 << _HEADER_BITS) - 1
_MASK_PAIR: Final = int.from_bytes(2 * _MASK_BYTES.tobytes(), "big")
"""``_validation_mask`` over two headers back to back, as one big-endian integer."""

# numpy copies opaque (void) items with one memcpy each: a record's header or payload as
# one item is several times cheaper to move than the same bytes as a 2-D array of words,
# whose inner loop is only a few elements long, and a few percent cheaper than as bytes.
_RECORD_HDR: Final = np.dtype({"names": ["h"], "formats": [_HDR], "offsets": [0],
                               "itemsize": wire.DATA_DATAGRAM_LEN})
_RECORD_PAYLOAD: Final = np.dtype({"names": ["p"], "formats": [_ROW], "offsets": [wire.HEADER_LEN],
                                   "itemsize": wire.DATA_DATAGRAM_LEN})


def _header_items(recs: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    """Each record's header as one opaque ``HEADER_LEN``-byte item (a strided view, no copy)."""
    return recs.view(_RECORD_HDR)["h"]


def _payload_items(recs: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    """Each record's payload as one opaque ``FRAG_PAYLOAD``-byte item (a strided view, no copy)."""
    return recs.view(_RECORD_PAYLOAD)["p"]


_CHECK_WORD: Final = wire.FIELD_BY_NAME["check"].offset // 8
_BE_U64: Final = np.dtype(">u8")
_BE_U16: Final = np.dtype(">u2")
_FLAGS_U16: Final = wire.FIELD_BY_NAME["flags"].offset // 2


RunBlocks = tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]


def _build_run_blocks(rows: int) -> RunBlocks:
    """Blocks of ``rows`` whole header words for validating an in-order run with flat array ops.

    The first holds, per fragment index, the frag_index bits of its header words (zero
    elsewhere); the second repeats the run mask (check masked out) on every row, the third
    the same with the flags compared too (``Reassembler.add_run``).  All are contiguous, so
    XOR and AND with them run as one flat loop: broadcasting a 5-word row over a run
    instead costs several times more (numpy loops over the short inner axis).
    """
    index = np.zeros((rows, _HEADER_WORDS), dtype=np.uint64)
    index[:, _INDEX_WORD] = _INDEX_WORDS[:rows]
    mask = np.zeros((rows, _HEADER_WORDS), dtype=np.uint64)
    mask[:, :_CMP_WORDS] = _MASK_RUN_WORDS
    flags_mask = np.zeros((rows, _HEADER_WORDS), dtype=np.uint64)
    flags_mask[:, :_CMP_WORDS] = _MASK_FLAGS_RUN_WORDS
    return index, mask, flags_mask


_run_blocks_cache = _build_run_blocks(1024)
"""Grown on demand (``_run_blocks``) up to ``MAX_FRAGMENTS`` rows; replaced, never changed in place."""


def _run_blocks(rows: int) -> RunBlocks:
    """The run blocks with at least ``rows`` rows."""
    global _run_blocks_cache
    blocks = _run_blocks_cache
    if blocks[0].shape[0] < rows:
        blocks = _build_run_blocks(min(wire.MAX_FRAGMENTS, max(rows, 2 * blocks[0].shape[0])))
        _run_blocks_cache = blocks  # one reference swap: a concurrent reader keeps the old blocks
    return blocks


def records_view(buf: BufferLike) -> npt.NDArray[np.void]:
    """View a buffer of back-to-back DATA datagrams as ``DATA_PACKET_DTYPE`` records (no copy)."""
    raw = _as_u8(buf)
    if raw.size % wire.DATA_DATAGRAM_LEN:
        raise wire.WireError("bad_length", f"{raw.size} bytes is not a whole number of "
                             f"{wire.DATA_DATAGRAM_LEN}-byte DATA datagrams")
    return raw.view(wire.DATA_PACKET_DTYPE)


def empty_records(count: int) -> npt.NDArray[np.void]:
    """An uninitialised, contiguous array of ``count`` DATA records for ``fragment_into``."""
    return np.empty(count, dtype=wire.DATA_PACKET_DTYPE)


_CHECKED: Final = np.dtype([("identity", wire.IDENTITY_DTYPE), ("payload", _ROW)])
"""What one fragment's check hashes, back to back: its identity, then its payload."""
_CHECKED_LEN: Final = _CHECKED.itemsize


_CHECK_BLOCK: Final = 1024
"""Fragments hashed per block (1.4 MB of messages per thread, reused): a bounded buffer."""


class _CheckArea(threading.local):
    """A thread's buffer of ``_CHECK_BLOCK`` messages and a memoryview of each, made once.

    The views are what makes the loop cheap: one xxh3 call per fragment over a view that
    already exists, with no slicing, packing or copying per fragment.
    """

    def __init__(self) -> None:
        self.area = np.zeros(_CHECK_BLOCK, dtype=_CHECKED)
        self.raw = self.area.view(np.uint8).data
        self.views = [self.raw[o : o + _CHECKED_LEN] for o in range(0, _CHECK_BLOCK * _CHECKED_LEN, _CHECKED_LEN)]


_check_area: Final = _CheckArea()


def fragment_checks(chunk_bytes: BufferLike, chunk_key: int, *, generation: int = 0, first: int = 0,
                    count: int | None = None) -> npt.NDArray[np.uint64]:
    """``wire.fragment_check`` of fragments ``first .. first+count-1`` (default: all) of a chunk.

    Block by block, the identities and payloads are laid out with a few array-wide copies
    in a per-thread buffer (``_CheckArea``), then one xxh3 call per fragment hashes its
    part of it (about a quarter of the time of packing and copying each fragment in
    Python).  A holder computes them once per chunk and generation and passes them to
    ``fragment_into`` for every answer; a receiver computes them to find the fragments of
    a chunk that failed its whole-chunk check, or to check every fragment of a chunk that
    has none.
    """
    src = _as_u8(chunk_bytes)
    chunk_len = int(src.size)
    total, count = _fragment_range(chunk_len, first, count)
    _check_header_values(chunk_key, generation, 0, 0)
    out = np.empty(count, dtype=np.uint64)
    for at in range(first, first + count, _CHECK_BLOCK):
        n = min(_CHECK_BLOCK, first + count - at)
        out[at - first : at - first + n] = _check_block(src, chunk_key, generation, total, at, n)
    return out


def _check_block(src: npt.NDArray[np.uint8], chunk_key: int, generation: int, total: int, first: int,
                 count: int) -> npt.NDArray[np.uint64]:
    """``fragment_checks`` of at most ``_CHECK_BLOCK`` fragments from ``first``."""
    area = _check_area
    chunk_len = int(src.size)
    payload = wire.FRAG_PAYLOAD
    end = first + count
    n_full = min(end, chunk_len // payload) - first  # those with a whole payload (all but a short tail)
    ident = area.area["identity"][:count]
    ident["chunk_key"] = chunk_key
    ident["generation"] = generation
    ident["frag_index"] = _INDEX[first:end]
    ident["frag_count"] = total
    ident["chunk_len"] = chunk_len
    ident["payload_len"] = payload
    if n_full:
        area.area["payload"][:n_full] = src[first * payload : (first + n_full) * payload].view(_ROW)
    checks = np.fromiter(map(xxhash.xxh3_64_intdigest, area.views[:n_full], itertools.repeat(wire.CHECK_SEED, n_full)),
                         dtype=np.uint64, count=n_full)
    if n_full == count:
        return checks
    # The short tail fragment: its check covers its valid bytes only.
    start = (end - 1) * payload
    plen = chunk_len - start
    ident["payload_len"][count - 1] = plen
    at = (count - 1) * _CHECKED_LEN
    tail = area.raw[at : at + wire.IDENTITY_STRUCT.size + plen]
    tail[wire.IDENTITY_STRUCT.size :] = src[start:].data
    return np.append(checks, np.uint64(xxhash.xxh3_64_intdigest(tail, wire.CHECK_SEED)))


def fragment_into(out: npt.NDArray[np.void], chunk_bytes: BufferLike, chunk_key: int, *,
                  generation: int = 0, request_id: int = 0, flags: int = 0, first: int = 0,
                  count: int | None = None, checks: npt.NDArray[np.uint64] | None = None) -> npt.NDArray[np.void]:
    """Write fragments ``first .. first+count-1`` of a chunk into ``out[:count]``; return that slice.

    ``out`` must be a C-contiguous ``DATA_PACKET_DTYPE`` array with at least ``count``
    records (see ``empty_records``); nothing is allocated per call beyond the header
    template.  Each record's bytes equal ``wire.data_packet`` for the same fragment.
    ``checks`` are the chunk's ``fragment_checks`` for this generation (all of them,
    indexed by fragment); without them the selected fragments' checks are computed here.
    """
    src = _as_u8(chunk_bytes)
    chunk_len = int(src.size)
    total, count = _fragment_range(chunk_len, first, count)
    if (out.dtype is not wire.DATA_PACKET_DTYPE and out.dtype != wire.DATA_PACKET_DTYPE) or out.ndim != 1 \
            or not out.flags.c_contiguous:
        raise ValueError("out must be a 1-D C-contiguous array of wire.DATA_PACKET_DTYPE records")
    if out.size < count:
        raise ValueError(f"out holds {out.size} records, {count} fragments requested")
    if checks is not None and checks.shape != (total,):
        raise ValueError(f"checks for {checks.shape} fragments, the chunk has {total}")
    _check_header_values(chunk_key, generation, request_id, flags)
    recs = out[:count]

    # Payload: every selected fragment except possibly the chunk's last is full, so one
    # copy of opaque payload-sized items moves them; the tail fragment is copied and
    # zero-padded on its own, through the records' flat bytes (cheaper than 2-D indexing).
    last_is_tail = first + count == total
    full = count - 1 if last_is_tail else count
    start = first * wire.FRAG_PAYLOAD
    if full:
        _payload_items(recs[:full])[...] = src[start : start + full * wire.FRAG_PAYLOAD].view(_ROW)
    tail_len = 0
    if last_is_tail:
        tail_start = (total - 1) * wire.FRAG_PAYLOAD
        tail_len = chunk_len - tail_start
        flat = recs.view(np.uint8)
        at = full * wire.DATA_DATAGRAM_LEN + wire.HEADER_LEN
        flat[at : at + tail_len] = src[tail_start:]
        if tail_len < wire.FRAG_PAYLOAD:
            flat[at + tail_len : at + wire.FRAG_PAYLOAD] = 0

    # Headers after the payload, while the records' cache lines are still warm: the
    # shared bytes broadcast as one opaque 40-byte item per record (a memcpy each; as
    # 64-bit words or bytes it is several times slower), then the per-fragment index,
    # check and the tail's payload_len.
    _header_items(recs)[...] = _template_header(chunk_key, total, chunk_len, generation, request_id, flags)
    hdr = recs["hdr"]
    hdr["frag_index"] = _BE_INDEX[first : first + count]
    if checks is None:
        hdr["check"] = fragment_checks(src, chunk_key, generation=generation, first=first, count=count)
    else:
        hdr["check"] = checks[first : first + count]
    if tail_len:
        _PAYLOAD_LEN.pack_into(flat.data, full * wire.DATA_DATAGRAM_LEN + _PAYLOAD_LEN_AT, tail_len)
    return recs


def fragment(chunk_bytes: BufferLike, chunk_key: int, *, generation: int = 0, request_id: int = 0,
             flags: int = 0, first: int = 0, count: int | None = None,
             checks: npt.NDArray[np.uint64] | None = None) -> npt.NDArray[np.void]:
    """Fragments ``first .. first+count-1`` (default: all) of a serialized chunk as new DATA records."""
    _, n = _fragment_range(int(_as_u8(chunk_bytes).size), first, count)
    return fragment_into(empty_records(n), chunk_bytes, chunk_key, generation=generation,
                         request_id=request_id, flags=flags, first=first, count=n, checks=checks)


def runs(mask: npt.NDArray[np.bool_], max_runs: int | None = None) -> list[tuple[int, int]]:
    """The runs of True in ``mask``, as ``(start, count)``, the first ``max_runs`` of them."""
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return []
    # A run starts wherever the index is not the previous index + 1.
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = idx[np.concatenate(([0], breaks))]
    ends = idx[np.concatenate((breaks - 1, [idx.size - 1]))]
    out = [(int(s), int(e - s + 1)) for s, e in zip(starts, ends, strict=True)]
    return out if max_runs is None else out[:max_runs]


class Reassembler:
    """Collects the DATA fragments of one chunk into a preallocated buffer.

    ``add`` takes one datagram, ``add_batch`` an array of ``DATA_PACKET_DTYPE`` records.
    A fragment is accepted only if it is a valid DATA packet of exactly this chunk
    (key, generation, chunk length, fragment count); the first copy of each fragment
    wins and later duplicates are ignored.  ``missing_ranges`` lists what to ask for
    again.

    Buffer guarantees: nothing is written outside the first ``chunk_len`` bytes of a
    caller's buffer; a stored fragment is never changed again, by a duplicate or by an
    invalid record; a fragment is marked received only after its record passed every
    check.  Bytes of fragments not yet received are undefined (``add_batch`` copies an
    in-order run into those slots before validating it, which is what lets validation
    run on warm cache lines).
    """

    def __init__(self, chunk_key: int, chunk_len: int, generation: int = 0,
                 buffer: BufferLike | None = None,
                 alloc: Callable[[int], npt.NDArray[np.uint8]] | None = None) -> None:
        """``buffer``: the caller's, written only in its first ``chunk_len`` bytes; else one of its own,
        from ``alloc(nbytes)`` (a writable uint8 array, e.g. ``BufferPool.take``) or numpy."""
        self.chunk_key = chunk_key
        self.chunk_len = chunk_len
        self.generation = generation
        self.frag_count = wire.fragment_count(chunk_len)
        _check_header_values(chunk_key, generation, 0, 0)
        padded = self.frag_count * wire.FRAG_PAYLOAD
        if buffer is None:
            # Padded to whole fragments so every fragment, the tail too, lands with one
            # row copy; only the first chunk_len bytes are ever exposed.
            self._buf = np.empty(padded, dtype=np.uint8) if alloc is None else alloc(padded)
            if self._buf.dtype != np.uint8 or self._buf.shape != (padded,) or not self._buf.flags.writeable:
                raise ValueError(f"alloc({padded}) must give a writable uint8 array of that many bytes")
        else:
            self._buf = _as_u8(buffer)
            if self._buf.size < chunk_len:
                raise ValueError(f"buffer of {self._buf.size} bytes cannot hold a {chunk_len}-byte chunk")
            if not self._buf.flags.writeable:
                raise ValueError("buffer must be writable")
        # Fragments copied as whole rows.  A caller's buffer is written only in its first
        # chunk_len bytes, so there the tail fragment (if short) takes a separate short copy.
        writable = padded if buffer is None else chunk_len
        self._rows = min(self.frag_count, writable // wire.FRAG_PAYLOAD)
        self._grid_items = self._buf[: self._rows * wire.FRAG_PAYLOAD].view(_ROW)
        self._tail_len = chunk_len - (self.frag_count - 1) * wire.FRAG_PAYLOAD
        self.received = np.zeros(self.frag_count, dtype=np.bool_)
        """Per-fragment flag: True once that fragment has been stored."""
        # Each stored fragment's header as it arrived (raw wire words): ``checks`` and
        # ``flags`` are views of it, and an in-order run's headers land here with one copy
        # that its validation then reads (undefined where not received).
        self._hdrs = np.empty((self.frag_count, _HEADER_WORDS), dtype=np.uint64)
        self._hdr_items = self._hdrs.view(_HDR).reshape(self.frag_count)
        self.received_count = 0
        self.rejected = 0
        """Invalid records skipped by non-strict ``add_batch`` calls."""
        self.rejected_reasons: Counter[str] = Counter()
        """Those skipped records by ``WireError.reason`` (``wrong_key``, ``bad_length``...)."""
        # A masked compare of the header checks version, opcode, unknown flag bits, key,
        # frag_count, generation, status, chunk_len and a full payload_len; only
        # frag_index, request_id and check (and the known flags) may vary.  The tail
        # fragment, whose payload_len may be shorter, has its own expectation.
        self._set_expectations()

    def reset(self, generation: int | None = None) -> None:
        """Forget every received fragment (e.g. after an INVALIDATE), optionally for a new generation.

        The buffer is kept, so a retry reuses its memory; its bytes become undefined.
        """
        if generation is not None and generation != self.generation:
            _check_header_values(self.chunk_key, generation, 0, 0)
            self.generation = generation
            self._set_expectations()
        self.received[:] = False
        self.received_count = 0

    def _set_expectations(self) -> None:
        """The masked header every full fragment, and the tail fragment, must carry."""
        # Both headers packed and masked as one Python int: at this size cheaper than
        # numpy, and it runs once per transfer.
        both = int.from_bytes(_HEADER_PAIR.pack(
            wire.KVPOOL_VERSION, wire.Opcode.DATA, 0, self.chunk_key, 0, self.frag_count, 0,
            self.generation, wire.FRAG_PAYLOAD, wire.Status.OK, self.chunk_len, 0,
            wire.KVPOOL_VERSION, wire.Opcode.DATA, 0, self.chunk_key, 0, self.frag_count, 0,
            self.generation, self._tail_len, wire.Status.OK, self.chunk_len, 0), "big") & _MASK_PAIR
        # A full fragment's and the tail's masked header (frag_index 0, check masked to 0):
        # what every row of a validated run reduces to (``add_batch``).
        self._expect_row_int = both >> _HEADER_BITS
        self._expect_tail_int = both & _HEADER_ONES
        self._expect_row = self._expect_row_int.to_bytes(wire.HEADER_LEN, "big")
        self._expect_tail = self._expect_tail_int.to_bytes(wire.HEADER_LEN, "big")

    # ----------------------------------------------------------------------------- state

    @property
    def checks(self) -> npt.NDArray[np.uint64]:
        """Per fragment, the ``check`` its stored copy carried (undefined where not received)."""
        checks: npt.NDArray[np.uint64] = self._hdrs.view(_BE_U64)[:, _CHECK_WORD]
        return checks

    @property
    def flags(self) -> npt.NDArray[np.uint16]:
        """Per fragment, the header flags its stored copy carried (undefined where not received)."""
        flags: npt.NDArray[np.uint16] = self._hdrs.view(_BE_U16)[:, _FLAGS_U16]
        return flags

    @property
    def complete(self) -> bool:
        """True once every fragment has been stored."""
        return self.received_count == self.frag_count

    @property
    def buffer(self) -> memoryview:
        """The whole chunk-sized buffer, whatever has arrived so far (for zero-copy use)."""
        return self._buf[: self.chunk_len].data

    @property
    def data(self) -> memoryview:
        """The assembled chunk; raises ``RuntimeError`` until every fragment has arrived."""
        if not self.complete:
            raise RuntimeError(f"chunk {self.chunk_key:#x} incomplete: "
                               f"{self.received_count}/{self.frag_count} fragments")
        return self.buffer

    def missing_ranges(self, max_ranges: int | None = None) -> list[tuple[int, int]]:
        """Runs of fragments not yet received, as ``(start, count)``, for selective GETs."""
        return runs(~self.received, max_ranges)

    def bad_fragments(self) -> npt.NDArray[np.intp]:
        """Indices of stored fragments whose bytes do not give the ``check`` they arrived with.

        Recomputes ``wire.fragment_check`` of every stored fragment (one xxh3 call each):
        the slow path a receiver takes when the whole chunk failed its own check, or
        when the chunk has none.
        """
        stored = np.flatnonzero(self.received)
        if stored.size == 0:
            return stored
        want = fragment_checks(self._buf[: self.chunk_len], self.chunk_key, generation=self.generation)
        bad: npt.NDArray[np.intp] = stored[want[stored] != self.checks[stored]]
        return bad

    def forget(self, indices: npt.NDArray[np.intp] | list[int]) -> int:
        """Un-store fragments (e.g. ones that failed their check), so they can be received again; how many."""
        idx = np.asarray(indices, dtype=np.intp)
        if idx.size and (idx.min() < 0 or idx.max() >= self.frag_count):
            raise IndexError(f"fragment index outside 0..{self.frag_count - 1}")
        idx = np.unique(idx)
        idx = idx[self.received[idx]]
        self.received[idx] = False
        self.received_count -= int(idx.size)
        return int(idx.size)

    # ----------------------------------------------------------------------------- input

    def _check_one(self, hdr: wire.Header, datagram_len: int) -> None:
        """Raise ``WireError`` unless ``hdr`` is a DATA fragment of this very chunk."""
        wire.validate(hdr, datagram_len)
        if hdr.opcode != wire.Opcode.DATA:
            raise wire.WireError("bad_opcode", f"{wire.Opcode(hdr.opcode).name} is not DATA")
        if hdr.chunk_key != self.chunk_key:
            raise wire.WireError("wrong_key", f"chunk {hdr.chunk_key:#x}, reassembling {self.chunk_key:#x}")
        if hdr.generation != self.generation:
            raise wire.WireError("wrong_generation", f"generation {hdr.generation}, expected {self.generation}")
        if hdr.chunk_len != self.chunk_len:
            raise wire.WireError("wrong_length", f"chunk_len {hdr.chunk_len}, expected {self.chunk_len}")
        # wire.validate already tied frag_count and payload_len to chunk_len.

    def _copy_run(self, first: int, records: npt.NDArray[np.void]) -> None:
        """Copy the payloads of records for fragments ``first ..`` into place (rows, then a short tail if any)."""
        n = records.shape[0]
        rows = max(0, min(n, self._rows - first))
        if rows:
            self._grid_items[first : first + rows] = _payload_items(records[:rows])
        for k in range(rows, n):  # only an unpadded tail fragment falls outside the grid
            self._store(first + k, records["payload"][k])

    def _store(self, index: int, payload: npt.NDArray[np.uint8]) -> None:
        """Copy one fragment's payload to its place in the buffer (only its valid bytes for a short tail)."""
        if index < self._rows:
            self._grid_items[index : index + 1] = payload.view(_ROW)
        else:  # the tail fragment of a caller buffer that is not padded to whole fragments
            off = index * wire.FRAG_PAYLOAD
            self._buf[off : off + self._tail_len] = payload[: self._tail_len]

    def add(self, datagram: BufferLike) -> bool:
        """Store one DATA datagram; True if new, False if a duplicate; ``WireError`` if invalid."""
        view = _as_u8(datagram)
        hdr = wire.unpack_header(view.data)
        self._check_one(hdr, int(view.size))
        idx = hdr.frag_index
        if self.received[idx]:
            return False
        self._store(idx, view[wire.HEADER_LEN :])
        self._hdrs[idx].view(np.uint8)[:] = view[: wire.HEADER_LEN]
        self.received[idx] = True
        self.received_count += 1
        return True

    @staticmethod
    def _header_words(recs: npt.NDArray[np.void]) -> npt.NDArray[np.uint64]:
        """The records' compared header words as an ``(n, 4)`` array of 64-bit words (a view when possible)."""
        n = recs.size
        if recs.flags.c_contiguous:
            return recs.view(np.uint64).reshape(n, _RECORD_WORDS)[:, :_CMP_WORDS]
        return np.ascontiguousarray(recs["hdr"]).view(np.uint64).reshape(n, _HEADER_WORDS)[:, :_CMP_WORDS]

    def _invalid(self, recs: npt.NDArray[np.void]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.intp]]:
        """Per record, True where it is not a valid DATA fragment of this chunk; and the indices."""
        masked = self._header_words(recs) & _MASK_WORDS[:_CMP_WORDS]
        expect = np.frombuffer(self._expect_row, dtype=np.uint64)[:_CMP_WORDS]
        # The (n, 4) bool result viewed as one uint32 per record avoids a slow any(axis=1).
        bad: npt.NDArray[np.bool_] = (masked != expect).view(np.uint32).reshape(recs.size) != 0
        idx = recs["hdr"]["frag_index"].astype(np.intp)
        bad |= idx >= self.frag_count
        tail = np.flatnonzero(idx == self.frag_count - 1)
        if tail.size:  # the tail fragment must carry exactly the chunk's last bytes
            expect_tail = np.frombuffer(self._expect_tail, dtype=np.uint64)[:_CMP_WORDS]
            bad[tail] = (masked[tail] != expect_tail).any(axis=1)
        return bad, idx

    def _record_error(self, recs: npt.NDArray[np.void], i: int) -> wire.WireError:
        """The ``WireError`` the per-packet path gives for invalid record ``i`` (slow path, bad records only)."""
        rec = recs[i : i + 1].view(np.uint8)
        try:
            self._check_one(wire.unpack_header(rec.data), wire.DATA_DATAGRAM_LEN)
        except wire.WireError as err:
            return wire.WireError(err.reason, f"record {i}: {err}")
        raise AssertionError("vectorised and per-packet validation disagree")  # pragma: no cover

    def add_run(self, records: npt.NDArray[np.void]) -> int:
        """Store ``records`` if they are the common case; return their flags, or -1 having stored nothing.

        The common case: a non-empty run of ``DATA_PACKET_DTYPE`` records of fragments in
        order, none stored yet, every record a valid DATA fragment of this chunk (the checks
        of ``add_batch``), all with the same flags.  Anything else is left to
        ``add_batch``, which sorts it out record by record.  The headers are copied into place
        and validated there before any payload is copied, so a run that is not the common
        case costs no payload copy here.  The returned flags are every record's, so a caller
        needs no pass over the run to read them (the per-fragment flags are stored as always).
        """
        if records.dtype is not wire.DATA_PACKET_DTYPE and records.dtype != wire.DATA_PACKET_DTYPE:
            raise ValueError("records must be a 1-D array of wire.DATA_PACKET_DTYPE")
        n = records.shape[0]
        if n == 0:
            return -1
        first = int(records["hdr"]["frag_index"][0])
        end = first + n
        if end > self.frag_count or (self.received_count and self.received[first:end].any()):
            return -1
        self._hdr_items[first:end] = _header_items(records)
        # XOR out each position's own frag_index and mask what may vary (request_id, check):
        # every row of the run must then be the first row, and the first the chunk's expected
        # row once its flags are taken out (a run ending with the tail fragment: its own row).
        index, _, mask = _run_blocks(end)
        diff = np.bitwise_xor(self._hdrs[first:end], index[first:end])
        diff &= mask[:n]
        rows = diff.tobytes()
        full = n - 1 if end == self.frag_count else n
        row = _HEADER_WORDS * 8
        head = int.from_bytes(rows[:row], "big")
        flags = (head >> _FLAGS_SHIFT) & 0xFFFF
        if flags & _UNKNOWN_FLAGS:
            return -1
        if full and (head ^ (flags << _FLAGS_SHIFT) != self._expect_row_int
                     or (full > 1 and rows[row : full * row] != rows[: (full - 1) * row])):
            return -1
        if full < n and (int.from_bytes(rows[full * row :], "big") ^ (flags << _FLAGS_SHIFT)
                         != self._expect_tail_int):
            return -1
        self._copy_run(first, records)
        self.received[first:end] = True
        self.received_count += n
        return flags

    def add_batch(self, records: npt.NDArray[np.void], *, strict: bool = True) -> int:
        """Store many DATA records at once; return how many new fragments were stored.

        With ``strict`` (default) any invalid record raises ``WireError`` (the reason of
        the first one) and no fragment of the batch is marked stored.  Without it, invalid
        records are skipped and counted in ``rejected`` and, by reason, in
        ``rejected_reasons``, and the valid ones stored.
        Duplicates, inside the batch or of earlier fragments, are ignored (the first copy
        wins).
        """
        if records.ndim != 1 or (records.dtype is not wire.DATA_PACKET_DTYPE
                                 and records.dtype != wire.DATA_PACKET_DTYPE):
            raise ValueError("records must be a 1-D array of wire.DATA_PACKET_DTYPE (np.concatenate "
                             "changes the dtype; fill empty_records() or use records_view())")
        if records.size == 0:
            return 0
        n = int(records.size)
        first = int(records["hdr"]["frag_index"][0])
        end = first + n
        if end <= self.frag_count and (self.received_count == 0 or not self.received[first:end].any()):
            # The common case is a run in order into fragments not yet stored.  Copy its
            # payloads and headers into place before validating, so that validation reads
            # headers the copy just brought into cache; the run is only *marked* stored once
            # every record passed.  The slots written hold nothing stored, so a bad record
            # changes no stored data.
            self._copy_run(first, records)
            self._hdr_items[first:end] = _header_items(records)
            # Validate the whole run with flat ops on those contiguous header words: XOR out
            # each position's own frag_index and mask what may vary (request_id, known
            # flags, check); the run is valid exactly when every row is then the chunk's
            # expected row (adjacent rows compared as one flat array, the first by bytes).
            index, mask, _ = _run_blocks(end)
            diff = np.bitwise_xor(self._hdrs[first:end], index[first:end])
            diff &= mask[:n]
            # Every row equals the first, the first is a full fragment's; except that a run
            # ending with the tail fragment has the tail's own expectation in its last row.
            full = n - 1 if end == self.frag_count else n
            flat = diff[:full].reshape(-1)
            if ((full == n or diff[full].tobytes() == self._expect_tail)
                    and (full == 0 or (diff[0].tobytes() == self._expect_row
                                       and not np.count_nonzero(flat[_HEADER_WORDS:] != flat[:-_HEADER_WORDS])))):
                self.received[first:end] = True
                self.received_count += n
                return n
        payload = records["payload"]
        bad, idx = self._invalid(records)
        if bad.any():
            if strict:
                raise self._record_error(records, int(np.flatnonzero(bad)[0]))
            bad_at = np.flatnonzero(bad)
            self.rejected += int(bad_at.size)
            for i in bad_at.tolist():  # per bad record only: the reason each one failed
                self.rejected_reasons[self._record_error(records, i).reason] += 1
            keep = ~bad
            idx, payload, records = idx[keep], payload[keep], records[keep]
            if idx.size == 0:
                return 0
        # Out of order or with duplicates: keep the first copy of each fragment not yet seen.
        uniq, pos = np.unique(idx, return_index=True)
        fresh = ~self.received[uniq]
        uniq, pos = uniq[fresh], pos[fresh]
        in_grid = uniq < self._rows
        self._grid_items[uniq[in_grid]] = _payload_items(records)[pos[in_grid]]
        for i, j in zip(uniq[~in_grid], pos[~in_grid], strict=True):  # at most the tail fragment
            self._store(int(i), payload[int(j)])
        self._hdr_items[uniq] = _header_items(records)[pos]
        self.received[uniq] = True
        self.received_count += int(uniq.size)
        return int(uniq.size)
