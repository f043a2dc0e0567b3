"""Chunk keys: deterministic, prefix-chained, full blocks only."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch

from hostagent.chunking import ROOT_KEY, ChunkRef, block_key, chunk_keys, chunk_refs, full_blocks, salt_root

MODEL = "Qwen/Qwen2.5-0.5B"
TOKENS = list(range(1000, 1100))


def test_only_full_blocks_are_chunks() -> None:
    refs = chunk_refs(MODEL, TOKENS, 16)
    assert len(refs) == 6 == full_blocks(100, 16)
    assert refs[0] == ChunkRef(refs[0].key, ROOT_KEY, 0, 0, 16)
    assert [(r.index, r.token_start, r.token_end) for r in refs][-1] == (5, 80, 96)
    assert all(r.num_tokens == 16 for r in refs)
    assert chunk_keys(MODEL, TOKENS[:15], 16) == []
    assert chunk_keys(MODEL, [], 16) == []


def test_keys_chain_through_parents() -> None:
    refs = chunk_refs(MODEL, TOKENS, 16)
    for prev, ref in itertools.pairwise(refs):
        assert ref.parent_key == prev.key
        assert ref.key == block_key(MODEL, prev.key, TOKENS[ref.token_start : ref.token_end])
    assert refs[0].key == block_key(MODEL, ROOT_KEY, TOKENS[:16])


def test_matches_the_documented_hash() -> None:
    model = MODEL.encode()
    h = hashlib.blake2b(digest_size=8, person=b"kvpool-chunk-v1")
    h.update(len(model).to_bytes(4, "little") + model + (0).to_bytes(8, "little"))
    h.update(np.arange(1000, 1004, dtype="<u4").tobytes())
    assert chunk_keys(MODEL, TOKENS[:4], 4)[0] == int.from_bytes(h.digest(), "little")


def test_equal_prefixes_give_equal_keys_and_diverge_after() -> None:
    a = TOKENS[:64]
    b = [*TOKENS[:40], 7, *TOKENS[41:64]]  # differs in block 2 (tokens 32..47)
    ka, kb = chunk_keys(MODEL, a, 16), chunk_keys(MODEL, b, 16)
    assert ka[:2] == kb[:2]
    # A key implies its whole prefix: once blocks differ, every later key differs too,
    # even where the block's own tokens (block 3) are identical.
    assert ka[2] != kb[2] and ka[3] != kb[3]
    assert a[48:64] == b[48:64]


def test_longer_prompt_extends_key_list() -> None:
    assert chunk_keys(MODEL, TOKENS, 8)[:5] == chunk_keys(MODEL, TOKENS[:45], 8)


def test_model_and_block_size_scope_keys() -> None:
    assert chunk_keys(MODEL, TOKENS, 16) != chunk_keys("other/model", TOKENS, 16)
    assert chunk_keys(MODEL, TOKENS, 16)[0] != chunk_keys(MODEL, TOKENS, 8)[0]
    # Length prefix: moving a byte between model id and tokens cannot collide.
    assert block_key("a", 0, [1]) != block_key("a\x01", 0, [])


def test_input_types_agree() -> None:
    want = chunk_keys(MODEL, TOKENS, 16)
    assert chunk_keys(MODEL, tuple(TOKENS), 16) == want
    assert chunk_keys(MODEL, np.array(TOKENS, dtype=np.int64), 16) == want
    assert chunk_keys(MODEL, np.array(TOKENS, dtype=np.int32), 16) == want
    assert chunk_keys(MODEL, torch.tensor(TOKENS).numpy(), 16) == want


def test_keys_are_64_bit_and_never_root() -> None:
    keys = chunk_keys(MODEL, list(range(16 * 200)), 16)
    assert len(set(keys)) == 200
    assert all(0 < k < 1 << 64 for k in keys)


def test_deterministic_across_processes() -> None:
    # A fresh interpreter has a different PYTHONHASHSEED; keys must not change.
    code = f"from hostagent.chunking import chunk_keys; print(chunk_keys({MODEL!r}, list(range(1000, 1100)), 16))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "12345"}).stdout
    assert out.strip() == str(chunk_keys(MODEL, TOKENS, 16))


@pytest.mark.parametrize(
    ("tokens", "block", "model", "message"),
    [([-1] * 16, 16, MODEL, "0.."), ([1 << 32] * 16, 16, MODEL, "0.."), ([[1, 2]], 1, MODEL, "1-D"),
     ([1.5] * 16, 16, MODEL, "integers"), (TOKENS, 0, MODEL, "block_size"), (TOKENS, 16, "", "model_id")],
)
def test_bad_input(tokens: list[int], block: int, model: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chunk_keys(model, tokens, block)


def test_bad_parent_key() -> None:
    with pytest.raises(ValueError, match="64-bit"):
        block_key(MODEL, 1 << 64, [1])


def test_salts_separate_whole_chains() -> None:
    tokens = list(range(64))
    plain = chunk_keys("m", tokens, 16)
    a = chunk_keys("m", tokens, 16, salt="tenant-a")
    b = chunk_keys("m", tokens, 16, salt="tenant-b")
    assert chunk_keys("m", tokens, 16, salt=None) == plain
    assert a == chunk_keys("m", tokens, 16, salt="tenant-a")  # a salt is as deterministic as no salt
    assert not set(a) & set(b) and not set(a) & set(plain) and not set(b) & set(plain)
    assert chunk_keys("m2", tokens, 16, salt="tenant-a")[0] != a[0]  # the model id still scopes
    assert chunk_keys("m", tokens, 16, salt="")[0] != plain[0]  # an empty salt is a salt
    refs = chunk_refs("m", tokens, 16, salt="tenant-a")
    assert refs[0].parent_key == salt_root("m", "tenant-a") != 0 and refs[1].parent_key == a[0]
