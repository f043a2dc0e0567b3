"""experiment.backlog: a software switch's port backlog read from /proc, summarized, and warned about."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from bmv2_topologies.experiment.backlog import (
    Backlog,
    BacklogSampler,
    backlog_warnings,
    packet_backlog,
    socket_inodes,
    summarize,
)

HEADER = "sk               RefCnt Type Proto  Iface R Rmem   User   Inode\n"


def _table(rows: list[tuple[int, str]]) -> str:
    """``/proc/net/packet`` text: (Rmem, inode) per socket."""
    return HEADER + "".join(f"ffff8881 3 3 0003 {i} 1 {rmem} 0 {inode}\n" for i, (rmem, inode) in enumerate(rows))


def test_socket_inodes_are_this_processs_open_sockets() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        inode = str(os.fstat(s.fileno()).st_ino)
        assert inode in socket_inodes(os.getpid())
    assert inode not in socket_inodes(os.getpid())
    assert socket_inodes(2**22 + 12345) == set()  # no such process: nothing, no error


def test_only_the_switchs_own_sockets_count() -> None:
    # A capture (tcpdump) in the same namespace has packet sockets too: not the switch's backlog.
    table = _table([(1_000_000, "11"), (250_000, "12"), (9_999_999, "99")])
    assert packet_backlog(table, {"11", "12"}) == 1_250_000
    assert packet_backlog(table, {"42"}) is None
    assert packet_backlog(HEADER, {"11"}) is None


def test_the_sampler_reads_each_switch_over_the_run(tmp_path: Path) -> None:
    proc = tmp_path
    (proc / "7" / "fd").mkdir(parents=True)
    (proc / "7" / "net").mkdir()
    for fd, inode in (("3", "11"), ("4", "12")):
        os.symlink(f"socket:[{inode}]", proc / "7" / "fd" / fd)
    os.symlink("/dev/null", proc / "7" / "fd" / "0")
    sampler = BacklogSampler({"s1": 7, "gone": 8}, proc=proc)
    for queued in (0, 4_000_000, 2_000_000, 30_000_000, 0):
        (proc / "7" / "net" / "packet").write_text(_table([(queued, "11"), (0, "12"), (5_000_000, "77")]))
        sampler.sample()
    got = sampler.stop()
    assert got["s1"] == Backlog(p50_bytes=2_000_000, max_bytes=30_000_000, samples=5)
    assert got["gone"] == Backlog(0, 0, 0)


def test_summary_is_the_lower_median_and_the_most() -> None:
    assert summarize([5, 1, 9, 3]) == Backlog(3, 9, 4)
    assert summarize([]) == Backlog(0, 0, 0)


def test_a_mode_that_ran_at_the_switchs_cpu_is_named_with_what_the_others_had() -> None:
    by_mode = {"plain": {"s1": Backlog(0, 40_000, 250)},
               "multicast": {"s1": Backlog(16_000_000, 27_000_000, 250)},
               "pool": {"s1": Backlog(900_000, 8_000_000, 250)}}
    lines = backlog_warnings(by_mode)
    assert len(lines) == 1
    assert lines[0].startswith("in multicast, switch s1 had 16.0 MB waiting at its ports at the median (27.0 MB")
    assert "plain 0.0, pool 0.9" in lines[0]
    assert backlog_warnings(by_mode, threshold=500_000)[1].startswith("in pool, switch s1 had 0.9 MB")
