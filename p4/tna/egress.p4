/* -*- P4_16 -*- */
/*
 * Egress: per-replica work, as ../include/egress.p4: a flooded ARP copy never leaves
 * through the port it came in on; otherwise the coalescing egress (replica pruning and
 * rewrite, reply records of waiting GETs) and, TNA only, the egress half of the pool
 * (served bytes read into a reply or written from a DATA, pool.p4).
 */
#ifndef KVPOOL_TNA_EGRESS_P4
#define KVPOOL_TNA_EGRESS_P4

/*************************************************************************
 ***********************  E G R E S S  ***********************************
 *************************************************************************/

control MyEgress(inout headers_t hdr,
                 inout eg_metadata_t meta,
                 in egress_intrinsic_metadata_t standard_metadata,
                 in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                 inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                 inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {

    CoalesceEgress() coalesce;
    PoolEgress()     pool;

    apply {
        if (hdr.bridge.flags == BRIDGE_FLOOD && standard_metadata.egress_port == hdr.bridge.ingress_port) {
            eg_dprsr_md.drop_ctl = 1;
        } else if (eg_prsr_md.parser_err != 0) {
            // A DATA shorter than its UDP length (only the pool's packets parse a payload).
            eg_dprsr_md.drop_ctl = 1;
        } else {
            coalesce.apply(hdr, standard_metadata, eg_dprsr_md);
            pool.apply(hdr, standard_metadata);
        }
        if (hdr.ipv4.isValid() && hdr.ipv4.ihl == 5) {
            meta.ipv4_checksum = 1;
        }
    }
}

#endif  // KVPOOL_TNA_EGRESS_P4
