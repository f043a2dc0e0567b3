"""The model's building blocks below the pipeline: BMv2 hashes, checksums, port I/O."""

from __future__ import annotations

import logging
import random
import socket
import time

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from switchmodel import checksum, hashes
from switchmodel.dataplane import DataPlane, frames_lost
from switchmodel.ports import MemoryPorts, PortIO, PortSpec, check_unique
from switchmodel.vethlab import VethLab, can_build


def test_crc_check_values_match_bmv2_algorithms() -> None:
    # The catalogue check values of the CRC variants BMv2's calculations.cpp implements.
    assert hashes.crc16(b"123456789") == 0xBB3D  # CRC-16/ARC
    assert hashes.crc32(b"123456789") == 0xCBF43926  # CRC-32 (zlib)
    assert hashes.crc_ccitt(b"123456789") == 0x29B1  # CRC-16/CCITT-FALSE
    assert hashes.crc16(b"") == 0


def test_fast_crc16_equals_bmv2_loop() -> None:
    rng = random.Random(7)
    for n in (0, 1, 8, 10, 12, 64):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert hashes.crc16(data) == hashes.crc16_bmv2(data)


def test_identity_and_xor16() -> None:
    assert hashes.identity(bytes.fromhex("0102030405060708ff")) == 0x0102030405060708
    assert hashes.identity(b"\x12\x34") == 0x1234
    assert hashes.xor16(bytes.fromhex("f0f00f0fab")) == 0xF0F0 ^ 0x0F0F ^ 0xAB00


def test_pack_fields_is_msb_first_and_zero_padded() -> None:
    assert hashes.pack_fields([(0x1, 4), (0xABC, 12)]) == bytes.fromhex("1abc")
    assert hashes.pack_fields([(1, 1)]) == b"\x80"
    assert hashes.pack_fields([(0x0102030405060708, 64), (0x0A0B, 16)]) == bytes.fromhex("01020304050607080a0b")
    assert hashes.pack_fields([(0x1FF, 8)]) == b"\xff"  # values are cut to their width


def test_v1model_hash_is_base_plus_modulo_cut_to_width() -> None:
    data = [(0xDEADBEEF, 32)]
    raw = hashes.crc16(bytes.fromhex("deadbeef"))
    assert hashes.v1model_hash("crc16", 0, data, 1024, 32) == raw % 1024
    assert hashes.v1model_hash("crc16", 100, data, 1024, 32) == 100 + raw % 1024
    assert hashes.v1model_hash("crc32", 0, data, 0, 32) == 0  # BMv2 treats max 0 as 1
    assert hashes.v1model_hash("identity", 0, [(0x1234, 16)], 1 << 16, 8) == 0x34
    with pytest.raises(ValueError, match="not modelled"):
        hashes.v1model_hash("toeplitz", 0, data, 16, 16)


def test_ipv4_checksum_matches_scapy_and_csum16() -> None:
    frame = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2", ttl=17, id=99) / UDP() / Raw(b"abc"))
    ip_hdr = frame[14:34]
    assert checksum.ipv4_header_checksum(ip_hdr) == int.from_bytes(ip_hdr[10:12], "big")
    zeroed = ip_hdr[:10] + b"\x00\x00" + ip_hdr[12:]
    assert hashes.csum16(zeroed) == checksum.ipv4_header_checksum(ip_hdr)


def test_complete_l4_checksum_fills_partial_udp_checksum() -> None:
    good = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2) / Raw(b"hello world"))
    partial = bytearray(good)
    partial[40:42] = b"\x12\x34"  # what a CHECKSUM_PARTIAL frame carries: not the real checksum
    assert checksum.complete_l4_checksum(bytes(partial)) == good
    arp_like = bytes(14) + b"xx"
    assert checksum.complete_l4_checksum(arp_like) == arp_like


@pytest.mark.parametrize("text,port,name", [("1@s1-eth1", 1, "s1-eth1"), ("510@veth0", 510, "veth0")])
def test_port_spec_parse(text: str, port: int, name: str) -> None:
    assert PortSpec.parse(text) == PortSpec(port, name)


@pytest.mark.parametrize("text", ["s1-eth1", "x@eth0", "511@eth0", "1@", "1@averyveryverylongname0"])
def test_port_spec_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError, match="interface"):
        PortSpec.parse(text)


def test_check_unique_names_the_duplicate() -> None:
    with pytest.raises(ValueError, match="port 1 given more than once"):
        check_unique([PortSpec(1, "a"), PortSpec(1, "b")])
    with pytest.raises(ValueError, match="interface a given more than once"):
        check_unique([PortSpec(1, "a"), PortSpec(2, "a")])


