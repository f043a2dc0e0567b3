/* -*- P4_16 -*- */
/*
 * Coalescing: GETs for a chunk whose answer is already crossing the switch join it; the
 * answer is multicast to every waiter.  The behaviour of ../include/coalesce.p4 (per chunk,
 * range GETs only, owner, joiners, RETRANSMIT, generations, nested multicast groups,
 * reply records in egress), re-cut for Tofino's rule of one access per register per
 * packet, each access a stateful ALU on at most a pair of 32-bit halves:
 *
 * Ingress, 4 registers of PENDING_SLOTS cells indexed by crc32(chunk_key) mod PENDING_SLOTS,
 * each in its own stage, in this order (each decides from what the previous returned):
 *   pending_live    {ts, tag}: ts = the slot clock's tick when the slot last showed life
 *                   (tick_shift: global_tstamp[47:16] >> k, k from the configured timeout;
 *                   set half the clock away when the answer is over, which frees it),
 *                   tag = {1, 00, owner waiter id:8, crc64(chunk_key)[20:0]}.
 *                   Liveness is decided here, first, because the other three are written
 *                   only when a slot is opened: GET -> OPENED (slot over: opened with my
 *                   tag), MINE (my tag: ts refreshed), OTHER (another owner or chunk).
 *   pending_key     chunk_key {hi, lo}: written when opened, else compared (the tag's 21
 *                   bits of hash only narrow the choice; this is the exact test).
 *   pending_gen     the generation asked for: written when opened, else compared.
 *   pending_waiters bitmap: set to {me} when opened, or me added when absorbed; read by a
 *                   release, and cleared by the one that ends the answer.
 * On BMv2 the four cells are read first and written after; here the owner and liveness
 * share a pair, and pending_sub's owner half lives in pending_live's tag.
 *
 * Differences that follow:
 * - An answer that ends the slot (NACK, last fragment) frees it in pending_live, before
 *   the key and generation are compared; on BMv2 only a matching one does.  Only a writer's
 *   answer to the slot's owner, with the same 21-bit hash, gets that far, so what it can
 *   cost is coalescing, never a wrong answer.
 * - Every answer to the owner refreshes ts (BMv2: only while others wait).
 * - A slot is over 17 ticks of a coarse clock after its last sign of life, which is between
 *   the timeout and about twice it (BMv2: the timeout exactly).  A Tofino 1 stateful ALU takes
 *   two PHV operands, the tag and one time, so the test compares their difference with a
 *   constant; the clock's step (tick_shift, a constant table on the controller's timeout)
 *   makes 16 ticks at least the timeout.  The test is unsigned (now - ts >= 17), so a slot
 *   touched just before the 48-bit timestamp wraps (every 78 h) ends early, never late.
 * - A packet counts once per counter: CO_EXPIRED_REUSED stands for FIRST + EXPIRED_REUSED.
 * - 1 << waiter_id and the group of the highest waiter are looked up in two small constant
 *   tables (a Tofino ALU does not shift by a variable amount and has no priority encoder).
 *
 * Egress (CoalesceEgress): reply records pending_reply_id and pending_reply_port, cell
 * pending_idx * MAX_WAITERS + waiter, as pending_reply's {request_id, port} on BMv2 (a
 * Tofino 1 stateful ALU returns 32 bits, so two registers).
 */
#ifndef KVPOOL_TNA_COALESCE_P4
#define KVPOOL_TNA_COALESCE_P4

// A slot is over once the slot clock (tick_shift) has advanced LIVE_TICKS ticks past its last
// sign of life: 16 whole ticks, at least the timeout.
const bit<32> LIVE_TICKS = 17;

// A Tofino 1 stateful ALU outputs one source per action, so pending_live's actions return
// their 4-bit predicate, 1 << (cmphi * 2 + cmplo), with cmplo = over (LIVE_TICKS or more since
// ts) and cmphi = mine (the tag is this waiter's); the control branches on it.
const bit<8> PRED_NEITHER  = 1;  // live, not mine
const bit<8> PRED_OVER     = 2;  // over, not mine
const bit<8> PRED_MINE     = 4;  // live, mine
const bit<8> PRED_OVER_MINE = 8; // over, mine (over wins)

// What a kvpool packet is to Coalesce (co_kind_check, before Safety's verdict).
const bit<8> CO_K_NONE        = 0;
const bit<8> CO_K_NO_WAITER   = 1;   // a range GET from a host with no waiter id
const bit<8> CO_K_GET         = 2;   // a range GET: opens, joins or refreshes the chunk's slot
const bit<8> CO_K_PEEK        = 3;   // a range GET re-asked (RETRANSMIT): refreshes only its own
const bit<8> CO_K_ANSWER      = 4;   // DATA to a waiter: released to the slot's waiters
const bit<8> CO_K_ANSWER_LAST = 5;   // the last DATA or a NACK: released, and ends the slot

