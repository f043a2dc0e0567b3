"""KV-cache layouts to chunk tensors and back.

A *chunk tensor* is the KV of one block of ``B`` tokens across all layers, shaped
``[layers, 2, kv_heads, B, head_dim]`` (index 0 of the second axis is K, 1 is V): the
unit that is hashed, serialized and sent.  Functions that handle many blocks return or
take them stacked as ``[n, layers, 2, kv_heads, B, head_dim]``; ``chunks[i]`` is then a
contiguous chunk tensor that ``hostagent.serialize`` can read without a copy.

Two engine layouts are supported:

* **Hugging Face** (transformers): per layer, K and V of shape
  ``[batch, kv_heads, seq, head_dim]``.  Read from a transformers 5.x ``DynamicCache``
  (``cache.layers[i].keys / .values``), a 4.x cache (``key_cache`` / ``value_cache``
  lists) or a plain sequence of ``(k, v)`` pairs; written back as a ``DynamicCache``
  the model can continue generating from, or as a list of ``(k, v)`` pairs.
* **vLLM-style paged**: per layer, one tensor ``[num_blocks, 2, block_size, kv_heads,
  head_dim]``; a sequence's tokens live in the blocks its block table lists, block
  ``j`` of the table holding tokens ``j*B .. (j+1)*B - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

KVPair = tuple[torch.Tensor, torch.Tensor]


# ------------------------------------------------------------------------------ HF


def hf_layers(cache: Any) -> list[KVPair]:
    """The per-layer ``(k, v)`` tensors of a transformers cache or a sequence of pairs (no copy)."""
    layers = getattr(cache, "layers", None)
    if layers is not None and all(hasattr(layer, "keys") for layer in layers):  # transformers >= 5
        pairs = [(layer.keys, layer.values) for layer in layers]
        for i, layer in enumerate(layers):
            # A sliding-window layer keeps only its last tokens: position 0 of its tensors
            # is not token 0, so the prefix's KV is simply not there.
            held = layer.keys.shape[-2] if isinstance(layer.keys, torch.Tensor) else 0
            if hasattr(layer, "get_seq_length") and held and layer.get_seq_length() != held:
                raise ValueError(f"layer {i} holds only the last {held} of {layer.get_seq_length()} tokens "
                                 "(sliding window); the prefix's KV cannot be read from it")
    elif hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):  # transformers 4.x
        pairs = list(zip(cache.key_cache, cache.value_cache, strict=True))
    elif isinstance(cache, Sequence) and not isinstance(cache, torch.Tensor):
        pairs = []
        for i, item in enumerate(cache):
            if len(item) < 2:
                raise ValueError(f"layer {i}: expected a (key, value) pair, got {len(item)} items")
            pairs.append((item[0], item[1]))
    else:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: expected a transformers cache "
                        "or a sequence of (key, value) tensors")
    if not pairs:
        raise ValueError("the cache has no layers")
    for i, (k, v) in enumerate(pairs):
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise ValueError(f"layer {i} is not initialised (no key/value tensors)")
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"layer {i}: K {tuple(k.shape)} and V {tuple(v.shape)} must both be "
                             "[batch, kv_heads, seq, head_dim]")
        if k.shape[0:2] != pairs[0][0].shape[0:2] or k.shape[3] != pairs[0][0].shape[3]:
            raise ValueError(f"layer {i}: shape {tuple(k.shape)} differs from layer 0 {tuple(pairs[0][0].shape)}")
        if k.dtype != pairs[0][0].dtype:
            raise ValueError(f"layer {i}: dtype {k.dtype} differs from layer 0 {pairs[0][0].dtype}")
    return pairs


def chunks_from_hf(cache: Any, block_size: int, *, num_blocks: int | None = None, start_block: int = 0,
                   batch_index: int = 0) -> torch.Tensor:
    """Blocks ``start_block ..`` of one sequence of an HF cache as ``[n, L, 2, H, B, D]`` (a copy).

    ``num_blocks`` defaults to every full block the cache holds from ``start_block`` on;
    asking for more than every layer holds raises ``ValueError``.
    """
    pairs = hf_layers(cache)
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    batch, heads, _, dim = pairs[0][0].shape
    if not 0 <= batch_index < batch:
        raise ValueError(f"batch_index {batch_index} outside 0..{batch - 1}")
    seq = min(k.shape[2] for k, _ in pairs)  # a sliding-window layer may hold fewer tokens
    if num_blocks is None:
        num_blocks = max(0, seq // block_size - start_block)
    end = (start_block + num_blocks) * block_size
    if start_block < 0 or num_blocks < 0 or end > seq:
        raise ValueError(f"blocks {start_block}+{num_blocks} of {block_size} tokens need {end} tokens, "
                         f"the cache holds {seq} in every layer")
    k0 = pairs[0][0]
    out = torch.empty((num_blocks, len(pairs), 2, heads, block_size, dim), dtype=k0.dtype, device=k0.device)
    lo = start_block * block_size
    for layer, (k, v) in enumerate(pairs):
        for kv, src in enumerate((k, v)):
            # [H, n*B, D] -> [H, n, B, D] -> [n, H, B, D]: one strided copy per layer and K/V.
            rows = src[batch_index, :, lo:end, :].reshape(heads, num_blocks, block_size, dim)
            out[:, layer, kv] = rows.permute(1, 0, 2, 3)
    return out


def _as_stack(chunks: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Chunks as one ``[n, L, 2, H, B, D]`` tensor (a sequence is stacked: one copy)."""
    stack = chunks if isinstance(chunks, torch.Tensor) else torch.stack(list(chunks))
    if stack.dim() != 6 or stack.shape[2] != 2:
        raise ValueError(f"chunks must be [n, layers, 2, kv_heads, block, head_dim], got {tuple(stack.shape)}")
    return stack


