"""The TNA program's decision tables (scripts/tna_decisions.py) decide as the v1model chains do.

Each table's constant entries, matched as a TCAM matches them (first entry in priority order),
are compared with a transcription of the ``if`` chain it replaces (p4/include/safety.p4,
pool.p4, popularity.p4, coalesce.p4, ingress.p4, in the TNA program's terms: the sign bits
and differences Safety and the pool compute), on boundary values, quiet values and random
ones, half of them made to match one of the table's entries.
"""

from __future__ import annotations

import random
import runpy
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from kvpool import contract as c
from tests.paths import SCRIPTS

GEN: dict[str, Any] = runpy.run_path(str(SCRIPTS / "tna_decisions.py"))
TNA = c.TNA_DIR
S31 = 1 << 31

BRIDGE_RELEASE, BRIDGE_ABSORB = GEN["BRIDGE_RELEASE"], GEN["BRIDGE_ABSORB"]
FWD_ROUTE, FWD_UNICAST, FWD_FLOOD, FWD_NO_ROUTE = GEN["FWD_ROUTE"], GEN["FWD_UNICAST"], GEN["FWD_FLOOD"], \
    GEN["FWD_NO_ROUTE"]

Values = Mapping[str, int]


# ------------------------------------------------------------------------ the chains, transcribed


def header_check(v: Values) -> str:
    if v["version"] != c.KVPOOL_VERSION:
        return "header_is(DROP_BAD_VERSION)"
    if v["opcode"] == 0 or v["opcode"] > c.OP_MAX:
        return "header_is(DROP_BAD_OPCODE)"
    if v["flags"] & ~c.KNOWN_FLAGS & 0xFFFF:
        return "header_is(DROP_BAD_FLAGS)"
    if v["frag_count"] == 0 or v["frag_index"] == c.MAX_FRAG_INDEX:
        return "header_is(DROP_BAD_RANGE)"
    if v["opcode"] == c.OP_DATA:
        return "header_is(DROP_NONE)"
    if v["payload_len"] != 0:
        return "header_is(DROP_BAD_LENGTH)"
    if v["udp_length"] != c.KV_UDP_LEN_NO_PAYLOAD and not (v["opcode"] == c.OP_GET
                                                           and v["udp_length"] == c.KV_UDP_LEN_DATA):
        return "header_is(DROP_BAD_LENGTH)"
    if v["opcode"] == c.OP_GET and v["end"] > c.MAX_FRAG_INDEX:
        return "header_is(DROP_BAD_RANGE)"
    return "header_is(DROP_NONE)"


def data_check(v: Values) -> str:
    if v["left"] == 0 or v["left"] & S31:
        return "data_is(DROP_BAD_RANGE)"
    if v["payload_len"] == 0 or v["udp_length"] != c.KV_UDP_LEN_DATA:
        return "data_is(DROP_BAD_LENGTH)"
    if v["slack"] & S31:
        return "data_is(DROP_BAD_LENGTH)"
    if v["over"] != 0 and not v["over"] & S31:
        return "data_is(DROP_BAD_LENGTH)"
    if v["last_diff"] != 0 and v["payload_len"] != c.FRAG_PAYLOAD:
        return "data_is(DROP_BAD_LENGTH)"
    if v["last_diff"] == 0 and v["tail_diff"] != 0:
        return "data_is(DROP_BAD_LENGTH)"
    return "data_is(DROP_NONE)"


def status_check(v: Values) -> str:
    if v["opcode"] == c.OP_NACK:
        bad = v["status"] == c.STATUS_OK or v["status"] > c.STATUS_MAX
    else:
        bad = v["status"] != c.STATUS_OK
    return "status_is(DROP_BAD_STATUS)" if bad else "status_is(DROP_NONE)"


def _before_safety(v: Values) -> str | None:
    """v1model's ingress before Safety's groups: parser, IPv4 checksum, IPv4 only, source guard."""
    if v["parser_err"] != 0:
        return "drop_for(DROP_PARSE_ERROR)"
    if v["ipv4_valid"] and v["ihl"] == 5 and v["checksum_error"]:
        return "drop_for(DROP_BAD_CHECKSUM)"
    if not v["ipv4_valid"]:
        return "NoAction()"
    if v["guarded"] and v["spoof"] != 0:
        return "drop_for(DROP_SPOOFED)"
    return None


def safety_verdict(v: Values) -> str:
    early = _before_safety(v)
    if early is not None:
        return early
    if v["header_reason"]:
        return "take_header_reason()"
    if v["data_reason"]:
        return "take_data_reason()"
    if v["status_reason"]:
        return "take_status_reason()"
    if v["kv_valid"] and v["opcode"] == c.OP_INVALIDATE and not v["is_writer"]:
        return "drop_for(DROP_NOT_WRITER)"
    return "NoAction()"


