"""The conformance probe's parts on their own, with no target: answers, entities, golden files, comparison.

The whole probe against the model (and BMv2 or its golden file) is ``tests/switchmodel/test_p4rt_conformance.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from p4.v1 import p4runtime_pb2

from kvpool.p4rt.p4info import SCOPE_DEFAULT_ONLY, P4Info
from switchmodel.conformance import KNOWN_DIFFERENCES, Difference, compare, load_golden, p4info_digest, save_golden
from switchmodel.conformance.client import _squeeze
from switchmodel.conformance.entities import _actions_in_scope, _describe_entity, _entry
from tests.paths import P4RT_MINI


def test_long_batches_squeeze_to_runs() -> None:
    assert _squeeze(["OK"]) == "OK"
    assert _squeeze(["OK", "OK", "OK", "UNKNOWN", "OK"]) == "[OK*3, UNKNOWN, OK]"


def test_entries_come_from_the_p4info_alone_and_read_back_as_text() -> None:
    p4info = P4Info.load(P4RT_MINI)
    for t in p4info.tables:
        actions = _actions_in_scope(p4info, t, SCOPE_DEFAULT_ONLY)
        te = _entry(p4info, t, seed=3, action_id=actions[0] if actions else None)
        entity = p4runtime_pb2.Entity()
        entity.table_entry.CopyFrom(te)
        text = _describe_entity(p4info, entity)
        assert text.startswith("{") and all(f.name in text for f in t.match_fields), text
        assert not actions or p4info.action(actions[0]).name in text


def test_golden_file_round_trip_and_comparison(tmp_path: Path) -> None:
    p4info = P4Info.load(P4RT_MINI)
    path = tmp_path / "golden.json"
    answers = [("a", "OK"), ("b", "[OK*2, NOT_FOUND]")]
    save_golden(path, answers, p4info, "bmv2 (test)")
    doc = load_golden(path)
    assert doc["p4info_sha256"] == p4info_digest(p4info) and doc["target"] == "bmv2 (test)"
    assert [tuple(a) for a in doc["answers"]] == answers
    diffs, missing = compare(doc["answers"], [("a", "OK"), ("b", "OK"), ("c", "OK")])
    assert diffs == [Difference("b", "[OK*2, NOT_FOUND]", "OK")] and missing == ["c"]
    assert all(isinstance(why, str) and why for why in KNOWN_DIFFERENCES.values())


def test_the_command_still_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "switchmodel.conformance", "--help"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[3])
    assert "P4Runtime conformance probe" in out.stdout and "--compare" in out.stdout
