"""Packet I/O for the reference switch: Linux interfaces (AF_PACKET) or memory.

``PortIO`` is the model's equivalent of simple_switch's ``-i 1@s1-eth1``: one raw
AF_PACKET socket bound to each interface, a loop that reads a frame, runs it through
the pipeline (anything with ``process(ingress_port, frame)``) and writes every output
frame to the interface of its egress port.  ``MemoryPorts`` does the same with queues,
for in-process tests and benchmarks that need no root.

Checksum offload: a Linux sender on a veth with TX offload on leaves the UDP/TCP
checksum to hardware.  The kernel flags such a frame ``TP_STATUS_CSUMNOTREADY`` in
the AF_PACKET auxdata; ``PortIO`` completes the checksum before the pipeline sees the
frame, so receivers behind the model never drop it silently.  ``disable_offloads``
turns the offloads off altogether (as p4lang/tutorials' P4Host does), which BMv2
needs and which the CLI does for the model's own interfaces by default.

Impairment: given an ``Impairer`` (``switchmodel.impair``), ``PortIO`` passes every
received frame through its ``in`` channel before the pipeline and every frame it sends
through its ``out`` channel, and releases held (reordered) frames when they are due; an
``ImpairFile`` changes the specs at run time.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import selectors
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from kvpool.sockets import set_buffers
from switchmodel.checksum import complete_l4_checksum
from switchmodel.impair import Impairer, ImpairFile

log = logging.getLogger(__name__)

ETH_P_ALL: Final = 0x0003
SOL_PACKET: Final = 263
PACKET_AUXDATA: Final = 8
PACKET_IGNORE_OUTGOING: Final = 23
PACKET_OUTGOING: Final = 4
PACKET_STATISTICS: Final = 6
_TPACKET_STATS: Final = struct.Struct("=II")  # struct tpacket_stats: tp_packets, tp_drops
TP_STATUS_CSUMNOTREADY: Final = 1 << 3
_AUXDATA: Final = struct.Struct("=IIIHHHH")
_MAX_FRAME: Final = 65536
_CMSG_SPACE: Final = socket.CMSG_SPACE(_AUXDATA.size)
_SOCKET_BUFFER: Final = 32 << 20
"""Per port and direction. A frame costs its skb's truesize (a few KiB on a veth), and the
loop, one Python thread on a shared CPU, can be kept from reading for a few hundred ms: a
holder at 100 Mbit/s overflowed 4 MiB while requesters' single GETs kept the loop busy
(the DATA lost, every GET the switch had absorbed for it waited for its retransmit)."""
_DRAIN_BATCH: Final = 64
"""Frames read from one socket per wake-up: amortises the select call under load."""

MAX_PORT: Final = 510
"""Largest usable port number; 511 is v1model's drop port on BMv2."""