def get_verdict(v: Values) -> str:
    if _before_safety(v) is not None:
        return "NoAction()"
    passes = v["kv_valid"] and v["header_reason"] == 0 and v["status_reason"] == 0
    return "get_passes()" if passes else "NoAction()"


def _usable(v: Values) -> bool:
    return v["pool_state"] in (c.PoolState.FILLING, c.PoolState.VALID)


def _fits(v: Values) -> bool:
    return v["rest_sign"] == 0 and v["room_sign"] == 0


def _slot_range(v: Values) -> bool:
    return v["sidx"] >= c.TNA_POOL_SLOTS or v["base"] >= c.TNA_POOL_SLOTS


def pool_get_decide(v: Values) -> str:
    if not v["pool_found"]:
        return "pool_count(POOL_LOOKUP_MISS)"
    if v["pool_state"] == c.PoolState.UPSTREAM:
        return "pool_count(POOL_UPSTREAM)"
    if v["frag_count"] != 1 or v["flags"] & c.FLAG_NO_CACHE or v["gen_bad"] != 0:
        return "pool_count(POOL_BYPASS)"
    if not _usable(v) or v["placement"] == 0 or v["index_past"] == 0 or not _fits(v):
        return "pool_count(POOL_BYPASS)"
    if _slot_range(v):
        return "pool_count(POOL_SLOT_RANGE)"
    if v["udp_length"] != c.KV_UDP_LEN_DATA:
        return "pool_count(POOL_NO_ROOM)"
    return "pool_try_serve()"


def pool_data_decide(v: Values) -> str:
    if not v["pool_found"]:
        return "pool_count(POOL_LOOKUP_MISS)"
    if not v["is_writer"]:
        return "pool_count(POOL_FILL_UNAUTH)"
    if v["flags"] & (c.FLAG_SWITCH_SERVED | c.FLAG_COALESCED):
        return "pool_count(POOL_FILL_REPLICA)"
    if v["differs"] != 0:
        return "pool_mismatch()"
    if not _usable(v) or v["placement"] == 0:
        return "pool_skip()"
    if _slot_range(v):
        return "pool_count(POOL_SLOT_RANGE)"
    if not _fits(v):
        return "pool_count(POOL_BYPASS)"
    repair = bool(v["flags"] & c.FLAG_NO_CACHE)
    if v["pool_state"] == c.PoolState.VALID:
        return "pool_fill_repair()" if repair else "pool_fill_if_stale()"
    return "pool_fill_always()"


def pool_other_decide(v: Values) -> str:
    if not v["pool_found"]:
        return "pool_count(POOL_LOOKUP_MISS)"
    return "pool_count(POOL_INVALIDATE)" if v["opcode"] == c.OP_INVALIDATE else "pool_skip()"


def forward_verdict(v: Values) -> str:
    if v["drop_reason"] != 0:
        return "NoAction()"
    if v["bridge_flags"] & BRIDGE_ABSORB or v["served"]:
        return "back_out()"
    if v["ipv4_valid"] and v["ttl"] <= 1:
        return "ttl_expired()"
    if v["bridge_flags"] == BRIDGE_RELEASE:
        return "released()" if v["ipv4_valid"] else "NoAction()"
    if v["fwd"] == FWD_ROUTE:
        return "route()" if v["ipv4_valid"] else "route_as_is()"
    if v["fwd"] == FWD_UNICAST:
        return "unicast()"
    if v["fwd"] == FWD_FLOOD:
        return "flood()"
    if v["fwd"] == FWD_NO_ROUTE:
        return "drop_for(DROP_NO_ROUTE)"
    return "drop_for(DROP_UNHANDLED)"


def pop_gate(v: Values) -> str:
    counted = (v["get_ok"] and not v["from_fabric"] and not v["pool_found"] and v["opcode"] == c.OP_GET
               and v["frag_index"] == 0 and not v["flags"] & c.FLAG_RETRANSMIT)
    return "pop_counted()" if counted else "NoAction()"


def hot_check(v: Values) -> str:
    reached = v["pop_go"] and not (v["d0"] & S31 or v["d1"] & S31 or v["d2"] & S31)
    return "hot_reached()" if reached else "NoAction()"


def bloom_check(v: Values) -> str:
    if not v["reached"]:
        return "NoAction()"
    return "hot_seen()" if v["seen0"] == 1 and v["seen1"] == 1 else "hot_report()"


POOL_DO = GEN["POOL_DO"]


