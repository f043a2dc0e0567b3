"""Write p4/tna/decide_*.p4: the TNA program's decision chains as prioritized ternary tables.

Tofino 1 makes a table (a logical table with its gateway) of every branch of an ``if`` chain
that assigns, and a stage holds 16 logical tables: kvpool's chains (Safety's checks, the pool's
decision, the ingress's verdict on forwarding) took about 90 of the 223 the program needed.
A decision list -- rules tried in order, the first that holds decides -- is exactly a ternary
table whose constant entries are in priority order, one logical table and one lookup.

A rule is a conjunction of conditions on the table's keys; a condition is a set of ternary
patterns of which one must hold, so ``x != c`` is one pattern per bit (bit i is not c's),
``x > c`` one per 0 bit of c (the bits above as in c, this one 1), and a rule expands to the
product of its conditions' patterns (patterns on one key merged, contradictions dropped, an
entry that an earlier one covers dropped).  A negated compound condition has no such form:
the rules say it by order instead (what must not reach a rule is decided by an earlier one),
and ``tests/p4/test_tna_decisions.py`` checks every table against a transcription of the
v1model program's ``if`` chains, on boundary and random values.  The keys name PHV fields
whole or as slices (a gateway's own limits do not apply to a table's match).  Values come
from ``kvpool.contract`` (which its tests keep equal to ``p4/include/constants.p4``); the
actions keep the P4 constants' names.

    python -m scripts.tna_decisions   (rewrites every p4/tna/decide_*.p4; --check compares)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kvpool import contract as c

Pattern = tuple[int, int]
"""(value, mask) of one key: the key matches when ``key & mask == value``."""


@dataclass(frozen=True, slots=True)
class Key:
    """A table key: how the rules name it, the P4 expression matched, and its width."""

    name: str
    expr: str
    width: int
    boolean: bool = False   # a P4 bool (isValid(), a bool field): its entries say true or false

    @property
    def full(self) -> int:
        return (1 << self.width) - 1


@dataclass(frozen=True, slots=True)
class Cond:
    """One of ``patterns`` holds on key ``key``."""

    key: str
    patterns: tuple[Pattern, ...]


@dataclass(frozen=True, slots=True)
class Rule:
    """When every condition holds (and no earlier rule did), run ``action``; ``why`` is its comment."""

    conds: tuple[Cond, ...]
    action: str
    why: str


@dataclass(frozen=True, slots=True)
class Table:
    """A decision list over ``keys``: the first rule that holds decides, else ``default``."""

    name: str
    keys: tuple[Key, ...]
    rules: tuple[Rule, ...]
    default: str
    actions: tuple[str, ...]
    doc: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One constant entry: a pattern per key (mask 0: don't care), the action, and its rule."""

    patterns: tuple[Pattern, ...]
    action: str
    rule: int


# ------------------------------------------------------------------------------- conditions
# Widths are looked up when a rule expands, so a condition names its key only.


def eq(key: str, value: int) -> Cond:
    return Cond(key, ((value, -1),))  # -1: every bit of the key (cut to its width on expansion)


def among(key: str, *values: int) -> Cond:
    return Cond(key, tuple((v, -1) for v in values))


def bit(key: str, i: int, value: int) -> Cond:
    return Cond(key, ((value << i, 1 << i),))


def any_bit(key: str, mask: int) -> Cond:
    """At least one of ``mask``'s bits set."""
    return Cond(key, tuple((1 << i, 1 << i) for i in range(mask.bit_length()) if mask >> i & 1))


def ne(key: str, value: int, width: int) -> Cond:
    """Some bit differs from ``value``'s."""
    return Cond(key, tuple((((value >> i & 1) ^ 1) << i, 1 << i) for i in range(width)))


def nonzero(key: str, width: int) -> Cond:
    return ne(key, 0, width)


def gt(key: str, value: int, width: int) -> Cond:
    """``key > value`` (unsigned): at the highest bit where they differ, the key has 1 and value 0."""
    pats = []
    for i in range(width):
        if not value >> i & 1:
            high = ((1 << width) - 1) & ~((1 << (i + 1)) - 1)
            pats.append(((value & high) | (1 << i), high | (1 << i)))
    return Cond(key, tuple(pats))


def le(key: str, value: int, width: int) -> Cond:
    """``key <= value`` (unsigned): equal, or at the highest differing bit the key has 0."""
    pats = [(value, (1 << width) - 1)]
    for i in range(width):
        if value >> i & 1:
            high = ((1 << width) - 1) & ~((1 << (i + 1)) - 1)
            pats.append((value & high, high | (1 << i)))
    return Cond(key, tuple(pats))


