"""Frames and masks for the data-plane tests (PTF style, one definition for every target).

Hosts sit one per switch port: host ``i`` on port ``i`` with MAC ``02:00:00:00:00:0i``
and IPv4 ``10.0.0.i``.  Frames are built with scapy (readable in a failing test) and
compared as bytes under a ``Mask`` whose don't-care bits are named by layer and field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Packet, Raw

from kvpool import wire
from kvpool.scapy_layer import KvPool

ETH_OFF: Final = 0
IP_OFF: Final = 14
UDP_OFF: Final = 34
KV_OFF: Final = 42
PAYLOAD_OFF: Final = KV_OFF + wire.HEADER_LEN

# (offset, length) in bytes of each field we may mask, by layer.
_FIELDS: Final[dict[str, dict[str, tuple[int, int]]]] = {
    "eth": {"dst": (0, 6), "src": (6, 6), "type": (12, 2)},
    "ip": {"tos": (1, 1), "len": (2, 2), "id": (4, 2), "frag": (6, 2), "ttl": (8, 1), "proto": (9, 1),
           "chksum": (10, 2), "src": (12, 4), "dst": (16, 4)},
    "udp": {"sport": (0, 2), "dport": (2, 2), "len": (4, 2), "chksum": (6, 2)},
    "kv": {f.name: (f.offset, f.bits // 8) for f in wire.FIELDS},
}
_LAYER_OFF: Final = {"eth": ETH_OFF, "ip": IP_OFF, "udp": UDP_OFF, "kv": KV_OFF}


@dataclass(frozen=True, slots=True)
class Host:
    """A test host: the switch port it hangs off, its MAC and IPv4 address."""

    port: int
    mac: str
    ip: str


def host(port: int) -> Host:
    """Host number ``port`` of the test topology."""
    return Host(port, f"02:00:00:00:00:{port:02x}", f"10.0.0.{port}")


def kv_frame(src: Host, dst: Host, hdr: bytes, payload: bytes = b"", *, sport: int = 40000,
             dport: int = wire.KVPOOL_UDP_PORT, ttl: int = 64, ip_id: int = 1, udp_checksum: int | None = None,
             eth_src: str | None = None) -> bytes:
    """An Ethernet/IPv4/UDP/kvpool frame from ``src`` to ``dst`` with header bytes ``hdr``.

    ``udp_checksum=0`` builds a frame without UDP checksum, as the switch sends the
    packets it creates; ``eth_src`` overrides the source MAC.
    """
    pkt: Packet = (Ether(src=eth_src or src.mac, dst=dst.mac) / IP(src=src.ip, dst=dst.ip, ttl=ttl, id=ip_id)
                   / UDP(sport=sport, dport=dport, chksum=udp_checksum) / Raw(hdr + payload))
    return bytes(pkt)


def data_frame(src: Host, dst: Host, key: int, frag: int, chunk: bytes, *, request_id: int = 0,
               generation: int = 0, flags: int = 0, dport: int = 40000) -> bytes:
    """A holder's DATA for fragment ``frag`` of ``chunk`` (source port 7470)."""
    return kv_frame(src, dst, wire.data_packet(key, frag, chunk, request_id, generation, flags),
                    sport=wire.KVPOOL_UDP_PORT, dport=dport)


def get_frame(src: Host, dst: Host, key: int, frag: int = 0, *, count: int = 1, request_id: int = 0,
              generation: int = 0, flags: int = 0, sport: int = 40000, ip_id: int = 1, room: bool = False,
              ttl: int = 64, udp_checksum: int | None = None) -> bytes:
    """A GET from ``src`` to the holder ``dst``.

    ``room`` appends the 1408 bytes of reply room a GET needs to be answered by the
    switch (p4/README.md, "Reply room").
    """
    datagram = wire.get_packet(key, frag, count, request_id, generation, flags, room=room)
    return kv_frame(src, dst, datagram, sport=sport, ip_id=ip_id, ttl=ttl, udp_checksum=udp_checksum)


def stripped_get(src: Host, dst: Host, key: int, frag: int = 0, *, count: int = 1, request_id: int = 0,
                 generation: int = 0, flags: int = 0, sport: int = 40000, ip_id: int = 1) -> bytes:
    """What leaves the switch for a GET with room it did not answer: a plain GET, TTL
    decremented, UDP checksum 0 (the switch does not recompute it)."""
    return get_frame(src, dst, key, frag, count=count, request_id=request_id, generation=generation, flags=flags,
                     sport=sport, ip_id=ip_id, ttl=63, udp_checksum=0)


