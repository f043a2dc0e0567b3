"""The controller daemon against the reference switch: real gRPC, real pipeline, real packets.

A star (holder h0 on port 1, requesters h1..h3 on ports 2..4) in one model switch run
in-process. Requesters' missed GETs make the switch report a hot chunk; the controller's
epoch admits it; the holder's DATA passing through fills the slots; the next GET is
answered by the switch itself and never reaches the holder.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from controller.catalog import Catalog, ChunkInfo
from controller.daemon import Controller, EpochReport
from controller.fabric import FabricSettings
from controller.overrides import Override
from controller.placement import MARK_KEY
from controller.settings import ControllerError, ControllerSettings, Mode, SwitchEndpoint
from kvpool import contract as n
from kvpool import hints as kh
from kvpool import wire
from kvpool.hints import GetPath, Hint, Hints
from tests.ctl_harness import P4INFO, SKIP_REASON, TOPO, FakeSink, ModelSwitch

pytestmark = pytest.mark.skipif(not P4INFO.exists(), reason=SKIP_REASON)

HOLDER, H1, H2, H3 = (TOPO.hosts[h] for h in ("h0", "h1", "h2", "h3"))
KEY = 0x1234_5678_9ABC_DEF0
CHUNK = bytes((i * 31 + 7) % 256 for i in range(3 * wire.FRAG_PAYLOAD + 100))  # 4 fragments


@pytest.fixture
def switch() -> Iterator[ModelSwitch]:
    sw = ModelSwitch()
    yield sw
    sw.stop()


class HintRecorder:
    """An agent's hints API as the controller sees it: records every document sent."""

    def __init__(self) -> None:
        self.docs: list[Hints] = []

    def send(self, doc: Mapping[str, Any]) -> None:
        self.docs.append(kh.parse(doc))


def controller(switch: ModelSwitch, mode: Mode, sink: FakeSink | None = None, adopt: bool = True,
               hints: HintRecorder | None = None, push_admitted: bool = False) -> Controller:
    settings = ControllerSettings(mode=mode, p4info=P4INFO, fabric=FabricSettings(popularity_threshold=2),
                                  epoch_s=0.05, adopt=adopt, push_admitted=push_admitted)
    catalog = Catalog([ChunkInfo(KEY, None, 0, len(CHUNK))])
    return Controller(TOPO, [SwitchEndpoint("s1", switch.address, 1)], settings, catalog, sink,
                      hint_sinks=[hints] if hints is not None else ())


def _kv(frame: bytes) -> wire.Header:
    return wire.unpack_header(frame[42:])


def test_plain_mode_installs_routes_but_no_coalescing(switch: ModelSwitch) -> None:
    with controller(switch, Mode.PLAIN) as ctl:
        assert switch.state.entry_count(n.IPV4_ROUTE) == 5  # 4 hosts + the fill sink
        assert switch.state.entry_count(n.WAITER_LOOKUP) == 0
        assert switch.state.multicast_groups() == {}
        # Two GETs for the same fragment both reach the holder.
        for h in (H1, H2):
            out = switch.send(h, HOLDER, wire.get_packet(KEY, 0, request_id=7))
            assert [p for p, _ in out] == [1]
        assert ctl.status()["mode"] == "plain"


def test_multicast_mode_coalesces(switch: ModelSwitch) -> None:
    with controller(switch, Mode.MULTICAST):
        assert switch.state.entry_count(n.WAITER_LOOKUP) == 3
        first = switch.send(H1, HOLDER, wire.get_packet(KEY, 0, 4, request_id=1))  # range GETs: coalesced
        second = switch.send(H2, HOLDER, wire.get_packet(KEY, 0, 4, request_id=2))
        assert [p for p, _ in first] == [1] and second == []
        # The holder's one answer, addressed to h1, reaches both waiters.
        out = switch.send(HOLDER, H1, wire.data_packet(KEY, 0, CHUNK, request_id=1), sport=wire.KVPOOL_UDP_PORT)
        assert sorted(p for p, _ in out) == [2, 3]
        assert {_kv(f).request_id for _, f in out} == {1, 2}


