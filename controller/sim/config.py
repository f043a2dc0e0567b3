"""Cluster and model configuration of the simulator, with validation that names the bad option."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from controller.policy.value import PrefillCost
from kvpool import contract
from kvpool.trace import BLOCK_TOKENS
from kvpool.wire import FRAG_PAYLOAD


class ConfigError(ValueError):
    """A nonsensical simulator option; the message names it."""


@dataclass(frozen=True)
class ModelSpec:
    """What the simulator needs of a model: KV bytes per token and a prefill cost model."""

    name: str
    kv_bytes_per_token: int
    n_params: float
    n_layers: int
    d_model: int
    #: prefill throughput at short context on one inference node (tokens/s)
    prefill_tokens_per_s: float

    def cost(self, block_tokens: int = BLOCK_TOKENS) -> PrefillCost:
        """The prefill FLOP model of this model."""
        return PrefillCost(self.n_params, self.n_layers, self.d_model, block_tokens)

    @property
    def flops_per_s(self) -> float:
        """Effective FLOP/s of a node, calibrated so short prompts prefill at ``prefill_tokens_per_s``."""
        return self.prefill_tokens_per_s * 2.0 * self.n_params


#: KV bytes/token = 2 (K and V) x layers x KV heads x head dim x 2 bytes (bf16)
MODELS: dict[str, ModelSpec] = {
    "qwen2.5-0.5b": ModelSpec("qwen2.5-0.5b", 2 * 24 * 2 * 64 * 2, 0.49e9, 24, 896, 40_000.0),
    "llama3-8b": ModelSpec("llama3-8b", 2 * 32 * 8 * 128 * 2, 8.0e9, 32, 4096, 8_000.0),
    "llama3-70b": ModelSpec("llama3-70b", 2 * 80 * 8 * 128 * 2, 70.6e9, 80, 8192, 1_200.0),
}

ROUTINGS = ("random", "round_robin", "affinity")
#: what a node does with a chunk its GPU memory evicts: demote every one to host DRAM, only those
#: it used more than once, or none (drop)
DEMOTE_MODES = ("all", "reused", "none")


@dataclass(frozen=True)
class ClusterConfig:
    """The modelled cluster: nodes, holders, switches, links, tiers, model."""

    nodes: int = 64
    holders: int = 4
    switches: int = 1
    switch_mib: float = 1536.0
    hbm_gib: float = 8.0
    dram_gib: float = 32.0
    pool_gib: float = 0.0  # 0: the holders' DRAM pool keeps everything
    node_gbps: float = 100.0
    holder_gbps: float = 100.0
    pcie_gbps: float = 200.0
    switch_rtt_us: float = 5.0
    holder_rtt_us: float = 25.0
    model: ModelSpec = field(default_factory=lambda: MODELS["qwen2.5-0.5b"])
    block_tokens: int = BLOCK_TOKENS
    slot_bytes: int = FRAG_PAYLOAD
    routing: str = "random"
    #: HBM evictions: "all" demoted to host DRAM, "reused" only chunks the node used twice, "none" dropped
    demote: str = "all"
    #: a chunk fetched from the pool or the switch is kept in the node's HBM after its first use (1)
    #: or only from its second use at that node on (2); chunks a node computes are always kept
    promote_after: int = 1
    #: chunks a request computes pass the switch on their way to the holders; with ``fill_on_write``
    #: the switch policy may admit them then (the pass fills them), so a session's next turn on
    #: another node can find them in the switch (Mooncake-style prefetch of the next turn)
    fill_on_write: bool = False
    #: affinity routing: the share of recent requests one node may take above its fair share
    affinity_slack: float = 1.0
    coalesce: bool = True
    #: coalescing pending slots per switch, direct-mapped by chunk key as in the P4 program: a fetch
    #: whose slot another chunk's outstanding fetch holds is not coalesced (0: unlimited)
    pending_slots: int = 0
    #: hosts per switch with a waiter id, the only ones whose fetches coalesce (0: unlimited)
    max_waiters: int = 0
    #: controller CPU time per control message (table write, directory update), for the overhead model
    ctrl_msg_us: float = 50.0
    seed: int = 0

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first nonsensical option."""
        positive_int = ("nodes", "holders", "switches", "block_tokens", "slot_bytes")
        for name in positive_int:
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        positive = ("hbm_gib", "node_gbps", "holder_gbps", "pcie_gbps")
        for name in positive:
            v = getattr(self, name)
            if not v > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {v!r}")
        for name in ("pending_slots", "max_waiters"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a non-negative integer, got {v!r}")
        non_negative = ("switch_mib", "dram_gib", "pool_gib", "switch_rtt_us", "holder_rtt_us", "ctrl_msg_us")
        for name in non_negative:
            v = getattr(self, name)
            if not v >= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be non-negative, got {v!r}")
        if self.switches > self.nodes:
            raise ConfigError(f"--switches ({self.switches}) cannot exceed --nodes ({self.nodes})")
        if self.routing not in ROUTINGS:
            raise ConfigError(f"--routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if self.demote not in DEMOTE_MODES:
            raise ConfigError(f"--demote must be one of {', '.join(DEMOTE_MODES)}, got {self.demote!r}")
        if self.promote_after not in (1, 2):
            raise ConfigError(f"--promote-after must be 1 or 2, got {self.promote_after!r}")
        if self.affinity_slack < 0:
            raise ConfigError(f"--affinity-slack must be non-negative, got {self.affinity_slack!r}")
        if self.hbm_gib * 2**30 < self.chunk_bytes:
            raise ConfigError(f"--hbm-gib {self.hbm_gib} holds not even one {self.chunk_bytes}-byte chunk")
        if self.pool_gib and self.pool_gib * 2**30 < self.chunk_bytes:
            raise ConfigError(f"--pool-gib {self.pool_gib} holds not even one chunk")

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one full block's KV."""
        return self.block_tokens * self.model.kv_bytes_per_token

    @property
    def slots_per_chunk(self) -> int:
        """Switch slots (fragments) per chunk."""
        return -(-self.chunk_bytes // self.slot_bytes)

    @property
    def switch_bytes(self) -> int:
        """Pool bytes per switch."""
        return int(self.switch_mib * 2**20)

    @property
    def switch_chunks(self) -> int:
        """Whole chunks one switch pool holds (paged into slots)."""
        return (self.switch_bytes // self.slot_bytes) // self.slots_per_chunk

    def blocks_in(self, gib: float) -> int:
        """Whole chunks that fit in ``gib`` GiB."""
        return int(gib * 2**30) // self.chunk_bytes



@dataclass(frozen=True)
class SwitchPreset:
    """What one switch of a real target holds, as ClusterConfig fields."""

    switch_mib: float
    pending_slots: int
    max_waiters: int

    def apply(self, cfg: ClusterConfig) -> ClusterConfig:
        """``cfg`` with this switch."""
        return replace(cfg, switch_mib=self.switch_mib, pending_slots=self.pending_slots,
                       max_waiters=self.max_waiters)


#: Switches that exist (``kvpool sim --switch-preset``, q4's ``tofino1``).  ``tofino1``: the TNA
#: program on one Tofino 1 pipe (p4/README.md, "v1model and TNA"): 2,048 pending slots and 32
#: waiters per switch, and no pool memory for KV chunks: its pool serves only fragments of at
#: most 32 bytes, and every fragment of a KV chunk but the last carries 1,408.
SWITCH_PRESETS: dict[str, SwitchPreset] = {
    "tofino1": SwitchPreset(0.0, contract.TNA_PENDING_SLOTS, contract.TNA_MAX_WAITERS),
}
