"""The same kind of calls through p4runtime-shell, as a reviewer drives a switch.

The shell pushes the pipeline itself (clearing the target), so its probe runs after the
main one on the same target; its answers are the codes the shell reports.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool import contract
from kvpool.p4rt.p4info import SCOPE_DEFAULT_ONLY, SCOPE_TABLE_ONLY, P4Info, TableInfo
from switchmodel.conformance.client import PRIMARY_ID, _code_name, _squeeze
from switchmodel.conformance.entities import _actions_in_scope
from switchmodel.conformance.golden import Answers

# ---------------------------------------------------------------------------------------------
# The same kind of calls through p4runtime-shell, as a reviewer drives a switch
# ---------------------------------------------------------------------------------------------


def _shell_value(f: Any, seed: int) -> str:
    value = seed % (1 << f.bitwidth) or 1
    if f.match_type == "lpm":
        return f"{value}/{f.bitwidth}"
    if f.match_type == "ternary":
        return f"{value}&&&{(1 << f.bitwidth) - 1}"
    if f.match_type == "range":
        return f"{value}..{value}"
    return str(value)


def run_shell_probe(address: str, p4info_path: Path, device_config_path: Path, device_id: int = 1) -> Answers:
    """Insert, read, modify and delete through p4runtime-shell on every table, group and digest.

    The shell pushes the pipeline itself (clearing the target), so this runs after
    :func:`run_probe` on the same target. Answers are the codes the shell reports.
    """
    from p4runtime_sh import shell as sh

    probe = _ShellProbe(sh, P4Info.load(p4info_path))
    sh.setup(device_id=device_id, grpc_addr=address, election_id=(0, PRIMARY_ID),
             config=sh.FwdPipeConfig(str(p4info_path), str(device_config_path)), verbose=False)
    try:
        for t in probe.p4info.tables:
            probe.table(t)
        for c in probe.p4info.counters[:2]:
            probe.attempt(f"{c.name}: read every cell", lambda: len(list(sh.CounterEntry(c.name).read())))  # noqa: B023
        probe.multicast(contract.COALESCE_MCAST_GRP)
        for d in probe.p4info.digests:
            probe.digest(d.name)
    finally:
        sh.teardown()
    return probe.answers


class _ShellProbe:
    """Calls made through p4runtime-shell's entity API, answers as the codes it reports."""

    def __init__(self, sh: Any, p4info: P4Info) -> None:
        self.sh = sh
        self.p4info = p4info
        self.answers: Answers = []

    def attempt(self, name: str, call: Callable[[], Any]) -> None:
        from p4runtime_sh.p4runtime import P4RuntimeException, P4RuntimeWriteException
        from p4runtime_sh.utils import UserError

        try:
            got = call()
            answer = "OK" if got is None else f"OK {got}"
        except P4RuntimeWriteException as e:
            answer = _squeeze([_code_name(err.canonical_code) for _, err in e.errors])
        except P4RuntimeException as e:
            answer = str(e.grpc_error.code().name)
        except UserError as e:
            answer = f"refused by the shell: {str(e).splitlines()[0]}"
        self.answers.append((f"shell: {name}", answer))

    def _entry(self, t: TableInfo, seed: int, value: int = 1) -> Any:
        acts = _actions_in_scope(self.p4info, t, SCOPE_DEFAULT_ONLY)
        action = self.p4info.action(acts[0]) if acts else None
        te = self.sh.TableEntry(t.name)(action=action.name) if action else self.sh.TableEntry(t.name)
        for f in t.match_fields:
            te.match[f.name] = _shell_value(f, seed)
        if action is not None:
            for prm in action.params:
                te.action[prm.name] = str(value % (1 << prm.bitwidth))
        if t.needs_priority:
            te.priority = 10
        return te

    def _set_default(self, t: TableInfo, action_id: int) -> None:
        action = self.p4info.action(action_id)
        te = self.sh.TableEntry(t.name)(action=action.name, is_default=True)
        for prm in action.params:
            te.action[prm.name] = "1"
        te.modify()

    def table(self, t: TableInfo) -> None:
        sh, n = self.sh, t.name
        self.attempt(f"{n}: INSERT", lambda: self._entry(t, 1).insert())
        self.attempt(f"{n}: INSERT again", lambda: self._entry(t, 1).insert())
        self.attempt(f"{n}: read", lambda: len(list(sh.TableEntry(n).read())))
        self.attempt(f"{n}: MODIFY", lambda: self._entry(t, 1, value=2).modify())
        self.attempt(f"{n}: MODIFY a missing entry", lambda: self._entry(t, 2).modify())
        self.attempt(f"{n}: DELETE", lambda: self._entry(t, 1).delete())
        self.attempt(f"{n}: DELETE again", lambda: self._entry(t, 1).delete())
        defaults = _actions_in_scope(self.p4info, t, SCOPE_TABLE_ONLY)
        if defaults:
            self.attempt(f"{n}: MODIFY the default entry", lambda: self._set_default(t, defaults[0]))
        self.attempt(f"{n}: read the default entry",
                     lambda: [e.action.action_name for e in sh.TableEntry(n)(is_default=True).read()])

    def multicast(self, gid: int) -> None:
        group = self.sh.MulticastGroupEntry
        self.attempt(f"multicast group {gid}: INSERT", lambda: group(gid).add(1, 0).add(2, 1).insert())
        self.attempt(f"multicast group {gid}: INSERT again", lambda: group(gid).add(3, 0).insert())
        self.attempt(f"multicast group {gid}: read",
                     lambda: sorted((r.egress_port, r.instance) for g in group(gid).read() for r in g.replicas))
        self.attempt(f"multicast group {gid}: DELETE", lambda: group(gid).delete())
        self.attempt(f"multicast group {gid}: DELETE again", lambda: group(gid).delete())

    def _digest_entry(self, name: str) -> Any:
        de = self.sh.DigestEntry(name)
        de.max_list_size, de.max_timeout_ns, de.ack_timeout_ns = 1, 0, 10**9
        return de

    def digest(self, name: str) -> None:
        self.attempt(f"digest {name}: INSERT", lambda: self._digest_entry(name).insert())
        self.attempt(f"digest {name}: INSERT again", lambda: self._digest_entry(name).insert())
        self.attempt(f"digest {name}: read", lambda: len(list(self.sh.DigestEntry(name).read())))
        self.attempt(f"digest {name}: DELETE", lambda: self._digest_entry(name).delete())
