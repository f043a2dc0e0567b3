"""The P4 program's contract (p4/): every fact about it that Python code relies on, once.

The switch model, the controller, the fabric, the daemon, the tests and the benchmarks
import this module instead of spelling any of these again:

* where the program and its committed p4c output live (``p4/``, ``p4/build/``);
* the qualified P4Info names of its tables, match fields, actions, parameters, counters,
  registers and digest (ids come from the P4Info at run time, never from here);
* the constants of ``p4/include/constants.p4`` under the same names, and its index
  blocks (drop reasons, statistics, pool states) as enums;
* the geometry the program declares (table, counter and register sizes) and the hash
  salts of ``p4/include/popularity.p4``.

Wire-format values come from :mod:`kvpool.wire`; the constants here that mirror them are
derived from it, not copied.  ``tests/kvpool/test_contract.py`` checks this module against
``p4/build/kvpool.p4info.txtpb``, ``p4/include/*.p4`` and ``p4/README.md``, and
``tests/switchmodel/test_model_vs_build.py`` checks the switch model against ``p4/build/kvpool.json``.
Standard library and :mod:`kvpool.wire` only: no protobuf, no gRPC.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Final

from kvpool import wire

# --------------------------------------------------------------------------------------------
# Where the program and its compiled artefacts live
# --------------------------------------------------------------------------------------------

P4_DIR: Final = Path(__file__).resolve().parents[1] / "p4"
"""The P4 sources: ``kvpool.p4`` (wiring) and ``include/`` (one file per concern)."""
INCLUDE_DIR: Final = P4_DIR / "include"
BUILD_DIR: Final = P4_DIR / "build"
"""Committed p4c output (``make -C p4`` writes it), so a user without p4c can run."""
P4INFO_FILE: Final = "kvpool.p4info.txtpb"
BMV2_JSON_FILE: Final = "kvpool.json"
P4C_VERSION_FILE: Final = "p4c-version.txt"
P4INFO_PATH: Final = BUILD_DIR / P4INFO_FILE
BMV2_JSON_PATH: Final = BUILD_DIR / BMV2_JSON_FILE
P4C_VERSION_PATH: Final = BUILD_DIR / P4C_VERSION_FILE
BUILD_ENV: Final = "KVPOOL_P4_BUILD"
"""Environment variable naming another build directory (tests and benchmarks honour it)."""


def build_dir() -> Path:
    """The build directory tests and benchmarks use: ``$KVPOOL_P4_BUILD`` or the committed one."""
    override = os.environ.get(BUILD_ENV)
    return Path(override) if override else BUILD_DIR


# --------------------------------------------------------------------------------------------
# P4Info names
# --------------------------------------------------------------------------------------------

NO_ACTION: Final = "NoAction"

# --- tables ----------------------------------------------------------------------------------
HOST_GUARD: Final = "MyIngress.safety.host_guard"
WRITERS: Final = "MyIngress.safety.writers"
POOL_LOOKUP: Final = "MyIngress.pool.pool_lookup"
POPULARITY_CONFIG: Final = "MyIngress.popularity.popularity_config"
COALESCE_CONFIG: Final = "MyIngress.coalesce.coalesce_config"
WAITER_LOOKUP: Final = "MyIngress.coalesce.waiter_lookup"
IPV4_ROUTE: Final = "MyIngress.fwd.ipv4_route"
ARP_FORWARD: Final = "MyIngress.fwd.arp_forward"
WAITER_EGRESS: Final = "MyEgress.coalesce.waiter_egress"

# --- match fields (P4 expressions, as p4c names them) ------------------------------------------
KEY_INGRESS_PORT: Final = "standard_metadata.ingress_port"
KEY_WRITER_SRC: Final = "hdr.ipv4.srcAddr"
KEY_CHUNK_KEY: Final = "hdr.kv.chunk_key"
KEY_WAITER_ADDR: Final = "meta.waiter_addr"
KEY_IPV4_DST: Final = "hdr.ipv4.dstAddr"
KEY_ARP_TPA: Final = "hdr.arp.tpa"
KEY_EGRESS_RID: Final = "standard_metadata.egress_rid"

#: Table -> its match fields, in key order (keyless config tables have none).
TABLE_KEYS: Final[dict[str, tuple[str, ...]]] = {
    HOST_GUARD: (KEY_INGRESS_PORT,),
    WRITERS: (KEY_INGRESS_PORT, KEY_WRITER_SRC),
    POOL_LOOKUP: (KEY_CHUNK_KEY,),
    POPULARITY_CONFIG: (),
    COALESCE_CONFIG: (),
    WAITER_LOOKUP: (KEY_WAITER_ADDR,),
    IPV4_ROUTE: (KEY_IPV4_DST,),
    ARP_FORWARD: (KEY_ARP_TPA,),
    WAITER_EGRESS: (KEY_EGRESS_RID,),
}

# --- actions ---------------------------------------------------------------------------------
GUARD_SOURCE: Final = "MyIngress.safety.guard_source"
FABRIC_PORT: Final = "MyIngress.safety.fabric_port"
ALLOW_WRITER: Final = "MyIngress.safety.allow_writer"
POOL_ENTRY: Final = "MyIngress.pool.pool_entry"
SET_POPULARITY: Final = "MyIngress.popularity.set_popularity"
SET_PENDING_TIMEOUT: Final = "MyIngress.coalesce.set_pending_timeout"
SET_WAITER_ID: Final = "MyIngress.coalesce.set_waiter_id"
IPV4_FORWARD: Final = "MyIngress.fwd.ipv4_forward"
DROP_NO_ROUTE: Final = "MyIngress.fwd.drop_no_route"
ARP_UNICAST: Final = "MyIngress.fwd.arp_unicast"
ARP_FLOOD: Final = "MyIngress.fwd.arp_flood"
REWRITE_WAITER: Final = "MyEgress.coalesce.rewrite_waiter"

#: Action -> its parameters, in declaration order.
ACTION_PARAMS: Final[dict[str, tuple[str, ...]]] = {
    NO_ACTION: (),
    GUARD_SOURCE: ("addr",),
    FABRIC_PORT: (),
    ALLOW_WRITER: (),
    POOL_ENTRY: ("base_slot", "frag_count", "chunk_len", "generation", "state", "placement"),
    SET_POPULARITY: ("threshold", "epoch"),
    SET_PENDING_TIMEOUT: ("timeout_us",),
    SET_WAITER_ID: ("waiter_id",),
    IPV4_FORWARD: ("port", "dst_mac"),
    DROP_NO_ROUTE: (),
    ARP_UNICAST: ("port",),
    ARP_FLOOD: ("mcast_grp",),
    REWRITE_WAITER: ("addr", "mac"),
}

# --- indexed counters (packets) ----------------------------------------------------------------
DROP_REASON: Final = "MyIngress.drop_reason"
SLOT_HITS: Final = "MyIngress.pool.slot_hits"
SLOT_FILLS: Final = "MyIngress.pool.slot_fills"
POOL_STATS: Final = "MyIngress.pool.pool_stats"
COALESCE_STATS: Final = "MyIngress.coalesce.coalesce_stats"
POPULARITY_STATS: Final = "MyIngress.popularity.popularity_stats"
WAITER_REPLICAS: Final = "MyEgress.coalesce.waiter_replicas"
EGRESS_STATS: Final = "MyEgress.coalesce.egress_stats"

COUNTERS: Final[tuple[str, ...]] = (DROP_REASON, SLOT_HITS, SLOT_FILLS, POOL_STATS, COALESCE_STATS,
                                    POPULARITY_STATS, WAITER_REPLICAS, EGRESS_STATS)

# --- registers (data plane only: the model's pipeline uses them; P4Runtime cannot) --------------
SLICES: Final[tuple[str, ...]] = tuple(f"MyIngress.pool.slice_{i}" for i in range(wire.SLICES_PER_FRAGMENT))
SLOT_TAG: Final = "MyIngress.pool.slot_tag"
"""Per slot: ``{placement:32, frag_index:16}`` of the bytes it holds (0: never written)."""
SLOT_CHECK: Final = "MyIngress.pool.slot_check"
"""Per slot: the writer's check of those bytes, returned as is in served replies."""
MISMATCH_SEEN: Final = "MyIngress.pool.mismatch_seen"
SKETCH_ROWS: Final[tuple[str, ...]] = tuple(f"MyIngress.popularity.sketch_row{i}" for i in range(3))
BLOOM_ROWS: Final[tuple[str, ...]] = tuple(f"MyIngress.popularity.bloom_row{i}" for i in range(2))
PENDING_KEY: Final = "MyIngress.coalesce.pending_key"
PENDING_SUB: Final = "MyIngress.coalesce.pending_sub"
"""Per pending slot: ``{frag_index:16, generation asked for:32}``."""
PENDING_TS: Final = "MyIngress.coalesce.pending_ts"
PENDING_WAITERS: Final = "MyIngress.coalesce.pending_waiters"
PENDING_REPLY: Final = "MyEgress.coalesce.pending_reply"

