"""Bad input to an agent: garbage datagrams during a live transfer and bad API calls.

Every bad datagram is dropped and counted by reason, and the transfer in flight still
completes bit-identical; every bad API call gets a one-line JSON error with a 4xx status,
is counted by reason, and the agent keeps serving.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from hostagent.api import pack_bundle
from hostagent.daemon import Agent, AgentConfig
from hostagent.holder import Holder
from hostagent.tiers import HostTier, TieredStore
from hostagent.transport import Transport, TransportConfig
from kvpool import wire

KEY = 0x5EED_0000_0000_0001


def _raw_header(**fields: int) -> bytearray:
    """A header with any field values, valid or not (``Header.pack`` refuses out-of-range ones)."""
    values = {"version": wire.KVPOOL_VERSION, "opcode": wire.Opcode.DATA, "flags": 0, "chunk_key": KEY,
              "frag_index": 0, "frag_count": 1, "request_id": 0, "generation": 0, "payload_len": 0,
              "status": 0, "chunk_len": 0, "check": 0}
    values.update(fields)
    return bytearray(wire.HEADER_STRUCT.pack(*(values[f.name] for f in wire.FIELDS)))


def _data(rid: int, chunk_len: int, index: int, **fields: int) -> bytes:
    """A full-size DATA datagram for fragment ``index`` with consistent lengths unless overridden."""
    count = wire.fragment_count(chunk_len)
    base = {"request_id": rid, "frag_index": index, "frag_count": count, "chunk_len": chunk_len,
            "payload_len": wire.expected_payload_len(chunk_len, min(index, count - 1)) or 1}
    base.update(fields)
    return bytes(_raw_header(**base)) + bytes(wire.FRAG_PAYLOAD)


def test_garbage_during_a_live_transfer_is_dropped_counted_and_harmless() -> None:
    payload = os.urandom(3_000_000)  # 2131 fragments
    store = TieredStore([HostTier(1 << 30)])
    store.put(KEY, payload)
    # Paced so the transfer is still running while the garbage arrives.
    hcfg = TransportConfig(port=0, rate_bytes_per_s=2.5e6, burst_bytes=64 << 10)  # about 1.3 s
    # A long retransmit timeout: no spurious retransmits on a busy machine, so counts stay exact.
    rcfg = TransportConfig(port=0, retransmit_timeout_s=5.0, give_up_s=30.0)
    with Transport(hcfg, Holder(store)) as holder, Transport(rcfg) as req:
        result: list[bytes] = []
        t = threading.Thread(target=lambda: result.append(req.fetch_one(KEY, holder.address, timeout=60)))
        t.start()
        deadline = time.monotonic() + 10
        while not any(got > 0 for _, _, got, _ in req.active_requests()):
            assert time.monotonic() < deadline, "transfer did not start"
            time.sleep(0.005)
        (rid, key, got, count), = req.active_requests()
        assert key == KEY and 0 < got < count
        n = len(payload)
        garbage = {
            "truncated": [b"", b"\x01\x02", bytes(wire.HEADER_LEN - 1)],
            "bad_version": [_data(rid, n, 5, version=1)],
            "bad_opcode": [bytes(_raw_header(opcode=9, request_id=rid))],
            "bad_flags": [_data(rid, n, 6, flags=0x8000)],
            "bad_range": [_data(rid, n, count + 7)],  # fragment index past the chunk's end
            "bad_length": [_data(rid, n, 7)[:1000],  # a DATA datagram cut short
                           _data(rid, n, 8, payload_len=5)],  # payload_len that does not fit chunk_len
            "wrong_length": [_data(rid, n - wire.FRAG_PAYLOAD, 9)],  # a total length other than the transfer's
            "oversize": [bytes(2000)],
            "unknown_request": [_data(rid ^ 0xFFFF, n, 10),
                                wire.nack_packet(KEY, wire.Status.BUSY, request_id=rid ^ 0xFFFF)],
            "wrong_key": [_data(rid, n, 11, chunk_key=KEY + 1)],
            "unexpected_opcode": [wire.get_packet(KEY, 0, 1, rid)],
        }
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for pkts in garbage.values():
                for p in pkts:
                    s.sendto(p, ("127.0.0.1", req.fetch_port))
            # And some at the holder's port: its GET service must not care either.
            for p in (b"\xff" * 7, _data(rid, n, 0), bytes(_raw_header(opcode=wire.Opcode.GET, frag_count=0))):
                s.sendto(p, holder.address)
        time.sleep(0.05)
        # The garbage met a transfer in flight (else it would count as late, not as itself).
        assert req.active_requests(), "transfer finished before the garbage arrived; slow the holder down"

        t.join(60)
        assert result and result[0] == payload  # completed, bit-identical
        drops = req.stats()["drops"]
        assert drops == {reason: len(pkts) for reason, pkts in garbage.items()}
        hdrops = holder.stats()["drops"]
        assert hdrops == {"truncated": 1, "unexpected_opcode": 1, "bad_range": 1}
        st = req.stats()
        assert st["fragments_stored"] == count and st["requests_completed"] == 1


@pytest.fixture
def agent() -> Iterator[Agent]:
    a = Agent(AgentConfig(udp_port=0, api_port=0, max_body_bytes=1 << 20, log_level="WARNING"))
    a.start()
    try:
        yield a
    finally:
        a.stop()


BAD_CALLS = [
    # method, path, body, headers, status, reason, words in the message
    ("PUT", "/v1/chunks/xyz", b"abc", {}, 400, "bad_key", "hex digits"),
    ("PUT", "/v1/chunks/0x12345678901234567", b"abc", {}, 400, "bad_key", "hex digits"),
    ("PUT", "/v1/chunks/0x1", b"", {}, 400, "bad_chunk", "allowed 1.."),
    ("PUT", "/v1/chunks/0x1?generation=-3", b"abc", {}, 400, "bad_field", "generation"),
    ("POST", "/v1/fetch", b"not json", {}, 400, "bad_json", "not JSON"),
    ("POST", "/v1/fetch", b"[1, 2]", {}, 400, "bad_json", "JSON object"),
    ("POST", "/v1/fetch", b'{"keys": [1, 2]}', {}, 400, "bad_key", "hex strings"),
    ("POST", "/v1/fetch", b'{"keys": ["0x1"], "holder": "nohost"}', {}, 400, "bad_holder", "host:port"),
    ("POST", "/v1/fetch", b'{"keys": ["0x1"], "holder": "h:99999"}', {}, 400, "bad_holder", "host:port"),
    ("POST", "/v1/fetch", b'{"keys": ["0x1"], "holder": "no-such-host.invalid:7470"}', {}, 400, "bad_holder",
     "cannot resolve"),
    ("POST", "/v1/fetch", b'{"keys": ["0x1"], "timeout": -1}', {}, 400, "bad_field", "timeout"),
    ("POST", "/v1/fetch", b'{"model_id": "m"}', {}, 400, "missing_field", "token_ids"),
    ("POST", "/v1/fetch", b'{"model_id": "m", "token_ids": [1], "block_size": 0}', {}, 400, "bad_field",
     "block_size"),
    ("POST", "/v1/fetch", b'{"model_id": "m", "token_ids": [-1], "block_size": 1}', {}, 400, "bad_field",
     "token_ids"),
    ("POST", "/v1/publish", b"\x05\x00", {}, 400, "bad_bundle", "no chunk count"),
    ("POST", "/v1/publish", b"".join(pack_bundle([1], [b"abc"]))[:-1], {}, 400, "bad_bundle", "chunk bytes"),
    ("POST", "/v1/publish", b"".join(pack_bundle([1], [b"abc"])), {"X-Kvpool-Generation": "x"}, 400,
     "bad_field", "X-Kvpool-Generation"),
    # Announces 2 MiB (over max_body_bytes); refused from the headers alone, before any body is sent.
    ("POST", "/v1/publish", None, {"Content-Length": str(2 << 20)}, 413, "body_too_large", "max_body_bytes"),
    ("GET", "/v1/nothing", None, {}, 404, "unknown_path", "no endpoint"),
    ("DELETE", "/v1/stats", None, {}, 405, "bad_method", "not allowed"),
]


def test_bad_api_calls_get_one_line_errors_and_are_counted(agent: Agent) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", agent.api_port, timeout=10)
    bearer = {"Authorization": f"Bearer {agent.token.value}"}
    expected: dict[str, int] = {}
    for method, path, body, headers, status, reason, words in BAD_CALLS:
        conn.request(method, path, body=body, headers={**bearer, **headers})
        resp = conn.getresponse()
        text = resp.read().decode()
        assert resp.status == status, (path, body, text)
        assert text.endswith("\n") and "\n" not in text[:-1]
        assert words in json.loads(text)["error"], text
        expected[reason] = expected.get(reason, 0) + 1
        if resp.will_close:  # the 413 closes the connection rather than read 2 MiB it refuses
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", agent.api_port, timeout=10)
    # The same keep-alive connection still works, and nothing bad was stored.
    conn.request("PUT", "/v1/chunks/0x1", body=b"good", headers=bearer)
    assert conn.getresponse().read() and agent.store.get(1) == b"good"
    conn.request("GET", "/v1/stats")
    stats = json.loads(conn.getresponse().read())
    conn.close()
    assert stats["api"]["errors"] == expected
    assert stats["api"]["errors_total"] == len(BAD_CALLS)
    assert stats["tiers"]["chunks"] == 1 and stats["agent"]["published_chunks"] == 1
