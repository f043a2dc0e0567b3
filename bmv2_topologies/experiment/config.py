"""What one experiment run is told: the demo's configuration and the side-by-side's.

Standard library only, so the CLIs can read the defaults without loading the harness.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

MODES = ("plain", "multicast", "pool")
"""How much the switch helps: forwarding only, coalescing + multicast, plus the switch pool."""
SYSTEMS = ("mooncake", "kvpool_plain", "kvpool_multicast", "kvpool_pool")
"""What the side-by-side compares: Mooncake Store alone, then kvpool in each mode in front of it."""
REQUESTER_COUNTS = (2, 4, 8, 16)
"""The side-by-side's default requester counts N, one network each."""
TOPOLOGIES = ("star", "leaf-spine")
"""Generated topologies (``kvpool.topology``); anything else names a topology JSON file."""
@dataclass(frozen=True)
class TargetKnobs:
    """What a run takes on one switch target unless told (``TARGET_KNOBS``)."""

    in_flight: int
    """Fragments each requester keeps in flight over all its chunks (``kvpool-agent --max-inflight``)."""
    chunk_window: int
    """Most fragments in flight for one chunk (``kvpool-agent --window``)."""
    servable_window: int = 0
    """Most fragments in flight for one chunk the switches pool (``kvpool-agent --servable-window``;
    0: ``chunk_window``)."""


TARGET_KNOBS: dict[str, TargetKnobs] = {"model": TargetKnobs(600, 600),
                                        "bmv2": TargetKnobs(600, 600, 4)}
"""Per switch target. Requesters keep the whole hot prefix in flight, as an engine fetching a
prefix asks for all of it: range GETs, one per window, which a paced holder answers at its
link's rate, so a large window costs BMv2 no burst.  Switches coalesce range GETs per chunk
(p4/include/coalesce.p4), and only GETs that meet while an answer is pending share it: with 64
in flight, 16 to a chunk, a requester worked through a few chunks at a time and a replayed
sysprompt trace on BMv2 saved 0.20 of what the ideal saves (multicast p50 1.04x plain's), 1.09
with the whole prefix asked at once (0.63x).  A chunk the switches pool keeps 4 in flight on
BMv2: a switch answers a pooled chunk's GETs at once, in one burst, and its queues hold 64
packets: 16 such answers per requester overflowed the spine's egress queues on the
leaf-spine (pool p50 2.6x faster than plain against 4.4x with 4)."""


def knobs_help(knob: str) -> str:
    """``knob`` of ``TARGET_KNOBS`` on every target, for ``--help``: "600 on the model, 600 on bmv2"."""
    return ", ".join(f"{getattr(k, knob)} on {'the model' if t == 'model' else t}" for t, k in TARGET_KNOBS.items())


