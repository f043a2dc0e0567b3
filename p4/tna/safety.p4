/* -*- P4_16 -*- */
/*
 * Safety: the host-port source guard, header validation and the writers ACL, as
 * ../include/safety.p4 (same tables, actions, order of checks and drop reasons).
 *
 * Tofino differences: there is no multiplier, so x * 1408 is the sum of x's bytes'
 * products, from constant tables (products.p4); and the payload of a DATA is not parsed
 * in ingress, so a DATA shorter than its UDP length claims is not caught here
 * (DROP_PARSE_ERROR in v1model) but in the egress parser, and only for a packet the
 * egress pool writes (which then drops it).
 */
#ifndef KVPOOL_TNA_SAFETY_P4
#define KVPOOL_TNA_SAFETY_P4

/*************************************************************************
 ***********************  S A F E T Y  ***********************************
 *************************************************************************/

control Safety(inout headers_t hdr,
               inout ig_metadata_t meta,
               in ingress_intrinsic_metadata_t standard_metadata,
               in ingress_intrinsic_metadata_from_parser_t ig_prsr_md) {

    ip4Addr_t host_addr = 0;
    bit<1> guarded = 0;
    bit<32> spoof;   // srcAddr ^ the guarded host's address: not 0 when spoofed

    // x * 1408 for idx = frag_index and cnt = frag_count: the sum of its bytes' products,
    // read from constant tables (products.p4, generated from FRAG_PAYLOAD).  Tofino has no
    // multiplier, and shifted terms do not do: bf-p4c splits a sum at a term's known-zero low
    // bits (x << 7's seven), and the split left no PHV allocation for the 32-bit values the
    // checks below compute.  frag_index (meta.want_index, which the pool reads too),
    // frag_count and payload_len reach 32 bits through identity hash units: a copy from a
    // 16-bit header field would put the 32-bit value in 16-bit containers, and a sum cannot
    // span two containers.  Each layer of sums is an action of its own: bf-p4c runs an action
    // in one stage and does not split dependent statements into several.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) wide_idx;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) wide_cnt;
    // chunk_len in and frag_done out through hash units too: an instruction reads its PHV
    // sources from its destination's container group, so every value linked by sums,
    // XORs and copies must fit one group at once; these copies keep the header's fields,
    // the pool's and these sums in groups of their own.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) copy_chunk_len;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) copy_done;
    bit<32> clen;
    bit<32> cnt;
    // Compares of two fields become a difference here and a ternary match on its sign bit
    // or its zero in data_check: every value compared is below 2^31, so the sign bit of
    // a - b says a < b.  The chain is three stages: products, sums, differences.
    bit<32> left;    // frag_count - frag_index: 0 or negative when the index is past the end
    bit<32> done;    // idx * 1408: payload bytes before this fragment (its low byte's product first)
    bit<32> upto;    // cnt * 1408 (its low byte's product first)
    bit<32> upto_m;  // cnt * 1408 - 1407
    bit<32> idx_hi;  // the high bytes' products
    bit<32> cnt_hi;
    bit<32> end;     // idx + cnt
    bit<32> over;    // chunk_len - upto: in [-1407, 0] exactly when chunk_len fits cnt fragments
    bit<32> slack;   // chunk_len - upto_m = over + 1407: negative when chunk_len is too short
                     // for cnt fragments (or past 2^31 beyond them, where over looks negative)
    // The payload_len a DATA must carry, in 16 bits (off the 32-bit chain above, whose
    // values must share one container group): 1408, or for the last fragment the chunk's
    // tail, chunk_len - (cnt-1)*1408 = over + 1408, which is in [1, 1408] once the two
    // checks on over hold, so 16 bits of it decide: payload_len - 1408 == chunk_len - upto,
    // that is upto16 == clen16 - plen_less (mod 2^16).
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) copy_clen16;
    bit<16> clen16;     // chunk_len's low 16 bits
    bit<16> upto16;     // cnt * 1408, low 16 bits (its low byte's product first)
    bit<16> cnt_hi16;
    bit<16> plen_less;  // payload_len - 1408
    bit<16> tail_rhs;   // clen16 - plen_less
    bit<16> tail_diff;  // upto16 ^ tail_rhs: 0 when payload_len is the tail
    bit<16> next16;     // frag_index + 1
    bit<16> last_diff;  // next16 ^ frag_count: 0 for the last fragment