REGISTERS: Final[tuple[str, ...]] = (*SLICES, SLOT_TAG, SLOT_CHECK, MISMATCH_SEEN, *SKETCH_ROWS, *BLOOM_ROWS,
                                     PENDING_KEY, PENDING_SUB, PENDING_TS, PENDING_WAITERS, PENDING_REPLY)

# --- digests ---------------------------------------------------------------------------------
HOT_CHUNK: Final = "hot_chunk_t"
"""The popularity stage's report of a hot chunk (P4Info names a digest by its struct)."""
FILL_MISMATCH: Final = "fill_mismatch_t"
"""The pool's report of writer DATA unlike its entry (another generation or length)."""
#: Digest -> its struct members, in order.
DIGEST_MEMBERS: Final[dict[str, tuple[str, ...]]] = {
    HOT_CHUNK: ("chunk_key", "estimate", "epoch"),
    FILL_MISMATCH: ("chunk_key", "generation", "frag_count", "chunk_len"),
}


def all_names() -> list[tuple[str, str]]:
    """Every (P4Info entity kind, qualified name) this module defines."""
    return ([("table", t) for t in TABLE_KEYS] + [("action", a) for a in ACTION_PARAMS]
            + [("counter", c) for c in COUNTERS] + [("register", r) for r in REGISTERS]
            + [("digest", d) for d in DIGEST_MEMBERS])


