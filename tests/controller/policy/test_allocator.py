"""Slot allocator of the paged switch pool: consecutive runs, no leaks, reuse after free."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from controller.policy.allocator import AllocatorError, SlotAllocator


def test_runs_are_consecutive_and_disjoint() -> None:
    a = SlotAllocator(100)
    bases = [a.alloc(10) for _ in range(10)]
    assert bases == list(range(0, 100, 10))
    assert a.alloc(1) is None and a.free_slots == 0


def test_free_merges_and_slots_are_reused() -> None:
    a = SlotAllocator(30)
    x, y, z = a.alloc(10), a.alloc(10), a.alloc(10)
    assert (x, y, z) == (0, 10, 20)
    a.free(10, 10)
    assert a.alloc(10) == 10  # the freed run is reused
    a.free(0, 10)
    a.free(10, 10)
    assert a.largest_free_run == 20  # neighbours merged into one run
    assert a.alloc(20) == 0


def test_double_free_and_wrong_length_are_errors() -> None:
    a = SlotAllocator(8)
    b = a.alloc(4)
    assert b is not None
    with pytest.raises(AllocatorError):
        a.free(b, 3)
    a.free(b, 4)
    with pytest.raises(AllocatorError):
        a.free(b, 4)
    with pytest.raises(ValueError):
        SlotAllocator(0)


def _churn(a: SlotAllocator, rng: random.Random, steps: int, p_free: float, max_run: int,
           live: dict[int, int]) -> Iterator[None]:
    """Random frees (of ``live``'s runs) and allocations of up to ``max_run`` slots, ``live`` kept in step."""
    for _ in range(steps):
        if live and rng.random() < p_free:
            base = rng.choice(list(live))
            a.free(base, live.pop(base))
        else:
            n = rng.randint(1, max_run)
            got = a.alloc(n)
            if got is not None:
                live[got] = n
        yield


def test_random_churn_never_leaks_or_overlaps() -> None:
    a = SlotAllocator(1000)
    live: dict[int, int] = {}
    for _ in _churn(a, random.Random(7), 5000, 0.5, 40, live):
        taken = sorted(live.items())
        for (b0, n0), (b1, _) in itertools.pairwise(taken):
            assert b0 + n0 <= b1  # no overlap
        assert a.used_slots == sum(live.values())
        assert a.allocations() == live
    for base, n in list(live.items()):
        a.free(base, n)
    assert a.free_slots == 1000 and a.largest_free_run == 1000


def test_reserve_takes_exactly_a_free_run() -> None:
    a = SlotAllocator(30)
    a.reserve(10, 5)  # a run another controller placed, in the middle of the free space
    assert a.allocations() == {10: 5} and a.free_slots == 25
    assert a.alloc(10) == 0 and a.alloc(10) == 15  # first fit around it
    with pytest.raises(AllocatorError):
        a.reserve(12, 2)  # taken
    with pytest.raises(AllocatorError):
        a.reserve(25, 10)  # runs past the end
    a.reserve(25, 5)
    a.free(10, 5)
    a.reserve(10, 5)  # freed runs merge and can be reserved again
    assert a.free_slots == 0


def test_is_free_is_exactly_inside_the_slots_and_overlapping_no_allocation() -> None:
    rng = random.Random(11)
    a = SlotAllocator(200)
    live: dict[int, int] = {}
    for _ in _churn(a, rng, 2000, 0.4, 12, live):
        base, n = rng.randint(-5, 205), rng.randint(1, 15)
        brute = base >= 0 and base + n <= 200 and not any(b < base + n and base < b + m for b, m in live.items())
        assert a.is_free(base, n) == brute
        if brute:  # and what is_free calls free, reserve takes
            a.reserve(base, n)
            live[base] = n
    assert not a.is_free(0, 0)