def sign(key: str, width: int, value: int) -> Cond:
    """The top bit (a difference's sign) is ``value``."""
    return bit(key, width - 1, value)


def rule(why: str, action: str, *conds: Cond) -> Rule:
    return Rule(tuple(conds), action, why)


# ------------------------------------------------------------------------------- expansion


@functools.cache
def expand(table: Table) -> tuple[Entry, ...]:
    """The table's constant entries, in priority order."""
    index = {k.name: i for i, k in enumerate(table.keys)}
    entries: list[Entry] = []
    for n, r in enumerate(table.rules):
        for combo in itertools.product(*(cond.patterns for cond in r.conds)):
            pats: list[Pattern] = [(0, 0)] * len(table.keys)
            ok = True
            for cond, (value, mask) in zip(r.conds, combo, strict=True):
                i = index[cond.key]
                mask &= table.keys[i].full
                if value & ~mask:
                    raise ValueError(f"{table.name}: {cond.key} pattern {value:#x} outside mask {mask:#x}")
                v0, m0 = pats[i]
                if (v0 ^ value) & m0 & mask:
                    ok = False  # contradicts another condition of the rule: never holds
                    break
                pats[i] = (v0 | value, m0 | mask)
            if ok and not any(_covers(e.patterns, pats) for e in entries):
                entries.append(Entry(tuple(pats), r.action, n))
    return tuple(entries)


def _covers(earlier: Iterable[Pattern], later: Iterable[Pattern]) -> bool:
    """Every key value the later entry matches, the earlier one matches too (it never wins)."""
    return all(m0 & ~m1 == 0 and (v0 ^ v1) & m0 == 0 for (v0, m0), (v1, m1) in zip(earlier, later, strict=True))


def decide(table: Table, values: Mapping[str, int]) -> str:
    """The action the table runs for these key values (what the switch's TCAM picks)."""
    for e in expand(table):
        if all(values[k.name] & m == v for k, (v, m) in zip(table.keys, e.patterns, strict=True)):
            return e.action
    return table.default


# ------------------------------------------------------------------------------- the tables

TNA_DIR = Path(__file__).resolve().parent.parent / "p4" / "tna"


def _tna_const(name: str) -> int:
    """A constant of the TNA program's own (BRIDGE_*, FWD_*, POOL_DO_*), read where p4/tna/ defines it."""
    for path in sorted(TNA_DIR.glob("*.p4")):
        found = re.search(rf"^const bit<\d+> {name}\s*=\s*(\w+);", path.read_text(), re.M)
        if found is not None:
            return int(found.group(1), 0)
    raise KeyError(f"no p4/tna/*.p4 defines {name}")


BRIDGE_RELEASE, BRIDGE_ABSORB = _tna_const("BRIDGE_RELEASE"), _tna_const("BRIDGE_ABSORB")
FWD_ROUTE, FWD_UNICAST, FWD_FLOOD, FWD_NO_ROUTE = (_tna_const(n) for n in ("FWD_ROUTE", "FWD_UNICAST", "FWD_FLOOD",
                                                                          "FWD_NO_ROUTE"))
POOL_DO = {n: _tna_const(f"POOL_DO_{n}") for n in ("SERVE", "MISMATCH", "FILL_IF_STALE", "FILL_REPAIR",
                                                    "FILL_ALWAYS")}
CO_K = {n: _tna_const(f"CO_K_{n}") for n in ("NO_WAITER", "GET", "PEEK", "ANSWER", "ANSWER_LAST")}
PRED = {n: _tna_const(f"PRED_{n}") for n in ("NEITHER", "OVER", "MINE", "OVER_MINE")}
_DL = c.KV_UDP_LEN_DATA
_NP = c.KV_UDP_LEN_NO_PAYLOAD
_SLOT_BITS = c.TNA_POOL_SLOTS - 1  # POOL_SLOTS is a power of 2: an index is in range when it is at most this

