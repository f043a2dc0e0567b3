/* -*- P4_16 -*- */
/*
 * Coalescing: GETs for a chunk whose answer is already crossing the switch join it; the
 * answer is multicast to every waiter.
 *
 * Pending state per chunk, indexed by crc32(chunk_key) mod PENDING_SLOTS:
 *   pending_key     chunk_key the slot is answering
 *   pending_sub     {owner waiter id, generation}: the waiter whose GETs the holder answers
 *                   (the one that opened the slot), and the generation its GETs asked for
 *                   (0: whatever is current)
 *   pending_ts      ingress_global_timestamp of the slot's last sign of life (us): opened,
 *                   a GET of its owner, an answer to its owner crossing
 *   pending_waiters bitmap over waiter ids; 0 = slot free
 * and, in egress, pending_reply[slot * MAX_WAITERS + waiter] = {request_id, UDP port}
 * of that waiter's latest GET.  It lives in egress because a register belongs to one
 * control and the replicas read it there; ingress marks the GET and egress records it.
 *
 * Why per chunk: requesters ask for a chunk with range GETs (one per window), and that is
 * what the switch coalesces, so its help costs no request packet plain forwarding would not
 * send.  A GET that joins an answer in progress gets the rest of that answer; what passed
 * before it joined it asks for again (RETRANSMIT, which goes to the holder).
 *
 * Waiters.  The controller gives each host a waiter id 0..MAX_WAITERS-1 on each switch
 * (waiter_lookup on its IPv4 address, waiter_egress on the id), the lowest ids to the
 * hosts most likely to wait there together (its own hosts first), and programs MAX_WAITERS
 * nested multicast groups: COALESCE_MCAST_GRP + t has a replica (port towards waiter w,
 * egress_rid = w) for every waiter w <= t.  A release multicasts to the group of the
 * highest id in its waiter bitmap, with the bitmap in user metadata (BMv2 copies it into
 * every replica); egress drops replicas whose bit is clear and rewrites the rest.
 *
 * Range GET (frag_count > 1) not answered by the pool, from a host with a waiter id (a
 * single-fragment GET, the pool's, is answered by a pool or the holder, never held here:
 * answers from both come out of order, and a last fragment served early would end a slot):
 *   slot free or timed out  -> open it: key, {me, asked generation}, now, bitmap = {me};
 *                              forward to the holder.  A RETRANSMIT opens nothing (it
 *                              asks for a run, not to the chunk's last fragment, which
 *                              is what ends a slot): forwarded.
 *   slot live, same key and asked generation, I own it
 *                           -> my next window: forward, the slot stays live.
 *   slot live, same key and asked generation, another owns it
 *                           -> set my bit, record my reply; absorb (drop in egress).
 *                              A RETRANSMIT GET (what its sender missed, or what a lost
 *                              answer left out) goes to the holder instead, and joins
 *                              nothing: a waiter here already gets the answer, and one
 *                              that waits below another switch would get it twice.
 *   slot live, same key, another asked generation
 *                           -> forward normally (CO_OTHER_GENERATION): GETs are only
 *                              coalesced when any answer to one is an answer to all.
 *   slot live, other chunk  -> collision: forward normally, no coalescing.
 * A GET from a host without a waiter id is forwarded normally.
 *
 * DATA or NACK from a writer, addressed to the owner of a slot for the same key, whose
 * asked generation is 0 or the response's (a NACK echoes the generation its GET asked
 * for): multicast to the waiters.  The owner's copy leaves as the holder sent it; every
 * other replica gets its waiter's IPv4/MAC, its recorded request_id and UDP port, and
 * FLAG_COALESCED.  When the owner is the only waiter the response is forwarded as any
 * packet and nothing else is done (where nothing is shared, the switch does the work of
 * plain forwarding).  The chunk's last fragment and any NACK free the slot (the answer is
 * over: a BUSY's waiters come back at the holder's booked time and meet again); any other
 * DATA to a slot with waiters keeps it live.  Answers to a GET of a non-owner (its RETRANSMIT) are forwarded
 * normally.  A writer here is an (ingress port, source) pair (Safety): a switch-served
 * reply coming from the holder's side counts, since switches are trusted; only the pool
 * refuses to store such bytes.
 *
 * Limits: one outstanding request per (host, chunk) (the latest GET's request_id wins); a
 * GET recorded in egress while a release for the same slot is being replicated may see its
 * reply record overwritten (BMv2 runs ingress and egress concurrently).
 */
#ifndef KVPOOL_COALESCE_P4
#define KVPOOL_COALESCE_P4

