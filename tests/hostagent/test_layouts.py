"""KV layouts to chunk tensors and back: HF caches, vLLM-style paged blocks, bit-exact."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hostagent.chunking import chunk_keys
from hostagent.fragment import Reassembler, fragment
from hostagent.layouts import (
    chunks_from_hf,
    chunks_from_paged,
    hf_cache_from_chunks,
    hf_kv_from_chunks,
    hf_layers,
    write_chunks_to_hf,
    write_chunks_to_paged,
)
from hostagent.serialize import deserialize, serialize

LAYERS, HEADS, DIM, BLOCK = 3, 2, 8, 16


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


KV = tuple[torch.Tensor, torch.Tensor]


def _hf_pairs(batch: int = 2, seq: int = 50, dtype: torch.dtype = torch.bfloat16) -> list[KV]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, HEADS, seq, DIM, generator=g).to(dtype),
             torch.randn(batch, HEADS, seq, DIM, generator=g).to(dtype)) for _ in range(LAYERS)]


# ------------------------------------------------------------------------------ HF


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_hf_chunks_are_blocks_across_layers(dtype: torch.dtype) -> None:
    pairs = _hf_pairs(dtype=dtype)
    chunks = chunks_from_hf(pairs, BLOCK, batch_index=1)
    assert chunks.shape == (3, LAYERS, 2, HEADS, BLOCK, DIM)  # 50 tokens: 3 full blocks
    assert chunks[0].is_contiguous()
    for i in range(3):
        for layer, (k, v) in enumerate(pairs):
            assert _bits_equal(chunks[i, layer, 0], k[1, :, i * BLOCK : (i + 1) * BLOCK])
            assert _bits_equal(chunks[i, layer, 1], v[1, :, i * BLOCK : (i + 1) * BLOCK])


def test_hf_round_trip_bit_exact_through_the_wire() -> None:
    pairs = _hf_pairs()
    chunks = chunks_from_hf(pairs, BLOCK)
    received = []
    for i in range(chunks.shape[0]):
        blob = serialize(chunks[i])
        r = Reassembler(i + 1, len(blob))
        r.add_batch(fragment(blob, i + 1)[::-1].copy())
        received.append(deserialize(r.data))
    rebuilt = hf_kv_from_chunks(received)
    for (k, v), (k2, v2) in zip(pairs, rebuilt, strict=True):
        assert _bits_equal(k2, k[0:1, :, : 3 * BLOCK].contiguous())
        assert _bits_equal(v2, v[0:1, :, : 3 * BLOCK].contiguous())
    cache = hf_cache_from_chunks(received)
    assert cache.get_seq_length() == 3 * BLOCK
    assert all(_bits_equal(a[0], b[0]) for a, b in zip(hf_layers(cache), rebuilt, strict=True))


def test_hf_block_range_and_write_in_place() -> None:
    pairs = _hf_pairs(seq=64)
    middle = chunks_from_hf(pairs, BLOCK, start_block=1, num_blocks=2)
    assert torch.equal(middle, chunks_from_hf(pairs, BLOCK)[1:3])
    target = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in pairs]
    write_chunks_to_hf(target, middle, start_block=1, batch_index=1)
    for (k, v), (tk, tv) in zip(pairs, target, strict=True):
        assert _bits_equal(tk[1, :, BLOCK : 3 * BLOCK], k[0, :, BLOCK : 3 * BLOCK])
        assert _bits_equal(tv[1, :, BLOCK : 3 * BLOCK], v[0, :, BLOCK : 3 * BLOCK])
        assert not tk[0].any() and not tk[1, :, :BLOCK].any() and not tk[1, :, 3 * BLOCK :].any()
    with pytest.raises(ValueError, match="do not fit a cache"):
        write_chunks_to_hf(target, middle, start_block=3)


def test_hf_errors() -> None:
    pairs = _hf_pairs()
    with pytest.raises(ValueError, match="the cache holds 50"):
        chunks_from_hf(pairs, BLOCK, num_blocks=4)
    with pytest.raises(ValueError, match="batch_index"):
        chunks_from_hf(pairs, BLOCK, batch_index=2)
    with pytest.raises(ValueError, match="block_size"):
        chunks_from_hf(pairs, 0)
    with pytest.raises(TypeError, match="unsupported cache"):
        chunks_from_hf(torch.zeros(3), BLOCK)
    with pytest.raises(ValueError, match="no layers"):
        chunks_from_hf([], BLOCK)
    with pytest.raises(ValueError, match="layer 1"):
        chunks_from_hf([pairs[0], (pairs[1][0][:, :1], pairs[1][1][:, :1])], BLOCK)
    with pytest.raises(ValueError, match="dtype"):
        chunks_from_hf([pairs[0], (pairs[1][0].float(), pairs[1][1].float())], BLOCK)
    with pytest.raises(ValueError, match="n, layers, 2"):
        hf_kv_from_chunks(torch.zeros(2, 3, 4))
    assert chunks_from_hf(pairs, 64).shape[0] == 0  # no full block: no chunks


def _tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    model.train(False)  # inference mode (no dropout); same as .eval()
    return model


@pytest.mark.slow
def test_rebuilt_dynamic_cache_drives_generation() -> None:
    from transformers import DynamicCache

    model = _tiny_llama()
    prompt = torch.randint(0, 97, (1, 53), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(prompt, use_cache=True)
    cache = full.past_key_values
    assert isinstance(cache, DynamicCache)
    keys = chunk_keys("tiny-llama", prompt[0].numpy(), BLOCK)
    chunks = chunks_from_hf(cache, BLOCK)
    assert chunks.shape[0] == len(keys) == 3
    # Send each chunk through serialization, fragmentation and reassembly.
    received = []
    for key, chunk in zip(keys, chunks, strict=True):
        blob = serialize(chunk)
        r = Reassembler(key, len(blob))
        r.add_batch(fragment(blob, key))
        received.append(deserialize(r.data))
    rebuilt = hf_cache_from_chunks(received, config=model.config)
    assert rebuilt.get_seq_length() == 48
    with torch.no_grad():
        # Prefill only the 5 tokens after the 48 cached ones: same logits as the full pass.
        tail = model(prompt[:, 48:], past_key_values=rebuilt, use_cache=True)
    torch.testing.assert_close(tail.logits[0], full.logits[0, 48:], rtol=1e-4, atol=1e-5)
    # And greedy generation from a rebuilt cache matches generation from scratch.
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=8, do_sample=False)
        got = model.generate(prompt, past_key_values=hf_cache_from_chunks(received, config=model.config),
                             max_new_tokens=8, do_sample=False)
    assert torch.equal(ref, got)


# ------------------------------------------------------------------------------ paged


def _paged(num_blocks: int = 10, block: int = 4, dtype: torch.dtype = torch.float16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(num_blocks, 2, block, HEADS, DIM, generator=g).to(dtype) for _ in range(LAYERS)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_paged_extract_and_write_bit_exact(dtype: torch.dtype) -> None:
    src = _paged(dtype=dtype)
    table = [7, 2, 5]
    chunks = chunks_from_paged(src, table)
    assert chunks.shape == (3, LAYERS, 2, HEADS, 4, DIM)
    for i, b in enumerate(table):
        for layer in range(LAYERS):
            # Paged block [2, B, H, D] is the chunk's [2, H, B, D] transposed.
            assert _bits_equal(chunks[i, layer], src[layer][b].permute(0, 2, 1, 3))
    dst = [torch.zeros_like(t) for t in src]
    write_chunks_to_paged(dst, [0, 1, 9], chunks)
    assert _bits_equal(chunks_from_paged(dst, [0, 1, 9]), chunks)
    for layer in range(LAYERS):
        assert not dst[layer][2:9].any()  # blocks outside the table untouched
    # Through the wire and back into the same blocks.
    wire_chunks = [deserialize(serialize(c)) for c in chunks]
    dst2 = [torch.zeros_like(t) for t in src]
    write_chunks_to_paged(dst2, table, wire_chunks)
    for layer in range(LAYERS):
        assert _bits_equal(dst2[layer][table], src[layer][table])


def test_hf_and_paged_agree() -> None:
    """A sequence stored both ways gives identical chunks, so either engine can serve the other."""
    pairs = _hf_pairs(batch=1, seq=3 * 4, dtype=torch.float16)
    paged = [torch.zeros(6, 2, 4, HEADS, DIM, dtype=torch.float16) for _ in range(LAYERS)]
    table = [4, 0, 3]
    for layer, (k, v) in enumerate(pairs):
        for j, b in enumerate(table):
            paged[layer][b, 0] = k[0, :, 4 * j : 4 * j + 4].transpose(0, 1)
            paged[layer][b, 1] = v[0, :, 4 * j : 4 * j + 4].transpose(0, 1)
    assert _bits_equal(chunks_from_paged(paged, table), chunks_from_hf(pairs, 4))


def test_paged_errors() -> None:
    src = _paged()
    chunks = chunks_from_paged(src, [1, 2])
    with pytest.raises(ValueError, match=r"outside 0\.\.9"):
        chunks_from_paged(src, [10])
    with pytest.raises(ValueError, match="repeats"):
        write_chunks_to_paged(src, [3, 3], chunks)
    with pytest.raises(ValueError, match="do not fit"):
        write_chunks_to_paged(src, [3, 4, 5], chunks)
    with pytest.raises(ValueError, match="cache is"):
        write_chunks_to_paged(src, [3, 4], chunks.float())
    with pytest.raises(ValueError, match="num_blocks, 2"):
        chunks_from_paged([torch.zeros(4, 3, 4, 2, 8)], [0])
    with pytest.raises(ValueError, match="layer 1"):
        chunks_from_paged([src[0], src[1][:5]], [0])
    with pytest.raises(ValueError, match="no layers"):
        chunks_from_paged([], [0])
    before = [t.clone() for t in src]
    with pytest.raises(ValueError):
        write_chunks_to_paged(src, [3, 99], chunks)
    assert all(torch.equal(a, b) for a, b in zip(before, src, strict=True))  # nothing half-written


# ------------------------------------------------------------------------------ GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_paged_cache_on_gpu_round_trip() -> None:
    src = [t.cuda() for t in _paged(dtype=torch.bfloat16)]
    table = [6, 1, 8]
    chunks = chunks_from_paged(src, table)
    assert chunks.device.type == "cuda"
    # Over the wire the chunks travel from host memory: serialize copies device -> host.
    wire_chunks = [deserialize(serialize(c)) for c in chunks]
    assert all(c.device.type == "cpu" for c in wire_chunks)
    dst = [torch.zeros_like(t) for t in src]
    write_chunks_to_paged(dst, [0, 2, 4], wire_chunks)  # host chunks into device blocks
    assert _bits_equal(chunks_from_paged(dst, [0, 2, 4]).cpu(), chunks.cpu())
    assert all(not t[[1, 3, 5, 6, 7, 8, 9]].any() for t in dst)


@needs_cuda
def test_hf_cache_on_gpu_round_trip() -> None:
    pairs = [(k.cuda(), v.cuda()) for k, v in _hf_pairs(dtype=torch.float16)]
    chunks = chunks_from_hf(pairs, BLOCK, batch_index=1)
    assert chunks.device.type == "cuda"
    received = [deserialize(serialize(c)) for c in chunks]
    cache = hf_cache_from_chunks(received, device="cuda")
    for (k, v), (k2, v2) in zip(pairs, hf_layers(cache), strict=True):
        assert k2.device.type == "cuda"
        assert _bits_equal(k2[0].cpu(), k[1, :, : 3 * BLOCK].cpu())
        assert _bits_equal(v2[0].cpu(), v[1, :, : 3 * BLOCK].cpu())


@needs_cuda
@pytest.mark.slow
def test_rebuilt_cache_drives_generation_on_gpu() -> None:
    model = _tiny_llama().cuda()
    prompt = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(5)).cuda()
    with torch.no_grad():
        cache = model(prompt, use_cache=True).past_key_values
        received = [deserialize(serialize(c)) for c in chunks_from_hf(cache, BLOCK)]
        rebuilt = hf_cache_from_chunks(received, config=model.config, device="cuda")
        ref = model.generate(prompt, max_new_tokens=6, do_sample=False)
        got = model.generate(prompt, past_key_values=rebuilt, max_new_tokens=6, do_sample=False)
    assert torch.equal(ref, got)


def test_sliding_window_layer_refused() -> None:
    from transformers import DynamicCache

    k = torch.randn(1, HEADS, 40, DIM)
    # A third item makes transformers build a sliding-window layer that keeps 8 tokens.
    cache = DynamicCache([(k, k), (k, k, torch.tensor(8))])
    assert len(hf_layers([(k, k)])) == 1
    with pytest.raises(ValueError, match="sliding window"):
        chunks_from_hf(cache, BLOCK)
    short = DynamicCache([(k, k), (k[:, :, :6], k[:, :, :6], torch.tensor(8))])  # window not full yet
    with pytest.raises(ValueError, match="holds 6"):
        chunks_from_hf(short, BLOCK, num_blocks=1)
