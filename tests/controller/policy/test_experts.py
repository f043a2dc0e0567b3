"""Expert options (position tilt, leaves first, S3-FIFO) and the leader race's hand-over costs."""

from __future__ import annotations

import pytest

from controller.policy import Admit, Evict, EvictAction, Expert, PolicyConfig, PolicyEngine
from controller.policy.engine import DEFAULT_EXPERTS

SLOT = 1000
CHUNK = 3 * SLOT


def _engine(chunks: int, *experts: Expert, **kw: object) -> PolicyEngine:
    cfg = PolicyConfig(capacity_bytes=chunks * CHUNK, slot_bytes=SLOT, experts=experts, **kw)  # type: ignore[arg-type]
    return PolicyEngine(cfg)


HOT = (0, 1, 2, 3)


def _race(e: PolicyEngine, rounds: int) -> None:
    """A hot set of 4 then a scan of 4 one-shots, per round (8 fetches; epochs of 16 end after a scan).

    The frequency expert keeps the hot set, the recency one holds the last scan at every epoch's end.
    """
    fresh = 1000 + 4 * e.clock
    for _ in range(rounds):
        for k in (*HOT, fresh, fresh + 1, fresh + 2, fresh + 3):
            e.access(k, None, 0, CHUNK)
        fresh += 4


def test_a_chunk_the_new_leader_holds_is_placed_by_its_next_fetch() -> None:
    e = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=16, leader_half_life=5000.0, leader_fill_cost=0.0)
    for _ in range(200):
        _race(e, 2)
        if e.leader_switches:
            break
    assert e.leader == 1
    missing = [k for k in HOT if k in e.pool.residents and not e.holds(k)]
    assert len(missing) >= 2  # the hot set came with the new leader, not through the switch
    k = missing[0]
    e.drain()
    assert e.access(k, None, 0, CHUNK) is False  # this fetch goes to the holder, and its DATA fills it
    assert e.holds(k)
    assert [c.key for c in e.drain() if isinstance(c, Admit)] == [k]
    assert e.access(k, None, 0, CHUNK) is True


def test_fill_cost_keeps_a_leader_whose_challenger_would_refill_too_much() -> None:
    free = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=16, leader_half_life=5000.0, leader_fill_cost=0.0)
    dear = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=16, leader_half_life=5000.0, leader_fill_cost=1e6)
    _race(free, 80)
    _race(dear, 80)
    assert free.leader == 1 and free.leader_switches >= 1
    assert dear.leader == 0 and dear.leader_switches == 0
    assert dear.experts[1].stats["hits"] > dear.experts[0].stats["hits"]  # it did lead, by too little


def test_tilt_values_deep_blocks_more() -> None:
    flat = _engine(2, Expert(1e6))
    tilted = _engine(2, Expert(1e6, tilt=1.0))
    for e in (flat, tilted):
        e.access(1, None, 0, CHUNK)
        e.access(2, None, 15, CHUNK)
    assert flat.pool.value_of(2) == pytest.approx(flat.pool.value_of(1))
    assert tilted.pool.value_of(2) == pytest.approx(16 * tilted.pool.value_of(1))  # 2 ** log2(1 + 15)
    # full pool: a newcomer displaces the shallow chunk, not the deep one
    for _ in range(6):
        tilted.access(3, None, 0, CHUNK)
    assert tilted.holds(2) and tilted.holds(3) and not tilted.holds(1)
    with pytest.raises(ValueError, match="tilt"):
        _engine(2, Expert(10.0, tilt=-1.0))


def _first_evicted_from_a_chain(e: PolicyEngine) -> int:
    """Chain 10 <- 11 <- 12 with the root the coldest, then a hot newcomer: which chunk goes first?"""
    e.access(10, None, 0, CHUNK)
    for _ in range(3):
        e.access(11, 10, 1, CHUNK)
    for _ in range(5):
        e.access(12, 11, 2, CHUNK)
    e.drain()
    for _ in range(20):
        e.access(50, None, 0, CHUNK)
    return next(c.key for c in e.drain() if isinstance(c, Evict))


