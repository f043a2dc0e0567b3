/* -*- P4_16 -*- */
/*
 * Geometry of the TNA program (Tofino 1, one pipe): what replaces the BMv2 block of
 * ../include/constants.p4.  Defining KVPOOL_GEOMETRY before that file is included keeps
 * its BMv2 values out; every other constant (wire format, drop reasons, statistics
 * indices, pool states, multicast groups) comes from there unchanged.
 *
 * Why these sizes (p4/README.md, "v1model and TNA: what differs and why"):
 * - A register lives in one stage, next to its stateful ALU (4 per stage, 12 stages per
 *   gress), and a stage has 80 SRAM blocks of 128 Kbit and 48 map RAMs; a stateful table
 *   also takes one map RAM per SRAM block.  A register of 16384 32-bit cells is 4 blocks.
 * - The served part of a fragment is the first SERVED_BYTES of its payload: 8 registers of
 *   32-bit words in egress, one stateful ALU each (see pool.p4 for why not more).
 */
#ifndef KVPOOL_TNA_GEOMETRY_P4
#define KVPOOL_TNA_GEOMETRY_P4

#define KVPOOL_GEOMETRY

// Slots of the egress pool: 32 word registers x 16384 cells x 4 B = 2 MiB of served bytes.
#define POOL_SLOTS      16384
// A chunk per slot at most, plus the controller's placement mark entry.
#define POOL_ENTRIES    16385
// Pending slots (per chunk, crc32 index): 4 ingress registers of 2048 cells.
#define PENDING_SLOTS   2048
#define MISMATCH_CELLS  256
#define MAX_WAITERS     32
// Reply records in egress: PENDING_SLOTS * MAX_WAITERS, a request id register and a port
// register (a Tofino 1 stateful ALU returns 32 bits, so {request_id, port} is two).
#define PENDING_REPLIES 65536
#define SKETCH_COLS     4096
#define BLOOM_BITS      4096
#define ROUTE_ENTRIES   1024
#define ARP_ENTRIES     1024
#define WRITER_ENTRIES  256
#define GUARD_ENTRIES   512
// Pending slots keep time on a coarse clock, global_tstamp[47:16] >> k (65.536 us << k per
// tick, k from the timeout: Coalesce.tick_shift), and a slot is over 17 ticks after its last
// sign of life, between the timeout and about twice it.  The timeout stays in microseconds;
// the data plane divides it by 64 (65.536 us units, 2.4% longer than on BMv2).
const bit<32> DEFAULT_PENDING_TIMEOUT_US = 100000;

// TNA only: the served part of a fragment, SERVED_WORDS registers of 32 bits (a multiple of 4, 8 to 32; 8 on Tofino 1: see pool.p4).
#define SERVED_WORDS    8
const bit<16> SERVED_BYTES = 4 * SERVED_WORDS;

// How the egress pool treats a packet (bridged from ingress).
const bit<8> POOL_OP_NONE  = 0;
const bit<8> POOL_OP_SERVE = 1;   // read the slot into the GET's reply room
const bit<8> POOL_OP_FILL  = 2;   // write the DATA's served part into the slot

// Digest types (ingress deparser).
const bit<3> DIGEST_HOT_CHUNK     = 1;
const bit<3> DIGEST_FILL_MISMATCH = 2;

#endif  // KVPOOL_TNA_GEOMETRY_P4