def hf_kv_from_chunks(chunks: torch.Tensor | Sequence[torch.Tensor], *,
                      device: torch.device | str | None = None) -> list[KVPair]:
    """Consecutive chunks (from token 0) as per-layer ``(k, v)`` of shape ``[1, H, n*B, D]``."""
    stack = _as_stack(chunks)
    if device is not None:
        stack = stack.to(device)
    n, layers, _, heads, block, dim = stack.shape
    pairs: list[KVPair] = []
    for layer in range(layers):
        # [n, H, B, D] -> [H, n, B, D] -> [1, H, n*B, D]; contiguous so the cache owns it.
        k, v = (stack[:, layer, kv].permute(1, 0, 2, 3).reshape(1, heads, n * block, dim).contiguous()
                for kv in (0, 1))
        pairs.append((k, v))
    return pairs


def hf_cache_from_chunks(chunks: torch.Tensor | Sequence[torch.Tensor], *, config: Any = None,
                         device: torch.device | str | None = None) -> Any:
    """A transformers ``DynamicCache`` holding consecutive chunks from token 0, ready for generation.

    ``config`` (the model's config) lets transformers pick per-layer cache types, e.g.
    sliding-window layers; without it every layer is a plain dynamic layer.
    """
    from transformers import DynamicCache  # heavy import, only where a cache is built

    return DynamicCache(hf_kv_from_chunks(chunks, device=device), config=config)


def write_chunks_to_hf(cache: Any, chunks: torch.Tensor | Sequence[torch.Tensor], *, start_block: int = 0,
                       batch_index: int = 0) -> None:
    """Write chunks into an existing HF cache's tensors in place (e.g. a preallocated static cache)."""
    pairs = hf_layers(cache)
    stack = _as_stack(chunks)
    n, layers, _, heads, block, dim = stack.shape
    batch, c_heads, _, c_dim = pairs[0][0].shape
    if (layers, heads, dim) != (len(pairs), c_heads, c_dim):
        raise ValueError(f"chunks of {layers} layers x {heads} heads x {dim} do not fit a cache of "
                         f"{len(pairs)} x {c_heads} x {c_dim}")
    if not 0 <= batch_index < batch:
        raise ValueError(f"batch_index {batch_index} outside 0..{batch - 1}")
    lo, hi = start_block * block, (start_block + n) * block
    seq = min(k.shape[2] for k, _ in pairs)
    if start_block < 0 or hi > seq:
        raise ValueError(f"tokens {lo}..{hi} do not fit a cache of {seq} tokens; build a new one with "
                         "hf_cache_from_chunks instead")
    if stack.dtype != pairs[0][0].dtype:
        raise ValueError(f"chunks are {stack.dtype}, the cache is {pairs[0][0].dtype}")
    for layer, (k, v) in enumerate(pairs):
        for kv, dst in enumerate((k, v)):
            rows = stack[:, layer, kv].to(dst.device).permute(1, 0, 2, 3).reshape(heads, n * block, dim)
            dst[batch_index, :, lo:hi, :] = rows


