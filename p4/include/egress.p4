/* -*- P4_16 -*- */
/*
 * Egress: per-replica work.  A flooded ARP copy never leaves through the port it came
 * in on; everything else is the coalescing egress (replica pruning and rewrite, reply
 * records of waiting GETs).
 */
#ifndef KVPOOL_EGRESS_P4
#define KVPOOL_EGRESS_P4

/*************************************************************************
 ***********************  E G R E S S  ***********************************
 *************************************************************************/

control MyEgress(inout headers_t hdr,
                 inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {

    CoalesceEgress() coalesce;

    apply {
        if (meta.flood == 1 && standard_metadata.egress_port == standard_metadata.ingress_port) {
            mark_to_drop(standard_metadata);
        } else {
            coalesce.apply(hdr, meta, standard_metadata);
        }
    }
}

#endif  // KVPOOL_EGRESS_P4