HEADER_CHECK = Table(
    name="header_check",
    keys=(Key("version", "hdr.kv.version", 8), Key("opcode", "hdr.kv.opcode", 8),
          Key("flags", "hdr.kv.flags", 16), Key("frag_count", "hdr.kv.frag_count", 16),
          Key("frag_index", "hdr.kv.frag_index", 16), Key("payload_len", "hdr.kv.payload_len", 16),
          Key("udp_length", "hdr.udp.length", 16), Key("end", "end", 32)),
    rules=(
        rule("version != KVPOOL_VERSION", "header_is(DROP_BAD_VERSION)", ne("version", c.KVPOOL_VERSION, 8)),
        rule("opcode == 0", "header_is(DROP_BAD_OPCODE)", eq("opcode", 0)),
        rule("opcode > OP_MAX", "header_is(DROP_BAD_OPCODE)", gt("opcode", c.OP_MAX, 8)),
        rule("flags outside KNOWN_FLAGS", "header_is(DROP_BAD_FLAGS)", any_bit("flags", 0xFFFF & ~c.KNOWN_FLAGS)),
        rule("frag_count == 0", "header_is(DROP_BAD_RANGE)", eq("frag_count", 0)),
        rule("frag_index == MAX_FRAG_INDEX", "header_is(DROP_BAD_RANGE)", eq("frag_index", c.MAX_FRAG_INDEX)),
        rule("DATA: data_check decides the rest", "header_is(DROP_NONE)", eq("opcode", c.OP_DATA)),
        rule("payload_len != 0", "header_is(DROP_BAD_LENGTH)", nonzero("payload_len", 16)),
        # The UDP length is the header's, or a GET's with reply room; only a GET's range is left.
        rule("no payload, GET past MAX_FRAG_INDEX", "header_is(DROP_BAD_RANGE)",
             eq("udp_length", _NP), eq("opcode", c.OP_GET), gt("end", c.MAX_FRAG_INDEX, 32)),
        rule("no payload", "header_is(DROP_NONE)", eq("udp_length", _NP)),
        rule("GET with room, past MAX_FRAG_INDEX", "header_is(DROP_BAD_RANGE)",
             eq("udp_length", _DL), eq("opcode", c.OP_GET), gt("end", c.MAX_FRAG_INDEX, 32)),
        rule("GET with room", "header_is(DROP_NONE)", eq("udp_length", _DL), eq("opcode", c.OP_GET)),
    ),
    default="header_is(DROP_BAD_LENGTH)",   # any other UDP length
    actions=("header_is",),
    doc="The checks of every opcode, in v1model's order, and those of the opcodes other than DATA.",
)

DATA_CHECK = Table(
    name="data_check",
    keys=(Key("left", "left", 32), Key("payload_len", "hdr.kv.payload_len", 16),
          Key("udp_length", "hdr.udp.length", 16), Key("slack", "slack", 32),
          Key("over", "over", 32), Key("last_diff", "last_diff", 16),
          Key("tail_diff", "tail_diff", 16)),
    rules=(
        rule("frag_index >= frag_count (left == 0)", "data_is(DROP_BAD_RANGE)", eq("left", 0)),
        rule("frag_index >= frag_count (left < 0)", "data_is(DROP_BAD_RANGE)", sign("left", 32, 1)),
        rule("payload_len == 0", "data_is(DROP_BAD_LENGTH)", eq("payload_len", 0)),
        rule("UDP length not a DATA's", "data_is(DROP_BAD_LENGTH)", ne("udp_length", _DL, 16)),
        rule("chunk_len <= (cnt-1)*1408, or past 2^31 + cnt*1408", "data_is(DROP_BAD_LENGTH)",
             sign("slack", 32, 1)),
        rule("chunk_len > cnt*1408", "data_is(DROP_BAD_LENGTH)", sign("over", 32, 0), nonzero("over", 32)),
        # v1model tests "not last and not 1408" before "last and not the tail": exclusive, so either order.
        rule("the last fragment, not the chunk's tail", "data_is(DROP_BAD_LENGTH)",
             eq("last_diff", 0), nonzero("tail_diff", 16)),
        rule("the last fragment", "data_is(DROP_NONE)", eq("last_diff", 0)),
        rule("not the last fragment, not FRAG_PAYLOAD bytes", "data_is(DROP_BAD_LENGTH)",
             ne("payload_len", c.FRAG_PAYLOAD, 16)),
    ),
    default="data_is(DROP_NONE)",
    actions=("data_is",),
    doc="A DATA's fragment arithmetic (Safety's sums; every value compared is below 2^31).",
)