def test_hot_chunk_is_admitted_filled_and_served_by_the_switch(switch: ModelSwitch) -> None:
    sink = FakeSink()
    with controller(switch, Mode.POOL, sink) as ctl:
        _admit(ctl, switch)
        # Nothing is pushed: a push costs the holder's link a copy whether or not the chunk is
        # asked for again, and the answers that cross the switch fill it anyway.
        assert sink.pushed == []
        entry = switch.state.lookup_exact(n.POOL_LOOKUP, KEY)
        assert entry.hit and entry.params["frag_count"] == 4 and entry.params["chunk_len"] == len(CHUNK)

        # The holder's answers cross the switch: every fragment is written on pass.
        for i in range(4):
            switch.send(HOLDER, H1, wire.data_packet(KEY, i, CHUNK), sport=wire.KVPOOL_UDP_PORT)
        # Now a GET from h3 is answered by the switch, out of h3's own port, with the bytes.
        out = switch.send(H3, HOLDER, wire.get_packet(KEY, 2, request_id=99, room=True))
        assert [p for p, _ in out] == [4]
        reply = out[0][1]
        hdr = _kv(reply)
        assert hdr.opcode == wire.Opcode.DATA and hdr.flags & wire.Flag.SWITCH_SERVED and hdr.request_id == 99
        start, body = 2 * wire.FRAG_PAYLOAD, 42 + wire.HEADER_LEN
        assert reply[body:body + hdr.payload_len] == CHUNK[start:start + hdr.payload_len]

        # The hit on fragment 0 is a fetch the next epoch observes through the slot counters.
        switch.send(H2, HOLDER, wire.get_packet(KEY, 0, request_id=5, room=True))
        report = ctl.run_epoch()
        assert report.slot_hits == 1
        assert ctl.status()["pool"] == {"slots": 1024, "used": 4, "chunks": 1}


def test_with_push_admitted_the_holder_is_asked_to_push_each_admitted_chunk(switch: ModelSwitch) -> None:
    sink = FakeSink()
    with controller(switch, Mode.POOL, sink, push_admitted=True) as ctl:
        _admit(ctl, switch)
        assert sink.pushed == [KEY]
        ctl.run_epoch()
        assert sink.pushed == [KEY]  # once, not every epoch


