/* -*- P4_16 -*- */
/*
 * Safety: the host-port source guard, header validation and the writers ACL.
 *
 * Source guard (every IPv4 packet).  host_guard maps a port that faces a host to that
 * host's address; a packet arriving there with another IPv4 source is dropped
 * (DROP_SPOOFED).  So a requester can neither pose as a holder (whose writes the switch
 * trusts) nor aim the answer to a GET at a victim.  A port towards another switch has a
 * fabric_port entry: not checked (switches are trusted), but marked (meta.from_fabric),
 * so that a fetch is counted by Popularity once, at the switch where it entered the
 * fabric, and not again at every switch on its way.  Ports without an entry are neither.
 *
 * Every kvpool header is checked in the order of kvpool.wire.validate, and the first
 * failure names the drop reason (ingress counts it in MyIngress.drop_reason and drops):
 *   version -> opcode -> flags -> range (frag_count 0 or frag_index 0xFFFF) ->
 *   DATA: range (frag_index >= frag_count) -> length (payload_len 1..1408, UDP length
 *         1456, chunk_len consistent with frag_count and payload_len);
 *   other: length (payload_len 0; UDP length 48, or 1456 for a GET with reply room)
 *          -> GET: range (index + count > 0xFFFF)
 *   -> status (1..STATUS_MAX on NACK, 0 on every other opcode).
 * The writers ACL marks (ingress port, IPv4 source) pairs allowed to fill the pool, send
 * INVALIDATE and answer coalesced GETs: a holder's address counts only on the port
 * towards that holder.  The pool and coalescing controls act on meta.is_writer; a GET
 * is never looked up (no table apply for the most common kvpool packet).
 */
#ifndef KVPOOL_SAFETY_P4
#define KVPOOL_SAFETY_P4

/*************************************************************************
 ***********************  S A F E T Y  ***********************************
 *************************************************************************/

control Safety(inout headers_t hdr,
               inout metadata_t meta,
               inout standard_metadata_t standard_metadata) {

    ip4Addr_t host_addr = 0;
    bit<1> guarded = 0;

    action guard_source(ip4Addr_t addr) {
        guarded = 1;
        host_addr = addr;
    }

    action fabric_port() {
        meta.from_fabric = 1;
    }

    // Port facing a host -> the only IPv4 source that port may send; port facing a
    // switch -> marked.  Miss = not checked, not marked.
    table host_guard {
        key = { standard_metadata.ingress_port: exact; }
        actions = { guard_source; fabric_port; NoAction; }
        size = GUARD_ENTRIES;
        default_action = NoAction();
    }

    action allow_writer() {
        meta.is_writer = 1;
    }

    // (Ingress port, source IPv4) -> may write (fill, invalidate, answer waiters).
    // Miss = not a writer.
    table writers {
        key = {
            standard_metadata.ingress_port: exact;
            hdr.ipv4.srcAddr: exact;
        }
        actions = { allow_writer; NoAction; }
        size = WRITER_ENTRIES;
        default_action = NoAction();
    }

    apply {
        host_guard.apply();
        if (guarded == 1 && hdr.ipv4.srcAddr != host_addr) {
            meta.drop_reason = DROP_SPOOFED;
            return;
        }
        if (!hdr.kv.isValid()) {
            return;
        }

        // Length arithmetic in 32 bits: frag_count * 1408 reaches 92 MB.
        bit<32> idx = (bit<32>)hdr.kv.frag_index;
        bit<32> cnt = (bit<32>)hdr.kv.frag_count;
        bit<32> frag = (bit<32>)FRAG_PAYLOAD;
        bit<32> done = idx * frag;  // payload bytes in the fragments before this one
        bit<32> rest = hdr.kv.chunk_len - done;

        if (hdr.kv.version != KVPOOL_VERSION) {
            meta.drop_reason = DROP_BAD_VERSION;
        } else if (hdr.kv.opcode == 0 || hdr.kv.opcode > OP_MAX) {
            meta.drop_reason = DROP_BAD_OPCODE;
        } else if ((hdr.kv.flags & ~KNOWN_FLAGS) != 0) {
            meta.drop_reason = DROP_BAD_FLAGS;
        } else if (hdr.kv.frag_count == 0 || hdr.kv.frag_index == MAX_FRAG_INDEX) {
            meta.drop_reason = DROP_BAD_RANGE;
        } else if (hdr.kv.opcode == OP_DATA) {
            // frag_index < frag_count, payload_len in 1..1408, a UDP datagram of exactly
            // header + 1408 bytes, and chunk_len consistent with both:
            // frag_count == ceil(chunk_len / 1408) and
            // payload_len == min(1408, chunk_len - frag_index * 1408).
            if (hdr.kv.frag_index >= hdr.kv.frag_count) {
                meta.drop_reason = DROP_BAD_RANGE;
            } else if (hdr.kv.payload_len == 0 || hdr.kv.payload_len > FRAG_PAYLOAD) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (hdr.udp.length != KV_UDP_LEN_DATA) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (hdr.kv.chunk_len <= (cnt - 1) * frag || hdr.kv.chunk_len > cnt * frag) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (rest >= frag && hdr.kv.payload_len != FRAG_PAYLOAD) {
                meta.drop_reason = DROP_BAD_LENGTH;
            } else if (rest < frag && (bit<32>)hdr.kv.payload_len != rest) {
                meta.drop_reason = DROP_BAD_LENGTH;
            }
        } else if (hdr.kv.payload_len != 0) {
            meta.drop_reason = DROP_BAD_LENGTH;
        } else if (hdr.udp.length != KV_UDP_LEN_NO_PAYLOAD
                   && !(hdr.kv.opcode == OP_GET && hdr.udp.length == KV_UDP_LEN_DATA)) {
            // No payload, except the reply room a GET may carry.
            meta.drop_reason = DROP_BAD_LENGTH;
        } else if (hdr.kv.opcode == OP_GET && idx + cnt > (bit<32>)MAX_FRAG_INDEX) {
            meta.drop_reason = DROP_BAD_RANGE;
        }

        if (meta.drop_reason == DROP_NONE) {
            if (hdr.kv.opcode == OP_NACK) {
                if (hdr.kv.status == STATUS_OK || hdr.kv.status > STATUS_MAX) {
                    meta.drop_reason = DROP_BAD_STATUS;
                }
            } else if (hdr.kv.status != STATUS_OK) {
                meta.drop_reason = DROP_BAD_STATUS;
            }
        }

        // A GET needs no writer: only fills (DATA), releases (DATA, NACK) and INVALIDATE ask.
        if (meta.drop_reason == DROP_NONE && hdr.kv.opcode != OP_GET) {
            writers.apply();
            // Only a writer may announce a change; a stray INVALIDATE goes nowhere.
            if (hdr.kv.opcode == OP_INVALIDATE && meta.is_writer == 0) {
                meta.drop_reason = DROP_NOT_WRITER;
            }
        }
    }
}

#endif  // KVPOOL_SAFETY_P4