# --------------------------------------------------------------------------------------------
# Constants of p4/include/constants.p4, same names (wire values derived from kvpool.wire)
# --------------------------------------------------------------------------------------------

ETHERTYPE_IPV4: Final = 0x0800
ETHERTYPE_ARP: Final = 0x0806
IPPROTO_UDP: Final = 17

KVPOOL_UDP_PORT: Final = wire.KVPOOL_UDP_PORT
KVPOOL_VERSION: Final = wire.KVPOOL_VERSION
OP_GET: Final = int(wire.Opcode.GET)
OP_DATA: Final = int(wire.Opcode.DATA)
OP_INVALIDATE: Final = int(wire.Opcode.INVALIDATE)
OP_NACK: Final = int(wire.Opcode.NACK)
OP_MAX: Final = max(int(o) for o in wire.Opcode)
FLAG_SWITCH_SERVED: Final = int(wire.Flag.SWITCH_SERVED)
FLAG_RETRANSMIT: Final = int(wire.Flag.RETRANSMIT)
FLAG_COALESCED: Final = int(wire.Flag.COALESCED)
FLAG_NO_CACHE: Final = int(wire.Flag.NO_CACHE)
KNOWN_FLAGS: Final = wire.KNOWN_FLAGS
STATUS_OK: Final = int(wire.Status.OK)
STATUS_MAX: Final = max(int(s) for s in wire.Status)

KV_HEADER_BYTES: Final = wire.HEADER_LEN
SLICE_BYTES: Final = wire.SLICE_BYTES
SLICE_BITS: Final = 8 * wire.SLICE_BYTES
SLICES_PER_FRAGMENT: Final = wire.SLICES_PER_FRAGMENT
FRAG_PAYLOAD: Final = wire.FRAG_PAYLOAD
MAX_FRAG_INDEX: Final = wire.MAX_FRAGMENTS
"""``frag_index`` must stay below this; ``frag_index + frag_count`` of a GET may reach it."""

KV_UDP_LEN_NO_PAYLOAD: Final = wire.UDP_HEADER_LEN + wire.HEADER_LEN
KV_UDP_LEN_DATA: Final = wire.UDP_HEADER_LEN + wire.DATA_DATAGRAM_LEN
KV_IPV4_LEN_DATA: Final = wire.IPV4_HEADER_LEN + KV_UDP_LEN_DATA
KV_IPV4_LEN_NO_PAYLOAD: Final = wire.IPV4_HEADER_LEN + KV_UDP_LEN_NO_PAYLOAD
SWITCH_REPLY_TTL: Final = 64
"""IPv4 TTL of a reply the switch builds from a GET."""

