"""Chunk tensors to self-describing byte blobs and back, without copies where possible.

Blob layout (little-endian), header padded to a multiple of 16 bytes so the payload's
elements stay aligned when the blob itself is::

    0   magic        4s   b"KVPC"
    4   version      u8   FORMAT_VERSION
    5   dtype code   u8   see DTYPE_CODES (the tensor's dtype, also when quantized)
    6   quant mode   u8   Quant
    7   ndim         u8   0..MAX_NDIM
    8   payload_len  u64  bytes after the header
    16  checksum     u64  xxh3_64 over header bytes 0..15, the shape and the payload
    24  shape        ndim x u64
    ..  zero padding to the header length
    ..  payload

Payload by quantization mode:

* ``Quant.NONE``: the tensor's raw bytes, C order, little-endian.  bf16 and fp8 travel
  as their bit patterns (numpy has no bf16; torch reinterprets them with ``view``).
* ``Quant.INT8``: symmetric per-row int8.  A *row* is the tensor's last dimension (for
  a chunk ``[layers, 2, kv_heads, tokens, head_dim]``: one head's vector for one token),
  so each row gets its own ``scale = absmax(row) / 127`` stored as float32, followed by
  the int8 values ``q = round(x / scale)``.  Dequantized ``x' = q * scale``.
  **Error bound**: ``|x - x'| <= scale / 2`` per element (computed in float32; rounding
  x' back to a 16-bit dtype adds at most half a unit in the last place of x').
  Non-finite values cannot be quantized and are rejected.

The checksum covers the header as well as the payload, so a flipped dtype or shape
byte is caught like a flipped payload byte.  Any malformed blob raises
``ChunkFormatError`` (``ChecksumError`` for a checksum mismatch); a corrupt tensor is
never returned.  The fixed fields and the checksum are defined in ``hostagent.envelope``,
which needs no torch: the agent's transport checks every fetched chunk with it.
"""

from __future__ import annotations

import enum
import struct
import sys
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

from hostagent.envelope import CHECKSUM_OFFSET as _CHECKSUM_OFFSET
from hostagent.envelope import FIXED as _FIXED
from hostagent.envelope import FIXED_LEN as _FIXED_LEN
from hostagent.envelope import FORMAT_VERSION as FORMAT_VERSION
from hostagent.envelope import MAGIC as MAGIC
from hostagent.envelope import MAX_NDIM as MAX_NDIM
from hostagent.envelope import checksum as _checksum
from hostagent.envelope import header_len as header_len

INT8_LEVELS: Final = 127
"""Largest int8 magnitude used: symmetric quantization keeps -128 unused."""



class ChunkFormatError(ValueError):
    """A blob that is not a valid serialized chunk (truncated, bad magic, unknown dtype...)."""


class ChecksumError(ChunkFormatError):
    """A blob whose checksum does not match its content: corrupted in transit or storage."""


class Quant(enum.IntEnum):
    """How the payload encodes the tensor's values."""

    NONE = 0
    INT8 = 1


DTYPE_CODES: Final[dict[torch.dtype, int]] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.float64: 4,
    torch.int8: 5,
    torch.uint8: 6,
    torch.int16: 7,
    torch.int32: 8,
    torch.int64: 9,
    torch.float8_e4m3fn: 10,
    torch.float8_e5m2: 11,
}
"""Wire code of every supported dtype; codes are part of the format, never renumber."""

CODE_DTYPES: Final = {code: dtype for dtype, code in DTYPE_CODES.items()}
_QUANT_CODES: Final = frozenset(int(q) for q in Quant)

WritableBuffer = bytearray | memoryview | npt.NDArray[np.uint8]
"""A writable, contiguous byte buffer (a reassembly buffer, a bytearray, a numpy array)."""
ReadableBuffer = bytes | WritableBuffer
"""Any contiguous byte buffer."""
_QUANTIZABLE: Final = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """The decoded header of a serialized chunk."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    quant: Quant
    payload_len: int
    checksum: int
    header_len: int

    @property
    def numel(self) -> int:
        """Elements in the tensor."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def total_len(self) -> int:
        """Bytes of the whole blob."""
        return self.header_len + self.payload_len


def _payload_len(dtype: torch.dtype, shape: tuple[int, ...], quant: Quant) -> int:
    """Payload bytes of a tensor with this dtype and shape under ``quant``."""
    numel = 1
    for d in shape:
        numel *= d
    if quant == Quant.NONE:
        return numel * torch.empty((), dtype=dtype).element_size()
    rows = numel // shape[-1] if shape and shape[-1] else 0
    return 4 * rows + numel


def serialized_size(tensor: torch.Tensor, quant: Quant = Quant.NONE) -> int:
    """Bytes ``serialize`` produces for ``tensor``."""
    return blob_size(tensor.dtype, tuple(tensor.shape), quant)


def blob_size(dtype: torch.dtype, shape: tuple[int, ...], quant: Quant = Quant.NONE) -> int:
    """Bytes of the blob of a ``dtype`` tensor of ``shape`` (what a buffer for it must hold)."""
    return header_len(len(shape)) + _payload_len(dtype, shape, quant)


