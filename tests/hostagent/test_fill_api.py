"""What experiments and the controller need of an agent: a Unix-socket API, pushes, network-only fetches."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostagent.client import AgentClient
from hostagent.daemon import Agent, AgentConfig
from hostagent.fragment import Reassembler
from kvpool import wire
from kvpool.http_api import ApiError, ApiUnreachableError

CHUNK = bytes((i * 7 + 3) % 256 for i in range(5 * wire.FRAG_PAYLOAD + 11))  # 6 fragments
KEY = 0xFEED_0000_0000_0001


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Agent, Agent, Path]]:
    sock = tmp_path / "holder.sock"
    holder = Agent(AgentConfig(udp_port=0, api_port=0, api_socket=str(sock), log_level="WARNING"))
    requester = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))
    holder.start()
    requester.start()
    try:
        yield holder, requester, sock
    finally:
        requester.stop()
        holder.stop()


def test_unix_socket_api_serves_and_is_removed_on_stop(tmp_path: Path) -> None:
    sock = tmp_path / "a.sock"
    agent = Agent(AgentConfig(udp_port=0, api_port=0, api_socket=str(sock), log_level="WARNING"))
    agent.start()
    try:
        client = AgentClient(f"unix:{sock}")
        assert client.health()["api_socket"] == f"unix:{sock}"
        client.put_chunk(KEY, CHUNK)
        assert client.get_chunk(KEY) == CHUNK
        with pytest.raises(ApiError) as err:
            client.get_chunk(KEY + 1)
        assert err.value.status == 404
    finally:
        agent.stop()
    assert not sock.exists()
    with pytest.raises(ApiUnreachableError, match=r"agent API at .+ is unreachable"):
        AgentClient(f"unix:{sock}", timeout=2).health()


def test_push_sends_every_fragment_once_to_the_target(pair: tuple[Agent, Agent, Path]) -> None:
    holder, _, sock = pair
    client = AgentClient(f"unix:{sock}")
    client.put_chunk(KEY, CHUNK)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        sink.settimeout(3)
        answer = client.push([KEY, KEY + 1], f"127.0.0.1:{sink.getsockname()[1]}")
        assert answer == {"pushed": 1, "missing": [f"{KEY + 1:#018x}"]}
        reasm = Reassembler(KEY, len(CHUNK))
        datagrams = 0
        while not reasm.complete:
            datagram, addr = sink.recvfrom(4096)
            datagrams += 1
            assert addr[1] == holder.transport.port  # from the kvpool port, as every DATA
            assert wire.unpack_header(datagram).request_id == 0
            reasm.add(datagram)
        assert datagrams == 6 and bytes(reasm.data) == CHUNK
        sink.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sink.recvfrom(4096)
    assert holder.transport.stats()["pushed_fragments"] == 6


@pytest.mark.parametrize(("doc_to", "message"), [(None, "to must be"), ("nohost", "IPv4 host:port"),
                                                 ("example.org:1", "IPv4 host:port")])
def test_push_bad_arguments(pair: tuple[Agent, Agent, Path], doc_to: str | None, message: str) -> None:
    _, _, sock = pair
    client = AgentClient(f"unix:{sock}")
    with pytest.raises(ApiError) as err:
        client.http.post("/v1/push", {"keys": [f"{KEY:#x}"], **({"to": doc_to} if doc_to else {})})
    assert err.value.status == 400 and message in err.value.message


def test_network_only_fetch_neither_reads_nor_keeps_local_copies(pair: tuple[Agent, Agent, Path]) -> None:
    holder, requester, sock = pair
    AgentClient(f"unix:{sock}").put_chunk(KEY, CHUNK)
    client = AgentClient(requester.api_url)
    holder_addr = f"127.0.0.1:{holder.transport.port}"
    for _ in range(2):
        keys, blobs, stopped = client.fetch_chunks([KEY], holder_addr, local=False)
        assert keys == [KEY] and blobs == [CHUNK] and stopped is None
    assert requester.store.get(KEY) is None
    served = holder.transport.stats()
    assert requester.stats()["agent"]["fetch_remote"] == 2
    # A normal fetch keeps the copy, and the next one is answered locally.
    client.fetch_chunks([KEY], holder_addr)
    client.fetch_chunks([KEY], holder_addr)
    assert requester.stats()["agent"]["fetch_remote"] == 3 and requester.store.get(KEY) is not None
    assert served["datagrams_received"] >= 2
    with pytest.raises(ApiError) as err:
        client.http.post("/v1/fetch", {"keys": [f"{KEY:#x}"], "local": "no"})
    assert err.value.status == 400 and "local must be" in err.value.message
    time.sleep(0)


def _answers(sock: socket.socket, n: int) -> list[wire.Header]:
    return [wire.unpack_header(sock.recvfrom(4096)[0]) for _ in range(n)]


def test_holder_answers_duplicates_at_once_where_the_switches_merge_or_not() -> None:
    """A second requester's GETs, single or range, are answered at once: switches coalesce ranges per chunk."""
    holder = Agent(AgentConfig(udp_port=0, api_port=0, log_level="WARNING"))
    holder.start()
    port = holder.transport.port
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        holder.publish(KEY, CHUNK)
        for s in socks:
            s.bind(("127.0.0.1", 0))
            s.settimeout(3)
        first, second, third = socks
        client = AgentClient(holder.api_url)
        for merge, rid in ((False, 10), (True, 20)):
            # The controller says whether the switches merge (multicast/pool) or only forward (plain).
            assert client.http.post("/v1/hints", {"ttl_s": 60, "merge": merge, "chunks": []}) == {"chunks": 0}
            for i in range(6):
                first.sendto(wire.get_packet(KEY, i, request_id=rid), ("127.0.0.1", port))
            assert {h.frag_index for h in _answers(first, 6)} == set(range(6))
            for i in range(6):  # another requester, while the first is still fresh
                second.sendto(wire.get_packet(KEY, i, request_id=rid + 1), ("127.0.0.1", port))
            third.sendto(wire.get_packet(KEY, 0, 6, request_id=rid + 2), ("127.0.0.1", port))
            got = _answers(second, 6)
            assert sorted(h.frag_index for h in got) == list(range(6)) and {h.opcode for h in got} == {wire.Opcode.DATA}
            ranged = _answers(third, 6)
            assert sorted(h.frag_index for h in ranged) == list(range(6)), merge
            assert {(h.opcode, h.status, h.chunk_len) for h in ranged} == {(wire.Opcode.DATA, 0, len(CHUNK))}, merge
        st = holder.transport.stats()
        assert st["nacks_sent"] == 0 and st["answer_wait"]["held"] == 0
    finally:
        for s in socks:
            s.close()
        holder.stop()
