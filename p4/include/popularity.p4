/* -*- P4_16 -*- */
/*
 * Popularity: which chunks outside the pool are fetched often enough to be admitted.
 *
 * What is counted: a GET for a chunk that is NOT in pool_lookup, whose range starts at
 * fragment 0 and that is not a RETRANSMIT, i.e. one count per fetch of a whole chunk,
 * not one per fragment.  Absorbed (coalesced) GETs count too: they are demand.
 *
 * Count-min sketch: 3 rows of SKETCH_COLS bit<32> cells, cell = {tag:8, count:24}.
 *   row 0 index = crc32({chunk_key})              mod SKETCH_COLS
 *   row 1 index = crc16({chunk_key})              mod SKETCH_COLS
 *   row 2 index = crc32({chunk_key, SKETCH_SALT}) mod SKETCH_COLS
 * (BMv2 hash: base + (hash(big-endian bytes of the concatenated fields) % max); crc32 is
 * zlib's CRC-32, crc16 is CRC-16/ARC; every input here is whole bytes.)
 * The estimate is the minimum of the three incremented counts (saturating at 2^24-1).
 *
 * Epochs instead of resets: the controller cannot write registers over BMv2's P4Runtime,
 * so it ages the sketch by changing `epoch` in popularity_config's default action.  Each
 * cell and Bloom cell stores the tag {1, epoch} it was last written in; a cell with
 * another tag reads as zero / unset, so a new epoch starts from a clean sketch lazily.
 * The leading 1 keeps the tag non-zero, so never-written (zero) registers are unset too.
 * (A cell untouched for exactly 128 epochs would alias; the controller's epochs are far
 * fewer.)
 *
 * Report: when the estimate reaches `threshold` and the 2-row Bloom filter does not yet
 * hold the chunk for this epoch, both Bloom cells are set and a hot_chunk_t digest
 * {chunk_key, estimate, epoch} goes to the controller.  Bloom indices:
 *   crc32({BLOOM_SALT, chunk_key}) and crc16({BLOOM_SALT, chunk_key}) mod BLOOM_BITS.
 */
#ifndef KVPOOL_POPULARITY_P4
#define KVPOOL_POPULARITY_P4

const bit<32> SKETCH_SALT = 0x9E3779B9;
const bit<32> BLOOM_SALT  = 0x85EBCA6B;

/*************************************************************************
 ***********************  P O P U L A R I T Y  ***************************
 *************************************************************************/

// The count a sketch cell holds in the current epoch, plus one, saturating.
bit<24> next_count(in bit<32> cell, in epochTag_t tag) {
    bit<24> count = 0;
    if (cell[31:24] == tag) {
        count = cell[23:0];
    }
    if (count != SKETCH_COUNT_MAX) {
        count = count + 1;
    }
    return count;
}

control Popularity(inout headers_t hdr,
                   inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {

    register<bit<32>>(SKETCH_COLS)   sketch_row0;
    register<bit<32>>(SKETCH_COLS)   sketch_row1;
    register<bit<32>>(SKETCH_COLS)   sketch_row2;
    register<epochTag_t>(BLOOM_BITS) bloom_row0;
    register<epochTag_t>(BLOOM_BITS) bloom_row1;
    counter(POPULARITY_STATS, CounterType.packets) popularity_stats;

    bit<32> hot_threshold;
    epoch_t cur_epoch;

    action set_popularity(bit<32> threshold, epoch_t epoch) {
        hot_threshold = threshold;
        cur_epoch = epoch;
    }

    // Keyless: the controller sets threshold and epoch by modifying the default action.
    table popularity_config {
        actions = { set_popularity; }
        size = 1;
        default_action = set_popularity(DEFAULT_HOT_THRESHOLD, DEFAULT_SKETCH_EPOCH);
    }

    apply {
        if (meta.pool_found == 0 && hdr.kv.frag_index == 0
                && (hdr.kv.flags & FLAG_RETRANSMIT) == 0) {
            popularity_config.apply();
            epochTag_t tag = 1w1 ++ cur_epoch;

            bit<32> i0;
            bit<32> i1;
            bit<32> i2;
            hash(i0, HashAlgorithm.crc32, (bit<32>)0, { hdr.kv.chunk_key },
                 (bit<32>)SKETCH_COLS);
            hash(i1, HashAlgorithm.crc16, (bit<32>)0, { hdr.kv.chunk_key },
                 (bit<32>)SKETCH_COLS);
            hash(i2, HashAlgorithm.crc32, (bit<32>)0, { hdr.kv.chunk_key, SKETCH_SALT },
                 (bit<32>)SKETCH_COLS);

            bit<32> c0;
            bit<32> c1;
            bit<32> c2;
            sketch_row0.read(c0, i0);
            sketch_row1.read(c1, i1);
            sketch_row2.read(c2, i2);
            bit<24> n0 = next_count(c0, tag);
            bit<24> n1 = next_count(c1, tag);
            bit<24> n2 = next_count(c2, tag);
            sketch_row0.write(i0, tag ++ n0);
            sketch_row1.write(i1, tag ++ n1);
            sketch_row2.write(i2, tag ++ n2);
            popularity_stats.count(POP_COUNTED);

            bit<24> estimate = n0;
            if (n1 < estimate) {
                estimate = n1;
            }
            if (n2 < estimate) {
                estimate = n2;
            }

            if ((bit<32>)estimate >= hot_threshold) {
                bit<32> b0;
                bit<32> b1;
                hash(b0, HashAlgorithm.crc32, (bit<32>)0, { BLOOM_SALT, hdr.kv.chunk_key },
                     (bit<32>)BLOOM_BITS);
                hash(b1, HashAlgorithm.crc16, (bit<32>)0, { BLOOM_SALT, hdr.kv.chunk_key },
                     (bit<32>)BLOOM_BITS);
                epochTag_t seen0;
                epochTag_t seen1;
                bloom_row0.read(seen0, b0);
                bloom_row1.read(seen1, b1);
                if (seen0 == tag && seen1 == tag) {
                    popularity_stats.count(POP_SUPPRESSED);
                } else {
                    bloom_row0.write(b0, tag);
                    bloom_row1.write(b1, tag);
                    digest<hot_chunk_t>(DIGEST_RECEIVER,
                                        { hdr.kv.chunk_key, (bit<32>)estimate, cur_epoch });
                    popularity_stats.count(POP_REPORTED);
                }
            }
        }
    }
}

#endif  // KVPOOL_POPULARITY_P4
