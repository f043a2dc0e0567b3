/* -*- P4_16 -*- */
/*
 * Pool: chunk lookup, hits served from register memory, fill on pass.
 *
 * Memory.  A slot is one fragment: SLICES_PER_FRAGMENT register arrays of bit<1024>
 * (slice_0 .. slice_10), all indexed by the slot number, hold its 1408 bytes.  The value
 * is sliced because a register cell is one field and BMv2 handles 1024-bit fields well
 * while one 11264-bit field would be an outlier nobody tests; one slice per array also
 * lets a hardware target spread the arrays over stages.  A chunk occupies frag_count
 * consecutive slots from the base slot the controller allocated (paged, no
 * fragmentation).
 *
 * What a slot holds.  The controller gives every admission a placement id (a
 * pool_lookup action parameter, never 0, unique per switch and never reused while the
 * switch runs) and installs the chunk's generation in the same entry: the generation in
 * force lives only there, so only the controller moves it, and no packet can freeze or
 * disable a chunk.  Each slot carries slot_tag = {placement, frag_index} of the bytes
 * written into it and slot_check, the check their writer computed (kvpool.wire).  A
 * fragment is served only from a slot tagged with the entry's placement and the
 * requested index, so bytes written under an older placement (before an eviction, a
 * move to another base slot, or a republish, which the controller installs as a new
 * placement) or for another fragment are never served, and no register ever has to be
 * cleared (BMv2's P4Runtime server cannot write registers).  The reply carries the
 * stored check as it is: the switch never computes over a payload, and the receiver's
 * recomputation ties the bytes to the key, generation, index and lengths.
 *
 * Fill on pass.  Only writer DATA (meta.is_writer: the writers ACL matched its ingress
 * port and source) is written, never DATA a switch built or replicated (SWITCH_SERVED,
 * COALESCED), and only when its generation, frag_count and chunk_len equal the entry's.
 * Writer DATA that differs is forwarded untouched, counted (POOL_FILL_MISMATCH) and
 * reported to the controller (fill_mismatch_t, once per change seen in a
 * crc16(chunk_key)-indexed cell), which re-admits or evicts.  State FILLING writes every
 * such DATA; VALID skips a slot already tagged current, unless the DATA answers a
 * NO_CACHE request: a requester distrusted a copy, so the holder's bytes rewrite the slot
 * (repair: once an impairment stops, a corrupted fill does not outlive the next NO_CACHE
 * answer).
 *
 * Reply room.  A served reply is the GET rewritten in place, and a DATA is 1408 bytes
 * longer than a GET.  BMv2's simple_switch gives a packet only 512 bytes of room to grow
 * (PacketBuffer(len + 512) in simple_switch.cpp; beyond that the deparser overruns the
 * buffer and the switch crashes), and hardware cannot add 1408 bytes either.  So the
 * switch answers only a GET that brings the room with it: a GET whose UDP datagram is
 * DATA-sized (payload_len 0, FRAG_PAYLOAD bytes of padding, parsed as the 11 slices).
 * The hit overwrites the slices; every GET with room that is not answered has the room
 * stripped here (slices invalid, lengths back to a plain GET, UDP checksum 0), so the
 * holder, the coalescing state and the links beyond the first hop see a plain GET.  A
 * plain GET the switch could otherwise answer counts as POOL_NO_ROOM and goes on.
 *
 * Across a fabric the controller gives a chunk's bytes to one switch (the one nearest the
 * requesters that all their GETs for it cross, docs/guide/operations.md) and installs the
 * chunk in state UPSTREAM on the switches between the requesters and that one: there a
 * GET keeps its room (POOL_UPSTREAM) for the switch above to answer, and nothing is filled
 * or served.  The first switch without an UPSTREAM entry strips the room as above.
 *
 * INVALIDATE (writers only; Safety drops the rest) is counted and forwarded to its
 * destination; it changes no switch state.  Registers written per packet: a fill reads
 * and writes slot_tag once and writes slot_check and the slices; every new cell is at
 * most 64 bits (for the Tofino port).
 */
#ifndef KVPOOL_POOL_P4
#define KVPOOL_POOL_P4

/*************************************************************************
 ***********************  P O O L  ***************************************
 *************************************************************************/

