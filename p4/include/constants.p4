/* -*- P4_16 -*- */
/*
 * kvpool constants: wire format, pool geometry, reason and statistic indices.
 *
 * Wire values mirror kvpool/wire.py; every constant has a same-named twin (or enum member)
 * in kvpool/contract.py, which tests/test_contract.py checks: edit them together.
 * The geometry constants are #defines because P4_16 needs compile-time integers for
 * register, counter and table sizes and for header-stack lengths.
 */
#ifndef KVPOOL_CONSTANTS_P4
#define KVPOOL_CONSTANTS_P4

/*************************************************************************
 ***********************  W I R E   F O R M A T  *************************
 *************************************************************************/

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP  = 0x0806;
const bit<8>  IPPROTO_UDP    = 17;

const bit<16> KVPOOL_UDP_PORT = 7470;
const bit<8>  KVPOOL_VERSION  = 2;

// Opcodes (kvpool.wire.Opcode).
const bit<8> OP_GET        = 1;
const bit<8> OP_DATA       = 2;
const bit<8> OP_INVALIDATE = 3;
const bit<8> OP_NACK       = 4;
const bit<8> OP_MAX        = 4;

// Flag bits (kvpool.wire.Flag); anything outside KNOWN_FLAGS is malformed.
const bit<16> FLAG_SWITCH_SERVED = 0x0001;
const bit<16> FLAG_RETRANSMIT    = 0x0002;
const bit<16> FLAG_COALESCED     = 0x0004;
const bit<16> FLAG_NO_CACHE      = 0x0008;
const bit<16> KNOWN_FLAGS        = 0x000F;

// NACK status codes (kvpool.wire.Status): OK (0) on every other opcode, 1..STATUS_MAX on NACK.
const bit<16> STATUS_OK  = 0;
const bit<16> STATUS_MAX = 5;

// Header and payload geometry (kvpool.wire.HEADER_LEN, SLICE_BYTES, SLICES_PER_FRAGMENT).
#define KV_HEADER_BYTES     40
#define SLICE_BITS          1024
#define SLICE_BYTES         128
#define SLICES_PER_FRAGMENT 11
// FRAG_PAYLOAD = SLICE_BYTES * SLICES_PER_FRAGMENT = 1408 bytes in every DATA packet.
const bit<16> FRAG_PAYLOAD  = 1408;
const bit<16> MAX_FRAG_INDEX = 0xFFFF;  // frag_index must stay below this (wire.MAX_FRAGMENTS)

// Lengths of the packets the switch checks or creates (IPv4 without options).
const bit<16> KV_UDP_LEN_NO_PAYLOAD = 48;    // UDP 8 + kvpool 40: GET, INVALIDATE, NACK
const bit<16> KV_UDP_LEN_DATA       = 1456;  // UDP 8 + kvpool 40 + payload 1408 (or reply room)
const bit<16> KV_IPV4_LEN_DATA      = 1476;  // IPv4 20 + KV_UDP_LEN_DATA
const bit<16> KV_IPV4_LEN_NO_PAYLOAD = 68;    // IPv4 20 + KV_UDP_LEN_NO_PAYLOAD
const bit<8>  SWITCH_REPLY_TTL      = 64;

/*************************************************************************
 ***********************  P O O L   G E O M E T R Y  *********************
 *************************************************************************/

// A target whose memory differs declares its own geometry before including this file and
// defines KVPOOL_GEOMETRY (p4/tna/geometry.p4 does); the values below are BMv2's.
#ifndef KVPOOL_GEOMETRY
#define KVPOOL_GEOMETRY