@dataclass
class DemoConfig:
    """Everything one demo run needs (the CLI flags)."""

    requesters: int = 8
    target: str | None = None
    topology: str = "star"
    """``star``, ``leaf-spine`` or the path of a topology JSON file (its inference hosts are the requesters)."""
    leaves: int = 4
    spines: int = 2
    holders: int | None = None
    """Holder hosts (chunks dealt over them by prefix position); None: 1 on the star, 2 on the leaf-spine."""
    modes: tuple[str, ...] = MODES
    trace: Path | None = None
    max_requests: int = 64
    time_scale: float = 1.0
    waves: int = 4
    hot_blocks: int = 4
    tail_blocks: int = 0
    wave_gap_ms: float = 6000.0
    block_tokens: int = 16
    layers: int = 24
    kv_heads: int = 2
    head_dim: int = 64
    holder_mbps: float = 10.0
    host_mbps: float = 1000.0
    fabric_mbps: float = 1000.0
    out: Path = Path("results/demo")
    seed: int = 0
    deadline_s: float | None = None
    """Deadline of each replayed request (the caller's, given to the agent's fetch).  None: far
    beyond what the work implies (``load.default_deadline_s``: 10 x the replay's bytes at line
    rate, 60..3600 s), so a request fails only when its holder cannot be reached."""
    window: int | None = None
    """Fragments each requester keeps in flight; None: the target's (``TARGET_KNOBS``; on the
    model enough for the whole hot prefix, so every requester asks for all of it at once, as an
    engine fetching a prefix does)."""
    chunk_window: int | None = None
    """Most fragments in flight for one chunk (within ``window``); None: the target's (``TARGET_KNOBS``)."""
    servable_window: int | None = None
    """The same for a chunk the switches pool (they answer its GETs at once, in bursts); None: the
    target's, 0: ``chunk_window``."""
    max_queue_ms: float = 1000.0
    """Sending time the holder queues before it answers GETs BUSY with a retry hint (``--max-queue``)."""
    gather_ms: float = 0.0
    """How long a holder waits before it answers the head of a chunk the controller calls hot, so the
    GETs of a wave meet at a switch (``kvpool-agent --gather``; 0: at once).  Off: on the BMv2
    leaf-spine's waves 80 ms cut multicast's holder bytes from 0.17-0.21 of plain's to 0.13-0.15 in
    four runs of six, but on a replayed sysprompt trace (BMv2, 100 Mbit/s) it left requests waiting
    for their stall timers five times as often and made multicast slower than plain."""
    push_admitted: bool = False
    """Pool mode: the holder pushes each chunk the controller admits (``ControllerSettings.push_admitted``);
    False: the answers that cross the switch fill it."""
    impair: tuple[str, ...] = ()
    """Link impairments of the model switch (``switchmodel.impair`` specs, e.g. ``*:both:loss=0.1``)."""
    observe: bool = False
    """Run Prometheus beside the demo and draw the dashboard from it (``experiment.observe``)."""

    @property
    def in_flight(self) -> int:
        """The requesters' window: ``window``, else the target's (the model's when none is chosen yet)."""
        return self.window if self.window is not None else self.knobs.in_flight

    @property
    def chunk_fragments(self) -> int:
        """The most fragments one chunk keeps in flight: ``chunk_window``, else the target's, within ``in_flight``."""
        told = self.chunk_window if self.chunk_window is not None else self.knobs.chunk_window
        return max(2, min(told, self.in_flight))

    @property
    def servable_fragments(self) -> int:
        """The most fragments one pooled chunk keeps in flight (0: as any chunk, ``chunk_fragments``)."""
        told = self.servable_window if self.servable_window is not None else self.knobs.servable_window
        return max(2, min(told, self.chunk_fragments)) if told else 0

    @property
    def knobs(self) -> TargetKnobs:
        """The target's defaults (the model's when none is chosen yet)."""
        return TARGET_KNOBS[self.target or "model"]

    @property
    def holder_count(self) -> int:
        """Holders a generated topology gets (``holders``, else the topology's default)."""
        if self.holders is not None:
            return self.holders
        return 2 if self.topology == "leaf-spine" else 1

    @property
    def topology_file(self) -> Path | None:
        """The topology JSON file, when ``topology`` names one."""
        return None if self.topology in TOPOLOGIES else Path(self.topology)

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """One chunk: [layers, 2 (K and V), kv_heads, block_tokens, head_dim], fp16."""
        return (self.layers, 2, self.kv_heads, self.block_tokens, self.head_dim)

    def validate(self) -> None:
        """Raise ValueError naming the first nonsensical option."""
        checks = {
            "requesters": 1 <= self.requesters <= (32 if self.topology == "leaf-spine" else 16),
            "leaves": 1 <= self.leaves <= 16,
            "spines": 1 <= self.spines <= 8,
            "holders": self.holders is None or 1 <= self.holders <= 8,
            "fabric_mbps": self.fabric_mbps > 0,
            "waves": self.waves >= 1,
            "hot_blocks": self.hot_blocks >= 1,
            "tail_blocks": self.tail_blocks >= 0,
            "wave_gap_ms": self.wave_gap_ms > 0,
            "block_tokens": self.block_tokens >= 1,
            "holder_mbps": self.holder_mbps > 0,
            "host_mbps": self.host_mbps > 0,
            "max_requests": self.max_requests >= 1,
            "time_scale": self.time_scale > 0,
            "window": self.window is None or 1 <= self.window <= 4096,
            "chunk_window": self.chunk_window is None or 2 <= self.chunk_window <= 4096,
            "servable_window": self.servable_window is None or self.servable_window == 0
            or 2 <= self.servable_window <= 4096,
            "max_queue_ms": 0 <= self.max_queue_ms <= 60_000,
            "gather_ms": 0 <= self.gather_ms <= 1000,
            "deadline_s": self.deadline_s is None or 0 < self.deadline_s <= 3600,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')}: invalid value {getattr(self, name)!r}")
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
        path = self.topology_file
        if path is not None and not path.is_file():
            raise ValueError(f"--topology: {self.topology!r} is neither {' nor '.join(TOPOLOGIES)} nor a topology "
                             "JSON file")
        if self.impair:
            from switchmodel.impair import parse_specs  # standard library only

            try:
                parse_specs(self.impair)
            except ValueError as exc:
                raise ValueError(f"--impair: {exc}") from None
            if self.target == "bmv2":
                raise ValueError("--impair needs --target model: BMv2 has no impairment and this kernel no sch_netem")


@dataclass
class VsConfig:
    """One side-by-side run at one requester count (the flags of the script)."""

    # The network and the prefix are the demo's (its defaults, so the two stay alike).
    requesters: int = DemoConfig.requesters
    topology: str = DemoConfig.topology
    holders: int | None = DemoConfig.holders
    waves: int = 5
    hot_blocks: int = DemoConfig.hot_blocks
    holder_mbps: float = DemoConfig.holder_mbps
    target: str | None = None
    systems: tuple[str, ...] = SYSTEMS
    window: int | None = DemoConfig.window
    settle_s: float = 2.0
    """Pause between waves: pending GETs time out, and in pool mode the controller admits and fills."""
    segment_mib: int = 256
    out: Path = Path("results/vs_mooncake")
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first nonsensical option."""
        for s in self.systems:
            if s not in SYSTEMS:
                raise ValueError(f"--systems: unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
        if self.settle_s < 0:
            raise ValueError(f"--settle-s: invalid value {self.settle_s!r}")
        if self.segment_mib < 16:
            raise ValueError(f"--segment-mib: at least 16, got {self.segment_mib}")
        self.demo_config().validate()

    def demo_config(self) -> DemoConfig:
        """The demo's configuration for the same network and stream (waves of the hot prefix only)."""
        modes = tuple(s.removeprefix("kvpool_") for s in self.systems if s.startswith("kvpool_"))
        return DemoConfig(requesters=self.requesters, target=self.target, topology=self.topology,
                          holders=self.holders, modes=modes, waves=self.waves,
                          hot_blocks=self.hot_blocks, tail_blocks=0, holder_mbps=self.holder_mbps,
                          window=self.window, out=self.out / f"n{self.requesters}",
                          seed=self.seed)

    def for_counts(self, counts: list[int]) -> list[VsConfig]:
        """This configuration at each requester count N, validated (ValueError names the first bad option)."""
        configs = [replace(self, requesters=n) for n in counts]
        for cfg in configs:
            cfg.validate()
        return configs