def pool_outcome(v: Values) -> str:
    do = v["pool_do"]
    if do == POOL_DO["SERVE"]:
        return "serve()" if v["hit"] else "NoAction()"
    if do == POOL_DO["FILL_IF_STALE"]:
        return "NoAction()" if v["current"] else "fill()"   # current: FILL_SKIPPED, set by the decision
    if do == POOL_DO["FILL_REPAIR"]:
        return "fill_repair()" if v["current"] else "fill()"
    if do == POOL_DO["FILL_ALWAYS"]:
        return "fill()"
    if do == POOL_DO["MISMATCH"]:
        return "mismatch_reported()" if v["fresh"] else "NoAction()"
    return "NoAction()"


CO_K, PRED = GEN["CO_K"], GEN["PRED"]


def co_kind_check(v: Values) -> str:
    if v["opcode"] == c.OP_GET and v["frag_count"] > 1:
        if not v["has_waiter"]:
            return "co_kind_is(CO_K_NO_WAITER)"
        return "co_kind_is(CO_K_PEEK)" if v["flags"] & c.FLAG_RETRANSMIT else "co_kind_is(CO_K_GET)"
    if v["has_waiter"] and v["opcode"] in (c.OP_DATA, c.OP_NACK):
        over = v["opcode"] == c.OP_NACK or v["past_last"] == 0
        return "co_kind_is(CO_K_ANSWER_LAST)" if over else "co_kind_is(CO_K_ANSWER)"
    return "NoAction()"


def co_finish(v: Values) -> str:
    kind, pred = v["co_kind"], v["pred"]
    if kind == CO_K["NO_WAITER"]:
        return "co_count(CO_NO_WAITER_ID)" if v["get_ok"] else "NoAction()"
    if kind not in (CO_K["GET"], CO_K["PEEK"]) or pred not in PRED.values():
        return "NoAction()"   # pending_live did not run
    retransmit = kind == CO_K["PEEK"]
    if pred in (PRED["OVER"], PRED["OVER_MINE"]):
        return "co_count(CO_RETRANSMIT)" if retransmit else "co_opened()"
    if not v["same_key"]:
        return "co_count(CO_COLLISION)"
    if not v["same_gen"]:
        return "co_count(CO_OTHER_GENERATION)"
    if pred == PRED["MINE"]:
        return "co_owner()"
    return "co_count(CO_RETRANSMIT)" if retransmit else "co_absorbed()"


REFERENCE: dict[str, Callable[[Values], str]] = {
    "header_check": header_check, "data_check": data_check, "status_check": status_check,
    "safety_verdict": safety_verdict, "pool_get_decide": pool_get_decide, "pool_data_decide": pool_data_decide,
    "pool_other_decide": pool_other_decide, "forward_verdict": forward_verdict,
    "get_verdict": get_verdict, "pop_gate": pop_gate, "hot_check": hot_check, "bloom_check": bloom_check,
    "pool_outcome": pool_outcome, "co_kind_check": co_kind_check, "co_finish": co_finish,
}


# ------------------------------------------------------------------------ values that matter


def _interesting(table: Any, key: Any) -> list[int]:
    """Boundary values of a key: 0, 1, the extremes, the top bit, and every value a rule names, +-1."""
    full = key.full
    out = {0, 1, 2, full, full - 1, 1 << (key.width - 1), (1 << (key.width - 1)) - 1}
    for r in table.rules:
        for cond in r.conds:
            if cond.key == key.name:
                for value, mask in cond.patterns:
                    for v in (value, value | (~mask & full)):
                        out |= {v & full, (v + 1) & full, (v - 1) & full}
    return sorted({v & full for v in out})


#: An IPv4 packet with no parser or checksum error from an unguarded port.
ENTRY = {"parser_err": 0, "ipv4_valid": 1, "ihl": 5, "checksum_error": 0, "guarded": 0, "spoof": 0}

