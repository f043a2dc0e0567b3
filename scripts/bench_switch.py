"""Packets per second through a switch target over veth pairs: forwarded and switch-served.

Every measurement runs on the same two veth pairs (host side in a namespace of its own,
driven by raw AF_PACKET sockets from this process) with a closed loop: at most
``--window`` frames in flight, so the number is what the switch sustains, not what the
kernel drops.  Rows:

* ``echo``: a plain Python AF_PACKET loop that copies frames from port 1 to port 2
  (the floor any Python switch pays for packet I/O);
* ``model forward (UDP)``: plain UDP datagrams routed to the holder (parse, guard, route:
  what every packet pays, the floor of the program on that target);
* ``model forward``: kvpool GETs for a chunk outside the pool, routed to the holder;
* ``model served``: GETs (with reply room) for a filled chunk, answered from switch
  memory (1482-byte replies);
* the same three rows for ``bmv2`` when ``simple_switch_grpc`` is on PATH (a crashed
  switch is reported in the table, not timed);
* ``model pipeline`` (in-process, no I/O): the pipeline's own rate, for reference.

Ratios are against ``echo`` measured in the same run.  The last line is
``served_hits_pps=<number>`` for the chosen ``--target``.  Needs root.

    sudo .venv/bin/python scripts/bench_switch.py --target model --seconds 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controller.p4runtime import P4RuntimeSwitch
from kvpool import contract as n
from kvpool import wire
from kvpool.p4rt.p4info import P4Info
from switchmodel.pipeline import KvpoolPipeline
from switchmodel.ports import PortIO, PortSpec
from switchmodel.state import SwitchState
from switchmodel.targets import Process, bmv2_missing, start_bmv2, start_model
from switchmodel.vethlab import VethLab, can_build

ROOT = Path(__file__).resolve().parents[1]
BUILD = n.build_dir()
P4INFO = BUILD / n.P4INFO_FILE
BMV2_JSON = BUILD / n.BMV2_JSON_FILE
LOG_DIR = ROOT / "logs" / "bench"

CLIENT_MAC, HOLDER_MAC = "02:00:00:00:00:01", "02:00:00:00:00:02"
CLIENT_IP, HOLDER_IP = "10.0.0.1", "10.0.0.2"
KEY_FILLED, KEY_MISSED = 0x5E4FED, 0xF04A4D
CHUNK = bytes((i * 7) % 251 for i in range(4 * wire.FRAG_PAYLOAD))


def _frame(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, sport: int, dport: int, payload: bytes) -> bytes:
    """Ethernet/IPv4/UDP bytes built with scapy (only at set-up time, never per packet)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    return bytes(Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip) / UDP(sport=sport, dport=dport)
                 / Raw(payload))


def get_frame(key: int, frag: int, room: bool = False) -> bytes:
    """A GET from the client to the holder, with reply room when the switch should answer it."""
    return _frame(CLIENT_MAC, HOLDER_MAC, CLIENT_IP, HOLDER_IP, 40000, wire.KVPOOL_UDP_PORT,
                  wire.get_packet(key, frag, room=room))


def udp_frame(i: int) -> bytes:
    """A plain UDP datagram from the client to the holder (not kvpool's port): the program's floor."""
    return _frame(CLIENT_MAC, HOLDER_MAC, CLIENT_IP, HOLDER_IP, 40000 + i, 9, bytes(64))


def data_frame(key: int, frag: int) -> bytes:
    """The holder's DATA for fragment ``frag`` of CHUNK, addressed to the client."""
    return _frame(HOLDER_MAC, CLIENT_MAC, HOLDER_IP, CLIENT_IP, wire.KVPOOL_UDP_PORT, 40000,
                  wire.data_packet(key, frag, CHUNK))


@dataclass
class Row:
    """One measurement."""

    target: str
    test: str
    frames: int
    seconds: float
    lost: int
    note: str = ""

    @property
    def pps(self) -> float:
        """Frames delivered per second."""
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def closed_loop(lab: VethLab, frames: list[bytes], rx_index: int, seconds: float,
                window: int) -> tuple[int, float, int]:
    """Send ``frames`` round robin from host 0, count arrivals at host ``rx_index``.

    At most ``window`` frames are outstanding; a frame not seen within 0.2 s of silence
    is counted lost and its slot reused.  Returns (delivered, seconds, lost).
    """
    tx = lab.host_socks[0]
    inflight = delivered = lost = sent = 0
    start = time.perf_counter()
    deadline = start + seconds
    last_rx = start
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        while inflight < window:
            tx.send(frames[sent % len(frames)])
            sent += 1
            inflight += 1
        got = 0
        while lab.recv(rx_index) is not None:
            got += 1
        if got:
            delivered += got
            inflight = max(0, inflight - got)
            last_rx = now
        elif now - last_rx > 0.2:
            lost += inflight
            inflight = 0
            last_rx = now
    elapsed = time.perf_counter() - start
    # Let stragglers land so the next measurement starts clean.
    time.sleep(0.2)
    while lab.recv(0) is not None or lab.recv(1) is not None:
        pass
    return delivered, elapsed, lost