def test_without_leaves_first_a_parent_may_go_before_its_child() -> None:
    assert _first_evicted_from_a_chain(_engine(3, Expert(1e6, leaves_first=True))) == 12
    assert _first_evicted_from_a_chain(_engine(3, Expert(1e6, leaves_first=False))) == 10


def test_a_last_copy_tier_keeps_leaves_first_whatever_the_expert_says() -> None:
    from controller.policy import Tier

    e = _engine(3, Expert(1e6, leaves_first=False), tier=Tier.POOL, hit_saving="compute")
    assert _first_evicted_from_a_chain(e) == 12  # the leaf: there a block without its parent is useless


def test_default_experts_span_recency_to_frequency_with_and_without_tree_features() -> None:
    hls = [x.half_life for x in DEFAULT_EXPERTS]
    assert min(hls) <= 16 and max(hls) >= 65536
    assert any(x.tilt > 0 for x in DEFAULT_EXPERTS) and any(x.tilt == 0 for x in DEFAULT_EXPERTS)
    assert any(not x.leaves_first for x in DEFAULT_EXPERTS)
    assert any(x.kind == "s3fifo" for x in DEFAULT_EXPERTS)
    with pytest.raises(ValueError, match="leader_fill_cost"):
        PolicyEngine(PolicyConfig(capacity_bytes=10 * CHUNK, slot_bytes=SLOT, leader_fill_cost=-1.0))


def test_a_hand_over_writes_nothing_and_leftovers_serve_until_their_slots_are_needed() -> None:
    e = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=1 << 20)
    for k in (1, 2, 3, 4):  # the leader (and the switch) hold 1..4
        e.access(k, None, 0, CHUNK)
    gone = 4
    e.experts[1].evict(gone, EvictAction.DROP)  # the shadow holds 1..3 and 99
    e.experts[1].admit(99, None, 0, CHUNK, 0)
    e.drain()
    e._hand_over(1)
    assert e.drain() == []  # nothing written: the switch follows the new leader as fetches pass
    assert e.holds(gone) and e.stats["leftovers"] == 1  # still served: the eager switch had dropped it
    assert e.access(99, None, 0, CHUNK) is False  # the new leader's chunk: a miss that places it ...
    changes = e.drain()
    # ... in the leftover's slots, the switch being full
    assert [(type(c).__name__, c.key) for c in changes] == [("Evict", gone), ("Admit", 99)]
    assert e.holds(99) and not e.holds(gone) and e.stats["leftovers"] == 0
    assert set(e.image.held) == set(e.pool.residents)
    slots = sorted((p.base_slot, p.n_slots) for p in e.image.held.values())
    assert slots == sorted(e.image.allocator.allocations().items())  # the switch's allocator agrees


def test_leftovers_go_least_recently_fetched_first_and_a_quota_tenant_has_none() -> None:
    from types import SimpleNamespace
    from typing import cast

    from controller.policy import Change, Tier
    from controller.policy.image import SwitchImage
    from controller.policy.pool import ValuePool

    image = SwitchImage(Tier.SWITCH, 12)
    lead = SimpleNamespace(changes=[], quotas=SimpleNamespace(quotas={7: 3}), residents={}, value_of=lambda k: 0.0)
    leader = cast(ValuePool, lead)
    out: list[Change] = []
    for k, tenant in ((1, 0), (2, 0), (3, 0), (4, 7)):
        image.restore(k, 3 * (k - 1), 3, tenant)
    image.hand_over(leader, "leader switch", out)  # the new leader holds none of them
    assert [c.key for c in out] == [4] and set(image.leftovers) == {1, 2, 3}  # tenant 7 has a quota
    image.touch(1)  # a hit: 1 goes to the back of the line
    lead.residents = {5: SimpleNamespace(n_slots=3, tenant=0, base_slot=0)}
    out.clear()
    image.follow(leader, 5, out)  # the leader's chunk 5 passes: it takes free slots first
    assert [(type(c).__name__, c.key) for c in out] == [("Admit", 5)] and set(image.leftovers) == {1, 2, 3}
    lead.residents[6] = SimpleNamespace(n_slots=3, tenant=0, base_slot=0)
    out.clear()
    image.follow(leader, 6, out)  # full now: the least recently fetched leftover, 2, makes room
    assert [(type(c).__name__, c.key) for c in out] == [("Evict", 2), ("Admit", 6)]
    with pytest.raises(KeyError):
        image.drop(5, EvictAction.DROP, None, "not a leftover", out)
    out.clear()
    image.settle(out)
    assert [c.key for c in out] == [3, 1] and set(image.held) == {5, 6}


