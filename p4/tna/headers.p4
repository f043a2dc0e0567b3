/* -*- P4_16 -*- */
/*
 * Headers and metadata of the TNA program.  Types, wire headers and digests come from
 * ../include/wire.p4 (shared with the v1model program); what is here exists because of
 * Tofino:
 *
 * - kvWords_t: the served part of a payload, SERVED_WORDS 32-bit words.  A Tofino 1 PHV
 *   holds 4 Kbit, so a switch can only rewrite the first few hundred bytes of a packet;
 *   the rest of a 1408-byte payload is never parsed and leaves as it came.
 * - bridge_t: ingress metadata does not reach egress on Tofino unless it is carried in
 *   front of the packet.  The ingress deparser emits it, the egress parser extracts it and
 *   the egress deparser drops it; every multicast replica gets a copy (what BMv2's copy
 *   of the user metadata gives the v1model program).
 */
#ifndef KVPOOL_TNA_HEADERS_P4
#define KVPOOL_TNA_HEADERS_P4

#include "../include/wire.p4"

/*************************************************************************
 ***********************  H E A D E R S  *********************************
 *************************************************************************/

// The first SERVED_BYTES of a payload (DATA, or a GET's reply room).
header kvWords_t {
    bit<32> w0;  bit<32> w1;  bit<32> w2;  bit<32> w3;
    bit<32> w4;  bit<32> w5;  bit<32> w6;  bit<32> w7;
#if SERVED_WORDS > 8
    bit<32> w8;  bit<32> w9;  bit<32> w10;  bit<32> w11;
#endif
#if SERVED_WORDS > 12
    bit<32> w12;  bit<32> w13;  bit<32> w14;  bit<32> w15;
#endif
#if SERVED_WORDS > 16
    bit<32> w16;  bit<32> w17;  bit<32> w18;  bit<32> w19;
#endif
#if SERVED_WORDS > 20
    bit<32> w20;  bit<32> w21;  bit<32> w22;  bit<32> w23;
#endif
#if SERVED_WORDS > 24
    bit<32> w24;  bit<32> w25;  bit<32> w26;  bit<32> w27;
#endif
#if SERVED_WORDS > 28
    bit<32> w28;  bit<32> w29;  bit<32> w30;  bit<32> w31;
#endif
}

// Ingress -> egress (14 bytes).  Every field a whole number of bytes, and the four flags one
// byte written whole: on Tofino an action writes each PHV container from one PHV source (plus
// the container itself) or from a constant, so fields that share a container must not be
// written from different sources in one action.
header bridge_t {
    bit<8>       pool_op;        // POOL_OP_*: what the egress pool does
    bit<8>       flags;          // BRIDGE_*: set once per packet, as a whole byte
    bit<16>      slot;           // pool slot (pool_op != NONE)
    bit<16>      pending_idx;    // pending slot of chunk_key (its low PENDING_SLOTS bits)
    bit<8>       waiter_id;      // the GET's waiter (BRIDGE_RECORD)
    bit<8>       release_dst;    // waiter the response was addressed to (BRIDGE_RELEASE)
    waiterMask_t release_mask;
    bit<7>       _pad;           // never written: the port's container is copied, not built
    PortId_t     ingress_port;   // a flooded copy never leaves through it
}

#if POOL_SLOTS > 65536
#error "bridge_t.slot is 16 bits: POOL_SLOTS must fit"
#endif

// bridge_t.flags: at most one of these groups per packet (a response releases, a GET is
// recorded or absorbed, ARP floods).
const bit<8> BRIDGE_RELEASE = 1;   // multicast of a response to the waiters in release_mask
const bit<8> BRIDGE_RECORD  = 2;   // store (request_id, UDP port) of this waiter's GET
const bit<8> BRIDGE_ABSORB  = 4;   // duplicate GET: recorded in egress, then dropped
const bit<8> BRIDGE_FLOOD   = 8;   // ARP flooded through a multicast group