# ------------------------------------------------------------------------------ paged


def _check_paged(kv_caches: Sequence[torch.Tensor], block_ids: Sequence[int]) -> tuple[int, int, int, int]:
    """Validate a paged cache and block table; return ``(num_blocks, block_size, kv_heads, head_dim)``."""
    if len(kv_caches) == 0:
        raise ValueError("kv_caches has no layers")
    first = kv_caches[0]
    if first.dim() != 5 or first.shape[1] != 2:
        raise ValueError("paged layer must be [num_blocks, 2, block_size, kv_heads, head_dim], "
                         f"got {tuple(first.shape)}")
    for i, t in enumerate(kv_caches):
        if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"layer {i}: {tuple(t.shape)} {t.dtype} on {t.device} differs from layer 0: "
                             f"{tuple(first.shape)} {first.dtype} on {first.device}")
    num_blocks = first.shape[0]
    bad = [b for b in block_ids if not 0 <= b < num_blocks]
    if bad:
        raise ValueError(f"block ids {bad[:5]} outside 0..{num_blocks - 1}")
    return num_blocks, first.shape[2], first.shape[3], first.shape[4]


def _index(block_ids: Sequence[int], device: torch.device) -> torch.Tensor:
    """The block table as an index tensor on the cache's device."""
    return torch.as_tensor(list(block_ids), dtype=torch.long, device=device)


def chunks_from_paged(kv_caches: Sequence[torch.Tensor], block_ids: Sequence[int]) -> torch.Tensor:
    """The blocks ``block_ids`` of a paged cache as chunks ``[n, L, 2, H, B, D]`` (a copy)."""
    _, block, heads, dim = _check_paged(kv_caches, block_ids)
    first = kv_caches[0]
    idx = _index(block_ids, first.device)
    out = torch.empty((len(idx), len(kv_caches), 2, heads, block, dim), dtype=first.dtype, device=first.device)
    for layer, t in enumerate(kv_caches):
        # [n, 2, B, H, D] -> [n, 2, H, B, D]
        out[:, layer] = t.index_select(0, idx).permute(0, 1, 3, 2, 4)
    return out


def write_chunks_to_paged(kv_caches: Sequence[torch.Tensor], block_ids: Sequence[int],
                          chunks: torch.Tensor | Sequence[torch.Tensor]) -> None:
    """Write chunk ``i`` into block ``block_ids[i]`` of every layer, in place; other blocks untouched."""
    _, block, heads, dim = _check_paged(kv_caches, block_ids)
    stack = _as_stack(chunks)
    want = (len(block_ids), len(kv_caches), 2, heads, block, dim)
    if tuple(stack.shape) != want:
        raise ValueError(f"chunks {tuple(stack.shape)} do not fit {len(block_ids)} blocks of this cache: "
                         f"expected {want}")
    if stack.dtype != kv_caches[0].dtype:
        raise ValueError(f"chunks are {stack.dtype}, the cache is {kv_caches[0].dtype}")
    if len(set(block_ids)) != len(block_ids):
        raise ValueError("block_ids repeats a block: two chunks cannot share one block")
    first = kv_caches[0]
    idx = _index(block_ids, first.device)
    stack = stack.to(first.device)
    for layer, t in enumerate(kv_caches):
        t.index_copy_(0, idx, stack[:, layer].permute(0, 1, 3, 2, 4))