/*************************************************************************
 ***********************  C O A L E S C E   (ingress)  *******************
 *************************************************************************/

control Coalesce(inout headers_t hdr,
                 inout ig_metadata_t meta,
                 in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                 inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    Register<pair32_t, bit<32>>(PENDING_SLOTS) pending_live;
    Register<pair32_t, bit<32>>(PENDING_SLOTS) pending_key;
    Register<bit<32>, bit<32>>(PENDING_SLOTS)  pending_gen;
    Register<bit<32>, bit<32>>(PENDING_SLOTS)  pending_waiters;
    Counter<bit<32>, bit<32>>(COALESCE_STATS, CounterType_t.PACKETS) coalesce_stats;

    Hash<bit<32>>(HashAlgorithm_t.CRC32) pending_hash;
    // The tag's 21 bits of hash from a unit of their own (crc64's low 21), not crc32's high
    // bits: slicing crc32 at bit 11 for both the index and the tag left no PHV allocation.
    Hash<bit<21>>(HashAlgorithm_t.CRC64) tag_hash;
    // The same crc32 of the same key, 16 bits of it straight from a hash unit into the bridged
    // header (egress reads its low 11, crc[10:0]): one source for that container, not two
    // slices of the 32-bit result.  Egress only needs the same index for a chunk's GETs and
    // its answers, which this gives whatever bits the unit picks.
    Hash<bit<16>>(HashAlgorithm_t.CRC32) bridge_hash;

    bit<32> pending_timeout;
    // frag_index + 1 == frag_count (the chunk's last fragment) as an XOR tested against 0,
    // each step an action: a gateway does not compare two fields.
    bit<16> next;
    bit<16> past_last;

    // What the registers answered, and what co_kind_check made of the packet.
    bit<8> co_kind = CO_K_NONE;
    bit<8> pred = 0;                // pending_live's predicate (PRED_*), 0 when it did not run
    bit<1> same_key = 0;
    bit<1> same_gen = 0;
    bit<1> answers = 0;
    waiterMask_t before = 0;        // the waiters of a slot this GET reopened
    waiterMask_t mask = 0;          // the waiters an answer is released to


    // One hash output per action: an action takes at most 32 bits from hash units.
    action bridge_slot() {
        hdr.bridge.pending_idx = bridge_hash.get({ hdr.kv.chunk_key });
        hdr.bridge.waiter_id = meta.waiter_id[7:0];
    }

    // tag = {1, 00, waiter id:8} from waiter_bits, ORed with 21 bits of tag_hash (one ALU
    // operation: the hash unit's output is an operand of its own).
    action tag_bits() {
        meta.my_tag = meta.my_tag | (bit<32>)tag_hash.get({ hdr.kv.chunk_key });
    }

    action next_fragment() {
        next = hdr.kv.frag_index + 1;
    }

    action last_fragment() {
        past_last = next ^ hdr.kv.frag_count;
    }

    // cmplo and cmphi written inline: bf-p4c takes each as one comparison of the cell.
    RegisterAction<pair32_t, bit<32>, bit<8>>(pending_live) live_get = {
        void apply(inout pair32_t v, out bit<8> rv) {
            rv = this.predicate(meta.tick - v.hi >= LIVE_TICKS, v.lo == meta.my_tag);
            if (meta.tick - v.hi >= LIVE_TICKS) {
                v.hi = meta.tick;
                v.lo = meta.my_tag;
            } else if (v.lo == meta.my_tag) {
                v.hi = meta.tick;
            }
        }
    };

    RegisterAction<pair32_t, bit<32>, bit<8>>(pending_live) live_peek = {
        void apply(inout pair32_t v, out bit<8> rv) {
            rv = this.predicate(meta.tick - v.hi >= LIVE_TICKS, v.lo == meta.my_tag);
            if (meta.tick - v.hi < LIVE_TICKS && v.lo == meta.my_tag) {
                v.hi = meta.tick;
            }
        }
    };

    // An answer looks at the tag only: cmplo = mine, so PRED_OVER (2) here means mine.
    RegisterAction<pair32_t, bit<32>, bit<8>>(pending_live) live_answer = {
        void apply(inout pair32_t v, out bit<8> rv) {
            rv = this.predicate(v.lo == meta.my_tag);
            if (v.lo == meta.my_tag) {
                v.hi = meta.tick;
            }
        }
    };

    RegisterAction<pair32_t, bit<32>, bit<8>>(pending_live) live_answer_last = {
        void apply(inout pair32_t v, out bit<8> rv) {
            rv = this.predicate(v.lo == meta.my_tag);
            if (v.lo == meta.my_tag) {
                v.hi = meta.tick + 32w0x80000000;   // half the clock away: over at once
            }
        }
    };

    RegisterAction<pair32_t, bit<32>, bit<1>>(pending_key) key_open = {
        void apply(inout pair32_t v) {
            v.hi = hdr.kv.chunk_key[63:32];
            v.lo = hdr.kv.chunk_key[31:0];
        }
    };

    RegisterAction<pair32_t, bit<32>, bit<1>>(pending_key) key_same = {
        void apply(inout pair32_t v, out bit<1> rv) {
            if (v.hi == hdr.kv.chunk_key[63:32] && v.lo == hdr.kv.chunk_key[31:0]) {
                rv = 1;
            } else {
                rv = 0;
            }
        }
    };

    RegisterAction<bit<32>, bit<32>, bit<1>>(pending_gen) gen_open = {
        void apply(inout bit<32> v) {
            v = hdr.kv.generation;
        }
    };

    RegisterAction<bit<32>, bit<32>, bit<1>>(pending_gen) gen_same = {
        void apply(inout bit<32> v, out bit<1> rv) {
            if (v == hdr.kv.generation) {
                rv = 1;
            } else {
                rv = 0;
            }
        }
    };

    // A response answers the slot when it asked for the current generation (0) or this one.
    RegisterAction<bit<32>, bit<32>, bit<1>>(pending_gen) gen_answers = {
        void apply(inout bit<32> v, out bit<1> rv) {
            if (v == 0 || v == hdr.kv.generation) {
                rv = 1;
            } else {
                rv = 0;
            }
        }
    };

    RegisterAction<waiterMask_t, bit<32>, waiterMask_t>(pending_waiters) waiters_open = {
        void apply(inout waiterMask_t v, out waiterMask_t waiting) {
            waiting = v;
            v = meta.me;
        }
    };

    RegisterAction<waiterMask_t, bit<32>, waiterMask_t>(pending_waiters) waiters_join = {
        void apply(inout waiterMask_t v) {
            v = v | meta.me;
        }
    };

    RegisterAction<waiterMask_t, bit<32>, waiterMask_t>(pending_waiters) waiters_read = {
        void apply(inout waiterMask_t v, out waiterMask_t waiting) {
            waiting = v;
        }
    };

    RegisterAction<waiterMask_t, bit<32>, waiterMask_t>(pending_waiters) waiters_take = {
        void apply(inout waiterMask_t v, out waiterMask_t waiting) {
            waiting = v;
            v = 0;
        }
    };

    // The slot clock: now >> k, k the smallest that makes 16 ticks at least the timeout (from
    // the timeout's highest set bit: entry b matches bit b set and every bit above it clear).
    action tick_0() { meta.tick = meta.now >> 0; }
    action tick_1() { meta.tick = meta.now >> 1; }
    action tick_2() { meta.tick = meta.now >> 2; }
    action tick_3() { meta.tick = meta.now >> 3; }
    action tick_4() { meta.tick = meta.now >> 4; }
    action tick_5() { meta.tick = meta.now >> 5; }
    action tick_6() { meta.tick = meta.now >> 6; }
    action tick_7() { meta.tick = meta.now >> 7; }
    action tick_8() { meta.tick = meta.now >> 8; }
    action tick_9() { meta.tick = meta.now >> 9; }
    action tick_10() { meta.tick = meta.now >> 10; }
    action tick_11() { meta.tick = meta.now >> 11; }
    action tick_12() { meta.tick = meta.now >> 12; }
    action tick_13() { meta.tick = meta.now >> 13; }
    action tick_14() { meta.tick = meta.now >> 14; }
    action tick_15() { meta.tick = meta.now >> 15; }
    action tick_16() { meta.tick = meta.now >> 16; }
    action tick_17() { meta.tick = meta.now >> 17; }
    action tick_18() { meta.tick = meta.now >> 18; }
    action tick_19() { meta.tick = meta.now >> 19; }
    action tick_20() { meta.tick = meta.now >> 20; }
    action tick_21() { meta.tick = meta.now >> 21; }
    action tick_22() { meta.tick = meta.now >> 22; }
    action tick_23() { meta.tick = meta.now >> 23; }
    action tick_24() { meta.tick = meta.now >> 24; }
    action tick_25() { meta.tick = meta.now >> 25; }
    action tick_26() { meta.tick = meta.now >> 26; }
    action tick_27() { meta.tick = meta.now >> 27; }
    action tick_28() { meta.tick = meta.now >> 28; }

    @hidden
    table tick_shift {
        key = { pending_timeout: ternary; }
        actions = {
            tick_0; tick_1; tick_2; tick_3; tick_4; tick_5; tick_6; tick_7;
            tick_8; tick_9; tick_10; tick_11; tick_12; tick_13; tick_14; tick_15;
            tick_16; tick_17; tick_18; tick_19; tick_20; tick_21; tick_22; tick_23;
            tick_24; tick_25; tick_26; tick_27; tick_28;
        }
        size = 32;
        const entries = {
            (32w1 << 31) &&& ~((32w1 << 31) - 1) : tick_28();
            (32w1 << 30) &&& ~((32w1 << 30) - 1) : tick_27();
            (32w1 << 29) &&& ~((32w1 << 29) - 1) : tick_26();
            (32w1 << 28) &&& ~((32w1 << 28) - 1) : tick_25();
            (32w1 << 27) &&& ~((32w1 << 27) - 1) : tick_24();
            (32w1 << 26) &&& ~((32w1 << 26) - 1) : tick_23();
            (32w1 << 25) &&& ~((32w1 << 25) - 1) : tick_22();
            (32w1 << 24) &&& ~((32w1 << 24) - 1) : tick_21();
            (32w1 << 23) &&& ~((32w1 << 23) - 1) : tick_20();
            (32w1 << 22) &&& ~((32w1 << 22) - 1) : tick_19();
            (32w1 << 21) &&& ~((32w1 << 21) - 1) : tick_18();
            (32w1 << 20) &&& ~((32w1 << 20) - 1) : tick_17();
            (32w1 << 19) &&& ~((32w1 << 19) - 1) : tick_16();
            (32w1 << 18) &&& ~((32w1 << 18) - 1) : tick_15();
            (32w1 << 17) &&& ~((32w1 << 17) - 1) : tick_14();
            (32w1 << 16) &&& ~((32w1 << 16) - 1) : tick_13();
            (32w1 << 15) &&& ~((32w1 << 15) - 1) : tick_12();
            (32w1 << 14) &&& ~((32w1 << 14) - 1) : tick_11();
            (32w1 << 13) &&& ~((32w1 << 13) - 1) : tick_10();
            (32w1 << 12) &&& ~((32w1 << 12) - 1) : tick_9();
            (32w1 << 11) &&& ~((32w1 << 11) - 1) : tick_8();
            (32w1 << 10) &&& ~((32w1 << 10) - 1) : tick_7();
            (32w1 << 9) &&& ~((32w1 << 9) - 1) : tick_6();
            (32w1 << 8) &&& ~((32w1 << 8) - 1) : tick_5();
            (32w1 << 7) &&& ~((32w1 << 7) - 1) : tick_4();
            (32w1 << 6) &&& ~((32w1 << 6) - 1) : tick_3();
            (32w1 << 5) &&& ~((32w1 << 5) - 1) : tick_2();
            (32w1 << 4) &&& ~((32w1 << 4) - 1) : tick_1();
            (32w1 << 3) &&& ~((32w1 << 3) - 1) : tick_0();
            (32w1 << 2) &&& ~((32w1 << 2) - 1) : tick_0();
            (32w1 << 1) &&& ~((32w1 << 1) - 1) : tick_0();
            (32w1 << 0) &&& ~((32w1 << 0) - 1) : tick_0();
        }
        default_action = tick_0();
    }

    // The controller's microseconds / 64 (no divider: a slice), in global_tstamp[47:16]'s
    // 65.536 us units: 2.4% longer.
    action set_pending_timeout(bit<32> timeout_us) {
        pending_timeout = (bit<32>)timeout_us[31:6];
    }

    table coalesce_config {
        actions = { set_pending_timeout; }
        size = 1;
        default_action = set_pending_timeout(DEFAULT_PENDING_TIMEOUT_US);
    }

    action set_waiter_id(waiterId_t waiter_id) {
        meta.has_waiter = 1;
        meta.waiter_id = waiter_id;
    }

    table waiter_lookup {
        key = { meta.waiter_addr: exact; }
        actions = { set_waiter_id; NoAction; }
        size = MAX_WAITERS;
        default_action = NoAction();
    }

    action waiter_bit(waiterMask_t me, bit<32> owner) {
        meta.me = me;
        meta.my_tag = owner;
    }

    @hidden
    action no_waiter_bit() {
        meta.has_waiter = 0;   // an id past MAX_WAITERS cannot wait
    }

    // Waiter id -> 1 << id, and the owner part of its tag, {1, 00, id:8, 21w0}; an id with no
    // bit (>= MAX_WAITERS) misses and cannot wait.
    @hidden
    table waiter_bits {
        key = { meta.waiter_id: exact; }
        actions = { waiter_bit; no_waiter_bit; }
        const default_action = no_waiter_bit();
        const entries = {
            0: waiter_bit(32w0x1, 32w0x80000000);
            1: waiter_bit(32w0x2, 32w0x80200000);
            2: waiter_bit(32w0x4, 32w0x80400000);
            3: waiter_bit(32w0x8, 32w0x80600000);
            4: waiter_bit(32w0x10, 32w0x80800000);
            5: waiter_bit(32w0x20, 32w0x80a00000);
            6: waiter_bit(32w0x40, 32w0x80c00000);
            7: waiter_bit(32w0x80, 32w0x80e00000);
            8: waiter_bit(32w0x100, 32w0x81000000);
            9: waiter_bit(32w0x200, 32w0x81200000);
            10: waiter_bit(32w0x400, 32w0x81400000);
            11: waiter_bit(32w0x800, 32w0x81600000);
            12: waiter_bit(32w0x1000, 32w0x81800000);
            13: waiter_bit(32w0x2000, 32w0x81a00000);
            14: waiter_bit(32w0x4000, 32w0x81c00000);
            15: waiter_bit(32w0x8000, 32w0x81e00000);
            16: waiter_bit(32w0x10000, 32w0x82000000);
            17: waiter_bit(32w0x20000, 32w0x82200000);
            18: waiter_bit(32w0x40000, 32w0x82400000);
            19: waiter_bit(32w0x80000, 32w0x82600000);
            20: waiter_bit(32w0x100000, 32w0x82800000);
            21: waiter_bit(32w0x200000, 32w0x82a00000);
            22: waiter_bit(32w0x400000, 32w0x82c00000);
            23: waiter_bit(32w0x800000, 32w0x82e00000);
            24: waiter_bit(32w0x1000000, 32w0x83000000);
            25: waiter_bit(32w0x2000000, 32w0x83200000);
            26: waiter_bit(32w0x4000000, 32w0x83400000);
            27: waiter_bit(32w0x8000000, 32w0x83600000);
            28: waiter_bit(32w0x10000000, 32w0x83800000);
            29: waiter_bit(32w0x20000000, 32w0x83a00000);
            30: waiter_bit(32w0x40000000, 32w0x83c00000);
            31: waiter_bit(32w0x80000000, 32w0x83e00000);
        }
    }

    action release_to(MulticastGroupId_t grp) {
        ig_tm_md.mcast_grp_a = grp;
    }

    // Bitmap -> the group of its highest waiter id: entry t matches bit t set, bits above clear.
    @hidden
    table release_group {
        key = { mask: ternary; }
        actions = { release_to; NoAction; }
        default_action = NoAction();
        const entries = {
            32w0x00000001 &&& 32w0xffffffff: release_to(COALESCE_MCAST_GRP + 0);
            32w0x00000002 &&& 32w0xfffffffe: release_to(COALESCE_MCAST_GRP + 1);
            32w0x00000004 &&& 32w0xfffffffc: release_to(COALESCE_MCAST_GRP + 2);
            32w0x00000008 &&& 32w0xfffffff8: release_to(COALESCE_MCAST_GRP + 3);
            32w0x00000010 &&& 32w0xfffffff0: release_to(COALESCE_MCAST_GRP + 4);
            32w0x00000020 &&& 32w0xffffffe0: release_to(COALESCE_MCAST_GRP + 5);
            32w0x00000040 &&& 32w0xffffffc0: release_to(COALESCE_MCAST_GRP + 6);
            32w0x00000080 &&& 32w0xffffff80: release_to(COALESCE_MCAST_GRP + 7);
            32w0x00000100 &&& 32w0xffffff00: release_to(COALESCE_MCAST_GRP + 8);
            32w0x00000200 &&& 32w0xfffffe00: release_to(COALESCE_MCAST_GRP + 9);
            32w0x00000400 &&& 32w0xfffffc00: release_to(COALESCE_MCAST_GRP + 10);
            32w0x00000800 &&& 32w0xfffff800: release_to(COALESCE_MCAST_GRP + 11);
            32w0x00001000 &&& 32w0xfffff000: release_to(COALESCE_MCAST_GRP + 12);
            32w0x00002000 &&& 32w0xffffe000: release_to(COALESCE_MCAST_GRP + 13);
            32w0x00004000 &&& 32w0xffffc000: release_to(COALESCE_MCAST_GRP + 14);
            32w0x00008000 &&& 32w0xffff8000: release_to(COALESCE_MCAST_GRP + 15);
            32w0x00010000 &&& 32w0xffff0000: release_to(COALESCE_MCAST_GRP + 16);
            32w0x00020000 &&& 32w0xfffe0000: release_to(COALESCE_MCAST_GRP + 17);
            32w0x00040000 &&& 32w0xfffc0000: release_to(COALESCE_MCAST_GRP + 18);
            32w0x00080000 &&& 32w0xfff80000: release_to(COALESCE_MCAST_GRP + 19);
            32w0x00100000 &&& 32w0xfff00000: release_to(COALESCE_MCAST_GRP + 20);
            32w0x00200000 &&& 32w0xffe00000: release_to(COALESCE_MCAST_GRP + 21);
            32w0x00400000 &&& 32w0xffc00000: release_to(COALESCE_MCAST_GRP + 22);
            32w0x00800000 &&& 32w0xff800000: release_to(COALESCE_MCAST_GRP + 23);
            32w0x01000000 &&& 32w0xff000000: release_to(COALESCE_MCAST_GRP + 24);
            32w0x02000000 &&& 32w0xfe000000: release_to(COALESCE_MCAST_GRP + 25);
            32w0x04000000 &&& 32w0xfc000000: release_to(COALESCE_MCAST_GRP + 26);
            32w0x08000000 &&& 32w0xf8000000: release_to(COALESCE_MCAST_GRP + 27);
            32w0x10000000 &&& 32w0xf0000000: release_to(COALESCE_MCAST_GRP + 28);
            32w0x20000000 &&& 32w0xe0000000: release_to(COALESCE_MCAST_GRP + 29);
            32w0x40000000 &&& 32w0xc0000000: release_to(COALESCE_MCAST_GRP + 30);
            32w0x80000000 &&& 32w0x80000000: release_to(COALESCE_MCAST_GRP + 31);
        }
    }

    @hidden
    action co_kind_is(bit<8> kind) {
        co_kind = kind;
    }

    // co_finish's outcomes (decide_coalesce.p4): every range GET with a verdict is counted.
    @hidden
    action co_count(bit<32> stat) {
        meta.count_coalesce = 1;
        meta.coalesce_stat = stat;
    }

    @hidden
    action co_opened() {
        meta.count_coalesce = 1;
        meta.coalesce_stat = CO_FIRST;   // CO_EXPIRED_REUSED when the slot had waiters
        hdr.bridge.flags = BRIDGE_RECORD;
    }

    @hidden
    action co_owner() {
        meta.count_coalesce = 1;
        meta.coalesce_stat = CO_OWNER;
        hdr.bridge.flags = BRIDGE_RECORD;
    }

    @hidden
    action co_absorbed() {
        meta.count_coalesce = 1;
        meta.coalesce_stat = CO_ABSORBED;
        hdr.bridge.flags = BRIDGE_RECORD | BRIDGE_ABSORB;
    }

    @hidden
    action co_reused() {
        meta.coalesce_stat = CO_EXPIRED_REUSED;
    }

    @hidden
    action release() {
        hdr.bridge.flags = BRIDGE_RELEASE;
        hdr.bridge.release_mask = mask;
        hdr.bridge.release_dst = meta.waiter_id[7:0];
        meta.coalesce_stat = CO_RELEASE;
        meta.count_coalesce = 1;
    }

#include "decide_coalesce.p4"

    // Tofino 1 has no long branches (a table after an `if` waits for every table inside it),
    // so each `if` below holds one stage: the four registers in their order, each access
    // chosen by a gateway on co_kind and what the register before answered, and the
    // outcome by co_finish beside pending_waiters.
    apply {
        coalesce_config.apply();
        if (hdr.kv.opcode == OP_GET) {
            meta.waiter_addr = hdr.ipv4.srcAddr;
        } else {
            meta.waiter_addr = hdr.ipv4.dstAddr;
        }
        waiter_lookup.apply();
        waiter_bits.apply();   // has_waiter = 0 for an id with no bit

        bit<32> crc = pending_hash.get({ hdr.kv.chunk_key });
        bit<32> idx = (bit<32>)crc[10:0];   // mod PENDING_SLOTS (2048)
        bridge_slot();
        tag_bits();
        // 65.536 us units; pending_timeout holds the timeout in them already (set_pending_timeout).
        meta.now = ig_prsr_md.global_tstamp[47:16];
        tick_shift.apply();
        next_fragment();
        last_fragment();
        if (hdr.kv.isValid()) {
            co_kind_check.apply();
        }

        // pending_live: a range GET once it has a GET's verdict (get_ok), an answer once it
        // has the whole verdict, from a writer.
        bool answer_ok = meta.drop_reason == DROP_NONE && meta.is_writer == 1;
        if (meta.get_ok == 1 && co_kind == CO_K_GET) {
            pred = live_get.execute(idx);
        } else if (meta.get_ok == 1 && co_kind == CO_K_PEEK) {
            pred = live_peek.execute(idx);
        } else if (answer_ok && co_kind == CO_K_ANSWER) {
            pred = live_answer.execute(idx);
        } else if (answer_ok && co_kind == CO_K_ANSWER_LAST) {
            pred = live_answer_last.execute(idx);
        }

        // pending_key and pending_gen: written by the GET that opens the slot, compared by the
        // others (both read only, so both run) and by an answer to the slot's owner (an
        // answer's PRED_OVER is "mine": live_answer tests one condition).
        bool over = pred == PRED_OVER || pred == PRED_OVER_MINE;
        bool live = pred == PRED_NEITHER || pred == PRED_MINE;
        bool a_get = co_kind == CO_K_GET || co_kind == CO_K_PEEK;
        bool an_answer = co_kind == CO_K_ANSWER || co_kind == CO_K_ANSWER_LAST;
        if (co_kind == CO_K_GET && over) {
            key_open.execute(idx);
            gen_open.execute(idx);
        } else if (a_get && live) {
            same_key = key_same.execute(idx);
            same_gen = gen_same.execute(idx);
        } else if (an_answer && pred == PRED_OVER) {
            same_key = key_same.execute(idx);
            answers = gen_answers.execute(idx);
        }

        co_finish.apply();
        // pending_waiters: {me} for the GET that opened the slot, me added for a duplicate, and
        // an answer to the owner reads them (or takes them, the last).
        if (co_kind == CO_K_GET && over) {
            before = waiters_open.execute(idx);
        } else if (co_kind == CO_K_GET && pred == PRED_NEITHER && same_key == 1 && same_gen == 1) {
            waiters_join.execute(idx);
        } else if (co_kind == CO_K_ANSWER_LAST && pred == PRED_OVER && same_key == 1 && answers == 1) {
            mask = waiters_take.execute(idx);
        } else if (co_kind == CO_K_ANSWER && pred == PRED_OVER && same_key == 1 && answers == 1) {
            mask = waiters_read.execute(idx);
        }

        // A reopened slot that had waiters (only waiters_open sets before), or an answer
        // released when someone other than the addressee waits (only an answer sets mask): one
        // chain, as both write the statistic, so that neither waits for the other.  The group
        // of the highest waiter replicates it.
        if (before != 0) {
            co_reused();
        } else if (mask != 0 && mask != meta.me) {
            release();
            release_group.apply();
        }
        if (meta.count_coalesce == 1) {
            coalesce_stats.count(meta.coalesce_stat);
        }
    }
}

