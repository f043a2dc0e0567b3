"""Per-tenant quotas of the switch pool and the bound on pinned space."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


class QuotaError(ValueError):
    """A pin or quota request the pool cannot honour; the message says which limit."""


@dataclass
class QuotaBook:
    """Slots used per tenant and pinned, against their limits.

    ``quotas`` maps a tenant to the most slots it may hold (a tenant not listed may use the
    whole pool); pinned slots over all tenants stay under ``pin_fraction`` of the pool so
    that pins can never starve the value-driven part.
    """

    total_slots: int
    quotas: dict[int, int] = field(default_factory=dict)
    pin_fraction: float = 0.25
    used: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    pinned_slots: int = 0

    def __post_init__(self) -> None:
        if self.total_slots <= 0:
            raise QuotaError(f"total_slots must be positive, got {self.total_slots}")
        if not 0.0 <= self.pin_fraction <= 1.0:
            raise QuotaError(f"pin_fraction must be within [0, 1], got {self.pin_fraction}")
        for tenant, q in self.quotas.items():
            if q <= 0:
                raise QuotaError(f"quota of tenant {tenant} must be positive, got {q} slots")

    @property
    def pin_bound(self) -> int:
        """The most slots all pins together may hold."""
        return int(self.total_slots * self.pin_fraction)

    def quota(self, tenant: int) -> int:
        """Slot limit of ``tenant``."""
        return self.quotas.get(tenant, self.total_slots)

    def over_quota(self, tenant: int, n: int) -> bool:
        """Whether holding ``n`` more slots would put ``tenant`` over its quota."""
        return self.used[tenant] + n > self.quota(tenant)

    def check_pin(self, tenant: int, n: int) -> None:
        """Raise :class:`QuotaError` unless ``n`` more pinned slots for ``tenant`` fit both limits."""
        if self.pinned_slots + n > self.pin_bound:
            raise QuotaError(
                f"pin of {n} slots exceeds the pin bound: {self.pinned_slots} of {self.pin_bound} slots already pinned"
            )
        if n > self.quota(tenant):
            raise QuotaError(f"pin of {n} slots exceeds tenant {tenant}'s quota of {self.quota(tenant)} slots")

    def charge(self, tenant: int, n: int) -> None:
        """Account ``n`` slots (negative to release) to ``tenant``."""
        self.used[tenant] += n
        if self.used[tenant] < 0:
            raise QuotaError(f"tenant {tenant} released more slots than it held")
