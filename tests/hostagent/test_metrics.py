"""The agent's ``/metrics``: Prometheus' text format, read by its parser, equal to ``/v1/stats`` after real fetches.

Two agents on loopback: one holds chunks, the other fetches them (exactly), asks for one the
holder does not have (a NACK, an error outcome), and a stray datagram is dropped. Every count
the dashboard needs (outcomes, latency, bytes by path, the holder's answers and NACKs, drops)
appears in ``/metrics`` with the value ``/v1/stats`` shows.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from tests.scrape import scrape, value


@pytest.fixture
def agents() -> Iterator[tuple[Agent, Agent]]:
    pair = [Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING")) for _ in range(2)]
    for a in pair:
        a.start()
    try:
        yield pair[0], pair[1]
    finally:
        for a in pair:
            a.stop()


def test_agent_metrics_match_the_stats_after_fetches(agents: tuple[Agent, Agent]) -> None:
    holder, requester = agents
    udp = f"127.0.0.1:{holder.transport.port}"
    blobs = [bytes([i]) * (3000 + 700 * i) for i in range(3)]
    AgentClient(holder.api_url).publish_chunks([1, 2, 3], blobs)
    client = AgentClient(requester.api_url)
    got, data, stopped = client.fetch_chunks([1, 2, 3], udp)
    assert got == [1, 2, 3] and [bytes(d) for d in data] == blobs and stopped is None
    assert client.fetch_chunks([9], udp)[0] == []  # the holder NACKs: an error outcome
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"\x00" * 5, ("127.0.0.1", holder.transport.port))  # too short for a header: dropped
    deadline = time.monotonic() + 5
    while not holder.stats()["transport"]["drops"] and time.monotonic() < deadline:
        time.sleep(0.01)

    content_type, m = scrape(requester.api_url)
    st = client.stats()
    assert content_type.startswith("text/plain; version=0.0.4")
    a, tr = st["agent"], st["transport"]
    assert a["fetch_remote"] == 3 and a["fetch_failed"] == 1
    assert value(m, "kvpool_agent_fetched_chunks_total", outcome="exact") == a["fetch_remote"]
    assert value(m, "kvpool_agent_fetched_chunks_total", outcome="error") == a["fetch_failed"]
    assert value(m, "kvpool_agent_fetched_chunks_total", outcome="local") == a["fetch_local_hits"] == 0
    assert value(m, "kvpool_agent_fetch_duration_seconds_count") == a["fetch_seconds"]["count"] == 2
    assert value(m, "kvpool_agent_fetch_duration_seconds_bucket", le="+Inf") == 2
    assert value(m, "kvpool_agent_fetch_duration_seconds_sum") == pytest.approx(a["fetch_seconds"]["sum_s"])
    assert value(m, "kvpool_agent_received_bytes_total", path="holder") == tr["goodput_bytes"] == sum(map(len, blobs))
    assert value(m, "kvpool_agent_received_bytes_total", path="switch") == 0  # loopback: no switch on the way
    assert value(m, "kvpool_agent_transfers_total", outcome="completed") == tr["requests_completed"] == 3
    assert value(m, "kvpool_agent_nacks_received_total") == tr["nacks_received"] >= 1
    assert value(m, "kvpool_agent_tier_used_bytes", tier="dram") == st["tiers"]["tiers"][0]["used_bytes"]
    assert value(m, "kvpool_agent_integrity_retries_total", unit="fragment") == 0

    _, h = scrape(holder.api_url)
    hs = AgentClient(holder.api_url).stats()["transport"]
    assert value(h, "kvpool_holder_served_bytes_total") == hs["holder"]["bytes_served"] >= sum(map(len, blobs))
    assert value(h, "kvpool_holder_gets_total") == hs["holder"]["gets"]
    assert value(h, "kvpool_holder_nacks_total", status="unknown_chunk") == hs["holder"]["nacks"]["UNKNOWN_CHUNK"]
    assert value(h, "kvpool_holder_nacks_total", status="busy") == 0
    assert value(h, "kvpool_holder_answer_wait_seconds_count") == hs["answer_wait"]["answers"] > 0
    assert value(h, "kvpool_holder_send_queue_answers") == 0
    assert hs["drops"], "the stray datagram was not counted"
    for reason, n in hs["drops"].items():
        assert value(h, "kvpool_transport_drops_total", reason=reason) == n


def test_two_agents_in_one_process_keep_their_own_registries(agents: tuple[Agent, Agent]) -> None:
    holder, requester = agents
    AgentClient(holder.api_url).put_chunk(5, b"z" * 100)
    _, m1 = scrape(holder.api_url)
    _, m2 = scrape(requester.api_url)
    assert value(m1, "kvpool_agent_published_chunks_total") == 1
    assert value(m2, "kvpool_agent_published_chunks_total") == 0