#: Per table, values that pass its early rules (a packet of the common kind), so that samples
#: reach the later rules too.
QUIET: dict[str, dict[str, int]] = {
    "header_check": {"version": c.KVPOOL_VERSION, "opcode": c.OP_GET, "flags": 0, "frag_count": 1, "frag_index": 0,
                     "payload_len": 0, "udp_length": c.KV_UDP_LEN_NO_PAYLOAD, "end": 1},
    "data_check": {"left": 1, "payload_len": c.FRAG_PAYLOAD, "udp_length": c.KV_UDP_LEN_DATA, "slack": 5,
                   "over": S31 + 5, "last_diff": 1, "tail_diff": 0},
    "status_check": {"opcode": c.OP_GET, "status": 0},
    "safety_verdict": {**ENTRY, "header_reason": 0, "data_reason": 0, "status_reason": 0, "kv_valid": 1,
                       "opcode": c.OP_GET, "is_writer": 0},
    "get_verdict": {**ENTRY, "header_reason": 0, "status_reason": 0, "kv_valid": 1},
    "pop_gate": {"get_ok": 1, "from_fabric": 0, "pool_found": 0, "opcode": c.OP_GET, "frag_index": 0, "flags": 0},
    "co_kind_check": {"opcode": c.OP_GET, "frag_count": 4, "flags": 0, "has_waiter": 1, "past_last": 3},
    "co_finish": {"get_ok": 1, "co_kind": CO_K["GET"], "pred": PRED["NEITHER"], "same_key": 1, "same_gen": 1},
    "pool_outcome": {"pool_do": POOL_DO["SERVE"], "hit": 1, "current": 0, "fresh": 1},
    "pool_get_decide": {"pool_found": 1, "pool_state": c.PoolState.VALID, "frag_count": 1, "flags": 0, "gen_bad": 0,
                        "placement": 3, "index_past": 2, "rest_sign": 0, "room_sign": 0, "sidx": 5, "base": 4,
                        "udp_length": c.KV_UDP_LEN_DATA},
    "pool_data_decide": {"pool_found": 1, "is_writer": 1, "flags": 0, "differs": 0, "pool_state": c.PoolState.VALID,
                         "placement": 3, "sidx": 5, "base": 4, "rest_sign": 0, "room_sign": 0},
    "pool_other_decide": {"pool_found": 1, "opcode": c.OP_INVALIDATE},
    "hot_check": {"pop_go": 1, "d0": 0, "d1": 0, "d2": 0},
    "bloom_check": {"reached": 1, "seen0": 1, "seen1": 1},
    "forward_verdict": {"drop_reason": 0, "bridge_flags": 0, "served": 0, "ipv4_valid": 1, "ttl": 64,
                        "fwd": FWD_ROUTE},
}


def _samples(table: Any, n: int, seed: int) -> list[dict[str, int]]:
    """Boundary, quiet and random values; half of them made to match one of the table's
    entries (the rest of their bits as drawn), so that every rule's region is visited; the
    reference decides each, whether or not an earlier entry wins."""
    rng = random.Random(seed)
    pools = {k.name: _interesting(table, k) for k in table.keys}
    quiet = QUIET[table.name]
    entries = GEN["expand"](table)
    out = []
    for i in range(n):
        values = {}
        for k in table.keys:
            r = rng.random()
            values[k.name] = (quiet[k.name] if r < 0.5 else rng.choice(pools[k.name]) if r < 0.9
                              else rng.getrandbits(k.width))
        if i % 2:
            e = rng.choice(entries)
            values = {k.name: (values[k.name] & ~m) | v for k, (v, m) in zip(table.keys, e.patterns, strict=True)}
        out.append(values)
    return out


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_each_table_decides_as_its_chain(name: str) -> None:
    table = next(t for t in GEN["TABLES"] if t.name == name)
    decide = GEN["decide"]
    seen: set[str] = set()
    for values in _samples(table, 6000, seed=len(name)):
        want = REFERENCE[name](values)
        assert decide(table, values) == want, (name, values)
        seen.add(want)
    # Every outcome the chain has was reached, so the samples exercised every rule.
    outcomes = {r.action for r in table.rules} | {table.default}
    assert seen == outcomes, f"{name}: never saw {outcomes - seen}"


def test_the_pool_tables_decide_every_state_and_opcode_exhaustively() -> None:
    """The small keys the chains branch on most, every value, the rest at their boundaries."""
    decide = GEN["decide"]
    for name in ("pool_get_decide", "pool_data_decide"):
        table = next(t for t in GEN["TABLES"] if t.name == name)
        base = {k.name: 0 for k in table.keys}
        for state in range(256):
            for found in (0, 1):
                for flags in (0, c.FLAG_NO_CACHE, c.FLAG_COALESCED, c.FLAG_SWITCH_SERVED, c.FLAG_RETRANSMIT):
                    values = dict(base, pool_state=state, pool_found=found, flags=flags, frag_count=1,
                                  placement=7, index_past=3, is_writer=1, udp_length=c.KV_UDP_LEN_DATA)
                    assert decide(table, values) == REFERENCE[name](values), (name, values)


def test_the_entries_fit_a_tcam_and_name_only_declared_actions() -> None:
    for table in GEN["TABLES"]:
        entries = GEN["expand"](table)
        assert 0 < len(entries) <= 512, table.name   # one TCAM block deep (512 rows)
        names = {e.action.split("(")[0] for e in entries} | {table.default.split("(")[0]}
        assert names <= set(table.actions), table.name


def test_the_committed_files_are_the_generators() -> None:
    for name in GEN["FILES"]:
        assert (TNA / name).read_text() == GEN["file_p4"](name), "regenerate: python -m scripts.tna_decisions"
