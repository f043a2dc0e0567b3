"""The policy engine: observed chunk fetches in, intended pool changes out.

The controller daemon calls :meth:`PolicyEngine.step` once per epoch with the fetches it saw
(switch digests and counters); the simulator calls :meth:`PolicyEngine.access` per fetch. Both
run the same code: ``step`` is ``access`` over a batch. The engine keeps its own clock in
fetches, so nothing depends on the absolute request rate.

How fast should hit counts decay? That is the one knob that separates recency (short
half-life: LRU-like) from frequency (long half-life: LFU-like), and the right answer depends
on the pool size and the workload. So the engine runs several :class:`ValuePool` experts
with half-lives on a geometric grid over the same fetches, as shadows (keys only, no table
writes), and lets the one with the most recent hits drive the switch (follow the leader, with
hysteresis: a challenger takes over when its lead passes a paired test over the fetches where
the two disagree, :mod:`controller.policy.race`). The switch follows the leader lazily
(:class:`~controller.policy.image.SwitchImage`): a hand-over writes nothing; what the new
leader does not hold stays in the switch as leftovers that keep serving until their slots are
needed, and a chunk it holds that the switch does not is placed by its next fetch (a miss,
whose DATA fills it on the way past). Writing the new leader's pool at once would throw away
chunks still being hit (docs/design/notes-policy-engine.md).

Besides the half-life, experts differ in what they take from the prefix tree: how much a
block's position in its prefix adds to its value (``tilt``: deep blocks sit under long
conversations and documents, whose blocks come back together; with leaves evicted first a
tilted pool keeps whole chains instead of the heads of many), and whether a block with
resident children is protected (``leaves_first``; a copy tier above a pool that keeps every
chunk may do without). Which combination wins depends on the workload and the pool size, so
it is the leader race, not a constant, that decides. One expert is a classic, S3-FIFO itself
(:class:`~controller.policy.fifo.FifoPool`): the race can only be as good as its best expert,
and on bursty agent traffic S3-FIFO's small FIFO with ghosts beat every decayed-count pool.
Another asks what none of the others does, *when* a chunk comes back
(:class:`~controller.policy.nextfetch.NextFetchPool`: Belady with the next fetch predicted
from the chunk's own gaps); on session traffic in small pools it beat them all. The
expert grid and the leader's thresholds were chosen on the four generated workload families
(tool, docqa, chat, synthetic) with the Mooncake conversation trace held out; docs/research/README.md
has the leave-one-family-out table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controller.policy.admission import AdmissionGate
from controller.policy.changes import Change, EvictAction
from controller.policy.fifo import FifoPool
from controller.policy.image import SwitchImage
from controller.policy.nextfetch import NextFetchPool
from controller.policy.pool import ValuePool
from controller.policy.race import RaceTally
from controller.policy.sketch import FrequencySketch
from controller.policy.tiers import Tier, TierLayout, TierSpec
from controller.policy.value import PrefillCost
from kvpool.wire import FRAG_PAYLOAD

#: Llama-3-8B-like default when no cost model is given
DEFAULT_COST = PrefillCost(n_params=8.0e9, n_layers=32, d_model=4096)


#: the kinds of expert pool: decayed reuse value, S3-FIFO, predicted next fetch
EXPERT_KINDS = ("value", "s3fifo", "nextfetch")


@dataclass(frozen=True, slots=True)
class Expert:
    """One shadow pool's parameters."""

    #: half-life of hit counts, in fetches: short is recency (LRU-like), long is frequency
    half_life: float
    #: fetches (within the sketch's half-life) before a chunk is off probation
    probation_hits: int = 1
    #: share of the slots given to the probation FIFO (0: a chunk on probation stays out)
    probation_fraction: float = 0.0
    #: what one hit saves (see :attr:`PolicyConfig.hit_saving`); "auto" follows the config
    saving: str = "auto"
    #: weight of log2(1 + position in the prefix) in the chunk's value (0: position plays no part)
    tilt: float = 0.0
    #: a chunk whose children are resident is not a victim until they are gone (always so in a tier
    #: holding the last copy, where a hit saves prefill)
    leaves_first: bool = True
    #: "value" (a :class:`ValuePool` with the fields above), "s3fifo" (a :class:`FifoPool`: S3-FIFO
    #: itself) or "nextfetch" (a :class:`NextFetchPool`: evict what is predicted to be fetched last);
    #: the last two take only ``half_life`` (for the decayed count behind demote-or-drop) and
    #: ``leaves_first``
    kind: str = "value"

    def label(self) -> str:
        """A short description for change reasons and reports."""
        if self.kind == "s3fifo":
            return "S3-FIFO"
        if self.kind == "nextfetch":
            return "next fetch"
        extra = "".join((f", tilt {self.tilt:g}" if self.tilt else "",
                         f", {self.probation_hits} sightings" if self.probation_hits > 1 else "",
                         "" if self.leaves_first else ", no leaves-first"))
        return f"half-life {self.half_life:g}{extra}"

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.half_life <= 0:
            raise ValueError(f"expert half_life must be positive, got {self.half_life}")
        if self.probation_hits < 1:
            raise ValueError(f"expert probation_hits must be at least 1, got {self.probation_hits}")
        if not 0.0 <= self.probation_fraction < 1.0:
            raise ValueError(f"expert probation_fraction must be within [0, 1), got {self.probation_fraction}")
        if self.saving not in ("auto", "fetch", "compute"):
            raise ValueError(f"expert saving must be auto, fetch or compute, got {self.saving!r}")
        if not self.tilt >= 0:
            raise ValueError(f"expert tilt must be non-negative, got {self.tilt}")
        if self.kind not in EXPERT_KINDS:
            raise ValueError(f"expert kind must be one of {', '.join(EXPERT_KINDS)}, got {self.kind!r}")


