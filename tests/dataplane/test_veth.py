"""The model on real interfaces: hosts' own kernels talk through it over veth pairs.

Each host side lives in a network namespace of its own with its address, so ARP,
UDP checksums and socket delivery are the kernel's, as in Mininet.  Host-side checksum
offload stays ON here: the frames reach the switch with partial UDP checksums (the trap
DESIGN.md describes), and the model must complete them or the receiver drops silently.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterator

import pytest

from controller.p4runtime import P4RuntimeSwitch
from kvpool import contract as n
from kvpool import wire
from switchmodel.p4rt_server import P4RuntimeServer
from switchmodel.pipeline import KvpoolPipeline
from switchmodel.ports import PortIO, PortSpec
from switchmodel.state import SwitchState
from switchmodel.targets import start_model
from switchmodel.vethlab import VethLab, can_build, in_netns

from . import program
from .harness import BMV2_JSON, DEVICE_ID, LOG_DIR, P4INFO

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(can_build() is not None, reason=f"veth lab: {can_build()}"),
    pytest.mark.skipif(not P4INFO.exists(), reason=f"{P4INFO} is missing"),
]


def _udp_socket(lab: VethLab, host_index: int, port: int) -> socket.socket:
    """A UDP socket in host ``host_index``'s namespace, bound to its address."""
    sock = in_netns(lab.host_netns[host_index], functools.partial(socket.socket, socket.AF_INET,
                                                                 socket.SOCK_DGRAM))
    sock.bind((f"10.0.0.{host_index + 1}", port))
    sock.settimeout(3.0)
    return sock


@pytest.fixture
def lab() -> Iterator[VethLab]:
    """Four hosts with addresses, each in its own namespace, offloads left on."""
    with VethLab(4, host_offloads_off=False, separate_hosts=True, addresses=True) as built:
        yield built


def test_kernel_udp_with_partial_checksums_crosses_the_model(lab: VethLab) -> None:
    state = SwitchState(device_id=DEVICE_ID)
    pipeline = KvpoolPipeline(state)
    server = P4RuntimeServer(state, "127.0.0.1:0").start()
    ports = PortIO([PortSpec(i + 1, name) for i, name in enumerate(lab.switch_ifs)], pipeline)
    sw = P4RuntimeSwitch(f"127.0.0.1:{server.port}", P4INFO, device_id=DEVICE_ID, reconnect=False)
    try:
        sw.connect()
        program.routes(sw)
        ports.open()
        ports.start()
        rx = _udp_socket(lab, 1, 6000)
        tx = _udp_socket(lab, 0, 5000)
        tx.sendto(b"through the model", ("10.0.0.2", 6000))  # ARP first, then UDP, via the switch
        data, addr = rx.recvfrom(2048)
        assert (data, addr) == (b"through the model", ("10.0.0.1", 5000))
        assert ports.stats.checksums_completed >= 1  # the kernel left the UDP checksum to "hardware"
        rx.close()
        tx.close()
    finally:
        ports.close()
        sw.close()
        server.stop(0)


def test_kvpool_switch_process_fills_and_serves_kernel_sockets(lab: VethLab) -> None:
    proc = start_model(lab.switch_ifs, LOG_DIR, device_id=DEVICE_ID)
    sw = P4RuntimeSwitch(proc.grpc_addr, P4INFO, BMV2_JSON if BMV2_JSON.exists() else None, device_id=DEVICE_ID,
                         reconnect=False)
    key = 0xFEEDFACE
    chunk = program.chunk_bytes(3000)
    try:
        sw.connect()
        program.routes(sw)
        program.writer(sw, program.HOLDER)
        program.admit(sw, key, 7, len(chunk))
        holder = _udp_socket(lab, 2, wire.KVPOOL_UDP_PORT)
        agent1 = _udp_socket(lab, 0, 9000)
        agent2 = _udp_socket(lab, 1, 9001)
        # The holder answers agent 1: every fragment passes the switch and is stored.
        for i in range(wire.fragment_count(len(chunk))):
            holder.sendto(wire.data_packet(key, i, chunk, request_id=i), ("10.0.0.1", 9000))
            got, _ = agent1.recvfrom(4096)
            assert got == wire.data_packet(key, i, chunk, request_id=i)
        # Agent 2 asks with reply room: the switch answers from its memory, the holder never hears of it.
        agent2.sendto(wire.get_packet(key, 1, request_id=77, room=True), ("10.0.0.3", wire.KVPOOL_UDP_PORT))
        reply, addr = agent2.recvfrom(4096)
        assert addr == ("10.0.0.3", wire.KVPOOL_UDP_PORT)
        assert reply == wire.data_packet(key, 1, chunk, request_id=77, flags=int(wire.Flag.SWITCH_SERVED))
        holder.settimeout(0.3)
        with pytest.raises(TimeoutError):
            holder.recvfrom(4096)
        assert sw.read_counter(n.SLOT_HITS, 8)[8].packets == 1
        for s in (holder, agent1, agent2):
            s.close()
    finally:
        sw.close()
        proc.stop()