# --- pool geometry -------------------------------------------------------------------------------
POOL_SLOTS: Final = 1024
"""Fragment-sized rows of switch memory; a chunk occupies consecutive slots from its base."""
POOL_ENTRIES: Final = POOL_SLOTS + 1
"""Chunks the pool table holds (at most one per slot), plus the controller's placement mark entry."""
PENDING_SLOTS: Final = 65536
"""Pending-request slots for coalescing (direct-mapped by a hash of chunk key and fragment)."""
MISMATCH_CELLS: Final = 256
"""Cells remembering the last fill mismatch reported, per crc16(chunk_key) (digest suppression)."""
MAX_WAITERS: Final = 32
"""Hosts that can wait on one coalesced fragment: waiter ids 0..31, a 32-bit bitmap."""
PENDING_REPLIES: Final = PENDING_SLOTS * MAX_WAITERS
SKETCH_COLS: Final = 4096
"""Cells per count-min sketch row (3 rows)."""
BLOOM_BITS: Final = 4096
"""Cells per Bloom filter row (2 rows)."""
ROUTE_ENTRIES: Final = 1024
ARP_ENTRIES: Final = 1024
WRITER_ENTRIES: Final = 256
GUARD_ENTRIES: Final = 512
"""Host ports whose IPv4 source ``host_guard`` checks (one entry per port)."""

COALESCE_MCAST_GRP: Final = 1
"""First multicast group of the coalescing release.  Group ``COALESCE_MCAST_GRP + t`` holds one
replica (port to waiter w, rid w) per waiter ``w <= t`` of the switch: a release goes to the
group of the highest waiter id in its bitmap (``coalesce_group``), so a switch makes replicas
for waiters ``0..t`` only, not for every waiter it knows."""


def coalesce_group(mask: int) -> int:
    """The multicast group a release to the waiter bitmap ``mask`` (non-zero) goes to."""
    if not 0 < mask < 1 << MAX_WAITERS:
        raise ValueError(f"a waiter bitmap is 1..2**{MAX_WAITERS}-1, got {mask}")
    return COALESCE_MCAST_GRP + mask.bit_length() - 1

DEFAULT_PENDING_TIMEOUT_US: Final = 100_000
DEFAULT_HOT_THRESHOLD: Final = 8
DEFAULT_SKETCH_EPOCH: Final = 1
EPOCH_MAX: Final = 127
"""Largest popularity epoch (``epoch_t`` is bit<7>; the tag is {1, epoch}, never 0)."""

SKETCH_COUNT_MAX: Final = 0xFFFFFF
"""Count-min counters are {tag:8, count:24}; a count saturates here instead of wrapping."""
DIGEST_RECEIVER: Final = 1

# Hash salts of p4/include/popularity.p4 (a second, independent index from the same key).
SKETCH_SALT: Final = 0x9E3779B9
BLOOM_SALT: Final = 0x85EBCA6B


class PoolState(enum.IntEnum):
    """``state`` parameter of ``pool_entry`` (``POOL_STATE_*``); any other value disables the entry."""

    DISABLED = 0
    FILLING = 1
    VALID = 2
    UPSTREAM = 3


# --------------------------------------------------------------------------------------------
# Counter indices (constants.p4 index blocks; p4/README.md documents them)
# --------------------------------------------------------------------------------------------


class DropReason(enum.IntEnum):
    """Indices of ``MyIngress.drop_reason`` (``DROP_*``)."""

    NONE = 0
    PARSE_ERROR = 1
    BAD_CHECKSUM = 2
    TTL_EXPIRED = 3
    NO_ROUTE = 4
    UNHANDLED = 5
    BAD_VERSION = 6
    BAD_OPCODE = 7
    BAD_FLAGS = 8
    BAD_RANGE = 9
    BAD_LENGTH = 10
    BAD_STATUS = 11
    NOT_WRITER = 12
    SPOOFED = 13


class PoolStat(enum.IntEnum):
    """Indices of ``MyIngress.pool.pool_stats`` (``POOL_*``)."""

    LOOKUP_MISS = 0
    HIT = 1
    MISS_UNFILLED = 2
    BYPASS = 3
    FILL = 4
    FILL_MISMATCH = 5
    FILL_SKIPPED = 6
    FILL_UNAUTH = 7
    FILL_REPLICA = 8
    INVALIDATE = 9
    SLOT_RANGE = 10
    NO_ROOM = 11
    REPAIR = 12
    MISMATCH_REPORTED = 13
    UPSTREAM = 14


