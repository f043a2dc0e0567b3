"""The controller's P4Runtime driver against the model's gRPC server on 127.0.0.1.

Names in, names out: every call here uses P4Info names and plain values. Covers pipeline
push, batched writes and their error report, arbitration, multicast, counters, digests,
an unreachable switch, reconnect + resync to a restarted switch, and p4runtime-shell
attaching to the same server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from p4.v1 import p4runtime_pb2

from controller.p4runtime import (
    Entry,
    NoPipelineError,
    NotMasterError,
    P4RuntimeCallError,
    P4RuntimeError,
    P4RuntimeSwitch,
    SwitchUnreachableError,
    WriteError,
    make_cookie,
)
from kvpool import contract
from kvpool.p4rt.codec import ActionCall, FieldMatch, Replica, TableEntry
from kvpool.p4rt.p4info import P4Info, P4InfoError
from kvpool.tcp import free_port
from switchmodel.p4rt_server import P4RuntimeServer
from switchmodel.state import SwitchState
from tests.paths import P4RT_MINI

MINI = P4RT_MINI
KVPOOL_P4INFO = contract.P4INFO_PATH


@pytest.fixture
def server() -> Iterator[P4RuntimeServer]:
    srv = P4RuntimeServer(SwitchState(), f"127.0.0.1:{free_port()}").start()
    yield srv
    srv.stop()


@pytest.fixture
def sw(server: P4RuntimeServer) -> Iterator[P4RuntimeSwitch]:
    driver = P4RuntimeSwitch(f"127.0.0.1:{server.port}", MINI, b'{"model": true}', timeout_s=3, batch_size=64)
    driver.connect()
    yield driver
    driver.close()


def pool(key: int, slot: int = 1, port: int = 1) -> Entry:
    return Entry("MyIngress.pool", {"hdr.kv.key": key, "sm.ingress_port": port}, "MyIngress.pool_hit",
                 {"slot": slot, "nfrags": 4})


def test_connect_pushes_pipeline_once(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    assert sw.is_master and sw.connected
    pipe = server.state.pipeline
    assert pipe is not None and pipe.cookie == sw.cookie and pipe.device_config == b'{"model": true}'
    assert sw.switch_cookie() == sw.cookie
    sw.insert_entries([pool(1)])
    assert sw.resync() == {"pipeline": 0, "insert": 0, "modify": 0, "delete": 0}  # nothing to do
    assert server.state.entry_count("pool") == 1
    sw.push_pipeline()  # a forced push clears the switch, then the intended state is written back
    assert server.state.entry_count("pool") == 1


def test_entries_by_name_every_match_kind(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    sw.insert_entry("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.0.1.0/24"}, "ipv4_forward",
                    {"dstAddr": "00:00:00:00:01:02", "port": 2})
    sw.insert_entry("MyIngress.acl", {"hdr.ipv4.srcAddr": ("10.0.0.0", "255.0.0.0"), "hdr.udp.dstPort": (7000, 7999),
                                      "sm.ingress_port": 3}, "MyIngress.drop", priority=10)
    sw.insert_entries([pool(0xFFFF_FFFF_FFFF_FFFF, slot=65535)])
    state = server.state
    hit = state.lookup_exact("ipv4_lpm", 0x0A000107)
    assert hit.hit and hit.params == {"dstAddr": 0x0102, "port": 2}
    assert state.lookup("acl", [0x0A090909, 7470, 3]).action == "MyIngress.drop"
    assert state.lookup("acl", [0x0A090909, 7470, 4]).hit is False
    assert state.lookup_exact("pool", (1 << 64) - 1, 1).params["slot"] == 65535
    back = {e.table: e for e in sw.read_entries()}
    assert back["MyIngress.ipv4_lpm"].match == {"hdr.ipv4.dstAddr": (0x0A000100, 24)}
    assert back["MyIngress.acl"].match == {"hdr.ipv4.srcAddr": (0x0A000000, 0xFF000000),
                                           "hdr.udp.dstPort": (7000, 7999), "sm.ingress_port": 3}
    assert back["MyIngress.acl"].priority == 10
    sw.modify_entry("pool", {"hdr.kv.key": (1 << 64) - 1, "sm.ingress_port": 1}, "pool_hit", {"slot": 9, "nfrags": 1})
    assert state.lookup_exact("pool", (1 << 64) - 1, 1).params == {"slot": 9, "nfrags": 1}
    sw.delete_entry("ipv4_lpm", {"hdr.ipv4.dstAddr": ("10.0.1.0", 24)})
    assert state.entry_count("ipv4_lpm") == 0
    assert {e.table for e in sw.intended_entries} == {"MyIngress.acl", "MyIngress.pool"}
    sw.set_default_action("ipv4_lpm", "drop")
    assert sw.read_default_action("ipv4_lpm") == ("MyIngress.drop", {})


def test_bad_names_and_values_fail_before_sending(sw: P4RuntimeSwitch) -> None:
    with pytest.raises(P4InfoError, match="no table 'nope'"):
        sw.insert_entries([Entry("nope", {}, "drop")])
    with pytest.raises(P4InfoError, match=r"no match field .hdr\.kv\.kee."):
        sw.insert_entry("pool", {"hdr.kv.kee": 1, "sm.ingress_port": 1}, "pool_hit", {"slot": 1, "nfrags": 1})
    with pytest.raises(ValueError, match="does not fit in bit<9>"):
        sw.insert_entry("pool", {"hdr.kv.key": 1, "sm.ingress_port": 512}, "pool_hit", {"slot": 1, "nfrags": 1})
    with pytest.raises(ValueError, match=r"parameter.*nfrags missing"):
        sw.insert_entry("pool", {"hdr.kv.key": 1, "sm.ingress_port": 1}, "pool_hit", {"slot": 1})
    with pytest.raises(ValueError, match="host bits"):
        sw.insert_entry("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.0.1.1/24"}, "drop")
    with pytest.raises(ValueError, match=r"exact field.*sm\.ingress_port missing"):
        sw.insert_entry("pool", {"hdr.kv.key": 1}, "pool_hit", {"slot": 1, "nfrags": 1})
    assert sw.intended_entries == []


def test_batched_write_reports_each_rejected_update(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    sw.insert_entries([pool(1)])
    with pytest.raises(WriteError) as e:
        sw.insert_entries([pool(2), pool(1), pool(3), pool(4), pool(5)])  # dup, then the table (4) fills up
    # A full table is the target's refusal: UNKNOWN, as PI reports it over BMv2.
    assert e.value.codes == ["ALREADY_EXISTS", "UNKNOWN"]
    text = str(e.value)
    assert "rejected 2 of 5 update(s)" in text
    assert "#1 INSERT MyIngress.pool {hdr.kv.key=0x1, sm.ingress_port=0x1}: ALREADY_EXISTS" in text
    assert "#4 INSERT MyIngress.pool {hdr.kv.key=0x5" in text and "is full" in text
    assert server.state.entry_count("pool") == 4
    assert len(sw.intended_entries) == 4  # the accepted ones only
    with pytest.raises(WriteError, match="NOT_FOUND"):
        sw.delete_entries([pool(9)])
    with pytest.raises(WriteError, match="PERMISSION_DENIED: Cannot use DEFAULT_ONLY action"):
        sw.insert_entries([Entry("pool", {"hdr.kv.key": 8, "sm.ingress_port": 1}, "NoAction")])


def test_many_entries_in_batches(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    routes = [Entry("ipv4_lpm", {"hdr.ipv4.dstAddr": (i << 8, 24)}, "ipv4_forward", {"dstAddr": i, "port": i % 512})
              for i in range(1000)]
    sw.insert_entries(routes)  # 16 Write RPCs of up to 64 updates
    assert server.state.entry_count("ipv4_lpm") == 1000
    assert len(sw.read_entries("ipv4_lpm")) == 1000
    sw.delete_entries(routes[:500])
    assert server.state.entry_count("ipv4_lpm") == 500


def test_unreachable_switch_fails_fast_with_one_line() -> None:
    port = free_port()
    driver = P4RuntimeSwitch(f"127.0.0.1:{port}", MINI, timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(SwitchUnreachableError) as e:
        driver.connect()
    assert time.monotonic() - start < 5
    message = str(e.value)
    assert "\n" not in message and f"127.0.0.1:{port}" in message and "0.5 s" in message


def test_arbitration_between_two_drivers(server: P4RuntimeServer) -> None:
    addr = f"127.0.0.1:{server.port}"
    low = P4RuntimeSwitch(addr, MINI, election_id=(0, 1), timeout_s=3).connect()
    low.insert_entries([pool(1)])
    high = P4RuntimeSwitch(addr, MINI, election_id=(0, 2), timeout_s=3, reconnect=False).connect()
    assert high.is_master
    deadline = time.monotonic() + 5
    while low.is_master and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not low.is_master
    with pytest.raises(NotMasterError, match="refused Write"):
        low.insert_entries([pool(2)])
    # The new master's resync made the switch match *its* intended state: empty.
    assert server.state.entry_count("pool") == 0
    lower = P4RuntimeSwitch(addr, MINI, election_id=(0, 0x1), timeout_s=3, reconnect=False)
    with pytest.raises(SwitchUnreachableError, match="refused the stream: INVALID_ARGUMENT"):
        lower.connect()  # the same election id as a connected controller
    backup = P4RuntimeSwitch(addr, MINI, election_id=(0, 0), timeout_s=3, reconnect=False)
    with pytest.raises(NotMasterError, match="backup"):
        backup.connect()
    assert backup.read_entries() == []  # a backup can still read
    high.close()  # the master leaves: the next highest is promoted and makes the switch its own again
    deadline = time.monotonic() + 5
    while server.state.entry_count("pool") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert low.is_master and server.state.entry_count("pool") == 1
    low.insert_entries([pool(2)])
    for d in (low, lower, backup):
        d.close()


def test_multicast_groups(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    sw.set_multicast_group(7, [(1, 0), (1, 1), (2, 0)])
    assert sw.read_multicast_groups() == {7: [(1, 0), (1, 1), (2, 0)]}
    sw.set_multicast_group(7, [(3, 4)])  # replaces
    assert [(r.port, r.rid) for r in server.state.multicast_group(7)] == [(3, 4)]
    with pytest.raises(WriteError, match="twice"):
        sw.set_multicast_group(8, [(1, 0), (1, 0)])
    sw.delete_multicast_group(7)
    assert sw.read_multicast_groups() == {}
    with pytest.raises(WriteError, match="NOT_FOUND"):
        sw.delete_multicast_group(7)


def test_a_push_deletes_the_groups_first_and_replicas_compare_as_a_set(sw: P4RuntimeSwitch, server: P4RuntimeServer,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sw.set_multicast_group(7, [(1, 0), (2, 1)])
    # The same replicas read back in another order are the same group (BMv2 reads them
    # reversed): a resync leaves it alone.
    server.state.modify_group(7, [Replica(2, 1), Replica(1, 0)])
    assert sw.resync() == {"pipeline": 0, "insert": 0, "modify": 0, "delete": 0}
    # A push deletes the switch's groups before it goes (BMv2 keeps a pushed-over group's
    # replicas, and ours written back would add to them), then writes ours back.
    deleted: list[int] = []
    delete_group = server.state.delete_group

    def recorded(gid: int) -> None:
        deleted.append(gid)
        delete_group(gid)

    monkeypatch.setattr(server.state, "delete_group", recorded)
    sw.push_pipeline()
    assert deleted == [7]
    assert sw.read_multicast_groups() == {7: [(1, 0), (2, 1)]}


def test_counters(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    server.state.counter_add("hits", 3, 1408)
    server.state.counter_add("hits", 3, 1408)
    assert sw.read_counter("hits", 3)[3].packets == 2
    every = sw.read_counter("MyIngress.hits")
    assert len(every) == 16 and every[3].bytes == 2816 and every[0].packets == 0
    sw.insert_entry("acl", {"sm.ingress_port": 1}, "allow", priority=1)
    server.state.lookup("acl", [0, 0, 1], packet_len=100)
    ((entry, value),) = sw.read_direct_counters("acl")
    assert entry.match == {"sm.ingress_port": 1} and (value.packets, value.bytes) == (1, 100)


def test_digests_delivered_and_acked(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    sw.configure_digest("hot_digest_t", max_list_size=1, ack_timeout_ns=60 * 10**9)
    assert server.state.emit_digest("hot_digest_t", {"key": 0x1234, "count": 3})
    digest = sw.digests.get(timeout=5)
    assert digest.name == "hot_digest_t" and digest.items == [{"key": 0x1234, "count": 3}]
    deadline = time.monotonic() + 5
    while server.state.outstanding_digest_lists("hot_digest_t") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.state.outstanding_digest_lists("hot_digest_t") == []  # the driver acked it
    assert server.state.emit_digest("hot_digest_t", {"key": 0x1234, "count": 3})  # so it may come again
    assert sw.digests.get(timeout=5).items == [{"key": 0x1234, "count": 3}]
    sw.configure_digest("hot_digest_t", max_list_size=8, max_timeout_ns=10**9)
    assert sw.read_digest_configs()["hot_digest_t"].max_list_size == 8


def test_packet_out_and_in(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    got: list[tuple[bytes, dict[str, int]]] = []
    server.state.packet_out_handler = lambda payload, meta: got.append((payload, dict(meta)))
    sw.send_packet_out(b"\x01\x02", egress_port=5)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == [(b"\x01\x02", {"egress_port": 5})]
    server.state.send_packet_in(b"up", {"ingress_port": 2})
    pin = sw.packet_ins.get(timeout=5)
    assert pin.payload == b"up" and pin.metadata == {"ingress_port": 2}


@pytest.mark.slow
def test_reconnect_to_restarted_switch_resyncs_everything(server: P4RuntimeServer) -> None:
    port = server.port
    sw = P4RuntimeSwitch(f"127.0.0.1:{port}", MINI, b"{}", timeout_s=2).connect()
    sw.insert_entries([pool(k, slot=k) for k in range(3)])
    sw.insert_entry("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.0.0.0/8"}, "drop")
    sw.insert_entry("acl", {"hdr.ipv4.srcAddr": ("10.0.0.1", "255.255.255.255")}, "allow", priority=4)
    sw.set_default_action("ipv4_lpm", "drop")
    sw.set_multicast_group(3, [(1, 0), (2, 1)])
    sw.configure_digest("hot_digest_t", max_list_size=4, max_timeout_ns=1000)
    intended = sorted(map(repr, sw.intended_entries))
    assert sw.health()["state"] == "up" and sw.instance == 1  # the first push
    server.stop()
    deadline = time.monotonic() + 5
    while sw.connected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sw.connected
    health = sw.health()
    assert health["state"] == "down" and health["down_since"] is not None and health["last_error"]
    with pytest.raises(SwitchUnreachableError):
        sw.insert_entries([pool(9)])  # no switch: fails after timeout_s, not recorded
    fresh = P4RuntimeServer(SwitchState(), f"127.0.0.1:{port}").start()
    try:
        assert sw.wait_connected(20), "driver did not reconnect to the restarted switch"
        assert sw.reconnects == 1
        assert sw.instance == 2, "a switch with no pipeline is a new instance"
        assert sw.health()["state"] == "up" and sw.health()["down_since"] is None
        assert fresh.state.pipeline is not None and fresh.state.pipeline.cookie == sw.cookie
        assert sorted(map(repr, sw.read_entries())) == intended
        assert fresh.state.entry_count("pool") == 3
        assert fresh.state.default_action("ipv4_lpm") == ActionCall("MyIngress.drop", {})
        assert sw.read_multicast_groups() == {3: [(1, 0), (2, 1)]}
        assert sw.read_digest_configs()["hot_digest_t"].max_list_size == 4
        sw.insert_entries([pool(3)])  # and it is usable again
        assert fresh.state.entry_count("pool") == 4
    finally:
        sw.close()
        fresh.stop()


def test_a_switch_away_for_long_is_found_soon_after_it_listens_again(server: P4RuntimeServer) -> None:
    """gRPC's own backoff (1 s, then 1.6x: attempts near 1, 2.6, 5.2, 9.3, 15.8 s) is not the driver's pace.

    Away 10 s, a switch was found only at gRPC's next attempt, 4-7 s after it listened (a CI
    run's chaos test saw a 10 s reconnect); the driver's channel retries within
    ``max_backoff_s``. The bound is a deadline with room for a loaded machine, not a timing.
    """
    port = server.port
    sw = P4RuntimeSwitch(f"127.0.0.1:{port}", MINI, b"{}", timeout_s=30, max_backoff_s=0.5).connect()
    try:
        server.stop()
        deadline = time.monotonic() + 5
        while sw.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not sw.connected
        time.sleep(10)
        fresh = P4RuntimeServer(SwitchState(), f"127.0.0.1:{port}").start()
        try:
            assert sw.wait_connected(3), "not reconnected within 3 s of the switch listening again"
            assert sw.instance == 2
        finally:
            fresh.stop()
    finally:
        sw.close()


def test_resync_repairs_drift(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    sw.insert_entries([pool(1, slot=1), pool(2, slot=2)])
    sw.set_multicast_group(1, [(1, 0)])
    state = server.state
    # Changes behind the controller's back: an extra entry, a changed one, a lost one, a lost group.
    state.insert_entry("pool", TableEntry({"hdr.kv.key": FieldMatch("exact", 7), "sm.ingress_port":
                                           FieldMatch("exact", 1)}, ActionCall("MyIngress.pool_hit",
                                                                               {"slot": 7, "nfrags": 1})))
    state.modify_entry("pool", TableEntry({"hdr.kv.key": FieldMatch("exact", 1), "sm.ingress_port":
                                           FieldMatch("exact", 1)}, ActionCall("MyIngress.pool_hit",
                                                                               {"slot": 99, "nfrags": 1})))
    state.delete_entry("pool", {"hdr.kv.key": FieldMatch("exact", 2), "sm.ingress_port": FieldMatch("exact", 1)})
    state.delete_group(1)
    assert sw.resync() == {"pipeline": 0, "insert": 2, "modify": 1, "delete": 1}
    assert sorted(e.match["hdr.kv.key"] for e in sw.read_entries("pool")) == [1, 2]  # type: ignore[type-var]
    assert state.lookup_exact("pool", 1, 1).params["slot"] == 1
    assert sw.read_multicast_groups() == {1: [(1, 0)]}


def test_p4runtime_shell_attaches(server: P4RuntimeServer, tmp_path: Path) -> None:
    sh = pytest.importorskip("p4runtime_sh.shell")
    from p4runtime_sh.p4runtime import P4RuntimeWriteException
    device_config = tmp_path / "kvpool.json"
    device_config.write_text("{}")
    sh.setup(device_id=1, grpc_addr=f"127.0.0.1:{server.port}", election_id=(0, 1),
             config=sh.FwdPipeConfig(str(MINI), str(device_config)), verbose=False)
    try:
        te = sh.TableEntry("MyIngress.pool")(action="MyIngress.pool_hit")
        te.match["hdr.kv.key"] = "5"
        te.match["sm.ingress_port"] = "1"
        te.action["slot"] = "3"
        te.action["nfrags"] = "2"
        te.insert()
        assert server.state.lookup_exact("pool", 5, 1).params == {"slot": 3, "nfrags": 2}
        (read,) = list(sh.TableEntry("MyIngress.pool").read())
        assert read.action["slot"].value == b"\x03"  # type: ignore[index]
        group = sh.MulticastGroupEntry(4).add(1, 0).add(2, 1)
        group.insert()
        assert len(list(sh.MulticastGroupEntry(4).read())) == 1
        with pytest.raises(P4RuntimeWriteException, match="ALREADY_EXISTS"):
            te.insert()
    finally:
        sh.teardown()


@pytest.mark.skipif(not KVPOOL_P4INFO.exists(), reason="p4/build/kvpool.p4info.txtpb not built yet")
def test_driver_with_the_kvpool_program(server: P4RuntimeServer) -> None:
    with P4RuntimeSwitch.for_kvpool(f"127.0.0.1:{server.port}", timeout_s=3) as sw:
        sw.connect()
        p4info = sw.p4info
        assert server.state.pipeline is not None
        for t in p4info.tables:
            action, _ = sw.read_default_action(t.name)
            assert p4info.has("action", action)
        for c in p4info.counters:
            assert len(sw.read_counter(c.name)) == c.size
        for d in p4info.digests:
            sw.configure_digest(d.name, max_list_size=1)
        assert set(sw.read_digest_configs()) == {d.name for d in p4info.digests}
        sw.set_multicast_group(1, [(1, 0), (2, 1)])
        assert sw.read_multicast_groups() == {1: [(1, 0), (2, 1)]}


def test_every_failure_is_a_typed_p4runtime_error(sw: P4RuntimeSwitch, server: P4RuntimeServer) -> None:
    with pytest.raises(P4RuntimeCallError) as e:  # a read the switch refuses: INVALID_ARGUMENT
        sw._read([p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=0x02FFFFFF))])
    assert e.value.code == "INVALID_ARGUMENT" and e.value.address == sw.address
    with pytest.raises(WriteError) as w:
        sw.delete_entries([pool(9)])
    assert isinstance(w.value, P4RuntimeError) and w.value.code == "NOT_FOUND"
    server.state.set_pipeline(P4Info.load(MINI))  # someone wiped the switch: same P4Info, no cookie
    server.state._pipeline = None  # and then it lost its pipeline altogether (a restart without a push)
    with pytest.raises(NoPipelineError):
        sw.read_counter("hits")
    assert not sw.ready  # the driver knows the session is gone: it reconnects and pushes again
    assert sw.wait_connected(10) and server.state.pipeline is not None
    assert sw.instance == 2


def test_a_call_spans_one_session_or_its_answer_is_discarded(sw: P4RuntimeSwitch) -> None:
    def reconnects_meanwhile(stub: Any) -> str:
        sw._session += 1  # what _open does when the channel came back to a (new) switch process
        return "the new process's answer"

    with pytest.raises(SwitchUnreachableError, match="answer was discarded"):
        sw._call("Read", reconnects_meanwhile)


def test_deferred_writes_reach_a_restarted_switch(server: P4RuntimeServer) -> None:
    port = server.port
    sw = P4RuntimeSwitch(f"127.0.0.1:{port}", MINI, b"{}", timeout_s=2, wait_ready_s=0, defer_writes=True,
                         max_backoff_s=0.2).connect()
    try:
        sw.insert_entries([pool(1)])
        server.stop()
        deadline = time.monotonic() + 5
        while sw.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        sw.insert_entries([pool(2)])  # the switch is down: only the intended state changes, at once
        sw.set_multicast_group(5, [(1, 0)])
        with pytest.raises(SwitchUnreachableError):
            sw.read_entries("pool")  # reads do not wait (wait_ready_s=0)
        fresh = P4RuntimeServer(SwitchState(), f"127.0.0.1:{port}").start()
        try:
            assert sw.wait_connected(20)
            assert fresh.state.entry_count("pool") == 2 and set(fresh.state.multicast_groups()) == {5}
        finally:
            fresh.stop()
    finally:
        sw.close()


def test_a_new_driver_adopts_a_warm_switch(server: P4RuntimeServer) -> None:
    addr = f"127.0.0.1:{server.port}"
    first = P4RuntimeSwitch(addr, MINI, b"{}", timeout_s=3).connect()
    first.insert_entries([pool(1, slot=5), pool(2, slot=6)])
    first.insert_entry("ipv4_lpm", {"hdr.ipv4.dstAddr": "10.0.0.0/8"}, "drop")
    cookie = first.cookie
    first.close()
    second = P4RuntimeSwitch(addr, MINI, b"{}", timeout_s=3).connect(push_pipeline=False)
    try:
        adopted = second.adopt("pool")
        assert sorted(e.params["slot"] for e in adopted) == [5, 6]  # type: ignore[type-var]
        second.manage()
        assert second.adopted and second.cookie == cookie and server.state.pipeline is not None
        assert server.state.pipeline.cookie == cookie  # not pushed again
        assert server.state.entry_count("pool") == 2  # kept: adopted
        assert server.state.entry_count("ipv4_lpm") == 0  # not adopted: the resync removed it
    finally:
        second.close()


def test_a_pipeline_pushed_by_someone_else_is_a_new_instance(server: P4RuntimeServer) -> None:
    sw = P4RuntimeSwitch(f"127.0.0.1:{server.port}", MINI, b"{}", timeout_s=3, check_interval_s=0.1).connect()
    try:
        sw.insert_entries([pool(1)])
        instance = sw.instance
        other = make_cookie(sw.pipeline_id, nonce=(sw.cookie + 1))
        server.state.set_pipeline(P4Info.load(MINI), b"{}", other)  # a push that cleared the switch
        deadline = time.monotonic() + 10
        while server.state.entry_count("pool") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.state.entry_count("pool") == 1, "the driver did not notice the foreign push"
        assert sw.instance == instance + 1 and sw.cookie == other  # ours, pushed by someone else: kept
    finally:
        sw.close()
