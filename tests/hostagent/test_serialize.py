"""Chunk serialization: bit-exact round trips, zero-copy views, int8 error bound, bad blobs."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from hostagent.serialize import (
    DTYPE_CODES,
    FORMAT_VERSION,
    MAGIC,
    ChecksumError,
    ChunkFormatError,
    Quant,
    deserialize,
    header_len,
    parse_header,
    serialize,
    serialize_into,
    serialize_parts,
    serialized_size,
    tensor_bytes,
)

CHUNK_SHAPE = (2, 2, 3, 16, 8)  # [layers, k/v, kv_heads, tokens, head_dim]


def _bits(t: torch.Tensor) -> bytes:
    """The tensor's raw bytes, so NaN payloads and -0.0 compare exactly."""
    return bytes(tensor_bytes(t.contiguous()))


def _random(dtype: torch.dtype, shape: tuple[int, ...] = CHUNK_SHAPE, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
def test_round_trip_bit_exact(dtype: torch.dtype) -> None:
    t = _random(dtype)
    blob = serialize(t)
    assert len(blob) == serialized_size(t) == header_len(5) + t.numel() * t.element_size()
    back = deserialize(blob)
    assert back.dtype == dtype and back.shape == t.shape
    assert _bits(back) == _bits(t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_special_values_survive(dtype: torch.dtype) -> None:
    t = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-8, 65504.0]).to(dtype)
    assert _bits(deserialize(serialize(t))) == _bits(t)


def test_header_describes_tensor() -> None:
    t = _random(torch.bfloat16)
    hdr = parse_header(serialize(t))
    assert hdr.dtype == torch.bfloat16 and hdr.shape == CHUNK_SHAPE and hdr.quant == Quant.NONE
    assert hdr.header_len % 16 == 0 and hdr.payload_len == t.numel() * 2
    assert bytes(serialize(t)[:4]) == MAGIC


def test_odd_shapes() -> None:
    odd = (torch.tensor(3.5), torch.empty(0, 4), torch.arange(7, dtype=torch.int16), _random(torch.float16, (1,) * 8))
    for t in odd:
        back = deserialize(serialize(t))
        assert back.shape == t.shape and back.dtype == t.dtype and _bits(back) == _bits(t)


def test_non_contiguous_tensor_serialized_in_logical_order() -> None:
    t = _random(torch.float32).transpose(2, 3)
    assert torch.equal(deserialize(serialize(t)), t)


def test_deserialize_is_zero_copy_on_writable_buffers() -> None:
    t = _random(torch.float16)
    blob = serialize(t)
    back = deserialize(blob)
    base = np.frombuffer(blob, dtype=np.uint8).ctypes.data
    assert base <= back.data_ptr() < base + len(blob)  # the tensor lives inside the blob
    blob[-2:] = b"\x00\x3c"  # fp16 1.0, written into the blob after the fact...
    assert back.reshape(-1)[-1].item() == 1.0  # ...is visible through the tensor: no copy
    own = deserialize(blob, verify=False, copy=True)
    assert not (base <= own.data_ptr() < base + len(blob))
    readonly = deserialize(bytes(blob), verify=False)  # bytes cannot be shared writable
    assert _bits(readonly) == _bits(own)