STATUS_CHECK = Table(
    name="status_check",
    keys=(Key("opcode", "hdr.kv.opcode", 8), Key("status", "hdr.kv.status", 16)),
    rules=(
        rule("NACK with STATUS_OK", "status_is(DROP_BAD_STATUS)", eq("opcode", c.OP_NACK), eq("status", c.STATUS_OK)),
        rule("NACK past STATUS_MAX", "status_is(DROP_BAD_STATUS)", eq("opcode", c.OP_NACK),
             gt("status", c.STATUS_MAX, 16)),
        rule("NACK", "status_is(DROP_NONE)", eq("opcode", c.OP_NACK)),
        rule("any other opcode with a status", "status_is(DROP_BAD_STATUS)", nonzero("status", 16)),
    ),
    default="status_is(DROP_NONE)",
    actions=("status_is",),
    doc="A NACK carries a status in 1..STATUS_MAX, every other opcode STATUS_OK.",
)

_ENTRY_KEYS = (Key("parser_err", "ig_prsr_md.parser_err", 16), Key("ipv4_valid", "hdr.ipv4.isValid()", 1, True),
               Key("ihl", "hdr.ipv4.ihl", 4), Key("checksum_error", "meta.checksum_error", 1, True),
               Key("guarded", "guarded", 1), Key("spoof", "spoof", 32))


SAFETY_VERDICT = Table(
    name="safety_verdict",
    keys=(*_ENTRY_KEYS, Key("header_reason", "header_reason", 8), Key("data_reason", "data_reason", 8),
          Key("status_reason", "status_reason", 8), Key("kv_valid", "hdr.kv.isValid()", 1, True),
          Key("opcode", "hdr.kv.opcode", 8), Key("is_writer", "meta.is_writer", 1)),
    rules=(
        rule("the parser's error", "drop_for(DROP_PARSE_ERROR)", nonzero("parser_err", 16)),
        rule("the IPv4 checksum (no options)", "drop_for(DROP_BAD_CHECKSUM)",
             eq("ipv4_valid", 1), eq("ihl", 5), eq("checksum_error", 1)),
        rule("not IPv4: no checks", "NoAction()", eq("ipv4_valid", 0)),
        rule("a host port's packet from another source", "drop_for(DROP_SPOOFED)", eq("guarded", 1),
             nonzero("spoof", 32)),
        rule("the header's checks first", "take_header_reason()", nonzero("header_reason", 8)),
        rule("then a DATA's", "take_data_reason()", nonzero("data_reason", 8)),
        rule("then the status", "take_status_reason()", nonzero("status_reason", 8)),
        rule("INVALIDATE needs a writer", "drop_for(DROP_NOT_WRITER)",
             eq("kv_valid", 1), eq("opcode", c.OP_INVALIDATE), eq("is_writer", 0)),
    ),
    default="NoAction()",
    actions=("take_header_reason", "take_data_reason", "take_status_reason", "drop_for", "NoAction"),
    doc="The ingress's checks in v1model's order: parser, checksum, source guard, then the groups' first reason.",
)

GET_VERDICT = Table(
    name="get_verdict",
    keys=(*_ENTRY_KEYS, Key("header_reason", "header_reason", 8), Key("status_reason", "status_reason", 8),
          Key("kv_valid", "hdr.kv.isValid()", 1, True)),
    rules=(
        rule("the parser's error", "NoAction()", nonzero("parser_err", 16)),
        rule("the IPv4 checksum (no options)", "NoAction()",
             eq("ipv4_valid", 1), eq("ihl", 5), eq("checksum_error", 1)),
        rule("a host port's packet from another source", "NoAction()", eq("guarded", 1), nonzero("spoof", 32)),
        rule("an IPv4 kvpool packet with no reason but a DATA's", "get_passes()",
             eq("ipv4_valid", 1), eq("kv_valid", 1), eq("header_reason", 0), eq("status_reason", 0)),
    ),
    default="NoAction()",
    actions=("get_passes", "NoAction"),
    doc="A GET's verdict without a DATA's checks (meta.get_ok), so Popularity and Coalesce do not wait for them.",
)

_STATE = "pool_state"
_USABLE = (c.PoolState.FILLING, c.PoolState.VALID)

