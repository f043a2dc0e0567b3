"""The host's UDP limit for kvpool's DATA datagrams: a blast of them between processes on loopback.

The reference ``scripts/bench_hostagent.py`` holds the agent's fetch goodput against: the
same number of ``DATA_DATAGRAM_LEN``-byte datagrams, with no protocol at all, sent one call
per datagram or with UDP GSO (44 segments per send) and received one call per datagram or
with UDP GRO (coalesced buffers of up to 64 KiB).  ``--flows N`` runs N sender/receiver
pairs at once.  Each receiver counts what arrived until its socket stays quiet for 0.5 s;
the seconds span the first datagram any receiver got to the last.

    python scripts/udp_blast.py --count 200000 --gso --flows 4

prints one JSON line: packets and bytes received (all flows), seconds, MB/s.
Loopback only; every process it starts ends before it returns.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

UDP_SEGMENT = 103  # setsockopt(SOL_UDP, ...): every send of k*L bytes leaves as k datagrams
UDP_GRO = 104  # setsockopt(SOL_UDP, ...) and its cmsg: the segment size of a coalesced buffer
GSO_SEGMENTS = 44
"""Datagrams per segmented send: 44 x 1448 B fit one 64 KiB UDP send."""


def _buffers(s: socket.socket, size: int) -> None:
    """Socket buffers of ``size`` bytes; SO_*BUFFORCE (root) beats the sysctl cap, else the capped size."""
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):
        try:
            s.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, plain, size)


def receive(dlen: int, sock_buf: int, gro: bool) -> None:
    """Print the bound port, count datagrams until the socket is quiet, print what arrived as JSON."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _buffers(s, sock_buf)
    if gro:
        s.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1], flush=True)
    buf = memoryview(bytearray(65536 if gro else dlen))
    cms = socket.CMSG_SPACE(4)
    packets = nbytes = 0
    first = last = 0.0

    def recv() -> int:
        nonlocal packets
        if not gro:
            got = s.recv_into(buf)
            packets += 1
            return got
        got, anc, _flags, _addr = s.recvmsg_into([buf], cms)
        seg = got
        for level, kind, data in anc:
            if level == socket.SOL_UDP and kind == UDP_GRO:
                seg = int.from_bytes(data[:4], sys.byteorder)
        packets += -(-got // seg)  # the datagrams one coalesced buffer holds
        return got

    s.settimeout(30.0)
    try:
        nbytes += recv()
        first = last = time.perf_counter()
        s.settimeout(0.5)  # the blast is over once the socket stays quiet this long
        while True:
            nbytes += recv()
            last = time.perf_counter()
    except TimeoutError:
        pass
    print(json.dumps({"packets": packets, "bytes": nbytes, "first": first, "last": last}), flush=True)


def send(dlen: int, sock_buf: int, port: int, count: int, segs: int) -> None:
    """Send ``count`` datagrams of ``dlen`` bytes to ``port``, ``segs`` per call (GSO when above 1)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _buffers(s, sock_buf)
    if segs > 1:
        s.setsockopt(socket.SOL_UDP, UDP_SEGMENT, dlen)
    ring = 1024
    view = memoryview(bytearray(dlen * ring))
    addr = ("127.0.0.1", port)
    i = 0
    while i < count:
        k = min(segs, count - i, ring - i % ring)
        off = (i % ring) * dlen
        s.sendto(view[off:off + k * dlen], addr)
        i += k


def blast(count: int, sock_buf: int, *, dlen: int, gso: bool = False, flows: int = 1) -> dict[str, float]:
    """``count`` datagrams per flow, ``flows`` pairs at once; packets, bytes and seconds received, all flows."""
    me = [sys.executable, __file__]
    recvs = [subprocess.Popen([*me, "_receive", str(dlen), str(sock_buf), str(int(gso))], stdout=subprocess.PIPE,
                              text=True) for _ in range(flows)]
    try:
        ports = []
        for r in recvs:
            assert r.stdout is not None
            ports.append(int(r.stdout.readline()))
        segs = GSO_SEGMENTS if gso else 1
        senders = [subprocess.Popen([*me, "_send", str(dlen), str(sock_buf), str(port), str(count), str(segs)])
                   for port in ports]
        for snd in senders:
            if snd.wait(300) != 0:
                raise RuntimeError(f"blast sender exited with {snd.returncode}")
        outs = []
        for r in recvs:
            assert r.stdout is not None
            outs.append(json.loads(r.stdout.readline()))
            r.wait(30)
    finally:
        for r in recvs:
            if r.poll() is None:
                r.kill()
                r.wait()
    got = [o for o in outs if o["packets"] > 0]
    span = max(o["last"] for o in got) - min(o["first"] for o in got) if got else 0.0
    return {"packets": sum(o["packets"] for o in outs), "bytes": sum(o["bytes"] for o in outs), "seconds": span}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_receive":  # the child processes blast() starts
        receive(int(argv[1]), int(argv[2]), argv[3] == "1")
        return 0
    if argv and argv[0] == "_send":
        send(*(int(a) for a in argv[1:6]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=100_000, help="datagrams per flow (default 100000)")
    p.add_argument("--size", type=int, default=1448,
                   help="datagram bytes (default 1448, kvpool's DATA_DATAGRAM_LEN)")
    p.add_argument("--sock-buf", type=int, default=64 << 20, help="socket buffer bytes (default 64 MiB)")
    p.add_argument("--gso", action="store_true", help="segmented sends and coalesced receives (GSO + GRO)")
    p.add_argument("--flows", type=int, default=1, help="sender/receiver pairs at once (default 1)")
    args = p.parse_args(argv)
    if args.count < 1 or args.flows < 1 or not 1 <= args.size <= 65507:
        p.error("--count and --flows must be at least 1, --size 1 to 65507")
    got = blast(args.count, args.sock_buf, dlen=args.size, gso=args.gso, flows=args.flows)
    got["mbps"] = got["bytes"] / got["seconds"] / 1e6 if got["seconds"] else 0.0
    print(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
