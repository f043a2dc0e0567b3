"""vLLM engines loading a prefix through the switch while it is killed and restarted.

``KvpoolConnector``'s failure case "switch restarted mid-load", in Mininet on the model
switch (``bmv2_topologies/experiment/vllm_restart.py``): two requesters running vLLM with the
connector fetch a 512-token prefix from ``h0`` over a 2 Mbit/s holder link in multicast mode;
once a fifth of one copy has crossed that link and each requester's agent has part of it, the
switch process is SIGKILLed and started again, empty, and the testbed's controller resyncs it.
Every request must complete in bounded time with a full prefill's greedy tokens, each having
either loaded the whole prefix (what the dead switch lost was retransmitted) or recomputed what
did not load; never wrong KV. The kill must have landed mid-load (after DATA reached the
requesters, before either had the prefix); a wave after the switch is back loads the whole
prefix again.

Needs root, Mininet and the vLLM venv (``scripts/setup_vllm.sh``, or ``KVPOOL_VLLM_VENV``);
skips with the reason otherwise. Run it under ``flock /tmp/kvpool-netns.lock``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bmv2_topologies.network import mininet_available

REASON = mininet_available()
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]

#: Beyond the connector's fetch timeout (30 s): vLLM's steps on a busy two-core machine.
ANSWERED_WITHIN_S = 120.0


def test_switch_restarted_mid_load_costs_no_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bmv2_topologies.experiment.ttft import TtftError, vllm_python
    from bmv2_topologies.experiment.vllm_restart import run_vllm_switch_restart

    try:
        vllm_python()
    except TtftError as exc:
        pytest.skip(str(exc))
    res = run_vllm_switch_restart(tmp_path, requesters=2, mode="multicast", prefix_tokens=512, holder_mbps=2.0)
    with capsys.disabled():
        print("\n" + res.summary())
    why = res.summary() + _logs(tmp_path)
    assert res.errors == [], why
    waves = {"reference": res.reference, "during": res.during, "after": res.after}
    for name, answers in waves.items():
        assert len(answers) == 2 and all("error" not in a for a in answers), f"{name}: {answers}\n{why}"
    reference = [a["tokens"] for a in res.reference]
    assert all(a["cached_tokens"] == 0 for a in res.reference), why  # a full prefill: nothing loaded

    # The kill landed mid-load: DATA had crossed the holder link and reached every requester's
    # agent, and neither had the whole prefix.
    assert res.killed_at is not None, why
    assert 0 < res.holder_bytes_at_kill < res.prefix_wire_bytes, why
    assert all(0 < n < res.prefix_fragments for n in res.stored_at_kill), why
    assert res.reachable_after_s is not None, "the restarted switch never forwarded again\n" + why

    # Bounded, the same tokens, and each request either loaded everything or recomputed the rest.
    assert res.answered_after_s < ANSWERED_WITHIN_S, why
    for i, a in enumerate(res.during):
        assert a["tokens"] == reference[i], f"h{i + 1}: tokens differ from a full prefill's\n{why}"
        if a["stopped"] is None:
            # Loaded bit-exact (the connector checks every chunk) and the load spanned the kill.
            assert a["cached_tokens"] == res.prefix_tokens, why
            assert a["start"] + a["fetch_ms"] / 1e3 > res.killed_at, why
            assert res.stored_during[i] >= res.prefix_fragments, why
        else:
            assert "recomputed" in a["stopped"] and a["cached_tokens"] < res.prefix_tokens, why

    # The switch is back (resynced by the controller): the prefix loads from kvpool again.
    for i, a in enumerate(res.after):
        assert a["tokens"] == reference[i], why
        assert (a["cached_tokens"], a["stopped"]) == (res.prefix_tokens, None), why


def _logs(out: Path, lines: int = 15) -> str:
    """The tails of the switch's, the requesters' agents' and vLLM hosts' logs: why a load failed."""
    run = out / "run"
    text = []
    for log in [run / "s1.log", *sorted(run.glob("h*.agent.log")), *sorted(run.glob("h*.vllm_host.log"))]:
        if log.exists():
            got = log.read_text(errors="replace").splitlines()[-lines:]
            text.append(f"\n--- {log.name}\n" + "\n".join(got))
    return "".join(text)
