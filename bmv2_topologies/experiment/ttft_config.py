"""What the ttft experiment is told: the model every inference host runs, and the run's shape.

Standard library only, so ``kvpool experiment --help`` reads the defaults without torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bmv2_topologies.experiment.config import MODES

SCHEMES = ("serial", "shared")
"""How the hosts share this machine's cores: one computes at a time (its wait left out of TTFT), or all at once."""
ENGINES = ("transformers", "vllm")
"""What runs the model on a host: ``bmv2_topologies.ttft_host`` (transformers, driven by hand) or
``bmv2_topologies.vllm_host`` (vLLM with ``KvpoolConnector``, in the vLLM venv)."""
VLLM_BLOCK_TOKENS = 32
"""vLLM's CPU attention wants blocks of a multiple of 32 tokens; a chunk is one block."""


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-style decoder built from a config with a fixed seed (no weights are downloaded).

    The default has Qwen2.5-0.5B's compute per byte of KV (about 58 kFLOP of prefill per
    byte of cache): 4 layers of width 1024 with one KV head (multi-query attention), fp32.
    """

    layers: int = 4
    hidden: int = 1024
    heads: int = 16
    kv_heads: int = 1
    intermediate: int = 4096
    vocab: int = 8192
    seed: int = 0

    @property
    def head_dim(self) -> int:
        """Per-head width (hidden / heads)."""
        return self.hidden // self.heads

    @property
    def model_id(self) -> str:
        """The model id in the chunk keys: equal specs give equal keys on every host."""
        return (f"kvpool-ttft/llama-L{self.layers}-H{self.hidden}-A{self.heads}-K{self.kv_heads}-"
                f"I{self.intermediate}-V{self.vocab}-seed{self.seed}")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of fp32 K and V one token adds to the cache, all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * 4

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token through the layers (2 per multiply-add; attention scores and the head left out)."""
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return 2 * self.layers * (attn + mlp)

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.intermediate, self.vocab) < 1:
            raise ValueError(f"model: every size must be positive, got {self}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"model: hidden {self.hidden} must divide by heads {self.heads}, "
                             f"heads by kv_heads {self.kv_heads}")

    def to_json(self) -> str:
        """The spec as one JSON object (the host's ``--model``)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """The spec from ``to_json``'s text (ValueError on unknown or missing fields)."""
        try:
            spec = cls(**json.loads(text))
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"--model: not a model spec: {exc}") from None
        spec.validate()
        return spec


QUICK_MODEL = ModelSpec(layers=2, hidden=256, heads=4, kv_heads=1, intermediate=1024, vocab=1024)
"""The quick run's model: prefill in milliseconds, so the test suite measures the plumbing, not the CPU."""


@dataclass
class TtftConfig:
    """One ttft run: requester counts, modes, compute schemes, waves, prompt sizes, the sweep, the network."""

    requesters: tuple[int, ...] = (1, 4, 8)
    modes: tuple[str, ...] = MODES
    schemes: tuple[str, ...] = SCHEMES
    waves: int = 3
    """Waves per (scheme, requester count, mode); every requester of a wave starts at the same instant."""
    prefix_tokens: int = 512
    """The shared prefix (a hot system prompt), published on the holder; a multiple of ``block_tokens``."""
    suffix_tokens: int = 40
    """Each request's own tokens after the prefix (different for every requester and wave)."""
    sweep_tokens: tuple[int, ...] = (64, 128, 256, 512, 1024)
    """Prefix lengths of the break-even sweep (one requester, full prefill vs fetch + the rest)."""
    sweep_reps: int = 3
    block_tokens: int = 16
    steps: int = 8
    """Greedy tokens generated per request (all compared between full prefill and fetched KV)."""
    model: ModelSpec = field(default_factory=ModelSpec)
    threads: int = 1
    """torch threads per host."""
    holder_mbps: float = 20.0
    target: str = "model"
    """The switch: the model by default, not the demo's "BMv2 when installed": the figures are a
    balance of CPU and link, and BMv2 on a small VM forwards a few thousand packets a second
    (p4/README.md), which the figures would measure instead of the fetch."""
    settle_s: float = 2.0
    """Pause between waves: pending GETs time out, and in pool mode the controller admits and fills."""
    fetch_timeout_s: float = 60.0
    seed: int = 0
    quick: bool = False
    engine: str = "transformers"
    """One of ``ENGINES``; ``vllm`` needs ``block_tokens`` a multiple of ``VLLM_BLOCK_TOKENS``."""

    @classmethod
    def for_quick(cls, **changes: object) -> TtftConfig:
        """The reduced run the tests use (under a minute): 1 and 2 requesters, a tiny model, one wave."""
        base: dict[str, object] = {
            "requesters": (1, 2), "modes": ("plain", "multicast"), "schemes": ("serial",), "waves": 1,
            "prefix_tokens": 128, "suffix_tokens": 8, "sweep_tokens": (32, 128), "sweep_reps": 1, "steps": 4,
            "model": QUICK_MODEL, "settle_s": 0.5, "fetch_timeout_s": 30.0, "quick": True,
        }
        return cls(**(base | changes))  # type: ignore[arg-type]

    @property
    def published_tokens(self) -> int:
        """Tokens of the prefix the holder publishes: the longest any request or sweep point reads."""
        return max(self.prefix_tokens, *self.sweep_tokens)

    def validate(self) -> None:
        """Raise ValueError naming the first nonsensical option."""
        # Imported here: the network module pulls in the switch model and P4Runtime, which the hosts'
        # processes (ttft_host, and vllm_host in the vLLM venv) need not have.
        from bmv2_topologies.network import TARGETS

        self.model.validate()
        b = self.block_tokens
        checks = {
            "requesters": bool(self.requesters) and all(1 <= n <= 16 for n in self.requesters),
            "waves": self.waves >= 1,
            "block_tokens": b >= 1,
            "prefix_tokens": self.prefix_tokens >= b and self.prefix_tokens % max(b, 1) == 0,
            "suffix_tokens": self.suffix_tokens >= 1,
            "sweep_tokens": all(p >= b and p % max(b, 1) == 0 for p in self.sweep_tokens),
            "sweep_reps": self.sweep_reps >= 1,
            "steps": self.steps >= 1,
            "threads": self.threads >= 1,
            "holder_mbps": self.holder_mbps > 0,
            "settle_s": self.settle_s >= 0,
            "fetch_timeout_s": self.fetch_timeout_s > 0,
            "target": self.target in TARGETS,
            "engine": self.engine in ENGINES,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ttft: {name.replace('_', '-')}: invalid value {getattr(self, name)!r}"
                                 + (f" (a multiple of block-tokens {b})" if name in ("prefix_tokens", "sweep_tokens")
                                    else ""))
        if self.engine == "vllm" and b % VLLM_BLOCK_TOKENS:
            raise ValueError(f"ttft: block-tokens {b}: vLLM's CPU attention wants a multiple of {VLLM_BLOCK_TOKENS}")
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"ttft: unknown mode {m!r}; choose from {', '.join(MODES)}")
        for s in self.schemes:
            if s not in SCHEMES:
                raise ValueError(f"ttft: unknown compute scheme {s!r}; choose from {', '.join(SCHEMES)}")

    def jsonable(self) -> dict[str, object]:
        """The configuration as plain JSON values (result.json's ``config``)."""
        d = asdict(self)
        d["model"] = asdict(self.model)
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