class CoalesceStat(enum.IntEnum):
    """Indices of ``MyIngress.coalesce.coalesce_stats`` (``CO_*``)."""

    FIRST = 0
    ABSORBED = 1
    RETRANSMIT = 2
    COLLISION = 3
    NO_WAITER_ID = 4
    RELEASE = 5
    EXPIRED_REUSED = 6
    OTHER_GENERATION = 7
    OWNER = 8


class PopularityStat(enum.IntEnum):
    """Indices of ``MyIngress.popularity.popularity_stats`` (``POP_*``)."""

    COUNTED = 0
    REPORTED = 1
    SUPPRESSED = 2


class EgressStat(enum.IntEnum):
    """Indices of ``MyEgress.coalesce.egress_stats`` (``EG_*``)."""

    REPLICA_SENT = 0
    REPLICA_PRUNED = 1
    NO_WAITER_ENTRY = 2
    REPLY_RECORDED = 3


# --------------------------------------------------------------------------------------------
# Geometry as the program declares it (P4Info and BMv2 JSON sizes)
# --------------------------------------------------------------------------------------------

#: Table -> entries it holds (``size``).
TABLE_SIZES: Final[dict[str, int]] = {
    HOST_GUARD: GUARD_ENTRIES,
    WRITERS: WRITER_ENTRIES,
    POOL_LOOKUP: POOL_ENTRIES,
    POPULARITY_CONFIG: 1,
    COALESCE_CONFIG: 1,
    WAITER_LOOKUP: MAX_WAITERS,
    IPV4_ROUTE: ROUTE_ENTRIES,
    ARP_FORWARD: ARP_ENTRIES,
    WAITER_EGRESS: MAX_WAITERS,
}

#: Counter -> cells (``DROP_REASONS``, ``POOL_STATS``, ... in constants.p4 for the labelled ones).
COUNTER_SIZES: Final[dict[str, int]] = {
    DROP_REASON: 16,
    SLOT_HITS: POOL_SLOTS,
    SLOT_FILLS: POOL_SLOTS,
    POOL_STATS: 16,
    COALESCE_STATS: len(CoalesceStat),
    POPULARITY_STATS: 4,
    WAITER_REPLICAS: MAX_WAITERS,
    EGRESS_STATS: 8,
}

#: Register -> (cells, bits per cell).
REGISTER_SHAPES: Final[dict[str, tuple[int, int]]] = {
    **{s: (POOL_SLOTS, SLICE_BITS) for s in SLICES},
    SLOT_TAG: (POOL_SLOTS, 48),
    SLOT_CHECK: (POOL_SLOTS, 64),
    MISMATCH_SEEN: (MISMATCH_CELLS, 64),
    **{r: (SKETCH_COLS, 32) for r in SKETCH_ROWS},
    **{r: (BLOOM_BITS, 8) for r in BLOOM_ROWS},
    PENDING_KEY: (PENDING_SLOTS, 64),
    PENDING_SUB: (PENDING_SLOTS, 48),
    PENDING_TS: (PENDING_SLOTS, 48),
    PENDING_WAITERS: (PENDING_SLOTS, MAX_WAITERS),
    PENDING_REPLY: (PENDING_REPLIES, 48),
}


# --------------------------------------------------------------------------------------------
# The TNA program (p4/tna/, Tofino 1): same names wherever the function is the same
# --------------------------------------------------------------------------------------------
# Tables, actions, parameters, counters, counter indices and digests are the ones above (a TNA
# P4Info answers to them: kvpool.p4rt.p4info looks past bf-p4c's pipe prefix).  What differs is
# below: registers whose cells Tofino lays out differently, and the geometry of one pipe
# (p4/tna/geometry.p4; p4/README.md, "v1model and TNA: what differs and why").

