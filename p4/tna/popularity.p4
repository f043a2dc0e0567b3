/* -*- P4_16 -*- */
/*
 * Popularity: count-min sketch, Bloom filter and hot_chunk_t digest, as
 * ../include/popularity.p4: same rows, hash inputs, salts, epochs and threshold.
 *
 * Tofino differences:
 * - A sketch cell is a pair {tag, count} (64 bits; {tag:8, count:24} in one 32-bit cell on
 *   BMv2): a stateful ALU compares whole halves, so the tag cannot share a word with the
 *   count.  The count still saturates at SKETCH_COUNT_MAX.
 * - Each Bloom row is written unconditionally with the current tag by the same access that
 *   reads it (one access per register per packet); writing the tag a cell already holds
 *   changes nothing, so the filter ends as v1model's does.
 * - A packet counts once per counter: POP_COUNTED counts the GETs below the threshold, so
 *   v1model's COUNTED is COUNTED + REPORTED + SUPPRESSED here.
 * - Hash indices are the low bits of Tofino's CRC-32 and CRC-16, taken to be the CRCs
 *   BMv2 computes (zlib CRC-32, CRC-16/ARC); checking that needs a Tofino model.
 */
#ifndef KVPOOL_TNA_POPULARITY_P4
#define KVPOOL_TNA_POPULARITY_P4

const bit<32> SKETCH_SALT = 0x9E3779B9;
const bit<32> BLOOM_SALT  = 0x85EBCA6B;

// One count-min row: the count this cell holds in the current epoch, plus one, saturating.
#define SKETCH_ROW(r)                                                                    \
    Register<pair32_t, bit<32>>(SKETCH_COLS) sketch_row##r;                              \
    RegisterAction<pair32_t, bit<32>, bit<32>>(sketch_row##r) sketch_row##r##_count = {  \
        void apply(inout pair32_t v, out bit<32> count) {                                \
            if (v.hi == meta.tag32) {                                                    \
                if (v.lo != (bit<32>)SKETCH_COUNT_MAX) {                                 \
                    v.lo = v.lo + 1;                                                     \
                }                                                                        \
            } else {                                                                     \
                v.hi = meta.tag32;                                                       \
                v.lo = 1;                                                                \
            }                                                                            \
            count = v.lo;                                                                \
        }                                                                                \
    };

// One Bloom row: 1 when the cell already held the current tag; it holds it afterwards.
#define BLOOM_ROW(r)                                                                     \
    Register<epochTag_t, bit<32>>(BLOOM_BITS) bloom_row##r;                              \
    RegisterAction<epochTag_t, bit<32>, bit<1>>(bloom_row##r) bloom_row##r##_set = {     \
        void apply(inout epochTag_t v, out bit<1> seen) {                                \
            if (v == meta.tag) {                                                         \
                seen = 1;                                                                \
            } else {                                                                     \
                seen = 0;                                                                \
            }                                                                            \
            v = meta.tag;                                                                \
        }                                                                                \
    };

/*************************************************************************
 ***********************  P O P U L A R I T Y  ***************************
 *************************************************************************/

