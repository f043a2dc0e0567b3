"""Seeded link impairment for the model switch's ports: loss, duplication, reordering, bit flips.

This kernel has no ``sch_netem``, so ``tc qdisc ... netem`` (and Mininet's link loss and
jitter, which use it) cannot impair the links of an emulated network.  The model switch
does it itself, where frames enter and leave it: a *channel* is one switch port in one
direction (``in``: frames the port received, before the pipeline sees them; ``out``:
frames the pipeline sends out of the port), and each channel draws from its own
``random.Random`` seeded by ``(seed, port, direction)``, so the same frames in the same
order meet the same fate on every run.

A spec is ``PORT:DIR:key=value,...`` with ``PORT`` a port number or ``*`` (every port
without a spec of its own), ``DIR`` one of ``in``, ``out``, ``both``, and the keys:

* ``loss``: probability that a frame is dropped;
* ``dup``: probability that a surviving frame is sent twice;
* ``corrupt``: probability that a copy gets exactly one bit flipped, uniformly over all
  bits of the Ethernet frame (most land in the payload of a DATA frame);
* ``reorder``: probability that a copy is held back ``delay_ms`` milliseconds while the
  frames behind it go on (so it arrives after them);
* ``delay_ms``: how long a reordered copy is held (default 5);
* ``seed``: the channel's seed (default 0).

For example ``2:in:loss=0.1,seed=7`` or ``*:both:corrupt=0.01``.  Decisions per frame:
loss first (one draw), then duplication (one draw), then per copy corruption (one draw,
plus one for the bit) and reordering (one draw); a draw is made only for a non-zero
probability.

At run time, ``ImpairFile`` watches a file of specs (one per line, ``#`` comments): when
the file exists its specs replace the ones given on the command line, an empty file
means no impairment, and deleting it restores the command line's.  A test stops an
impairment by writing an empty file (``kvpool-switch --impair-file PATH``).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

DIRECTIONS: Final = ("in", "out")
_DIR_CHOICES: Final = ("in", "out", "both")
_PROBABILITIES: Final = ("loss", "dup", "reorder", "corrupt")
MAX_DELAY_MS: Final = 10_000.0
MAX_PORT: Final = 510
"""Largest switch port a spec may name (511 is v1model's drop port)."""


@dataclass(frozen=True, slots=True)
class Impairment:
    """What happens to the frames of one channel; every probability is in 0..1."""

    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    delay_ms: float = 5.0
    corrupt: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in _PROBABILITIES:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"impairment {name}={value}: must be a probability in 0..1")
        if not 0.0 < self.delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"impairment delay_ms={self.delay_ms}: must be in (0, {MAX_DELAY_MS:g}]")
        if self.seed < 0:
            raise ValueError(f"impairment seed={self.seed}: must be >= 0")

    @property
    def active(self) -> bool:
        """True when some frame can be affected."""
        return any(getattr(self, name) > 0 for name in _PROBABILITIES)


_FIELD_TYPES: Final = {f.name: (int if f.name == "seed" else float) for f in dataclasses.fields(Impairment)}