def _check_tensor(tensor: torch.Tensor, quant: Quant) -> None:
    """Reject tensors this format cannot carry, with a message saying what to change."""
    if tensor.dtype not in DTYPE_CODES:
        raise ChunkFormatError(f"dtype {tensor.dtype} not supported; use one of {sorted(map(str, DTYPE_CODES))}")
    if tensor.dim() > MAX_NDIM:
        raise ChunkFormatError(f"{tensor.dim()}-D tensor, at most {MAX_NDIM} dimensions")
    if quant == Quant.INT8:
        if tensor.dtype not in _QUANTIZABLE:
            raise ChunkFormatError(f"int8 quantization needs a floating dtype, got {tensor.dtype}")
        if tensor.dim() == 0:
            raise ChunkFormatError("int8 quantization needs at least one dimension (rows are the last)")
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        raise ChunkFormatError("serialization assumes a little-endian host")


def _byte_view(buf: ReadableBuffer) -> memoryview:
    """A flat byte memoryview of ``buf`` without copying."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("buffer array must be C-contiguous")
        return buf.reshape(-1).view(np.uint8).data
    return memoryview(buf).cast("B")


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A read-write byte view of a contiguous CPU tensor's storage, without copying."""
    if tensor.device.type != "cpu":
        raise ValueError(f"tensor on {tensor.device}; move it to the CPU first (one copy)")
    if not tensor.is_contiguous():
        raise ValueError("tensor is not contiguous; call .contiguous() first (one copy)")
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    # view(uint8) reinterprets the storage (bf16 and fp8 included); numpy shares it.
    arr: npt.NDArray[np.uint8] = flat.view(torch.uint8).numpy()
    return arr.data


def _encode_header(dtype: torch.dtype, shape: tuple[int, ...], quant: Quant, payload_len: int,
                   out: memoryview) -> int:
    """Write the header (checksum zero) into ``out``; return its length."""
    hlen = header_len(len(shape))
    _FIXED.pack_into(out, 0, MAGIC, FORMAT_VERSION, DTYPE_CODES[dtype], int(quant), len(shape), payload_len, 0)
    struct.pack_into(f"<{len(shape)}Q", out, _FIXED_LEN, *shape)
    out[_FIXED_LEN + 8 * len(shape) : hlen] = bytes(hlen - _FIXED_LEN - 8 * len(shape))
    return hlen


