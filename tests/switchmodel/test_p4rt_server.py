"""The model's P4Runtime server over a real gRPC channel on 127.0.0.1, spoken to with raw protobufs.

Checks what a controller could notice: arbitration, pipeline actions, per-update error
codes in the Write status details (as PI/BMv2 report them), wildcard reads, counters,
multicast groups, digests with acks, packet-in/out.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from kvpool.p4rt.codec import CounterValue, Replica
from kvpool.p4rt.p4info import P4Info
from switchmodel.p4rt_server import P4RuntimeServer
from switchmodel.state import SwitchState
from tests.paths import P4RT_MINI

MINI = P4RT_MINI
P4INFO = P4Info.load(MINI)
T_LPM, T_POOL, T_ACL = (P4INFO.table(n).id for n in ("ipv4_lpm", "pool", "acl"))
A_FWD, A_DROP, A_HIT, A_ALLOW, A_NOP = (P4INFO.action(n).id for n in
                                        ("ipv4_forward", "drop", "pool_hit", "allow", "NoAction"))
C_HITS = P4INFO.counter("hits").id
D_HOT = P4INFO.digest("hot_digest_t").id


class Controller:
    """A bare P4Runtime client: one stream, arbitration replies and stream messages in queues."""

    def __init__(self, address: str, election: int | None, device_id: int = 1) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.election = election or 0
        self.device_id = device_id
        self.requests: queue.Queue[Any] = queue.Queue()
        self.arbitration: queue.Queue[Any] = queue.Queue()
        self.messages: queue.Queue[Any] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.stream = self.stub.StreamChannel(self._iter())
        threading.Thread(target=self._recv, daemon=True).start()
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = device_id
        if election is not None:
            req.arbitration.election_id.low = election
        self.requests.put(req)

    def _iter(self) -> Iterator[Any]:
        while (msg := self.requests.get()) is not None:
            yield msg

    def _recv(self) -> None:
        try:
            for msg in self.stream:
                (self.arbitration if msg.HasField("arbitration") else self.messages).put(msg)
        except grpc.RpcError as e:
            self.error = e
            self.arbitration.put(e)

    def arb(self) -> Any:
        return self.arbitration.get(timeout=5)

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()

    def write(self, *updates: Any, election: int | None = None) -> None:
        req = p4runtime_pb2.WriteRequest(device_id=self.device_id)
        req.election_id.low = self.election if election is None else election
        req.updates.extend(updates)
        self.stub.Write(req, timeout=5)

    def read(self, *entities: Any) -> list[Any]:
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id, entities=list(entities))
        return [e for r in self.stub.Read(req, timeout=5) for e in r.entities]

    def set_pipeline(self, action: int = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
                     cookie: int = 1, p4info: Any = None) -> None:
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=self.device_id, action=action)
        req.election_id.low = self.election
        req.config.p4info.CopyFrom(p4info if p4info is not None else P4INFO.message)
        req.config.p4_device_config = b"{}"
        req.config.cookie.cookie = cookie
        self.stub.SetForwardingPipelineConfig(req, timeout=5)


def update(utype: int, **entity: Any) -> Any:
    u = p4runtime_pb2.Update(type=utype)
    for kind, msg in entity.items():
        getattr(u.entity, kind).CopyFrom(msg)
    return u


def pool_entry(key: int, port: int = 1, slot: int | bytes = 3, nfrags: bytes = b"\x02",
               action: int = A_HIT) -> Any:
    te = p4runtime_pb2.TableEntry(table_id=T_POOL)
    te.match.add(field_id=1).exact.value = key.to_bytes(8, "big")  # padded form: must be accepted
    te.match.add(field_id=2).exact.value = bytes([port])
    act = te.action.action
    act.action_id = action
    if action == A_HIT:
        act.params.add(param_id=1, value=slot if isinstance(slot, bytes) else slot.to_bytes(2, "big"))
        act.params.add(param_id=2, value=nfrags)
    return te


INSERT, MODIFY, DELETE = p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE


def write_errors(e: grpc.RpcError) -> list[tuple[str, str]]:
    """(code name, message) per update from a failed Write's status details."""
    assert e.code() == grpc.StatusCode.UNKNOWN
    status = status_pb2.Status()
    for key, value in e.trailing_metadata():
        if key == "grpc-status-details-bin":
            status.ParseFromString(value)
    out = []
    for detail in status.details:
        err = p4runtime_pb2.Error()
        assert detail.Unpack(err)
        out.append((code_pb2.Code.Name(err.canonical_code), str(err.message)))
    return out