control Pool(inout headers_t hdr,
             inout metadata_t meta,
             inout standard_metadata_t standard_metadata) {

    // Fragment payloads: one array per 128-byte slice.
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_0;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_1;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_2;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_3;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_4;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_5;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_6;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_7;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_8;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_9;
    register<bit<SLICE_BITS>>(POOL_SLOTS) slice_10;

    // Per slot: {placement, frag_index} of its bytes (0: never written) and their check.
    register<slotTag_t>(POOL_SLOTS) slot_tag;
    register<bit<64>>(POOL_SLOTS)   slot_check;

    // Last fill mismatch reported, per crc16(chunk_key) cell: a digest per change, not per packet.
    register<bit<64>>(MISMATCH_CELLS) mismatch_seen;

    counter(POOL_SLOTS, CounterType.packets) slot_hits;
    counter(POOL_SLOTS, CounterType.packets) slot_fills;
    counter(POOL_STATS, CounterType.packets) pool_stats;

    action pool_entry(slotIdx_t base_slot, bit<16> frag_count, bit<32> chunk_len,
                      generation_t generation, bit<8> state, placement_t placement) {
        meta.pool_found = 1;
        meta.base_slot = base_slot;
        meta.pool_frag_count = frag_count;
        meta.pool_chunk_len = chunk_len;
        meta.pool_generation = generation;
        meta.pool_state = state;
        meta.pool_placement = placement;
    }

    // Chunk key -> where and what the chunk is in switch memory.
    table pool_lookup {
        key = { hdr.kv.chunk_key: exact; }
        actions = { pool_entry; NoAction; }
        size = POOL_ENTRIES;
        default_action = NoAction();
    }

    // Called from apply, never from a table: @hidden keeps it out of the P4Info.
    @hidden
    action write_slot(slotIdx_t slot, slotTag_t tag) {
        slice_0.write(slot, hdr.payload[0].v);
        slice_1.write(slot, hdr.payload[1].v);
        slice_2.write(slot, hdr.payload[2].v);
        slice_3.write(slot, hdr.payload[3].v);
        slice_4.write(slot, hdr.payload[4].v);
        slice_5.write(slot, hdr.payload[5].v);
        slice_6.write(slot, hdr.payload[6].v);
        slice_7.write(slot, hdr.payload[7].v);
        slice_8.write(slot, hdr.payload[8].v);
        slice_9.write(slot, hdr.payload[9].v);
        slice_10.write(slot, hdr.payload[10].v);
        slot_tag.write(slot, tag);
        slot_check.write(slot, hdr.kv.check);
    }

    // A GET's reply room is only for this switch: what goes on is a plain GET.
    @hidden
    action strip_reply_room() {
        hdr.payload[0].setInvalid();
        hdr.payload[1].setInvalid();
        hdr.payload[2].setInvalid();
        hdr.payload[3].setInvalid();
        hdr.payload[4].setInvalid();
        hdr.payload[5].setInvalid();
        hdr.payload[6].setInvalid();
        hdr.payload[7].setInvalid();
        hdr.payload[8].setInvalid();
        hdr.payload[9].setInvalid();
        hdr.payload[10].setInvalid();
        hdr.ipv4.totalLen = KV_IPV4_LEN_NO_PAYLOAD;
        hdr.udp.length = KV_UDP_LEN_NO_PAYLOAD;
        hdr.udp.checksum = 0;
    }

    // Turn the GET (with reply room: the slices are valid) into the DATA reply in place
    // and send it back where it came from.
    @hidden
    action serve(slotIdx_t slot, bit<16> payload_len) {
        slice_0.read(hdr.payload[0].v, slot);
        slice_1.read(hdr.payload[1].v, slot);
        slice_2.read(hdr.payload[2].v, slot);
        slice_3.read(hdr.payload[3].v, slot);
        slice_4.read(hdr.payload[4].v, slot);
        slice_5.read(hdr.payload[5].v, slot);
        slice_6.read(hdr.payload[6].v, slot);
        slice_7.read(hdr.payload[7].v, slot);
        slice_8.read(hdr.payload[8].v, slot);
        slice_9.read(hdr.payload[9].v, slot);
        slice_10.read(hdr.payload[10].v, slot);
        slot_check.read(hdr.kv.check, slot);

        macAddr_t mac = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = hdr.ethernet.srcAddr;
        hdr.ethernet.srcAddr = mac;
        ip4Addr_t addr = hdr.ipv4.dstAddr;
        hdr.ipv4.dstAddr = hdr.ipv4.srcAddr;
        hdr.ipv4.srcAddr = addr;
        hdr.ipv4.totalLen = KV_IPV4_LEN_DATA;
        hdr.ipv4.ttl = SWITCH_REPLY_TTL;
        bit<16> port = hdr.udp.dstPort;
        hdr.udp.dstPort = hdr.udp.srcPort;
        hdr.udp.srcPort = port;
        hdr.udp.length = KV_UDP_LEN_DATA;
        hdr.udp.checksum = 0;

        // request_id and frag_index are echoed; the rest describes the stored fragment.
        hdr.kv.opcode = OP_DATA;
        hdr.kv.flags = FLAG_SWITCH_SERVED;
        hdr.kv.frag_count = meta.pool_frag_count;
        hdr.kv.generation = meta.pool_generation;
        hdr.kv.payload_len = payload_len;
        hdr.kv.status = STATUS_OK;
        hdr.kv.chunk_len = meta.pool_chunk_len;
        meta.served = 1;
    }

    apply {
        bool keep_room = false;
        if (pool_lookup.apply().hit) {
            slotIdx_t slot = meta.base_slot + (slotIdx_t)hdr.kv.frag_index;
            // Checking base_slot too guards against the sum wrapping around 2^32.
            bool slot_ok = meta.base_slot < POOL_SLOTS && slot < POOL_SLOTS;
            bool usable = (meta.pool_state == POOL_STATE_FILLING
                           || meta.pool_state == POOL_STATE_VALID)
                          && meta.pool_placement != 0;
            slotTag_t want = meta.pool_placement ++ hdr.kv.frag_index;
            slotTag_t tag;

            if (hdr.kv.opcode == OP_GET) {
                if (meta.pool_state == POOL_STATE_UPSTREAM) {
                    // A switch nearer the holder has the bytes: it gets the room.
                    keep_room = true;
                    pool_stats.count(POOL_UPSTREAM);
                } else if (hdr.kv.frag_count != 1
                        || (hdr.kv.flags & FLAG_NO_CACHE) != 0
                        || (hdr.kv.generation != 0 && hdr.kv.generation != meta.pool_generation)
                        || !usable
                        || hdr.kv.frag_index >= meta.pool_frag_count) {
                    // Not a single fragment this switch may answer: the holder decides.
                    pool_stats.count(POOL_BYPASS);
                } else if (!slot_ok) {
                    pool_stats.count(POOL_SLOT_RANGE);
                } else if (!hdr.payload[0].isValid()) {
                    pool_stats.count(POOL_NO_ROOM);
                } else {
                    slot_tag.read(tag, slot);
                    if (tag == want) {
                        // Valid payload bytes: min(1408, chunk_len - frag_index * 1408).
                        bit<32> rest = meta.pool_chunk_len
                                       - (bit<32>)hdr.kv.frag_index * (bit<32>)FRAG_PAYLOAD;
                        bit<16> payload_len = FRAG_PAYLOAD;
                        if (rest < (bit<32>)FRAG_PAYLOAD) {
                            payload_len = (bit<16>)rest;
                        }
                        serve(slot, payload_len);
                        slot_hits.count(slot);
                        pool_stats.count(POOL_HIT);
                    } else {
                        pool_stats.count(POOL_MISS_UNFILLED);
                    }
                }
            } else if (hdr.kv.opcode == OP_DATA) {
                if (meta.is_writer == 0) {
                    pool_stats.count(POOL_FILL_UNAUTH);
                } else if ((hdr.kv.flags & (FLAG_SWITCH_SERVED | FLAG_COALESCED)) != 0) {
                    // Built or replicated by a switch: trusted for release, never as a writer's bytes.
                    pool_stats.count(POOL_FILL_REPLICA);
                } else if (hdr.kv.generation != meta.pool_generation
                           || hdr.kv.frag_count != meta.pool_frag_count
                           || hdr.kv.chunk_len != meta.pool_chunk_len) {
                    // Not the chunk the entry describes: forwarded, not written, reported
                    // to the controller once per change seen in its cell.
                    pool_stats.count(POOL_FILL_MISMATCH);
                    bit<32> mismatch_cell;
                    hash(mismatch_cell, HashAlgorithm.crc16, (bit<32>)0, { hdr.kv.chunk_key },
                         (bit<32>)MISMATCH_CELLS);
                    bit<64> seen;
                    mismatch_seen.read(seen, mismatch_cell);
                    bit<64> what = (hdr.kv.chunk_key[63:32] ^ hdr.kv.generation)
                                   ++ (hdr.kv.chunk_key[31:0] ^ hdr.kv.chunk_len);
                    if (seen != what) {
                        mismatch_seen.write(mismatch_cell, what);
                        digest<fill_mismatch_t>(DIGEST_RECEIVER,
                            { hdr.kv.chunk_key, hdr.kv.generation, hdr.kv.frag_count,
                              hdr.kv.chunk_len });
                        pool_stats.count(POOL_MISMATCH_REPORTED);
                    }
                } else if (!usable) {
                    // Disabled entry: pass the DATA on, remember nothing.
                } else if (!slot_ok) {
                    pool_stats.count(POOL_SLOT_RANGE);
                } else {
                    bool current = false;
                    if (meta.pool_state == POOL_STATE_VALID) {
                        slot_tag.read(tag, slot);
                        current = tag == want;
                    }
                    if (current && (hdr.kv.flags & FLAG_NO_CACHE) == 0) {
                        pool_stats.count(POOL_FILL_SKIPPED);
                    } else {
                        write_slot(slot, want);
                        slot_fills.count(slot);
                        pool_stats.count(POOL_FILL);
                        if (current) {
                            pool_stats.count(POOL_REPAIR);
                        }
                    }
                }
            } else if (hdr.kv.opcode == OP_INVALIDATE) {
                // Only writers get here (Safety drops the rest).  It goes on to its
                // destination; generations move only through the controller's entries.
                pool_stats.count(POOL_INVALIDATE);
            }
        } else {
            pool_stats.count(POOL_LOOKUP_MISS);
        }

        if (hdr.kv.opcode == OP_GET && meta.served == 0 && hdr.payload[0].isValid() && !keep_room) {
            strip_reply_room();
        }
    }
}

#endif  // KVPOOL_POOL_P4