def _latest(ctl: Controller, rec: HintRecorder, want: Callable[[Hints], bool]) -> Hints:
    """Run epochs until the agents were sent a document ``want`` accepts; that document."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ctl.run_epoch()
        ctl.hints.flush()
        if rec.docs and want(rec.docs[-1]):
            return rec.docs[-1]
        time.sleep(0.05)
    raise AssertionError(f"never sent; last documents: {rec.docs[-3:]}")


@pytest.mark.parametrize("mode", [Mode.PLAIN, Mode.MULTICAST, Mode.POOL])
def test_agents_hear_which_chunks_are_hot_or_pooled_and_whether_the_switches_merge(switch: ModelSwitch,
                                                                                  mode: Mode) -> None:
    rec = HintRecorder()
    with controller(switch, mode, FakeSink(), hints=rec) as ctl:
        ctl.hints.flush()
        # At start, at once: nothing named, so every agent drops what an earlier controller said.
        assert rec.docs and rec.docs[0].chunks == {} and rec.docs[0].merge is (mode is not Mode.PLAIN)
        for i, h in enumerate((H1, H2, H3)):  # KEY asked for by three requesters: hot (threshold 2)
            switch.send(h, HOLDER, wire.get_packet(KEY, 0, 64, request_id=30 + i))
        if mode is Mode.PLAIN:
            for _ in range(5):  # no digests in plain mode: nothing to tell
                ctl.run_epoch()
            ctl.hints.flush()
            assert all(d.chunks == {} and not d.merge for d in rec.docs)
            return
        doc = _latest(ctl, rec, lambda d: d.chunks.get(KEY, Hint(GetPath.RANGE)).path is GetPath.SINGLE
                      and (mode is Mode.MULTICAST or KEY in ctl.residents))
        # The length comes from the catalog: a requester asks for every fragment at once.
        assert doc.chunks == {KEY: Hint(GetPath.SINGLE, len(CHUNK))} and doc.merge
        assert doc.ttl_s == ctl.settings.hints.ttl_s
        if mode is Mode.MULTICAST:
            return
        # Pooled, not filled yet: still asked for by range GETs (single GETs would all miss and go
        # to the holder, a request packet each).  Once an answer crossed the switch and wrote its
        # slots, servable.
        for _ in range(3):
            ctl.run_epoch()
        ctl.hints.flush()
        assert rec.docs[-1].chunks[KEY].path is GetPath.SINGLE
        for i in range(wire.fragment_count(len(CHUNK))):
            switch.send(HOLDER, H1, wire.data_packet(KEY, i, CHUNK), sport=wire.KVPOOL_UDP_PORT)
        doc = _latest(ctl, rec, lambda d: d.chunks.get(KEY, Hint(GetPath.RANGE)).path is GetPath.SERVABLE)
        assert doc.chunks == {KEY: Hint(GetPath.SERVABLE, len(CHUNK))}


def test_unknown_digest_keys_are_counted_not_admitted(switch: ModelSwitch) -> None:
    with controller(switch, Mode.POOL) as ctl:
        other = 0xDEAD
        for h in (H1, H2, H3):
            switch.send(h, HOLDER, wire.get_packet(other, 0))
        deadline = time.monotonic() + 5
        unknown = 0
        while unknown == 0 and time.monotonic() < deadline:
            unknown += ctl.run_epoch().unknown_keys
            time.sleep(0.05)
        assert unknown >= 1 and not ctl.residents


def test_missing_switch_address_is_an_error() -> None:
    with pytest.raises(ControllerError, match="no P4Runtime address"):
        Controller(TOPO, [], ControllerSettings(p4info=P4INFO))


def test_each_epoch_reads_only_the_residents_base_slot_counters(switch: ModelSwitch) -> None:
    # A read of all 1,024 slot counters every epoch (0.1 s in the demo) took the model switch's
    # CPU from its packets: the pool's p99 was 1.5-2x multicast's on replayed agent traffic.
    with controller(switch, Mode.POOL, FakeSink()) as ctl:
        sw = next(iter(ctl.switches.values()))
        cells: list[list[int]] = []
        whole: list[str] = []
        real_cells, real_read = sw.read_counter_cells, sw.read_counter

        def spy_cells(name: str, indices: Any) -> Any:
            indices = list(indices)
            if name == n.SLOT_HITS:
                cells.append(indices)
            return real_cells(name, indices)

        def spy_read(name: str, index: int | None = None) -> Any:
            whole.append(name)
            return real_read(name, index)

        sw.read_counter_cells = spy_cells  # type: ignore[method-assign]
        sw.read_counter = spy_read  # type: ignore[method-assign]
        ctl.run_epoch()
        assert cells == [] and whole == []  # nothing resident: nothing read
        _admit(ctl, switch)
        base = ctl.residents[KEY].base_slot
        assert cells and all(c == [base] for c in cells)  # the baseline at placement, then each epoch
        assert whole == []
        for i in range(4):
            switch.send(HOLDER, H1, wire.data_packet(KEY, i, CHUNK), sport=wire.KVPOOL_UDP_PORT)
        switch.send(H2, HOLDER, wire.get_packet(KEY, 0, request_id=5, room=True))
        switch.send(H3, HOLDER, wire.get_packet(KEY, 0, request_id=6, room=True))
        assert ctl.run_epoch().slot_hits == 2
        assert ctl.run_epoch().slot_hits == 0  # counted once


def _admit(ctl: Controller, switch: ModelSwitch) -> None:
    """Make KEY hot until the controller admits it."""
    for i, h in enumerate((H1, H2, H3)):
        switch.send(h, HOLDER, wire.get_packet(KEY, 0, request_id=10 + i))
    deadline = time.monotonic() + 10
    while KEY not in ctl.residents and time.monotonic() < deadline:
        ctl.run_epoch()
        time.sleep(0.05)
    assert KEY in ctl.residents, "the hot chunk was never admitted"


def _epochs_until(ctl: Controller, done: Callable[[EpochReport], bool], within: float = 10.0) -> EpochReport:
    """Run epochs until one's report satisfies ``done`` (digests reach the controller asynchronously)."""
    deadline = time.monotonic() + within
    while True:
        report = ctl.run_epoch()
        if done(report) or time.monotonic() > deadline:
            return report
        time.sleep(0.05)