@pytest.fixture
def server() -> Iterator[P4RuntimeServer]:
    srv = P4RuntimeServer(SwitchState(device_id=1), "127.0.0.1:0").start()
    yield srv
    srv.stop()


@pytest.fixture
def addr(server: P4RuntimeServer) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def master(addr: str) -> Iterator[Controller]:
    c = Controller(addr, election=10)
    assert c.arb().arbitration.status.code == code_pb2.OK
    c.set_pipeline()
    yield c
    c.close()


def test_writes_only_from_the_primarys_stream(addr: str, server: P4RuntimeServer) -> None:
    # Each client on its own connection, as separate processes would be.
    rogue = grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
    stub = p4runtime_pb2_grpc.P4RuntimeStub(rogue)
    req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
        device_id=1, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
    req.config.p4info.CopyFrom(P4INFO.message)
    for election in (None, 1):  # nobody connected: refused with or without an election id (PI takes the first)
        if election is not None:
            req.election_id.low = election
        with pytest.raises(grpc.RpcError) as e:
            stub.SetForwardingPipelineConfig(req, timeout=5)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    c = Controller(addr, election=10)
    assert c.arb().arbitration.status.code == code_pb2.OK
    c.set_pipeline()
    write = p4runtime_pb2.WriteRequest(device_id=1, updates=[update(INSERT, table_entry=pool_entry(1))])
    write.election_id.low = 10  # the primary's id, but not from the primary's stream
    with pytest.raises(grpc.RpcError) as e:
        stub.Write(write, timeout=5)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "connection" in str(e.value.details())
    assert server.state.entry_count("pool") == 0
    c.write(update(INSERT, table_entry=pool_entry(1)))  # the primary itself
    assert server.state.entry_count("pool") == 1
    rogue.close()
    c.close()


def test_capabilities_and_no_pipeline(addr: str) -> None:
    c = Controller(addr, election=1)
    assert c.arb().arbitration.status.code == code_pb2.OK
    assert c.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest()).p4runtime_api_version == "1.4.1"
    for call in (lambda: c.write(update(INSERT, table_entry=pool_entry(1))),
                 lambda: c.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())),
                 lambda: c.stub.GetForwardingPipelineConfig(
                     p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=1))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    c.close()


def test_arbitration_highest_election_id_wins(addr: str) -> None:
    a = Controller(addr, election=5)
    first = a.arb().arbitration
    assert first.status.code == code_pb2.OK and first.election_id.low == 5
    a.set_pipeline()
    b = Controller(addr, election=9)
    got_b = b.arb().arbitration
    assert got_b.status.code == code_pb2.OK and got_b.election_id.low == 9
    demoted = a.arb().arbitration  # the old master is told it lost mastership
    assert demoted.status.code == code_pb2.ALREADY_EXISTS and demoted.election_id.low == 9
    with pytest.raises(grpc.RpcError) as e:
        a.write(update(INSERT, table_entry=pool_entry(1)))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        a.set_pipeline()
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    b.write(update(INSERT, table_entry=pool_entry(1)))
    c = Controller(addr, election=3)  # a lower one joins as backup, told who is master
    got_c = c.arb().arbitration
    assert got_c.status.code == code_pb2.ALREADY_EXISTS and got_c.election_id.low == 9
    assert len(a.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()))) == 1  # backups may read
    b.close()  # the master leaves: the next highest is promoted
    promoted = a.arb().arbitration
    assert promoted.status.code == code_pb2.OK and promoted.election_id.low == 5
    a.write(update(INSERT, table_entry=pool_entry(2)))
    a.close()
    c.close()


