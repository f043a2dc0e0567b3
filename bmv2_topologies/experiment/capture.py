"""What crossed the holder's link: port byte counters and a tcpdump capture of kvpool headers.

The capture is read with scapy's ``RawPcapReader`` (streaming: one record at a time, never
the whole file in memory); each record's IPv4/UDP headers are read in place and its
kvpool header is decoded by ``kvpool.wire``, the one owner of the format. No per-packet
scapy dissection: a demo capture holds tens of thousands of frames.
"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from scapy.utils import RawPcapReader

from bmv2_topologies.network import interface_name
from kvpool import wire
from kvpool.topology import Topology

INCAST_WINDOW_S = 0.1
"""Seconds within which GETs for the same fragment count as concurrent (the pending timeout)."""

_ETH_IPV4 = b"\x08\x00"
_UDP = 17


def link_bytes(*intfs: str) -> int:
    """Bytes the interfaces have received and sent so far (both directions, every protocol), summed."""
    total = 0
    for intf in intfs:
        base = Path("/sys/class/net") / intf / "statistics"
        total += int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())
    return total


def holder_links(topo: Topology) -> dict[str, str]:
    """Holder host -> the switch interface facing it: its counters are that holder link's bytes."""
    out: dict[str, str] = {}
    for h in topo.holders():
        link = topo.host_link(h.name)
        end = link.b if link.a.node == h.name else link.a
        assert end.port is not None  # validated: a host's link ends at a switch port
        out[h.name] = interface_name(end.node, end.port)
    return out


def fabric_links(topo: Topology) -> list[str]:
    """One switch interface per link between two switches (each link counted once)."""
    return [interface_name(link.a.node, link.a.port) for link in topo.links
            if link.a.port is not None and link.b.port is not None]


class LinkCapture:
    """tcpdump on one link (headers only, every packet flushed) while an experiment runs."""

    def __init__(self, path: Path, intf: str) -> None:
        self.path = path
        self.intf = intf
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LinkCapture:
        if shutil.which("tcpdump"):
            # --immediate-mode: otherwise libpcap hands packets over in blocks, up to a second
            # late, and a mode read right after it ends would miss its last packets. 96 bytes
            # per frame hold every header up to and including kvpool's.
            self.proc = subprocess.Popen(["tcpdump", "--immediate-mode", "-i", self.intf, "-s", "96", "-U", "-w",
                                          str(self.path)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # tcpdump says "listening on ..." once it captures; nothing before that is seen.
            assert self.proc.stderr is not None
            line = self.proc.stderr.readline()
            if b"listening on" not in line:
                raise RuntimeError(f"tcpdump on {self.intf} did not start: {line.decode(errors='replace').strip()}")
            threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # never block tcpdump
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            time.sleep(0.2)
            self.proc.terminate()
            self.proc.wait(timeout=10)


@dataclass(frozen=True, slots=True)
class KvpoolPacket:
    """One captured kvpool datagram: when, between which IPv4 addresses, and its header."""

    time: float
    src: str
    dst: str
    header: wire.Header


def kvpool_packets(pcap: Path, window: tuple[float, float] = (0.0, float("inf"))) -> Iterator[KvpoolPacket]:
    """The kvpool datagrams (UDP to or from ``KVPOOL_UDP_PORT``) captured within ``window`` (wall clock)."""
    with RawPcapReader(str(pcap)) as reader:
        # A nanosecond capture stores nanoseconds in the microseconds field.
        unit = 1e-9 if getattr(reader, "nano", False) else 1e-6
        for frame, meta in reader:
            ts = meta.sec + meta.usec * unit
            if not window[0] <= ts <= window[1] or frame[12:14] != _ETH_IPV4 or frame[23] != _UDP:
                continue
            ip_len = (frame[14] & 0x0F) * 4
            udp = 14 + ip_len
            kv = udp + 8
            if len(frame) < kv + wire.HEADER_LEN:
                continue
            sport, dport = struct.unpack_from("!HH", frame, udp)
            if wire.KVPOOL_UDP_PORT not in (sport, dport):
                continue
            yield KvpoolPacket(ts, socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34]),
                               wire.unpack_header(frame[kv:kv + wire.HEADER_LEN]))


def peak_gets(pcap: Path, holder_ip: str, window: tuple[float, float]) -> int:
    """Incast degree: most GETs for one fragment that reached the holder within one pending window.

    Without coalescing every requester's GET for a hot fragment reaches the holder (N of
    them); with it, the switch lets one through per outstanding fragment.
    """
    first_seen: dict[tuple[int, int], tuple[float, int]] = {}
    peak = 0
    for p in kvpool_packets(pcap, window):
        if p.dst != holder_ip or p.header.opcode != wire.Opcode.GET:
            continue
        fragment = (p.header.chunk_key, p.header.frag_index)
        start, count = first_seen.get(fragment, (p.time, 0))
        if p.time - start > INCAST_WINDOW_S:
            start, count = p.time, 0
        first_seen[fragment] = (start, count + 1)
        peak = max(peak, count + 1)
    return peak


@dataclass
class HolderTraffic:
    """kvpool packets on the holder link: GETs it received, DATA it sent (per fragment and destination)."""

    gets_in: int = 0
    data_out: dict[tuple[int, int, str], int] = field(default_factory=dict)


def holder_traffic(pcap: Path, holder_ip: str, window: tuple[float, float]) -> HolderTraffic:
    """Count the GETs that reached the holder and the DATA it sent within ``window`` (wall clock)."""
    out = HolderTraffic()
    for p in kvpool_packets(pcap, window):
        if p.header.opcode == wire.Opcode.GET and p.dst == holder_ip:
            out.gets_in += 1
        elif p.header.opcode == wire.Opcode.DATA and p.src == holder_ip:
            k = (p.header.chunk_key, p.header.frag_index, p.dst)
            out.data_out[k] = out.data_out.get(k, 0) + 1
    return out
