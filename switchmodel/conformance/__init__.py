"""P4Runtime conformance probe: the same P4Info-generated calls to any target, every answer kept.

The model's server (:mod:`switchmodel.p4rt_server`) must answer P4Runtime as BMv2's PI
server does. This package generates, from a P4Info alone, a fixed sequence of calls that
touch every table, counter, digest and multicast group and the arbitration rules, sends it
to a target over gRPC, and records one answer per call: the gRPC status code (for a
batched Write, the code of each update), plus what a read returned, decoded with the
shared codec. Two targets agree when every answer is equal.

Modules: :mod:`.client` (a client with its own connection), :mod:`.entities` (calls built
from the P4Info, reads decoded to text), :mod:`.probe` (the call sequence),
:mod:`.shell` (the same through p4runtime-shell), :mod:`.golden` (targets, golden files,
comparison, the known differences) and ``__main__`` (the command line). This package is
the public import path for the test and the command.

``python -m switchmodel.conformance --target bmv2 --record tests/data/p4rt_conformance.bmv2.json``
records BMv2's answers (the golden file ``tests/switchmodel/test_p4rt_conformance.py``
compares the model against when BMv2 is not installed); ``--target model`` prints the
model's; ``--compare FILE`` prints the calls on which a target differs from a recorded file.
"""

from switchmodel.conformance.client import Client
from switchmodel.conformance.golden import (
    KNOWN_DIFFERENCES,
    Answers,
    Difference,
    bmv2_target,
    bmv2_version,
    compare,
    load_golden,
    model_target,
    p4info_digest,
    save_golden,
)
from switchmodel.conformance.probe import probe_all, run_probe
from switchmodel.conformance.shell import run_shell_probe

__all__ = [
    "KNOWN_DIFFERENCES",
    "Answers",
    "Client",
    "Difference",
    "bmv2_target",
    "bmv2_version",
    "compare",
    "load_golden",
    "model_target",
    "p4info_digest",
    "probe_all",
    "run_probe",
    "run_shell_probe",
    "save_golden",
]
