/* -*- P4_16 -*- */
/*
 * Pool: chunk lookup, hits served from register memory, fill on pass, as
 * ../include/pool.p4 (same table, action, counters and decisions), split across the
 * gresses by where each register is used.
 *
 * Ingress (control Pool): pool_lookup, every decision and every counter, and slot_tag,
 * whose {placement, frag_index} decides hit, miss and fill.  A hit rewrites the GET into
 * the DATA reply here; a fill or a hit is handed to egress in bridge.pool_op.
 * Egress (control PoolEgress): the bytes.  SERVED_WORDS registers of 32-bit words
 * (word_0 .. word_7) and the writer's check (slot_check_hi, slot_check_lo), indexed
 * by the slot, are read into a served reply or written from a passing DATA.
 *
 * What a Tofino 1 pipe can serve, and why 32 bytes.  A stateful ALU reads or writes one
 * cell of at most 32 bits (or a pair of 32-bit halves, returning 32 bits) once per packet,
 * 4 per stage: one register per served word.  And a switch only rewrites bytes its parser
 * put into the PHV: Tofino 1's egress parser reads at most 160 bytes of a packet (bf-p4c,
 * specs/parde_spec.h), of which the egress intrinsic metadata (27), the bridged header
 * (14), Ethernet + IPv4 + UDP (42) and the kvpool header (40) take 123.  That leaves 37:
 * SERVED_WORDS = 8, 32 bytes.  More passes (recirculation) do not help: no pass reaches
 * further into the payload.  (Serving from ingress, whose parser has no such limit, would
 * lift it to the PHV's and the stateful ALUs' budget, about 128 bytes.)  So the TNA pool
 * stores and serves the first SERVED_BYTES = 32 bytes of a fragment, and only a fragment
 * whose payload_len is at most that is served or filled (a chunk of at most 32 bytes, or
 * the short last fragment of a chunk).  Its reply is still a full DATA: the GET's
 * 1408-byte room carries it, the switch writes the first 32 bytes and the rest leaves as
 * the requester sent it (zeros), past payload_len, which no receiver reads.
 * A fragment longer than SERVED_BYTES counts as POOL_BYPASS (GET) or is not written (DATA,
 * POOL_BYPASS too): the controller admits to a TNA pool only chunks that fit.
 *
 * Other differences from v1model:
 * - A GET's reply room is never stripped (1408 bytes are not in the PHV, so they cannot be
 *   cut): a GET with room that is not answered goes on with its room, and the holder
 *   accepts either size (kvpool.wire).
 * - A served reply leaves through the port its GET came in on, with the Ethernet
 *   addresses swapped, instead of being routed by ipv4_route on the requester's address
 *   (ipv4_route is applied once, on the original destination, before the pool knows): the
 *   same port wherever routes are symmetric, as in every kvpool topology.
 * - A packet counts once per counter: POOL_REPAIR stands for FILL + REPAIR and
 *   POOL_MISMATCH_REPORTED for FILL_MISMATCH + MISMATCH_REPORTED.
 * - slot_tag is a pair {placement, frag_index} (64 bits, 48 on BMv2); slot_check is two
 *   32-bit registers; mismatch_seen is a pair.
 */
#ifndef KVPOOL_TNA_POOL_P4
#define KVPOOL_TNA_POOL_P4

/*************************************************************************
 ***********************  P O O L   (ingress)  ***************************
 *************************************************************************/

// What a decision table of the pool leaves to slot_tag or mismatch_seen (Pool.pool_do).
const bit<8> POOL_DO_NONE          = 0;
const bit<8> POOL_DO_SERVE         = 1;   // tag_is: served when the slot holds the fragment
const bit<8> POOL_DO_MISMATCH      = 2;   // mismatch_new: reported unless it was already
const bit<8> POOL_DO_FILL_IF_STALE = 3;   // tag_write_if_stale: written unless current
const bit<8> POOL_DO_FILL_REPAIR   = 4;   // tag_write: written, a repair when current
const bit<8> POOL_DO_FILL_ALWAYS   = 5;   // tag_write: written