control Popularity(inout headers_t hdr,
                   inout ig_metadata_t meta,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {

    Counter<bit<32>, bit<32>>(POPULARITY_STATS, CounterType_t.PACKETS) popularity_stats;

    bit<32> hot_threshold;
    // estimate >= hot_threshold as "no row's count below it": each row's count minus the
    // threshold, negative (bit 31) when below, beside the min that makes the estimate, so
    // the Bloom filter waits two stages for the sketch, not four.  Counts stop at
    // SKETCH_COUNT_MAX (2^24 - 1) and the threshold is taken at most 2^24, so a difference
    // is negative exactly when the count is below.
    bit<32> d0;
    bit<32> d1;
    bit<32> d2;
    bit<32> n12;

    epoch_t cur_epoch;

    SKETCH_ROW(0)
    SKETCH_ROW(1)
    SKETCH_ROW(2)
    BLOOM_ROW(0)
    BLOOM_ROW(1)

    Hash<bit<16>>(HashAlgorithm_t.CRC32) row0_hash;
    Hash<bit<16>>(HashAlgorithm_t.CRC16) row1_hash;
    Hash<bit<16>>(HashAlgorithm_t.CRC32) row2_hash;
    Hash<bit<16>>(HashAlgorithm_t.CRC32) bloom0_hash;
    Hash<bit<16>>(HashAlgorithm_t.CRC16) bloom1_hash;

    action set_popularity(bit<32> threshold, epoch_t epoch) {
        hot_threshold = min(threshold, 32w0x1000000);   // a count never reaches more
        cur_epoch = epoch;
        meta.tag = 1w1 ++ epoch;
        meta.tag32 = (bit<32>)(1w1 ++ epoch);
    }

    table popularity_config {
        actions = { set_popularity; }
        size = 1;
        default_action = set_popularity(DEFAULT_HOT_THRESHOLD, DEFAULT_SKETCH_EPOCH);
    }

    // One hash output per action: an action takes at most 32 bits from hash units.  The
    // CRC-32 rows keep 16 bits of it (taken to be its low 16, of which the index is the low
    // 12 as on BMv2; checking that needs a Tofino model): 32-bit containers are the scarce ones.
    bit<16> i0;
    bit<16> i1;
    bit<16> i2;
    bit<16> b0;
    bit<16> b1;

    action row0_index() {
        i0 = row0_hash.get({ hdr.kv.chunk_key });
    }

    action row1_index() {
        i1 = row1_hash.get({ hdr.kv.chunk_key });
    }

    action row2_index() {
        i2 = row2_hash.get({ hdr.kv.chunk_key, SKETCH_SALT });
    }

    action bloom0_index() {
        b0 = bloom0_hash.get({ BLOOM_SALT, hdr.kv.chunk_key });
    }

    action bloom1_index() {
        b1 = bloom1_hash.get({ BLOOM_SALT, hdr.kv.chunk_key });
    }

    bit<1> pop_go = 0;    // pop_gate: counted in the sketch
    bit<1> reached = 0;   // hot_check: the estimate reached the threshold
    bit<32> n0 = 0;       // the rows' counts (pop_go only; the arithmetic on them runs anyway)
    bit<32> n1 = 0;
    bit<32> n2 = 0;
    bit<1> seen0 = 0;
    bit<1> seen1 = 0;

    @hidden
    action pop_counted() {
        pop_go = 1;
        meta.popularity_stat = POP_COUNTED;
    }

    // hot_check and bloom_check (decide_popularity.p4, scripts/tna_decisions.py): ternary tables
    // on the rows' signs and the Bloom rows' answers, not nested ifs (a table and a stage each).
    @hidden
    action hot_reached() {
        reached = 1;
    }

    @hidden
    action hot_seen() {
        meta.popularity_stat = POP_SUPPRESSED;
    }

    @hidden
    action hot_report() {
        meta.epoch = cur_epoch;
        meta.report_hot = 1;   // digested at the end of the ingress
        meta.popularity_stat = POP_REPORTED;
    }

#include "decide_popularity.p4"

    action below0() { d0 = n0 - hot_threshold; }
    action below1() { d1 = n1 - hot_threshold; }
    action below2() { d2 = n2 - hot_threshold; }

    // The configuration and the hash indices only read, so they run for every KV packet,
    // beside Safety; the registers wait for the GET's verdict (meta.get_ok), which Safety
    // knows before a DATA's.
    apply {
        popularity_config.apply();
        // mod SKETCH_COLS and mod BLOOM_BITS (both 4096): the low 12 bits.
        row0_index();
        row1_index();
        row2_index();
        bloom0_index();
        bloom1_index();
        // Each `if` holds one stage of tables (Tofino 1 has no long branches: a table after
        // an `if` waits for every table inside it), and what follows reads pop_go / reached.
        pop_gate.apply();   // pop_go: a GET the sketch counts
        if (pop_go == 1) {
            n0 = sketch_row0_count.execute((bit<32>)i0[11:0]);
            n1 = sketch_row1_count.execute((bit<32>)i1[11:0]);
            n2 = sketch_row2_count.execute((bit<32>)i2[11:0]);
        }
        below0();
        below1();
        below2();
        n12 = min(n1, n2);
        meta.estimate = min(n0, n12);
        hot_check.apply();   // reached: counted, and the estimate reached the threshold
        if (reached == 1) {
            seen0 = bloom_row0_set.execute((bit<32>)b0[11:0]);
            seen1 = bloom_row1_set.execute((bit<32>)b1[11:0]);
        }
        bloom_check.apply();
        if (pop_go == 1) {
            popularity_stats.count(meta.popularity_stat);
        }
    }
}

#endif  // KVPOOL_TNA_POPULARITY_P4