class _Echo:
    """Port 1 -> port 2 and back, no parsing: the cost of Python packet I/O alone."""

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return [(3 - ingress_port, frame)]


def _echo_main(ifs: list[str]) -> None:
    io = PortIO([PortSpec(i + 1, name) for i, name in enumerate(ifs)], _Echo())
    io.open()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    io.run()


def program(sw: P4RuntimeSwitch) -> None:
    """Routes for client (port 1) and holder (port 2), the holder as writer, KEY_FILLED admitted."""
    for port, mac, ip in ((1, CLIENT_MAC, CLIENT_IP), (2, HOLDER_MAC, HOLDER_IP)):
        sw.insert_entry(n.IPV4_ROUTE, {n.KEY_IPV4_DST: (ip, 32)}, n.IPV4_FORWARD, {"port": port, "dst_mac": mac})
    sw.insert_entry(n.WRITERS, {n.KEY_INGRESS_PORT: 2, n.KEY_WRITER_SRC: HOLDER_IP}, n.ALLOW_WRITER)
    sw.insert_entry(n.POOL_LOOKUP, {n.KEY_CHUNK_KEY: KEY_FILLED}, n.POOL_ENTRY,
                    {"base_slot": 0, "frag_count": wire.fragment_count(len(CHUNK)), "chunk_len": len(CHUNK),
                     "generation": 0, "state": 2, "placement": 1})


def fill(lab: VethLab) -> None:
    """The holder sends every fragment of KEY_FILLED through the switch (fill on pass)."""
    for i in range(wire.fragment_count(len(CHUNK))):
        lab.send(1, data_frame(KEY_FILLED, i))
        deadline = time.monotonic() + 2
        while lab.recv(0) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("fill: the DATA never reached the client")


def bench_switch(kind: str, lab: VethLab, seconds: float, window: int,
                 progress: Callable[[str], None]) -> list[Row]:
    """Forwarded and served rates of one switch target started on ``lab``."""
    starter = start_bmv2 if kind == "bmv2" else start_model
    proc: Process = starter(lab.switch_ifs, LOG_DIR, device_id=1)
    sw = P4RuntimeSwitch(proc.grpc_addr, P4INFO, BMV2_JSON if BMV2_JSON.exists() else None, device_id=1,
                         reconnect=False)
    rows = []
    try:
        sw.connect()
        program(sw)
        fill(lab)
        progress(f"{kind}: forward")
        d, s, lost = closed_loop(lab, [udp_frame(i) for i in range(16)], 1, seconds, window)
        rows.append(Row(kind, "forward (UDP, not kvpool)", d, s, lost))
        missed = [get_frame(KEY_MISSED + i, 0) for i in range(16)]
        d, s, lost = closed_loop(lab, missed, 1, seconds, window)
        rows.append(Row(kind, "forward (GET to holder)", d, s, lost))
        progress(f"{kind}: served")
        hits = [get_frame(KEY_FILLED, i % 4, room=True) for i in range(16)]
        d, s, lost = closed_loop(lab, hits, 0, seconds, window)
        if proc.proc.poll() is not None:
            # BMv2 cannot grow a GET into a full DATA (switchmodel/DIFFERENCES.md).
            rows.append(Row(kind, "served (hit from switch memory)", d, s, lost,
                            f"switch crashed (exit {proc.proc.returncode}), see {proc.log_path.name}"))
            return rows
        rows.append(Row(kind, "served (hit from switch memory)", d, s, lost))
        served = sw.read_counter(n.POOL_STATS, 1)[1].packets
        if served < d:
            raise RuntimeError(f"{kind}: {d} replies seen but the switch counted only {served} hits")
    finally:
        sw.close()
        proc.stop()
    return rows


def bench_echo(lab: VethLab, seconds: float, window: int) -> Row:
    """The plain Python echo on the same veths."""
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_echo_main, args=(lab.switch_ifs,), daemon=True)
    child.start()
    try:
        time.sleep(0.3)
        frames = [get_frame(KEY_MISSED + i, 0) for i in range(16)]
        d, s, lost = closed_loop(lab, frames, 1, seconds, window)
    finally:
        child.terminate()
        child.join(5)
    return Row("python echo", "forward (AF_PACKET copy)", d, s, lost)