@dataclass(frozen=True, slots=True)
class ImpairSpec:
    """An impairment bound to a port (None: every port without its own spec) and direction."""

    port: int | None
    direction: str
    impairment: Impairment

    @classmethod
    def parse(cls, text: str) -> ImpairSpec:
        """Parse ``PORT:DIR:key=value,...``; ``ValueError`` with a one-line reason otherwise."""
        parts = text.strip().split(":")
        if len(parts) != 3:
            raise ValueError(f"impairment {text!r}: expected PORT:DIR:key=value,..., "
                             "e.g. 2:in:loss=0.1,seed=7")
        port_text, direction, params = (p.strip() for p in parts)
        port: int | None
        if port_text == "*":
            port = None
        elif port_text.isdigit() and int(port_text) <= MAX_PORT:
            port = int(port_text)
        else:
            raise ValueError(f"impairment {text!r}: port must be 0..{MAX_PORT} or *")
        if direction not in _DIR_CHOICES:
            raise ValueError(f"impairment {text!r}: direction must be one of {', '.join(_DIR_CHOICES)}")
        values: dict[str, float | int] = {}
        for item in filter(None, (p.strip() for p in params.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip()
            kind = _FIELD_TYPES.get(key)
            if not sep or kind is None:
                raise ValueError(f"impairment {text!r}: {item!r} is not key=value with a key from "
                                 f"{', '.join(_FIELD_TYPES)}")
            try:
                values[key] = kind(raw.strip())
            except ValueError:
                raise ValueError(f"impairment {text!r}: {key} must be {kind.__name__}, got {raw.strip()!r}") from None
        return cls(port, direction, Impairment(**values))  # type: ignore[arg-type]

    def __str__(self) -> str:
        imp = self.impairment
        port = "*" if self.port is None else str(self.port)
        params = ",".join(f"{f}={getattr(imp, f):g}" for f in (*_PROBABILITIES, "delay_ms"))
        return f"{port}:{self.direction}:{params},seed={imp.seed}"

    def directions(self) -> tuple[str, ...]:
        """The channel directions this spec covers."""
        return DIRECTIONS if self.direction == "both" else (self.direction,)


def parse_specs(lines: Iterable[str]) -> list[ImpairSpec]:
    """Specs from lines of text (blank lines and ``#`` comments skipped); ``ValueError`` if one is bad.

    The same port and direction named twice is an error (``*`` counts as its own port).
    """
    specs: list[ImpairSpec] = []
    seen: set[tuple[int | None, str]] = set()
    for line in lines:
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        spec = ImpairSpec.parse(text)
        for d in spec.directions():
            if (spec.port, d) in seen:
                port = "*" if spec.port is None else spec.port
                raise ValueError(f"impairment {text!r}: port {port} direction {d} already has one")
            seen.add((spec.port, d))
        specs.append(spec)
    return specs


@dataclass
class ChannelStats:
    """What a channel did: frames seen and what happened to them."""

    frames: int = 0
    lost: int = 0
    duplicated: int = 0
    corrupted: int = 0
    reordered: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return dataclasses.asdict(self)


@dataclass
class _Channel:
    impairment: Impairment
    rng: random.Random
    stats: ChannelStats = field(default_factory=ChannelStats)

    def apply(self, frame: bytes) -> list[tuple[float, bytes]]:
        """The copies of ``frame`` that leave this channel, each with its hold time in seconds."""
        imp, rnd = self.impairment, self.rng.random
        self.stats.frames += 1
        if imp.loss and rnd() < imp.loss:
            self.stats.lost += 1
            return []
        copies = [frame]
        if imp.dup and rnd() < imp.dup:
            copies.append(frame)
            self.stats.duplicated += 1
        out: list[tuple[float, bytes]] = []
        for copy in copies:
            if imp.corrupt and copy and rnd() < imp.corrupt:
                copy = flip_bit(copy, self.rng.randrange(len(copy) * 8))
                self.stats.corrupted += 1
            hold = 0.0
            if imp.reorder and rnd() < imp.reorder:
                hold = imp.delay_ms / 1000.0
                self.stats.reordered += 1
            out.append((hold, copy))
        return out


def flip_bit(frame: bytes, bit: int) -> bytes:
    """``frame`` with bit ``bit`` flipped (bit 0 is the most significant bit of byte 0)."""
    byte, shift = divmod(bit, 8)
    buf = bytearray(frame)
    buf[byte] ^= 0x80 >> shift
    return bytes(buf)


class Impairer:
    """Applies impairment specs to the frames of a switch's ports and holds the delayed ones.

    Not thread-safe: the port loop owns it (``ingress``, ``egress``, ``due``, ``configure``).
    """

    def __init__(self, specs: Sequence[ImpairSpec] = ()) -> None:
        self._specs: tuple[ImpairSpec, ...] = ()
        self._channels: dict[tuple[int | None, str], _Channel] = {}
        self._held: list[tuple[float, int, str, int, bytes]] = []
        self._seq = itertools.count()
        self._retired: dict[str, ChannelStats] = {}
        self.configure(specs)

    @property
    def specs(self) -> tuple[ImpairSpec, ...]:
        """The specs in force."""
        return self._specs

    @property
    def active(self) -> bool:
        """True when a spec in force can affect a frame, or frames are still held back."""
        return bool(self._channels) or bool(self._held)

    def configure(self, specs: Sequence[ImpairSpec]) -> None:
        """Put ``specs`` in force, every channel with a fresh generator; frames already held stay held."""
        for (port, direction), ch in self._channels.items():
            name = f"{'*' if port is None else port}:{direction}"
            old = self._retired.setdefault(name, ChannelStats())
            for k, v in ch.stats.as_dict().items():
                setattr(old, k, getattr(old, k) + v)
        self._specs = tuple(specs)
        self._channels = {}
        for spec in specs:
            if not spec.impairment.active:
                continue
            for d in spec.directions():
                label = "*" if spec.port is None else str(spec.port)
                rng = random.Random(f"kvpool-impair:{spec.impairment.seed}:{label}:{d}")
                self._channels[(spec.port, d)] = _Channel(spec.impairment, rng)

    def _channel(self, port: int, direction: str) -> _Channel | None:
        ch = self._channels.get((port, direction))
        return ch if ch is not None else self._channels.get((None, direction))

    def _pass(self, direction: str, port: int, frame: bytes, now: float) -> list[bytes]:
        ch = self._channel(port, direction)
        if ch is None:
            return [frame]
        out: list[bytes] = []
        for hold, copy in ch.apply(frame):
            if hold > 0:
                heapq.heappush(self._held, (now + hold, next(self._seq), direction, port, copy))
            else:
                out.append(copy)
        return out

    def ingress(self, port: int, frame: bytes, now: float) -> list[bytes]:
        """Frames received on ``port`` that reach the pipeline now (held ones come from ``due``)."""
        return self._pass("in", port, frame, now)

    def egress(self, port: int, frame: bytes, now: float) -> list[bytes]:
        """Frames for ``port`` that leave now (held ones come from ``due``)."""
        return self._pass("out", port, frame, now)

    def next_due(self) -> float | None:
        """When the earliest held frame is due (monotonic seconds), or None."""
        return self._held[0][0] if self._held else None

    def due(self, now: float) -> list[tuple[str, int, bytes]]:
        """Held frames whose time has come, as ``(direction, port, frame)`` in due order."""
        out: list[tuple[str, int, bytes]] = []
        while self._held and self._held[0][0] <= now:
            _, _, direction, port, frame = heapq.heappop(self._held)
            out.append((direction, port, frame))
        return out

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters per channel (``PORT:DIR``, ``*`` for the catch-all), over every configuration."""
        out = {name: s.as_dict() for name, s in self._retired.items()}
        for (port, direction), ch in self._channels.items():
            name = f"{'*' if port is None else port}:{direction}"
            prev = out.get(name, ChannelStats().as_dict())
            out[name] = {k: prev[k] + v for k, v in ch.stats.as_dict().items()}
        return out


class ImpairFile:
    """A file of specs that replaces the command line's while it exists (checked at most every 0.1 s)."""

    CHECK_INTERVAL: Final = 0.1

    def __init__(self, path: Path, fallback: Sequence[ImpairSpec] = ()) -> None:
        self.path = path
        self.fallback = tuple(fallback)
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0

    def poll(self, now: float) -> list[ImpairSpec] | None:
        """The specs to put in force if the file changed since the last call, else None.

        A file that cannot be parsed is logged and ignored (the specs in force stay).
        """
        if now < self._next_check:
            return None
        self._next_check = now + self.CHECK_INTERVAL
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        if stamp is None:
            log.info("impairment file %s gone: back to the command line's specs", self.path)
            return list(self.fallback)
        try:
            specs = parse_specs(self.path.read_text().splitlines())
        except (OSError, ValueError) as exc:
            log.error("impairment file %s ignored: %s", self.path, exc)
            return None
        log.info("impairment from %s: %s", self.path, "; ".join(map(str, specs)) or "none")
        return specs
