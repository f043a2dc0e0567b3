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
from kvpool.httpjson import ApiError, ApiUnreachableError

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


def test_holder_holds_and_converts_only_duplicates_and_only_where_the_switches_merge(tmp_path: Path) -> None:
    """``hold_s``: a lone request is answered at once; a second requester's GETs hold the chunk, ranges are refused."""
    holder = Agent(AgentConfig(udp_port=0, api_port=0, hold_s=0.3, log_level="WARNING"))
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

        def lone_then_duplicate(merge: bool, rid: int) -> tuple[float, dict[str, int]]:
            # The controller says whether the switches merge (multicast/pool) or only forward (plain).
            assert client.http.post("/v1/hints", {"ttl_s": 60, "merge": merge, "chunks": []}) == {"chunks": 0}
            for i in range(6):
                first.sendto(wire.get_packet(KEY, i, request_id=rid), ("127.0.0.1", port))
            assert {h.frag_index for h in _answers(first, 6)} == set(range(6))  # alone: answered, not held
            t0 = time.monotonic()
            for i in range(6):  # another requester, within the hold time of the first
                second.sendto(wire.get_packet(KEY, i, request_id=rid + 1), ("127.0.0.1", port))
            third.sendto(wire.get_packet(KEY, 0, 6, request_id=rid + 2), ("127.0.0.1", port))
            got = _answers(second, 6)
            waited = time.monotonic() - t0
            assert sorted(h.frag_index for h in got) == list(range(6)) and {h.opcode for h in got} == {wire.Opcode.DATA}
            (answer,) = _answers(third, 1) if merge else [h for h in _answers(third, 6)][:1]
            st = holder.transport.stats()
            return waited, {"holds": st["holds"], "converted": st["converted_gets"], "answer_op": answer.opcode,
                            "answer_status": answer.status, "hint_us": answer.chunk_len,
                            "answer_frags": answer.frag_count}

        waited, plain = lone_then_duplicate(False, 10)
        # Plain forwarding: a duplicate changes nothing (no switch could merge it).
        assert plain == {"holds": 0, "converted": 0, "answer_op": wire.Opcode.DATA, "answer_status": 0,
                         "hint_us": len(CHUNK), "answer_frags": 6}
        waited, merged = lone_then_duplicate(True, 20)
        # The switches merge: the second requester's single GETs hold the chunk's answers, and the
        # range GET of a third is refused BUSY, for one fragment (ask singly), with a short hint.
        assert waited >= 0.3
        assert merged == {"holds": 1, "converted": 1, "answer_op": wire.Opcode.NACK,
                          "answer_status": wire.Status.BUSY, "hint_us": 30_000, "answer_frags": 1}
        # A retransmitted range is never refused: it is served.
        third.sendto(wire.get_packet(KEY, 0, 6, request_id=99, flags=wire.Flag.RETRANSMIT), ("127.0.0.1", port))
        assert {(h.opcode, h.frag_index) for h in _answers(third, 6)} == {(wire.Opcode.DATA, i) for i in range(6)}
    finally:
        for s in socks:
            s.close()
        holder.stop()
    with pytest.raises(ValueError, match="hold_s"):
        AgentConfig(hold_s=5.0).transport_config()


def test_holder_answers_a_hot_chunks_get_a_hold_late_and_only_where_the_switches_merge() -> None:
    """A chunk the hints call hot: each new single GET waits ``hold_s`` (its duplicates join it in the switch)."""
    holder = Agent(AgentConfig(udp_port=0, api_port=0, hold_s=0.3, log_level="WARNING"))
    holder.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        holder.publish(KEY, CHUNK)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(3)
        client = AgentClient(holder.api_url)
        addr = ("127.0.0.1", holder.transport.port)
        hot = {"chunks": [{"key": f"{KEY:#x}", "path": "single", "nbytes": len(CHUNK)}], "ttl_s": 60}

        def ask(merge: bool, rid: int, flags: int = 0) -> tuple[float, int]:
            assert client.http.post("/v1/hints", {**hot, "merge": merge}) == {"chunks": 1}
            t0 = time.monotonic()
            sock.sendto(wire.get_packet(KEY, 0, request_id=rid, flags=flags), addr)
            (answer,) = _answers(sock, 1)
            assert (answer.opcode, answer.frag_index) == (wire.Opcode.DATA, 0)
            return time.monotonic() - t0, int(holder.transport.stats()["held_gets"])

        assert ask(False, 1)[1] == 0  # plain forwarding: nothing could join it, answered at once
        waited, held = ask(True, 2)
        assert held == 1 and waited >= 0.3  # the switches merge: answered a hold late
        assert ask(True, 3, wire.Flag.RETRANSMIT)[1] == 1  # a retransmit is never held again
    finally:
        sock.close()
        holder.stop()


def test_holder_holds_the_next_chunks_of_requesters_that_just_met_on_one() -> None:
    """Two requesters met on a chunk: for two hold times their single GETs of other chunks are held too."""
    holder = Agent(AgentConfig(udp_port=0, api_port=0, hold_s=0.3, log_level="WARNING"))
    holder.start()
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for k in (KEY, KEY + 1, KEY + 2, KEY + 3):
            holder.publish(k, CHUNK)
        for s in socks:
            s.bind(("127.0.0.1", 0))
            s.settimeout(3)
        first, second, other = socks
        assert AgentClient(holder.api_url).http.post("/v1/hints", {"ttl_s": 60, "merge": True, "chunks": []}) \
            == {"chunks": 0}
        addr = ("127.0.0.1", holder.transport.port)

        def lone(sock: socket.socket, key: int, rid: int) -> float:
            """Seconds until ``sock``'s single GET of ``key``'s fragment 0 is answered."""
            t0 = time.monotonic()
            sock.sendto(wire.get_packet(key, 0, request_id=rid), addr)
            (answer,) = _answers(sock, 1)
            assert (answer.opcode, answer.chunk_key, answer.frag_index) == (wire.Opcode.DATA, key, 0)
            return time.monotonic() - t0

        first.sendto(wire.get_packet(KEY, 0, 6, request_id=1), addr)
        assert len(_answers(first, 6)) == 6  # alone: answered at once, as a range
        second.sendto(wire.get_packet(KEY, 0, 6, request_id=2), addr)
        (refused,) = _answers(second, 1)
        assert (refused.status, refused.frag_count) == (wire.Status.BUSY, 1)  # they met: converted
        met = time.monotonic()
        # The requester that met another starts its next chunk: held, so the others join it in the switch.
        assert lone(second, KEY + 1, 3) >= 0.3
        # A requester that met nobody is answered at once.
        assert lone(other, KEY + 2, 4) < 0.2
        # Two hold times later the meeting is forgotten.
        time.sleep(max(0.0, met + 0.65 - time.monotonic()))
        assert lone(second, KEY + 3, 5) < 0.2
        assert holder.transport.stats()["held_gets"] == 1
    finally:
        for s in socks:
            s.close()
        holder.stop()
