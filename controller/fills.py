"""Which pooled chunks the switches can answer yet: their last slot written since they were placed.

A pooled chunk fills on pass: the answers that cross its switch write its slots
(p4/include/pool.p4, ``slot_fills`` counts each write), or the holder pushes it there.  Until
then a requester that asks for it one fragment at a time (the servable path, ``kvpool.hints``)
gains nothing and costs a request packet per fragment: the switch misses and the holder
answers every single GET.  So the controller hints a pooled chunk ``servable`` only once the
fill counter of its last slot has grown since its placement; before that, requesters ask for
it with range GETs, which the switches coalesce, and whose answers fill it.

Pure: :class:`FillWatch` takes the counts the controller read and says which chunks are
filled.  Counts are summed over the switches (one slot space for the fabric, so a slot index
names one chunk everywhere).  Only unfilled chunks need reading (``unfilled``): every
P4Runtime read takes the model switch's CPU from its packets.  A filled chunk stays filled
until it leaves the pool or ``reset`` (a switch that restarted has empty registers); a count
that went down before the fill was seen is read as such a restart too.  A fill before the
first read of a chunk's slot is missed (it becomes the baseline): the chunk stays on range
GETs, which cost nothing extra, until its next pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(slots=True)
class _Watch:
    slot: int
    base: int | None = None
    filled: bool = False


class FillWatch:
    """Per pooled chunk: the fill count of its last slot at placement, and whether it grew since."""

    def __init__(self) -> None:
        self._watch: dict[int, _Watch] = {}

    def update(self, last_slots: Mapping[int, int], fills: Mapping[int, int] | None) -> set[int]:
        """Take the residents (key -> last slot) and the fill counts read now (slot -> count; None: no read).

        Returns the chunks filled.  A chunk no longer resident is forgotten; one placed at another
        slot starts over.
        """
        for key in [k for k in self._watch if k not in last_slots]:
            del self._watch[key]
        for key, slot in last_slots.items():
            w = self._watch.get(key)
            if w is None or w.slot != slot:
                w = self._watch[key] = _Watch(slot)
            if fills is None or slot not in fills:
                continue
            count = fills[slot]
            if w.base is None or count < w.base:
                w.base, w.filled = count, False  # first read, or a switch lost its registers
            elif count > w.base:
                w.filled = True
        return {k for k, w in self._watch.items() if w.filled}

    def unfilled(self, last_slots: Mapping[int, int]) -> list[int]:
        """The last slots worth reading now: those of the chunks not yet seen filled."""
        return sorted({slot for key, slot in last_slots.items()
                       if not ((w := self._watch.get(key)) is not None and w.slot == slot and w.filled)})

    def reset(self, keys: Iterable[int]) -> None:
        """Forget what is known of ``keys`` (their switch lost its registers): unfilled, new baseline."""
        for key in keys:
            self._watch.pop(key, None)
