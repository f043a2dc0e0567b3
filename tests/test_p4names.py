"""controller.p4names against the compiled P4Info: every name, key and parameter list exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller import p4names
from switchmodel.p4info import P4Info, names_missing

P4INFO = Path(__file__).parents[1] / "p4" / "build" / "kvpool.p4info.txtpb"

pytestmark = pytest.mark.skipif(not P4INFO.exists(), reason="p4/build/kvpool.p4info.txtpb not built yet")


@pytest.fixture(scope="module")
def p4info() -> P4Info:
    return P4Info.load(P4INFO)


def test_every_name_exists(p4info: P4Info) -> None:
    assert names_missing(p4info, p4names.all_names()) == []


def test_every_table_and_counter_is_named(p4info: P4Info) -> None:
    assert {t.name for t in p4info.tables} == set(p4names.TABLE_KEYS)
    assert {c.name for c in p4info.counters} == set(p4names.COUNTERS)
    assert {d.name for d in p4info.digests} == set(p4names.DIGEST_MEMBERS)


def test_keys_params_and_digest_members_match(p4info: P4Info) -> None:
    for table, keys in p4names.TABLE_KEYS.items():
        assert tuple(p4info.match_field_names(table)) == keys, table
    for action, params in p4names.ACTION_PARAMS.items():
        assert tuple(p.name for p in p4info.action(action).params) == params, action
    for digest, members in p4names.DIGEST_MEMBERS.items():
        assert tuple(m for m, _ in p4info.digest(digest).members) == members, digest
