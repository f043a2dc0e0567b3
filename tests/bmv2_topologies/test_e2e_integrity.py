"""Right bytes or a clear error in Mininet: faults, republishes, moves, restarts, in every mode.

A small run of ``scripts/bench_integrity.py`` (bmv2_topologies/experiment/integrity.py) on
the model target: 10 % loss, 25 % reordering, 5 % duplication and 1 % bit flips on every
switch port, each in plain, multicast and pool mode; a republish of the same and of new
bytes, a re-admission at other base slots and a holder restart.  No chunk may come back
wrong or stale, no tier may keep a damaged chunk, the pool must serve right bytes again
once an impairment stops, and the coherence cases must not stall.  Needs root and Mininet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bmv2_topologies.network import mininet_available

REASON = mininet_available()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def test_every_fetch_is_exact_or_a_clear_error_and_nothing_stale_or_poisoned_survives(tmp_path: Path) -> None:
    from bmv2_topologies.experiment.integrity import COHERENCE, IMPAIRMENTS, IntegrityConfig, run_integrity

    cfg = IntegrityConfig(requesters=2, target="model", chunks=2, chunk_kib=24, rounds=1, out=tmp_path)
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
    # Bit flips were really met and caught somewhere (the receivers' checks did their job).
    assert sum(r.caught for r in results if r.case == "corrupt1") > 0