def test_a_pin_places_a_chunk_the_leader_holds_and_the_switch_does_not_yet() -> None:
    from controller.policy import Pin

    e = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=1 << 20, pin_fraction=0.5)
    e.access(1, None, 0, CHUNK)
    e.experts[1].admit(7, None, 0, CHUNK, 0)  # only the shadow holds 7
    e.drain()
    e._hand_over(1)
    assert not e.holds(7)
    changes = e.pin(7, None, 0, CHUNK)
    assert [type(c).__name__ for c in changes if c.key == 7] == ["Admit", "Pin"] and e.holds(7)
    assert any(isinstance(c, Pin) for c in changes)


def test_an_operator_verb_settles_the_switch_and_may_evict_a_leftover() -> None:
    from controller.policy.operator import evict

    e = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=1 << 20)
    for k in (1, 2, 3, 4):
        e.access(k, None, 0, CHUNK)
    for k in (3, 4):
        e.experts[1].evict(k, EvictAction.DROP)
    e.drain()
    e._hand_over(1)
    assert set(e.image.leftovers) == {3, 4}
    changes = evict(e, 4, EvictAction.DROP)  # only the switch holds 4: evicted, and 3 goes too (settled)
    assert [c.key for c in changes if isinstance(c, Evict)] == [4, 3]
    assert not e.image.leftovers and set(e.image.held) == {1, 2} == set(e.pool.residents)


def test_s3fifo_expert_is_s3fifo() -> None:
    e = _engine(10, Expert(256.0, kind="s3fifo"))  # 10 chunks: the small FIFO's share is one
    for k in range(1, 11):  # first sightings fill the pool through the small FIFO
        assert e.access(k, None, 0, CHUNK) is False and e.pool.on_probation(k)
    assert e.access(5, None, 0, CHUNK) is True  # 5 is hit while in the small FIFO
    e.access(11, None, 0, CHUNK)  # full: the oldest, 1, leaves unhit and is remembered as a ghost
    assert not e.holds(1) and 1 in e.pool.ghost  # type: ignore[attr-defined]
    e.access(1, None, 0, CHUNK)  # a ghost comes back straight into main
    assert e.holds(1) and not e.pool.on_probation(1) and not e.holds(2)
    for k in range(100, 104):  # one-shots push 3, 4 out; 5 was hit, so it moves to main instead
        e.access(k, None, 0, CHUNK)
    assert e.holds(5) and not e.pool.on_probation(5) and not e.holds(3) and not e.holds(4)
    changes = e.drain()
    assert any(isinstance(c, Admit) and "ghost" in c.reason for c in changes)
    with pytest.raises(ValueError, match="kind"):
        _engine(2, Expert(10.0, kind="arc"))


