/* -*- P4_16 -*- */
/*
 * Headers and metadata of the v1model program.  Types, wire headers and digests are in
 * wire.p4 (shared with the TNA program, p4/tna/).  A DATA payload is always FRAG_PAYLOAD = 1408 bytes, which the
 * parser extracts as SLICES_PER_FRAGMENT headers of one bit<1024> each: BMv2 handles
 * 1024-bit fields and registers comfortably, and a slice maps one-to-one onto one
 * register array of the pool, so a hit or fill is 11 register accesses.
 */
#ifndef KVPOOL_HEADERS_P4
#define KVPOOL_HEADERS_P4

#include "wire.p4"

/*************************************************************************
 ***********************  P A Y L O A D   ( v 1 m o d e l )  *************
 *************************************************************************/

// One 128-byte slice of a DATA payload (see the file comment for why 1024 bits).
header kvSlice_t {
    bit<SLICE_BITS> v;
}

struct headers_t {
    ethernet_t ethernet;
    arp_t      arp;
    ipv4_t     ipv4;
    udp_t      udp;
    kvpool_t   kv;
    kvSlice_t[SLICES_PER_FRAGMENT] payload;
}

/*************************************************************************
 ***********************  M E T A D A T A  *******************************
 *************************************************************************/

// BMv2 copies the whole user metadata into every multicast replica, which is how the
// waiter bitmap and pending index reach egress without a per-subset multicast group.
struct metadata_t {
    dropReason_t drop_reason;    // DROP_NONE or why ingress drops the packet
    bit<1>       is_writer;      // (ingress port, source) on the writers ACL
    bit<1>       from_fabric;    // arrived on a port towards another switch (host_guard)
    bit<1>       served;         // GET turned into a DATA reply by the switch
    bit<1>       flood;          // ARP flooded through a multicast group

    // Pool lookup result.
    bit<1>       pool_found;
    slotIdx_t    base_slot;
    bit<16>      pool_frag_count;
    bit<32>      pool_chunk_len;
    generation_t pool_generation;  // generation in force (only the controller changes it)
    bit<8>       pool_state;
    placement_t  pool_placement;   // what the chunk's slots must be tagged with

    // Coalescing.
    ip4Addr_t    waiter_addr;      // source of a GET, destination of a DATA/NACK
    bit<1>       has_waiter;
    waiterId_t   waiter_id;
    bit<32>      pending_idx;      // pending slot of chunk_key, see coalesce.p4
    bit<1>       record_reply;     // egress stores (request_id, UDP port) for this waiter
    bit<1>       absorb;           // duplicate GET: egress records it, then drops it
    bit<1>       release;          // DATA/NACK multicast to the waiters in release_mask
    waiterMask_t release_mask;
    waiterId_t   release_dst;      // waiter the holder's response was addressed to
}

#endif  // KVPOOL_HEADERS_P4