POOL_GET = Table(
    name="pool_get_decide",
    keys=(Key("pool_found", "meta.pool_found", 1), Key(_STATE, "meta.pool_state", 8),
          Key("frag_count", "hdr.kv.frag_count", 16), Key("flags", "hdr.kv.flags", 16),
          Key("gen_bad", "gen_bad", 32), Key("placement", "meta.pool_placement", 32),
          Key("index_past", "index_past", 16), Key("rest_sign", "rest_copy[31:31]", 1),
          Key("room_sign", "room[31:31]", 1), Key("sidx", "sidx", 32), Key("base", "base_copy", 32),
          Key("udp_length", "hdr.udp.length", 16)),
    rules=(
        rule("chunk not in the pool", "pool_count(POOL_LOOKUP_MISS)", eq("pool_found", 0)),
        rule("held upstream", "pool_count(POOL_UPSTREAM)", eq(_STATE, c.PoolState.UPSTREAM)),
        rule("a range GET", "pool_count(POOL_BYPASS)", ne("frag_count", 1, 16)),
        rule("NO_CACHE", "pool_count(POOL_BYPASS)", any_bit("flags", c.FLAG_NO_CACHE)),
        rule("pins a generation the pool does not hold", "pool_count(POOL_BYPASS)", nonzero("gen_bad", 32)),
        # "state not FILLING or VALID -> BYPASS" comes next in v1model: every later rule
        # requires a usable state, and the default is that BYPASS.
        rule("not placed", "pool_count(POOL_BYPASS)", among(_STATE, *_USABLE), eq("placement", 0)),
        rule("frag_index >= the entry's frag_count", "pool_count(POOL_BYPASS)",
             among(_STATE, *_USABLE), eq("index_past", 0)),
        rule("longer than the served part (rest wrapped)", "pool_count(POOL_BYPASS)",
             among(_STATE, *_USABLE), eq("rest_sign", 1)),
        rule("longer than the served part", "pool_count(POOL_BYPASS)", among(_STATE, *_USABLE), eq("room_sign", 1)),
        rule("slot past POOL_SLOTS", "pool_count(POOL_SLOT_RANGE)", among(_STATE, *_USABLE),
             gt("sidx", _SLOT_BITS, 32)),
        rule("base past POOL_SLOTS", "pool_count(POOL_SLOT_RANGE)", among(_STATE, *_USABLE),
             gt("base", _SLOT_BITS, 32)),
        rule("no reply room", "pool_count(POOL_NO_ROOM)", among(_STATE, *_USABLE), ne("udp_length", _DL, 16)),
        rule("servable: the slot's tag decides", "pool_try_serve()", among(_STATE, *_USABLE)),
    ),
    default="pool_count(POOL_BYPASS)",  # an unusable state
    actions=("pool_count", "pool_try_serve"),
    doc="A GET for a pooled chunk: served when its slot holds the fragment, else why not.",
)

POOL_DATA = Table(
    name="pool_data_decide",
    keys=(Key("pool_found", "meta.pool_found", 1), Key("is_writer", "meta.is_writer", 1),
          Key("flags", "hdr.kv.flags", 16), Key("differs", "differs", 32), Key(_STATE, "meta.pool_state", 8),
          Key("placement", "meta.pool_placement", 32), Key("sidx", "sidx", 32), Key("base", "base_copy", 32),
          Key("rest_sign", "rest_copy[31:31]", 1), Key("room_sign", "room[31:31]", 1)),
    rules=(
        rule("chunk not in the pool", "pool_count(POOL_LOOKUP_MISS)", eq("pool_found", 0)),
        rule("not from a writer", "pool_count(POOL_FILL_UNAUTH)", eq("is_writer", 0)),
        rule("a switch built or replicated it", "pool_count(POOL_FILL_REPLICA)",
             any_bit("flags", c.FLAG_SWITCH_SERVED | c.FLAG_COALESCED)),
        rule("describes another chunk (generation, length, frag_count)", "pool_mismatch()", nonzero("differs", 32)),
        # "disabled entry -> pass on, count nothing" next: every later rule requires a usable
        # state, and the default is that.
        rule("not placed", "pool_skip()", eq("placement", 0)),
        rule("slot past POOL_SLOTS", "pool_count(POOL_SLOT_RANGE)", among(_STATE, *_USABLE),
             gt("sidx", _SLOT_BITS, 32)),
        rule("base past POOL_SLOTS", "pool_count(POOL_SLOT_RANGE)", among(_STATE, *_USABLE),
             gt("base", _SLOT_BITS, 32)),
        rule("longer than the served part (rest wrapped)", "pool_count(POOL_BYPASS)",
             among(_STATE, *_USABLE), eq("rest_sign", 1)),
        rule("longer than the served part", "pool_count(POOL_BYPASS)", among(_STATE, *_USABLE), eq("room_sign", 1)),
        rule("VALID: written only when stale", "pool_fill_if_stale()", eq(_STATE, c.PoolState.VALID),
             bit("flags", c.FLAG_NO_CACHE.bit_length() - 1, 0)),
        rule("VALID, a NO_CACHE answer: always written (a repair when current)", "pool_fill_repair()",
             eq(_STATE, c.PoolState.VALID)),
        rule("FILLING: always written", "pool_fill_always()", eq(_STATE, c.PoolState.FILLING)),
    ),
    default="pool_skip()",  # an unusable state
    actions=("pool_count", "pool_mismatch", "pool_skip", "pool_fill_if_stale", "pool_fill_repair",
             "pool_fill_always"),
    doc="A DATA for a pooled chunk: written into its slot, or why not.",
)

