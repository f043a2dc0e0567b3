/* -*- P4_16 -*- */
/*
 * Parsers and deparsers: Ethernet / (ARP | IPv4 / UDP / kvpool), as ../include/parser.p4,
 * with Tofino's differences:
 *
 * - Ingress parses no payload: nothing in ingress reads it.  The IPv4 header checksum is
 *   verified here (Checksum extern) and ingress drops a wrong one (DROP_BAD_CHECKSUM).
 * - Egress parses the bridged header first, then, for a packet the egress pool reads or
 *   writes (bridge.pool_op), the served part of the payload (kvWords_t).  The rest of a
 *   1408-byte payload is never parsed: it leaves as it came.
 * - A GET's reply room is not stripped (pool.p4): only the parsed part of a packet can
 *   be removed, and 1408 bytes do not fit a PHV.
 * - The egress deparser recomputes the IPv4 header checksum (TTL, addresses and lengths
 *   change in both gresses) and leaves the UDP checksum as ingress set it, as the v1model
 *   program does (0 on packets the switch builds or rewrites).
 */
#ifndef KVPOOL_TNA_PARSER_P4
#define KVPOOL_TNA_PARSER_P4

/*************************************************************************
 ***********************  I N G R E S S   P A R S E R  *******************
 *************************************************************************/

parser MyIngressParser(packet_in pkt,
                       out headers_t hdr,
                       out ig_metadata_t meta,
                       out ingress_intrinsic_metadata_t standard_metadata) {

    Checksum() ipv4_checksum;

    state start {
        pkt.extract(standard_metadata);
        pkt.advance(PORT_METADATA_SIZE);
        // Tofino does not zero user metadata: every field starts defined here.
        meta.drop_reason = 0;
        meta.checksum_error = false;
        meta.is_writer = 0;
        meta.from_fabric = 0;
        meta.served = 0;
        meta.get_ok = 0;
        meta.frag_done = 0;
        meta.pool_stat = 0;
        meta.count_pool = 0;
        meta.coalesce_stat = 0;
        meta.count_coalesce = 0;
        meta.popularity_stat = 0;
        meta.pool_found = 0;
        meta.base_slot = 0;
        meta.pool_frag_count = 0;
        meta.pool_chunk_len = 0;
        meta.pool_generation = 0;
        meta.pool_state = 0;
        meta.pool_placement = 0;
        meta.waiter_addr = 0;
        meta.has_waiter = 0;
        meta.waiter_id = 0;
        meta.me = 0;
        meta.now = 0;
        meta.tick = 0;
        meta.my_tag = 0;
        meta.want_index = 0;
        meta.what_hi = 0;
        meta.what_lo = 0;
        meta.tag = 0;
        meta.tag32 = 0;
        meta.estimate = 0;
        meta.epoch = 0;
        meta.report_hot = 0;
        meta.report_mismatch = 0;
        meta.fwd = FWD_UNHANDLED;
        meta.fwd_port = 0;
        meta.fwd_mac = 0;
        meta.fwd_grp = 0;
        transition parse_ethernet;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP:  parse_arp;
            default:        accept;
        }
    }

    state parse_arp {
        pkt.extract(hdr.arp);
        transition accept;
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        ipv4_checksum.add(hdr.ipv4);
        meta.checksum_error = ipv4_checksum.verify();
        // Options (ihl > 5) and fragments are forwarded untouched, never read as kvpool.
        transition select(hdr.ipv4.ihl, hdr.ipv4.fragOffset, hdr.ipv4.protocol) {
            (5, 0, IPPROTO_UDP): parse_udp;
            default:             accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dstPort, hdr.udp.srcPort) {
            (KVPOOL_UDP_PORT, _): parse_kvpool;
            (_, KVPOOL_UDP_PORT): parse_kvpool;
            default:              accept;
        }
    }

    state parse_kvpool {
        pkt.extract(hdr.kv);
        transition accept;
    }
}

/*************************************************************************
 ***********************  I N G R E S S   D E P A R S E R  ***************
 *************************************************************************/

