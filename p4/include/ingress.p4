/* -*- P4_16 -*- */
/*
 * Ingress: wires the concerns in order and accounts for every drop.
 *
 *   1. parser error -> DROP_PARSE_ERROR; IPv4 checksum error -> DROP_BAD_CHECKSUM
 *   2. IPv4: Safety (host-port source guard); kvpool header: validation, writers ACL,
 *      INVALIDATE needs a writer
 *   3. Pool: lookup; GET hit -> reply built in place; writer DATA fill
 *   4. GET not served that entered the fabric here (not from a fabric port): Popularity
 *      (sketch, digest); range GET (frag_count > 1) not served: Coalesce (per chunk)
 *      DATA/NACK from a writer: Coalesce release (multicast to the waiters)
 *   5. absorbed GET -> egress (which records it, then drops it)
 *      otherwise TTL check/decrement (not for the switch's own replies) and, unless
 *      multicast by a release (one with other waiters), Forwarding (routes, ARP)
 *   6. any drop reason set -> count it in drop_reason, mark_to_drop
 */
#ifndef KVPOOL_INGRESS_P4
#define KVPOOL_INGRESS_P4

/*************************************************************************
 ***********************  I N G R E S S  *********************************
 *************************************************************************/

control MyIngress(inout headers_t hdr,
                  inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {

    counter(DROP_REASONS, CounterType.packets) drop_reason;

    Safety()     safety;
    Pool()       pool;
    Popularity() popularity;
    Coalesce()   coalesce;
    Forwarding() fwd;

    apply {
        if (standard_metadata.parser_error != error.NoError) {
            meta.drop_reason = DROP_PARSE_ERROR;
        } else if (standard_metadata.checksum_error == 1) {
            meta.drop_reason = DROP_BAD_CHECKSUM;
        } else if (hdr.ipv4.isValid()) {
            safety.apply(hdr, meta, standard_metadata);
        }

        if (meta.drop_reason == DROP_NONE && hdr.kv.isValid()) {
            pool.apply(hdr, meta, standard_metadata);
            if (meta.drop_reason == DROP_NONE && meta.served == 0) {
                bool is_get = hdr.kv.opcode == OP_GET;
                // Single-fragment GETs (the pool's, with reply room) are answered by a pool or the
                // holder, never held for another's answer: their answers come from both, out of
                // order, and a chunk's last fragment served early would end its slot.
                bool range_get = is_get && hdr.kv.frag_count > 1;
                bool response = (hdr.kv.opcode == OP_DATA || hdr.kv.opcode == OP_NACK)
                                && meta.is_writer == 1;
                if (is_get && meta.from_fabric == 0) {
                    popularity.apply(hdr, meta, standard_metadata);
                }
                if (range_get || response) {
                    coalesce.apply(hdr, meta, standard_metadata);
                }
            }
        }

        if (meta.drop_reason == DROP_NONE) {
            if (meta.absorb == 1) {
                standard_metadata.egress_spec = standard_metadata.ingress_port;
            } else {
                if (hdr.ipv4.isValid() && meta.served == 0) {
                    if (hdr.ipv4.ttl <= 1) {
                        meta.drop_reason = DROP_TTL_EXPIRED;
                    } else {
                        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
                    }
                }
                if (meta.drop_reason == DROP_NONE && meta.release == 0) {
                    fwd.apply(hdr, meta, standard_metadata);
                }
            }
        }

        if (meta.drop_reason != DROP_NONE) {
            drop_reason.count((bit<32>)meta.drop_reason);
            mark_to_drop(standard_metadata);
        }
    }
}

#endif  // KVPOOL_INGRESS_P4
