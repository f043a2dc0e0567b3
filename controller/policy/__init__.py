"""Policy engine: what the switch pool holds and how KV moves between tiers (pure: data in, changes out).

Nothing here does I/O. The controller daemon feeds :class:`~controller.policy.engine.PolicyEngine`
the fetches it observed (digests, counters) each epoch and ships the returned changes to the
switch; the simulator drives the very same engine fetch by fetch.
"""

from controller.policy.allocator import SlotAllocator
from controller.policy.changes import Admit, Change, Evict, EvictAction, Pin, Unpin
from controller.policy.engine import Expert, Observation, PolicyConfig, PolicyEngine
from controller.policy.pool import ValuePool
from controller.policy.quotas import QuotaBook, QuotaError
from controller.policy.tiers import Tier, TierLayout, TierSpec
from controller.policy.value import PrefillCost

__all__ = [
    "Admit",
    "Change",
    "Evict",
    "EvictAction",
    "Expert",
    "Observation",
    "Pin",
    "PolicyConfig",
    "PolicyEngine",
    "PrefillCost",
    "QuotaBook",
    "QuotaError",
    "SlotAllocator",
    "Tier",
    "TierLayout",
    "TierSpec",
    "Unpin",
    "ValuePool",
]
