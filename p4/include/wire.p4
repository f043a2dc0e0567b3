/* -*- P4_16 -*- */
/*
 * What every kvpool program shares, whatever its target: the types, the wire headers
 * (Ethernet, ARP, IPv4, UDP and the kvpool header, exactly kvpool.wire.FIELDS: 40 bytes,
 * big-endian) and the digests the controller receives.  The v1model program
 * (include/headers.p4) and the TNA program (tna/headers.p4) both include this file, so
 * the wire format and the digest layouts have one home.
 */
#ifndef KVPOOL_WIRE_P4
#define KVPOOL_WIRE_P4

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

/*************************************************************************
 ***********************  D I G E S T S  *********************************
 *************************************************************************/

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

#endif  // KVPOOL_WIRE_P4
