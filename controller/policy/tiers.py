"""The storage tiers a chunk can live in, their capacities, and the promotion/demotion rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Tier(IntEnum):
    """Where a chunk lives, fastest for its node first."""

    HBM = 0  # GPU memory of the inference node
    DRAM = 1  # host memory of the inference node
    SWITCH = 2  # the switch pool: shared, tiny, one hop away, served at line rate
    POOL = 3  # the remote DRAM pool on the holders (Mooncake Store): shared, large


#: a chunk evicted from a tier goes here when its value warrants (None: nowhere, dropped)
DEMOTION: dict[Tier, Tier | None] = {
    Tier.HBM: Tier.DRAM,
    Tier.DRAM: Tier.POOL,
    # The switch holds copies of pool chunks: its demotion target is the pool, which
    # normally still has the chunk, so "demote" there means "make sure the pool keeps it".
    Tier.SWITCH: Tier.POOL,
    Tier.POOL: None,
}

#: a chunk used from a tier is promoted here (shared tiers feed the switch; node tiers feed HBM)
PROMOTION: dict[Tier, Tier | None] = {
    Tier.HBM: None,
    Tier.DRAM: Tier.HBM,
    Tier.SWITCH: Tier.HBM,
    Tier.POOL: Tier.SWITCH,
}


@dataclass(frozen=True, slots=True)
class TierSpec:
    """Capacity of one tier in bytes (per node for HBM/DRAM, per switch for SWITCH, total for POOL)."""

    tier: Tier
    capacity_bytes: int

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0:
            raise ValueError(f"{self.tier.name.lower()} capacity must be positive, got {self.capacity_bytes} bytes")


@dataclass(frozen=True)
class TierLayout:
    """The tiers present in a deployment and where chunks move between them."""

    specs: dict[Tier, TierSpec] = field(default_factory=dict)

    def capacity(self, tier: Tier) -> int:
        """Capacity of ``tier`` in bytes (0 when the tier is absent)."""
        spec = self.specs.get(tier)
        return spec.capacity_bytes if spec else 0

    def demotion_target(self, tier: Tier) -> Tier | None:
        """The next present tier below ``tier`` on its demotion path, or None."""
        nxt = DEMOTION[tier]
        while nxt is not None and nxt not in self.specs:
            nxt = DEMOTION[nxt]
        return nxt

    def promotion_target(self, tier: Tier) -> Tier | None:
        """The present tier a chunk used from ``tier`` is promoted to, or None."""
        nxt = PROMOTION[tier]
        while nxt is not None and nxt not in self.specs:
            nxt = PROMOTION[nxt]
        return nxt
