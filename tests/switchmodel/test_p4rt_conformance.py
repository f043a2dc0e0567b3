"""The model's P4Runtime server answers every P4Info-generated call as BMv2 does.

:mod:`switchmodel.conformance` sends the same sequence of calls (every table, counter,
digest and multicast group; duplicates, missing entries, too-wide values, unknown ids,
keyless tables, default entries, backup and stream-less writes; then the same through
p4runtime-shell) to the model and to a reference, and the answers are compared one by one.

The reference is a live BMv2 when ``simple_switch_grpc`` is on PATH or in /opt/bmv2/bin,
else the golden file ``tests/data/p4rt_conformance.bmv2.json`` recorded once on BMv2
(``python -m switchmodel.conformance --target bmv2 --record tests/data/p4rt_conformance.bmv2.json``).
The test prints which one it used. Differences the model keeps on purpose are listed in
``switchmodel.conformance.KNOWN_DIFFERENCES`` and ``switchmodel/DIFFERENCES.md``.
"""

from __future__ import annotations

import pytest

from kvpool import contract
from kvpool.p4rt.p4info import P4Info
from switchmodel.conformance import (
    KNOWN_DIFFERENCES,
    Answers,
    bmv2_target,
    bmv2_version,
    compare,
    load_golden,
    model_target,
    p4info_digest,
    probe_all,
)
from switchmodel.targets import find_simple_switch_grpc
from tests.paths import DATA

GOLDEN = DATA / "p4rt_conformance.bmv2.json"
RECORD = "python -m switchmodel.conformance --target bmv2 --record tests/data/p4rt_conformance.bmv2.json"

pytestmark = pytest.mark.skipif(not contract.P4INFO_PATH.exists() or not contract.BMV2_JSON_PATH.exists(),
                                reason="p4/build/ has no compiled program (make -C p4)")


def _probe(address: str) -> Answers:
    return probe_all(address, contract.P4INFO_PATH, contract.BMV2_JSON_PATH)


@pytest.fixture(scope="module")
def model() -> Answers:
    with model_target() as address:
        return _probe(address)


@pytest.fixture(scope="module")
def live_bmv2(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Answers] | None:
    binary = find_simple_switch_grpc()
    if binary is None:
        return None
    with bmv2_target(binary, tmp_path_factory.mktemp("bmv2")) as address:
        return f"live BMv2 ({bmv2_version(binary)}, {binary})", _probe(address)


@pytest.fixture(scope="module")
def reference(live_bmv2: tuple[str, Answers] | None) -> tuple[str, Answers]:
    """(where the answers come from, BMv2's answers)."""
    if live_bmv2 is not None:
        return live_bmv2
    if not GOLDEN.exists():
        pytest.fail(f"no simple_switch_grpc here and no golden file {GOLDEN}; record it where BMv2 is "
                    f"installed: {RECORD}")
    doc = load_golden(GOLDEN)
    if doc["p4info_sha256"] != p4info_digest(P4Info.load(contract.P4INFO_PATH)):
        pytest.fail(f"{GOLDEN.name} was recorded for another P4Info (the program changed); re-record it where "
                    f"BMv2 is installed: {RECORD}")
    return (f"golden file {GOLDEN.name} ({doc['target']}, recorded {doc['recorded']}; no simple_switch_grpc "
            "here)", [(str(n), str(a)) for n, a in doc["answers"]])


def test_model_answers_every_call_as_bmv2(model: Answers, reference: tuple[str, Answers],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    source, answers = reference
    diffs, missing = compare(answers, model)
    unexpected = [d for d in diffs if d.name not in KNOWN_DIFFERENCES]
    stale = sorted(set(KNOWN_DIFFERENCES) - {d.name for d in diffs})
    with capsys.disabled():
        print(f"\nP4Runtime conformance: the model against {source}: {len(model)} calls, "
              f"{len(diffs)} answered differently, all of them documented in switchmodel/DIFFERENCES.md"
              if not unexpected else f"\nP4Runtime conformance against {source}: {len(unexpected)} differences")
    assert not missing, f"the reference has no answer for {len(missing)} call(s) ({missing[:3]}...); re-record: " \
                        f"{RECORD}"
    assert not unexpected, "the model answers differently from BMv2:\n" + "\n".join(map(str, unexpected))
    assert not stale, f"listed as known differences but answered alike now (remove them from " \
                      f"KNOWN_DIFFERENCES and switchmodel/DIFFERENCES.md): {stale}"


@pytest.mark.parametrize("call", [
    "arbitration: Write from the backup",
    "arbitration: SetForwardingPipelineConfig from the backup",
    "arbitration: Write with no stream open and an election id",
    "arbitration: Write from a client with no stream and no election id",
    "arbitration: Write from a client with no stream and a made-up election id",
])
def test_backup_and_stream_less_writes_are_refused_on_both(call: str, model: Answers,
                                                           reference: tuple[str, Answers]) -> None:
    assert dict(model)[call] == "PERMISSION_DENIED"
    assert dict(reference[1])[call] == "PERMISSION_DENIED"


def test_the_model_refuses_writes_that_do_not_come_from_the_primarys_stream(model: Answers) -> None:
    # PI takes these (it checks the election id alone); the model wants the primary's connection too.
    answers = dict(model)
    for call in (c for c in KNOWN_DIFFERENCES if c.startswith("arbitration:")):
        assert answers[call] == "PERMISSION_DENIED", call
    assert answers["arbitration: primary writes"] == "OK"


def test_golden_file_is_what_bmv2_answers(live_bmv2: tuple[str, Answers] | None) -> None:
    if live_bmv2 is None:
        pytest.skip("no simple_switch_grpc on PATH or in /opt/bmv2/bin to check the golden file against")
    if not GOLDEN.exists():
        pytest.fail(f"BMv2 is installed but {GOLDEN} is missing: {RECORD}")
    doc = load_golden(GOLDEN)
    if doc["p4info_sha256"] != p4info_digest(P4Info.load(contract.P4INFO_PATH)):
        pytest.fail(f"{GOLDEN.name} was recorded for another P4Info; re-record: {RECORD}")
    diffs, missing = compare(doc["answers"], live_bmv2[1])
    assert not diffs and not missing, f"{GOLDEN.name} is stale ({len(diffs)} answers differ, {len(missing)} " \
                                      f"missing); re-record: {RECORD}"