// The pool's directory, looked up by its own control so that the ingress can run it first:
// it only reads, so it runs for every KV packet beside Safety, and Popularity and Coalesce
// (which read pool_found) then run before the pool's decisions, which rewrite the header of
// a GET they serve.  The ingress names this instance "pool", so the table and action keep
// v1model's names (MyIngress.pool.pool_lookup, MyIngress.pool.pool_entry).  The branch on
// its answer tests pool_found, not the table's hit: Tofino 1 has no long branches, so every
// later reader of a table's result would wait for the whole branch its hit decides.
control PoolLookup(inout headers_t hdr, inout ig_metadata_t meta) {

    action pool_entry(slotIdx_t base_slot, bit<16> frag_count, bit<32> chunk_len,
                      generation_t generation, bit<8> state, placement_t placement) {
        meta.pool_found = 1;
        meta.base_slot = base_slot;
        meta.pool_frag_count = frag_count;
        meta.pool_chunk_len = chunk_len;
        meta.pool_generation = generation;
        meta.pool_state = state;
        meta.pool_placement = placement;
    }

    table pool_lookup {
        key = { hdr.kv.chunk_key: exact; }
        actions = { pool_entry; NoAction; }
        size = POOL_ENTRIES;
        default_action = NoAction();
    }

    apply {
        if (hdr.kv.isValid()) {
            pool_lookup.apply();
        }
    }
}