def test_duplicate_election_id_and_bad_device(addr: str) -> None:
    a = Controller(addr, election=4)
    assert a.arb().arbitration.status.code == code_pb2.OK
    dup = Controller(addr, election=4)
    err = dup.arb()
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    wrong = Controller(addr, election=7, device_id=42)  # PI: another device id is a device without a pipeline
    assert wrong.arb().arbitration.status.code == code_pb2.OK
    for call in (lambda: wrong.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry())),
                 lambda: wrong.write(update(INSERT, table_entry=pool_entry(1)))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    noid = Controller(addr, election=None)  # no election id is election id 0: a backup here
    got = noid.arb().arbitration
    assert got.status.code == code_pb2.ALREADY_EXISTS and got.election_id.low == 4
    noid2 = Controller(addr, election=0)
    err = noid2.arb()
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    for c in (a, dup, wrong, noid, noid2):
        c.close()


def test_batch_reports_each_update_and_applies_the_good_ones(master: Controller, server: P4RuntimeServer) -> None:
    bad_table = pool_entry(9)
    bad_table.table_id = 0x02FFFFFF
    bad_action = pool_entry(10, action=A_ALLOW)  # allow is not an action of pool
    bad_param_width = pool_entry(11, slot=b"\x01\x00\x00")  # 3 bytes for bit<16>
    missing_param = pool_entry(12)
    del missing_param.action.action.params[1]
    unknown_action = pool_entry(13)
    unknown_action.action.action.action_id = 0x01FFFFFF
    default_only = pool_entry(14, action=A_NOP)
    updates = [
        update(INSERT, table_entry=pool_entry(1)),
        update(INSERT, table_entry=pool_entry(1)),
        update(DELETE, table_entry=pool_entry(2)),
        update(INSERT, table_entry=bad_table),
        update(INSERT, table_entry=bad_action),
        update(INSERT, table_entry=bad_param_width),
        update(INSERT, table_entry=missing_param),
        update(INSERT, table_entry=unknown_action),
        update(INSERT, table_entry=default_only),
        update(INSERT, table_entry=pool_entry(3)),
    ]
    with pytest.raises(grpc.RpcError) as e:
        master.write(*updates)
    codes = [code for code, _ in write_errors(e.value)]
    # Unknown P4Info ids are INVALID_ARGUMENT, as PI answers them; a missing entry is NOT_FOUND;
    # a DEFAULT_ONLY action in an entry is PERMISSION_DENIED (the spec's code, and PI's).
    assert codes == ["OK", "ALREADY_EXISTS", "NOT_FOUND", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT",
                     "INVALID_ARGUMENT", "INVALID_ARGUMENT", "PERMISSION_DENIED", "OK"]
    messages = dict(enumerate(m for _, m in write_errors(e.value)))
    assert "already exists" in messages[1] and "does not fit in bit<16>" in messages[5]
    assert "slot" not in messages[6] and "nfrags" in messages[6]
    assert server.state.entry_count("pool") == 2
    assert server.state.lookup_exact("pool", 3, 1).params == {"slot": 3, "nfrags": 2}


