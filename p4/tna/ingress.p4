/* -*- P4_16 -*- */
/*
 * Ingress: the concerns in the order of ../include/ingress.p4, and every drop counted.
 *
 *   1. parser error -> DROP_PARSE_ERROR; IPv4 checksum error -> DROP_BAD_CHECKSUM
 *   2. IPv4: Safety; kvpool header: validation, writers ACL, INVALIDATE needs a writer
 *   3. Pool: lookup; GET hit -> reply built in place (egress fills its served part),
 *      writer DATA -> fill decided here, bytes written in egress
 *   4. GET not served that entered the fabric here: Popularity; range GET not served, or
 *      DATA/NACK from a writer: Coalesce
 *   5. absorbed GET -> egress (records it, drops it); a served reply -> back out of its
 *      ingress port; otherwise TTL check/decrement and, unless released, Forwarding
 *   6. any drop reason -> drop_reason counter, drop_ctl
 *
 * The bridged header is made valid for every packet: egress reads it for all of them.
 */
#ifndef KVPOOL_TNA_INGRESS_P4
#define KVPOOL_TNA_INGRESS_P4

/*************************************************************************
 ***********************  I N G R E S S  *********************************
 *************************************************************************/

// Each bridged field in a container of its own: actions write them from different sources.
@pa_container_size("ingress", "hdr.bridge.pool_op", 8)
@pa_container_size("ingress", "hdr.bridge.flags", 8)
@pa_container_size("ingress", "hdr.bridge.pending_idx", 16)
@pa_container_size("ingress", "hdr.bridge.waiter_id", 8)
@pa_container_size("ingress", "hdr.bridge.release_dst", 8)
@pa_container_size("ingress", "hdr.bridge.release_mask", 32)
// A stateful ALU reads a PHV operand whole from one container (the search bus takes no
// byte shared with other data): the liveness operands each get a 32-bit container.
@pa_container_size("ingress", "meta.my_tag", 32)
@pa_container_size("ingress", "meta.tick", 32)
// A gateway compares the waiters read with meta.me by XOR, byte for byte: both whole.
@pa_container_size("ingress", "meta.me", 32)
control MyIngress(inout headers_t hdr,
                  inout ig_metadata_t meta,
                  in ingress_intrinsic_metadata_t standard_metadata,
                  in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                  inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                  inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    Counter<bit<32>, bit<32>>(DROP_REASONS, CounterType_t.PACKETS) drop_reason;

    Safety()     safety;
    @name("pool") PoolLookup() pool_lookup;
    Pool()       pool;
    Popularity() popularity;
    Coalesce()   coalesce;
    Forwarding() fwd;

    // Where a packet goes (forward_verdict, decide_ingress.p4: v1model's chain as one ternary
    // table).  FWD_UNICAST and FWD_FLOOD come from ARP, which has no IPv4 header to age.
    @hidden
    action back_out() {
        ig_tm_md.ucast_egress_port = standard_metadata.ingress_port;
    }

    @hidden
    action ttl_expired() {
        meta.drop_reason = DROP_TTL_EXPIRED;
    }

    @hidden
    action released() {
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;   // multicast by Coalesce (release_group)
    }

    @hidden
    action route() {
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        ig_tm_md.ucast_egress_port = meta.fwd_port;
        hdr.ethernet.dstAddr = meta.fwd_mac;
    }

    @hidden
    action route_as_is() {
        ig_tm_md.ucast_egress_port = meta.fwd_port;
        hdr.ethernet.dstAddr = meta.fwd_mac;
    }

    @hidden
    action unicast() {
        ig_tm_md.ucast_egress_port = meta.fwd_port;
    }

    @hidden
    action flood() {
        ig_tm_md.mcast_grp_a = meta.fwd_grp;
        hdr.bridge.flags = BRIDGE_FLOOD;
    }

    @hidden
    action drop_for(dropReason_t reason) {
        meta.drop_reason = reason;
    }

#include "decide_ingress.p4"

    apply {
        hdr.bridge.setValid();
        hdr.bridge.pool_op = POOL_OP_NONE;
        hdr.bridge.flags = 0;
        hdr.bridge.slot = 0;
        hdr.bridge.pending_idx = 0;
        hdr.bridge.waiter_id = 0;
        hdr.bridge.release_dst = 0;
        hdr.bridge.release_mask = 0;
        hdr.bridge.ingress_port = standard_metadata.ingress_port;

        fwd.apply(hdr, meta, ig_tm_md);

        // Safety decides the parser's and the checksum's drops too (safety_verdict), so that
        // no `if` around it holds its stages: a table after one waits for all of it.
        safety.apply(hdr, meta, standard_metadata, ig_prsr_md);

        // The pool drops nothing and serves only single-fragment GETs of chunks in
        // pool_lookup, which neither Popularity (chunks not in the pool) nor Coalesce (range
        // GETs, responses) takes, so "not served" (v1model's condition) holds for every
        // packet they see: they run before the pool's decisions, on the header as it came,
        // and no stage of theirs waits for the pool's.
        pool_lookup.apply(hdr, meta);
        // Not inside an `if`: their prologues (hash indices, lookups, the slot clock) then
        // run beside Safety, and only the registers wait for its verdict (a block's head
        // would wait for every reader inside it).  Both decide only for a KV packet.
        popularity.apply(hdr, meta, ig_dprsr_md);   // a GET's own verdict: meta.get_ok
        coalesce.apply(hdr, meta, ig_prsr_md, ig_tm_md);   // range GETs and responses
        pool.apply(hdr, meta, standard_metadata, ig_dprsr_md, ig_tm_md);

        // Forwarding's answer, unless the packet is absorbed (back to its port, which
        // drops it in egress), served (back to its port) or released (multicast).
        forward_verdict.apply();

        if (meta.report_hot == 1) {
            ig_dprsr_md.digest_type = DIGEST_HOT_CHUNK;
        } else if (meta.report_mismatch == 1) {
            ig_dprsr_md.digest_type = DIGEST_FILL_MISMATCH;
        }

        if (meta.drop_reason != DROP_NONE) {
            drop_reason.count((bit<32>)meta.drop_reason);
            ig_dprsr_md.drop_ctl = 1;
        }
    }
}

#endif  // KVPOOL_TNA_INGRESS_P4