// Fragment-sized rows of switch memory; a chunk occupies frag_count consecutive slots
// from its base slot.  11 x 1024 slots x 128 B = 1.375 MiB of register memory.
#define POOL_SLOTS      1024
// Chunks the pool table can hold (at most one per slot), plus the controller's placement
// mark entry (controller/placement.py).
#define POOL_ENTRIES    1025
// Pending-request slots for coalescing, indexed by a hash of chunk_key.  A GET whose slot
// another chunk holds is not coalesced, so the table is sized well above the chunks being
// fetched through one switch at once.
#define PENDING_SLOTS   65536
// Cells remembering the last fill mismatch reported per crc16(chunk_key) (digest suppression).
#define MISMATCH_CELLS  256
// Hosts that can wait on a coalesced chunk; the waiter bitmap is bit<MAX_WAITERS>.
#define MAX_WAITERS     32
// Per (pending slot, waiter) reply records: PENDING_SLOTS * MAX_WAITERS.
#define PENDING_REPLIES 2097152
// Count-min sketch: SKETCH_ROWS (fixed at 3) rows of SKETCH_COLS counters.
#define SKETCH_COLS     4096
// Bloom filter against duplicate hot-chunk reports: 2 rows of BLOOM_BITS cells.
#define BLOOM_BITS      4096
// Routes and ARP entries.
#define ROUTE_ENTRIES   1024
#define ARP_ENTRIES     1024
#define WRITER_ENTRIES  256
// Host ports whose IPv4 source the switch checks (one entry per port).
#define GUARD_ENTRIES   512
const bit<48> DEFAULT_PENDING_TIMEOUT_US = 100000;  // 100 ms, BMv2 timestamps are in us

#endif  // KVPOOL_GEOMETRY

// First of the MAX_WAITERS nested multicast groups the controller programs for releases:
// group COALESCE_MCAST_GRP + t has a replica (port towards waiter w, egress_rid = w) for
// every waiter w <= t of the switch (groups 1..32).
const bit<16> COALESCE_MCAST_GRP = 1;

// Defaults of the runtime-settable configuration tables (default actions).
const bit<32> DEFAULT_HOT_THRESHOLD      = 8;
const bit<7>  DEFAULT_SKETCH_EPOCH       = 1;

// Pool entry states (action parameter `state` of pool_entry).
// Any value other than FILLING and VALID disables the entry (#define: nothing tests for it).
#define POOL_STATE_DISABLED 0      // entry kept but neither filled nor served
const bit<8> POOL_STATE_FILLING  = 1;  // every writer DATA is written; filled fragments served
const bit<8> POOL_STATE_VALID    = 2;  // served; writer DATA rewrites a slot only if it is not
                                       // current or the DATA answers a NO_CACHE request (repair)
const bit<8> POOL_STATE_UPSTREAM = 3;  // held by a switch nearer the holder: GETs keep their
                                       // reply room past this one; neither filled nor served here

// Count saturates instead of wrapping (count-min counters are {tag:8, count:24}).
const bit<24> SKETCH_COUNT_MAX = 0xFFFFFF;
const bit<32> DIGEST_RECEIVER  = 1;  // ignored by BMv2's P4Runtime server, required by v1model

/*************************************************************************
 ***********************  D R O P   R E A S O N S  ***********************
 *************************************************************************/
// Index into MyIngress.drop_reason; mirrored by the DropReason enum in p4/README.md.
// DROP_NONE is never counted: it means "not dropped".
typedef bit<8> dropReason_t;
const dropReason_t DROP_NONE             = 0;
const dropReason_t DROP_PARSE_ERROR      = 1;   // truncated header or payload
const dropReason_t DROP_BAD_CHECKSUM     = 2;   // IPv4 header checksum wrong
const dropReason_t DROP_TTL_EXPIRED      = 3;   // IPv4 TTL <= 1 on a forwarded packet
const dropReason_t DROP_NO_ROUTE         = 4;   // no ipv4_route / arp_forward entry
const dropReason_t DROP_UNHANDLED        = 5;   // neither IPv4 nor ARP (e.g. IPv6)
const dropReason_t DROP_BAD_VERSION      = 6;
const dropReason_t DROP_BAD_OPCODE       = 7;
const dropReason_t DROP_BAD_FLAGS        = 8;
const dropReason_t DROP_BAD_RANGE        = 9;   // frag_count 0, frag_index out of range
const dropReason_t DROP_BAD_LENGTH       = 10;  // payload_len / UDP length / chunk_len inconsistent
const dropReason_t DROP_BAD_STATUS       = 11;
const dropReason_t DROP_NOT_WRITER       = 12;  // INVALIDATE not from a writer (port, source)
const dropReason_t DROP_SPOOFED          = 13;  // IPv4 source other than the host's on a host port
#define DROP_REASONS 16