struct headers_t {
    bridge_t   bridge;
    ethernet_t ethernet;
    arp_t      arp;
    ipv4_t     ipv4;
    udp_t      udp;
    kvpool_t   kv;
    kvWords_t  words;            // egress only: the served part of the payload
}

// A register cell of two 32-bit halves, the widest a Tofino 1 stateful ALU updates.
struct pair32_t {
    bit<32> hi;
    bit<32> lo;
}

/*************************************************************************
 ***********************  M E T A D A T A  *******************************
 *************************************************************************/

// What Forwarding found for a packet (meta.fwd).
const bit<8> FWD_UNHANDLED = 0;  // neither IPv4 nor ARP
const bit<8> FWD_ROUTE     = 1;  // an IPv4 route: fwd_port, fwd_mac
const bit<8> FWD_UNICAST   = 2;  // an ARP target behind fwd_port
const bit<8> FWD_FLOOD     = 3;  // an ARP flood to group fwd_grp
const bit<8> FWD_NO_ROUTE  = 4;

struct ig_metadata_t {
    dropReason_t drop_reason;    // DROP_NONE or why ingress drops the packet
    bool         checksum_error; // IPv4 header checksum wrong (ingress parser)
    bit<1>       is_writer;
    bit<1>       from_fabric;
    bit<1>       served;
    bit<1>       get_ok;         // a GET that passed Safety (Safety: before a DATA's verdict)
    bit<32>      frag_done;      // frag_index * FRAG_PAYLOAD: payload bytes before this fragment

    // Counter indices: a Tofino counter is addressed once per packet, so each control sets
    // the index where v1model counts and counts once at its end.
    bit<32>      pool_stat;
    bit<1>       count_pool;
    bit<32>      coalesce_stat;
    bit<1>       count_coalesce;
    bit<32>      popularity_stat;

    // Pool lookup result.
    bit<1>       pool_found;
    slotIdx_t    base_slot;
    slotIdx_t    pool_slot;      // base_slot + frag_index: the slot of this fragment
    bit<16>      pool_frag_count;
    bit<32>      pool_chunk_len;
    generation_t pool_generation;
    bit<8>       pool_state;
    placement_t  pool_placement;

    // Coalescing.
    ip4Addr_t    waiter_addr;
    bit<1>       has_waiter;
    waiterId_t   waiter_id;
    waiterMask_t me;             // 1 << waiter_id
    bit<32>      now;            // global_tstamp[47:16]: 65.536 us units
    bit<32>      tick;           // now >> k: the pending slots' clock (Coalesce.tick_shift)
    bit<32>      my_tag;         // pending_live tag: {1, 00, waiter id:8, crc64[20:0]}

    // Pool operands of the stateful ALUs (a register action reads them from the PHV).
    bit<32>      want_index;     // (bit<32>)frag_index: the low half of the tag a slot must hold
    bit<32>      what_hi;        // crc32(key, generation) (mismatch_seen)
    bit<32>      what_lo;        // crc32(chunk_len, key)

    // Popularity operands.
    epochTag_t   tag;            // {1, epoch}
    bit<32>      tag32;

    // Forwarding's answer (FWD_*), applied at the end of the ingress.
    bit<8>       fwd;
    PortId_t     fwd_port;
    macAddr_t    fwd_mac;
    MulticastGroupId_t fwd_grp;

    // Digests asked for, set as digest_type at the end of the ingress: the pool (a DATA) and
    // popularity (a GET) each writing digest_type would order all of one after the other.
    bit<1>       report_hot;
    bit<1>       report_mismatch;

    // Popularity digest (hot_chunk_t).
    bit<32>      estimate;
    epoch_t      epoch;
}

struct eg_metadata_t {
    // Set in egress, read by the deparser (whose conditions may test metadata only): the
    // IPv4 header has no options, so its checksum is recomputed (as the v1model program).
    bit<1> ipv4_checksum;
}

#endif  // KVPOOL_TNA_HEADERS_P4
