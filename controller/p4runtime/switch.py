"""The driver as callers use it: :class:`P4RuntimeSwitch`, its pipeline push and resync.

:class:`P4RuntimeSwitch` joins the session (:mod:`.session`), the writes (:mod:`.writes`)
and the reads (:mod:`.reads`), and owns what needs all three: pushing the pipeline and
making the switch match the intended state (read, diff, write only the difference),
adopting a warm switch's entries, and taking a switch over with :meth:`manage`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from p4.v1 import p4runtime_pb2

from controller.p4runtime.entities import Entry, _Key, _prebuilt, _Update
from controller.p4runtime.errors import WriteError
from controller.p4runtime.reads import SwitchReads
from controller.p4runtime.session import log, make_cookie
from controller.p4runtime.writes import SwitchWrites
from kvpool import contract
from kvpool.p4rt import codec
from kvpool.p4rt.codec import DigestConfig, Value
from kvpool.p4rt.p4info import P4Info


class P4RuntimeSwitch(SwitchWrites, SwitchReads):
    """A P4Runtime client for one switch, addressed by P4Info names (see :mod:`controller.p4runtime`).

    ``wait_ready_s`` bounds how long a call waits for a reconnect in progress (default
    ``timeout_s``; 0 fails at once). With ``defer_writes`` a write made while the switch is
    down, or one the connection drops, only changes the intended state, which the resync
    after the reconnect applies: the owner keeps going through a switch's restart.
    """

    @classmethod
    def for_kvpool(cls, address: str, **kwargs: Any) -> P4RuntimeSwitch:
        """A driver for the kvpool program, with P4Info and BMv2 JSON from p4/build/."""
        if not contract.P4INFO_PATH.exists():
            raise FileNotFoundError(f"{contract.P4INFO_PATH} is missing: compile p4/ with `make -C p4`")
        json_path = contract.BMV2_JSON_PATH
        return cls(address, contract.P4INFO_PATH, json_path if json_path.exists() else None, **kwargs)

    # --- pipeline --------------------------------------------------------------------------------

    def push_pipeline(self) -> None:
        """Push our pipeline (clearing the switch), then write the intended state back onto it."""
        self._wait_ready()
        with self._lock:
            self._push_pipeline()
            if self._intended.entries or self._intended.defaults or self._intended.groups or \
                    self._intended.digests:
                self.resync()

    def _push_pipeline(self) -> None:
        """SetForwardingPipelineConfig(VERIFY_AND_COMMIT) with our P4Info, device config and a fresh cookie."""
        self._clear_multicast_groups()
        cookie = make_cookie(self.pipeline_id)
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        self._election_msg(req.election_id)
        req.config.p4info.CopyFrom(self.p4info.message)
        req.config.p4_device_config = self.device_config
        req.config.cookie.cookie = cookie
        self._call("SetForwardingPipelineConfig",
                   lambda stub: stub.SetForwardingPipelineConfig(req, timeout=max(self.timeout_s, 30.0)))
        self.cookie = cookie
        self.instance += 1  # a push clears the switch: registers and counters start from zero

    def _clear_multicast_groups(self) -> None:
        """Delete every multicast group the switch holds, before a pipeline push.

        A push should clear them, and on BMv2 (1.15.5 with PI) a read after it finds none, but
        BMv2's replication engine keeps the old groups' replicas; the groups written back after
        the push add theirs to the same group ids, so every release reached each waiter once
        more per push (3 copies after two modes of a testbed run; the same as
        p4lang/behavioral-model#891 for clone sessions).  Deleted first, nothing is left behind.
        """
        if not self._has_pipeline():
            return  # nothing pushed yet: no groups either (and a read would fail)
        groups = self.read_multicast_groups()
        if not groups:
            return
        errors = self._write([self._group_update(p4runtime_pb2.Update.DELETE, gid, ()) for gid in sorted(groups)])
        if errors:
            raise WriteError(self.address, len(groups), errors)

    # --- resync ----------------------------------------------------------------------------------

    @property
    def intended_entries(self) -> list[Entry]:
        """Entries the controller wants on the switch (what a resync restores)."""
        with self._lock:
            return list(self._intended.entries.values())

    def _attach_instance(self, counts: dict[str, int]) -> None:
        """Find out which instance of the pipeline the switch runs; push ours when it runs none or another.

        The first connect of this driver to a switch already running this pipeline adopts it
        (:attr:`adopted`: a warm switch whose state the owner may keep). Later, a cookie of
        this pipeline with another nonce means someone else pushed it (after a restart, say):
        a new instance, but no push is needed.
        """
        cookie = self.switch_cookie()
        first = not self._ever_connected
        if cookie == self.cookie:
            pass
        elif self.runs_our_pipeline(cookie):
            assert cookie is not None
            self.cookie = cookie
            if first:
                self.adopted = True
                log.info("switch %s already runs this pipeline (cookie %#x): adopting it", self.address, cookie)
            else:
                self.instance += 1
                log.warning("switch %s: pipeline pushed by someone else (cookie %#x): a new instance",
                            self.address, cookie)
        else:
            self._push_pipeline()
            counts["pipeline"] = 1
            if not first:
                log.warning("switch %s ran %s: pushed ours (a new instance: registers and counters start from zero)",
                            self.address, "no pipeline" if cookie is None else f"another pipeline ({cookie:#x})")
        self._ever_connected = True

    def intend(self, entries: Iterable[Entry] = (), *, defaults: Mapping[str, tuple[str, Mapping[str, Value]]]
               | None = None, groups: Mapping[int, Iterable[tuple[int, int]]] | None = None,
               digests: Mapping[str, DigestConfig] | None = None) -> None:
        """Add to the intended state without writing: the next resync makes the switch match.

        Entries, default actions (table -> (action, params)), multicast groups (id ->
        replicas) and digest configs, validated against the P4Info now. For a controller
        that adopts a warm switch: what the switch holds already costs nothing, the rest is
        written by the one resync of :meth:`manage`.
        """
        with self._lock:
            for e in entries:
                key, canon = self._normalize(e)
                if not canon.action:
                    raise ValueError(f"{canon.describe()}: an action is required")
                self._intended.entries[key] = canon
            for table, (action, params) in (defaults or {}).items():
                call = codec.action_call(self.p4info, action, params)
                self._intended.defaults[self._table(table).name] = (call.action, dict(call.params))
            for gid, replicas in (groups or {}).items():
                self._intended.groups[int(gid)] = tuple((int(p), int(r)) for p, r in replicas)
            for name, config in (digests or {}).items():
                self._intended.digests[self.p4info.digest(name).name] = config

    def adopt(self, table: str) -> list[Entry]:
        """Take the entries ``table`` holds on the switch as intended (a warm switch): a resync keeps them.

        For a controller that starts on a switch another controller programmed: call it
        after ``connect(push_pipeline=False)`` and before :meth:`manage`, then continue
        from the entries it returns instead of deleting them.
        """
        got = self.read_entries(table)
        self.intend(got)
        return got

    def manage(self) -> None:
        """Take the switch over after ``connect(push_pipeline=False)``: resync it to the intended state now
        and on every reconnect or promotion (what ``connect()`` does by default).

        The pause between the two lets a restarted controller read back what the switch held
        (its pool entries, their placement ids, ``controller.placement``) and :meth:`adopt`
        or :meth:`intend` what it keeps before the resync replaces the rest. A switch that is
        down, or held by another controller, is resynced when it answers or promotes us.
        """
        self._manage = True
        if self._connected.is_set() and self._is_master:
            self._resync_as_owner(mark_ready=True)

    def resync(self) -> dict[str, int]:
        """Make the switch match the intended state: pipeline, entries, defaults, groups, digests.

        Pushes the pipeline when the switch runs none or another one (see
        :meth:`_attach_instance`), then reads what the switch holds and writes only the
        difference. Returns counts of the updates sent, by kind.
        """
        counts = {"pipeline": 0, "insert": 0, "modify": 0, "delete": 0}
        with self._lock:
            self._attach_instance(counts)
            updates: list[_Update] = []
            # Entries: switch's view keyed the same way as the intended state.
            have: dict[_Key, Entry] = {}
            for e in self._read_mutable_entries():
                key, canon = self._normalize(e)
                have[key] = canon
            want = self._intended.entries
            for key, e in have.items():
                if key not in want:
                    updates.append(self._entry_update(p4runtime_pb2.Update.DELETE, key, e))
                    counts["delete"] += 1
            for key, e in want.items():
                if key not in have:
                    updates.append(self._entry_update(p4runtime_pb2.Update.INSERT, key, e))
                    counts["insert"] += 1
                elif (have[key].action, dict(have[key].params)) != (e.action, dict(e.params)):
                    updates.append(self._entry_update(p4runtime_pb2.Update.MODIFY, key, e))
                    counts["modify"] += 1
            for table, (action, params) in self._intended.defaults.items():
                if self.read_default_action(table) != (action, params):
                    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
                    codec.encode_default_entry(self.p4info, self._table(table),
                                               codec.action_call(self.p4info, action, params), u.entity.table_entry)
                    updates.append(_prebuilt(u, f"MODIFY default of {table} -> {action}"))
                    counts["modify"] += 1
            groups = self.read_multicast_groups()
            for gid in groups:
                if gid not in self._intended.groups:
                    updates.append(self._group_update(p4runtime_pb2.Update.DELETE, gid, ()))
                    counts["delete"] += 1
            for gid, want_reps in self._intended.groups.items():
                if gid not in groups:
                    updates.append(self._group_update(p4runtime_pb2.Update.INSERT, gid, want_reps))
                    counts["insert"] += 1
                elif sorted(groups[gid]) != sorted(want_reps):  # replicas are a set (BMv2 reads them reversed)
                    updates.append(self._group_update(p4runtime_pb2.Update.MODIFY, gid, want_reps))
                    counts["modify"] += 1
            digests = self.read_digest_configs()
            for name, config in self._intended.digests.items():
                if name not in digests:
                    updates.append(self._digest_update(p4runtime_pb2.Update.INSERT, name, config))
                    counts["insert"] += 1
                elif digests[name] != config:
                    updates.append(self._digest_update(p4runtime_pb2.Update.MODIFY, name, config))
                    counts["modify"] += 1
            for name in digests:
                if name not in self._intended.digests:
                    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.DELETE)
                    codec.encode_digest_entry(self.p4info.digest(name), None, u.entity.digest_entry)
                    updates.append(_prebuilt(u, f"DELETE digest {name}"))
                    counts["delete"] += 1
            # Deletes first so a full table has room for the inserts.
            updates.sort(key=lambda u: u.type != p4runtime_pb2.Update.DELETE)
            errors = self._write(updates)
            if errors:
                raise WriteError(self.address, len(updates), errors)
        log.info("switch %s resynced: %s", self.address, counts)
        return counts



@contextlib.contextmanager
def connected(address: str, p4info: str | Path | P4Info, device_config: str | Path | bytes | None = None,
              **kwargs: Any) -> Iterator[P4RuntimeSwitch]:
    """``with connected(addr, p4info, json) as sw:`` — a connected switch, closed afterwards."""
    sw = P4RuntimeSwitch(address, p4info, device_config, **kwargs)
    try:
        sw.connect()
        yield sw
    finally:
        sw.close()