class FrameProcessor(Protocol):
    """What the port loop drives: the pipeline (or anything with the same call)."""

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Run one frame that arrived on ``ingress_port``; return ``(egress_port, frame)`` pairs."""
        ...


class PortError(RuntimeError):
    """An interface cannot be opened or configured; the message says which and why."""


@dataclass(frozen=True, slots=True)
class PortSpec:
    """A switch port number bound to a Linux interface name."""

    port: int
    ifname: str

    @classmethod
    def parse(cls, text: str) -> PortSpec:
        """Parse ``PORT@IFNAME`` (simple_switch's ``-i`` syntax), e.g. ``1@s1-eth1``."""
        num, sep, ifname = text.partition("@")
        if not sep or not num.strip().isdigit() or not ifname.strip():
            raise ValueError(f"interface {text!r}: expected PORT@IFNAME, e.g. 1@s1-eth1")
        port = int(num)
        if not 0 <= port <= MAX_PORT:
            raise ValueError(f"interface {text!r}: port must be 0..{MAX_PORT} (511 is the drop port)")
        name = ifname.strip()
        if len(name) >= 16 or "/" in name or " " in name:
            raise ValueError(f"interface {text!r}: {name!r} is not a valid Linux interface name")
        return cls(port, name)


def check_unique(specs: Sequence[PortSpec]) -> None:
    """Raise ``ValueError`` if a port number or an interface appears twice."""
    ports = [str(s.port) for s in specs]
    names = [s.ifname for s in specs]
    for what, values in (("port", ports), ("interface", names)):
        dup = sorted({v for v in values if values.count(v) > 1})
        if dup:
            raise ValueError(f"{what} {dup[0]} given more than once")


def disable_offloads(ifname: str) -> None:
    """Turn off checksum and segmentation offloads on ``ifname`` (``ethtool --offload``)."""
    ethtool = shutil.which("ethtool") or "/usr/sbin/ethtool"
    if not os.path.exists(ethtool):
        raise PortError("ethtool not found: install it (apt-get install ethtool) or pass --keep-offloads")
    proc = subprocess.run(
        [ethtool, "--offload", ifname, "rx", "off", "tx", "off", "sg", "off", "tso", "off", "gso", "off"],
        capture_output=True, text=True, check=False,
    )
    # ethtool exits non-zero when a feature is fixed for the device; the ones we need
    # (rx/tx checksumming) are changeable on veths, so only "no such device" is fatal.
    if proc.returncode != 0 and "No such device" in (proc.stderr + proc.stdout):
        raise PortError(f"ethtool --offload {ifname}: no such device")


@dataclass
class PortStats:
    """Counters of the port loop (the pipeline keeps its own drop counters)."""

    rx_frames: int = 0
    tx_frames: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    checksums_completed: int = 0
    unknown_egress: int = 0
    tx_errors: int = 0
    process_errors: int = 0
    #: frames the kernel dropped because a port's socket buffer was full: the loop fell behind
    rx_kernel_drops: int = 0
    per_port_kernel_drops: dict[int, int] = field(default_factory=dict)
    per_port_rx: dict[int, int] = field(default_factory=dict)
    per_port_tx: dict[int, int] = field(default_factory=dict)


def open_raw_socket(ifname: str) -> socket.socket:
    """An AF_PACKET raw socket bound to ``ifname``: all protocols, auxdata on, own TX ignored."""
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except PermissionError as exc:
        raise PortError("raw sockets need root (or CAP_NET_RAW)") from exc
    try:
        set_buffers(sock, _SOCKET_BUFFER)
        sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
        # Kernels before 4.20 lack this option; recv_frame then skips outgoing frames by pkttype.
        with contextlib.suppress(OSError):
            sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.bind((ifname, 0))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENODEV:
            raise PortError(f"interface {ifname}: no such device") from exc
        raise PortError(f"interface {ifname}: {exc.strerror}") from exc
    sock.setblocking(False)
    return sock


def recv_frame(sock: socket.socket) -> tuple[bytes, bool] | None:
    """Read one received frame: ``(frame, checksum_not_ready)``, or ``None`` when none is waiting.

    Frames this host sent itself (pkttype OUTGOING) are skipped.
    """
    while True:
        try:
            data, ancdata, _flags, addr = sock.recvmsg(_MAX_FRAME, _CMSG_SPACE)
        except BlockingIOError:
            return None
        except InterruptedError:
            continue
        if len(addr) > 2 and addr[2] == PACKET_OUTGOING:
            continue
        not_ready = False
        for level, kind, blob in ancdata:
            if level == SOL_PACKET and kind == PACKET_AUXDATA and len(blob) >= _AUXDATA.size:
                not_ready = bool(_AUXDATA.unpack_from(blob)[0] & TP_STATUS_CSUMNOTREADY)
        return data, not_ready


class PortIO:
    """Runs a frame processor between Linux interfaces, one AF_PACKET socket per port."""

    def __init__(self, specs: Sequence[PortSpec], processor: FrameProcessor,
                 *, lock: threading.Lock | None = None, impairer: Impairer | None = None,
                 impair_file: ImpairFile | None = None) -> None:
        """Bind nothing yet; ``open`` creates the sockets.  ``lock`` serialises ``process`` calls.

        ``impairer`` impairs frames in and out of the ports; ``impair_file`` (which needs
        an ``impairer``, one is made if missing) changes its specs while running.
        """
        check_unique(specs)
        self.specs = tuple(specs)
        self.processor = processor
        self.stats = PortStats()
        self.impair_file = impair_file
        self.impairer = impairer if impairer is not None or impair_file is None else Impairer(impair_file.fallback)
        self._lock = lock or threading.Lock()
        self._socks: dict[int, socket.socket] = {}
        self._selector: selectors.BaseSelector | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Open and bind one socket per interface; raises ``PortError`` naming the bad one."""
        selector = selectors.DefaultSelector()
        try:
            for spec in self.specs:
                sock = open_raw_socket(spec.ifname)
                self._socks[spec.port] = sock
                selector.register(sock, selectors.EVENT_READ, spec.port)
        except BaseException:
            selector.close()
            self.close()
            raise
        self._selector = selector

    def read_kernel_drops(self) -> int:
        """Add the frames the kernel dropped since the last read (socket buffers full) to ``stats``."""
        for port, sock in self._socks.items():
            with contextlib.suppress(OSError):
                raw = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size)
                dropped = _TPACKET_STATS.unpack(raw)[1]  # the kernel resets its counters on read
                if dropped:
                    self.stats.rx_kernel_drops += dropped
                    self.stats.per_port_kernel_drops[port] = self.stats.per_port_kernel_drops.get(port, 0) + dropped
        return self.stats.rx_kernel_drops

    def close(self) -> None:
        """Stop the loop (if running) and close every socket."""
        self.stop()
        self.read_kernel_drops()
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def __enter__(self) -> PortIO:
        """Open the ports."""
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the ports."""
        self.close()

    def send(self, port: int, frame: bytes) -> bool:
        """Write ``frame`` out of ``port`` (through the impairment, if any); False if it could not leave.

        A frame the impairment drops or holds back counts as sent.
        """
        if self.impairer is not None and self.impairer.active:
            ok = True
            for copy in self.impairer.egress(port, frame, time.monotonic()):
                ok = self._send_now(port, copy) and ok
            return ok
        return self._send_now(port, frame)

    def _send_now(self, port: int, frame: bytes) -> bool:
        """Write ``frame`` out of ``port``; False (and counted) if the port is unknown or the write fails."""
        sock = self._socks.get(port)
        if sock is None:
            self.stats.unknown_egress += 1
            return False
        try:
            sock.send(frame)
        except BlockingIOError:
            # Socket buffer full: a real port would tail-drop too.
            self.stats.tx_errors += 1
            return False
        except OSError:
            self.stats.tx_errors += 1
            return False
        self.stats.tx_frames += 1
        self.stats.tx_bytes += len(frame)
        self.stats.per_port_tx[port] = self.stats.per_port_tx.get(port, 0) + 1
        return True

    def handle(self, port: int, frame: bytes, checksum_not_ready: bool) -> None:
        """Run one received frame through the processor and send what comes out."""
        self.stats.rx_frames += 1
        self.stats.rx_bytes += len(frame)
        self.stats.per_port_rx[port] = self.stats.per_port_rx.get(port, 0) + 1
        if checksum_not_ready:
            frame = complete_l4_checksum(frame)
            self.stats.checksums_completed += 1
        if self.impairer is not None and self.impairer.active:
            for copy in self.impairer.ingress(port, frame, time.monotonic()):
                self._process(port, copy)
            return
        self._process(port, frame)

    def _process(self, port: int, frame: bytes) -> None:
        """Run one frame through the processor and send what comes out."""
        try:
            with self._lock:
                outputs = self.processor.process(port, frame)
        except Exception:
            # A bug must cost one frame, not the port loop (and with it the whole switch).
            self.stats.process_errors += 1
            if self.stats.process_errors <= 10:
                log.exception("frame from port %d dropped: the processor failed", port)
            return
        for egress, out in outputs:
            self.send(egress, out)

    def poll(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for frames and handle what arrived; returns how many."""
        if self._selector is None:
            raise PortError("ports are not open")
        imp = self.impairer
        if imp is not None:
            if self.impair_file is not None:
                specs = self.impair_file.poll(time.monotonic())
                if specs is not None:
                    imp.configure(specs)
                timeout = min(timeout, ImpairFile.CHECK_INTERVAL)
            due = imp.next_due()
            if due is not None:
                timeout = max(0.0, min(timeout, due - time.monotonic()))
        handled = 0
        for key, _mask in self._selector.select(timeout):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            for _ in range(_DRAIN_BATCH):
                got = recv_frame(sock)
                if got is None:
                    break
                self.handle(int(key.data), got[0], got[1])
                handled += 1
        if imp is not None and imp.next_due() is not None:
            self._release_held(imp)
        return handled

    def _release_held(self, imp: Impairer) -> None:
        """Pass on the frames the impairment held back whose time has come."""
        for direction, port, frame in imp.due(time.monotonic()):
            if direction == "in":
                self._process(port, frame)
            else:
                self._send_now(port, frame)

    def run(self, poll_interval: float = 0.2) -> None:
        """Loop until ``stop`` is called."""
        while not self._stop.is_set():
            self.poll(poll_interval)

    def start(self) -> None:
        """Run the loop in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="kvpool-ports", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop thread to finish and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class MemoryPorts:
    """In-memory ports: ``inject`` runs a frame through the processor, outputs queue per port."""

    def __init__(self, processor: FrameProcessor, *, lock: threading.Lock | None = None) -> None:
        """Queues start empty; ``lock`` serialises ``process`` against control-plane writes."""
        self.processor = processor
        self._lock = lock or threading.Lock()
        self.queues: dict[int, collections.deque[bytes]] = collections.defaultdict(collections.deque)

    def inject(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Process ``frame`` as if received on ``port``; outputs are queued and also returned."""
        with self._lock:
            outputs = self.processor.process(port, frame)
        for egress, out in outputs:
            self.queues[egress].append(out)
        return outputs

    def pending(self) -> dict[int, int]:
        """Frames waiting per port (ports with none are left out)."""
        return {p: len(q) for p, q in self.queues.items() if q}

    def drain(self, ports: Iterable[int] | None = None) -> list[tuple[int, bytes]]:
        """Take every queued frame (of ``ports``, default all) in port order."""
        out: list[tuple[int, bytes]] = []
        for port in sorted(self.queues if ports is None else ports):
            queue = self.queues.get(port)
            while queue:
                out.append((port, queue.popleft()))
        return out
