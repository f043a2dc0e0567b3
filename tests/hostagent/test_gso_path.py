"""Segmented sends on a Mininet-like veth: what a software switch reading the peer sees.

The host side of a veth lives in a namespace of its own, as a Mininet host; the switch
side is read with a packet socket, as the model switch and BMv2 read their ports.  With the
host's offloads off (how ``bmv2_topologies`` configures hosts) the kernel splits a
segmented send into ordinary frames before the veth, so GSO stays on; with them on the veth
would hand the peer one 64 KiB frame, so the holder sends one datagram per call there.
"""

from __future__ import annotations

import socket
import subprocess
import time

import numpy as np
import pytest

from hostagent.send_queue import SendJob, SendQueue
from hostagent.transport_config import Counters, TransportConfig
from kvpool import wire
from switchmodel.ports import open_raw_socket, recv_frame
from switchmodel.vethlab import VethLab, can_build, in_netns

pytestmark = pytest.mark.skipif(can_build() is not None, reason=str(can_build()))

_PEER = "10.0.0.99"


def _frames_after_sending(offloads_off: bool, count: int) -> tuple[SendQueue, list[int]]:
    """Send ``count`` DATA from the lab's host through a ``SendQueue``; the queue and the frame lengths seen."""
    with VethLab(1, host_offloads_off=offloads_off, addresses=True) as lab:
        ns, host_if = lab.host_netns[0], lab.host_ifs[0]
        # No ARP on the way: the peer's MAC is fixed, as Mininet hosts' neighbours are.
        subprocess.run(["ip", "netns", "exec", ns, "ip", "neigh", "replace", _PEER, "lladdr", "02:00:00:00:00:63",
                        "dev", host_if, "nud", "permanent"], check=True)
        tap = open_raw_socket(lab.switch_ifs[0])
        try:
            def holder_socket() -> socket.socket:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.bind(("10.0.0.1", 0))
                return s

            sock = in_netns(ns, holder_socket)  # stays in the host's namespace
            q = SendQueue(TransportConfig(port=0, send_quantum=64), Counters())
            q.sock = sock
            in_netns(ns, lambda: q.use_gso(sock, "10.0.0.1"))  # it reads the host's interfaces, as an agent there
            recs = np.zeros(count, dtype=wire.DATA_PACKET_DTYPE)
            recs["hdr"]["frag_index"] = np.arange(count)
            q.add_job(SendJob(recs, recs.view(np.uint8).data, (_PEER, wire.KVPOOL_UDP_PORT), 0, count, None, 1,
                              None, 0))
            while q.pending():
                q.send()
            sock.close()
            lens: list[int] = []
            deadline = time.monotonic() + 2.0
            while len(lens) < count and time.monotonic() < deadline:
                got = recv_frame(tap)
                if got is None:
                    time.sleep(0.01)
                elif len(got[0]) > 34 and got[0][23] == socket.IPPROTO_UDP:
                    lens.append(len(got[0]))
        finally:
            tap.close()
    return q, lens


def test_with_host_offloads_off_segmented_sends_reach_the_switch_as_ordinary_frames() -> None:
    q, lens = _frames_after_sending(offloads_off=True, count=100)
    frame = wire.ETHERNET_HEADER_LEN + wire.IPV4_HEADER_LEN + wire.UDP_HEADER_LEN + wire.DATA_DATAGRAM_LEN
    assert q.gso_segments > 1 and q.gso_fallback == ""
    assert lens == [frame] * 100
    assert q._c.send_calls < 10 and q._c.datagrams_sent == 100


def test_with_host_offloads_on_the_holder_sends_one_datagram_per_call_and_says_why() -> None:
    q, lens = _frames_after_sending(offloads_off=False, count=20)
    frame = wire.ETHERNET_HEADER_LEN + wire.IPV4_HEADER_LEN + wire.UDP_HEADER_LEN + wire.DATA_DATAGRAM_LEN
    assert q.gso_segments == 1 and "tx-udp-segmentation on" in q.gso_fallback
    assert lens == [frame] * 20 and q._c.send_calls == 20