#: the default experts: half-lives from recency (16 fetches) to frequency (65536), each plain and
#: tilted towards deep blocks, one whose gate keeps first sightings out, one recency expert
#: without the leaves-first rule, S3-FIFO, and a predicted Belady (next fetch). The first one
#: drives the switch until the evidence says otherwise: a middle of the grid (moderate
#: half-life, moderate tilt) loses least while the race is open.
DEFAULT_EXPERTS: tuple[Expert, ...] = (
    Expert(256.0, tilt=0.5),
    Expert(16.0),
    Expert(1024.0),
    Expert(4096.0),
    Expert(16384.0),
    Expert(65536.0),
    Expert(4096.0, probation_hits=2),
    Expert(1024.0, tilt=0.5),
    Expert(4096.0, tilt=0.5),
    Expert(16384.0, tilt=0.5),
    Expert(65536.0, tilt=1.0),
    Expert(256.0, leaves_first=False),
    Expert(256.0, kind="s3fifo", leaves_first=False),
    Expert(256.0, kind="nextfetch", leaves_first=False),
)


def _flat(_position: int) -> float:
    """A hit saves one holder transfer of the chunk, wherever the block sits in the prefix."""
    return 1.0


@dataclass(frozen=True, slots=True)
class Observation:
    """One fetch of chunk ``key`` (block ``position`` of a prefix, child of ``parent``) by ``tenant``."""

    key: int
    parent: int | None
    position: int
    nbytes: int
    tenant: int = 0


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the reuse-value policy; the defaults are what the simulator's ``value`` policy runs."""

    capacity_bytes: int
    tier: Tier = Tier.SWITCH
    slot_bytes: int = FRAG_PAYLOAD
    cost: PrefillCost = DEFAULT_COST
    #: what one hit saves: "fetch" (a holder transfer: the tier above a pool that keeps every
    #: chunk), "compute" (the prefill of the block: the tier holds the last copy), or "auto"
    #: (fetch for the switch, compute for the others)
    hit_saving: str = "auto"
    experts: tuple[Expert, ...] = DEFAULT_EXPERTS
    #: half-life (fetches) of the experts' hit scores, and the margin a challenger must win by.
    #: 10,000 rather than the 40,000 of the eager switch: with leftovers serving, a hand-over costs
    #: less, and a quicker race was at least as good in each of three draws of the generated
    #: families (cells below the best baseline and share of Belady; docs/research/README.md)
    leader_half_life: float = 10_000.0
    leader_margin: float = 0.0
    #: ... and by this many standard deviations of its lead, counted over the fetches where the two
    #: disagreed (a paired test, race.py), so noise rarely switches
    leader_z: float = 1.0
    #: ... and by this many hits per chunk the hand-over must fill (a chunk the new leader holds and
    #: the switch does not is a miss at its next fetch, which places it). 0: the race ignores
    #: the refill, which the leave-one-family-out selection preferred on the generated families by
    #: a hair; the conversation trace alone would have chosen 0.25 (docs/research/README.md)
    leader_fill_cost: float = 0.0
    #: fetches between the race's decisions (fold the hits into the scores, maybe hand over). 128
    #: rather than 512: the race acts on a lead as soon as it clears the threshold instead of up to
    #: 511 fetches later, which counts most while the experts first diverge (leave-one-family-out
    #: choice on the generated families, docs/research/README.md)
    epoch_fetches: int = 128
    demote_min_hits: float = 1.0
    sketch_width: int = 1 << 16
    sketch_reset: int = 1 << 16
    tenant_quotas: dict[int, int] = field(default_factory=dict)
    pin_fraction: float = 0.25
    layout: TierLayout | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first nonsensical option."""
        if self.capacity_bytes <= 0:
            raise ValueError(f"pool capacity must be positive, got {self.capacity_bytes} bytes")
        if self.slot_bytes <= 0:
            raise ValueError(f"slot size must be positive, got {self.slot_bytes} bytes")
        if self.capacity_bytes < self.slot_bytes:
            raise ValueError(f"pool capacity {self.capacity_bytes} B is smaller than one slot ({self.slot_bytes} B)")
        if self.hit_saving not in ("auto", "fetch", "compute"):
            raise ValueError(f"hit_saving must be auto, fetch or compute, got {self.hit_saving!r}")
        if not self.experts:
            raise ValueError("at least one expert (half-life, probation hits, probation fraction) is needed")
        for ex in self.experts:
            ex.validate()
        if self.leader_half_life <= 0 or self.leader_margin < 0 or self.leader_fill_cost < 0:
            raise ValueError("leader_half_life must be positive, leader_margin and leader_fill_cost non-negative")
        if self.epoch_fetches <= 0:
            raise ValueError(f"epoch_fetches must be positive, got {self.epoch_fetches}")
        if self.demote_min_hits < 0:
            raise ValueError(f"demote_min_hits must be non-negative, got {self.demote_min_hits}")


class PolicyEngine:
    """Reuse-value policy for one shared tier: experts over half-lives, the leader drives the switch."""

    def __init__(self, config: PolicyConfig) -> None:
        config.validate()
        self.config = config
        self.tier = config.tier
        self.n_slots = config.capacity_bytes // config.slot_bytes
        layout = config.layout or TierLayout(
            {config.tier: TierSpec(config.tier, config.capacity_bytes), Tier.POOL: TierSpec(Tier.POOL, 1 << 62)}
        )
        default_kind = config.hit_saving
        if default_kind == "auto":
            default_kind = "fetch" if config.tier is Tier.SWITCH else "compute"
        cost = config.cost
        sketch = FrequencySketch(width=config.sketch_width, reset_every=config.sketch_reset)
        self.gates: dict[int, AdmissionGate] = {}
        self.experts: list[ValuePool] = []
        for ex in config.experts:
            kind = default_kind if ex.saving == "auto" else ex.saving
            saving: Callable[[int], float] = _flat if kind == "fetch" else cost.relative
            make = {"s3fifo": FifoPool, "nextfetch": NextFetchPool}.get(ex.kind, ValuePool)
            pool = make(
                tier=config.tier,
                n_slots=self.n_slots,
                slot_bytes=config.slot_bytes,
                half_life=ex.half_life,
                gate=self.gates.setdefault(ex.probation_hits, AdmissionGate(sketch, ex.probation_hits)),
                probation_fraction=ex.probation_fraction,
                saving=saving,
                layout=layout,
                demote_min_hits=config.demote_min_hits,
                tenant_quotas=config.tenant_quotas,
                pin_fraction=config.pin_fraction,
                position_tilt=ex.tilt,
                # Where a hit saves prefill the tier holds the last copy: a block without its
                # parent there is useless, so no expert may evict a parent before its children.
                leaves_first=ex.leaves_first or kind == "compute",
            )
            pool.record = False
            self.experts.append(pool)
        self.sketch = sketch
        self.leader = 0  # the first expert drives the switch until another is clearly better
        self.experts[0].record = True
        #: decayed hits and pairwise disagreements of the experts (race.py)
        self.race = RaceTally(len(self.experts), config.leader_half_life, config.epoch_fetches)
        #: this epoch's fetches by which experts hit (bit i: expert i)
        self._patterns: dict[int, int] = {}
        self._bits = [(1 << i, pool) for i, pool in enumerate(self.experts)]
        self._until_epoch = config.epoch_fetches
        self.clock = 0
        self.leader_switches = 0
        #: what the switch holds: the leader's chunks and, after a hand-over, leftovers (image.py)
        self.image = SwitchImage(config.tier, self.n_slots)
        self._changes: list[Change] = []

    @property
    def pool(self) -> ValuePool:
        """The expert currently driving the switch."""
        return self.experts[self.leader]

    @property
    def stats(self) -> dict[str, int]:
        """The leader's counters plus engine-level ones."""
        s = dict(self.pool.stats)
        s["leader_switches"] = self.leader_switches
        s["leftovers"] = len(self.image.leftovers)
        return s

    def step(self, observations: list[Observation]) -> list[Change]:
        """Process one epoch of observed fetches in order; returns the intended changes."""
        for o in observations:
            self.access(o.key, o.parent, o.position, o.nbytes, o.tenant)
        return self.drain()

    def drain(self, settle: bool = False) -> list[Change]:
        """The changes decided since the last drain; ``settle`` (operator verbs) lets every leftover go."""
        self.image.follow(self.pool, None, self._changes, settle)
        out, self._changes = self._changes, []
        return out

    def access(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int = 0) -> bool:
        """One fetch of ``key``: True when the switch holds it; the experts learn, the switch follows the leader."""
        self.clock += 1
        estimate = self.sketch.add(key)
        image = self.image
        hit = image.holds(key)
        if hit:
            image.touch(key)
        mask = 0
        for bit, pool in self._bits:
            if pool.access(key, parent, position, nbytes, tenant, estimate):
                mask |= bit
        patterns = self._patterns
        patterns[mask] = patterns.get(mask, 0) + 1
        # A chunk the leader holds and the switch does not (since a hand-over) is placed by this
        # fetch, a miss whose DATA fills it on the way back, as for any admission.
        image.follow(self.pool, key, self._changes)
        self._until_epoch -= 1
        if self._until_epoch <= 0:
            self._epoch()
        return hit

    def _epoch(self) -> None:
        """Fold this epoch's hits into the race; hand over to a clearly better expert."""
        self._until_epoch = self.config.epoch_fetches
        self.race.fold(self._patterns)
        self._patterns = {}
        cfg = self.config
        best = self.race.challenger(self.leader, margin=cfg.leader_margin, z=cfg.leader_z)
        if best is None:
            return
        if cfg.leader_fill_cost > 0:
            held = self.image.held
            fills = sum(1 for k in self.experts[best].residents if k not in held)
            if self.race.scores[best] - self.race.scores[self.leader] <= cfg.leader_fill_cost * fills:
                return
        self._hand_over(best)

    def _hand_over(self, new: int) -> None:
        """Make expert ``new`` the leader; the switch follows it lazily (nothing is written now)."""
        old_pool, new_pool = self.pool, self.experts[new]
        self.image.follow(old_pool, None, self._changes)  # what the old leader decided before it goes
        old_pool.record = False
        new_pool.changes = []
        new_pool.record = True
        self.image.hand_over(new_pool, f"leader switch to {self.config.experts[new].label()}", self._changes)
        self.leader = new
        self.leader_switches += 1

    def pin(self, key: int, parent: int | None, position: int, nbytes: int, tenant: int = 0) -> list[Change]:
        """Pin ``key`` in every expert (so it stays pinned across leader switches)."""
        for pool in self.experts:
            pool.pin(key, parent, position, nbytes, tenant)
        return self.drain(settle=True)

    def unpin(self, key: int) -> list[Change]:
        """Release a pin in every expert."""
        for pool in self.experts:
            pool.unpin(key)
        return self.drain(settle=True)

    def restore(self, key: int, parent: int | None, position: int, nbytes: int, base_slot: int,
                tenant: int = 0) -> None:
        """Take ``key`` as held by the switch at ``base_slot`` in every expert (adopting a warm switch).

        Every expert starts from what the switch holds, as after a hand-over; nothing is
        written (no change is emitted). Raises (AllocatorError, QuotaError) when the chunk
        does not fit where it is; the experts that took it keep it, so check first with
        :meth:`can_restore`.
        """
        for pool in self.experts:
            pool.restore(key, parent, position, nbytes, tenant, base_slot)
        self.image.restore(key, base_slot, self.pool.slots_for(nbytes), tenant)

    def can_restore(self, nbytes: int, base_slot: int) -> bool:
        """Whether a chunk of ``nbytes`` at ``base_slot`` fits every expert (free slots, room in main)."""
        for pool in self.experts:
            n = pool.slots_for(nbytes)
            if pool.main_used + n > pool.main_slots or not pool.allocator.is_free(base_slot, n):
                return False
        return self.image.can_restore(base_slot, self.pool.slots_for(nbytes))

    def holds(self, key: int) -> bool:
        """Whether the switch holds ``key`` (the leader's chunk, or a leftover of an earlier leader)."""
        return self.image.holds(key)

    def evict_leftover(self, key: int, action: EvictAction, why: str = "evicted by operator") -> list[Change]:
        """Evict ``key``, held by the switch but by no leader (a leftover), now, and settle; KeyError if not one."""
        target = self.pool.layout.demotion_target(self.tier) if action is EvictAction.DEMOTE else None
        self.image.drop(key, action, target, why, self._changes)
        return self.drain(settle=True)
