"""The holder's requester gate: verified sources only, answers bounded to the window, a budget per source."""

from __future__ import annotations

import re

import pytest

from hostagent.gate import RequesterGate, parse_allow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _gate(clock: Clock, **kw: object) -> RequesterGate:
    args: dict[str, object] = {"window_fragments": 8, "rate_fragments_per_s": 10.0, "burst_fragments": 16,
                               "clock": clock}
    args.update(kw)
    return RequesterGate(**args)  # type: ignore[arg-type]


def test_only_verified_sources_are_answered() -> None:
    g = _gate(Clock(), allow=["10.0.1.0/24", "10.0.2.7"])
    assert g.admit("10.0.1.9", 4) == 4 and g.admit("10.0.2.7", 4) == 4
    assert g.admit("10.0.2.8", 4) is None and g.admit("192.0.2.1", 1) is None  # forged or unknown: nothing
    assert g.admit("not an address", 1) is None
    assert g.admit("127.0.0.1", 4) == 4 and g.admit("::1", 4) == 4  # loopback cannot come from elsewhere
    g.set_registered(["10.9.9.9", "h-by-name"])  # the directory's nodes (names are skipped)
    assert g.admit("10.9.9.9", 1) == 1
    g.set_registered([])  # deregistered: refused again
    assert g.admit("10.9.9.9", 1) is None
    assert g.refused_unverified == 4 and g.missed.is_set()
    assert not _gate(Clock(), trust_loopback=False).verified("127.0.0.1")


def test_answers_are_bounded_to_the_window_and_the_budget() -> None:
    clock = Clock()
    g = _gate(clock, allow=["10.0.0.1"])
    assert g.admit("10.0.0.1", 4096) == 8  # a range GET for more than the window: the window
    assert g.admit("10.0.0.1", 8) == 8  # the burst (16) is spent
    assert g.admit("10.0.0.1", 8) == 0  # over the budget: BUSY
    clock.now += 0.5  # 5 fragments' worth of budget back
    assert g.admit("10.0.0.1", 8) == 5
    assert g.admit("127.0.0.1", 4096) == 8  # loopback: the window, no budget
    st = g.stats()
    assert (st["refused_budget"], st["clamped"]) == (1, 3)


def test_a_spent_budget_says_when_it_holds_the_get_again() -> None:
    clock = Clock()
    g = _gate(clock, allow=["10.0.0.1"])
    assert g.refill_s("10.0.0.1", 8) == 0.0  # a new source starts with its whole burst
    assert g.admit("10.0.0.1", 16) == 8 and g.admit("10.0.0.1", 8) == 8 and g.admit("10.0.0.1", 4) == 0
    assert g.refill_s("10.0.0.1", 4) == pytest.approx(0.4)  # 4 fragments at 10/s
    assert g.refill_s("10.0.0.1", 4096) == pytest.approx(0.8)  # never more than one window's worth
    clock.now += 0.4
    assert g.refill_s("10.0.0.1", 4) == pytest.approx(0.0) and g.admit("10.0.0.1", 4) == 4
    assert g.refill_s("not an address", 4) == 0.0


def test_refused_gets_of_one_source_come_back_one_after_another() -> None:
    # Told only when the budget holds one GET, every refused GET of a source came back at that
    # instant; one got it, the rest were refused again 1-3 ms later (a replayed trace at 3x the
    # holder link: 843,000 BUSY for 156,000 DATA). Each refusal books its refill behind the last.
    clock = Clock()
    g = _gate(clock, allow=["10.0.0.1", "10.0.0.2"])
    assert g.admit("10.0.0.1", 8) == 8 and g.admit("10.0.0.1", 8) == 8  # the burst is spent
    hints = [g.book_retry_s("10.0.0.1", 4) for _ in range(3)]
    assert hints == pytest.approx([0.4, 0.8, 1.2])  # 4 fragments at 10/s each, in turn
    assert g.book_retry_s("10.0.0.2", 4) == 0.0  # another source has its own budget and turns
    for hint in hints:  # each comes back at its turn and finds its fragments
        clock.now = 100.0 + hint
        assert g.admit("10.0.0.1", 4) == 4
    clock.now += 0.05  # a GET refused after the booked ones are due: behind none of them
    assert g.admit("10.0.0.1", 4) == 0 and g.book_retry_s("10.0.0.1", 4) == pytest.approx(0.35)
    assert g.book_retry_s("not an address", 4) == 0.0


def test_a_grant_given_back_costs_the_budget_nothing() -> None:
    clock = Clock()
    g = _gate(clock, allow=["10.0.0.1"])
    assert g.admit("10.0.0.1", 8) == 8 and g.admit("10.0.0.1", 8) == 8
    clock.now += 0.35  # 3.5 fragments back
    assert g.admit("10.0.0.1", 4) == 3
    g.give_back("10.0.0.1", 1)  # the holder sent 2 (a range refused 1 fragment reads as a conversion)
    assert g.refill_s("10.0.0.1", 2) == pytest.approx(0.05)  # 1.5 left, not 0.5
    g.give_back("10.0.0.1", 100)
    assert g.admit("10.0.0.1", 8) == 8 and g.admit("10.0.0.1", 8) == 8  # never above one burst
    assert g.admit("10.0.0.1", 1) == 0
    g.give_back("not an address", 1)


def test_bad_settings_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match=re.escape("'10.0.0.300' is not an IP address or CIDR prefix")):
        parse_allow(["10.0.0.300"])
    with pytest.raises(ValueError, match="window_fragments"):
        RequesterGate(window_fragments=0, rate_fragments_per_s=1, burst_fragments=1)
