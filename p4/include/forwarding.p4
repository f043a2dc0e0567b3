/* -*- P4_16 -*- */
/*
 * Forwarding: IPv4 host routes and ARP.
 *
 * IPv4 is routed by longest prefix on the destination (host routes are /32 entries; a
 * leaf-spine leaf can send a whole remote subnet towards a spine with one prefix).  The
 * action sets the egress port and the next hop's MAC and leaves the source MAC alone.
 * Switch-served replies reuse this table: the pool swaps the addresses first, so the
 * reply is routed back to the requester like any packet.
 *
 * ARP keeps working without a controller in the loop: arp_forward matches the ARP
 * target protocol address (the asked-for IP in a request, the asker's IP in a reply), so
 * requests and replies both travel loop-free along the host routes.  Its default (or an
 * entry) may instead flood through a multicast group; egress then drops the copy that
 * would leave through the ingress port.
 */
#ifndef KVPOOL_FORWARDING_P4
#define KVPOOL_FORWARDING_P4

/*************************************************************************
 ***********************  F O R W A R D I N G  ***************************
 *************************************************************************/

control Forwarding(inout headers_t hdr,
                   inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {

    action drop_no_route() {
        meta.drop_reason = DROP_NO_ROUTE;
    }

    action ipv4_forward(egressSpec_t port, macAddr_t dst_mac) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.dstAddr = dst_mac;
    }

    table ipv4_route {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { ipv4_forward; drop_no_route; }
        size = ROUTE_ENTRIES;
        default_action = drop_no_route();
    }

    action arp_unicast(egressSpec_t port) {
        standard_metadata.egress_spec = port;
    }

    action arp_flood(bit<16> mcast_grp) {
        standard_metadata.mcast_grp = mcast_grp;
        meta.flood = 1;
    }

    table arp_forward {
        key = { hdr.arp.tpa: lpm; }
        actions = { arp_unicast; arp_flood; drop_no_route; }
        size = ARP_ENTRIES;
        default_action = drop_no_route();
    }

    apply {
        if (hdr.ipv4.isValid()) {
            ipv4_route.apply();
        } else if (hdr.arp.isValid()) {
            arp_forward.apply();
        } else {
            meta.drop_reason = DROP_UNHANDLED;
        }
    }
}

#endif  // KVPOOL_FORWARDING_P4