/*************************************************************************
 ***********************  C O A L E S C E   (egress)  ********************
 *************************************************************************/

control CoalesceEgress(inout headers_t hdr,
                       in egress_intrinsic_metadata_t standard_metadata,
                       inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {

    Register<bit<32>, bit<16>>(PENDING_REPLIES) pending_reply_id;
    Register<bit<16>, bit<16>>(PENDING_REPLIES) pending_reply_port;
    // pending_idx * MAX_WAITERS + waiter, i.e. {pending_idx[10:0], waiter[4:0]}: an identity hash
    // builds the index from the two fields (the idiomatic Tofino way to concatenate an index).
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) replica_cell;
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) record_cell;
    Counter<bit<32>, bit<32>>(MAX_WAITERS, CounterType_t.PACKETS) waiter_replicas;
    Counter<bit<32>, bit<32>>(EGRESS_STATS, CounterType_t.PACKETS) egress_stats;

    RegisterAction<bit<32>, bit<16>, bit<32>>(pending_reply_id) reply_id_read = {
        void apply(inout bit<32> v, out bit<32> rv) { rv = v; }
    };
    RegisterAction<bit<32>, bit<16>, bit<32>>(pending_reply_id) reply_id_write = {
        void apply(inout bit<32> v) { v = hdr.kv.request_id; }
    };
    RegisterAction<bit<16>, bit<16>, bit<16>>(pending_reply_port) reply_port_read = {
        void apply(inout bit<16> v, out bit<16> rv) { rv = v; }
    };
    RegisterAction<bit<16>, bit<16>, bit<16>>(pending_reply_port) reply_port_write = {
        void apply(inout bit<16> v) { v = hdr.udp.srcPort; }
    };

    waiterMask_t rid_bit = 0;
    waiterMask_t waiting;   // release_mask & rid_bit, in an action: a gateway ANDs with constants only

    action prune_bits() {
        waiting = hdr.bridge.release_mask & rid_bit;
    }

    action rewrite_waiter(ip4Addr_t addr, macAddr_t mac) {
        hdr.ipv4.dstAddr = addr;
        hdr.ethernet.dstAddr = mac;
    }

    table waiter_egress {
        key = { standard_metadata.egress_rid: exact; }
        actions = { rewrite_waiter; NoAction; }
        size = MAX_WAITERS;
        default_action = NoAction();
    }

    action set_rid_bit(waiterMask_t b) {
        rid_bit = b;
    }

    // Replica id -> 1 << rid (0 for an rid with no bit).
    @hidden
    table rid_bits {
        key = { standard_metadata.egress_rid: exact; }
        actions = { set_rid_bit; NoAction; }
        default_action = NoAction();
        const entries = {
            0: set_rid_bit(32w0x1);
            1: set_rid_bit(32w0x2);
            2: set_rid_bit(32w0x4);
            3: set_rid_bit(32w0x8);
            4: set_rid_bit(32w0x10);
            5: set_rid_bit(32w0x20);
            6: set_rid_bit(32w0x40);
            7: set_rid_bit(32w0x80);
            8: set_rid_bit(32w0x100);
            9: set_rid_bit(32w0x200);
            10: set_rid_bit(32w0x400);
            11: set_rid_bit(32w0x800);
            12: set_rid_bit(32w0x1000);
            13: set_rid_bit(32w0x2000);
            14: set_rid_bit(32w0x4000);
            15: set_rid_bit(32w0x8000);
            16: set_rid_bit(32w0x10000);
            17: set_rid_bit(32w0x20000);
            18: set_rid_bit(32w0x40000);
            19: set_rid_bit(32w0x80000);
            20: set_rid_bit(32w0x100000);
            21: set_rid_bit(32w0x200000);
            22: set_rid_bit(32w0x400000);
            23: set_rid_bit(32w0x800000);
            24: set_rid_bit(32w0x1000000);
            25: set_rid_bit(32w0x2000000);
            26: set_rid_bit(32w0x4000000);
            27: set_rid_bit(32w0x8000000);
            28: set_rid_bit(32w0x10000000);
            29: set_rid_bit(32w0x20000000);
            30: set_rid_bit(32w0x40000000);
            31: set_rid_bit(32w0x80000000);
        }
    }

    apply {
        bit<32> stat = EG_REPLY_RECORDED;
        bool count = false;
        if (hdr.bridge.flags == BRIDGE_RELEASE) {
            rid_bits.apply();
            bit<16> cell = replica_cell.get({ hdr.bridge.pending_idx[10:0], standard_metadata.egress_rid[4:0] });
            count = true;
            prune_bits();
            if (waiting == 0) {
                eg_dprsr_md.drop_ctl = 1;
                stat = EG_REPLICA_PRUNED;
            } else if (!waiter_egress.apply().hit) {
                eg_dprsr_md.drop_ctl = 1;
                stat = EG_NO_WAITER_ENTRY;
            } else {
                if (standard_metadata.egress_rid != (bit<16>)hdr.bridge.release_dst) {
                    // Another waiter's copy: its own request id and port.
                    hdr.kv.request_id = reply_id_read.execute(cell);
                    hdr.udp.dstPort = reply_port_read.execute(cell);
                    hdr.kv.flags = hdr.kv.flags | FLAG_COALESCED;
                    hdr.udp.checksum = 0;
                }
                waiter_replicas.count((bit<32>)standard_metadata.egress_rid);
                stat = EG_REPLICA_SENT;
            }
        } else if ((hdr.bridge.flags & BRIDGE_RECORD) != 0) {
            bit<16> cell = record_cell.get({ hdr.bridge.pending_idx[10:0], hdr.bridge.waiter_id[4:0] });
            reply_id_write.execute(cell);
            reply_port_write.execute(cell);
            count = true;
            stat = EG_REPLY_RECORDED;
            if ((hdr.bridge.flags & BRIDGE_ABSORB) != 0) {
                eg_dprsr_md.drop_ctl = 1;
            }
        }
        if (count) {
            egress_stats.count(stat);
        }
    }
}

#endif  // KVPOOL_TNA_COALESCE_P4