def test_match_validation(master: Controller) -> None:
    def lpm(value: bytes, plen: int) -> Any:
        te = p4runtime_pb2.TableEntry(table_id=T_LPM)
        m = te.match.add(field_id=1)
        m.lpm.value, m.lpm.prefix_len = value, plen
        te.action.action.action_id = A_DROP
        return te

    def acl(priority: int, value: bytes = b"\x0a\x00\x00\x00", mask: bytes = b"\xff\x00\x00\x00") -> Any:
        te = p4runtime_pb2.TableEntry(table_id=T_ACL, priority=priority)
        m = te.match.add(field_id=1)
        m.ternary.value, m.ternary.mask = value, mask
        te.action.action.action_id = A_ALLOW
        return te

    wrong_kind = lpm(b"\x0a", 8)
    wrong_kind.match[0].ClearField("lpm")
    wrong_kind.match[0].exact.value = b"\x0a"
    unknown_field = pool_entry(1)
    unknown_field.match[1].field_id = 9
    no_exact = pool_entry(1)
    del no_exact.match[1]
    with pytest.raises(grpc.RpcError) as e:
        master.write(update(INSERT, table_entry=lpm(b"\x0a\x00\x00\x00", 8)),
                     update(INSERT, table_entry=lpm(b"\x0a\x00\x01\x00", 8)),  # host bits beyond /8
                     update(INSERT, table_entry=lpm(b"\x0a", 33)),
                     update(INSERT, table_entry=acl(0)),  # ternary table needs a priority
                     update(INSERT, table_entry=acl(5, value=b"\x0a\x01\x00\x00")),  # value outside mask
                     update(INSERT, table_entry=acl(5)),
                     update(INSERT, table_entry=wrong_kind),
                     update(INSERT, table_entry=unknown_field),
                     update(INSERT, table_entry=no_exact),
                     update(MODIFY, table_entry=pool_entry(77)))
    assert [c for c, _ in write_errors(e.value)] == [
        "OK", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "OK",
        "INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "NOT_FOUND"]


def test_table_full_is_the_targets_refusal(master: Controller) -> None:
    master.write(*(update(INSERT, table_entry=pool_entry(k)) for k in range(4)))
    with pytest.raises(grpc.RpcError) as e:
        master.write(update(INSERT, table_entry=pool_entry(4)))
    # PI reports BMv2's TABLE_FULL as UNKNOWN ("Error when adding match entry to target").
    assert write_errors(e.value) == [("UNKNOWN", "Error when adding match entry to target: table MyIngress.pool "
                                                 "is full (4 entries)")]


def test_reads_are_canonical_and_support_wildcards(master: Controller) -> None:
    master.write(update(INSERT, table_entry=pool_entry(1)), update(INSERT, table_entry=pool_entry(2, slot=7)))
    everything = master.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry()))
    assert len(everything) == 2
    te = everything[0].table_entry
    assert te.match[0].exact.value == b"\x01"  # canonical: no leading zeros
    assert te.action.action.params[0].value == b"\x03"
    one = master.read(p4runtime_pb2.Entity(table_entry=pool_entry(2)))
    assert len(one) == 1 and one[0].table_entry.action.action.params[0].value == b"\x07"
    none = master.read(p4runtime_pb2.Entity(table_entry=pool_entry(99)))
    assert none == []
    default = master.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(
        table_id=T_LPM, is_default_action=True)))
    assert default[0].table_entry.action.action.action_id == A_NOP
    with pytest.raises(grpc.RpcError) as e:
        master.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=0x02FFFFFF)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        master.read(p4runtime_pb2.Entity(register_entry=p4runtime_pb2.RegisterEntry()))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_default_entry_modify(master: Controller, server: P4RuntimeServer) -> None:
    te = p4runtime_pb2.TableEntry(table_id=T_LPM, is_default_action=True)
    te.action.action.action_id = A_DROP
    master.write(update(MODIFY, table_entry=te))
    assert server.state.default_action("ipv4_lpm").action == "MyIngress.drop"
    with pytest.raises(grpc.RpcError) as e:
        master.write(update(INSERT, table_entry=te))
    assert write_errors(e.value)[0][0] == "INVALID_ARGUMENT"
    reset = p4runtime_pb2.TableEntry(table_id=T_LPM, is_default_action=True)
    master.write(update(MODIFY, table_entry=reset))
    assert server.state.default_action("ipv4_lpm").action == "NoAction"


def test_counters_read_and_modify(master: Controller, server: P4RuntimeServer) -> None:
    server.state.counter_add("hits", 4, 1000)
    server.state.counter_add("hits", 4, 500)
    cell = master.read(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
        counter_id=C_HITS, index=p4runtime_pb2.Index(index=4))))
    assert [(c.counter_entry.data.packet_count, c.counter_entry.data.byte_count) for c in cell] == [(2, 1500)]
    every = master.read(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(counter_id=C_HITS)))
    assert len(every) == 16 and every[4].counter_entry.data.packet_count == 2
    assert len(master.read(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry()))) == 16
    with pytest.raises(grpc.RpcError) as e:
        master.read(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
            counter_id=C_HITS, index=p4runtime_pb2.Index(index=16))))
    assert e.value.code() == grpc.StatusCode.UNKNOWN  # PI: "Error when reading counter from target"
    reset = p4runtime_pb2.CounterEntry(counter_id=C_HITS, index=p4runtime_pb2.Index(index=4))
    master.write(update(MODIFY, counter_entry=reset))
    assert server.state.counter_read("hits", 4) == CounterValue(0, 0)
    with pytest.raises(grpc.RpcError) as e:
        master.write(update(INSERT, counter_entry=reset))
    assert write_errors(e.value)[0][0] == "INVALID_ARGUMENT"
    server.state.counter_add("hits", 5, 64)
    master.write(update(DELETE, counter_entry=p4runtime_pb2.CounterEntry(counter_id=C_HITS,
                                                                         index=p4runtime_pb2.Index(index=5))))
    assert server.state.counter_read("hits", 5) == CounterValue(0, 0)  # as PI: DELETE resets