POOL_OUTCOME = Table(
    name="pool_outcome",
    keys=(Key("pool_do", "pool_do", 8), Key("hit", "hit", 1), Key("current", "current", 1), Key("fresh", "fresh", 1)),
    rules=(
        rule("the slot holds the fragment: served", "serve()", eq("pool_do", POOL_DO["SERVE"]), eq("hit", 1)),
        rule("VALID and stale: written", "fill()", eq("pool_do", POOL_DO["FILL_IF_STALE"]), eq("current", 0)),
        rule("a NO_CACHE answer rewrote a current slot", "fill_repair()", eq("pool_do", POOL_DO["FILL_REPAIR"]),
             eq("current", 1)),
        rule("a NO_CACHE answer filled a stale slot", "fill()", eq("pool_do", POOL_DO["FILL_REPAIR"])),
        rule("FILLING: written", "fill()", eq("pool_do", POOL_DO["FILL_ALWAYS"])),
        rule("a mismatch not reported yet", "mismatch_reported()", eq("pool_do", POOL_DO["MISMATCH"]), eq("fresh", 1)),
    ),
    default="NoAction()",
    actions=("serve", "fill", "fill_repair", "mismatch_reported", "NoAction"),
    doc="What the slot's tag (or the mismatch cell) answered decides the pool's work.",
)

POOL_OTHER = Table(
    name="pool_other_decide",
    keys=(Key("pool_found", "meta.pool_found", 1), Key("opcode", "hdr.kv.opcode", 8)),
    rules=(
        rule("chunk not in the pool", "pool_count(POOL_LOOKUP_MISS)", eq("pool_found", 0)),
        rule("INVALIDATE from a writer: forwarded", "pool_count(POOL_INVALIDATE)", eq("opcode", c.OP_INVALIDATE)),
    ),
    default="pool_skip()",  # a NACK
    actions=("pool_count", "pool_skip"),
    doc="Any other opcode: counted when its chunk is pooled (INVALIDATE) or not.",
)

FORWARD_VERDICT = Table(
    name="forward_verdict",
    keys=(Key("drop_reason", "meta.drop_reason", 8), Key("bridge_flags", "hdr.bridge.flags", 8),
          Key("served", "meta.served", 1), Key("ipv4_valid", "hdr.ipv4.isValid()", 1, True),
          Key("ttl", "hdr.ipv4.ttl", 8), Key("fwd", "meta.fwd", 8)),
    rules=(
        rule("dropped already", "NoAction()", nonzero("drop_reason", 8)),
        rule("absorbed: to egress, which records and drops it", "back_out()",
             any_bit("bridge_flags", BRIDGE_ABSORB)),
        rule("served: the reply goes back out of its port", "back_out()", eq("served", 1)),
        rule("TTL expired", "ttl_expired()", eq("ipv4_valid", 1), le("ttl", 1, 8)),
        rule("released: multicast by Coalesce", "released()", eq("ipv4_valid", 1), eq("bridge_flags", BRIDGE_RELEASE)),
        rule("released (not IPv4)", "NoAction()", eq("bridge_flags", BRIDGE_RELEASE)),
        rule("routed", "route()", eq("ipv4_valid", 1), eq("fwd", FWD_ROUTE)),
        rule("routed (not IPv4)", "route_as_is()", eq("fwd", FWD_ROUTE)),
        rule("ARP to a known port", "unicast()", eq("fwd", FWD_UNICAST)),
        rule("ARP flooded", "flood()", eq("fwd", FWD_FLOOD)),
        rule("no route", "drop_for(DROP_NO_ROUTE)", eq("fwd", FWD_NO_ROUTE)),
    ),
    default="drop_for(DROP_UNHANDLED)",
    actions=("back_out", "ttl_expired", "released", "route", "route_as_is", "unicast", "flood", "drop_for",
             "NoAction"),
    doc="Where a packet goes: Forwarding's answer unless absorbed, served, expired or released.",
)

