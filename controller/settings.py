"""The controller daemon's configuration: its mode, where the switches listen, its settings.

One place for what :class:`controller.daemon.Controller` is told besides the topology, so
the CLI, the experiments and the tests build it the same way. :class:`ControllerError` is
the daemon's one error type (bad catalog, unknown chunk, no space).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from controller.fabric import FabricSettings
from controller.hints import HintSettings
from kvpool import contract as n
from kvpool.contract import POOL_SLOTS


class Mode(enum.StrEnum):
    """How much the switches help: the three ways the demo runs the same stream."""

    PLAIN = "plain"
    MULTICAST = "multicast"
    POOL = "pool"


class ControllerError(RuntimeError):
    """The controller cannot do what it was asked (bad catalog, unknown chunk, no space)."""



@dataclass(frozen=True)
class SwitchEndpoint:
    """Where one switch's P4Runtime server listens."""

    name: str
    address: str
    device_id: int = 1


@dataclass
class ControllerSettings:
    """Everything the controller needs besides the topology and the switches."""

    mode: Mode = Mode.POOL
    p4info: Path = n.P4INFO_PATH
    bmv2_json: Path | None = n.BMV2_JSON_PATH
    epoch_s: float = 0.5
    pool_slots: int = POOL_SLOTS
    fabric: FabricSettings = field(default_factory=FabricSettings)
    epochs_per_sketch_epoch: int = 20
    max_observations_per_digest: int = 64
    connect_timeout_s: float = 10.0
    heartbeat_timeout_s: float = 3.0
    #: what the switches run ("bmv2", "model"), shown to operators
    target: str = "unknown"
    #: keep the pool a warm switch holds (False: start from an empty pool, e.g. a fresh experiment mode)
    adopt: bool = True
    #: longest wait between two reconnect attempts to a switch that is down
    reconnect_backoff_s: float = 1.0
    #: how long a chunk stays hot and how often agents hear about hot and pooled chunks
    hints: HintSettings = field(default_factory=HintSettings)
    #: ask the holder to push each newly admitted chunk (False: the answers that cross its
    #: switch fill it, as they do anyway). A push costs the holder's link a copy whether or not
    #: the chunk is asked for again (docs/design/notes-daemon.md). Chunks a restarted switch
    #: held and chunks moved to a new placement are always pushed.
    push_admitted: bool = False
