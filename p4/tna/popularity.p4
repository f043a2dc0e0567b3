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

    action below0(bit<32> n) { d0 = n - hot_threshold; }
    action below1(bit<32> n) { d1 = n - hot_threshold; }
    action below2(bit<32> n) { d2 = n - hot_threshold; }

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
        // (two conditions: a gateway reads 4 bytes and 12 bits of PHV at most)
        bool counted = meta.get_ok == 1 && meta.from_fabric == 0 && meta.pool_found == 0;
        if (counted && hdr.kv.opcode == OP_GET) {
          if (hdr.kv.frag_index == 0 && (hdr.kv.flags & FLAG_RETRANSMIT) == 0) {
            bit<32> n0 = sketch_row0_count.execute((bit<32>)i0[11:0]);
            bit<32> n1 = sketch_row1_count.execute((bit<32>)i1[11:0]);
            bit<32> n2 = sketch_row2_count.execute((bit<32>)i2[11:0]);
            below0(n0);
            below1(n1);
            below2(n2);
            n12 = min(n1, n2);
            meta.estimate = min(n0, n12);

            meta.count_popularity = 1;
            meta.popularity_stat = POP_COUNTED;
            // (one sign bit per condition: "too complex" for a gateway otherwise)
            bool reached = false;
            if (d0[31:31] == 0) {
                if (d1[31:31] == 0) {
                    if (d2[31:31] == 0) {
                        reached = true;
                    }
                }
            }
            if (reached) {
                bit<1> seen0 = bloom_row0_set.execute((bit<32>)b0[11:0]);
                bit<1> seen1 = bloom_row1_set.execute((bit<32>)b1[11:0]);
                if (seen0 == 1 && seen1 == 1) {
                    meta.popularity_stat = POP_SUPPRESSED;
                } else {
                    meta.epoch = cur_epoch;
                    meta.report_hot = 1;   // digested at the end of the ingress
                    meta.popularity_stat = POP_REPORTED;
                }
            }
            if (meta.count_popularity == 1) {
                popularity_stats.count(meta.popularity_stat);
            }
          }
        }
    }
}

#endif  // KVPOOL_TNA_POPULARITY_P4
