"""Right bytes or a clear error in Mininet: faults, republishes, moves, restarts, in every mode.

A small run of ``scripts/bench_integrity.py`` (bmv2_topologies/experiment/integrity.py) on
the model target: 10 % loss, 25 % reordering, 5 % duplication and 1 % bit flips on every
switch port, each in plain, multicast and pool mode; a republish of the same and of new
bytes, a re-admission at other base slots and a holder restart.  No chunk may come back
wrong or stale, no tier may keep a damaged chunk, the pool must serve right bytes again
once an impairment stops, and the coherence cases must not stall.  Needs root and Mininet.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bmv2_topologies.network import mininet_available

REASON = mininet_available()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def test_every_fetch_is_exact_or_a_clear_error_and_nothing_stale_or_poisoned_survives(tmp_path: Path) -> None:
    from bmv2_topologies.experiment.integrity import COHERENCE, IMPAIRMENTS, IntegrityConfig, run_integrity

    # 96 KiB chunks: enough frames that 1% corruption flips a dozen or so (at 24 KiB, about 3).
    cfg = IntegrityConfig(requesters=2, target="model", chunks=2, chunk_kib=96, rounds=1, out=tmp_path)
    results, last = run_integrity(cfg, print_lines=False)
    assert last == "wrong_bytes_returned=0 stale_served=0 poisoned_after=0", [r.line() for r in results]
    assert {(r.mode, r.case) for r in results} == {(m, c) for m in ("plain", "multicast", "pool")
                                                   for c in (*IMPAIRMENTS, *COHERENCE)}
    for r in results:
        assert r.corrupt_in_tier == 0, r.line()
        assert r.exact > 0 and r.exact + r.errors == r.fetches, r.line()  # exact, or an error that says why
        if r.case in COHERENCE:
            assert r.errors == 0 and r.stalls == 0, r.line()
        if r.mode == "pool":
            assert r.switch_served > 0, r.line()  # the pool serves (again, once an impairment stopped)
    # Bit flips were really made (and none of them became a wrong byte, above).  Where one lands
    # the receivers' checks catch it, or the kernel drops the frame first: a switch passes the
    # holder's UDP checksum on unchanged in every copy but the ones it rewrites (p4/README.md).
    line = [ln for ln in (tmp_path / "run" / "s1.log").read_text().splitlines() if "impairment counters: " in ln][-1]
    channels = ast.literal_eval(line.split("impairment counters: ", 1)[1])
    assert sum(c["corrupted"] for c in channels.values()) > 0, line
