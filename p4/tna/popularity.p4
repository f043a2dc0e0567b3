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
    // estimate >= hot_threshold as max(estimate, hot_threshold) == estimate: a gateway does not
    // compare two fields, so the max and its XOR with the estimate are actions of their own.
    // The estimate is computed in meta.estimate (the digest's field) and the XOR overwrites
    // the max: the fewer 32-bit values in this chain, the likelier one container group holds it.
    bit<32> short_of;   // max(estimate, threshold), then its XOR with the estimate: 0 when reached

    action reach_max() {
        short_of = max(meta.estimate, hot_threshold);
    }

    action reach_cmp() {
        short_of = short_of ^ meta.estimate;
    }
    epoch_t cur_epoch;

    SKETCH_ROW(0)
    SKETCH_ROW(1)
    SKETCH_ROW(2)
    BLOOM_ROW(0)
    BLOOM_ROW(1)

    Hash<bit<32>>(HashAlgorithm_t.CRC32) row0_hash;
    Hash<bit<16>>(HashAlgorithm_t.CRC16) row1_hash;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) row2_hash;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) bloom0_hash;
    Hash<bit<16>>(HashAlgorithm_t.CRC16) bloom1_hash;

    action set_popularity(bit<32> threshold, epoch_t epoch) {
        hot_threshold = threshold;
        cur_epoch = epoch;
    }

    table popularity_config {
        actions = { set_popularity; }
        size = 1;
        default_action = set_popularity(DEFAULT_HOT_THRESHOLD, DEFAULT_SKETCH_EPOCH);
    }

    // One hash output per action: an action takes at most 32 bits from hash units.
    bit<32> i0;
    bit<16> i1;
    bit<32> i2;
    bit<32> b0;
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

    apply {
        if (meta.pool_found == 0 && hdr.kv.frag_index == 0
                && (hdr.kv.flags & FLAG_RETRANSMIT) == 0) {
            popularity_config.apply();
            meta.tag = 1w1 ++ cur_epoch;
            meta.tag32 = (bit<32>)meta.tag;

            // mod SKETCH_COLS and mod BLOOM_BITS (both 4096): the low 12 bits.
            row0_index();
            row1_index();
            row2_index();
            bit<32> n0 = sketch_row0_count.execute((bit<32>)i0[11:0]);
            bit<32> n1 = sketch_row1_count.execute((bit<32>)i1[11:0]);
            bit<32> n2 = sketch_row2_count.execute((bit<32>)i2[11:0]);
            bit<32> n12 = min(n1, n2);
            meta.estimate = min(n0, n12);
            reach_max();
            reach_cmp();

            meta.count_popularity = 1;
            meta.popularity_stat = POP_COUNTED;
            if (short_of == 0) {
                bloom0_index();
                bloom1_index();
                bit<1> seen0 = bloom_row0_set.execute((bit<32>)b0[11:0]);
                bit<1> seen1 = bloom_row1_set.execute((bit<32>)b1[11:0]);
                if (seen0 == 1 && seen1 == 1) {
                    meta.popularity_stat = POP_SUPPRESSED;
                } else {
                    meta.epoch = cur_epoch;
                    ig_dprsr_md.digest_type = DIGEST_HOT_CHUNK;
                    meta.popularity_stat = POP_REPORTED;
                }
            }
            if (meta.count_popularity == 1) {
                popularity_stats.count(meta.popularity_stat);
            }
        }
    }
}

#endif  // KVPOOL_TNA_POPULARITY_P4