def _fill(switch: ModelSwitch, chunk: bytes = CHUNK, generation: int = 0) -> None:
    for i in range(wire.fragment_count(len(chunk))):
        switch.send(HOLDER, H1, wire.data_packet(KEY, i, chunk, generation=generation), sport=wire.KVPOOL_UDP_PORT)


def _served(switch: ModelSwitch, frag: int = 1) -> wire.Header | None:
    """Ask for one fragment with reply room: the switch's answer, or None if it went to the holder.

    RETRANSMIT, so a GET that goes to the holder is never absorbed by the previous one's
    pending slot (and not counted as a fetch).
    """
    out = switch.send(H3, HOLDER, wire.get_packet(KEY, frag, request_id=77, room=True,
                                                  flags=int(wire.Flag.RETRANSMIT)))
    assert len(out) == 1
    port, frame = out[0]
    return _kv(frame) if port == 4 else None


def test_a_restarted_controller_never_gives_a_placement_id_twice(switch: ModelSwitch) -> None:
    with controller(switch, Mode.POOL) as first:
        _admit(first, switch)
        _fill(switch)
        assert _served(switch) is not None
        used = first.residents[KEY].placement
        mark = first.placements.mark
        assert switch.state.lookup_exact(n.POOL_LOOKUP, MARK_KEY).params["placement"] == mark >= used
    # A new controller process that does not adopt the pool: it reads the switch back before
    # replacing its state, so the same chunk at the same base slot gets an id above everything
    # the first one could have used.
    with controller(switch, Mode.POOL, adopt=False) as second:
        assert not switch.state.lookup_exact(n.POOL_LOOKUP, KEY).hit  # the first one's entries are gone
        admitted = second.submit(Override("admit", KEY))  # the sketch already reported it this epoch
        second.run_epoch()
        assert admitted.result(5)["admitted"] == [f"{KEY:#x}"]
        assert second.residents[KEY].placement > mark
        assert second.residents[KEY].base_slot == 0
        assert _served(switch) is None  # the slots still hold the first placement's bytes: not served
        _fill(switch)
        assert _served(switch) is not None


def test_a_holders_newer_generation_is_reported_and_the_chunk_re_placed(switch: ModelSwitch) -> None:
    with controller(switch, Mode.POOL) as ctl:
        _admit(ctl, switch)
        _fill(switch)
        before = ctl.residents[KEY].placement
        new = bytes(reversed(CHUNK))
        _fill(switch, new, generation=3)  # the holder restarted with other bytes: forwarded, reported
        assert _served(switch) is not None and _served(switch).generation == 0  # type: ignore[union-attr]
        report = _epochs_until(ctl, lambda r: r.mismatches > 0)
        assert report.mismatches == 1 and report.replaced == [KEY]
        res = ctl.residents[KEY]
        assert (res.generation, res.placement > before) == (3, True)
        assert _served(switch) is None  # the old bytes are dead
        _fill(switch, new, generation=3)
        hdr = _served(switch)
        assert hdr is not None and hdr.generation == 3
        # A stale holder's DATA (generation 0 again) is reported but followed only if not older.
        _fill(switch, CHUNK, generation=0)
        report = _epochs_until(ctl, lambda r: r.mismatches > 0)
        assert report.mismatches == 1 and report.replaced == [] and ctl.residents[KEY].generation == 3


