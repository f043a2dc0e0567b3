"""``POST /v1/lookup``: how many leading chunks an agent could answer, without moving a byte."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from kvpool.http_api import ApiError


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    a = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))
    a.start()
    try:
        yield a
    finally:
        a.stop()


def _blob() -> bytes:
    import torch

    from hostagent.serialize import serialize

    return bytes(serialize(torch.zeros(2, 2, 1, 4, 8)))


def test_lookup_counts_the_held_prefix(agent: Agent) -> None:
    client = AgentClient(agent.api_url)
    blob = _blob()
    client.publish_chunks([0x11, 0x12, 0x14], [blob, blob, blob])
    served_before = agent.stats()["tiers"]
    assert client.lookup([0x11, 0x12, 0x13, 0x14]) == {"requested": 4, "local": 2, "available": 2}
    assert client.lookup([0x13, 0x11]) == {"requested": 2, "local": 0, "available": 0}
    assert client.lookup([]) == {"requested": 0, "local": 0, "available": 0}
    # Only the index was read: no tier counted a hit (a get would have).
    assert agent.stats()["tiers"] == served_before


def test_lookup_from_tokens_matches_the_key_chain(agent: Agent) -> None:
    from hostagent.chunking import chunk_keys

    client = AgentClient(agent.api_url)
    tokens = list(range(40))
    keys = chunk_keys("m", tokens, 16)
    client.publish_chunks(keys[:1], [_blob()])
    doc = client.http.post("/v1/lookup", {"model_id": "m", "token_ids": tokens, "block_size": 16})
    assert doc == {"requested": 2, "local": 1, "available": 1}


@pytest.mark.parametrize("doc", [{"keys": "0x1"}, {"keys": ["zz"]}, {"model_id": "m"},
                                 {"model_id": "m", "token_ids": [-1], "block_size": 1}])
def test_lookup_refuses_bad_arguments(agent: Agent, doc: dict[str, object]) -> None:
    with pytest.raises(ApiError) as err:
        AgentClient(agent.api_url).http.post("/v1/lookup", doc)
    assert err.value.status == 400


def test_lookup_bounds_its_keys(agent: Agent) -> None:
    from hostagent.api import MAX_LOOKUP_KEYS

    with pytest.raises(ApiError) as err:
        AgentClient(agent.api_url).lookup(range(1, MAX_LOOKUP_KEYS + 2))
    assert err.value.status == 400 and err.value.code == "too_many_keys"


def test_lookup_needs_the_token(agent: Agent) -> None:
    with pytest.raises(ApiError) as err:
        AgentClient(agent.api_url, token="not-the-token").lookup([1])
    assert err.value.status == 401
