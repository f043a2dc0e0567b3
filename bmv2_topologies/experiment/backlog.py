"""How far behind a software switch ran: the bytes waiting in its ports' receive buffers, sampled while a mode runs.

A software switch (the model, BMv2) reads its ports through AF_PACKET sockets.  When frames
come faster than its CPU handles them they wait in those sockets' buffers (32 MiB per port
for the model): no frame is lost, but every one, the holders' DATA included, waits its turn.
On a 2-core machine the replayed agent traffic at 3x the holder link kept 15-27 MB waiting at
the model's holder port through a multicast run (about 2 s of the switch's work) and none
in plain: the requesters' in-flight windows sat in that queue while the holder had nothing
to send.  Those latencies measure the emulation, not the protocol, and the demo says so.

The kernel reports each packet socket's queued bytes (``Rmem``) in ``/proc/<pid>/net/packet``
for the whole network namespace; the switch's own sockets are told apart by inode.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BACKLOG_WARN_BYTES = 1 << 20
"""A median backlog above this (about 700 full frames, tens of ms of a model switch's work) is reported."""

SAMPLE_S = 0.1


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[str]:
    """Inodes of the sockets process ``pid`` has open (empty when it is gone or unreadable)."""
    fd_dir = proc / str(pid) / "fd"
    out: set[str] = set()
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def packet_backlog(table: str, inodes: set[str]) -> int | None:
    """Bytes queued in the packet sockets of ``table`` (``/proc/<pid>/net/packet``'s text) whose inode is in ``inodes``.

    Columns: ``sk RefCnt Type Proto Iface R Rmem User Inode``.  None when no socket of
    ``inodes`` is in the table (the process reads no ports through packet sockets).
    """
    total, found = 0, False
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 9 and fields[8] in inodes:
            total += int(fields[6])
            found = True
    return total if found else None


@dataclass(frozen=True)
class Backlog:
    """One switch's receive backlog over a run: median and most, in bytes, and how many samples."""

    p50_bytes: int
    max_bytes: int
    samples: int

    def summary(self) -> dict[str, int]:
        """The JSON object."""
        return {"p50_bytes": self.p50_bytes, "max_bytes": self.max_bytes, "samples": self.samples}


def summarize(samples: list[int]) -> Backlog:
    """Median (nearest rank, lower) and maximum of ``samples``; zeros when there are none."""
    if not samples:
        return Backlog(0, 0, 0)
    xs = sorted(samples)
    return Backlog(xs[(len(xs) - 1) // 2], xs[-1], len(xs))


class BacklogSampler:
    """Samples each named switch process's port backlog every ``SAMPLE_S`` in a thread, from ``start`` to ``stop``."""

    def __init__(self, pids: Mapping[str, int], proc: Path = Path("/proc"), interval: float = SAMPLE_S) -> None:
        """``pids``: switch name -> PID of its process (a process gone mid-run stops being sampled)."""
        self.pids = dict(pids)
        self.proc = proc
        self.interval = interval
        self.samples: dict[str, list[int]] = {name: [] for name in self.pids}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inodes: dict[str, set[str]] = {}

    def sample(self) -> None:
        """Take one sample of every switch (what the thread does each interval)."""
        for name, pid in self.pids.items():
            inodes = self._inodes.get(name) or socket_inodes(pid, self.proc)
            if not inodes:
                continue
            self._inodes[name] = inodes  # ports are opened once, at start
            try:
                table = (self.proc / str(pid) / "net" / "packet").read_text()
            except OSError:
                continue
            queued = packet_backlog(table, inodes)
            if queued is not None:
                self.samples[name].append(queued)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> BacklogSampler:
        """Start sampling."""
        self._thread = threading.Thread(target=self._loop, name="switch-backlog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Backlog]:
        """Stop; each switch's backlog over the samples taken."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        return {name: summarize(xs) for name, xs in self.samples.items()}


def backlog_warnings(by_mode: Mapping[str, Mapping[str, Backlog]],
                     threshold: int = BACKLOG_WARN_BYTES) -> list[str]:
    """One line per mode and switch whose median backlog passed ``threshold``: that mode ran at the switch's CPU.

    ``by_mode``: mode -> switch -> its backlog.  The line names what the other modes had, so a
    reader sees which comparisons the emulation skewed.
    """
    lines = []
    for mode, switches in by_mode.items():
        for name, b in sorted(switches.items()):
            if b.p50_bytes <= threshold:
                continue
            others = ", ".join(f"{m} {s[name].p50_bytes / 1e6:.1f}" for m, s in by_mode.items()
                               if m != mode and name in s)
            lines.append(f"in {mode}, switch {name} had {b.p50_bytes / 1e6:.1f} MB waiting at its ports at the "
                         f"median ({b.max_bytes / 1e6:.1f} MB at most{'; ' + others if others else ''}): its CPU, "
                         f"not the links, set this mode's pace, and the latencies include that queue")
    return lines