class _Swap:
    """Sends a frame from port 1 to port 2 and back; drops anything from elsewhere."""

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return [(3 - ingress_port, frame)] if ingress_port in (1, 2) else []


class _Broken:
    """A processor with a bug."""

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        raise ZeroDivisionError(frame[0] / 0)


def test_port_io_survives_a_failing_processor() -> None:
    io = PortIO([], _Broken())
    io.handle(1, b"\x01", checksum_not_ready=False)
    io.handle(1, b"\x02", checksum_not_ready=False)
    assert io.stats.process_errors == 2 and io.stats.rx_frames == 2 and io.stats.tx_frames == 0


def test_memory_ports_queue_outputs_per_port() -> None:
    ports = MemoryPorts(_Swap())
    assert ports.inject(1, b"a") == [(2, b"a")]
    ports.inject(2, b"b")
    ports.inject(7, b"c")
    assert ports.pending() == {1: 1, 2: 1}
    assert ports.drain() == [(1, b"b"), (2, b"a")]
    assert ports.pending() == {}


@pytest.mark.root
@pytest.mark.skipif(can_build() is not None, reason=str(can_build()))
def test_port_io_forwards_between_veths_and_completes_checksums() -> None:
    with VethLab(2, host_offloads_off=False) as lab:
        io = PortIO([PortSpec(1, lab.switch_ifs[0]), PortSpec(2, lab.switch_ifs[1])], _Swap())
        with io:
            io.start()
            frame = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                          / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2) / Raw(b"x" * 40))
            lab.send(0, frame)
            deadline = time.monotonic() + 2
            got = None
            while got is None and time.monotonic() < deadline:
                got = lab.recv(1)
                time.sleep(0.005)
            assert got == frame
            assert lab.recv(0) is None  # the switch does not echo back, and our own TX is ignored
            assert io.stats.rx_frames == 1 and io.stats.tx_frames == 1
            assert io.stats.per_port_tx == {2: 1}


class _Count:
    """Counts what it is given; forwards nothing."""

    def __init__(self) -> None:
        self.frames = 0

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        self.frames += 1
        return []


def _drain(io: PortIO) -> None:
    while io.poll(0.05):
        pass


@pytest.mark.root
@pytest.mark.skipif(can_build() is not None, reason=str(can_build()))
def test_port_buffers_hold_a_second_of_a_holder_while_the_loop_is_busy() -> None:
    # A holder at 100 Mbit/s sends ~8,600 full frames a second; the loop, one Python thread
    # on a shared CPU, can be kept from reading for hundreds of ms. With 4 MiB buffers the
    # kernel dropped such DATA (1.5% of a replay's frames), and every GET the switch had
    # absorbed for a lost one waited for its retransmit timeout.
    frame = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                  / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2) / Raw(b"x" * 1408))
    with VethLab(1) as lab:
        counter = _Count()
        with PortIO([PortSpec(1, lab.switch_ifs[0])], counter) as io:
            for _ in range(8600):  # nobody reads meanwhile
                lab.send(0, frame)
            _drain(io)
            assert io.read_kernel_drops() == 0
            assert counter.frames == 8600

            # A buffer that cannot hold them: what the kernel dropped is counted, per port.
            io._socks[1].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)
            for _ in range(2000):
                lab.send(0, frame)
            _drain(io)
            dropped = io.read_kernel_drops()
            assert dropped > 0
            assert counter.frames + dropped == 8600 + 2000
            assert io.stats.per_port_kernel_drops == {1: dropped}


def test_frames_lost_at_the_ports_are_logged_at_exit_and_read_back(caplog: pytest.LogCaptureFixture) -> None:
    # The demo reads a model switch's log after the run and warns when its ports lost frames:
    # the latencies then measure the emulation, not kvpool (a 4 MiB buffer lost 1.5% of a
    # replay's frames and doubled multicast's p50 before anyone looked).
    io = PortIO([], _Count())
    io.stats.tx_errors, io.stats.rx_kernel_drops, io.stats.per_port_kernel_drops = 3, 40, {1: 40}
    with caplog.at_level(logging.INFO, logger="switchmodel.dataplane"):
        DataPlane(None, io).stop()  # type: ignore[arg-type]
    text = caplog.text
    assert "40 dropped by the kernel" in text
    assert frames_lost(text) == 43
    assert frames_lost(text + text) == 86  # a restarted switch appends to its log
    assert frames_lost("kvpool-switch: device 1 serving P4Runtime on 127.0.0.1:50052\n") == 0
