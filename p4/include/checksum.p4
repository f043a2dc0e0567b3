/* -*- P4_16 -*- */
/*
 * IPv4 header checksum: verified on the way in (a bad one sets
 * standard_metadata.checksum_error and ingress drops it as DROP_BAD_CHECKSUM) and
 * recomputed on the way out, because the switch rewrites TTL, addresses and lengths.
 *
 * UDP checksum: the switch never recomputes it over the payload.  Packets it forwards
 * unchanged above IPv4 keep the sender's checksum (TTL is not in the pseudo-header);
 * packets it creates or rewrites (switch-served DATA, coalesced replicas) carry
 * checksum 0, which UDP over IPv4 defines as "no checksum" (RFC 768).
 */
#ifndef KVPOOL_CHECKSUM_P4
#define KVPOOL_CHECKSUM_P4

/*************************************************************************
 ************   C H E C K S U M    V E R I F I C A T I O N   *************
 *************************************************************************/

control MyVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        verify_checksum(
            hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version,
              hdr.ipv4.ihl,
              hdr.ipv4.diffserv,
              hdr.ipv4.totalLen,
              hdr.ipv4.identification,
              hdr.ipv4.flags,
              hdr.ipv4.fragOffset,
              hdr.ipv4.ttl,
              hdr.ipv4.protocol,
              hdr.ipv4.srcAddr,
              hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum,
            HashAlgorithm.csum16);
    }
}

/*************************************************************************
 *************   C H E C K S U M    C O M P U T A T I O N   **************
 *************************************************************************/

control MyComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(
            hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version,
              hdr.ipv4.ihl,
              hdr.ipv4.diffserv,
              hdr.ipv4.totalLen,
              hdr.ipv4.identification,
              hdr.ipv4.flags,
              hdr.ipv4.fragOffset,
              hdr.ipv4.ttl,
              hdr.ipv4.protocol,
              hdr.ipv4.srcAddr,
              hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum,
            HashAlgorithm.csum16);
    }
}

#endif  // KVPOOL_CHECKSUM_P4