def test_direct_counters(master: Controller, server: P4RuntimeServer) -> None:
    te = p4runtime_pb2.TableEntry(table_id=T_ACL, priority=3)
    m = te.match.add(field_id=3)
    m.optional.value = b"\x02"
    te.action.action.action_id = A_DROP
    master.write(update(INSERT, table_entry=te))
    server.state.lookup("acl", [1, 2, 2], packet_len=64)
    got = master.read(p4runtime_pb2.Entity(direct_counter_entry=p4runtime_pb2.DirectCounterEntry(
        table_entry=p4runtime_pb2.TableEntry(table_id=T_ACL))))
    assert [(g.direct_counter_entry.data.packet_count, g.direct_counter_entry.data.byte_count)
            for g in got] == [(1, 64)]
    with_counters = master.read(p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(
        table_id=T_ACL, counter_data=p4runtime_pb2.CounterData())))
    assert with_counters[0].table_entry.counter_data.byte_count == 64


def test_multicast_groups(master: Controller, server: P4RuntimeServer) -> None:
    def group(gid: int, *replicas: tuple[int, int]) -> Any:
        pre = p4runtime_pb2.PacketReplicationEngineEntry()
        pre.multicast_group_entry.multicast_group_id = gid
        for port, rid in replicas:
            pre.multicast_group_entry.replicas.add(egress_port=port, instance=rid)
        return pre

    master.write(update(INSERT, packet_replication_engine_entry=group(1, (1, 0), (1, 1), (3, 0))))
    assert server.state.multicast_group(1) == (Replica(1, 0), Replica(1, 1), Replica(3, 0))
    with pytest.raises(grpc.RpcError) as e:
        master.write(update(INSERT, packet_replication_engine_entry=group(1, (2, 0))),
                     update(MODIFY, packet_replication_engine_entry=group(2, (2, 0))),
                     update(DELETE, packet_replication_engine_entry=group(3)))
    assert [c for c, _ in write_errors(e.value)] == ["ALREADY_EXISTS", "NOT_FOUND", "NOT_FOUND"]
    master.write(update(MODIFY, packet_replication_engine_entry=group(1, (2, 5))))
    read = master.read(p4runtime_pb2.Entity(packet_replication_engine_entry=group(0)))
    assert [(r.egress_port, r.instance) for r in
            read[0].packet_replication_engine_entry.multicast_group_entry.replicas] == [(2, 5)]
    master.write(update(DELETE, packet_replication_engine_entry=group(1)))
    assert server.state.multicast_groups() == {}