def served_frame(requester: Host, holder: Host, key: int, frag: int, chunk: bytes, *, request_id: int = 0,
                 generation: int = 0, sport: int = 40000, ip_id: int = 1) -> bytes:
    """What the switch sends back for a GET it answers: the GET turned around into DATA.

    Addresses swapped, TTL 64, IPv4 id kept, UDP from 7470 to the GET's source port with
    checksum 0, the fragment with ``SWITCH_SERVED`` set.
    """
    datagram = wire.data_packet(key, frag, chunk, request_id, generation, int(wire.Flag.SWITCH_SERVED))
    return kv_frame(holder, requester, datagram, sport=wire.KVPOOL_UDP_PORT, dport=sport, ttl=64, ip_id=ip_id,
                    udp_checksum=0)


def udp_frame(src: Host, dst: Host, payload: bytes, *, sport: int = 5000, dport: int = 6000,
              ttl: int = 64) -> bytes:
    """An ordinary (non-kvpool) UDP frame."""
    return bytes(Ether(src=src.mac, dst=dst.mac) / IP(src=src.ip, dst=dst.ip, ttl=ttl, id=1)
                 / UDP(sport=sport, dport=dport) / Raw(payload))


def arp_request(src: Host, target_ip: str) -> bytes:
    """A broadcast ARP who-has from ``src``."""
    return bytes(Ether(src=src.mac, dst="ff:ff:ff:ff:ff:ff")
                 / ARP(op=1, hwsrc=src.mac, psrc=src.ip, pdst=target_ip))


def with_ttl(frame: bytes, ttl: int) -> bytes:
    """``frame`` (Ethernet/IPv4) with its TTL set and IPv4 checksum recomputed."""
    pkt = Ether(frame)
    pkt[IP].ttl = ttl
    del pkt[IP].chksum
    return bytes(pkt)


def describe(frame: bytes) -> str:
    """One line for a failure message."""
    try:
        pkt = Ether(frame)
        if KvPool in pkt:
            kv = pkt[KvPool]
            return (f"{pkt[Ether].src}->{pkt[Ether].dst} {pkt[IP].src}->{pkt[IP].dst} "
                    f"op={kv.opcode} key={kv.chunk_key:#x} frag={kv.frag_index}/{kv.frag_count} "
                    f"flags={int(kv.flags):#x} rid={kv.request_id} gen={kv.generation} len={len(frame)}")
        return str(pkt.summary())
    except Exception:  # a malformed frame still needs a description
        return frame[:64].hex()


class Mask:
    """An expected frame with don't-care bytes, named by layer (eth, ip, udp, kv) and field."""

    def __init__(self, expected: bytes) -> None:
        """Every byte of ``expected`` matters until ``dont_care`` says otherwise."""
        self.expected = expected
        self.care = bytearray(b"\xff" * len(expected))

    def dont_care(self, layer: str, name: str) -> Mask:
        """Ignore one field; returns self so calls chain."""
        off, length = _FIELDS[layer][name]
        start = _LAYER_OFF[layer] + off
        self.care[start:start + length] = bytes(length)
        return self

    def dont_care_bytes(self, start: int, length: int) -> Mask:
        """Ignore a byte range (e.g. a payload the test does not check)."""
        self.care[start:start + length] = bytes(length)
        return self

    def matches(self, frame: bytes) -> bool:
        """True when ``frame`` has the same length and agrees on every byte that matters."""
        if len(frame) != len(self.expected):
            return False
        return all((a ^ b) & m == 0 for a, b, m in zip(frame, self.expected, self.care, strict=True))

    def diff(self, frame: bytes) -> str:
        """Which named fields differ (for assertion messages)."""
        if len(frame) != len(self.expected):
            return f"length {len(frame)} != expected {len(self.expected)}"
        out = []
        for layer, fields in _FIELDS.items():
            base = _LAYER_OFF[layer]
            for name, (off, length) in fields.items():
                s = base + off
                if s + length > len(frame):
                    continue
                got = bytes(a & m for a, m in zip(frame[s:s + length], self.care[s:s + length], strict=True))
                want = bytes(a & m for a, m in zip(self.expected[s:s + length], self.care[s:s + length],
                                                   strict=True))
                if got != want:
                    out.append(f"{layer}.{name}: got {frame[s:s + length].hex()} want "
                               f"{self.expected[s:s + length].hex()}")
        if not out and not self.matches(frame):
            out.append("payload differs")
        return "; ".join(out)
