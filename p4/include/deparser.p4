/* -*- P4_16 -*- */
/*
 * Deparser: emits the valid headers in wire order.  A switch-served reply has its 11
 * payload slices made valid by the pool, so the GET grows into a full DATA packet here.
 */
#ifndef KVPOOL_DEPARSER_P4
#define KVPOOL_DEPARSER_P4

/*************************************************************************
 ***********************  D E P A R S E R  *******************************
 *************************************************************************/

control MyDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.kv);
        packet.emit(hdr.payload);
    }
}

#endif  // KVPOOL_DEPARSER_P4