def test_pipeline_actions(master: Controller, server: P4RuntimeServer) -> None:
    actions = p4runtime_pb2.SetForwardingPipelineConfigRequest
    master.write(update(INSERT, table_entry=pool_entry(1)))
    master.set_pipeline(actions.VERIFY, cookie=2)
    assert server.state.entry_count("pool") == 1
    master.set_pipeline(actions.RECONCILE_AND_COMMIT, cookie=3)
    assert server.state.entry_count("pool") == 1
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest
    cfg = master.stub.GetForwardingPipelineConfig(get(device_id=1, response_type=get.COOKIE_ONLY)).config
    assert cfg.cookie.cookie == 3 and not cfg.HasField("p4info")
    cfg = master.stub.GetForwardingPipelineConfig(get(device_id=1)).config
    assert cfg.p4info.tables[0].preamble.name == "MyIngress.ipv4_lpm" and cfg.p4_device_config == b"{}"
    master.set_pipeline(actions.VERIFY_AND_SAVE, cookie=4)
    assert master.stub.GetForwardingPipelineConfig(get(device_id=1)).config.cookie.cookie == 3
    master.set_pipeline(actions.COMMIT)
    assert master.stub.GetForwardingPipelineConfig(get(device_id=1)).config.cookie.cookie == 4
    assert server.state.entry_count("pool") == 0
    with pytest.raises(grpc.RpcError) as e:
        master.set_pipeline(actions.UNSPECIFIED)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    broken = P4INFO.message.__class__()
    broken.CopyFrom(P4INFO.message)
    broken.digests[0].type_spec.struct.name = "missing_t"
    with pytest.raises(grpc.RpcError) as e:
        master.set_pipeline(p4info=broken)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_digests_go_to_the_master_and_acks_free_the_data(master: Controller, server: P4RuntimeServer,
                                                         addr: str) -> None:
    backup = Controller(addr, election=1)
    assert backup.arb().arbitration.status.code == code_pb2.ALREADY_EXISTS
    entry = p4runtime_pb2.DigestEntry(digest_id=D_HOT)
    entry.config.max_list_size = 2
    entry.config.max_timeout_ns = 10**9
    entry.config.ack_timeout_ns = 60 * 10**9
    master.write(update(INSERT, digest_entry=entry))
    with pytest.raises(grpc.RpcError) as e:
        master.write(update(INSERT, digest_entry=entry))
    assert write_errors(e.value)[0][0] == "ALREADY_EXISTS"
    read = master.read(p4runtime_pb2.Entity(digest_entry=p4runtime_pb2.DigestEntry(digest_id=D_HOT)))
    assert read[0].digest_entry.config.max_list_size == 2
    with pytest.raises(grpc.RpcError) as e:  # as PI: "digest_id must be set when reading DigestEntry"
        master.read(p4runtime_pb2.Entity(digest_entry=p4runtime_pb2.DigestEntry()))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert server.state.emit_digest("hot_digest_t", {"key": 0xABCDEF, "count": 9})
    assert server.state.emit_digest("hot_digest_t", {"key": 7, "count": 1})
    msg = master.messages.get(timeout=5).digest
    values = [[m.bitstring for m in d.struct.members] for d in msg.data]
    assert msg.digest_id == D_HOT and values == [[b"\xab\xcd\xef", b"\x09"], [b"\x07", b"\x01"]]
    assert server.state.outstanding_digest_lists("hot_digest_t") == [msg.list_id]
    assert not server.state.emit_digest("hot_digest_t", {"key": 7, "count": 1})  # unacked: suppressed
    ack = p4runtime_pb2.StreamMessageRequest()
    ack.digest_ack.digest_id, ack.digest_ack.list_id = D_HOT, msg.list_id
    master.requests.put(ack)
    for _ in range(100):
        if not server.state.outstanding_digest_lists("hot_digest_t"):
            break
        threading.Event().wait(0.02)
    assert server.state.outstanding_digest_lists("hot_digest_t") == []
    assert server.state.emit_digest("hot_digest_t", {"key": 7, "count": 1})
    assert backup.messages.empty()
    backup.close()


def test_packet_out_and_in(master: Controller, server: P4RuntimeServer) -> None:
    got: list[tuple[bytes, dict[str, int]]] = []
    done = threading.Event()

    def handler(payload: bytes, meta: Any) -> None:
        got.append((payload, dict(meta)))
        done.set()

    server.state.packet_out_handler = handler
    req = p4runtime_pb2.StreamMessageRequest()
    req.packet.payload = b"hello"
    req.packet.metadata.add(metadata_id=1, value=b"\x01\x02")
    master.requests.put(req)
    assert done.wait(5) and got == [(b"hello", {"egress_port": 0x102})]
    server.state.send_packet_in(b"back", {"ingress_port": 7})
    pin = master.messages.get(timeout=5).packet
    assert pin.payload == b"back" and [(m.metadata_id, m.value) for m in pin.metadata] == [(1, b"\x07")]
