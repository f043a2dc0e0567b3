"""The intended changes the policy engine returns; a driver turns them into table writes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from controller.policy.tiers import Tier


class EvictAction(Enum):
    """What happens to an evicted chunk: moved to a lower tier (value recovery) or dropped."""

    DEMOTE = "demote"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class Admit:
    """Install ``key`` in ``tier`` at slots ``[base_slot, base_slot + n_slots)``; filled on the next pass."""

    key: int
    tier: Tier
    base_slot: int
    n_slots: int
    value: float
    reason: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Remove ``key`` from ``tier``; ``action`` says whether it moves to ``target`` or is dropped, and why."""

    key: int
    tier: Tier
    action: EvictAction
    target: Tier | None
    value: float
    reason: str


@dataclass(frozen=True, slots=True)
class Pin:
    """``key`` is pinned in ``tier`` for ``tenant``: never evicted until unpinned."""

    key: int
    tier: Tier
    tenant: int


@dataclass(frozen=True, slots=True)
class Unpin:
    """``key`` is no longer pinned and competes on value again."""

    key: int
    tier: Tier


Change = Admit | Evict | Pin | Unpin