def test_a_republish_moves_the_switches_off_the_old_bytes_before_it_returns(switch: ModelSwitch) -> None:
    with controller(switch, Mode.POOL) as ctl:
        version, _ = ctl.directory.issue(KEY, digest=1, nbytes=len(CHUNK))
        _admit(ctl, switch)
        assert ctl.residents[KEY].generation == version.generation == 1
        _fill(switch, generation=1)
        assert _served(switch) is not None
        new = bytes(reversed(CHUNK))
        version, previous = ctl.directory.issue(KEY, digest=2, nbytes=len(new))
        assert previous is not None
        answer = ctl.submit(Override("republish", KEY, generation=version.generation, nbytes=len(new)))
        ctl.run_epoch()
        assert answer.result(5) == {"key": f"{KEY:#x}", "generation": 2, "replaced": True, "epoch": ctl.epoch}
        assert _served(switch) is None  # nothing of generation 1 is served any more
        _fill(switch, CHUNK, generation=1)  # a late DATA of the old bytes does not come back either
        assert _served(switch) is None
        report = _epochs_until(ctl, lambda r: r.mismatches > 0)
        assert report.mismatches == 1 and report.replaced == [] and ctl.residents[KEY].generation == 2
        _fill(switch, new, generation=2)
        hdr = _served(switch)
        assert hdr is not None and hdr.generation == 2


def test_a_new_controller_adopts_a_warm_switch(switch: ModelSwitch) -> None:
    sink = FakeSink()
    with controller(switch, Mode.POOL, sink) as first:
        _admit(first, switch)
        _fill(switch)
        assert _served(switch) is not None
        placed = first.residents[KEY]
        mark = first.placements.mark
    pushed_before = len(sink.pushed)
    routes = switch.state.entry_count(n.IPV4_ROUTE)
    # A new controller process on the warm switch: it keeps the pool entry as it is.
    with controller(switch, Mode.POOL, sink) as second:
        res = second.residents[KEY]
        assert (res.base_slot, res.placement, res.generation) == (placed.base_slot, placed.placement,
                                                                  placed.generation)
        assert second.engine.holds(KEY) and second.engine.pool.residents[KEY].base_slot == placed.base_slot
        assert _served(switch, frag=0) is not None  # hits go on: no cold wave, nothing re-pushed
        assert switch.state.entry_count(n.IPV4_ROUTE) == routes
        report = _epochs_until(second, lambda r: r.slot_hits >= 1)
        assert report.slot_hits == 1 and not report.admitted  # the hit counts as a fetch of a resident
        assert len(sink.pushed) == pushed_before
        assert second.placements.last >= mark  # new placements continue above the first one's
        assert second.status()["switches"]["s1"]["state"] == "up"


def test_an_epoch_that_fails_is_counted_and_the_next_runs(switch: ModelSwitch) -> None:
    with controller(switch, Mode.POOL) as ctl:
        stop = threading.Event()
        calls = {"n": 0}
        real = ctl.run_epoch

        def flaky() -> EpochReport:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("FAILED_PRECONDITION from a switch that just restarted")
            if calls["n"] >= 4:
                stop.set()
            return real()

        ctl.run_epoch = flaky  # type: ignore[method-assign]
        ctl.run(stop)
        assert calls["n"] == 4 and ctl.failed_epochs == 1
        assert ctl.last_epoch_error is not None and "FAILED_PRECONDITION" in ctl.last_epoch_error
        assert ctl.status()["failed_epochs"] == 1


def test_a_clean_slate_is_no_restart_but_a_push_by_someone_else_is(switch: ModelSwitch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    with controller(switch, Mode.MULTICAST) as ctl:
        sw = ctl.switches["s1"]
        before = sw.instance
        ctl.clean_slate()
        assert sw.instance == before + 1  # a fresh pipeline: registers and counters from zero
        assert switch.state.entry_count(n.WAITER_LOOKUP) > 0  # the intended entries written back
        with caplog.at_level("WARNING", logger="kvpool.controller"):
            ctl.run_epoch()
        assert not [r for r in caplog.records if "new instance" in r.getMessage()]
        sw.push_pipeline()  # behind the controller's back: what a restarted switch looks like to it
        with caplog.at_level("WARNING", logger="kvpool.controller"):
            ctl.run_epoch()
        assert [r for r in caplog.records if "switch s1: a new instance" in r.getMessage()]