def test_tensor_bytes_aliases_storage() -> None:
    t = torch.zeros(4, dtype=torch.bfloat16)
    view = tensor_bytes(t)
    assert len(view) == 8
    view[0:2] = torch.tensor([2.0], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    assert t[0].item() == 2.0
    with pytest.raises(ValueError, match="contiguous"):
        tensor_bytes(torch.zeros(4, 4).t())


def test_serialize_into_and_parts() -> None:
    t = _random(torch.bfloat16)
    want = bytes(serialize(t))
    out = bytearray(len(want) + 100)
    assert serialize_into(t, out) == len(want)
    assert bytes(out[: len(want)]) == want
    head, payload = serialize_parts(t)
    assert head + bytes(payload) == want
    with pytest.raises(ValueError, match="needs"):
        serialize_into(t, bytearray(len(want) - 1))
    with pytest.raises(ValueError, match="writable"):
        serialize_into(t, bytes(len(want)))  # type: ignore[arg-type]


def test_unsupported_tensors_rejected() -> None:
    with pytest.raises(ChunkFormatError, match="dtype"):
        serialize(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ChunkFormatError, match="floating"):
        serialize(torch.zeros(3, dtype=torch.int32), Quant.INT8)
    for bad in ("nan", "inf", "-inf"):
        with pytest.raises(ChunkFormatError, match="finite"):
            serialize(torch.tensor([[1.0, 2.0], [1.0, float(bad)]]), Quant.INT8)
    with pytest.raises(ChunkFormatError, match="dimensions"):
        serialize(torch.zeros((1,) * 9))


# ------------------------------------------------------------------------------ int8


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int8_error_bound(dtype: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes, heavy tails and an all-zero row.
    x = torch.randn(CHUNK_SHAPE, generator=g) * torch.logspace(-3, 3, CHUNK_SHAPE[-2]).reshape(-1, 1)
    x[..., 3] = torch.distributions.StudentT(2.0).sample(x[..., 3].shape)
    x[0, 0, 0, 0, :] = 0
    x = x.to(dtype)
    before = x.clone()
    blob = serialize(x, Quant.INT8)
    assert _bits(x) == _bits(before)  # quantization works on a private copy
    assert parse_header(blob).quant == Quant.INT8
    back = deserialize(blob)
    assert back.dtype == dtype and back.shape == x.shape
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127
    err = (back.to(torch.float32) - xf).abs()
    # Stated bound: scale/2 per element, plus (for 16-bit dtypes) half an ulp of x' from
    # rounding the float32 result back; float32's own rounding gets a relative 1e-6.
    half_ulp = back.to(torch.float32).abs() * (torch.finfo(dtype).eps / 2 if dtype != torch.float32 else 0.0)
    bound = scale / 2 * (1 + 1e-6) + half_ulp
    assert bool((err <= bound).all()), float((err - bound).max())
    assert bool((back[0, 0, 0, 0] == 0).all())
    # The bound is tight enough to matter: the error is not trivially zero.
    assert float(err.max()) > 0
    # 1 byte per value + a float32 scale per row of head_dim values.
    rows = x.numel() // x.shape[-1]
    assert parse_header(blob).payload_len == x.numel() + 4 * rows


def test_int8_blob_checksummed() -> None:
    blob = serialize(_random(torch.float16), Quant.INT8)
    blob[-1] ^= 1
    with pytest.raises(ChecksumError):
        deserialize(blob)


# ------------------------------------------------------------------------------ bad blobs


def _blob() -> bytearray:
    return serialize(_random(torch.float16))


def test_truncated_and_trailing() -> None:
    blob = _blob()
    for n in (0, 3, 23, 24, header_len(5) - 1, header_len(5), len(blob) - 1):
        with pytest.raises(ChunkFormatError, match="truncated"):
            deserialize(blob[:n])
    with pytest.raises(ChunkFormatError, match="trailing"):
        deserialize(blob + b"\0")


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [(0, ord("X"), "magic"), (4, FORMAT_VERSION + 1, "version"), (5, 0, "dtype code"),
     (5, 200, "dtype code"), (6, 9, "quantization"), (7, 9, "ndim"), (7, 4, "payload_len"),
     (8, 1, "payload_len"), (6, int(Quant.INT8), "payload_len")],
)
def test_bad_header_fields(offset: int, value: int, message: str) -> None:
    blob = _blob()
    blob[offset] = value
    with pytest.raises(ChunkFormatError, match=message):
        deserialize(blob)


def test_int8_of_integer_dtype_is_invalid_blob() -> None:
    blob = serialize(torch.zeros(4, 8, dtype=torch.int32))
    blob[6] = int(Quant.INT8)
    with pytest.raises(ChunkFormatError, match="int8 quantization"):
        parse_header(blob)


def test_flipped_bits_caught_by_checksum() -> None:
    blob = _blob()
    rng = np.random.default_rng(0)
    hlen = header_len(5)
    for pos in [hlen, len(blob) - 1, *rng.integers(hlen, len(blob), 20)]:
        bad = bytearray(blob)
        bad[int(pos)] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(ChecksumError):
            deserialize(bad)
    # Header fields are covered too: fp16 <-> bf16 have the same size and shape.
    bad = bytearray(blob)
    bad[5] = DTYPE_CODES[torch.bfloat16]
    with pytest.raises(ChecksumError):
        deserialize(bad)
    # A shape that multiplies to the same size: (2,2,3,16,8) -> (2,2,3,8,16).
    dims = list(struct.unpack_from("<5Q", blob, 24))
    dims[3], dims[4] = dims[4], dims[3]
    bad = bytearray(blob)
    struct.pack_into("<5Q", bad, 24, *dims)
    with pytest.raises(ChecksumError):
        deserialize(bad)
    # verify=False trusts the caller and skips only the checksum.
    assert deserialize(bad, verify=False).shape == (2, 2, 3, 8, 16)


def test_numpy_buffers_in_and_out() -> None:
    t = _random(torch.float32)
    out = np.zeros(serialized_size(t), dtype=np.uint8)
    serialize_into(t, out)
    back = deserialize(out)
    assert torch.equal(back, t)
    assert back.data_ptr() == out.ctypes.data + header_len(t.dim())  # built on the array, no copy
    with pytest.raises(ValueError, match="C-contiguous"):
        deserialize(np.zeros((4, 200), dtype=np.uint8)[:, ::2])


def test_envelope_checks_a_blob_without_torch_and_refuses_what_is_not_one() -> None:
    from hostagent import envelope

    blob = serialize(torch.randn(*CHUNK_SHAPE))
    assert envelope.verify(blob) is True and envelope.verify(memoryview(blob)) is True
    assert envelope.verify(np.frombuffer(bytes(blob), dtype=np.uint8)) is True
    assert envelope.embedded_checksum(blob) == parse_header(blob).checksum
    for pos in (0, 5, 17, 24, len(blob) - 1):  # magic, dtype code, checksum, shape, payload
        bad = bytearray(blob)
        bad[pos] ^= 0x04
        assert envelope.verify(bad) is not True
    assert envelope.verify(bytes(blob[:-1])) is None  # length does not match the header
    assert envelope.verify(b"KVPC") is None and envelope.verify(b"not a chunk at all, just bytes") is None
