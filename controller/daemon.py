"""The controller daemon: program every switch of a topology and run the pool policy each epoch.

Glue only. ``controller.fabric`` says what each switch must hold, ``controller.policy``
decides which chunks the switch pool admits and evicts, ``controller.p4runtime`` ships the
writes, ``controller.residents`` keeps the chunks the switches hold; this module connects
them:

* start: connect to every switch, adopt the pool a warm switch still holds
  (``controller.residents.adopt``), push the pipeline where none of ours runs, install the
  fabric for the mode (``controller.settings.Mode``: plain, multicast, pool);
* each epoch (``pool``): turn hot-chunk digests and per-slot hit counters into
  observations, run ``PolicyEngine.step``, place each admitted chunk on the switch where
  the paths of its demand meet its holders (``controller.policy.site``) and write its
  ``pool_lookup`` entries; the answers that cross that switch fill it on pass (values never
  travel through the controller); a holder is asked to push a chunk where none may come
  soon (``controller.holder_push``);
* each epoch (``multicast`` and ``pool``): tell the agents which chunks are worth asking for
  one fragment at a time (``controller.hints``), and age the sketch every
  ``epochs_per_sketch_epoch`` epochs;
* operator side (``controller.api``): overrides (``controller.overrides``) are applied at
  the start of the next epoch, silent holders are swept from the directory, and a snapshot
  for the API is published at the end of every epoch.

Invariants: a switch fills only writer DATA whose generation, fragment count and length
equal its entry's (the catalog, ``controller.catalog``, is what makes entries exact); a
mismatch report re-places the chunk at the holder's generation when the directory agrees.
Every placement gets a fresh placement id, so bytes under an older one are never served.

A switch's trouble never stops the controller: its driver retries for ever and writes
meanwhile go to the intended state the resync applies; a failed epoch is logged and
counted and the next one runs. A switch that comes back as a new instance (registers
empty) counts hits from zero and gets its resident chunks pushed through it again.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

from controller.catalog import Catalog, ChunkActivity, ChunkInfo
from controller.counters import summed_cells
from controller.directory import Directory, Role
from controller.fabric import SwitchConfig, sink_addresses, switch_configs
from controller.fills import FillWatch
from controller.hints import HintPublisher, HintSchedule, HintSink, HotChunks, hints_for
from controller.holder_push import FillRequester
from controller.overrides import Override, OverrideRefusedError
from controller.p4runtime import Digest, Entry, P4RuntimeError, P4RuntimeSwitch
from controller.placement import MARK_KEY, Placements
from controller.policy.changes import Admit, Change, Evict, EvictAction
from controller.policy.engine import Observation, PolicyConfig, PolicyEngine
from controller.policy.operator import admit as policy_admit
from controller.policy.operator import evict as policy_evict
from controller.policy.operator import set_quota as policy_set_quota
from controller.policy.quotas import QuotaError
from controller.policy.site import Site, choose_site
from controller.residents import Resident, adopt, mark_entry, placement_ids, pool_entry
from controller.settings import ControllerError, ControllerSettings, Mode, SwitchEndpoint
from kvpool import contract as n
from kvpool import wire
from kvpool.contract import PoolState
from kvpool.hints import Hints
from kvpool.topology import Topology

log = logging.getLogger("kvpool.controller")


@dataclass
class EpochReport:
    """What one epoch saw and did."""

    epoch: int
    digests: int = 0
    observations: int = 0
    unknown_keys: int = 0
    admitted: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    replaced: list[int] = field(default_factory=list)
    """Resident chunks moved to a new placement (republished, or the holder's DATA said so)."""
    mismatches: int = 0
    """Fill-mismatch reports from the switches (the holder's DATA unlike the entry)."""
    slot_hits: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (keys as hex)."""
        d = asdict(self)
        d["admitted"] = [f"{k:#x}" for k in self.admitted]
        d["evicted"] = [f"{k:#x}" for k in self.evicted]
        d["replaced"] = [f"{k:#x}" for k in self.replaced]
        return d



class Controller:
    """Programs the switches of a topology and runs the pool policy (see the module docstring)."""

    def __init__(self, topo: Topology, switches: Iterable[SwitchEndpoint], settings: ControllerSettings | None = None,
                 catalog: Catalog | None = None, filler: FillRequester | None = None,
                 driver_factory: Callable[[SwitchEndpoint, ControllerSettings], P4RuntimeSwitch] | None = None,
                 directory: Directory | None = None, hint_sinks: Iterable[HintSink] = ()) -> None:
        """``directory`` lets the directory (registered agents, issued generations) outlive this
        controller, e.g. across experiment modes that each program the switches afresh;
        ``hint_sinks`` are the agents told which chunks to ask for singly (``controller.hints``)."""
        self.topo = topo
        self.settings = settings or ControllerSettings()
        self.endpoints = {e.name: e for e in switches}
        missing = set(topo.switches) - set(self.endpoints)
        if missing:
            raise ControllerError(f"no P4Runtime address for switch(es) {sorted(missing)}")
        self.catalog = catalog or Catalog()
        self.filler = filler
        self._driver_factory = driver_factory or _default_driver
        self.switches: dict[str, P4RuntimeSwitch] = {}
        self.configs: dict[str, SwitchConfig] = switch_configs(topo, self.settings.fabric)
        self.sinks = sink_addresses(topo, self.settings.fabric)
        for a, b in topo.asymmetric_pairs():
            log.warning("routes between %s and %s differ by direction: a switch that absorbs GETs on one "
                        "path is never released by answers on the other (coalescing there times out)", a, b)
        # Where each chunk's fetches enter the fabric: switch -> fetches reported there.
        self.demand: dict[int, dict[str, int]] = {}
        self.engine = PolicyEngine(PolicyConfig(capacity_bytes=self.settings.pool_slots * wire.FRAG_PAYLOAD))
        self.residents: dict[int, Resident] = {}
        self.placements = Placements()
        self._refill: set[int] = set()  # re-placed chunks the holder pushes at the next epoch
        # Per switch: slot hit counters as last read, and the switch instance they belong to
        # (a restarted switch counts from zero again).
        self._hits_seen: dict[str, dict[int, int]] = {}
        self._fills = FillWatch()
        self._instance_seen: dict[str, int] = {}
        #: Epochs that failed (and the controller ran on), and the last one's error.
        self.failed_epochs = 0
        self.last_epoch_error: str | None = None
        self.epoch = 0
        self.sketch_epoch = self.settings.fabric.popularity_epoch
        self.reports: list[EpochReport] = []
        self._digests: queue.Queue[tuple[str, Digest]] = queue.Queue()
        self._lock = threading.RLock()
        # Operator side (controller.api): the directory of holders, per-chunk activity, the
        # snapshot the API reads, and overrides queued for the epoch loop (the API never takes _lock).
        self.directory = directory or Directory({h.address: Role(h.role) for h in topo.hosts.values()},
                                                self.settings.heartbeat_timeout_s)
        self.activity: dict[int, ChunkActivity] = {}
        self.snapshot: dict[str, Any] = {}
        self._overrides: queue.Queue[tuple[Override, Future[dict[str, Any]]]] = queue.Queue()
        # Hints to agents: hot chunks (from digests) and pooled ones, sent when they change.
        self.hot = HotChunks(self.settings.hints.hot_ttl_s)
        self._hint_schedule = HintSchedule(self.settings.hints.refresh_s)
        self.hints = HintPublisher(list(hint_sinks))

    # ------------------------------------------------------------------ start / stop
    def start(self) -> Controller:
        """Connect to every switch, adopt what warm switches hold, push the pipeline where needed, install the fabric.

        Never fails for a switch's trouble: a switch that does not answer (or is held by
        another controller) is taken over by its driver when it answers. Switches that still
        run this pipeline are read first: placement ids continue above every one (and the
        mark) they hold, so none is given twice (``controller.placement``), and their pool
        is adopted (see the module docstring).
        """
        warm: dict[str, list[Entry]] = {}
        for name, ep in self.endpoints.items():
            sw = self._driver_factory(ep, self.settings)
            sw.on_digest = functools.partial(self._on_digest, name)
            self.switches[name] = sw
            try:
                sw.connect(push_pipeline=False, retry_in_background=True)
                if sw.runs_our_pipeline(sw.switch_cookie()):
                    warm[name] = sw.read_entries(n.POOL_LOOKUP)
            except P4RuntimeError as exc:
                log.warning("switch %s (%s): %s; taking it over when it answers", name, ep.address,
                            str(exc).splitlines()[0])
        self._recover_placements(warm)
        if self.settings.adopt and self.settings.mode is Mode.POOL:
            self._adopt(warm)
        mark = self.placements.reserve()  # the first block: its mark entry goes in with the fabric
        for name, sw in self.switches.items():
            self._install(name, sw)
            if mark is not None:
                sw.intend([mark_entry(mark)])
            try:
                # One resync: the pipeline if ours does not run there, then only what differs, so a
                # warm switch keeps forwarding (and serving what was adopted) throughout.
                sw.manage()
            except P4RuntimeError as exc:
                log.warning("switch %s: resync failed (%s); retrying when it answers again", name,
                            str(exc).splitlines()[0])
            self._instance_seen[name] = sw.instance
            log.info("switch %s (%s, device %d): %s for mode %s", name, self.endpoints[name].address,
                     self.endpoints[name].device_id, "programmed" if sw.ready else "down, programmed when it answers",
                     self.settings.mode)
        if self.settings.mode is Mode.POOL:
            self._slot_hits()  # baselines: hits a warm switch counted before this controller are no fetches of ours
        self._send_hints(time.monotonic())  # at once: agents drop hints an earlier controller gave
        self.publish_snapshot()
        return self

    def _on_digest(self, switch: str, digest: Digest) -> None:
        """A digest list arrived from ``switch`` (driver thread): the epoch loop takes it."""
        self._digests.put((switch, digest))

    def _recover_placements(self, warm: dict[str, list[Entry]]) -> None:
        """Continue placement ids above every placement and mark the warm switches hold (their registers too)."""
        placements, marks = placement_ids(warm)
        self.placements.recover(placements, marks)
        if placements or marks:
            log.info("placement ids continue above %d (read back from %d entries on %d switch(es))",
                     self.placements.last, len(placements) + len(marks), len(warm))

    def _adopt(self, warm: dict[str, list[Entry]]) -> None:
        """Keep the pool entries warm switches hold (``controller.residents.adopt``)."""
        residents, refill = adopt(warm, self.catalog, self.engine, self.switches)
        self.residents.update(residents)
        self._refill.update(refill)
    def _next_placement(self) -> int:
        """A fresh placement id; moves the mark entry on every switch first when a new block starts."""
        pid, mark = self.placements.next()
        if mark is not None:
            for sw in self.switches.values():
                sw.modify_entries([mark_entry(mark)])
        return pid

    def _install(self, name: str, sw: P4RuntimeSwitch) -> None:
        """Make the fabric of the mode part of the switch's intended state (the resync writes what differs)."""
        cfg = self.configs[name]
        mode = self.settings.mode
        coalescing = {n.WAITER_LOOKUP, n.WAITER_EGRESS}
        # Hot-chunk digests in both modes that help: they are how agents learn which chunks are
        # worth single GETs (the fill-mismatch digest matters only to a pool).
        sw.intend([e for e in cfg.entries if mode is not Mode.PLAIN or e.table not in coalescing],
                  defaults=cfg.defaults,
                  groups=cfg.groups if mode is not Mode.PLAIN else None,
                  digests=cfg.digests if mode is not Mode.PLAIN else None)

    def clean_slate(self) -> None:
        """Push the pipeline afresh to every switch: registers and counters start from zero.

        The owner's deliberate reset (an experiment's next mode), not a restart to recover
        from: the new instances are taken as the ones this controller knows, so no epoch
        warns of a restart; resident chunks a switch held are pushed through it again.
        """
        for name, sw in self.switches.items():
            sw.push_pipeline()
            self._take_new_instance(name, sw.instance)

    def close(self) -> None:
        """Close every P4Runtime connection (entries stay on the switches) and stop sending hints."""
        self.hints.close()
        for sw in self.switches.values():
            sw.close()
        self.switches.clear()

    def __enter__(self) -> Controller:
        # Idempotent: ``with Controller(...).start() as c`` must not connect twice (same election id).
        return self if self.switches else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the epoch
    def run(self, stop: threading.Event, on_epoch: Callable[[EpochReport], None] | None = None) -> None:
        """Run epochs every ``epoch_s`` seconds until ``stop`` is set; a failed epoch is logged and the next runs."""
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                report = self.run_epoch()
                if on_epoch is not None:
                    on_epoch(report)
            except Exception as exc:  # a switch's trouble, a refused write, a bug: say so and go on
                self.failed_epochs += 1
                self.last_epoch_error = f"epoch {self.epoch}: {type(exc).__name__}: {str(exc).splitlines()[0]}" \
                    if str(exc) else f"epoch {self.epoch}: {type(exc).__name__}"
                log.warning("%s; the controller runs on (%d failed epoch(s) so far)", self.last_epoch_error,
                            self.failed_epochs)
                log.debug("epoch %d failed", self.epoch, exc_info=True)
            next_at = max(next_at + self.settings.epoch_s, time.monotonic())  # no burst of late epochs
            stop.wait(max(0.0, next_at - time.monotonic()))

    def run_epoch(self) -> EpochReport:
        """One epoch: observations in, pool changes out to every switch."""
        with self._lock:
            self.epoch += 1
            report = EpochReport(self.epoch)
            self._notice_new_instances()
            self._apply_overrides(report)
            if self.settings.mode is Mode.POOL:
                observations = self._observe(report)
                report.observations = len(observations)
                changes = self.engine.step(observations)
                self._apply(changes, report)
            elif self.settings.mode is Mode.MULTICAST:
                self._observe(report, hot_only=True)
            if self.settings.mode is not Mode.PLAIN:
                if self.epoch % self.settings.epochs_per_sketch_epoch == 0:
                    self._next_sketch_epoch()
                self._send_hints(time.monotonic())
            self.reports.append(report)
            if report.admitted or report.evicted:
                log.info("epoch %d: %d digests, %d observations, admitted %d, evicted %d", report.epoch,
                         report.digests, report.observations, len(report.admitted), len(report.evicted))
            for node in self.directory.sweep():
                log.warning("node %s missed its heartbeats: marked down, its chunks no longer offered", node)
            self.publish_snapshot()
            return report

    def _observe(self, report: EpochReport, hot_only: bool = False) -> list[Observation]:
        """Digests in, observations for the policy out; every hot report also goes to ``self.hot``.

        ``hot_only`` (multicast mode, no pool): only the hot set is kept.
        """
        obs: list[Observation] = []
        moved: set[int] = set()
        now = time.monotonic()
        while True:
            try:
                switch, digest = self._digests.get_nowait()
            except queue.Empty:
                break
            if digest.name == n.FILL_MISMATCH and not hot_only:
                self._on_mismatch(digest, report)
                continue
            if digest.name != n.HOT_CHUNK:
                continue
            report.digests += 1
            for item in digest.items:
                self.hot.report(int(item["chunk_key"]), now)
                if hot_only:
                    continue
                info = self.catalog.get(item["chunk_key"])
                if info is None:
                    report.unknown_keys += 1
                    continue
                count = max(1, min(int(item["estimate"]), self.settings.max_observations_per_digest))
                obs.extend([Observation(info.key, info.parent, info.position, info.nbytes)] * count)
                act = self.activity.setdefault(info.key, ChunkActivity())
                act.fetches += count
                act.reported = int(item["estimate"])
                demand = self.demand.setdefault(info.key, {})
                demand[switch] = demand.get(switch, 0) + count
                res = self.residents.get(info.key)
                if res is not None and switch not in res.site.switches:
                    moved.add(info.key)  # demand from outside its site: maybe another switch saves more
        for key in sorted(moved):
            self._relocate(key, report)
        # Resident chunks make no digests (popularity counts misses only): their hits on
        # fragment 0 are their fetches, read from the per-slot counters of every switch.
        if self.residents:
            hits = self._slot_hits()
            for res in self.residents.values():
                delta = hits.get(res.base_slot, 0)
                report.slot_hits += delta
                info = res.info
                if delta:
                    act = self.activity.setdefault(info.key, ChunkActivity())
                    act.hits += delta
                    act.fetches += delta
                obs.extend([Observation(info.key, info.parent, info.position, info.nbytes)]
                           * min(delta, self.settings.max_observations_per_digest))
        return obs

    def _send_hints(self, now: float) -> None:
        """Send agents the hot and pooled chunks when they changed (or a refresh is due)."""
        if not self.hints.sinks:
            return
        pooled = self._filled()
        hot = self.hot.live(now) - pooled

        def nbytes(key: int) -> int:
            info = self.catalog.get(key)
            return 0 if info is None else info.nbytes

        chunks = hints_for(hot, pooled, nbytes)
        if self._hint_schedule.due(chunks, now):
            merge = self.settings.mode is not Mode.PLAIN
            self.hints.publish(Hints(chunks, self.settings.hints.ttl_s, merge))

    def _slot_hits(self) -> dict[int, int]:
        """Hits on the residents' base slots since the last read, summed over the switches that answer now.

        Only those cells are read: a resident's hits on fragment 0 are its fetches, and a
        read of all 1,024 cells every epoch took the model switch's CPU from its packets
        (docs/design/notes-daemon.md).  A cell read for the first time is a baseline, not hits: a switch that is
        down is skipped (its hits are counted when it answers again), a new controller does
        not count a warm switch's past hits, a restarted one does not count backwards, and a
        slot counts from when its chunk was placed there (``_baseline_slots``).
        """
        slots = sorted({res.base_slot for res in self.residents.values()})
        total: dict[int, int] = {}
        for name, sw in self.switches.items():
            if not sw.ready:
                continue
            now = self._read_slot_hits(name, sw, slots)
            if now is None:
                continue
            seen = self._hits_seen.get(name)
            self._hits_seen[name] = now  # only the slots in use: one freed and used again starts anew
            if seen is None:
                continue
            for idx, packets in now.items():
                before = seen.get(idx)
                delta = 0 if before is None else packets - before
                if delta > 0:
                    total[idx] = total.get(idx, 0) + delta
        return total

    def _filled(self) -> set[int]:
        """The resident chunks whose last slot was written since their placement (``controller.fills``)."""
        last = {k: r.base_slot + r.info.frag_count - 1 for k, r in self.residents.items()}
        ready = [(name, sw) for name, sw in self.switches.items() if sw.ready]
        slots = self._fills.unfilled(last)
        return self._fills.update(last, summed_cells(ready, n.SLOT_FILLS, slots) if slots else {})

    def _baseline_slots(self, slots: list[int]) -> None:
        """Read the hit counters of slots just given to chunks, so their hits count from now."""
        for name, sw in self.switches.items():
            seen = self._hits_seen.get(name)
            if seen is None or not sw.ready:
                continue
            now = self._read_slot_hits(name, sw, slots)
            if now is not None:
                seen.update(now)

    @staticmethod
    def _read_slot_hits(name: str, sw: P4RuntimeSwitch, slots: list[int]) -> dict[int, int] | None:
        if not slots:
            return {}
        try:
            return {idx: v.packets for idx, v in sw.read_counter_cells(n.SLOT_HITS, slots).items()}
        except P4RuntimeError as exc:
            log.info("switch %s: slot hits not read this epoch (%s)", name, str(exc).splitlines()[0])
            return None

    def _notice_new_instances(self) -> None:
        """A switch that came back as a new instance counts hits from zero and gets the pool pushed through it."""
        for name, sw in self.switches.items():
            seen = self._instance_seen.get(name)
            if seen is None or sw.instance == seen or not sw.ready:
                continue
            held = self._take_new_instance(name, sw.instance)
            if held:
                log.warning("switch %s: a new instance (restarted; its registers are empty): asking the holder to "
                            "push %d resident chunk(s) through it", name, len(held))
            else:
                log.warning("switch %s: a new instance (restarted): resynced", name)

    def _take_new_instance(self, name: str, instance: int) -> list[int]:
        """Know ``instance`` of switch ``name`` (empty registers); the pool's chunks sited there, to refill."""
        self._instance_seen[name] = instance
        self._hits_seen[name] = {}  # its counters started again from zero
        if self.settings.mode is not Mode.POOL:
            return []
        held = [k for k, r in self.residents.items() if r.site.switch == name]
        self._refill.update(held)  # only the chunks it holds: a relay keeps no bytes
        self._fills.reset(held)
        return held

    def _apply(self, changes: list[Change], report: EpochReport) -> None:
        # Evictions first: an admission in the same epoch may reuse the freed slots.
        for ch in changes:
            if isinstance(ch, Evict) and ch.key in self.residents:
                self._remove(ch.key)
                report.evicted.append(ch.key)
        fresh: list[int] = []
        for ch in changes:
            if isinstance(ch, Admit):
                info = self.catalog.get(ch.key)
                if info is None or ch.key in self.residents:
                    continue
                if ch.n_slots != info.frag_count:
                    raise ControllerError(f"policy gave chunk {ch.key:#x} {ch.n_slots} slots, it has "
                                          f"{info.frag_count} fragments")
                self._place(info, ch.base_slot)
                fresh.append(ch.key)
                report.admitted.append(ch.key)
        if fresh:
            self._baseline_slots([self.residents[k].base_slot for k in fresh])
        # An admitted chunk fills on pass from the answers that cross its switch, unless asked
        # to be pushed; a refill (restart, move, new generation) is always pushed.
        push = fresh if self.settings.push_admitted else []
        if self._refill:
            push.extend(k for k in self._refill if k in self.residents and k not in push)
            self._refill.clear()
        if push and self.filler is not None:
            # One push per holding switch, to its sink: routed there, filled on pass, dropped.
            by_sink: dict[str, list[int]] = {}
            for key in push:
                by_sink.setdefault(self.sinks[self.residents[key].site.switch], []).append(key)
            for sink, keys in by_sink.items():
                self.filler.push(keys, sink)

    def _generation(self, key: int) -> int:
        """The generation in force for ``key``: the directory's, 0 when it has issued none."""
        version = self.directory.version(key)
        return 0 if version is None else version.generation

    def site_of(self, key: int) -> Site:
        """Where chunk ``key`` should live now, from its demand and its holders (``choose_site``)."""
        # The holders the directory knows for it; every holder of the topology when it knows none.
        known = {h.address for h in self.directory.holders(key) if h.role is Role.HOLDER}
        names = [h.name for h in self.topo.holders() if h.address in known] or [h.name for h in self.topo.holders()]
        return choose_site(self.topo, names, self.demand.get(key, {}))

    def _install_site(self, res: Resident, state: int, old: Site | None = None) -> None:
        """Write the entries of ``res``: ``state`` on its switch, UPSTREAM on its relays (MODIFY where ``old`` had)."""
        had = old.switches if old is not None else frozenset()
        for name in sorted(res.site.switches):
            entry = pool_entry(res, state if name == res.site.switch else PoolState.UPSTREAM)
            sw = self.switches.get(name)
            if sw is None:
                continue
            if name in had:
                sw.modify_entries([entry])
            else:
                sw.insert_entries([entry])
        for name in sorted(had - res.site.switches):
            if name in self.switches:
                self.switches[name].delete_entry(n.POOL_LOOKUP, {n.KEY_CHUNK_KEY: res.info.key})

    def _place(self, info: ChunkInfo, base_slot: int) -> None:
        if base_slot + info.frag_count > self.settings.pool_slots:
            raise ControllerError(f"chunk {info.key:#x} at slot {base_slot} overruns the pool")
        if info.key == MARK_KEY:
            raise ControllerError(f"chunk key {MARK_KEY:#x} is reserved for the placement mark")
        res = Resident(info, base_slot, self._next_placement(), self._generation(info.key),
                       site=self.site_of(info.key))
        self._install_site(res, PoolState.FILLING)
        self.residents[info.key] = res
        log.info("chunk %#x: held by %s at slot %d%s", info.key, res.site.switch, base_slot,
                 f", relayed by {', '.join(sorted(res.site.relays))}" if res.site.relays else "")

    def _relocate(self, key: int, report: EpochReport) -> None:
        """Move a resident chunk to the switch its demand now meets at (a new placement, refilled by a push)."""
        res = self.residents.get(key)
        if res is None:
            return
        site = self.site_of(key)
        if site == res.site:
            return
        old = res.site
        res.site = site
        res.placement = self._next_placement()
        res.valid = False
        self._install_site(res, PoolState.FILLING, old)
        self._refill.add(key)
        report.replaced.append(key)
        log.info("chunk %#x: demand from outside its site; moved from %s to %s", key, old.switch, site.switch)

    def _replace(self, key: int, generation: int, nbytes: int, report: EpochReport) -> bool:
        """Move a resident chunk to a new placement at ``generation`` and length ``nbytes``.

        Bytes stored under the old placement are never served again; the slots refill from
        the holder's next DATA (pushed at the next epoch).  A length that needs another
        number of slots evicts the chunk instead (the policy may admit it again).  False
        when the chunk is not resident.
        """
        res = self.residents.get(key)
        if res is None:
            return False
        info = ChunkInfo(key, res.info.parent, res.info.position, nbytes)
        self.catalog.add(info)
        if info.frag_count != res.info.frag_count:
            self._apply(policy_evict(self.engine, key, EvictAction.DROP), report)
            return True
        res.info = info
        res.generation = generation
        res.placement = self._next_placement()
        res.valid = False
        self._install_site(res, PoolState.FILLING, res.site)
        self._refill.add(key)
        report.replaced.append(key)
        return True

    def _on_mismatch(self, digest: Digest, report: EpochReport) -> None:
        """The holder's DATA disagreed with an entry: follow the holder unless the directory knows better."""
        for item in digest.items:
            report.mismatches += 1
            key, generation, nbytes = int(item["chunk_key"]), int(item["generation"]), int(item["chunk_len"])
            res = self.residents.get(key)
            if res is None or (res.generation, res.info.nbytes) == (generation, nbytes):
                continue  # evicted meanwhile, or already re-placed
            version = self.directory.version(key)
            if version is not None:
                current = (version.generation, version.nbytes) == (generation, nbytes)
            else:  # no directory generations: the (trusted) writer's newer or equal generation wins
                current = generation >= res.generation
            if current:
                log.info("chunk %#x: holder sends generation %d, %d bytes; re-placing it", key, generation, nbytes)
                self._replace(key, generation, nbytes, report)

    def republish(self, key: int, generation: int, nbytes: int) -> dict[str, Any]:
        """A chunk's content changed (the directory issued ``generation``): no switch serves the old bytes after this.

        Runs in the epoch loop (``submit(Override("republish", ...))``), so every switch's
        entry has moved before the publisher is answered.
        """
        with self._lock:
            report = self.reports[-1] if self.reports else EpochReport(self.epoch)
            moved = self._replace(key, generation, nbytes, report)
            info = self.catalog.get(key)
            if not moved and info is not None and info.nbytes != nbytes:
                self.catalog.add(ChunkInfo(key, info.parent, info.position, nbytes))
        return {"key": f"{key:#x}", "generation": generation, "replaced": moved}

    def _remove(self, key: int) -> None:
        for name in sorted(self.residents[key].site.switches):
            if name in self.switches:
                self.switches[name].delete_entry(n.POOL_LOOKUP, {n.KEY_CHUNK_KEY: key})
        del self.residents[key]

    def _next_sketch_epoch(self) -> None:
        # Tags 1..127 cycle; a cell written under an older tag reads as zero.
        self.sketch_epoch = self.sketch_epoch % 127 + 1
        params = {"threshold": self.settings.fabric.popularity_threshold, "epoch": self.sketch_epoch}
        for sw in self.switches.values():
            sw.set_default_action(n.POPULARITY_CONFIG, n.SET_POPULARITY, params)

    # ------------------------------------------------------------------ pool state
    def mark_valid(self, key: int) -> None:
        """Switch a filled chunk to VALID: passing DATA no longer rewrites its current slots (NO_CACHE DATA does)."""
        with self._lock:
            res = self.residents[key]
            res.valid = True
            self._install_site(res, PoolState.VALID, res.site)

    def status(self) -> dict[str, Any]:
        """Connection and pool state for logs and the API; per switch: up, down since, resyncing, last error."""
        used = sum(r.info.frag_count for r in self.residents.values())
        return {
            "mode": str(self.settings.mode),
            "epoch": self.epoch,
            "failed_epochs": self.failed_epochs,
            "last_epoch_error": self.last_epoch_error,
            "switches": {name: {"address": self.endpoints[name].address, "connected": sw.connected,
                                "master": sw.is_master, **sw.health()} for name, sw in self.switches.items()},
            "pool": {"slots": self.settings.pool_slots, "used": used, "chunks": len(self.residents)},
            "catalog": len(self.catalog),
        }

    # ------------------------------------------------------------------ operator overrides
    def submit(self, override: Override) -> Future[dict[str, Any]]:
        """Queue an override for the start of the next epoch; the future holds its outcome.

        The outcome is a dict (what was admitted / evicted), or :class:`OverrideRefusedError`
        with a code: ``unknown_key``, ``not_resident``, ``not_pinned``, ``pinned``,
        ``has_children``, ``no_space``, ``pin_limit``, ``no_lower_tier``, ``bad_request``,
        ``pool_off``.
        """
        fut: Future[dict[str, Any]] = Future()
        self._overrides.put((override, fut))
        return fut

    def _apply_overrides(self, report: EpochReport) -> None:
        while True:
            try:
                ov, fut = self._overrides.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue  # the API gave up waiting: an override nobody awaits is not applied late
            try:
                result = self._override(ov, report)
            except ControllerError as exc:  # OverrideRefusedError included
                fut.set_exception(exc)
                continue
            except Exception as exc:  # a failed switch write: tell the operator, then fail the epoch as usual
                fut.set_exception(exc)
                raise
            # Publish before answering: the operator's next read must see the override.
            self.publish_snapshot()
            fut.set_result(result)

    def _info(self, key: int) -> ChunkInfo:
        info = self.catalog.get(key)
        if info is None:
            raise OverrideRefusedError("unknown_key", f"chunk {key:#x} is not in the catalog")
        return info

    def _override(self, ov: Override, report: EpochReport) -> dict[str, Any]:
        if ov.op == "republish":  # in every mode: a switch pool may hold the chunk from an earlier mode
            if ov.nbytes <= 0:
                raise OverrideRefusedError("bad_request", "republish: nbytes must be positive")
            return self.republish(ov.key, ov.generation, ov.nbytes) | {"epoch": self.epoch}
        if self.settings.mode is not Mode.POOL:
            raise OverrideRefusedError("pool_off", f"the controller runs in {self.settings.mode} mode: no switch pool")
        before_a, before_e = len(report.admitted), len(report.evicted)
        out: dict[str, Any] = {"op": ov.op}
        lead = self.engine.pool
        if ov.op in ("admit", "pin"):
            info = self._info(ov.key)
            out["key"] = f"{ov.key:#x}"
            r = lead.residents.get(ov.key)
            if r is not None and (ov.op == "admit" or r.pinned):
                out["already"] = True
            else:
                try:
                    # Through the engine, so its slot allocation and the switch stay one; both
                    # displace the lowest-value unpinned leaves. An admitted chunk then competes
                    # on value like any other; a pinned one stays until unpinned.
                    if ov.op == "admit":
                        changes = policy_admit(self.engine, info.key, info.parent, info.position, info.nbytes,
                                               ov.tenant)
                    else:
                        changes = self.engine.pin(info.key, info.parent, info.position, info.nbytes, ov.tenant)
                except QuotaError as exc:
                    code = "pin_limit" if ov.op == "pin" and ("pin bound" in str(exc) or "quota" in str(exc)) \
                        else "no_space"
                    raise OverrideRefusedError(code, str(exc)) from None
                self._apply(changes, report)
        elif ov.op == "unpin":
            self._info(ov.key)
            out["key"] = f"{ov.key:#x}"
            r = lead.residents.get(ov.key)
            if r is None or not r.pinned:
                raise OverrideRefusedError("not_pinned", f"chunk {ov.key:#x} is not pinned")
            self._apply(self.engine.unpin(ov.key), report)
        elif ov.op == "evict":
            self._info(ov.key)
            out["key"] = f"{ov.key:#x}"
            r = lead.residents.get(ov.key)
            # A leftover of an earlier leader (policy/image.py) is in the switch but in no pool: it may go
            if r is None and not self.engine.holds(ov.key):
                raise OverrideRefusedError("not_resident", f"chunk {ov.key:#x} is not in the switch pool")
            if r is not None and r.pinned:
                raise OverrideRefusedError("pinned", f"chunk {ov.key:#x} is pinned: unpin it first")
            if r is not None and r.children:
                raise OverrideRefusedError("has_children", f"chunk {ov.key:#x} has {r.children} resident child "
                                                           "chunk(s): evict them first (a child is useless without "
                                                           "its parent)")
            # The switch demotes to the pool (policy.tiers.DEMOTION): a live holder must still serve it.
            # Copies in inference nodes' own HBM/DRAM serve nobody else.
            if ov.demote and not any(h.role is Role.HOLDER for h in self.directory.holders(ov.key)):
                raise OverrideRefusedError("no_lower_tier", f"chunk {ov.key:#x}: no live holder keeps it in a lower "
                                                            "tier to demote to (use --drop)")
            action = EvictAction.DEMOTE if ov.demote else EvictAction.DROP
            self._apply(policy_evict(self.engine, ov.key, action), report)
            out["action"] = action.value
        elif ov.op == "quota":
            if ov.tenant < 0 or (ov.slots is not None and ov.slots < 1):
                raise OverrideRefusedError("bad_request", "quota: tenant must be >= 0 and slots >= 1")
            try:
                changes = policy_set_quota(self.engine, ov.tenant, ov.slots)
            except QuotaError as exc:
                raise OverrideRefusedError("pin_limit", str(exc)) from None
            self._apply(changes, report)
            out.update(tenant=ov.tenant, slots=ov.slots)
        else:
            raise OverrideRefusedError("bad_request", f"unknown override {ov.op!r}")
        out["admitted"] = [f"{k:#x}" for k in report.admitted[before_a:]]
        out["evicted"] = [f"{k:#x}" for k in report.evicted[before_e:]]
        res = self.residents.get(ov.key)
        if "key" in out and res is not None:
            out["base_slot"] = res.base_slot
        out["epoch"] = self.epoch
        return out

    # ------------------------------------------------------------------ snapshot for the API
    def publish_snapshot(self) -> None:
        """Publish what the operator API shows (an immutable document replaced as a whole)."""
        lead = self.engine.pool
        places = self.directory.chunk_tiers()
        rows: list[dict[str, Any]] = []
        for key in set(self.residents) | set(self.activity):
            act = self.activity.get(key, ChunkActivity())
            pr = lead.residents.get(key)
            res = self.residents.get(key)
            info = self.catalog.get(key)
            where = places.get(key, [])
            rows.append({
                "key": f"{key:#x}", "value": lead.value_of(key), "hits": act.hits, "fetches": act.fetches,
                "estimate": self.engine.sketch.estimate(key), "reported": act.reported,
                "tier": "switch" if res is not None else (where[0][1] if where else "-"),
                "holders": sorted({nid for nid, _ in where}), "pinned": bool(pr is not None and pr.pinned),
                "base_slot": res.base_slot if res is not None else None,
                "slots": info.frag_count if info is not None else None,
            })
        self.snapshot = {"time": time.time(), "status": self.status(), "chunks": rows,
                         "policy": dict(self.engine.stats)}


def _default_driver(ep: SwitchEndpoint, settings: ControllerSettings) -> P4RuntimeSwitch:
    device_config = settings.bmv2_json if settings.bmv2_json and settings.bmv2_json.exists() else None
    # A switch that is down must not hold the epoch loop: calls do not wait for its
    # reconnect, and writes meanwhile go to the intended state the resync applies.
    return P4RuntimeSwitch(ep.address, settings.p4info, device_config, device_id=ep.device_id,
                           timeout_s=settings.connect_timeout_s, wait_ready_s=0, defer_writes=True,
                           max_backoff_s=settings.reconnect_backoff_s)
