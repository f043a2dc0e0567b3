"""Qualified P4Info names of the kvpool program (p4/), in one place.

The controller and the model's pipeline address tables, actions, counters, registers and
the digest by these names; ids come from the P4Info at run time. ``tests/test_p4names.py``
checks every name, key and parameter list against ``p4/build/kvpool.p4info.txtpb``.
"""

from __future__ import annotations

from pathlib import Path

#: Committed p4c output (p4/build/ in the repository).
BUILD_DIR = Path(__file__).resolve().parents[1] / "p4" / "build"
P4INFO_PATH = BUILD_DIR / "kvpool.p4info.txtpb"
BMV2_JSON_PATH = BUILD_DIR / "kvpool.json"

NO_ACTION = "NoAction"

# --- tables ----------------------------------------------------------------------------------
WRITERS = "MyIngress.safety.writers"
POOL_LOOKUP = "MyIngress.pool.pool_lookup"
POPULARITY_CONFIG = "MyIngress.popularity.popularity_config"
COALESCE_CONFIG = "MyIngress.coalesce.coalesce_config"
WAITER_LOOKUP = "MyIngress.coalesce.waiter_lookup"
IPV4_ROUTE = "MyIngress.fwd.ipv4_route"
ARP_FORWARD = "MyIngress.fwd.arp_forward"
WAITER_EGRESS = "MyEgress.coalesce.waiter_egress"

# --- match fields (P4 expressions, as p4c names them) ---------------------------------------------
KEY_WRITER_SRC = "hdr.ipv4.srcAddr"
KEY_CHUNK_KEY = "hdr.kv.chunk_key"
KEY_WAITER_ADDR = "meta.waiter_addr"
KEY_IPV4_DST = "hdr.ipv4.dstAddr"
KEY_ARP_TPA = "hdr.arp.tpa"
KEY_EGRESS_RID = "standard_metadata.egress_rid"

#: Table -> its match fields, in key order (keyless config tables have none).
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    WRITERS: (KEY_WRITER_SRC,),
    POOL_LOOKUP: (KEY_CHUNK_KEY,),
    POPULARITY_CONFIG: (),
    COALESCE_CONFIG: (),
    WAITER_LOOKUP: (KEY_WAITER_ADDR,),
    IPV4_ROUTE: (KEY_IPV4_DST,),
    ARP_FORWARD: (KEY_ARP_TPA,),
    WAITER_EGRESS: (KEY_EGRESS_RID,),
}

# --- actions ---------------------------------------------------------------------------------
ALLOW_WRITER = "MyIngress.safety.allow_writer"
POOL_ENTRY = "MyIngress.pool.pool_entry"
SET_POPULARITY = "MyIngress.popularity.set_popularity"
SET_PENDING_TIMEOUT = "MyIngress.coalesce.set_pending_timeout"
SET_WAITER_ID = "MyIngress.coalesce.set_waiter_id"
IPV4_FORWARD = "MyIngress.fwd.ipv4_forward"
DROP_NO_ROUTE = "MyIngress.fwd.drop_no_route"
ARP_UNICAST = "MyIngress.fwd.arp_unicast"
ARP_FLOOD = "MyIngress.fwd.arp_flood"
REWRITE_WAITER = "MyEgress.coalesce.rewrite_waiter"

#: Action -> its parameters, in declaration order.
ACTION_PARAMS: dict[str, tuple[str, ...]] = {
    NO_ACTION: (),
    ALLOW_WRITER: (),
    POOL_ENTRY: ("base_slot", "frag_count", "chunk_len", "generation", "state"),
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
DROP_REASON = "MyIngress.drop_reason"
SLOT_HITS = "MyIngress.pool.slot_hits"
SLOT_FILLS = "MyIngress.pool.slot_fills"
POOL_STATS = "MyIngress.pool.pool_stats"
COALESCE_STATS = "MyIngress.coalesce.coalesce_stats"
POPULARITY_STATS = "MyIngress.popularity.popularity_stats"
WAITER_REPLICAS = "MyEgress.coalesce.waiter_replicas"
EGRESS_STATS = "MyEgress.coalesce.egress_stats"

COUNTERS: tuple[str, ...] = (DROP_REASON, SLOT_HITS, SLOT_FILLS, POOL_STATS, COALESCE_STATS, POPULARITY_STATS,
                             WAITER_REPLICAS, EGRESS_STATS)

# --- registers (data plane only: the model's pipeline uses them; P4Runtime cannot) --------------
SLICES: tuple[str, ...] = tuple(f"MyIngress.pool.slice_{i}" for i in range(11))
SLOT_KEY = "MyIngress.pool.slot_key"
SLOT_GEN = "MyIngress.pool.slot_gen"
SLOT_VALID = "MyIngress.pool.slot_valid"
CHUNK_GEN = "MyIngress.pool.chunk_gen"
CHUNK_GEN_KEY = "MyIngress.pool.chunk_gen_key"
SKETCH_ROWS: tuple[str, ...] = tuple(f"MyIngress.popularity.sketch_row{i}" for i in range(3))
BLOOM_ROWS: tuple[str, ...] = tuple(f"MyIngress.popularity.bloom_row{i}" for i in range(2))
PENDING_TAG = "MyIngress.coalesce.pending_tag"
PENDING_TS = "MyIngress.coalesce.pending_ts"
PENDING_WAITERS = "MyIngress.coalesce.pending_waiters"
PENDING_REPLY = "MyEgress.coalesce.pending_reply"

REGISTERS: tuple[str, ...] = (*SLICES, SLOT_KEY, SLOT_GEN, SLOT_VALID, CHUNK_GEN, CHUNK_GEN_KEY, *SKETCH_ROWS,
                              *BLOOM_ROWS, PENDING_TAG, PENDING_TS, PENDING_WAITERS, PENDING_REPLY)

# --- digest ----------------------------------------------------------------------------------
HOT_CHUNK = "hot_chunk_t"
#: Digest -> its struct members, in order.
DIGEST_MEMBERS: dict[str, tuple[str, ...]] = {HOT_CHUNK: ("chunk_key", "estimate", "epoch")}


def all_names() -> list[tuple[str, str]]:
    """Every (P4Info entity kind, qualified name) this module defines."""
    return ([("table", t) for t in TABLE_KEYS] + [("action", a) for a in ACTION_PARAMS]
            + [("counter", c) for c in COUNTERS] + [("register", r) for r in REGISTERS]
            + [("digest", d) for d in DIGEST_MEMBERS])