control Pool(inout headers_t hdr,
             inout ig_metadata_t meta,
             in ingress_intrinsic_metadata_t standard_metadata,
             inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
             inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    // Per slot: {placement, frag_index} of its bytes (0: never written).
    Register<pair32_t, bit<32>>(POOL_SLOTS) slot_tag;
    // Last fill mismatch reported, per crc16(chunk_key) cell.
    Register<pair32_t, bit<32>>(MISMATCH_CELLS) mismatch_seen;

    Counter<bit<32>, bit<32>>(POOL_SLOTS, CounterType_t.PACKETS) slot_hits;
    Counter<bit<32>, bit<32>>(POOL_SLOTS, CounterType_t.PACKETS) slot_fills;
    Counter<bit<32>, bit<32>>(POOL_STATS, CounterType_t.PACKETS) pool_stats;

    Hash<bit<16>>(HashAlgorithm_t.CRC16) mismatch_hash;

    // 1 when the slot holds this fragment of this placement.
    RegisterAction<pair32_t, bit<32>, bit<1>>(slot_tag) tag_is = {
        void apply(inout pair32_t v, out bit<1> current) {
            if (v.hi == meta.pool_placement && v.lo == meta.want_index) {
                current = 1;
            } else {
                current = 0;
            }
        }
    };

    // FILLING, or a NO_CACHE answer: always written; says whether it was current.
    RegisterAction<pair32_t, bit<32>, bit<1>>(slot_tag) tag_write = {
        void apply(inout pair32_t v, out bit<1> current) {
            if (v.hi == meta.pool_placement && v.lo == meta.want_index) {
                current = 1;
            } else {
                current = 0;
            }
            v.hi = meta.pool_placement;
            v.lo = meta.want_index;
        }
    };

    // VALID: written only when not current (FILL_SKIPPED saves the egress writes).
    RegisterAction<pair32_t, bit<32>, bit<1>>(slot_tag) tag_write_if_stale = {
        void apply(inout pair32_t v, out bit<1> current) {
            if (v.hi == meta.pool_placement && v.lo == meta.want_index) {
                current = 1;
            } else {
                v.hi = meta.pool_placement;
                v.lo = meta.want_index;
                current = 0;
            }
        }
    };

    // 1 when the cell did not hold this mismatch yet (and now does).
    RegisterAction<pair32_t, bit<32>, bit<1>>(mismatch_seen) mismatch_new = {
        void apply(inout pair32_t v, out bit<1> changed) {
            if (v.hi == meta.what_hi && v.lo == meta.what_lo) {
                changed = 0;
            } else {
                v.hi = meta.what_hi;
                v.lo = meta.what_lo;
                changed = 1;
            }
        }
    };

    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) slot_index;
    // 32-bit sums narrowed to 16-bit header fields through a hash unit: a copy would tie the
    // sum's container to the header's size, and a sum cannot be split across containers.
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) slot_low;
    bit<32> sidx;        // pool_slot through slot_index: the slot registers' index
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) rest_low;
    // The entry's checks, cut to what a gateway compares (at most 4 bytes of PHV, one side
    // constant): differences, XORs and ORs here, their sign bits or zero there.  Copies
    // through identity hash units keep a tested value out of the chain of 32-bit sums
    // (a slice of one splits the whole chain), and widen 16-bit fields for 32-bit ones.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) copy_rest;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) copy_base;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) wide_count_diff;  // frag_count ^ the entry's, widened
    bit<32> rest;        // pool_chunk_len - frag_done: payload bytes of this fragment as the entry has it
    bit<32> rest_copy;   // rest, out of the chain
    bit<32> room;        // SERVED_BYTES - rest: negative when the fragment is longer
    bit<32> base_copy;
    bit<16> count_xor;   // frag_count ^ the entry's (16 bits)
    bit<16> index_top;   // max(frag_index, the entry's frag_count)
    bit<16> index_past;  // index_top ^ frag_index: 0 when frag_index >= the entry's frag_count
    bit<32> gen_diff;    // generation ^ the entry's
    bit<32> gen_bad;     // min(generation, gen_diff): not 0 when a GET pins another generation
    bit<32> len_diff;    // chunk_len ^ the entry's
    bit<32> count_diff;  // count_xor, 32 bits
    bit<32> differs;     // gen_diff | len_diff | count_diff: not 0 when a DATA describes another chunk

    // One hash output per action: an action takes at most 32 bits from hash units.
    action entry_rest_sum() {
        rest = meta.pool_chunk_len - meta.frag_done;
    }

    action entry_rest() {
        rest_copy = copy_rest.get({ rest });
        gen_diff = hdr.kv.generation ^ meta.pool_generation;
        len_diff = hdr.kv.chunk_len ^ meta.pool_chunk_len;
    }

    // A reported mismatch, as the key of mismatch_seen: two CRC-32s over the chunk key with its
    // generation and with its length (v1model XORs them in; here that XOR would join the
    // header's fields to the group of the entry's compares, which then no longer fits one).
    Hash<bit<32>>(HashAlgorithm_t.CRC32) what_hash_hi;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) what_hash_lo;

    action what_hi_of() {
        meta.what_hi = what_hash_hi.get({ hdr.kv.chunk_key, hdr.kv.generation });
    }

    action what_lo_of() {
        meta.what_lo = what_hash_lo.get({ hdr.kv.chunk_len, hdr.kv.chunk_key });
    }

    action entry_base() {
        base_copy = copy_base.get({ meta.base_slot });
    }

    action entry_count_xor() {
        count_xor = hdr.kv.frag_count ^ meta.pool_frag_count;
    }

    action entry_count_diff() {
        count_diff = wide_count_diff.get({ count_xor });
    }

    action entry_index_top() {
        index_top = max(hdr.kv.frag_index, meta.pool_frag_count);
    }

    action compare_entry() {
        room = (bit<32>)SERVED_BYTES - rest_copy;
        index_past = index_top ^ hdr.kv.frag_index;
        gen_bad = (hdr.kv.generation < gen_diff) ? hdr.kv.generation : gen_diff;
        differs = gen_diff | len_diff;
    }

    action combine_entry() {
        differs = differs | count_diff;
    }


    bit<16> slot16;      // pool_slot, for the bridged header
    bit<16> rest16;      // rest, the served reply's payload_len
    bit<16> cell;        // mismatch_seen's cell
    // What the decision tables leave to the registers (POOL_DO_*), and what they answer.
    bit<8> pool_do = POOL_DO_NONE;
    bit<1> hit = 0;      // tag_is: the slot holds the fragment
    bit<1> current = 0;  // tag_write*: the slot held it before this DATA
    bit<1> fresh = 0;    // mismatch_new: not reported yet

    // The GET becomes the DATA reply in place and goes back out of its ingress port; egress
    // turns it around (PoolEgress.reply: addresses, ports, opcode, flags, frag_count and
    // generation, the fields Popularity and Coalesce read, so that no stage of theirs
    // waits for this one) and fills the served part of its room (POOL_OP_SERVE).
    @hidden
    action serve() {
        hdr.kv.payload_len = rest16;
        hdr.kv.status = STATUS_OK;
        hdr.kv.chunk_len = meta.pool_chunk_len;
        meta.served = 1;
        meta.pool_stat = POOL_HIT;
        hdr.bridge.pool_op = POOL_OP_SERVE;
        hdr.bridge.slot = slot16;
        // The reply's frag_count and generation ride in fields of the GET that the reply
        // overwrites and nothing in ingress reads (its UDP checksum, which the reply zeroes,
        // and the low half of its check, which egress reads from the slot): bridged, they
        // would take the egress parser past its 160 bytes, or split its states where bf-p4c
        // fails to allocate their match registers.
        hdr.udp.checksum = meta.pool_frag_count;
        hdr.kv.check[31:0] = meta.pool_generation;
    }

    @hidden
    action fill() {
        hdr.bridge.pool_op = POOL_OP_FILL;
        hdr.bridge.slot = slot16;
        meta.pool_stat = POOL_FILL;
    }

    @hidden
    action fill_repair() {
        hdr.bridge.pool_op = POOL_OP_FILL;
        hdr.bridge.slot = slot16;
        meta.pool_stat = POOL_REPAIR;
    }

    @hidden
    action mismatch_reported() {
        meta.report_mismatch = 1;   // digested at the end of the ingress
        meta.pool_stat = POOL_MISMATCH_REPORTED;
    }

    // What the decision tables (decide_pool.p4, scripts/tna_decisions.py) conclude: v1model's
    // chains, one ternary table per opcode (Tofino 1 makes a table of every branch of a chain).
    // The register accesses they lead to run in the switch below, and change the statistic
    // where their answer decides it.
    @hidden
    action pool_count(bit<32> stat) {
        meta.count_pool = 1;
        meta.pool_stat = stat;
    }

    @hidden
    action pool_skip() {
        meta.count_pool = 0;   // a disabled entry's DATA (passed on, nothing remembered), a NACK
    }

    @hidden
    action pool_try_serve() {
        meta.count_pool = 1;
        meta.pool_stat = POOL_MISS_UNFILLED;   // unless the slot's tag says it holds the fragment
        pool_do = POOL_DO_SERVE;
    }

    @hidden
    action pool_mismatch() {
        meta.count_pool = 1;
        meta.pool_stat = POOL_FILL_MISMATCH;
        pool_do = POOL_DO_MISMATCH;
    }

    // VALID and not a NO_CACHE answer: written only when the slot is not current.
    @hidden
    action pool_fill_if_stale() {
        meta.count_pool = 1;
        meta.pool_stat = POOL_FILL_SKIPPED;   // unless the slot is stale
        pool_do = POOL_DO_FILL_IF_STALE;
    }

    // VALID, a NO_CACHE answer: always written, a repair when the slot looked current.
    @hidden
    action pool_fill_repair() {
        meta.count_pool = 1;
        pool_do = POOL_DO_FILL_REPAIR;
    }

    // FILLING: always written.
    @hidden
    action pool_fill_always() {
        meta.count_pool = 1;
        pool_do = POOL_DO_FILL_ALWAYS;
    }