def test_s3fifo_expert_matches_the_simulator_baseline_it_replaced() -> None:
    """The textbook S3-FIFO (small FIFO 10%, ghosts as many as main, up to 3 laps) on a seeded stream."""
    import random
    from collections import OrderedDict, deque

    rng = random.Random(7)
    keys = [int(400 * rng.random() ** 2) for _ in range(5000)]
    cap = 40
    e = _engine(cap, Expert(256.0, kind="s3fifo", leaves_first=False))
    got = [e.access(k, None, 0, CHUNK) for k in keys]
    small_cap, main_cap = max(1, cap // 10), cap - max(1, cap // 10)
    small: deque[int] = deque()
    main: deque[int] = deque()
    ghost: OrderedDict[int, None] = OrderedDict()
    freq: dict[int, int] = {}

    def evict_main() -> None:
        while True:
            k1 = main.popleft()
            if not freq[k1]:
                del freq[k1]
                return
            freq[k1] -= 1
            main.append(k1)

    def evict_small() -> None:
        while small:
            k0 = small.popleft()
            if not freq[k0]:
                del freq[k0]
                ghost[k0] = None
                if len(ghost) > main_cap:
                    ghost.popitem(last=False)
                return
            freq[k0] = 0
            main.append(k0)
            if len(main) > main_cap:
                evict_main()

    want = []
    for k in keys:
        want.append(k in freq)
        if k in freq:
            freq[k] = min(freq[k] + 1, 3)
            continue
        while len(freq) >= cap:
            if len(small) >= small_cap or not main:
                evict_small()
            else:
                evict_main()
        freq[k] = 0
        if k in ghost:
            del ghost[k]
            main.append(k)
        else:
            small.append(k)
    assert got == want
    assert 0.2 < sum(got) / len(got) < 0.95  # a stream where eviction order matters


def test_s3fifo_expert_keeps_leaves_first_where_the_tier_holds_the_last_copy() -> None:
    from controller.policy import Tier

    copy_tier = _engine(3, Expert(256.0, kind="s3fifo", leaves_first=False))
    assert _first_evicted_from_a_chain(copy_tier) == 10  # textbook: the small FIFO's unhit head
    last_copy = _engine(3, Expert(256.0, kind="s3fifo", leaves_first=False), tier=Tier.POOL, hit_saving="compute")
    assert _first_evicted_from_a_chain(last_copy) == 12  # the leaf: the root and its child moved to main


def _first_hand_over(e: PolicyEngine) -> int:
    """Feed the hot-set-and-scan rounds (the frequency expert leads from the start) until a hand-over."""
    fresh = 1000
    while not e.leader_switches and e.clock < 10_000:
        for k in (*HOT, fresh, fresh + 1, fresh + 2, fresh + 3):
            e.access(k, None, 0, CHUNK)
            if e.leader_switches:
                break
        fresh += 4
    return e.clock


def test_the_race_acts_on_a_clear_lead_at_its_next_decision_every_epoch_fetches() -> None:
    assert PolicyConfig(capacity_bytes=CHUNK, slot_bytes=SLOT).epoch_fetches == 128
    for period in (32, 128, 512):
        e = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=period, leader_half_life=5000.0)
        # the lead is past one standard deviation after the first rounds: the hand-over comes at the
        # first decision, so a race deciding every 128 fetches switches 384 fetches before one every 512
        assert _first_hand_over(e) == period and e.leader == 1


def test_deciding_more_often_does_not_turn_noise_into_hand_overs() -> None:
    import random

    switches: dict[int, list[int]] = {}
    for period in (16, 128, 512):
        for seed in range(6):
            rng = random.Random(seed)
            e = _engine(4, Expert(2.0), Expert(1e6), epoch_fetches=period, leader_half_life=5000.0)
            for _ in range(20_000):  # 40 keys drawn uniformly: every expert hits 4/40 in expectation
                e.access(rng.randrange(40), None, 0, CHUNK)
            hits = [x.stats["hits"] for x in e.experts]
            assert abs(hits[0] - hits[1]) < 0.03 * sum(hits)
            # a one-standard-deviation test is crossed by chance now and then: at most about once
            # per half-life of the race's tally (20,000 fetches are four)
            assert e.leader_switches <= 4
            switches.setdefault(period, []).append(e.leader_switches)
    # deciding 32 times as often does not multiply them: the tally, not the period, sets the pace
    assert sum(switches[16]) <= 2 * sum(switches[512])
