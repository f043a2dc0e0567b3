"""FillWatch: a pooled chunk counts as filled once its last slot was written after its placement."""

from __future__ import annotations

from controller.fills import FillWatch


def test_a_chunk_is_filled_once_its_last_slot_was_written_after_the_first_read() -> None:
    w = FillWatch()
    assert w.update({1: 13}, {13: 5}) == set()  # the slot's past (an earlier chunk's fills) is the baseline
    assert w.update({1: 13}, {13: 5}) == set()
    assert w.update({1: 13}, {13: 6}) == {1}
    assert w.update({1: 13}, None) == {1}  # no read this epoch: what was known stays


def test_a_count_that_went_down_is_a_restarted_switch_and_the_chunk_is_unfilled_again() -> None:
    w = FillWatch()
    w.update({1: 13}, {13: 5})
    assert w.update({1: 13}, {13: 9}) == {1}
    assert w.update({1: 13}, {13: 0}) == set()  # empty registers: the next pass fills it again
    assert w.update({1: 13}, {13: 1}) == {1}


def test_an_evicted_or_moved_chunk_starts_over() -> None:
    w = FillWatch()
    w.update({1: 13, 2: 20}, {13: 0, 20: 0})
    assert w.update({1: 13, 2: 20}, {13: 1, 20: 1}) == {1, 2}
    assert w.update({2: 20}, {20: 1}) == {2}  # 1 evicted: forgotten
    assert w.update({1: 40, 2: 20}, {40: 7, 20: 1}) == {2}  # 1 again, elsewhere: a new baseline
    assert w.update({1: 40, 2: 20}, {40: 8, 20: 1}) == {1, 2}


def test_a_slot_not_read_keeps_the_chunk_unfilled_until_it_is() -> None:
    w = FillWatch()
    assert w.update({1: 13}, {}) == set()
    assert w.update({1: 13}, {13: 3}) == set()
    assert w.update({1: 13}, {13: 4}) == {1}


def test_only_unfilled_chunks_are_read_and_a_reset_makes_a_chunk_unfilled() -> None:
    w = FillWatch()
    last = {1: 13, 2: 20}
    assert w.unfilled(last) == [13, 20]
    w.update(last, {13: 0, 20: 0})
    assert w.update(last, {13: 1, 20: 0}) == {1}
    assert w.unfilled(last) == [20]  # a filled chunk is not read again
    assert w.update(last, {20: 0}) == {1}  # and stays filled without a read
    w.reset([1])  # its switch restarted: empty registers
    assert w.unfilled(last) == [13, 20]
    assert w.update(last, {13: 0, 20: 0}) == set()
    assert w.update(last, {13: 1, 20: 0}) == {1}