#include "decide_pool.p4"


    // pool_lookup (PoolLookup, above) has run; this waits for Safety's verdict.  Tofino 1 has
    // no long branches: a table that follows an `if` in its sequence waits until every table
    // inside it is placed, so no `if` here holds more than one stage of tables (a decision
    // table, or the registers it chose); what the next step needs is in pool_do and the
    // registers' answers.
    apply {
        // The arithmetic on the lookup's answer only writes metadata, so it runs beside
        // Safety; the decisions below wait for its verdict.
        // A register index must be an action argument, a constant or a hash unit's
        // output (bf-p4c): the sum goes to metadata and through an identity hash.
        meta.pool_slot = meta.base_slot + meta.want_index;  // want_index: frag_index widened (Safety)
        sidx = slot_index.get({ meta.pool_slot });
        slot16 = slot_low.get({ meta.pool_slot });
        entry_rest_sum();
        rest16 = rest_low.get({ rest });
        entry_rest();
        entry_base();
        entry_count_xor();
        entry_count_diff();
        entry_index_top();
        compare_entry();
        combine_entry();
        what_hi_of();
        what_lo_of();
        cell = mismatch_hash.get({ hdr.kv.chunk_key });

        if (meta.drop_reason == DROP_NONE && hdr.kv.isValid()) {
            if (hdr.kv.opcode == OP_GET) {
                pool_get_decide.apply();
            } else if (hdr.kv.opcode == OP_DATA) {
                pool_data_decide.apply();
            } else {
                pool_other_decide.apply();
            }
        }
        // One slot_tag access decides: VALID skips a current slot, unless the DATA answers a
        // NO_CACHE request (repair); FILLING always writes.
        if (pool_do == POOL_DO_SERVE) {
            hit = tag_is.execute(sidx);
        } else if (pool_do == POOL_DO_FILL_IF_STALE) {
            current = tag_write_if_stale.execute(sidx);
        } else if (pool_do == POOL_DO_FILL_REPAIR || pool_do == POOL_DO_FILL_ALWAYS) {
            current = tag_write.execute(sidx);
        } else if (pool_do == POOL_DO_MISMATCH) {
            fresh = mismatch_new.execute((bit<32>)cell[7:0]);
        }
        pool_outcome.apply();
        // The counters in tables of their own: a table's actions must address each indirect
        // extern alike (bf-p4c), and pool_outcome's serve and fill count different ones.
        if (meta.count_pool == 1) {
            pool_stats.count(meta.pool_stat);
        }
        if (hdr.bridge.pool_op == POOL_OP_SERVE) {
            slot_hits.count(sidx);
        } else if (hdr.bridge.pool_op == POOL_OP_FILL) {
            slot_fills.count(sidx);
        }
    }
}

