/* -*- P4_16 -*- */
/*
 * Headers and metadata.  The kvpool header is exactly kvpool.wire.FIELDS, in order:
 * 40 bytes, big-endian.  A DATA payload is always FRAG_PAYLOAD = 1408 bytes, which the
 * parser extracts as SLICES_PER_FRAGMENT headers of one bit<1024> each: BMv2 handles
 * 1024-bit fields and registers comfortably, and a slice maps one-to-one onto one
 * register array of the pool, so a hit or fill is 11 register accesses.
 */
#ifndef KVPOOL_HEADERS_P4
#define KVPOOL_HEADERS_P4

/*************************************************************************
 ***********************  T Y P E S  *************************************
 *************************************************************************/

typedef bit<9>  egressSpec_t;
typedef bit<48> macAddr_t;
typedef bit<32> ip4Addr_t;
typedef bit<64> chunkKey_t;
typedef bit<32> slotIdx_t;      // register index into the pool (0..POOL_SLOTS-1)
typedef bit<32> generation_t;
typedef bit<32> placement_t;    // admission id the controller gives a chunk; 0 is never given
typedef bit<48> slotTag_t;      // {placement, frag_index} of the bytes a slot holds
typedef bit<16> waiterId_t;     // same width as standard_metadata.egress_rid
typedef bit<32> waiterMask_t;   // bit w set = waiter w waits; width == MAX_WAITERS
typedef bit<48> timestamp_t;    // standard_metadata.ingress_global_timestamp, microseconds
typedef bit<7>  epoch_t;        // popularity epoch set by the controller
typedef bit<8>  epochTag_t;     // {1w1, epoch}: never 0, so zeroed registers mean "unset"

/*************************************************************************
 ***********************  H E A D E R S  *********************************
 *************************************************************************/

header ethernet_t {
    macAddr_t dstAddr;
    macAddr_t srcAddr;
    bit<16>   etherType;
}

header arp_t {
    bit<16>   htype;
    bit<16>   ptype;
    bit<8>    hlen;
    bit<8>    plen;
    bit<16>   oper;
    macAddr_t sha;
    ip4Addr_t spa;
    macAddr_t tha;
    ip4Addr_t tpa;
}

header ipv4_t {
    bit<4>    version;
    bit<4>    ihl;
    bit<8>    diffserv;
    bit<16>   totalLen;
    bit<16>   identification;
    bit<3>    flags;
    bit<13>   fragOffset;
    bit<8>    ttl;
    bit<8>    protocol;
    bit<16>   hdrChecksum;
    ip4Addr_t srcAddr;
    ip4Addr_t dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

// kvpool.wire.FIELDS: (name, bits, byte offset).
header kvpool_t {
    bit<8>       version;      //  0
    bit<8>       opcode;       //  1
    bit<16>      flags;        //  2
    chunkKey_t   chunk_key;    //  4
    bit<16>      frag_index;   // 12
    bit<16>      frag_count;   // 14
    bit<32>      request_id;   // 16
    generation_t generation;   // 20
    bit<16>      payload_len;  // 24
    bit<16>      status;       // 26
    bit<32>      chunk_len;    // 28
    bit<64>      check;        // 32: the writer's integrity check (DATA); stored and returned as is
}

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

// Sent to the controller when a missed chunk crosses the hot threshold.
struct hot_chunk_t {
    chunkKey_t chunk_key;
    bit<32>    estimate;   // count-min estimate of missed fetches this epoch
    epoch_t    epoch;
}

// Sent to the controller when writer DATA for an admitted chunk disagrees with its entry:
// the holder has another generation or another length than the switch was told.
struct fill_mismatch_t {
    chunkKey_t   chunk_key;
    generation_t generation;
    bit<16>      frag_count;
    bit<32>      chunk_len;
}

#endif  // KVPOOL_HEADERS_P4
