/* -*- P4_16 -*- */
/*
 * Safety: the host-port source guard, header validation and the writers ACL, as
 * ../include/safety.p4 (same tables, actions, order of checks and drop reasons).
 *
 * Tofino differences: there is no multiplier, so x * 1408 is (x << 10) + (x << 8) +
 * (x << 7); and the payload of a DATA is not parsed in ingress, so a DATA shorter than its
 * UDP length claims is not caught here (DROP_PARSE_ERROR in v1model) but in the egress
 * parser, and only for a packet the egress pool writes (which then drops it).
 */
#ifndef KVPOOL_TNA_SAFETY_P4
#define KVPOOL_TNA_SAFETY_P4

/*************************************************************************
 ***********************  S A F E T Y  ***********************************
 *************************************************************************/

control Safety(inout headers_t hdr,
               inout ig_metadata_t meta,
               in ingress_intrinsic_metadata_t standard_metadata) {

    ip4Addr_t host_addr = 0;
    bit<1> guarded = 0;

    // x * 1408 = (x * 11) << 7 = ((x << 3) + (x << 1) + x) << 7, for idx = frag_index and
    // cnt = frag_count, in actions of independent operations each: bf-p4c runs an action in
    // one stage and does not split dependent statements into several (a direct action call
    // is a table of its own, so each layer gets its stage).  Two 32-bit temporaries per
    // product, reused in place: the ingress PHV holds every one of them at once.
    // frag_index (meta.want_index, which the pool reads too), frag_count and payload_len are
    // widened through hash units (identity): a copy from a 16-bit header field would put the
    // 32-bit value in 16-bit containers, and a shift or sum cannot span two containers.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) wide_idx;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) wide_cnt;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) wide_len;
    bit<32> cnt;
    bit<32> plen;
    bit<32> done;    // idx * 1408: payload bytes before this fragment
    bit<32> upto;    // cnt * 1408
    bit<32> idx2;    // idx << 1, then unused
    bit<32> cnt2;    // cnt << 1
    bit<32> end;     // idx + cnt
    bit<32> below;   // (cnt - 1) * 1408
    bit<32> rest;    // chunk_len - done

    action widen() {
        meta.want_index = wide_idx.get({ hdr.kv.frag_index });
        cnt = wide_cnt.get({ hdr.kv.frag_count });
        plen = wide_len.get({ hdr.kv.payload_len });
    }

    action shifts() {
        done = meta.want_index << 3;
        idx2 = meta.want_index << 1;
        upto = cnt << 3;
        cnt2 = cnt << 1;
        end = meta.want_index + cnt;
    }

    action sums() {
        done = done + idx2;
        upto = upto + cnt2;
    }

    action totals() {
        done = done + meta.want_index;
        upto = upto + cnt;
    }

    action times128() {
        done = done << 7;
        upto = upto << 7;
    }

    action bounds() {
        below = upto - (bit<32>)FRAG_PAYLOAD;
        rest = hdr.kv.chunk_len - done;
        meta.frag_done = done;
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

    apply {
        host_guard.apply();
        if (guarded == 1 && hdr.ipv4.srcAddr != host_addr) {
            meta.drop_reason = DROP_SPOOFED;
        } else if (hdr.kv.isValid()) {
            widen();
            shifts();
            sums();
            totals();
            times128();
            bounds();
            bit<32> frag = (bit<32>)FRAG_PAYLOAD;

            if (hdr.kv.version != KVPOOL_VERSION) {
                meta.drop_reason = DROP_BAD_VERSION;
            } else if (hdr.kv.opcode == 0 || hdr.kv.opcode > OP_MAX) {
                meta.drop_reason = DROP_BAD_OPCODE;
            } else if ((hdr.kv.flags & ~KNOWN_FLAGS) != 0) {
                meta.drop_reason = DROP_BAD_FLAGS;
            } else if (hdr.kv.frag_count == 0 || hdr.kv.frag_index == MAX_FRAG_INDEX) {
                meta.drop_reason = DROP_BAD_RANGE;
            } else if (hdr.kv.opcode == OP_DATA) {
                if (hdr.kv.frag_index >= hdr.kv.frag_count) {
                    meta.drop_reason = DROP_BAD_RANGE;
                } else if (hdr.kv.payload_len == 0 || hdr.kv.payload_len > FRAG_PAYLOAD) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                } else if (hdr.udp.length != KV_UDP_LEN_DATA) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                } else if (hdr.kv.chunk_len <= below || hdr.kv.chunk_len > upto) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                } else if (rest >= frag && hdr.kv.payload_len != FRAG_PAYLOAD) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                } else if (rest < frag && plen != rest) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                }
            } else if (hdr.kv.payload_len != 0) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (hdr.udp.length != KV_UDP_LEN_NO_PAYLOAD
                       && !(hdr.kv.opcode == OP_GET && hdr.udp.length == KV_UDP_LEN_DATA)) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (hdr.kv.opcode == OP_GET && end > (bit<32>)MAX_FRAG_INDEX) {
                meta.drop_reason = DROP_BAD_RANGE;
            }

            if (meta.drop_reason == DROP_NONE) {
                if (hdr.kv.opcode == OP_NACK) {
                    if (hdr.kv.status == STATUS_OK || hdr.kv.status > STATUS_MAX) {
                        meta.drop_reason = DROP_BAD_STATUS;
                    }
                } else if (hdr.kv.status != STATUS_OK) {
                    meta.drop_reason = DROP_BAD_STATUS;
                }
            }

            if (meta.drop_reason == DROP_NONE && hdr.kv.opcode != OP_GET) {
                writers.apply();
                if (hdr.kv.opcode == OP_INVALIDATE && meta.is_writer == 0) {
                    meta.drop_reason = DROP_NOT_WRITER;
                }
            }
        }
    }
}

#endif  // KVPOOL_TNA_SAFETY_P4