#include "products.p4"

    // One hash output per action: an action takes at most 32 bits from hash units.
    action widen_index() {
        meta.want_index = wide_idx.get({ hdr.kv.frag_index });
    }

    action widen_count() {
        cnt = wide_cnt.get({ hdr.kv.frag_count });
    }

    action payload_less() {
        plen_less = hdr.kv.payload_len - (bit<16>)FRAG_PAYLOAD;
        next16 = hdr.kv.frag_index + 1;
    }

    action is_last() {
        last_diff = next16 ^ hdr.kv.frag_count;
    }

    action widen_chunk_len() {
        clen = copy_chunk_len.get({ hdr.kv.chunk_len });
    }

    action low_chunk_len() {
        clen16 = copy_clen16.get({ hdr.kv.chunk_len[15:0] });
    }

    action export_done() {
        meta.frag_done = copy_done.get({ done });
    }

    action sums() {
        done = done + idx_hi;
        upto = upto + cnt_hi;
        upto_m = upto_m + cnt_hi;
        end = meta.want_index + cnt;
        left = cnt - meta.want_index;
    }

    action sums16() {
        upto16 = upto16 + cnt_hi16;
        tail_rhs = clen16 - plen_less;
    }

    action bounds() {
        over = clen - upto;
        slack = clen - upto_m;
    }

    action tail_check() {
        tail_diff = upto16 ^ tail_rhs;
    }

    action spoof_of() {
        spoof = hdr.ipv4.srcAddr ^ host_addr;
    }

    action guard_source(ip4Addr_t addr) {
        guarded = 1;
        host_addr = addr;
    }

    action fabric_port() {
        meta.from_fabric = 1;
    }

    table host_guard {
        key = { standard_metadata.ingress_port: exact; }
        actions = { guard_source; fabric_port; NoAction; }
        size = GUARD_ENTRIES;
        default_action = NoAction();
    }

    action allow_writer() {
        meta.is_writer = 1;
    }

    table writers {
        key = {
            standard_metadata.ingress_port: exact;
            hdr.ipv4.srcAddr: exact;
        }
        actions = { allow_writer; NoAction; }
        size = WRITER_ENTRIES;
        default_action = NoAction();
    }

    // Each group of checks decides into a reason of its own and safety_verdict picks the
    // first, in v1model's order: a chain that read drop_reason between groups made every
    // group wait for the one before (a stage each), and everything downstream waits for it.
    // Each group is one ternary table (decide_safety.p4, scripts/tna_decisions.py): Tofino 1
    // makes a table of every branch of an if chain, and the chains took 25 of them.
    bit<8> header_reason = DROP_NONE;
    bit<8> data_reason = DROP_NONE;
    bit<8> status_reason = DROP_NONE;

    @hidden
    action header_is(bit<8> reason) {
        header_reason = reason;
    }

    @hidden
    action data_is(bit<8> reason) {
        data_reason = reason;
    }

    @hidden
    action status_is(bit<8> reason) {
        status_reason = reason;
    }

    @hidden
    action take_header_reason() {
        meta.drop_reason = header_reason;
    }

    @hidden
    action take_data_reason() {
        meta.drop_reason = data_reason;
    }

    @hidden
    action take_status_reason() {
        meta.drop_reason = status_reason;
    }

    @hidden
    action drop_for(dropReason_t reason) {
        meta.drop_reason = reason;
    }

    @hidden
    action get_passes() {
        meta.get_ok = 1;
    }

#include "decide_safety.p4"

    // Tofino 1 has no long branches: a table that follows an `if` in its sequence waits until
    // every table inside it is placed.  So the arithmetic runs for every packet (it only
    // writes this control's variables; garbage for a packet with no kvpool header, which no
    // decision reads), each `if` holds one table, and the ingress's own checks before Safety
    // (parser, IPv4 checksum, IPv4 only) are rules of safety_verdict: nothing after Safety
    // waits for all of it.
    apply {
        host_guard.apply();
        // Looked up for every packet (it only reads): is_writer is read for DATA, NACK and
        // INVALIDATE only, as v1model's writers lookup leaves it 0 for a GET.
        writers.apply();
        spoof_of();
        widen_index();
        widen_count();
        payload_less();
        is_last();
        widen_chunk_len();
        low_chunk_len();
        idx_lo_times.apply();
        idx_hi_times.apply();
        cnt_lo_times.apply();
        cnt_hi_times.apply();
        sums();
        sums16();
        bounds();
        export_done();
        tail_check();

        // v1model's one chain, cut in three: header_check takes the checks of every opcode
        // and those of the others, data_check those of a DATA, status_check the status.  A
        // DATA's checks need the fragment arithmetic (five stages); the others are known
        // early, so a GET's verdict (get_ok) is too, and Popularity does not wait for a DATA's.
        if (hdr.kv.isValid()) {
            header_check.apply();
        }
        if (hdr.kv.isValid() && hdr.kv.opcode == OP_DATA) {
            data_check.apply();
        }
        if (hdr.kv.isValid()) {
            status_check.apply();
        }
        safety_verdict.apply();
        get_verdict.apply();
    }
}

#endif  // KVPOOL_TNA_SAFETY_P4