def quantize_int8(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: ``(q, scale)`` with ``q`` int8 of the same shape, ``scale`` float32 per row."""
    # A private float32 copy: the ops below work in place on it.
    x = tensor.detach().to(torch.float32, copy=True).reshape(-1, tensor.shape[-1])
    # absmax as max(max, -min): two reductions, no |x| temporary.
    scale = torch.maximum(x.amax(dim=1), x.amin(dim=1).neg_()).div_(INT8_LEVELS)
    # inf and nan propagate into their row's scale: checking the scales is a full
    # finiteness check at a fraction of the cost of isfinite() over every value.
    if not bool(torch.isfinite(scale).all()):
        raise ChunkFormatError("int8 quantization needs finite values (found inf or nan)")
    # A zero row keeps scale 0 and q 0; dividing by 1 there avoids 0/0.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = x.div_(safe[:, None]).round_().clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)
    return q.reshape(tensor.shape), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of ``quantize_int8``: ``q * scale`` per row, in float32, then cast to ``dtype``."""
    x = q.reshape(-1, q.shape[-1]).to(torch.float32) * scale[:, None]
    return x.reshape(q.shape).to(dtype)


def serialize_into(tensor: torch.Tensor, out: WritableBuffer, quant: Quant = Quant.NONE) -> int:
    """Serialize ``tensor`` into the writable buffer ``out``; return the bytes written.

    The payload is copied once, straight from the tensor's storage into ``out``.
    """
    quant = Quant(quant)
    _check_tensor(tensor, quant)
    shape = tuple(tensor.shape)
    plen = _payload_len(tensor.dtype, shape, quant)
    hlen = header_len(len(shape))
    view = _byte_view(out)
    if view.readonly:
        raise ValueError("out must be writable")
    if len(view) < hlen + plen:
        raise ValueError(f"out holds {len(view)} bytes, the blob needs {hlen + plen}")
    _encode_header(tensor.dtype, shape, quant, plen, view)
    body = np.frombuffer(view, dtype=np.uint8, count=plen, offset=hlen)
    if quant == Quant.NONE:
        src = tensor.detach().cpu().contiguous()
        body[:] = np.frombuffer(tensor_bytes(src), dtype=np.uint8)
    else:
        q, scale = quantize_int8(tensor.cpu())
        rows = scale.numel()
        body[: 4 * rows] = scale.numpy().view(np.uint8)
        body[4 * rows :] = q.reshape(-1).numpy().view(np.uint8)
    struct.pack_into("<Q", view, _CHECKSUM_OFFSET, _checksum(view[:hlen], view[hlen : hlen + plen]))
    return hlen + plen


def serialize(tensor: torch.Tensor, quant: Quant = Quant.NONE) -> bytearray:
    """Serialize ``tensor`` into a new blob (header + payload)."""
    out = bytearray(serialized_size(tensor, quant))
    serialize_into(tensor, out, quant)
    return out


def serialize_parts(tensor: torch.Tensor) -> tuple[bytes, memoryview]:
    """Header bytes and a zero-copy view of the payload, for scatter-gather senders.

    ``header + payload`` equals ``serialize(tensor)``; the payload view aliases the
    tensor's storage, so the tensor must not change until the bytes are sent.
    """
    _check_tensor(tensor, Quant.NONE)
    payload = tensor_bytes(tensor)
    shape = tuple(tensor.shape)
    hdr = bytearray(header_len(len(shape)))
    hv = memoryview(hdr)
    _encode_header(tensor.dtype, shape, Quant.NONE, len(payload), hv)
    struct.pack_into("<Q", hv, _CHECKSUM_OFFSET, _checksum(hv, payload))
    return bytes(hdr), payload


def parse_header(blob: ReadableBuffer) -> ChunkHeader:
    """Decode and check a blob's header (not the checksum); raises ``ChunkFormatError``."""
    view = _byte_view(blob)
    if len(view) < _FIXED_LEN:
        raise ChunkFormatError(f"truncated: {len(view)} bytes, a header needs at least {_FIXED_LEN}")
    magic, version, dcode, qcode, ndim, plen, checksum = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise ChunkFormatError(f"bad magic {magic!r}, expected {MAGIC!r}: not a kvpool chunk")
    if version != FORMAT_VERSION:
        raise ChunkFormatError(f"format version {version}, this code reads {FORMAT_VERSION}")
    if dcode not in CODE_DTYPES:
        raise ChunkFormatError(f"unknown dtype code {dcode}")
    if qcode not in _QUANT_CODES:
        raise ChunkFormatError(f"unknown quantization mode {qcode}")
    if ndim > MAX_NDIM:
        raise ChunkFormatError(f"ndim {ndim} exceeds {MAX_NDIM}")
    hlen = header_len(ndim)
    if len(view) < hlen:
        raise ChunkFormatError(f"truncated: {len(view)} bytes, the header needs {hlen}")
    shape = struct.unpack_from(f"<{ndim}Q", view, _FIXED_LEN)
    dtype, quant = CODE_DTYPES[dcode], Quant(qcode)
    if quant == Quant.INT8 and (dtype not in _QUANTIZABLE or ndim == 0):
        raise ChunkFormatError(f"int8 quantization of a {ndim}-D {dtype} tensor is not a valid blob")
    if plen != _payload_len(dtype, shape, quant):
        raise ChunkFormatError(f"payload_len {plen} does not match shape {shape} of {dtype} ({quant.name})")
    if len(view) != hlen + plen:
        what = "truncated" if len(view) < hlen + plen else "trailing bytes"
        raise ChunkFormatError(f"{what}: blob of {len(view)} bytes, header says {hlen + plen}")
    return ChunkHeader(dtype, tuple(shape), quant, plen, checksum, hlen)


def deserialize(blob: ReadableBuffer, *, verify: bool = True, copy: bool = False) -> torch.Tensor:
    """Rebuild the tensor from a blob; raises ``ChunkFormatError`` / ``ChecksumError``.

    For an unquantized blob in a writable buffer (a ``bytearray``, a reassembly buffer)
    the tensor is built with ``torch.frombuffer`` on that buffer: no copy, and it shares
    the buffer's memory.  A read-only buffer (``bytes``) or ``copy=True`` gives a tensor
    of its own.  ``verify=False`` skips the checksum (only for data already verified).
    """
    view = _byte_view(blob)
    hdr = parse_header(view)
    payload = view[hdr.header_len :]
    if verify:
        got = _checksum(view[: hdr.header_len], payload)
        if got != hdr.checksum:
            raise ChecksumError(f"checksum mismatch: blob says {hdr.checksum:#018x}, content gives {got:#018x}")
    if hdr.numel == 0:
        return torch.empty(hdr.shape, dtype=hdr.dtype)
    if hdr.quant == Quant.INT8:
        rows = hdr.numel // hdr.shape[-1]
        scale = torch.frombuffer(_writable(payload[: 4 * rows]), dtype=torch.float32)
        q = torch.frombuffer(_writable(payload[4 * rows :]), dtype=torch.int8).reshape(hdr.shape)
        return dequantize_int8(q, scale, hdr.dtype)
    if copy or payload.readonly:
        payload = memoryview(bytearray(payload))
    return torch.frombuffer(payload, dtype=hdr.dtype).reshape(hdr.shape)


def _writable(view: memoryview) -> memoryview:
    """``view`` itself if writable, else a private copy (torch.frombuffer warns on read-only)."""
    return memoryview(bytearray(view)) if view.readonly else view
