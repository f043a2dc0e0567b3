/* -*- P4_16 -*- */
/*
 * Forwarding: IPv4 routes (longest prefix) and ARP, as ../include/forwarding.p4 (same
 * tables, actions and parameters).  On Tofino the egress port is
 * ig_tm_md.ucast_egress_port and a flood goes to ig_tm_md.mcast_grp_a.
 *
 * The lookups run first, for every packet, and only record their answer (meta.fwd_*): the
 * ingress applies it at its end, when it knows whether the pool served the packet or
 * coalescing absorbed or released it.  Looked up after them, as v1model does, they would
 * add their stages to the end of the pipe; a lookup changes nothing, so looking up a
 * packet that ends up dropped or served costs nothing but the lookup.
 */
#ifndef KVPOOL_TNA_FORWARDING_P4
#define KVPOOL_TNA_FORWARDING_P4

/*************************************************************************
 ***********************  F O R W A R D I N G  ***************************
 *************************************************************************/

control Forwarding(inout headers_t hdr,
                   inout ig_metadata_t meta,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    action drop_no_route() {
        meta.fwd = FWD_NO_ROUTE;
    }

    action ipv4_forward(PortId_t port, macAddr_t dst_mac) {
        meta.fwd = FWD_ROUTE;
        meta.fwd_port = port;
        meta.fwd_mac = dst_mac;
    }

    table ipv4_route {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { ipv4_forward; drop_no_route; }
        size = ROUTE_ENTRIES;
        default_action = drop_no_route();
    }

    action arp_unicast(PortId_t port) {
        meta.fwd = FWD_UNICAST;
        meta.fwd_port = port;
    }

    action arp_flood(MulticastGroupId_t mcast_grp) {
        meta.fwd = FWD_FLOOD;
        meta.fwd_grp = mcast_grp;
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
            meta.fwd = FWD_UNHANDLED;
        }
    }
}

#endif  // KVPOOL_TNA_FORWARDING_P4
