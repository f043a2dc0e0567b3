"""Chunk identity: 64-bit keys chained over a prompt's full blocks of tokens.

A prompt of token ids is cut into blocks of ``block_size`` tokens; only full blocks are
chunks (a partial tail is recomputed, never shared).  Block ``i``'s key is::

    blake2b(digest_size=8, person=b"kvpool-chunk-v1",
            len(model_id) u32 LE || model_id UTF-8 || parent_key u64 LE || tokens as u32 LE)

read as a little-endian integer, where ``parent_key`` is block ``i-1``'s key (``ROOT_KEY``
for the first block).  So equal prefixes give equal keys on every process and machine
(unlike Python's randomised ``hash()``), and because each key folds in its parent, a key
implies its whole prefix: two prompts share block ``i``'s key only if they share every
token up to the end of block ``i`` (up to 64-bit collisions).  The model id scopes keys
to one model (and should name anything else that changes the KV: revision, dtype).

A *salt* (a tenant's secret, vLLM's per-request ``cache_salt``) replaces ``ROOT_KEY`` as the
first block's parent with ``salt_root(model_id, salt)``, so its whole chain differs: prompts
under different salts (or one salted, one not) never share a key.  This separates tenants
that do not know each other's salt; it does not stop anyone who knows a key from asking for
its chunk.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

ROOT_KEY: Final = 0
"""Parent key of a prompt's first block; no chunk has this key (see ``block_key``)."""

_PERSON: Final = b"kvpool-chunk-v1"
_SALT_PERSON: Final = b"kvpool-salt-v1"
_MAX_TOKEN: Final = 0xFFFF_FFFF

TokenIds = Sequence[int] | npt.NDArray[np.integer]
"""Token ids as a list/tuple of ints or a 1-D integer array (a CPU tensor's ``.numpy()``)."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One full block of a prompt: its key, its parent's key and the tokens it covers."""

    key: int
    parent_key: int
    index: int
    token_start: int
    token_end: int

    @property
    def num_tokens(self) -> int:
        """Tokens in the block (the block size)."""
        return self.token_end - self.token_start


def _token_bytes(token_ids: TokenIds) -> bytes:
    """Token ids as little-endian uint32 bytes; rejects ids that do not fit."""
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"token_ids must be integers, got {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _MAX_TOKEN):
        raise ValueError(f"token ids must lie in 0..{_MAX_TOKEN}")
    return arr.astype("<u4", copy=False).tobytes()


def _model_prefix(model_id: str) -> bytes:
    """Length-prefixed model id, so ("ab", ...) and ("a", "b...") can never hash alike."""
    if not model_id:
        raise ValueError("model_id must not be empty")
    raw = model_id.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def _digest(prefix: bytes, parent_key: int, block: bytes) -> int:
    """The chained hash of one block; 0 is remapped to 1 so ROOT_KEY stays unused."""
    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    h.update(prefix)
    h.update(parent_key.to_bytes(8, "little"))
    h.update(block)
    return int.from_bytes(h.digest(), "little") or 1


def salt_root(model_id: str, salt: str | None) -> int:
    """Parent key of a prompt's first block under ``salt`` (``ROOT_KEY`` without one)."""
    if salt is None:
        return ROOT_KEY
    h = hashlib.blake2b(digest_size=8, person=_SALT_PERSON)
    h.update(_model_prefix(model_id))
    h.update(salt.encode("utf-8"))
    return int.from_bytes(h.digest(), "little") or 1


def block_key(model_id: str, parent_key: int, block_tokens: TokenIds) -> int:
    """Key of one block given its parent's key (``ROOT_KEY`` for a prompt's first block)."""
    if not 0 <= parent_key < 1 << 64:
        raise ValueError(f"parent_key {parent_key} is not a 64-bit unsigned key")
    return _digest(_model_prefix(model_id), parent_key, _token_bytes(block_tokens))


def chunk_refs(model_id: str, token_ids: TokenIds, block_size: int, *, salt: str | None = None) -> list[ChunkRef]:
    """The chunks of every full block of ``token_ids``, in prompt order (``salt``: see the module docstring)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    prefix = _model_prefix(model_id)
    data = _token_bytes(token_ids)
    step = 4 * block_size
    refs: list[ChunkRef] = []
    parent = salt_root(model_id, salt)
    for i in range(len(data) // step):
        key = _digest(prefix, parent, data[i * step : (i + 1) * step])
        refs.append(ChunkRef(key, parent, i, i * block_size, (i + 1) * block_size))
        parent = key
    return refs


def chunk_keys(model_id: str, token_ids: TokenIds, block_size: int, *, salt: str | None = None) -> list[int]:
    """Keys of every full block of ``token_ids``, in prompt order (``salt``: see the module docstring)."""
    return [ref.key for ref in chunk_refs(model_id, token_ids, block_size, salt=salt)]


def full_blocks(num_tokens: int, block_size: int) -> int:
    """How many full blocks (chunks) a prompt of ``num_tokens`` tokens has."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return max(0, num_tokens) // block_size