POP_GATE = Table(
    name="pop_gate",
    keys=(Key("get_ok", "meta.get_ok", 1), Key("from_fabric", "meta.from_fabric", 1),
          Key("pool_found", "meta.pool_found", 1), Key("opcode", "hdr.kv.opcode", 8),
          Key("frag_index", "hdr.kv.frag_index", 16), Key("flags", "hdr.kv.flags", 16)),
    rules=(
        rule("a first fetch of a chunk the pool lacks, entering the fabric here", "pop_counted()",
             eq("get_ok", 1), eq("from_fabric", 0), eq("pool_found", 0), eq("opcode", c.OP_GET),
             eq("frag_index", 0), bit("flags", c.FLAG_RETRANSMIT.bit_length() - 1, 0)),
    ),
    default="NoAction()",
    actions=("pop_counted", "NoAction"),
    doc="What the sketch counts: a GET that passed Safety, from a host port, for fragment 0, not re-asked.",
)

HOT_CHECK = Table(
    name="hot_check",
    keys=(Key("pop_go", "pop_go", 1), Key("d0", "d0", 32), Key("d1", "d1", 32), Key("d2", "d2", 32)),
    rules=(
        rule("counted, no row below the threshold: estimate >= hot_threshold", "hot_reached()",
             eq("pop_go", 1), sign("d0", 32, 0), sign("d1", 32, 0), sign("d2", 32, 0)),
    ),
    default="NoAction()",
    actions=("hot_reached", "NoAction"),
    doc="The estimate (the rows' min) reached the threshold: each row's count minus it is not negative.",
)

BLOOM_CHECK = Table(
    name="bloom_check",
    keys=(Key("reached", "reached", 1), Key("seen0", "seen0", 1), Key("seen1", "seen1", 1)),
    rules=(
        rule("both Bloom rows held the epoch's tag: reported already", "hot_seen()",
             eq("reached", 1), eq("seen0", 1), eq("seen1", 1)),
        rule("hot and new this epoch", "hot_report()", eq("reached", 1)),
    ),
    default="NoAction()",
    actions=("hot_seen", "hot_report", "NoAction"),
    doc="A hot chunk is reported once per epoch: unless the Bloom filter has seen it.",
)

CO_KIND = Table(
    name="co_kind_check",
    keys=(Key("opcode", "hdr.kv.opcode", 8), Key("frag_count", "hdr.kv.frag_count", 16),
          Key("flags", "hdr.kv.flags", 16), Key("has_waiter", "meta.has_waiter", 1),
          Key("past_last", "past_last", 16)),
    rules=(
        rule("a range GET from a host with no waiter id", "co_kind_is(CO_K_NO_WAITER)",
             eq("opcode", c.OP_GET), gt("frag_count", 1, 16), eq("has_waiter", 0)),
        rule("a range GET re-asked: joins nothing, opens nothing", "co_kind_is(CO_K_PEEK)",
             eq("opcode", c.OP_GET), gt("frag_count", 1, 16), any_bit("flags", c.FLAG_RETRANSMIT)),
        rule("a range GET", "co_kind_is(CO_K_GET)", eq("opcode", c.OP_GET), gt("frag_count", 1, 16)),
        rule("a response to a host with no waiter id", "NoAction()", eq("has_waiter", 0)),
        rule("a NACK ends the answer", "co_kind_is(CO_K_ANSWER_LAST)", eq("opcode", c.OP_NACK)),
        rule("the chunk's last fragment ends the answer", "co_kind_is(CO_K_ANSWER_LAST)",
             eq("opcode", c.OP_DATA), eq("past_last", 0)),
        rule("a fragment of the answer", "co_kind_is(CO_K_ANSWER)", eq("opcode", c.OP_DATA)),
    ),
    default="NoAction()",
    actions=("co_kind_is", "NoAction"),
    doc="What a kvpool packet is to Coalesce, before Safety's verdict (each path then waits for its own).",
)

_GETS = (CO_K["GET"], CO_K["PEEK"])
_OVER = (PRED["OVER"], PRED["OVER_MINE"])
_LIVE = (PRED["NEITHER"], PRED["MINE"])