/*************************************************************************
 ***********************  P O O L   (egress)  ****************************
 *************************************************************************/

// What the egress pool does with its registers for this packet (PoolEgress.word_op).
const bit<8> WORD_NONE = 0;
const bit<8> WORD_GET  = 1;   // read into a served reply
const bit<8> WORD_PUT  = 2;   // written from a filling DATA

// One register of the served part, or of the check: read into the reply, or written from the
// DATA.  A stateful ALU takes one access per action, so each register has a table of its own,
// and that table does both (keyed on word_op): one logical table per register, not two.
#define POOL_REGISTER(name, reg_t, field)                                                \
    Register<reg_t, bit<32>>(POOL_SLOTS) name;                                           \
    RegisterAction<reg_t, bit<32>, reg_t>(name) name##_read = {                          \
        void apply(inout reg_t v, out reg_t rv) { rv = v; }                              \
    };                                                                                   \
    RegisterAction<reg_t, bit<32>, reg_t>(name) name##_write = {                         \
        void apply(inout reg_t v) { v = field; }                                         \
    };                                                                                   \
    @hidden                                                                              \
    action name##_get() { field = name##_read.execute((bit<32>)hdr.bridge.slot); }      \
    @hidden                                                                              \
    action name##_put() { name##_write.execute((bit<32>)hdr.bridge.slot); }              \
    @hidden                                                                              \
    table name##_op {                                                                    \
        key = { word_op: exact; }                                                        \
        actions = { name##_get; name##_put; NoAction; }                                  \
        size = 2;                                                                        \
        const entries = {                                                                \
            WORD_GET: name##_get();                                                      \
            WORD_PUT: name##_put();                                                      \
        }                                                                                \
        const default_action = NoAction();                                               \
    }

#define POOL_WORD(i) POOL_REGISTER(word_##i, bit<32>, hdr.words.w##i)
#define POOL_WORD_OP(i) word_##i##_op.apply();

