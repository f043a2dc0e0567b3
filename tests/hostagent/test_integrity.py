"""End-to-end integrity at the agent: a chunk that cannot be had intact is a 502, never bytes or a tier entry."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from hostagent.serialize import serialize
from hostagent.transport import ChunkIntegrityError
from kvpool.http_api import ApiError


def _started(stack: contextlib.ExitStack, **kw: object) -> Agent:
    """An agent on free ports, stopped when ``stack`` closes."""
    agent = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING", retransmit_timeout_s=0.05).replace(**kw))
    agent.start()
    stack.callback(agent.stop)
    return agent


def _blob(seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    return bytes(serialize(torch.randn(4, 2, 64, 32, generator=gen)))


def test_a_damaged_chunk_is_a_502_naming_it_and_never_reaches_a_tier() -> None:
    with contextlib.ExitStack() as stack:
        _check_a_damaged_chunk(_started(stack), _started(stack, integrity_retries=1))


def _check_a_damaged_chunk(holder: Agent, requester: Agent) -> None:
    good, bad = _blob(1), bytearray(_blob(2))
    bad[len(bad) // 2] ^= 0x10  # the holder's copy of the second chunk is damaged
    AgentClient(holder.api_url).publish_chunks([0x11, 0x22], [good, bytes(bad)])
    client = AgentClient(requester.api_url)
    udp = f"127.0.0.1:{holder.transport.port}"
    with pytest.raises(ApiError) as err:
        client.fetch_chunks([0x11, 0x22], udp, timeout=30)
    assert err.value.status == 502
    assert "chunk 0x0000000000000022" in err.value.message and "content check failed 2 times" in err.value.message
    # The good chunk of the prefix was verified and kept; the damaged one is in no tier.
    assert requester.store.get(0x11) == good and requester.store.get(0x22) is None
    st = client.stats()
    assert st["api"]["errors"] == {"integrity": 1}
    assert st["transport"]["integrity"]["integrity_failures"] == 1
    assert st["transport"]["integrity"]["chunks_verified"] == 1
    # The same through the Python API: an exception that names the chunk, not a short prefix.
    with pytest.raises(ChunkIntegrityError) as exc:
        requester.fetch_prefix([0x22], ("127.0.0.1", holder.transport.port), local=False)
    assert exc.value.key == 0x22
    # A prefix that stops before the damaged chunk is an ordinary answer.
    keys, blobs, stopped = client.fetch_chunks([0x11], udp, timeout=30)
    assert keys == [0x11] and blobs == [good] and stopped is None