CO_FINISH = Table(
    name="co_finish",
    keys=(Key("get_ok", "meta.get_ok", 1), Key("co_kind", "co_kind", 8), Key("pred", "pred", 8),
          Key("same_key", "same_key", 1), Key("same_gen", "same_gen", 1)),
    rules=(
        rule("no waiter id", "co_count(CO_NO_WAITER_ID)", eq("get_ok", 1), eq("co_kind", CO_K["NO_WAITER"])),
        rule("the slot was over: opened by this GET", "co_opened()", eq("co_kind", CO_K["GET"]), among("pred", *_OVER)),
        rule("over, and a RETRANSMIT opens nothing", "co_count(CO_RETRANSMIT)", eq("co_kind", CO_K["PEEK"]),
             among("pred", *_OVER)),
        rule("live with another chunk", "co_count(CO_COLLISION)", among("co_kind", *_GETS), among("pred", *_LIVE),
             eq("same_key", 0)),
        rule("live with another generation", "co_count(CO_OTHER_GENERATION)", among("co_kind", *_GETS),
             among("pred", *_LIVE), eq("same_gen", 0)),
        rule("the owner's next GET", "co_owner()", among("co_kind", *_GETS), eq("pred", PRED["MINE"])),
        rule("a RETRANSMIT joins nothing", "co_count(CO_RETRANSMIT)", eq("co_kind", CO_K["PEEK"]),
             eq("pred", PRED["NEITHER"])),
        rule("a duplicate: absorbed", "co_absorbed()", eq("co_kind", CO_K["GET"]), eq("pred", PRED["NEITHER"])),
    ),
    default="NoAction()",
    actions=("co_count", "co_opened", "co_owner", "co_absorbed", "NoAction"),
    doc="A range GET's outcome from what pending_live, pending_key and pending_gen answered.",
)

FILES: dict[str, tuple[str, tuple[Table, ...]]] = {
    "decide_safety.p4": ("control Safety (safety.p4)", (HEADER_CHECK, DATA_CHECK, STATUS_CHECK, SAFETY_VERDICT,
                                                       GET_VERDICT)),
    "decide_pool.p4": ("control Pool (pool.p4)", (POOL_GET, POOL_DATA, POOL_OTHER, POOL_OUTCOME)),
    "decide_popularity.p4": ("control Popularity (popularity.p4)", (POP_GATE, HOT_CHECK, BLOOM_CHECK)),
    "decide_coalesce.p4": ("control Coalesce (coalesce.p4)", (CO_KIND, CO_FINISH)),
    "decide_ingress.p4": ("control MyIngress (ingress.p4)", (FORWARD_VERDICT,)),
}
"""Generated file -> (where it is included, its tables)."""

TABLES: tuple[Table, ...] = tuple(t for _, tables in FILES.values() for t in tables)


# ------------------------------------------------------------------------------- rendering


def _pattern(key: Key, value: int, mask: int) -> str:
    if mask == 0:
        return "_"
    if key.boolean:
        return "true" if value else "false"   # a bool key takes a bool
    digits = (key.width + 3) // 4
    return f"{key.width}w0x{value:0{digits}x} &&& {key.width}w0x{mask:0{digits}x}"


def table_p4(table: Table) -> str:
    """One table's P4 source (its actions are the including control's)."""
    entries = expand(table)
    width = max(len(k.expr) for k in table.keys)
    keys = "\n".join(f"            {k.expr + ':':<{width + 1}} ternary;" for k in table.keys)
    lines = []
    last = -1
    for e in entries:
        if e.rule != last:
            lines.append(f"            // {e.rule + 1}. {table.rules[e.rule].why}")
            last = e.rule
        pats = ", ".join(_pattern(k, v, m) for k, (v, m) in zip(table.keys, e.patterns, strict=True))
        lines.append(f"            ({pats}) : {e.action};")
    actions = "; ".join(table.actions)
    return (f"    // {table.doc}\n"
            f"    @hidden\n"
            f"    table {table.name} {{\n"
            f"        key = {{\n{keys}\n        }}\n"
            f"        actions = {{ {actions}; }}\n"
            f"        size = {max(len(entries), 1)};\n"
            f"        const entries = {{\n" + "\n".join(lines) + "\n"
            f"        }}\n"
            f"        const default_action = {table.default};\n"
            f"    }}\n")


def file_p4(name: str) -> str:
    where, tables = FILES[name]
    head = ("/* -*- P4_16 -*- */\n"
            "// Generated by scripts/tna_decisions.py from its decision lists; do not edit.\n"
            f"// Included inside {where}: each table's entries in priority order, a rule's\n"
            "// number and reason above its entries.\n\n")
    return head + "\n".join(table_p4(t) for t in tables)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=TNA_DIR,
                        help="where the decide_*.p4 files go (default: p4/tna)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name in FILES:
        path = args.dir / name
        text = file_p4(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            n = sum(len(expand(t)) for t in FILES[name][1])
            print(f"{path}: {len(FILES[name][1])} tables, {n} entries")
    if stale:
        print(f"stale: {', '.join(stale)}; regenerate: python -m scripts.tna_decisions", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