TNA_DIR: Final = P4_DIR / "tna"
"""The TNA sources: ``kvpool_tna.p4`` (wiring) and one file per concern."""
TNA_MAIN: Final = TNA_DIR / "kvpool_tna.p4"
TNA_BUILD_DIR: Final = TNA_DIR / "build"
"""Committed bf-p4c output: P4Info and the resource summary (``make -C p4 tna``)."""
TNA_P4INFO_PATH: Final = TNA_BUILD_DIR / "kvpool_tna.p4info.txtpb"
TNA_RESOURCES_PATH: Final = TNA_BUILD_DIR / "resources.json"
"""Per-stage use of one pipe, summarised from bf-p4c's ``pipe/logs/resources.json``."""
TNA_PIPE: Final = "pipe"
"""The Pipeline instance: bf-p4c writes table and action names as ``pipe.<control>...``."""
TNA_STAGES: Final = 12
"""Match-action stages of a Tofino 1 pipe, per gress."""

TNA_POOL_SLOTS: Final = 16384
TNA_POOL_ENTRIES: Final = TNA_POOL_SLOTS + 1
TNA_PENDING_SLOTS: Final = 2048
TNA_MAX_WAITERS: Final = MAX_WAITERS
TNA_PENDING_REPLIES: Final = TNA_PENDING_SLOTS * TNA_MAX_WAITERS
TNA_SERVED_WORDS: Final = 8
TNA_SERVED_BYTES: Final = 4 * TNA_SERVED_WORDS
"""The part of a fragment a TNA pool stores and serves; only fragments this short are served."""

TNA_WORDS: Final[tuple[str, ...]] = tuple(f"MyEgress.pool.word_{i}" for i in range(TNA_SERVED_WORDS))
TNA_SLOT_CHECK: Final[tuple[str, ...]] = ("MyEgress.pool.slot_check_hi", "MyEgress.pool.slot_check_lo")
TNA_PENDING_LIVE: Final = "MyIngress.coalesce.pending_live"
"""Per pending slot: ``{ts, tag}``, tag = ``{1, 00, owner waiter id:8, crc32(chunk_key)[31:11]}``."""
TNA_PENDING_GEN: Final = "MyIngress.coalesce.pending_gen"
TNA_PENDING_REPLY: Final[tuple[str, ...]] = ("MyEgress.coalesce.pending_reply_id",
                                             "MyEgress.coalesce.pending_reply_port")

#: Register -> (cells, bits per cell) in the TNA program (pairs of 32-bit halves are 64 bits).
TNA_REGISTER_SHAPES: Final[dict[str, tuple[int, int]]] = {
    SLOT_TAG: (TNA_POOL_SLOTS, 64),
    MISMATCH_SEEN: (MISMATCH_CELLS, 64),
    **{r: (SKETCH_COLS, 64) for r in SKETCH_ROWS},
    **{r: (BLOOM_BITS, 8) for r in BLOOM_ROWS},
    TNA_PENDING_LIVE: (TNA_PENDING_SLOTS, 64),
    PENDING_KEY: (TNA_PENDING_SLOTS, 64),
    TNA_PENDING_GEN: (TNA_PENDING_SLOTS, 32),
    PENDING_WAITERS: (TNA_PENDING_SLOTS, TNA_MAX_WAITERS),
    **{w: (TNA_POOL_SLOTS, 32) for w in TNA_WORDS},
    **{c: (TNA_POOL_SLOTS, 32) for c in TNA_SLOT_CHECK},
    TNA_PENDING_REPLY[0]: (TNA_PENDING_REPLIES, 32),
    TNA_PENDING_REPLY[1]: (TNA_PENDING_REPLIES, 16),
}

#: Table -> entries in the TNA program.
TNA_TABLE_SIZES: Final[dict[str, int]] = {**TABLE_SIZES, POOL_LOOKUP: TNA_POOL_ENTRIES}

#: Counter -> cells in the TNA program.
TNA_COUNTER_SIZES: Final[dict[str, int]] = {**COUNTER_SIZES, SLOT_HITS: TNA_POOL_SLOTS,
                                            SLOT_FILLS: TNA_POOL_SLOTS}


def tna_names() -> list[tuple[str, str]]:
    """Every (P4Info entity kind, name) the TNA program must define: the shared ones and its registers."""
    return ([(kind, name) for kind, name in all_names() if kind != "register"]
            + [("register", r) for r in TNA_REGISTER_SHAPES])


def tna_sources() -> list[Path]:
    """The files the TNA program is compiled from: p4/tna/*.p4 and the shared includes."""
    return [*sorted(TNA_DIR.glob("*.p4")), INCLUDE_DIR / "constants.p4", INCLUDE_DIR / "wire.p4"]
