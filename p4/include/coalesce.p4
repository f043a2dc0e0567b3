/* -*- P4_16 -*- */
/*
 * Coalescing: absorb duplicate GETs for a fragment in flight, multicast the response.
 *
 * Pending state, indexed by crc32(chunk_key, frag_index) mod PENDING_SLOTS:
 *   pending_key     chunk_key the slot is waiting for
 *   pending_sub     {frag_index, generation}: the fragment, and the generation its GETs
 *                   asked for (0: whatever is current)
 *   pending_ts      ingress_global_timestamp of the GET that opened it (us)
 *   pending_waiters bitmap over waiter ids; 0 = slot free
 * and, in egress, pending_reply[slot * MAX_WAITERS + waiter] = {request_id, UDP port}
 * of that waiter's latest GET.  It lives in egress because a register belongs to one
 * control and the replicas read it there; ingress marks the GET and egress records it.
 *
 * Waiters.  The controller gives each host a waiter id 0..MAX_WAITERS-1 on each switch
 * (waiter_lookup on its IPv4 address, waiter_egress on the id), the lowest ids to the
 * hosts most likely to wait there together (its own hosts first), and programs MAX_WAITERS
 * nested multicast groups: COALESCE_MCAST_GRP + t has a replica (port towards waiter w,
 * egress_rid = w) for every waiter w <= t.  A release multicasts to the group of the
 * highest id in its waiter bitmap, with the bitmap in user metadata (BMv2 copies it into
 * every replica); egress drops replicas whose bit is clear and rewrites the rest.  No
 * group per subset, and a leaf whose own hosts wait makes replicas for those only, not
 * for every host of the fabric (on BMv2 each pruned replica is a full egress pass).
 *
 * GET (single fragment, not answered by the pool), from a host with a waiter id:
 *   slot free or timed out  -> take it: key, {fragment, asked generation}, now, bitmap =
 *                              {me}; forward to the holder.
 *   slot live, same key, fragment and asked generation
 *                           -> set my bit, record my reply; absorb (drop in egress),
 *                              except a RETRANSMIT GET, which also goes upstream in case
 *                              the first GET or its answer was lost.
 *   slot live, same fragment, another asked generation
 *                           -> forward normally (CO_OTHER_GENERATION): GETs are only
 *                              coalesced when any answer to one is an answer to all, so
 *                              a waiter that pinned a generation cannot make the NACK
 *                              it gets (STALE_GENERATION) fail the others.
 *   slot live, other fragment -> collision: forward normally, no coalescing.
 * A GET from a host without a waiter id is forwarded normally.
 *
 * DATA or NACK from a writer, addressed to a waiter whose bit is set in a slot for the
 * same key and fragment, whose asked generation is 0 or the response's (a NACK echoes the
 * generation its GET asked for; age does not matter: the answer satisfies everyone who
 * waits): clear the bitmap and multicast.  Each replica gets the waiter's IPv4/MAC and
 * its own recorded request_id and UDP port; all but the one for the original destination
 * get FLAG_COALESCED.  When the addressee is the only waiter the response is forwarded
 * instead (release_unicast) and only gets its request_id and port: the same packet out,
 * without a replica per waiter id that egress would prune.  Other DATA is forwarded
 * normally.  A writer here is an (ingress
 * port, source) pair (Safety): a switch-served reply coming from the holder's side counts,
 * since switches are trusted; only the pool refuses to store such bytes.
 *
 * Limits: one outstanding request per (host, fragment) (the latest GET's request_id
 * wins); a GET recorded in egress while a release for the same slot is being replicated
 * may see its reply record overwritten (BMv2 runs ingress and egress concurrently).
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
             { hdr.kv.chunk_key, hdr.kv.frag_index }, (bit<32>)PENDING_SLOTS);
        bit<48> sub = hdr.kv.frag_index ++ hdr.kv.generation;
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

        bool same_fragment = slot_key == hdr.kv.chunk_key && slot_sub[47:32] == hdr.kv.frag_index;

        if (hdr.kv.opcode == OP_GET) {
            bool live = slot_mask != 0 && now - slot_ts < pending_timeout;
            if (meta.has_waiter == 0) {
                coalesce_stats.count(CO_NO_WAITER_ID);
            } else if (live && same_fragment && slot_sub == sub) {
                pending_waiters.write(meta.pending_idx, slot_mask | me);
                meta.record_reply = 1;
                if ((hdr.kv.flags & FLAG_RETRANSMIT) != 0) {
                    coalesce_stats.count(CO_RETRANSMIT);
                } else {
                    meta.absorb = 1;
                    coalesce_stats.count(CO_ABSORBED);
                }
            } else if (live && same_fragment) {
                coalesce_stats.count(CO_OTHER_GENERATION);
            } else if (live) {
                coalesce_stats.count(CO_COLLISION);
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
        } else if (meta.has_waiter == 1 && same_fragment && (slot_mask & me) != 0
                   && (slot_sub[31:0] == 0 || slot_sub[31:0] == hdr.kv.generation)) {
            // DATA or NACK from a writer answering a waited-for fragment.
            pending_waiters.write(meta.pending_idx, 0);
            meta.release = 1;
            meta.release_mask = slot_mask;
            meta.release_dst = meta.waiter_id;
            if (slot_mask == me) {
                // Nobody else waits here: forward it (Forwarding), egress gives it the
                // addressee's latest reply record.  Multicast would make a replica for every
                // waiter id only to prune all but this one, and a slot without absorbed GETs
                // is the common release (the holder's leaf sees one GET per fragment).
                meta.release_unicast = 1;
            } else {
                // The group of the highest waiter id in the bitmap (a binary search).
                waiterMask_t rest = slot_mask;
                bit<16> top = 0;
                if (rest[31:16] != 0) { top = top + 16; rest = rest >> 16; }
                if (rest[15:8] != 0)  { top = top + 8;  rest = rest >> 8; }
                if (rest[7:4] != 0)   { top = top + 4;  rest = rest >> 4; }
                if (rest[3:2] != 0)   { top = top + 2;  rest = rest >> 2; }
                if (rest[1:1] != 0)   { top = top + 1; }
                standard_metadata.mcast_grp = COALESCE_MCAST_GRP + top;
            }
            coalesce_stats.count(CO_RELEASE);
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
            if (meta.release_unicast == 1) {
                // Forwarded to its addressee, already routed: not a replica, no address rewrite.
                rid = meta.release_dst;
            } else if (rid >= MAX_WAITERS || (meta.release_mask & ((waiterMask_t)1 << (bit<8>)rid)) == 0) {
                mark_to_drop(standard_metadata);
                egress_stats.count(EG_REPLICA_PRUNED);
                send = false;
            } else if (!waiter_egress.apply().hit) {
                mark_to_drop(standard_metadata);
                egress_stats.count(EG_NO_WAITER_ENTRY);
                send = false;
            }
            if (send) {
                bit<48> reply;
                pending_reply.read(reply, meta.pending_idx * MAX_WAITERS + (bit<32>)rid);
                hdr.kv.request_id = reply[47:16];
                hdr.udp.dstPort = reply[15:0];
                if (rid != meta.release_dst) {
                    hdr.kv.flags = hdr.kv.flags | FLAG_COALESCED;
                }
                hdr.udp.checksum = 0;
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
