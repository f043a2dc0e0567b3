"""Chunk bundles: packed by ``pack_bundle``, read back whole (``unpack_bundle``) or from the pieces an
answer arrived in (``split_bundle``, what ``AgentClient.fetch_chunks`` uses), or into the caller's buffer
(``split_bundle_into``, what ``AgentClient.fetch_chunks_into`` uses)."""

from __future__ import annotations

import numpy as np
import pytest

from hostagent.api import (
    CHUNK_ALIGN,
    BufferTooSmallError,
    bundle_space,
    pack_bundle,
    split_bundle,
    split_bundle_into,
    unpack_bundle,
)
from kvpool.http_client import PiecesReader


def _body(keys: list[int], blobs: list[bytes]) -> bytes:
    return b"".join(bytes(p) for p in pack_bundle(keys, blobs))


@pytest.mark.parametrize("cut", [1, 3, 8, 17, 4096, 1 << 20])
def test_split_bundle_reads_any_cut_of_the_body(cut: int) -> None:
    keys = [0x1F, 2, 0xFFFF_FFFF_FFFF_FFFF]
    blobs = [bytes(range(256)) * 20, b"x", bytes(7000)]
    body = _body(keys, blobs)
    pieces = [body[i : i + cut] for i in range(0, len(body), cut)]
    got_keys, got = split_bundle(pieces)
    assert (got_keys, got) == (keys, blobs)
    assert all(type(b) is bytes for b in got)
    assert (got_keys, [bytes(v) for v in unpack_bundle(body)[1]]) == (keys, blobs)


@pytest.mark.parametrize(("body", "words"), [
    (b"", "more bytes"),
    (_body([1], [b"abc"])[:-1], "chunk bytes"),
    (_body([1], [b"abc"]) + b"!", "chunk bytes"),
    ((5).to_bytes(8, "little"), "cannot hold their index"),
])
def test_split_bundle_refuses_a_malformed_body(body: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        split_bundle([body])


@pytest.mark.parametrize("cut", [1, 17, 4096, 1 << 20])
@pytest.mark.parametrize("start", [0, 1, 63])
def test_split_bundle_into_places_each_chunk_aligned_in_the_buffer(cut: int, start: int) -> None:
    keys = [0x1F, 2, 3]
    blobs = [bytes(range(256)) * 20, b"x", bytes(7000)]
    body = _body(keys, blobs)
    backing = bytearray(b"\xab" * (bundle_space([len(b) for b in blobs]) + 64 + start))
    out = memoryview(backing)[start : start + bundle_space([len(b) for b in blobs])]
    got_keys, views = split_bundle_into(PiecesReader([body[i : i + cut] for i in range(0, len(body), cut)]), out)
    assert (got_keys, [bytes(v) for v in views]) == (keys, blobs)
    base = int(np.frombuffer(backing, dtype=np.uint8).ctypes.data)
    for v in views:
        addr = int(np.frombuffer(v, dtype=np.uint8).ctypes.data)
        assert v.obj is out.obj and addr % CHUNK_ALIGN == 0 and base + start <= addr
    assert backing[start + len(out):] == b"\xab" * (len(backing) - start - len(out))


def test_split_bundle_into_refuses_a_short_buffer_before_writing() -> None:
    body = _body([1, 2], [b"a" * 100, b"b" * 100])
    buf = bytearray(b"\xab" * 150)
    with pytest.raises(BufferTooSmallError) as err:
        split_bundle_into(PiecesReader([body]), memoryview(buf))
    assert err.value.needed >= 164 and buf == b"\xab" * 150
    with pytest.raises(ValueError, match="writable"):
        split_bundle_into(PiecesReader([body]), memoryview(bytes(400)))
