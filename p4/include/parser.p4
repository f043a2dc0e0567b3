/* -*- P4_16 -*- */
/*
 * Parser: Ethernet / (ARP | IPv4 / UDP / kvpool / payload slices).
 *
 * kvpool traffic is UDP with KVPOOL_UDP_PORT as destination (requests, INVALIDATE, DATA a
 * holder pushes) or as source (responses).  DATA carries a payload, always the full
 * FRAG_PAYLOAD bytes, so it is extracted as SLICES_PER_FRAGMENT fixed slices; so does a
 * GET with reply room (same UDP length, payload_len 0).  Everything
 * else is accepted as-is and only forwarded.  A packet too short for what its headers
 * announce ends with standard_metadata.parser_error set (BMv2 still runs ingress), and
 * ingress drops it as DROP_PARSE_ERROR.
 */
#ifndef KVPOOL_PARSER_P4
#define KVPOOL_PARSER_P4

/*************************************************************************
 ***********************  P A R S E R  ***********************************
 *************************************************************************/

parser MyParser(packet_in packet,
                out headers_t hdr,
                inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {

    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP:  parse_arp;
            default:        accept;
        }
    }

    state parse_arp {
        packet.extract(hdr.arp);
        transition accept;
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        // Options (ihl > 5) and fragments are forwarded untouched, never read as kvpool.
        transition select(hdr.ipv4.ihl, hdr.ipv4.fragOffset, hdr.ipv4.protocol) {
            (5, 0, IPPROTO_UDP): parse_udp;
            default:             accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort, hdr.udp.srcPort) {
            (KVPOOL_UDP_PORT, _): parse_kvpool;
            (_, KVPOOL_UDP_PORT): parse_kvpool;
            default:              accept;
        }
    }

    // A GET whose UDP length is that of a DATA carries "reply room": FRAG_PAYLOAD bytes of
    // padding the pool overwrites when it answers (see include/pool.p4 for why).
    state parse_kvpool {
        packet.extract(hdr.kv);
        transition select(hdr.kv.opcode, hdr.udp.length) {
            (OP_DATA, _):               parse_payload;
            (OP_GET, KV_UDP_LEN_DATA):  parse_payload;
            default:                    accept;
        }
    }

    // SLICES_PER_FRAGMENT == 11 extracts; a DATA (or a GET with reply room) shorter than
    // 1408 payload bytes fails here.
    state parse_payload {
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        packet.extract(hdr.payload.next);
        transition accept;
    }
}

#endif  // KVPOOL_PARSER_P4