def bench_pipeline(seconds: float) -> list[Row]:
    """The model pipeline in-process, no I/O: forwarded and served frames per second."""
    state = SwitchState(device_id=1)
    state.set_pipeline(P4Info.load(P4INFO))
    from kvpool.p4rt.codec import ActionCall, FieldMatch, TableEntry
    for port, mac, ip in ((1, CLIENT_MAC, CLIENT_IP), (2, HOLDER_MAC, HOLDER_IP)):
        state.insert_entry(n.IPV4_ROUTE, TableEntry({n.KEY_IPV4_DST: FieldMatch("lpm", _ip(ip), 32)},
                                                    ActionCall(n.IPV4_FORWARD, {"port": port, "dst_mac": _mac(mac)})))
    state.insert_entry(n.WRITERS, TableEntry({n.KEY_INGRESS_PORT: FieldMatch("exact", 2),
                                              n.KEY_WRITER_SRC: FieldMatch("exact", _ip(HOLDER_IP))},
                                             ActionCall(n.ALLOW_WRITER, {})))
    state.insert_entry(n.POOL_LOOKUP, TableEntry(
        {n.KEY_CHUNK_KEY: FieldMatch("exact", KEY_FILLED)},
        ActionCall(n.POOL_ENTRY, {"base_slot": 0, "frag_count": 4, "chunk_len": len(CHUNK), "generation": 0,
                                  "state": 2, "placement": 1})))
    pipe = KvpoolPipeline(state)
    for i in range(4):
        pipe.process(2, data_frame(KEY_FILLED, i))
    rows = []
    for test, frame, want_port in (("forward (GET to holder)", get_frame(KEY_MISSED, 0), 2),
                                   ("served (hit from switch memory)", get_frame(KEY_FILLED, 1, room=True), 1)):
        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(200):
                out = pipe.process(1, frame)
                count += out[0][0] == want_port
        rows.append(Row("model pipeline (no I/O)", test, count, time.perf_counter() - start, 0))
    return rows


def _ip(text: str) -> int:
    return int.from_bytes(bytes(int(x) for x in text.split(".")), "big")


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 2 on a usage problem (not root, no BMv2 for --target bmv2)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--target", choices=["model", "bmv2"], default="model",
                        help="whose served rate the last line reports (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement (default %(default)s)")
    parser.add_argument("--window", type=int, default=256, help="frames in flight (default %(default)s)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.window <= 0:
        parser.error("--seconds and --window must be positive")
    reason = can_build()
    if reason:
        print(f"bench_switch: {reason}", file=sys.stderr)
        return 2
    if not P4INFO.exists():
        print(f"bench_switch: {P4INFO} is missing (compile p4/ or set KVPOOL_P4_BUILD)", file=sys.stderr)
        return 2
    no_bmv2 = bmv2_missing()
    if args.target == "bmv2" and no_bmv2:
        print(f"bench_switch: --target bmv2: {no_bmv2}", file=sys.stderr)
        return 2

    def progress(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    rows: list[Row] = []
    with VethLab(2) as lab:
        progress("python echo")
        rows.append(bench_echo(lab, args.seconds, args.window))
        rows += bench_switch("model", lab, args.seconds, args.window, progress)
        if no_bmv2 is None:
            rows += bench_switch("bmv2", lab, args.seconds, args.window, progress)
        else:
            progress(f"bmv2 skipped: {no_bmv2}")
    progress("model pipeline in-process")
    rows += bench_pipeline(min(args.seconds, 2.0))

    echo = rows[0].pps
    print(f"{'target':<26}{'test':<34}{'frames':>9}{'lost':>7}{'pps':>11}{'vs echo':>9}  note")
    for r in rows:
        pps = "-" if r.note else f"{r.pps:.0f}"
        ratio = "-" if r.note else f"{r.pps / echo:.2f}"
        print(f"{r.target:<26}{r.test:<34}{r.frames:>9}{r.lost:>7}{pps:>11}{ratio:>9}  {r.note}".rstrip())
    served = next(r for r in rows if r.target == args.target and r.test.startswith("served"))
    dead = [f"{r.target} {r.test}" for r in rows if r.frames == 0 and not r.note]
    if dead:
        print(f"bench_switch: nothing came out of: {', '.join(dead)}", file=sys.stderr)
        return 1
    if served.note:
        print(f"bench_switch: {args.target} served: {served.note}", file=sys.stderr)
        return 1
    print(f"served_hits_pps={served.pps:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
