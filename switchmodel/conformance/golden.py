"""Targets, golden files and comparison: where the probe runs and what its answers are held against.

A golden file is BMv2's answers recorded once (``python -m switchmodel.conformance
--target bmv2 --record FILE``), with the P4Info's digest, so the model is checked against
BMv2 where BMv2 is not installed. :data:`KNOWN_DIFFERENCES` lists the calls on which the
model differs on purpose (``switchmodel/DIFFERENCES.md``); every other difference fails.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.p4rt.p4info import P4Info
from switchmodel.targets import start_bmv2

#: One answer per call: (the call's name, the answer as text), in call order.
Answers = list[tuple[str, str]]


#: Calls on which the model answers differently from BMv2 on purpose (switchmodel/DIFFERENCES.md):
#: probe name -> why. The conformance test fails on any other difference, and on a listed one
#: that no longer differs (so this list and DIFFERENCES.md cannot go stale).
KNOWN_DIFFERENCES: Mapping[str, str] = {
    "arbitration: Write with no stream open and no election id":
        "PI accepts requests without an election id while no stream is open (FAILED_PRECONDITION here "
        "only because no pipeline is set yet); the model takes writes only from the primary's stream",
    "arbitration: Write from a client with no stream, carrying the primary's election id":
        "PI identifies the primary by election id alone; the model also wants the primary's gRPC connection",
    "arbitration: Write on the backup's connection, carrying the primary's election id":
        "PI identifies the primary by election id alone; the model also wants the primary's gRPC connection",
    "pipeline: RECONCILE_AND_COMMIT with an entry in place":
        "PI replays counter cells as INSERTs, which counters refuse, so BMv2 fails the reconcile (UNKNOWN) "
        "and refuses later pushes; the model keeps the state the spec says a reconcile keeps",
}


# ---------------------------------------------------------------------------------------------
# Targets, golden files, comparison
# ---------------------------------------------------------------------------------------------


def p4info_digest(p4info: P4Info) -> str:
    """SHA-256 of the P4Info's deterministic serialization: which program a golden file was recorded for."""
    return hashlib.sha256(p4info.message.SerializeToString(deterministic=True)).hexdigest()


@contextlib.contextmanager
def model_target(device_id: int = 1) -> Iterator[str]:
    """The model's P4Runtime server in this process, fresh; yields its address."""
    from switchmodel.p4rt_server import P4RuntimeServer
    from switchmodel.state import SwitchState

    server = P4RuntimeServer(SwitchState(device_id=device_id), "127.0.0.1:0").start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop(grace=0)


@contextlib.contextmanager
def bmv2_target(binary: str, log_dir: Path, device_id: int = 1) -> Iterator[str]:
    """``simple_switch_grpc`` with no ports and no program, fresh; yields its address."""
    proc = start_bmv2([], log_dir, device_id=device_id, binary=binary)
    try:
        yield proc.grpc_addr
    finally:
        proc.stop()


def bmv2_version(binary: str) -> str:
    """What ``simple_switch_grpc --version`` prints (first line), for the golden file."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "unknown"


def load_golden(path: Path) -> dict[str, Any]:
    """A recorded answer file: ``target``, ``recorded``, ``p4info_sha256``, ``answers`` ([name, answer] pairs)."""
    doc: dict[str, Any] = json.loads(path.read_text())
    if not isinstance(doc.get("answers"), list):
        raise ValueError(f"{path}: no 'answers' list (not a conformance golden file)")
    return doc


def save_golden(path: Path, answers: Answers, p4info: P4Info, target: str) -> None:
    """Write a golden file of ``answers`` recorded on ``target``."""
    head = {"target": target, "recorded": datetime.date.today().isoformat(), "p4info_sha256": p4info_digest(p4info)}
    # One call per line, so a re-recording diffs call by call.
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    pairs = ",\n".join(f"    {json.dumps(list(a))}" for a in answers)
    path.write_text("{\n" + "\n".join(lines) + '\n  "answers": [\n' + pairs + "\n  ]\n}\n")


@dataclass(frozen=True)
class Difference:
    """One call answered differently: by the reference target and by the one under test."""

    name: str
    reference: str
    got: str

    def __str__(self) -> str:
        return f"{self.name}: reference {self.reference!r}, got {self.got!r}"


def compare(reference: Sequence[tuple[str, str]], got: Sequence[tuple[str, str]]) -> tuple[list[Difference],
                                                                                            list[str]]:
    """(calls answered differently, calls the reference has no answer for), in call order."""
    ref = dict(reference)
    diffs = [Difference(name, ref[name], answer) for name, answer in got if name in ref and ref[name] != answer]
    missing = [name for name, _ in got if name not in ref]
    return diffs, missing