/*************************************************************************
 ***********************  S T A T I S T I C S  ***************************
 *************************************************************************/
// Index into MyIngress.pool.pool_stats.
const bit<32> POOL_LOOKUP_MISS      = 0;   // kvpool packet whose chunk is not in the pool
const bit<32> POOL_HIT              = 1;   // GET answered from switch memory
const bit<32> POOL_MISS_UNFILLED    = 2;   // admitted, but the slot's tag is not {placement, frag_index}
const bit<32> POOL_BYPASS           = 3;   // range GET, NO_CACHE, other generation pinned, or disabled
const bit<32> POOL_FILL             = 4;   // fragment written into its slot
const bit<32> POOL_FILL_MISMATCH    = 5;   // writer DATA unlike the entry (generation, frag_count,
                                           // chunk_len): forwarded, not written
const bit<32> POOL_FILL_SKIPPED     = 6;   // VALID state and slot already current: no write needed
const bit<32> POOL_FILL_UNAUTH      = 7;   // DATA for an admitted chunk not from a writer, not written
const bit<32> POOL_FILL_REPLICA     = 8;   // DATA a switch built or replicated: never written
const bit<32> POOL_INVALIDATE       = 9;   // INVALIDATE from a writer: forwarded, changes nothing
const bit<32> POOL_SLOT_RANGE       = 10;  // base_slot + frag_index >= POOL_SLOTS (controller bug)
const bit<32> POOL_NO_ROOM          = 11;  // servable GET without reply room: sent to the holder
const bit<32> POOL_REPAIR           = 12;  // NO_CACHE writer DATA rewrote a slot that looked current
const bit<32> POOL_MISMATCH_REPORTED = 13; // fill mismatch sent to the controller (fill_mismatch_t)
const bit<32> POOL_UPSTREAM         = 14;  // GET for a chunk held upstream: passed on with its room
#define POOL_STATS 16

// Index into MyIngress.coalesce.coalesce_stats.
const bit<32> CO_FIRST              = 0;   // GET opened a pending slot and went to the holder
const bit<32> CO_ABSORBED           = 1;   // duplicate GET absorbed
const bit<32> CO_RETRANSMIT         = 2;   // RETRANSMIT GET for a chunk in progress: upstream, joins nothing
const bit<32> CO_COLLISION          = 3;   // slot busy with another chunk: GET forwarded
const bit<32> CO_NO_WAITER_ID       = 4;   // requester has no waiter id: GET forwarded
const bit<32> CO_RELEASE            = 5;   // DATA/NACK to a slot's owner multicast to its waiters
const bit<32> CO_EXPIRED_REUSED     = 6;   // a timed-out slot was taken over by a new GET
const bit<32> CO_OTHER_GENERATION   = 7;   // slot answers this chunk at another generation
const bit<32> CO_OWNER              = 8;   // the slot owner's next GET: forwarded, slot kept live
#define COALESCE_STATS 9

// Index into MyIngress.popularity.popularity_stats.
const bit<32> POP_COUNTED           = 0;   // missed GET counted in the sketch
const bit<32> POP_REPORTED          = 1;   // digest sent
const bit<32> POP_SUPPRESSED        = 2;   // over threshold but already reported this epoch
#define POPULARITY_STATS 4

// Index into MyEgress.coalesce.egress_stats.
const bit<32> EG_REPLICA_SENT       = 0;   // coalesced replica rewritten and sent
const bit<32> EG_REPLICA_PRUNED     = 1;   // replica for a waiter not in the bitmap
const bit<32> EG_NO_WAITER_ENTRY    = 2;   // replica whose egress_rid has no waiter_egress entry
const bit<32> EG_REPLY_RECORDED     = 3;   // (request_id, port) of a waiter stored
#define EGRESS_STATS 8

#endif  // KVPOOL_CONSTANTS_P4