control MyIngressDeparser(packet_out pkt,
                          inout headers_t hdr,
                          in ig_metadata_t meta,
                          in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {

    // P4Info names a v1model digest by its struct; these keep those names.
    @name(".hot_chunk_t") Digest<hot_chunk_t>(DIGEST_HOT_CHUNK) hot_chunk;
    @name(".fill_mismatch_t") Digest<fill_mismatch_t>(DIGEST_FILL_MISMATCH) fill_mismatch;

    apply {
        if (ig_dprsr_md.digest_type == DIGEST_HOT_CHUNK) {
            hot_chunk.pack({ hdr.kv.chunk_key, meta.estimate, meta.epoch });
        } else if (ig_dprsr_md.digest_type == DIGEST_FILL_MISMATCH) {
            fill_mismatch.pack({ hdr.kv.chunk_key, hdr.kv.generation, hdr.kv.frag_count,
                                 hdr.kv.chunk_len });
        }
        pkt.emit(hdr.bridge);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.arp);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.kv);
    }
}

/*************************************************************************
 ***********************  E G R E S S   P A R S E R  *********************
 *************************************************************************/

parser MyEgressParser(packet_in pkt,
                      out headers_t hdr,
                      out eg_metadata_t meta,
                      out egress_intrinsic_metadata_t standard_metadata) {

    // Only a packet the egress pool reads or writes has its served part parsed.  The choice
    // is made at once, from the bridged pool_op, and each kind has its own copy of the
    // states: a select on pool_op after the KV header would hold a match register through
    // every state in between, and bf-p4c then finds none for the IPv4 select.
    state start {
        meta.ipv4_checksum = 0;  // set in egress
        pkt.extract(standard_metadata);
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.pool_op) {
            POOL_OP_SERVE: pool_ethernet;
            POOL_OP_FILL:  pool_ethernet;
            default:       parse_ethernet;
        }
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP:  parse_arp;
            default:        accept;
        }
    }

    state parse_arp {
        pkt.extract(hdr.arp);
        transition accept;
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.fragOffset, hdr.ipv4.protocol) {
            (5, 0, IPPROTO_UDP): parse_udp;
            default:             accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dstPort, hdr.udp.srcPort) {
            (KVPOOL_UDP_PORT, _): parse_kvpool;
            (_, KVPOOL_UDP_PORT): parse_kvpool;
            default:              accept;
        }
    }

    state parse_kvpool {
        pkt.extract(hdr.kv);
        transition accept;
    }

    // The pool's packets: the same headers, then the served part.
    state pool_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: pool_ipv4;
            default:        accept;
        }
    }

    state pool_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.fragOffset, hdr.ipv4.protocol) {
            (5, 0, IPPROTO_UDP): pool_udp;
            default:             accept;
        }
    }

    state pool_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dstPort, hdr.udp.srcPort) {
            (KVPOOL_UDP_PORT, _): pool_kvpool;
            (_, KVPOOL_UDP_PORT): pool_kvpool;
            default:              accept;
        }
    }

    state pool_kvpool {
        pkt.extract(hdr.kv);
        transition parse_words;
    }

    state parse_words {
        pkt.extract(hdr.words);
        transition accept;
    }
}

/*************************************************************************
 ***********************  E G R E S S   D E P A R S E R  *****************
 *************************************************************************/

control MyEgressDeparser(packet_out pkt,
                         inout headers_t hdr,
                         in eg_metadata_t meta,
                         in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {

    Checksum() ipv4_checksum;

    apply {
        // As the v1model program: a header with options keeps the checksum it came with.
        if (meta.ipv4_checksum == 1) {
            hdr.ipv4.hdrChecksum = ipv4_checksum.update({
                hdr.ipv4.version,
                hdr.ipv4.ihl,
                hdr.ipv4.diffserv,
                hdr.ipv4.totalLen,
                hdr.ipv4.identification,
                hdr.ipv4.flags,
                hdr.ipv4.fragOffset,
                hdr.ipv4.ttl,
                hdr.ipv4.protocol,
                hdr.ipv4.srcAddr,
                hdr.ipv4.dstAddr });
        }
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.arp);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.kv);
        pkt.emit(hdr.words);
    }
}

#endif  // KVPOOL_TNA_PARSER_P4
