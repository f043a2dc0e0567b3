"""PTF-style targets for the data-plane tests: the same test drives the model or BMv2.

A ``Target`` is a switch programmed over P4Runtime (``self.sw``, the controller's
driver) with ports 1..N that a test sends frames into and expects frames out of:

* ``ModelTarget``: the reference model in this process: ``SwitchState`` + its P4Runtime
  gRPC server on a free loopback port + ``KvpoolPipeline`` behind in-memory ports.
  Outputs are produced synchronously, so "no other packets" needs no waiting.
* ``VethTarget``: a switch process (``simple_switch_grpc`` or ``kvpool-switch``) on the
  switch side of veth pairs, the test on the host side through raw sockets in a
  network namespace of its own.  Needs root; BMv2 also needs ``simple_switch_grpc``.

Every target starts each test from a freshly pushed pipeline (empty tables, zeroed
registers and counters), so tests never see each other's state.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Final

from controller.p4runtime import P4RuntimeSwitch
from kvpool import contract
from switchmodel.p4rt_server import P4RuntimeServer
from switchmodel.pipeline import KvpoolPipeline
from switchmodel.ports import MemoryPorts
from switchmodel.state import SwitchState
from switchmodel.targets import Process, start_bmv2, start_model
from switchmodel.vethlab import VethLab

from .packets import Mask, describe

ROOT: Final = Path(__file__).resolve().parents[2]
BUILD: Final = contract.build_dir()
"""Compiled program (``KVPOOL_P4_BUILD`` points elsewhere, e.g. at a fresh p4c output)."""
P4INFO: Final = BUILD / contract.P4INFO_FILE
BMV2_JSON: Final = BUILD / contract.BMV2_JSON_FILE
N_PORTS: Final = 4
DEVICE_ID: Final = 1
LOG_DIR: Final = ROOT / "logs" / "dataplane"


class Target(ABC):
    """A programmed switch with ports 1..N_PORTS, PTF style."""

    name: str
    sw: P4RuntimeSwitch
    #: Seconds to wait for a frame that should come out (0 for synchronous targets).
    wait_s: float
    #: Seconds to wait before declaring that no other frame came out.
    quiet_s: float

    def __init__(self) -> None:
        self.received: dict[int, collections.deque[bytes]] = collections.defaultdict(collections.deque)

    @abstractmethod
    def send(self, port: int, frame: bytes) -> None:
        """Inject ``frame`` as received by the switch on ``port``."""

    @abstractmethod
    def _poll(self) -> None:
        """Move frames the switch sent since the last call into ``self.received``."""

    @abstractmethod
    def close(self) -> None:
        """Stop everything this target started."""

    def connect(self, address: str) -> None:
        """Connect the driver, win arbitration and push a fresh pipeline (clean slate)."""
        self.sw = P4RuntimeSwitch(address, P4INFO, BMV2_JSON if BMV2_JSON.exists() else None,
                                  device_id=DEVICE_ID, reconnect=False, timeout_s=10.0)
        self.sw.connect()
        # A forced push: connect() keeps a pipeline whose cookie matches, with its registers.
        self.sw.push_pipeline()

    def expect(self, port: int, expected: bytes | Mask, timeout: float | None = None) -> bytes:
        """Wait for a frame on ``port`` that matches ``expected``; return it (fail otherwise).

        Frames that arrived on the port but do not match stay queued, so a later
        ``expect_no_other_packets`` reports them.
        """
        mask = expected if isinstance(expected, Mask) else Mask(expected)
        deadline = time.monotonic() + (self.wait_s if timeout is None else timeout)
        while True:
            self._poll()
            queue = self.received[port]
            for frame in list(queue):
                if mask.matches(frame):
                    queue.remove(frame)
                    return frame
            if time.monotonic() >= deadline:
                break
            time.sleep(0.002)
        seen = "\n  ".join(f"{describe(f)} [{mask.diff(f)}]" for f in self.received[port]) or "nothing"
        raise AssertionError(f"{self.name}: expected on port {port}: {describe(mask.expected)}\n"
                             f"  got: {seen}")

    def expect_no_other_packets(self, timeout: float | None = None) -> None:
        """Fail if any frame came out that no ``expect`` consumed."""
        time.sleep(self.quiet_s if timeout is None else timeout)
        self._poll()
        left = {p: [describe(f) for f in q] for p, q in self.received.items() if q}
        for q in self.received.values():
            q.clear()
        assert not left, f"{self.name}: unexpected frames: {left}"

    def counter(self, name: str, index: int) -> int:
        """Packets counted in one cell of an indexed counter, read over P4Runtime."""
        return self.sw.read_counter(name, index)[index].packets

    def counters(self, name: str) -> dict[int, int]:
        """Non-zero cells of an indexed counter (index -> packets)."""
        return {i: v.packets for i, v in self.sw.read_counter(name).items() if v.packets}


class ModelTarget(Target):
    """The reference model in-process: real gRPC server and pipeline, in-memory ports."""

    name = "model"
    wait_s = 0.0
    quiet_s = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.state = SwitchState(device_id=DEVICE_ID)
        self.pipeline = KvpoolPipeline(self.state)
        self.ports = MemoryPorts(self.pipeline)
        self.server = P4RuntimeServer(self.state, "127.0.0.1:0").start()
        self.connect(f"127.0.0.1:{self.server.port}")

    def send(self, port: int, frame: bytes) -> None:
        """Run the frame through the pipeline now; outputs queue per port."""
        self.ports.inject(port, frame)

    def _poll(self) -> None:
        for port, frame in self.ports.drain():
            self.received[port].append(frame)

    def close(self) -> None:
        """Close the driver and stop the gRPC server."""
        self.sw.close()
        self.server.stop(0)


class VethTarget(Target):
    """A switch process on veth pairs; the test talks to the host sides over raw sockets."""

    wait_s = 2.0
    quiet_s = 0.3

    def __init__(self, kind: str, lab: VethLab, process: Process) -> None:
        super().__init__()
        self.name = kind
        self.lab = lab
        self.process = process
        self._lock = threading.Lock()
        self.connect(process.grpc_addr)
        self._drain_stale()

    @classmethod
    def start(cls, kind: str) -> VethTarget:
        """Build a lab of N_PORTS pairs and start ``kind`` (``bmv2`` or ``model``) on it."""
        lab = VethLab(N_PORTS).open()
        try:
            if kind == "bmv2":
                # KVPOOL_BMV2_TRACE=1 writes BMv2's per-packet trace into logs/dataplane/.
                process = start_bmv2(lab.switch_ifs, LOG_DIR, device_id=DEVICE_ID,
                                     trace=os.environ.get("KVPOOL_BMV2_TRACE") == "1")
            else:
                process = start_model(lab.switch_ifs, LOG_DIR, device_id=DEVICE_ID)
        except BaseException:
            lab.close()
            raise
        try:
            return cls(kind, lab, process)
        except BaseException:
            process.stop()
            lab.close()
            raise

    def reset(self) -> None:
        """Fresh pipeline and empty queues between tests (the process keeps running)."""
        self.sw.close()
        self.connect(self.process.grpc_addr)
        self._drain_stale()

    def _drain_stale(self) -> None:
        time.sleep(0.05)
        self._poll()
        for q in self.received.values():
            q.clear()

    def send(self, port: int, frame: bytes) -> None:
        """Send from the host side of ``port``."""
        self.lab.send(port - 1, frame)

    def _poll(self) -> None:
        with self._lock:
            for i in range(N_PORTS):
                while (frame := self.lab.recv(i)) is not None:
                    self.received[i + 1].append(frame)

    def close(self) -> None:
        """Close the driver, stop the switch process, remove the lab."""
        try:
            self.sw.close()
        finally:
            self.process.stop()
            self.lab.close()


def target_kind() -> str:
    """``KVPOOL_TARGET``: ``model`` (default, in-process), ``model-veth`` or ``bmv2``."""
    kind = os.environ.get("KVPOOL_TARGET", "model").strip().lower()
    if kind not in ("model", "model-veth", "bmv2"):
        raise ValueError(f"KVPOOL_TARGET={kind!r}: use model, model-veth or bmv2")
    return kind