/*************************************************************************
 ***********************  C O A L E S C E   (ingress)  *******************
 *************************************************************************/

control Coalesce(inout headers_t hdr,
                 inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {

    register<chunkKey_t>(PENDING_SLOTS)   pending_key;
    register<bit<48>>(PENDING_SLOTS)      pending_sub;
    register<timestamp_t>(PENDING_SLOTS)  pending_ts;
    register<waiterMask_t>(PENDING_SLOTS) pending_waiters;
    counter(COALESCE_STATS, CounterType.packets) coalesce_stats;

    timestamp_t pending_timeout;

    action set_pending_timeout(timestamp_t timeout_us) {
        pending_timeout = timeout_us;
    }

    // Keyless: the controller changes the timeout by modifying the default action.
    table coalesce_config {
        actions = { set_pending_timeout; }
        size = 1;
        default_action = set_pending_timeout(DEFAULT_PENDING_TIMEOUT_US);
    }

    action set_waiter_id(waiterId_t waiter_id) {
        meta.has_waiter = 1;
        meta.waiter_id = waiter_id;
    }

    // Host IPv4 (source of a GET, destination of a response) -> waiter id.
    table waiter_lookup {
        key = { meta.waiter_addr: exact; }
        actions = { set_waiter_id; NoAction; }
        size = MAX_WAITERS;
        default_action = NoAction();
    }

    apply {
        coalesce_config.apply();
        if (hdr.kv.opcode == OP_GET) {
            meta.waiter_addr = hdr.ipv4.srcAddr;
        } else {
            meta.waiter_addr = hdr.ipv4.dstAddr;
        }
        waiter_lookup.apply();
        if (meta.waiter_id >= MAX_WAITERS) {
            meta.has_waiter = 0;  // an id with no bit in the bitmap cannot wait
        }

        hash(meta.pending_idx, HashAlgorithm.crc32, (bit<32>)0,
             { hdr.kv.chunk_key }, (bit<32>)PENDING_SLOTS);
        bit<48> sub = meta.waiter_id ++ hdr.kv.generation;
        chunkKey_t slot_key;
        bit<48> slot_sub;
        timestamp_t slot_ts;
        waiterMask_t slot_mask;
        pending_key.read(slot_key, meta.pending_idx);
        pending_sub.read(slot_sub, meta.pending_idx);
        pending_ts.read(slot_ts, meta.pending_idx);
        pending_waiters.read(slot_mask, meta.pending_idx);
        // BMv2 shifts by at most 8 bits; waiter ids are < MAX_WAITERS = 32 anyway.
        waiterMask_t me = (waiterMask_t)1 << (bit<8>)meta.waiter_id;
        timestamp_t now = standard_metadata.ingress_global_timestamp;

        bool same_chunk = slot_key == hdr.kv.chunk_key;
        bool mine = slot_sub[47:32] == meta.waiter_id;

        if (hdr.kv.opcode == OP_GET) {
            bool live = slot_mask != 0 && now - slot_ts < pending_timeout;
            if (meta.has_waiter == 0) {
                coalesce_stats.count(CO_NO_WAITER_ID);
            } else if (live && same_chunk && slot_sub[31:0] == hdr.kv.generation) {
                if (mine) {
                    pending_ts.write(meta.pending_idx, now);
                    meta.record_reply = 1;
                    coalesce_stats.count(CO_OWNER);
                } else if ((hdr.kv.flags & FLAG_RETRANSMIT) != 0) {
                    // What its sender missed: to the holder, and no join (a waiter here already
                    // gets the answer; one that waits below another switch would get it twice).
                    coalesce_stats.count(CO_RETRANSMIT);
                } else {
                    pending_waiters.write(meta.pending_idx, slot_mask | me);
                    meta.record_reply = 1;
                    meta.absorb = 1;
                    coalesce_stats.count(CO_ABSORBED);
                }
            } else if (live && same_chunk) {
                coalesce_stats.count(CO_OTHER_GENERATION);
            } else if (live) {
                coalesce_stats.count(CO_COLLISION);
            } else if ((hdr.kv.flags & FLAG_RETRANSMIT) != 0) {
                // It asks for what its sender missed, not up to the chunk's end: a slot it
                // opened would keep whoever joined it waiting for a last fragment that is
                // never sent, until the slot times out.
                coalesce_stats.count(CO_RETRANSMIT);
            } else {
                if (slot_mask != 0) {
                    coalesce_stats.count(CO_EXPIRED_REUSED);
                }
                pending_key.write(meta.pending_idx, hdr.kv.chunk_key);
                pending_sub.write(meta.pending_idx, sub);
                pending_ts.write(meta.pending_idx, now);
                pending_waiters.write(meta.pending_idx, me);
                meta.record_reply = 1;
                coalesce_stats.count(CO_FIRST);
            }
        } else if (meta.has_waiter == 1 && same_chunk && mine && slot_mask != 0
                   && (slot_sub[31:0] == 0 || slot_sub[31:0] == hdr.kv.generation)) {
            // DATA or NACK from a writer answering the slot's owner.
            bool over = hdr.kv.opcode == OP_NACK || hdr.kv.frag_index + 1 == hdr.kv.frag_count;
            if (over) {
                pending_waiters.write(meta.pending_idx, 0);  // the answer is over
            }
            if (slot_mask != me) {
                if (!over) {
                    pending_ts.write(meta.pending_idx, now);
                }
                meta.release = 1;
                meta.release_mask = slot_mask;
                meta.release_dst = meta.waiter_id;
                // The group of the highest waiter id in the bitmap (a binary search).
                waiterMask_t rest = slot_mask;
                bit<16> top = 0;
                if (rest[31:16] != 0) { top = top + 16; rest = rest >> 16; }
                if (rest[15:8] != 0)  { top = top + 8;  rest = rest >> 8; }
                if (rest[7:4] != 0)   { top = top + 4;  rest = rest >> 4; }
                if (rest[3:2] != 0)   { top = top + 2;  rest = rest >> 2; }
                if (rest[1:1] != 0)   { top = top + 1; }
                standard_metadata.mcast_grp = COALESCE_MCAST_GRP + top;
                coalesce_stats.count(CO_RELEASE);
            }
            // Its owner alone waits: forwarded as any packet, nothing else done (where nothing
            // is shared, every answer crosses the switch as in plain forwarding).
        }
    }
}

/*************************************************************************
 ***********************  C O A L E S C E   (egress)  ********************
 *************************************************************************/

control CoalesceEgress(inout headers_t hdr,
                       inout metadata_t meta,
                       inout standard_metadata_t standard_metadata) {

    // {request_id, UDP source port} of each waiter's GET, per pending slot.
    register<bit<48>>(PENDING_REPLIES) pending_reply;
    counter(MAX_WAITERS, CounterType.packets) waiter_replicas;
    counter(EGRESS_STATS, CounterType.packets) egress_stats;

    action rewrite_waiter(ip4Addr_t addr, macAddr_t mac) {
        hdr.ipv4.dstAddr = addr;
        hdr.ethernet.dstAddr = mac;
    }

    // Waiter id (the replica's egress_rid) -> where that waiter lives.
    table waiter_egress {
        key = { standard_metadata.egress_rid: exact; }
        actions = { rewrite_waiter; NoAction; }
        size = MAX_WAITERS;
        default_action = NoAction();
    }

    apply {
        if (meta.release == 1) {
            waiterId_t rid = standard_metadata.egress_rid;
            bool send = true;
            if (rid >= MAX_WAITERS || (meta.release_mask & ((waiterMask_t)1 << (bit<8>)rid)) == 0) {
                mark_to_drop(standard_metadata);
                egress_stats.count(EG_REPLICA_PRUNED);
                send = false;
            } else if (!waiter_egress.apply().hit) {
                mark_to_drop(standard_metadata);
                egress_stats.count(EG_NO_WAITER_ENTRY);
                send = false;
            }
            if (send && rid != meta.release_dst) {
                // Another waiter's copy: its own request id and port.  The owner's copy leaves
                // as the holder sent it (the answer to its own GET).
                bit<48> reply;
                pending_reply.read(reply, meta.pending_idx * MAX_WAITERS + (bit<32>)rid);
                hdr.kv.request_id = reply[47:16];
                hdr.udp.dstPort = reply[15:0];
                hdr.kv.flags = hdr.kv.flags | FLAG_COALESCED;
                hdr.udp.checksum = 0;
            }
            if (send) {
                waiter_replicas.count((bit<32>)rid);
                egress_stats.count(EG_REPLICA_SENT);
            }
        } else if (meta.record_reply == 1) {
            pending_reply.write(meta.pending_idx * MAX_WAITERS + (bit<32>)meta.waiter_id,
                                hdr.kv.request_id ++ hdr.udp.srcPort);
            egress_stats.count(EG_REPLY_RECORDED);
            if (meta.absorb == 1) {
                mark_to_drop(standard_metadata);
            }
        }
    }
}

#endif  // KVPOOL_COALESCE_P4
