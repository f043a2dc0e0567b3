"""The controller through a switch's trouble: a restart mid-run, a switch that is late, a process that never exits.

In process (the model switch's gRPC server stopped and started again on its port, a
fresh state each time, as a restarted ``kvpool-switch``): the epoch loop goes on, the
driver reconnects and resyncs everything (pipeline, routes, writers, groups, digests, the
pool entries, the placement mark), the restarted instance is noticed and the holder is
asked to push the resident chunks through it, and the pool serves again. As a process:
``kvpool-controller`` started before its switch runs its epochs with the switch down,
programs it when it answers, and rides out its restart. Timing here is only deadlines
for events to happen, never an assertion on how long they took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.catalog import Catalog, ChunkInfo
from controller.daemon import Controller
from controller.fabric import FabricSettings
from controller.placement import MARK_KEY
from controller.settings import ControllerSettings, Mode, SwitchEndpoint
from kvpool import contract as n
from kvpool import wire
from kvpool.tcp import free_port
from tests.ctl_harness import P4INFO, SKIP_REASON, TOPO, FakeSink, ModelSwitch

pytestmark = pytest.mark.skipif(not P4INFO.exists(), reason=SKIP_REASON)

HOLDER, H1, H3 = (TOPO.hosts[h] for h in ("h0", "h1", "h3"))
KEY = 0x0DDB_A11C_0FFE_E000
CHUNK = bytes((i * 7 + 3) % 256 for i in range(2 * wire.FRAG_PAYLOAD + 50))  # 3 fragments


def _wait(what: str, done: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"within {within:.0f} s: {what}")
        time.sleep(0.05)


def _fill(switch: ModelSwitch) -> None:
    for i in range(wire.fragment_count(len(CHUNK))):
        switch.send(HOLDER, H1, wire.data_packet(KEY, i, CHUNK), sport=wire.KVPOOL_UDP_PORT)


def _routes(switch: ModelSwitch | None) -> int:
    """Routes the switch holds (0 while it runs no pipeline)."""
    if switch is None or switch.state.pipeline is None:
        return 0
    return switch.state.entry_count(n.IPV4_ROUTE)


def _served(switch: ModelSwitch) -> bool:
    out = switch.send(H3, HOLDER, wire.get_packet(KEY, 1, request_id=9, room=True, flags=int(wire.Flag.RETRANSMIT)))
    return [p for p, _ in out] == [4]


@pytest.fixture
def looping() -> Iterator[tuple[Controller, ModelSwitch, FakeSink, Callable[[], ModelSwitch]]]:
    """A pool-mode controller running epochs in a thread on a model switch, and a way to restart the switch."""
    box = {"switch": ModelSwitch()}
    port = box["switch"].server.port
    settings = ControllerSettings(mode=Mode.POOL, p4info=P4INFO, bmv2_json=None, epoch_s=0.05,
                                  fabric=FabricSettings(popularity_threshold=2), connect_timeout_s=2)
    sink = FakeSink()
    ctl = Controller(TOPO, [SwitchEndpoint("s1", box["switch"].address, 1)], settings,
                     Catalog([ChunkInfo(KEY, None, 0, len(CHUNK))]), sink).start()
    stop = threading.Event()
    loop = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    loop.start()

    def restart() -> ModelSwitch:
        box["switch"].stop()
        box["switch"] = ModelSwitch(port)
        return box["switch"]

    try:
        yield ctl, box["switch"], sink, restart
    finally:
        stop.set()
        loop.join(timeout=10)
        ctl.close()
        box["switch"].stop()


def test_a_switch_restart_is_resynced_refilled_and_served_again(
        looping: tuple[Controller, ModelSwitch, FakeSink, Callable[[], ModelSwitch]]) -> None:
    ctl, switch, sink, restart = looping
    for i, h in enumerate((H1, H3)):  # two missed GETs: hot
        switch.send(h, HOLDER, wire.get_packet(KEY, 0, request_id=20 + i))
    _wait("the hot chunk is admitted", lambda: KEY in ctl.residents)
    _fill(switch)
    assert _served(switch)
    routes = switch.state.entry_count(n.IPV4_ROUTE)
    epoch, pushes = ctl.epoch, sink.pushed.count(KEY)

    fresh = restart()  # registers, tables, groups and digests of the old process are gone
    _wait("the controller resyncs the restarted switch", lambda: _routes(fresh) == routes)
    assert fresh.state.lookup_exact(n.POOL_LOOKUP, KEY).hit and fresh.state.lookup_exact(n.POOL_LOOKUP, MARK_KEY).hit
    assert fresh.state.multicast_groups() and fresh.state.digest_configs()
    _wait("the holder is asked to push the resident chunk through the new instance",
          lambda: sink.pushed.count(KEY) > pushes)
    assert not _served(fresh)  # empty registers: nothing stale is served
    _fill(fresh)  # the push the controller asked for
    assert _served(fresh)
    _wait("epochs go on", lambda: ctl.epoch > epoch + 3)
    status = ctl.status()["switches"]["s1"]
    assert status["state"] == "up" and status["reconnects"] >= 1 and status["instance"] >= 2


def test_status_says_a_switch_is_down_and_since_when(
        looping: tuple[Controller, ModelSwitch, FakeSink, Callable[[], ModelSwitch]]) -> None:
    ctl, switch, _, _ = looping
    switch.stop()
    _wait("the switch is seen down", lambda: ctl.status()["switches"]["s1"]["state"] == "down")
    st = ctl.status()["switches"]["s1"]
    assert st["down_since"] is not None and st["down_since"] <= time.time() and st["last_error"]
    epoch = ctl.epoch
    _wait("epochs go on while the switch is down", lambda: ctl.epoch > epoch + 3)


def _status(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc


def test_kvpool_controller_starts_before_its_switch_and_never_exits(tmp_path: Path) -> None:
    port = free_port()
    topo = tmp_path / "star.json"
    topo.write_text(json.dumps(TOPO.to_dict()))
    status = tmp_path / "status.json"
    log = (tmp_path / "controller.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "--topology", str(topo),
                             "--switch", f"s1=127.0.0.1:{port}@1", "--mode", "pool", "--epoch", "0.1",
                             "--p4info", str(P4INFO), "--status-file", str(status),
                             "--token-file", str(tmp_path / "token")],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.getcwd()})
    switch: ModelSwitch | None = None
    try:
        def s1() -> dict[str, Any]:
            return dict(_status(status).get("switches", {}).get("s1", {}))

        _wait("epochs run with the switch down", lambda: s1().get("state") == "down" and proc.poll() is None)
        switch = ModelSwitch(port)
        _wait("the switch is programmed once it answers", lambda: _routes(switch) > 0 and s1().get("state") == "up")
        switch.stop()
        _wait("the restart is seen", lambda: s1().get("state") == "down")
        assert proc.poll() is None, "kvpool-controller exited on a switch's trouble"
        switch = ModelSwitch(port)
        _wait("the restarted switch is programmed again", lambda: _routes(switch) > 0 and s1().get("state") == "up")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
        if switch is not None:
            switch.stop()
    assert code == 0, (tmp_path / "controller.log").read_text()[-2000:]