control PoolEgress(inout headers_t hdr,
                   in egress_intrinsic_metadata_t standard_metadata) {

    bit<8> word_op = WORD_NONE;

    POOL_WORD(0)   POOL_WORD(1)   POOL_WORD(2)   POOL_WORD(3)
    POOL_WORD(4)   POOL_WORD(5)   POOL_WORD(6)   POOL_WORD(7)
#if SERVED_WORDS > 8
    POOL_WORD(8)  POOL_WORD(9)  POOL_WORD(10)  POOL_WORD(11)
#endif
#if SERVED_WORDS > 12
    POOL_WORD(12)  POOL_WORD(13)  POOL_WORD(14)  POOL_WORD(15)
#endif
#if SERVED_WORDS > 16
    POOL_WORD(16)  POOL_WORD(17)  POOL_WORD(18)  POOL_WORD(19)
#endif
#if SERVED_WORDS > 20
    POOL_WORD(20)  POOL_WORD(21)  POOL_WORD(22)  POOL_WORD(23)
#endif
#if SERVED_WORDS > 24
    POOL_WORD(24)  POOL_WORD(25)  POOL_WORD(26)  POOL_WORD(27)
#endif
#if SERVED_WORDS > 28
    POOL_WORD(28)  POOL_WORD(29)  POOL_WORD(30)  POOL_WORD(31)
#endif

    // The writer's check of the stored bytes, returned as is (two 32-bit halves).
    POOL_REGISTER(slot_check_hi, bit<32>, hdr.kv.check[63:32])
    POOL_REGISTER(slot_check_lo, bit<32>, hdr.kv.check[31:0])

    // The reply's header, from the GET's (ingress set payload_len, status and chunk_len).
    action reply() {
        macAddr_t mac = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = hdr.ethernet.srcAddr;
        hdr.ethernet.srcAddr = mac;
        ip4Addr_t addr = hdr.ipv4.dstAddr;
        hdr.ipv4.dstAddr = hdr.ipv4.srcAddr;
        hdr.ipv4.srcAddr = addr;
        hdr.ipv4.totalLen = KV_IPV4_LEN_DATA;
        hdr.ipv4.ttl = SWITCH_REPLY_TTL;
        bit<16> port = hdr.udp.dstPort;
        hdr.udp.dstPort = hdr.udp.srcPort;
        hdr.udp.srcPort = port;
        hdr.udp.length = KV_UDP_LEN_DATA;
        hdr.kv.frag_count = hdr.udp.checksum;   // (serve)
        hdr.udp.checksum = 0;
        hdr.kv.opcode = OP_DATA;
        hdr.kv.flags = FLAG_SWITCH_SERVED;
        hdr.kv.generation = hdr.kv.check[31:0];   // (serve)
    }

    apply {
        if (hdr.bridge.pool_op == POOL_OP_SERVE) {
            reply();
        }
        if (hdr.words.isValid()) {
            if (hdr.bridge.pool_op == POOL_OP_SERVE) {
                word_op = WORD_GET;
            } else if (hdr.bridge.pool_op == POOL_OP_FILL
                       && (hdr.bridge.flags != BRIDGE_RELEASE
                           || standard_metadata.egress_rid == (bit<16>)hdr.bridge.release_dst)) {
                // A released DATA is written once: by the replica to the waiter it answered.
                word_op = WORD_PUT;
            }
        }
        POOL_WORD_OP(0)   POOL_WORD_OP(1)   POOL_WORD_OP(2)   POOL_WORD_OP(3)
        POOL_WORD_OP(4)   POOL_WORD_OP(5)   POOL_WORD_OP(6)   POOL_WORD_OP(7)
#if SERVED_WORDS > 8
        POOL_WORD_OP(8)  POOL_WORD_OP(9)  POOL_WORD_OP(10)  POOL_WORD_OP(11)
#endif
#if SERVED_WORDS > 12
        POOL_WORD_OP(12)  POOL_WORD_OP(13)  POOL_WORD_OP(14)  POOL_WORD_OP(15)
#endif
#if SERVED_WORDS > 16
        POOL_WORD_OP(16)  POOL_WORD_OP(17)  POOL_WORD_OP(18)  POOL_WORD_OP(19)
#endif
#if SERVED_WORDS > 20
        POOL_WORD_OP(20)  POOL_WORD_OP(21)  POOL_WORD_OP(22)  POOL_WORD_OP(23)
#endif
#if SERVED_WORDS > 24
        POOL_WORD_OP(24)  POOL_WORD_OP(25)  POOL_WORD_OP(26)  POOL_WORD_OP(27)
#endif
#if SERVED_WORDS > 28
        POOL_WORD_OP(28)  POOL_WORD_OP(29)  POOL_WORD_OP(30)  POOL_WORD_OP(31)
#endif
        slot_check_hi_op.apply();
        slot_check_lo_op.apply();
    }
}

#endif  // KVPOOL_TNA_POOL_P4
