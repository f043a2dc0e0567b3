"""Chunk bundles: packed by ``pack_bundle``, read back whole (``unpack_bundle``) or from the pieces an
answer arrived in (``split_bundle``, what ``AgentClient.fetch_chunks`` uses)."""

from __future__ import annotations

import pytest

from hostagent.api import pack_bundle, split_bundle, unpack_bundle


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
